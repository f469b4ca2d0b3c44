//! Reading and exporting the audit log: each read goes through the audit-access service, which
//! records it first.

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{API_ACTOR, ApiResult};
use crate::service::audit_access;
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/audit", get(list_audit))
        .route("/audit/export", get(export_audit))
        .route("/audit/{id}", get(get_audit))
}

/// Who reads the audit log through the API.
const READER: audit_access::Reader<'static> = audit_access::Reader {
    who: API_ACTOR,
    channel: audit_access::Channel::Api,
};

#[derive(Deserialize, Default)]
struct AuditQuery {
    #[serde(flatten)]
    filter: crate::db::audit::AuditFilter,
    before: Option<i64>,
    limit: Option<i64>,
}

/// Newest first; `next_before` is the cursor for the next (older) page. With `after_id`,
/// oldest first in commit order, and `next_after` the cursor of the next page.
#[utoipa::path(
    get,
    path = "/api/v1/audit",
    tag = "audit",
    summary = "Read the audit log",
    params(super::openapi::AuditParams),
    responses((status = 200, body = serde_json::Value, description = "`events`, newest first, and `next_before`, the cursor of the next page; with `after_id`, oldest first and `next_after`"))
)]
async fn list_audit(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<AuditQuery>,
) -> ApiResult<Json<Value>> {
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    let rows = audit_access::rows(&state, READER, &q.filter, q.before, limit).await?;
    if let Some(after) = q.filter.after_id {
        let next = rows.last().and_then(|r| r.id).unwrap_or(after);
        return Ok(Json(json!({"events": rows, "next_after": next})));
    }
    let next = if rows.len() as i64 == limit {
        rows.last().and_then(|r| r.id)
    } else {
        None
    };
    Ok(Json(json!({"events": rows, "next_before": next})))
}

#[utoipa::path(
    get,
    path = "/api/v1/audit/{id}",
    tag = "audit",
    summary = "Read one audit event",
    params(("id" = i64, Path, description = "Event id")),
    responses((status = 200, body = serde_json::Value, description = "One event"))
)]
async fn get_audit(State(state): State<AppState>, Path(id): Path<i64>) -> ApiResult<Json<Value>> {
    let row = audit_access::row(&state, READER, id).await?;
    Ok(Json(json!({"event": row})))
}

#[derive(Deserialize)]
struct ExportQuery {
    format: crate::audit::export::Format,
    #[serde(flatten)]
    filter: crate::db::audit::AuditFilter,
}

/// Streams the export: one row in memory at a time, whatever the range, once its record
/// (`audit.export`, with the filter) is durable.
#[utoipa::path(
    get,
    path = "/api/v1/audit/export",
    tag = "audit",
    summary = "Export the audit log",
    params(super::openapi::ExportParams),
    responses((status = 200, description = "The rows, streamed", content(("text/csv"), ("application/x-ndjson"))))
)]
async fn export_audit(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<ExportQuery>,
) -> ApiResult<Response> {
    use futures::StreamExt;
    let body = audit_access::export(&state, READER, q.format, q.filter)
        .await?
        .map(|r| {
            r.map_err(|e| {
                tracing::error!(error = %e, "audit export failed mid-stream");
                std::io::Error::other("audit export failed")
            })
        });
    Ok((
        [
            (header::CONTENT_TYPE, q.format.content_type().to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{}\"", q.format.file_name()),
            ),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}
