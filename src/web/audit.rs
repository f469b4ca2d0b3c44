//! The audit log: filtered, keyset-paginated list; one event's full record; export of the
//! current filter through the same streaming export as the API and the command line.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use serde::Deserialize;

use super::WebState;
use super::error::WebError;
use super::view::{Ctx, Nav, PageCtx, pretty_json, render, when};
use crate::audit::chain::ChainedEvent;
use crate::audit::export::Format;
use crate::audit::{EventKind, Outcome};
use crate::db::audit::AuditFilter;
use crate::service::ServiceError;
use crate::service::audit_access::{self, Channel, Reader};

const PAGE_SIZE: i64 = 50;

/// One row of an event table.
pub struct EventRow {
    pub id: i64,
    pub at: String,
    pub event_type: String,
    pub outcome: String,
    /// `good`, `bad` or `plain`: the outcome's badge.
    pub tone: &'static str,
    pub agent: String,
    pub tool: String,
    pub actor: String,
    pub resource: String,
    /// The person a host acted for, or who acted themselves.
    pub person: String,
    pub client_id: String,
    /// How long the call took, in milliseconds; empty where the row records none.
    pub latency: String,
    /// What an admin change did (`grant.create`), from its details.
    pub action: String,
}

fn tone(outcome: &str) -> &'static str {
    match outcome {
        "success" => "good",
        "started" => "plain",
        _ => "bad",
    }
}

pub fn event_row(r: &ChainedEvent) -> EventRow {
    let e = &r.event;
    EventRow {
        id: r.id.unwrap_or_default(),
        at: when(&e.at),
        event_type: e.event_type.clone(),
        outcome: e.outcome.clone(),
        tone: tone(&e.outcome),
        agent: e.agent.clone().unwrap_or_default(),
        tool: e.tool.clone().unwrap_or_default(),
        actor: e.admin_user.clone().unwrap_or_default(),
        resource: e.resource.clone().unwrap_or_default(),
        person: e.person.clone().unwrap_or_default(),
        client_id: e.client_id.clone().unwrap_or_default(),
        latency: e.latency_us.map(latency).unwrap_or_default(),
        action: e
            .details
            .as_deref()
            .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .and_then(|d| d.get("action").and_then(|a| a.as_str()).map(str::to_owned))
            .unwrap_or_default(),
    }
}

/// Milliseconds, with one decimal below ten (a cached result is well under one).
fn latency(us: i64) -> String {
    if us < 10_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{} ms", us / 1000)
    }
}

/// The filter as typed in the form; times are UTC.
#[derive(Debug, Deserialize, Default, Clone)]
pub struct AuditQuery {
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
    #[serde(default)]
    agent: String,
    #[serde(default)]
    tool: String,
    #[serde(default)]
    event_type: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    person: String,
    #[serde(default)]
    client_id: String,
    #[serde(default)]
    min_latency_ms: String,
    #[serde(default)]
    before: String,
    #[serde(default)]
    format: String,
}

/// Reads `2026-11-30T14:05`, `2026-11-30 14:05:09`, `2026-11-30` (UTC) or RFC 3339.
fn parse_time(s: &str) -> Result<Option<DateTime<Utc>>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    for f in [
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d %H:%M:%S",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, f) {
            return Ok(Some(t.and_utc()));
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).map(|t| t.and_utc()));
    }
    Err(format!(
        "`{s}` is not a time; write it as 2026-11-30T14:05 (UTC)"
    ))
}

impl AuditQuery {
    fn filter(&self) -> (AuditFilter, Vec<String>) {
        let mut errors = Vec::new();
        let mut time = |s: &str| {
            parse_time(s).unwrap_or_else(|e| {
                errors.push(e);
                None
            })
        };
        let since = time(&self.since);
        let until = time(&self.until);
        let text = |s: &str| Some(s.trim().to_owned()).filter(|s| !s.is_empty());
        // A kind nobody records is said so, not shown as an empty page.
        let event_type = text(&self.event_type)
            .and_then(|s| EventKind::parse_named(&s).map_err(|e| errors.push(e)).ok());
        let outcome = text(&self.outcome)
            .and_then(|s| Outcome::parse_named(&s).map_err(|e| errors.push(e)).ok());
        let min_latency_ms = text(&self.min_latency_ms).and_then(|s| match s.parse::<i64>() {
            Ok(ms) if ms >= 0 => Some(ms),
            _ => {
                errors.push(format!(
                    "`{s}` is not a number of milliseconds; write it as 250"
                ));
                None
            }
        });
        (
            AuditFilter {
                since,
                until,
                agent: text(&self.agent),
                tool: text(&self.tool),
                event_type,
                outcome,
                person: text(&self.person),
                client_id: text(&self.client_id),
                // The UI pages newest first; incremental reads are for machines.
                after_id: None,
                after_tx: None,
                min_latency_ms,
            },
            errors,
        )
    }

