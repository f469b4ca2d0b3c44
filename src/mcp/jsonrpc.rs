//! JSON-RPC errors for bodies that are not one valid JSON-RPC message.
//!
//! The SDK answers any JSON body it cannot deserialize with HTTP 415 "fail to deserialize",
//! and a tool call whose `arguments` is not an object with -32601 naming the method: a client
//! (or the model behind it) cannot tell from either what it did wrong. This layer reads the
//! body first and answers what JSON-RPC says: -32700 for text that is not JSON, -32600 for a
//! batch or anything that is not a request object, -32602 naming the field for a standard
//! method with bad params. The happy path costs one extra typed parse of the body (a few
//! microseconds for a tool call).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::MAX_REQUEST_BYTES;
use crate::state::AppState;

pub const PARSE_ERROR: i32 = -32700;
pub const INVALID_REQUEST: i32 = -32600;
pub const INVALID_PARAMS: i32 = -32602;

/// The first protocol revision in which a malformed request is an HTTP 400 rather than a
/// JSON-RPC error in a 200.
const FIRST_MODERN: &str = "2026-01-01";

pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST || !is_json(req.headers()) {
        return next.run(req).await;
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_REQUEST_BYTES) {
        return too_large();
    }
    let modern = is_modern(req.headers());
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_REQUEST_BYTES).await else {
        return too_large();
    };
    let message = match parse(&bytes, modern) {
        Err((status, body)) => return (status, axum::Json(body)).into_response(),
        Ok(message) => message,
    };
    if let Some(message) = &message
        && let Some(answer) = super::list::answer(&state, &parts, message).await
    {
        return answer;
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The message in `body`, or the answer to give when it is not one the SDK will dispatch
/// correctly. One typed parse: a standard method whose params do not fit its type
/// deserializes as a *custom* request (then answered "method not found"), so that case is
/// caught here too. `Ok(None)`: nothing better to say than the SDK will.
fn parse(body: &[u8], modern: bool) -> Result<Option<ClientJsonRpcMessage>, (StatusCode, Value)> {
    let refuse = |answer: Option<(StatusCode, Value)>| answer.map_or(Ok(None), Err);
    match serde_json::from_slice::<ClientJsonRpcMessage>(body) {
        Err(_) => refuse(classify(body, modern)),
        Ok(JsonRpcMessage::Request(r)) => match &r.request {
            // `initialize` is a removed method in the modern revision: the SDK answers it
            // (404 / -32601) as the spec says.
            ClientRequest::CustomRequest(c)
                if c.method == "initialize" && (modern || has_modern_meta(c.params.as_ref())) =>
            {
                Ok(Some(JsonRpcMessage::Request(r)))
            }
            ClientRequest::CustomRequest(c) if is_standard(&c.method) => {
                refuse(classify(body, modern))
            }
            _ => Ok(Some(JsonRpcMessage::Request(r))),
        },
        Ok(m) => Ok(Some(m)),
    }
}

fn has_modern_meta(params: Option<&Value>) -> bool {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get("io.modelcontextprotocol/protocolVersion"))
        .is_some()
}

/// Methods the SDK has types for: a request naming one must fit its type.
fn is_standard(method: &str) -> bool {
    matches!(
        method,
        "tools/call"
            | "tools/list"
            | "resources/read"
            | "resources/list"
            | "resources/templates/list"
            | "prompts/get"
            | "prompts/list"
            | "initialize"
    )
}

fn too_large() -> Response {
    let (status, body) = (
        StatusCode::PAYLOAD_TOO_LARGE,
        error(
            Value::Null,
            INVALID_REQUEST,
            format!(
                "Invalid Request: the body exceeds {MAX_REQUEST_BYTES} bytes or could not be read"
            ),
        ),
    );
    (status, axum::Json(body)).into_response()
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
}

fn is_modern(headers: &HeaderMap) -> bool {
    headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v >= FIRST_MODERN)
}

fn error(id: Value, code: i32, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Why `body` is not a JSON-RPC message the server accepts, as the HTTP status and JSON-RPC
/// error to answer; `None` when no better answer than the SDK's is known.
pub fn classify(body: &[u8], modern: bool) -> Option<(StatusCode, Value)> {
    let bad = |id: Value, code: i32, message: String| {
        Some((StatusCode::BAD_REQUEST, error(id, code, message)))
    };
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return bad(
                Value::Null,
                PARSE_ERROR,
                format!("Parse error: the body is not JSON ({e})"),
            );
        }
    };
    let obj = match value {
        Value::Array(_) => {
            return bad(
                Value::Null,
                INVALID_REQUEST,
                "Invalid Request: batches (JSON arrays) are not supported; send one JSON-RPC message per request".into(),
            );
        }
        Value::Object(o) => o,
        _ => {
            return bad(
                Value::Null,
                INVALID_REQUEST,
                "Invalid Request: the body must be a JSON-RPC 2.0 message object".into(),
            );
        }
    };
    let id = match obj.get("id") {
        Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
        _ => Value::Null,
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return bad(
            id,
            INVALID_REQUEST,
            "Invalid Request: `jsonrpc` must be \"2.0\"".into(),
        );
    }
    if let Some(other) = obj.get("id").filter(|v| !v.is_null() && id.is_null()) {
        let kind = match other {
            Value::Bool(_) => "a boolean",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
            _ => "invalid",
        };
        return bad(
            Value::Null,
            INVALID_REQUEST,
            format!("Invalid Request: `id` must be a string or a number, not {kind}"),
        );
    }
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        return bad(
            id,
            INVALID_REQUEST,
            "Invalid Request: `method` must be a string".into(),
        );
    };
    let params = obj.get("params").cloned().unwrap_or(Value::Null);
    let problem = params_problem(method, params)?;
    // A request's bad params are a JSON-RPC error; legacy revisions carry it in a 200.
    let status = if modern || id.is_null() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    Some((
        status,
        error(
            id,
            INVALID_PARAMS,
            format!("Invalid params for {method}: {problem}"),
        ),
    ))
}

/// What is wrong with `params` for `method`, for the methods the gateway serves.
fn params_problem(method: &str, params: Value) -> Option<String> {
    use rmcp::model as m;
    fn check<T: DeserializeOwned>(params: Value) -> Option<String> {
        if !params.is_object() && !params.is_null() {
            return Some("`params` must be an object".into());
        }
        serde_json::from_value::<T>(params)
            .err()
            .map(|e| e.to_string())
    }
    match method {
        "tools/call" => {
            if let Some(a) = params
                .get("arguments")
                .filter(|a| !a.is_object() && !a.is_null())
            {
                let kind = if a.is_array() {
                    "an array"
                } else {
                    "not an object"
                };
                return Some(format!("`arguments` must be an object, not {kind}"));
            }
            check::<m::CallToolRequestParams>(params)
        }
        "resources/read" => check::<m::ReadResourceRequestParams>(params),
        "prompts/get" => check::<m::GetPromptRequestParams>(params),
        "initialize" => check::<m::InitializeRequestParams>(params),
        "tools/list" | "resources/list" | "resources/templates/list" | "prompts/list" => {
            check::<Option<m::PaginatedRequestParams>>(params)
        }
        _ => Some("the params do not match the method".into()),
    }
}
