//! The REST surface: each operation at `/tools/<group><path>` with its own method, and the
//! merged OpenAPI document of what the caller may use at `GET /openapi.json`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Extension, Json, Router};
use serde_json::{Map, Value, json};

use crate::audit::{EventKind, Outcome, RequestOrigin};
use crate::gate::{self, Gate, Refused, Surface};
use crate::policy::snapshot::Principal;
use crate::pool::Tool;
use crate::pool::runner::ScriptOutcome;
use crate::state::AppState;

/// Largest request body accepted by a REST tool endpoint.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/tools/{*path}", any(call_operation))
        .route("/openapi.json", get(openapi))
        .route("/approvals/{id}", get(approval_status))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::http::require_agent,
        ))
        // Outermost: no request reaches a tool while the audit log cannot be written.
        .layer(axum::middleware::from_fn_with_state(
            state,
            crate::http::require_audit,
        ))
}

fn problem(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

fn not_found() -> Response {
    problem(StatusCode::NOT_FOUND, json!({"error": "unknown tool"}))
}

/// Finds the operation a method and path address among the tools the caller may see, with
/// the path parameters it binds. Only visible tools are routed: an ungranted operation is
/// not found before its body, its content type or its size is looked at.
fn route<'c>(
    visible: &'c [std::sync::Arc<Tool>],
    method: &Method,
    path: &str,
) -> Option<(&'c std::sync::Arc<Tool>, Map<String, Value>)> {
    let rest = path.strip_prefix("/tools/")?;
    let (group, op_path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    visible.iter().filter(|t| t.group() == group).find_map(|t| {
        let binding = t.http.as_ref()?;
        if binding.method != *method {
            return None;
        }
        match_template(&binding.path, op_path).map(|params| (t, params))
    })
}

/// Matches `/notes/{name}` against `/notes/abc`, binding `name`.
fn match_template(template: &str, path: &str) -> Option<Map<String, Value>> {
    let t: Vec<&str> = template.trim_end_matches('/').split('/').collect();
    let p: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    if t.len() != p.len() {
        return None;
    }
    let mut params = Map::new();
    for (ts, ps) in t.iter().zip(&p) {
        if let Some(name) = ts.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            let value = percent_decode(ps)?;
            if value.is_empty() {
                return None;
            }
            params.insert(name.to_owned(), Value::String(value));
        } else if ts != ps {
            return None;
        }
    }
    Some(params)
}

