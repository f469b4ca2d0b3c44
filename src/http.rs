//! HTTP plumbing shared by the surfaces: request ids, metrics, health, and the middleware that
//! puts the bearer guard ([`crate::auth::bearer`]) in front of the agent surfaces.

use std::net::IpAddr;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

use crate::auth::token::TokenError;
use crate::state::AppState;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Sets `x-request-id` on every request that lacks one and echoes it on the response.
pub fn request_id_layers()
-> tower::layer::util::Stack<PropagateRequestIdLayer, SetRequestIdLayer<MakeRequestUuid>> {
    // Stack::new(inner, outer): the id is set first, then propagated to the response.
    tower::layer::util::Stack::new(
        PropagateRequestIdLayer::new(REQUEST_ID),
        SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid),
    )
}

/// The request id of a request, for logs and error bodies.
pub fn request_id(req: &axum::http::request::Parts) -> String {
    req.headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// The surface a path belongs to, as metrics and summarised refusals name it.
pub fn surface_of(path: &str) -> &'static str {
    match path {
        p if p.starts_with("/mcp") => "mcp",
        p if p.starts_with("/tools/") || p == "/openapi.json" => "rest",
        p if p.starts_with("/oauth/") || p.starts_with("/.well-known/") => "oauth",
        p if p.starts_with("/api/") => "api",
        p if p.starts_with("/admin") || p.starts_with("/static/") => "web",
        _ => "ops",
    }
}

/// What axum appends to the route of a service nested under a path.
const NEST_TAIL: &str = "/{*__private__axum_nest_tail_param}";

/// The request method as a span attribute: the standard ones by name, any other as `_OTHER`
/// (a client may send any token as a method; the attribute stays a small set).
fn method_of(m: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

/// The request's span when traces are exported: named for its route, with the standard HTTP
/// attributes, continuing the caller's trace.
fn traced_span(req: &Request, id: &str) -> tracing::Span {
    let method = method_of(req.method());
    // Named for the route, never the raw path: a span name is a low-cardinality label.
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().trim_end_matches(NEST_TAIL).to_owned());
    let name = match &route {
        Some(r) => format!("{method} {r}"),
        None => method.to_owned(),
    };
    // The fields recorded later (the response, and on tool calls what the gate decided) are
    // declared here: a span only takes fields it was created with.
    let span = tracing::info_span!(
        "request",
        otel.name = %name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = route.as_deref(),
        url.path = %req.uri().path(),
        request_id = %id,
        http.response.status_code = tracing::field::Empty,
        toolgate.agent = tracing::field::Empty,
        toolgate.tool = tracing::field::Empty,
        toolgate.outcome = tracing::field::Empty,
        toolgate.call_id = tracing::field::Empty,
    );
    crate::telemetry::continue_trace(&span, req.headers());
    span
}

/// Counts and times every request per surface, inside its span (the request id, the HTTP
/// attributes, and the caller's trace when it sent one).
pub async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let surface = surface_of(req.uri().path());
    let started = Instant::now();
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let probe = matches!(req.uri().path(), "/healthz" | "/readyz");
    let span = if probe {
        // A probe every few seconds per orchestrator would bury the traces that matter.
        tracing::Span::none()
    } else if crate::telemetry::exporting() {
        traced_span(&req, &id)
    } else {
        // Logs read the same as before traces existed.
        tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
    };
    let origin = crate::audit::RequestOrigin {
        remote_addr: client_addr(
            req.extensions()
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip()),
            req.headers(),
            &state.settings.trusted_proxies,
        )
        .map(|ip| ip.to_string()),
        user_agent: req
            .headers()
            .get(header::USER_AGENT)
            // Header bytes need not be UTF-8: keep what was sent, invalid bytes replaced,
            // rather than recording no user agent at all.
            .map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .chars()
                    .take(512)
                    .collect()
            }),
        request_id: Some(id.clone()).filter(|s| !s.is_empty()),
        span: Some(span.clone()),
    };
    let mut req = req;
    req.extensions_mut().insert(origin.clone());
    let http1 = req.version() <= axum::http::Version::HTTP_11;
    let in_flight = state.request_started();
    let mut response = origin
        .scope(tracing::Instrument::instrument(next.run(req), span.clone()))
        .await;
    drop(in_flight);
    // As i64: the OpenTelemetry layer would turn an unsigned value into text.
    span.record(
        "http.response.status_code",
        i64::from(response.status().as_u16()),
    );
    if response.status().is_server_error() {
        span.record("otel.status_code", "error");
    }
    // While draining, clients are moved off their keep-alive connections one response at a
    // time, so none is left idle on a connection the listener's closing would cut.
    if state.is_draining() && http1 {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    state
        .metrics
        .http_requests
        .with_label_values(&[surface, response.status().as_str()])
        .inc();
    state
        .metrics
        .http_latency
        .with_label_values(&[surface])
        .observe(started.elapsed().as_secs_f64());
    response
}

