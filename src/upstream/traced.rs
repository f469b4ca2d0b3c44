//! The SDK's reqwest client for Streamable HTTP upstreams, plus the W3C trace headers of each
//! call. The SDK sends every message from one connection task and takes headers per
//! connection, not per message; a call's trace context travels inside the message instead
//! (`_meta.traceparent`, `_meta.tracestate`) and is lifted into headers here, just before the
//! POST that carries it.
//!
//! An answer past the upstream's size limit, which the SDK's client stops reading at the limit
//! and reports as a failed POST or a broken event stream, is handed on instead as an error
//! answer to the request it answered (see [`super::guard`]), as over stdio: the call fails at
//! once saying why, and the connection and other calls are left alone.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use http::{HeaderName, HeaderValue};
use reqwest013 as reqwest;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, RequestId, RequestParamsMeta, ServerJsonRpcMessage,
};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use sse_stream::{Error as SseError, Sse};

use super::guard;

/// The SDK's event stream of a POST answer.
type BoxedSseStream = BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Most redirects followed for one request (as the SDK's own client).
const MAX_REDIRECTS: usize = 10;

/// How long an upstream connection is kept open between calls. Below the 5 s keep-alive of
/// Node's and uvicorn's HTTP servers, where most MCP servers run, so a call never goes out on
/// a connection the upstream is closing at that moment (a POST is not retried).
const IDLE: std::time::Duration = std::time::Duration::from_secs(4);

/// Most connections kept open per upstream between calls: what 32 callers at once keep busy.
const IDLE_PER_UPSTREAM: usize = 32;

#[derive(Clone)]
pub struct TracedClient(reqwest::Client, usize);

impl TracedClient {
    /// The client the SDK would build, except that connections are kept between calls: only
    /// same-origin 307 and 308 redirects followed (they keep the method and body; any other
    /// would lose the message or replay the upstream's credentials to another host).
    ///
    /// The SDK's own client opens a connection per message, against a ~40 ms delayed-ACK
    /// stall seen when a connection was reused before its last answer was read to the end.
    /// Its transport now reads each answer's event stream to its end before the connection
    /// goes back (a stream cut short is closed, never reused), and this client writes with
    /// `TCP_NODELAY` (reqwest's default), so no write waits on an ACK. A new connection per
    /// call cost a proxied call about 0.3 ms on loopback (bench/README.md, P3); a kept one
    /// carries no identity, as every message brings its own headers.
    pub fn new(max_result_bytes: usize) -> Result<Self, reqwest::Error> {
        let policy = reqwest::redirect::Policy::custom(|attempt| {
            let keeps_body = matches!(
                attempt.status(),
                reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
            );
            let same_origin = attempt
                .previous()
                .first()
                .is_some_and(|first| first.origin() == attempt.url().origin());
            if !keeps_body || !same_origin {
                attempt.stop()
            } else if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error(format!("exceeded {MAX_REDIRECTS} redirects"))
            } else {
                attempt.follow()
            }
        });
        reqwest::Client::builder()
            .pool_max_idle_per_host(IDLE_PER_UPSTREAM)
            .pool_idle_timeout(IDLE)
            .tcp_nodelay(true)
            .redirect(policy)
            .build()
            .map(|c| Self(c, max_result_bytes))
    }
}

/// Whether an event stream failed because one event passed its size limit (the SDK's error
/// type for it is private; its message is the SDK's, pinned by version).
fn event_too_large(e: &SseError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err
            .to_string()
            .starts_with("SSE event exceeded the maximum size")
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// `stream`, with an event past the size limit replaced by the refusal of request `id`.
fn refusing(stream: BoxedSseStream, id: RequestId, limit: usize) -> BoxedSseStream {
    futures::stream::unfold(Some(stream), move |stream| {
        let id = id.clone();
        async move {
            let mut stream = stream?;
            match stream.next().await? {
                Err(e) if event_too_large(&e) => {
                    let answer = ServerJsonRpcMessage::error(guard::refusal(limit), Some(id));
                    let event = Sse {
                        event: Some("message".into()),
                        data: serde_json::to_string(&answer).ok(),
                        id: None,
                        retry: None,
                    };
                    // Nothing more is read from a stream that broke there.
                    Some((Ok(event), None))
                }
                item => Some((item, Some(stream))),
            }
        }
    })
    .boxed()
}

/// Adds the trace context a tool call carries in its `_meta` to the request's headers.
fn with_trace(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return headers;
    };
    let ClientRequest::CallToolRequest(call) = &request.request else {
        return headers;
    };
    for (name, value) in [
        (TRACEPARENT, call.params.traceparent()),
        (TRACESTATE, call.params.tracestate()),
    ] {
        if let Some(v) = value.and_then(|v| HeaderValue::try_from(v).ok()) {
            headers.insert(name, v);
        }
    }
    headers
}

impl StreamableHttpClient for TracedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_trace(&message, custom_headers);
        self.0
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_trace(&message, custom_headers);
        self.0
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_trace(&message, custom_headers);
        let id = match &message {
            ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        let session = session_id.as_deref().map(str::to_owned);
        let posted = self
            .0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await;
        match (posted, id) {
            (Err(StreamableHttpError::ResponseBodyTooLarge { .. }), Some(id)) => {
                Ok(StreamableHttpPostResponse::Json(
                    ServerJsonRpcMessage::error(guard::refusal(self.1), Some(id)),
                    session,
                ))
            }
            (Ok(StreamableHttpPostResponse::Sse(stream, session)), Some(id)) => Ok(
                StreamableHttpPostResponse::Sse(refusing(stream, id, self.1), session),
            ),
            (posted, _) => posted,
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