fn percent_decode(s: &str) -> Option<String> {
    url::form_urlencoded::parse(format!("v={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
}

/// Turns a string from a path or query into the JSON type the schema asks for; a value that
/// does not convert stays a string and fails validation with a precise message.
fn coerce(schema: Option<&Value>, raw: String) -> Value {
    let ty = schema.and_then(|s| s.get("type"));
    let wants = |t: &str| match ty {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(a)) => a.iter().any(|v| v == t),
        _ => false,
    };
    if wants("integer")
        && let Ok(i) = raw.parse::<i64>()
    {
        return json!(i);
    }
    if wants("number")
        && let Ok(f) = raw.parse::<f64>()
        && let Some(n) = serde_json::Number::from_f64(f)
    {
        return Value::Number(n);
    }
    if wants("boolean") {
        match raw.as_str() {
            "true" => return json!(true),
            "false" => return json!(false),
            _ => {}
        }
    }
    Value::String(raw)
}

async fn call_operation(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let origin = parts.extensions.get::<RequestOrigin>().cloned();
    let gate = Gate::new(&state, &principal, Surface::Rest, origin.as_ref());
    let visible = gate.visible();
    let Some((tool, path_params)) = route(&visible, &parts.method, parts.uri.path()) else {
        return refused(gate.unknown_tool(parts.uri.path()).await);
    };
    let admitted = match gate.admit_call(tool.name.as_str()).await {
        Ok(a) => a,
        Err(r) => return refused(r),
    };
    // Read only now that the caller is known to be allowed, and limited: what the body says
    // (or that it is too large, or not JSON) is audited and counted like any bad arguments.
    let (args, status) = match read_arguments(tool, path_params, &parts, body).await {
        Ok(args) => (Ok(args), StatusCode::BAD_REQUEST),
        Err((status, message)) => (Err(vec![message]), status),
    };
    match gate.run(admitted, args).await {
        Err(Refused::InvalidArguments { violations, .. }) if status != StatusCode::BAD_REQUEST => {
            problem(
                status,
                json!({"error": violations.join("; "), "violations": violations}),
            )
        }
        Err(r) => refused(r),
        Ok(done) => call_response(done.outcome),
    }
}

/// A call's own answer: what its tool said.
fn call_response(outcome: gate::Outcome) -> Response {
    match outcome {
        gate::Outcome::Script(o) => outcome_response(o),
        gate::Outcome::Upstream(r) => upstream_response(r),
    }
}

/// Where a call that needs approval stands: `202` with a status URL while it waits, the
/// refusal once a person denied it or it expired.
fn approval_response(tool: &str, ticket: &crate::service::approvals::Ticket) -> Response {
    let status_url = format!("/approvals/{}", ticket.id);
    let body = json!({
        "approval": ticket.id,
        "status": ticket.status,
        "status_url": status_url,
        "expires_at": ticket.expires_at,
        "reason": ticket.reason,
        "message": ticket.message(tool),
    });
    let status = match ticket.status.as_str() {
        "pending" | "granted" | "running" => StatusCode::ACCEPTED,
        "denied" => StatusCode::FORBIDDEN,
        "expired" => StatusCode::GONE,
        _ => StatusCode::CONFLICT,
    };
    let mut r = (status, Json(body)).into_response();
    if status == StatusCode::ACCEPTED
        && let Ok(v) = status_url.parse()
    {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// `GET /approvals/<id>`: the status URL of a call that waits, for its own caller only (any
/// other reads a 404, as for a request that does not exist). Once the call ran, its answer.
async fn approval_status(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let Ok(id) = uuid::Uuid::parse_str(&id) else {
        return not_found();
    };
    match crate::service::approvals::for_caller(&state, &principal, id).await {
        Ok(None) => not_found(),
        Ok(Some(row)) => match gate::stored_outcome(&row) {
            Some(outcome) => call_response(outcome),
            _ => approval_response(
                &row.tool,
                &crate::service::approvals::Ticket {
                    id: row.id,
                    status: row.state.clone(),
                    reason: row.reason.clone(),
                    expires_at: row.expires_at,
                    created: false,
                },
            ),
        },
        Err(e) => {
            tracing::error!(error = %e, "reading an approval failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "the approval store is unavailable; retry shortly"}),
            )
        }
    }
}

/// `Retry-After` in whole seconds (rounded up, at least 1) and the same wait in milliseconds
/// (rounded up), so the header and the body never disagree about when to come back.
fn retry_figures(wait: Duration) -> (u64, u64) {
    let ms = wait.as_micros().div_ceil(1000).max(1) as u64;
    (ms.div_ceil(1000), ms)
}

/// The answer to a request the gate refused.
fn refused(r: Refused) -> Response {
    match r {
        Refused::Approval { tool, ticket } => approval_response(tool.name.as_str(), &ticket),
        Refused::ApprovalUnavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1".to_owned())],
            Json(json!({"error": "the approval store is unavailable, so the call that needs approval did not run; retry shortly"})),
        )
            .into_response(),
        Refused::UnknownTool(_) => not_found(),
        // The caller may see the tool; what it lacks is its own credential, which someone
        // can set: a conflict with the state of the gateway, not a refusal of the caller.
        Refused::CredentialMissing { message, .. } => (
            StatusCode::CONFLICT,
            Json(json!({"error": message})),
        )
            .into_response(),
        Refused::RateLimited {
            retry_after,
            policy,
        } => {
            let (secs, ms) = retry_figures(retry_after);
            let mut r = (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, secs.to_string())],
                Json(json!({"error": "rate limited", "retry_after_ms": ms})),
            )
                .into_response();
            // draft-ietf-httpapi-ratelimit-headers: the limit, and none of it left for `t` s.
            if let Some(p) = policy {
                let h = r.headers_mut();
                if let Ok(v) = format!("\"{}\";q={};w={}", p.name, p.quota, p.window_secs).parse() {
                    h.insert("ratelimit-policy", v);
                }
                if let Ok(v) = format!("\"{}\";r=0;t={secs}", p.name).parse() {
                    h.insert("ratelimit", v);
                }
            }
            r
        }
        Refused::LimitsUnavailable { retry_after } => {
            let (secs, ms) = retry_figures(retry_after);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, secs.to_string())],
                Json(json!({"error": "the rate-limit store is unavailable, so the request was not served; retry shortly", "retry_after_ms": ms})),
            )
                .into_response()
        }
        Refused::AuditUnavailable(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1".to_owned())],
            Json(json!({"error": "the audit log is unavailable, so the request was not served; retry shortly"})),
        )
            .into_response(),
        Refused::InvalidArguments { violations, .. } => problem(
            StatusCode::BAD_REQUEST,
            json!({"error": "invalid arguments", "violations": violations}),
        ),
    }
}