    /// The filter as a query string, for pagination and export links.
    fn query_string(&self) -> String {
        let mut s = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("since", &self.since),
            ("until", &self.until),
            ("agent", &self.agent),
            ("tool", &self.tool),
            ("event_type", &self.event_type),
            ("outcome", &self.outcome),
            ("person", &self.person),
            ("client_id", &self.client_id),
            ("min_latency_ms", &self.min_latency_ms),
        ] {
            if !v.trim().is_empty() {
                s.append_pair(k, v.trim());
            }
        }
        s.finish()
    }
}

/// A quick time range: label and the `since` it sets.
pub struct Preset {
    pub label: &'static str,
    pub href: String,
}

#[derive(Template)]
#[template(path = "admin/audit/index.html")]
struct AuditPage {
    page: PageCtx,
    q: AuditQuery,
    errors: Vec<String>,
    events: Vec<EventRow>,
    older: Option<String>,
    paged: bool,
    newest: String,
    export_csv: String,
    export_jsonl: String,
    can_export: bool,
    event_types: Vec<&'static str>,
    outcomes: Vec<&'static str>,
    agents: Vec<String>,
    tools: Vec<String>,
    presets: Vec<Preset>,
}

pub async fn index(
    State(state): State<WebState>,
    ctx: Ctx,
    Query(q): Query<AuditQuery>,
) -> Result<Response, WebError> {
    let (filter, mut errors) = q.filter();
    let before = match q.before.trim() {
        "" => None,
        b => match b.parse::<i64>() {
            Ok(b) => Some(b),
            Err(_) => {
                errors.push(format!("`{b}` is not an event id"));
                None
            }
        },
    };
    let actor = ctx.admin.actor();
    let rows = audit_access::rows(&state, reader(&actor), &filter, before, PAGE_SIZE).await?;
    let qs = q.query_string();
    let with = |extra: &str| {
        if qs.is_empty() {
            format!("?{extra}")
        } else if extra.is_empty() {
            format!("?{qs}")
        } else {
            format!("?{qs}&{extra}")
        }
    };
    let older = (rows.len() as i64 == PAGE_SIZE)
        .then(|| rows.last().and_then(|r| r.id))
        .flatten()
        .map(|id| format!("/admin/audit{}", with(&format!("before={id}"))));
    let snapshot = state.policy.load();
    let now = Utc::now();
    let preset = |label: &'static str, hours: i64| {
        let mut p = q.clone();
        p.since = (now - chrono::Duration::hours(hours))
            .format("%Y-%m-%dT%H:%M")
            .to_string();
        p.until = String::new();
        Preset {
            label,
            href: format!("/admin/audit?{}", p.query_string()),
        }
    };
    let presets = vec![
        preset("Last hour", 1),
        preset("Last 24 hours", 24),
        preset("Last 7 days", 24 * 7),
    ];
    let page = AuditPage {
        page: ctx.page(Nav::Audit, "Audit log"),
        errors,
        events: rows.iter().map(event_row).collect(),
        older,
        paged: before.is_some(),
        newest: format!("/admin/audit{}", with("")),
        export_csv: format!("/admin/audit/export{}", with("format=csv")),
        export_jsonl: format!("/admin/audit/export{}", with("format=jsonl")),
        can_export: ctx.role().can_export(),
        event_types: EventKind::ALL.iter().map(|k| k.as_str()).collect(),
        outcomes: Outcome::ALL.iter().map(|o| o.as_str()).collect(),
        agents: snapshot
            .agents()
            .iter()
            .map(|a| a.record.name.clone())
            .collect(),
        tools: snapshot
            .catalog
            .tools()
            .map(|t| t.name.as_str().to_owned())
            .collect(),
        presets,
        q,
    };
    render(&page)
}

/// A block of (possibly JSON) text on the event page.
pub struct Block {
    pub label: &'static str,
    pub text: String,
}