/// Health and readiness, and metrics unless they have a listener of their own
/// ([`metrics_router`]).
pub fn ops_router(with_metrics: bool) -> Router<AppState> {
    let router = Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz));
    if with_metrics {
        router.route("/metrics", get(metrics))
    } else {
        router
    }
}

/// What `--metrics-bind` serves: metrics, and the probes beside them.
pub fn metrics_router(state: AppState) -> Router {
    ops_router(true).with_state(state)
}

async fn readyz(State(state): State<AppState>) -> Response {
    // Draining answers at once, without waiting on the database.
    if state.is_draining() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        )
            .into_response();
    }
    let db_ok = crate::db::ping(&state.db).await.is_ok();
    let snapshot = state.policy.load();
    let pool_loaded = !snapshot.catalog.groups().collect::<Vec<_>>().is_empty()
        || state.settings.tools_dir.is_dir();
    let status = if db_ok && pool_loaded {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({
            "database": if db_ok { "ok" } else { "unreachable" },
            "pool": {"tools": snapshot.catalog.len(), "load_errors": snapshot.catalog.load_errors().len()},
        })),
    )
        .into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    // What is read at scrape time rather than counted as it happens.
    let m = &state.metrics;
    m.audit_queue.set(state.audit.queued() as i64);
    let open = i64::from(state.db.size());
    let idle = state.db.num_idle() as i64;
    m.db_connections.with_label_values(&["open"]).set(open);
    m.db_connections.with_label_values(&["idle"]).set(idle);
    m.db_connections
        .with_label_values(&["in_use"])
        .set(open - idle);
    if let Ok(sinks) = crate::db::sinks::status(&state.db, 100_000).await {
        for (sink, _, _, _, waiting) in sinks {
            m.sink_lag.with_label_values(&[sink.as_str()]).set(waiting);
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// The `WWW-Authenticate` challenge that points clients at our protected-resource metadata,
/// with the scope to ask for and, for a token that was refused (RFC 6750 §3.1), why: a client
/// that reads `error_description="expired"` knows to get a new token rather than give up.
pub fn bearer_challenge(state: &AppState, refused: Option<&TokenError>) -> String {
    let mut c = format!(
        "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\", scope=\"{}\"",
        state.settings.issuer,
        crate::auth::scope::SUPPORTED_SCOPES.join(" ")
    );
    if let Some(e) = refused {
        // Fixed words only: nothing the token held is echoed.
        c.push_str(&format!(
            ", error=\"invalid_token\", error_description=\"{}\"",
            e.kind()
        ));
    }
    c
}

/// Resource-server guard for `/mcp`, `/tools/...` and `/openapi.json`: a valid access token
/// (or, in local development only, the dev agent) becomes a
/// [`crate::policy::snapshot::Principal`] in the request;
/// [`crate::auth::bearer`] checks, audits and counts it.
pub async fn require_agent(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let path = req.uri().path();
    let origin = req.extensions().get::<crate::audit::RequestOrigin>();
    let checked =
        crate::auth::bearer::authenticate(&state, authorization, origin, path, surface_of(path))
            .await;
    let refusal = match checked {
        Ok(principal) => {
            req.extensions_mut().insert(principal);
            return next.run(req).await;
        }
        Err(refusal) => refusal,
    };
    let refused = (refusal.error != TokenError::Missing).then_some(&refusal.error);
    let mut response = match refusal.limited {
        Some(wait) => (
            StatusCode::TOO_MANY_REQUESTS,
            [(
                header::RETRY_AFTER,
                (wait.as_secs_f64().ceil().max(1.0) as u64).to_string(),
            )],
            Json(json!({"error": "too_many_requests", "error_description": "too many requests with an invalid token from this address; retry later"})),
        )
            .into_response(),
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, bearer_challenge(&state, refused))],
            Json(json!({
                "error": if refused.is_some() { "invalid_token" } else { "unauthorized" },
                "error_description": match refused {
                    Some(TokenError::Expired) => "the access token has expired; request a new one",
                    _ => "a valid bearer access token is required",
                },
            })),
        )
            .into_response(),
    };
    // An unread request body makes the server drop the keep-alive connection right after this
    // answer, racing the client's next request on it (which then sees a reset, not an answer).
    // Read a small body to its end; refuse to keep a connection whose body is large, and say
    // so, rather than read it for a stranger.
    if !drain_body(req.into_body()).await {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Largest body read (and discarded) from a refused request so that its connection can be
/// reused.
const DRAIN_LIMIT: usize = 64 * 1024;

/// Reads and discards `body` if it is small and arrives promptly; `false` when it was not
/// read to its end.
async fn drain_body(body: axum::body::Body) -> bool {
    let read = axum::body::to_bytes(body, DRAIN_LIMIT);
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(2), read).await,
        Ok(Ok(_))
    )
}