/// The merged parameter object of a REST request (path + query + body), or the status and
/// message of why it cannot be read.
async fn read_arguments(
    tool: &Tool,
    path_params: Map<String, Value>,
    parts: &axum::http::request::Parts,
    body: axum::body::Body,
) -> Result<Value, (StatusCode, String)> {
    let Some(binding) = tool.http.as_ref() else {
        return Err((StatusCode::NOT_FOUND, "unknown tool".into()));
    };
    let props = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    let mut args = Map::new();
    let mut twice = Vec::new();
    for (k, v) in path_params {
        let v = coerce(
            props.and_then(|p| p.get(&k)),
            v.as_str().unwrap_or_default().to_owned(),
        );
        args.insert(k, v);
    }
    if let Some(q) = parts.uri.query() {
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
            seen.entry(k.into_owned()).or_default().push(v.into_owned());
        }
        for (k, mut values) in seen {
            let schema = props.and_then(|p| p.get(&k));
            let value = if values.len() == 1 {
                coerce(schema, values.remove(0))
            } else {
                let items = schema.and_then(|s| s.get("items"));
                Value::Array(values.into_iter().map(|v| coerce(items, v)).collect())
            };
            if args.insert(k.clone(), value).is_some() {
                twice.push(k);
            }
        }
    }
    let bytes: Bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body exceeds {MAX_BODY_BYTES} bytes"),
            )
        })?;
    if !bytes.iter().all(u8::is_ascii_whitespace) {
        if binding.body_params.is_empty()
            && !matches!(parts.method, Method::POST | Method::PUT | Method::PATCH)
        {
            return Err((
                StatusCode::BAD_REQUEST,
                "this operation takes no request body".into(),
            ));
        }
        let is_json = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_none_or(|ct| ct.starts_with("application/json"));
        if !is_json {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the request body must be application/json".into(),
            ));
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(body)) => {
                for (k, v) in body {
                    if args.insert(k.clone(), v).is_some() {
                        twice.push(k);
                    }
                }
            }
            Ok(_) => {
                return Err((
                    StatusCode::BAD_REQUEST,
                    "the request body must be a JSON object".into(),
                ));
            }
            Err(e) => {
                return Err((
                    StatusCode::BAD_REQUEST,
                    format!("the request body is not valid JSON: {e}"),
                ));
            }
        }
    }
    if let Some(k) = twice.first() {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("`{k}` is given more than once"),
        ));
    }
    Ok(Value::Object(args))
}