#[derive(Template)]
#[template(path = "admin/audit/show.html")]
struct EventPage {
    page: PageCtx,
    id: i64,
    fields: Vec<(&'static str, String)>,
    blocks: Vec<Block>,
    hidden: Vec<&'static str>,
}

pub async fn show(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> Result<Response, WebError> {
    let id: i64 = id.parse().map_err(|_| WebError::NotFound)?;
    let actor = ctx.admin.actor();
    let row = match audit_access::row(&state, reader(&actor), id).await {
        Err(ServiceError::NotFound(_)) => {
            return Err(WebError::Missing(format!("Audit event {id}")));
        }
        r => r?,
    };
    let e = &row.event;
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let num = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_default();
    let mut fields = vec![
        (
            "Time",
            e.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        ),
        ("Event type", e.event_type.clone()),
        ("Outcome", e.outcome.clone()),
        ("Agent", opt(&e.agent)),
        ("Tool", opt(&e.tool)),
        ("Admin / actor", opt(&e.admin_user)),
        ("Resource", opt(&e.resource)),
        ("OAuth client", opt(&e.client_id)),
        ("Person (signed in through the host)", opt(&e.person)),
        ("Token id (jti)", opt(&e.jti)),
        ("Call id", opt(&e.call_id)),
        ("Request id", opt(&e.request_id)),
        ("Remote address", opt(&e.remote_addr)),
        ("User agent", opt(&e.user_agent)),
        (
            "Exit code",
            e.exit_code.map(|c| c.to_string()).unwrap_or_default(),
        ),
        (
            "Latency",
            e.latency_us
                .map(|us| format!("{:.1} ms", us as f64 / 1000.0))
                .unwrap_or_default(),
        ),
        ("Bytes in", num(e.bytes_in)),
        ("Bytes out", num(e.bytes_out)),
        ("Result sha256", opt(&e.result_sha256)),
        ("Instance", row.instance.clone()),
        ("Chain", row.chain.clone()),
        ("Chain sequence", row.chain_seq.to_string()),
        ("Previous hash", row.prev_hash.clone()),
        ("Hash", row.hash.clone()),
    ];
    fields.retain(|(_, v)| !v.is_empty());
    let see_args = ctx.role().can_see_arguments();
    let mut blocks = Vec::new();
    let mut hidden = Vec::new();
    if let Some(error) = &e.error {
        let shown = if see_args {
            crate::audit::ErrorForViewer::Whole
        } else {
            e.error_without_arguments()
        };
        match shown {
            crate::audit::ErrorForViewer::Whole => blocks.push(Block {
                label: "Error",
                text: pretty_json(error),
            }),
            crate::audit::ErrorForViewer::Summary(text) => {
                blocks.push(Block {
                    label: "Error",
                    text,
                });
                hidden.push("the argument values the error quotes");
            }
            crate::audit::ErrorForViewer::Hidden => hidden.push("Error"),
        }
    }
    for (label, value, sensitive) in [
        ("Arguments", &e.arguments, true),
        ("Result", &e.result, true),
        ("Details", &e.details, false),
    ] {
        let Some(v) = value else { continue };
        if sensitive && !see_args {
            hidden.push(label);
        } else {
            blocks.push(Block {
                label,
                text: pretty_json(v),
            });
        }
    }
    render(&EventPage {
        page: ctx.page(Nav::Audit, format!("Audit event {id}")),
        id,
        fields,
        blocks,
        hidden,
    })
}

/// Streams the current filter as CSV or JSONL; for the roles that may export.
pub async fn export(
    State(state): State<WebState>,
    ctx: Ctx,
    Query(q): Query<AuditQuery>,
) -> Result<Response, WebError> {
    if !ctx.role().can_export() {
        return Err(WebError::Forbidden(
            "The viewer role cannot export the audit log, which holds tool arguments.".into(),
        ));
    }
    let format = match q.format.as_str() {
        "csv" => Format::Csv,
        "jsonl" => Format::Jsonl,
        other => {
            return Err(WebError::BadRequest(format!(
                "Unknown export format `{other}`; use csv or jsonl."
            )));
        }
    };
    let (filter, errors) = q.filter();
    if let Some(e) = errors.into_iter().next() {
        return Err(WebError::BadRequest(e));
    }
    // Who took a copy of the log, and of what, is itself part of the record.
    let actor = ctx.admin.actor();
    let body = audit_access::export(&state, reader(&actor), format, filter).await?;
    Ok(export_response(format, body))
}

/// Who reads the log through these pages.
pub(super) fn reader(actor: &str) -> Reader<'_> {
    Reader {
        who: actor,
        channel: Channel::Ui,
    }
}

/// An export as a download: streamed, one row in memory at a time, never cached.
fn export_response(
    format: Format,
    body: impl futures::Stream<Item = Result<bytes::Bytes, sqlx::Error>> + Send + 'static,
) -> Response {
    use futures::StreamExt;
    let body = body.map(|r| {
        r.map_err(|e| {
            tracing::error!(error = %e, "audit export failed mid-stream");
            std::io::Error::other("audit export failed")
        })
    });
    (
        [
            (header::CONTENT_TYPE, format.content_type().to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{}\"", format.file_name()),
            ),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}