/// Fails closed when the audit log cannot be written: no tool may run un-audited, and the
/// caller gets a clear 503 instead of a tool that silently was not recorded. Recovery needs
/// no restart: as soon as the database answers again, requests flow.
pub async fn require_audit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if !state.audit.is_healthy() {
        let ok = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            crate::db::ping(&state.db),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        if !ok {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                Json(json!({"error": "the audit log is unavailable, so no tool can run; retry shortly"})),
            )
                .into_response();
        }
        state.audit.set_healthy(true);
    }
    next.run(req).await
}

/// Entries of `X-Forwarded-For` looked at, at most: a chain of proxies is short, and the header
/// is the client's to fill.
const MAX_FORWARDED_HOPS: usize = 16;

/// The client's address: the peer's, unless the peer is a trusted proxy, in which case
/// `X-Forwarded-For` is read from the right (each proxy appends the address it saw) past every
/// trusted proxy, and the first address that is not one is the client. Entries left of it were
/// written by the client itself and prove nothing. A malformed entry stops the walk at the last
/// proxy that was trusted, so a forged header can at worst name a proxy, never a chosen address.
/// Per-address limits and the audit log's `remote_addr` depend on this.
pub fn client_addr(
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    trusted: &[ipnet::IpNet],
) -> Option<IpAddr> {
    let mut current = peer?.to_canonical();
    if trusted.is_empty() {
        return Some(current);
    }
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(&ip.to_canonical()));
    let mut hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut looked = 0;
    while is_trusted(&current) && looked < MAX_FORWARDED_HOPS {
        let Some(hop) = hops.pop() else { break };
        looked += 1;
        let Ok(ip) = hop
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        else {
            break;
        };
        current = ip.to_canonical();
    }
    Some(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn nets(s: &[&str]) -> Vec<ipnet::IpNet> {
        s.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn without_trusted_proxies_the_header_is_ignored() {
        let h = xff(&["198.51.100.9"]);
        assert_eq!(client_addr(ip("203.0.113.5"), &h, &[]), ip("203.0.113.5"));
    }

    #[test]
    fn a_stranger_cannot_choose_its_address_by_sending_the_header() {
        let h = xff(&["198.51.100.9"]);
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(
            client_addr(ip("203.0.113.5"), &h, &trusted),
            ip("203.0.113.5")
        );
    }

    #[test]
    fn behind_a_trusted_proxy_the_rightmost_untrusted_entry_is_the_client() {
        // The client forged the first entry; the proxy appended what it saw.
        let h = xff(&["1.2.3.4, 198.51.100.9"]);
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(
            client_addr(ip("10.0.0.2"), &h, &trusted),
            ip("198.51.100.9")
        );
        // Two proxies, and the header split over two lines.
        let h = xff(&["1.2.3.4, 198.51.100.9", "10.0.0.7"]);
        assert_eq!(
            client_addr(ip("10.0.0.2"), &h, &trusted),
            ip("198.51.100.9")
        );
    }

    #[test]
    fn a_malformed_or_missing_entry_stops_at_the_last_trusted_proxy() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = xff(&["198.51.100.9, not-an-ip"]);
        assert_eq!(client_addr(ip("10.0.0.2"), &h, &trusted), ip("10.0.0.2"));
        assert_eq!(
            client_addr(ip("10.0.0.2"), &HeaderMap::new(), &trusted),
            ip("10.0.0.2")
        );
        let h = xff(&["[2001:db8::1]"]);
        assert_eq!(client_addr(ip("10.0.0.2"), &h, &trusted), ip("2001:db8::1"));
    }

    #[test]
    fn ipv4_mapped_peers_match_ipv4_networks() {
        let trusted = nets(&["127.0.0.1/32"]);
        let h = xff(&["198.51.100.9"]);
        assert_eq!(
            client_addr(ip("::ffff:127.0.0.1"), &h, &trusted),
            ip("198.51.100.9")
        );
    }

    #[test]
    fn a_long_forged_chain_of_trusted_addresses_is_cut_short() {
        let trusted = nets(&["10.0.0.0/8"]);
        let chain = vec!["10.9.9.9"; 100].join(", ");
        let h = xff(&[&format!("198.51.100.9, {chain}")]);
        assert!(client_addr(ip("10.0.0.2"), &h, &trusted).is_some_and(|a| trusted[0].contains(&a)));
    }
}