/// An upstream tool over REST: its structured result, or its content blocks; its failures
/// with the statuses a script's would get.
fn upstream_response(
    r: Result<rmcp::model::CallToolResult, crate::upstream::UpstreamError>,
) -> Response {
    use crate::upstream::UpstreamError;
    match r {
        Ok(r) if r.is_error == Some(true) => problem(
            StatusCode::BAD_GATEWAY,
            json!({"error": "the tool failed", "content": r.content, "exit_code": null, "stderr": ""}),
        ),
        Ok(r) => match r.structured_content {
            Some(v) => (StatusCode::OK, Json(v)).into_response(),
            None => (StatusCode::OK, Json(json!({"content": r.content}))).into_response(),
        },
        Err(e @ UpstreamError::Timeout(..)) => {
            problem(StatusCode::GATEWAY_TIMEOUT, json!({"error": e.to_string()}))
        }
        Err(
            e @ (UpstreamError::Down(_) | UpstreamError::CircuitOpen(_) | UpstreamError::Busy(..)),
        ) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            Json(json!({"error": e.to_string()})),
        )
            .into_response(),
        Err(e) => problem(
            StatusCode::BAD_GATEWAY,
            json!({"error": e.to_string(), "exit_code": null, "stderr": ""}),
        ),
    }
}

fn outcome_response(outcome: ScriptOutcome) -> Response {
    let message = outcome.error_message().unwrap_or_default();
    match outcome {
        ScriptOutcome::Success { output, .. } => (StatusCode::OK, Json(output)).into_response(),
        ScriptOutcome::Failed { exit_code, stderr } => problem(
            StatusCode::BAD_GATEWAY,
            json!({"error": "the tool failed", "exit_code": exit_code, "stderr": stderr}),
        ),
        ScriptOutcome::InvalidOutput { reason, stderr } => problem(
            StatusCode::BAD_GATEWAY,
            json!({"error": format!("the tool printed invalid output: {reason}"), "exit_code": 0, "stderr": stderr}),
        ),
        ScriptOutcome::OutputTooLarge { .. } | ScriptOutcome::SpawnFailed { .. } => problem(
            StatusCode::BAD_GATEWAY,
            json!({"error": message, "exit_code": null, "stderr": ""}),
        ),
        ScriptOutcome::Timeout { .. } => {
            problem(StatusCode::GATEWAY_TIMEOUT, json!({"error": message}))
        }
        ScriptOutcome::Busy => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            Json(json!({"error": message})),
        )
            .into_response(),
    }
}

/// The merged OpenAPI document of the operations the caller may use.
async fn openapi(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    origin: Option<Extension<RequestOrigin>>,
) -> Response {
    let origin = origin.map(|Extension(o)| o);
    let gate = Gate::new(&state, &principal, Surface::Rest, origin.as_ref());
    if let Err(r) = gate.admit(EventKind::OpenApi).await {
        return refused(r);
    }
    let mut paths: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let mut shown = Vec::new();
    for tool in gate.visible() {
        shown.push(tool.name.as_str().to_owned());
        let (Some(binding), Some(op)) = (&tool.http, tool.openapi_operation()) else {
            continue;
        };
        paths
            .entry(format!("/tools/{}{}", tool.group(), binding.path))
            .or_default()
            .insert(binding.method.as_str().to_lowercase(), op);
    }
    gate.disclosed(
        EventKind::OpenApi,
        Outcome::Success,
        json!({"shown": shown}),
    );
    Json(json!({
        "openapi": "3.1.0",
        "info": {"title": "toolgate", "version": env!("CARGO_PKG_VERSION"), "description": "The tools this caller may use."},
        "servers": [{"url": state.settings.issuer}],
        "security": [{"bearer": []}],
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}},
        "paths": paths,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_bind_path_parameters() {
        let p = match_template("/notes/{name}", "/notes/deploy%20runbook.md").unwrap();
        assert_eq!(p["name"], json!("deploy runbook.md"));
        assert!(match_template("/notes/{name}", "/notes").is_none());
        assert!(match_template("/notes/{name}", "/other/x").is_none());
    }

    #[test]
    fn query_strings_take_the_schema_type() {
        assert_eq!(
            coerce(Some(&json!({"type": "integer"})), "3".into()),
            json!(3)
        );
        assert_eq!(
            coerce(Some(&json!({"type": "integer"})), "x".into()),
            json!("x")
        );
        assert_eq!(
            coerce(Some(&json!({"type": "boolean"})), "true".into()),
            json!(true)
        );
        assert_eq!(coerce(None, "3".into()), json!("3"));
    }
}
