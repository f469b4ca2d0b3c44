//! `tools/list`: one listing, and two ways of answering it.
//!
//! Through the SDK, a request spawns a service of its own, travels to the handler over a
//! channel, and comes back as a typed result that is serialized anew: every visible schema,
//! on every list. Most lists are the plainest kind of request, so this module answers those
//! itself, before the SDK: each tool keeps its entry serialized ([`Tool::mcp_json`]), and
//! the answer is the SDK's own envelope, serialized by the SDK's types, with those entries
//! copied in. A request with anything about it that the SDK might treat differently (an
//! `Origin`, quality values in `Accept`, an unknown protocol revision, a `_meta` it would
//! refuse, …) goes on to the SDK, which gives the answer or the error it always gave: the
//! fast path may only be faster, never different. `tests/api/mcp_fast_list.rs` holds it to
//! that, byte for byte, in both eras.
//!
//! Both ways share [`listing`]: grants, limits and the audit row are decided once.
//!
//! [`Tool::mcp_json`]: crate::pool::Tool::mcp_json

use std::borrow::Cow;
use std::sync::LazyLock;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use rmcp::ErrorData as McpError;
use rmcp::model::{
    CacheScope, ClientJsonRpcMessage, ClientRequest, GetMeta, JsonRpcMessage, ListToolsResult,
    ProtocolVersion, ServerJsonRpcMessage, ServerResult,
};
use serde_json::json;

use super::{decode_cursor, encode_cursor, page, refused};
use crate::audit::{EventKind, Outcome, RequestOrigin};
use crate::gate::{Gate, Surface};
use crate::policy::snapshot::{Discovery, Principal};
use crate::search::{self, Listed};
use crate::state::AppState;

/// One page of a caller's `tools/list`.
pub(super) struct Listing {
    pub entries: Vec<Listed>,
    pub next_cursor: Option<String>,
}

/// The caller's `tools/list` page after `cursor`: admitted by its limits, and audited with
/// what it showed.
pub(super) async fn listing(
    state: &AppState,
    gate: &Gate<'_>,
    cursor: Option<&str>,
) -> Result<Listing, McpError> {
    gate.admit(EventKind::ToolsList).await.map_err(refused)?;
    let visible = gate.visible();
    let after = match cursor.filter(|c| !c.is_empty()) {
        Some(c) => Some(decode_cursor(c)?),
        None => None,
    };
    let page_size = state.settings.page_size;
    let discovery = gate.discovery();
    let (entries, more) = if matches!(discovery, Discovery::Search | Discovery::Index) {
        let listed = if discovery == Discovery::Index {
            search::index_entries_with(gate.pinned(), &visible, gate.index_tool())
        } else {
            search::search_entries(gate.pinned(), &visible)
        };
        let (p, more) = page(&listed, Listed::name, after.as_deref(), page_size);
        (p.to_vec(), more)
    } else {
        let (p, more) = page(&visible, |t| t.name.as_str(), after.as_deref(), page_size);
        (p.iter().cloned().map(Listed::Tool).collect(), more)
    };
    let shown: Vec<&str> = entries.iter().map(Listed::name).collect();
    let next_cursor = more
        .then(|| shown.last().map(|last| encode_cursor(last)))
        .flatten();
    gate.disclosed(
        EventKind::ToolsList,
        Outcome::Success,
        json!({"shown": shown, "discovery": discovery.as_str()}),
    );
    Ok(Listing {
        entries,
        next_cursor,
    })
}

impl Listing {
    /// The page as the SDK's result, definitions left out: [`Self::into_result`] fills them in,
    /// the fast path splices their text in.
    fn shell(next_cursor: Option<String>) -> ListToolsResult {
        let mut result = ListToolsResult::with_all_items(Vec::new())
            // Filtered per token, and a revoked grant must vanish on the next request.
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private);
        result.next_cursor = next_cursor;
        result
    }

    /// The page as the SDK's typed result, for the SDK to answer.
    pub fn into_result(self) -> ListToolsResult {
        let mut result = Self::shell(self.next_cursor);
        result.tools = self.entries.iter().map(Listed::definition).collect();
        result
    }
}

/// The protocol era a request is answered in: it decides the result's shape, as the SDK's
/// handler does (`resultType` and caching hints from 2026-07-28 on, neither before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Era {
    Legacy,
    Modern,
}

const JSON: &str = "application/json";
const EVENT_STREAM: &str = "text/event-stream";

/// Answers `message` when it is a `tools/list` the SDK would dispatch to the handler as it
/// is; `None` sends it on to the SDK.
pub(super) async fn answer(
    state: &AppState,
    parts: &axum::http::request::Parts,
    message: &ClientJsonRpcMessage,
) -> Option<Response> {
    if !state.settings.mcp_fast_list {
        return None;
    }
    let JsonRpcMessage::Request(request) = message else {
        return None;
    };
    let ClientRequest::ListToolsRequest(list) = &request.request else {
        return None;
    };
    let era = era(
        &parts.headers,
        &request.request,
        &state.settings.allowed_hosts,
    )?;
    // Authentication ran first; without a principal the SDK path reports the wiring bug.
    let principal = parts.extensions.get::<Principal>()?;
    let origin = parts.extensions.get::<RequestOrigin>();
    let gate = Gate::new(state, principal, Surface::Mcp, origin);
    state.metrics.mcp_fast_lists.inc();
    let cursor = list.params.as_ref().and_then(|p| p.cursor.as_deref());
    let started = std::time::Instant::now();
    let listed = listing(state, &gate, cursor).await;
    state.metrics.mcp_operation(
        "tools/list",
        None,
        &principal.agent,
        listed
            .as_ref()
            .err()
            .map(|e| e.code.0.to_string())
            .as_deref(),
        started.elapsed(),
    );
    let message = match listed {
        Ok(listing) => return Some(json_response(body(listing, request.id.clone(), era))),
        Err(error) => ServerJsonRpcMessage::error(error, Some(request.id.clone())),
    };
    // The listing's errors (rate limited, audit or limits unavailable, a bad cursor) are
    // in-band JSON-RPC errors with HTTP 200 in both eras, as the SDK maps them.
    // An error that would not serialize (none does) is left to the SDK to answer.
    let bytes = serde_json::to_vec(&message).ok()?;
    Some(json_response(bytes))
}

fn json_response(body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(JSON));
    response
}

/// The answer's bytes: the SDK's envelope of an empty page, with the entries' text copied
/// between the brackets of its `"tools":[]`.
#[allow(
    clippy::expect_used,
    reason = "the SDK's own types always serialize, and always with the tools array"
)]
fn body(listing: Listing, id: rmcp::model::RequestId, era: Era) -> Vec<u8> {
    let mut result = ServerResult::ListToolsResult(Listing::shell(listing.next_cursor));
    match era {
        Era::Modern => result.fill_missing_cache_hints(),
        Era::Legacy => {
            result.strip_result_type_for_legacy_peer();
            result.strip_non_object_output_for_legacy_peer();
        }
    }
    let shell = serde_json::to_vec(&ServerJsonRpcMessage::response(result, id))
        .expect("a list result serializes");
    // The result is the envelope's last member and `tools` its only array, so the last
    // `"tools":[]` is the one to fill; the id before it is escaped JSON and cannot end a
    // string with this text unescaped.
    const EMPTY: &[u8] = br#""tools":[]"#;
    let at = shell
        .windows(EMPTY.len())
        .rposition(|w| w == EMPTY)
        .expect("the SDK writes the tools array")
        + EMPTY.len()
        - 1;
    let texts: Vec<Cow<'_, str>> = listing.entries.iter().map(entry_json).collect();
    let len = shell.len() + texts.iter().map(|t| t.len() + 1).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&shell[..at]);
    for (i, t) in texts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(t.as_bytes());
    }
    out.extend_from_slice(&shell[at..]);
    out
}

/// The meta-tools' entries, serialized once.
#[allow(
    clippy::expect_used,
    reason = "a meta-tool is the SDK's own type, which serializes"
)]
static META_JSON: LazyLock<Vec<(String, String)>> = LazyLock::new(|| {
    search::meta_tools()
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                serde_json::to_string(t).expect("a meta-tool serializes"),
            )
        })
        .collect()
});

#[allow(
    clippy::expect_used,
    reason = "META_JSON is built from the same list of meta-tools"
)]
fn entry_json<'a>(entry: &'a Listed) -> Cow<'a, str> {
    match entry {
        Listed::Tool(t) => t.mcp_json(),
        Listed::Index(t) => Cow::Borrowed(&t.json),
        Listed::Meta(m) => Cow::Borrowed(
            META_JSON
                .iter()
                .find(|(name, _)| name.as_str() == m.name)
                .map(|(_, text)| text.as_str())
                .expect("every meta-tool is serialized"),
        ),
    }
}

/// The era of a request the SDK would hand to the handler unchanged, or `None` when that is
/// not certain. Mirrors, conservatively, what the SDK checks before dispatch (rmcp 3.11's
/// `StreamableHttpService::handle` and `handle_post`, and the server handler's per-request
/// negotiation): anything this does not recognise falls through to the SDK.
fn era(headers: &HeaderMap, request: &ClientRequest, allowed_hosts: &[String]) -> Option<Era> {
    // A browser's request carries an Origin, which the SDK checks against its list: left to it.
    if headers.contains_key(header::ORIGIN) {
        return None;
    }
    if !host_allowed(headers, allowed_hosts) || !accepts_both(headers) {
        return None;
    }
    let header_version = single(headers, "mcp-protocol-version")?;
    let meta = request.get_meta();
    match meta.protocol_version() {
        // The session-era request: the header, when present, names a known revision that
        // predates per-request metadata.
        None => match header_version {
            None => Some(Era::Legacy),
            Some(v)
                if v < ProtocolVersion::V_2026_07_28.as_str()
                    && ProtocolVersion::KNOWN_VERSIONS
                        .iter()
                        .any(|k| k.as_str() == v) =>
            {
                Some(Era::Legacy)
            }
            Some(_) => None,
        },
        // The per-request era: a known revision named in `_meta` and the header alike, every
        // required `_meta` key present, and the one standard header a list needs.
        Some(version) => {
            let v = version.as_str();
            let known = ProtocolVersion::KNOWN_VERSIONS.contains(&version);
            let complete = meta
                .missing_required_keys(&ProtocolVersion::V_2026_07_28)
                .is_empty();
            let modern = v >= ProtocolVersion::V_2026_07_28.as_str();
            let method = single(headers, "mcp-method")? == Some("tools/list");
            let named = headers.contains_key("mcp-name");
            (known && complete && modern && header_version == Some(v) && method && !named)
                .then_some(Era::Modern)
        }
    }
}

/// The value of a header that must appear at most once: `Some(None)` when absent, `None` when
/// repeated or not text (the SDK decides those).
fn single<'h>(headers: &'h HeaderMap, name: &str) -> Option<Option<&'h str>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return None;
    }
    match first {
        None => Some(None),
        Some(v) => v.to_str().ok().map(Some),
    }
}

/// `Accept` lists both media types the transport requires, with no parameters (a quality
/// value is the SDK's to weigh).
fn accepts_both(headers: &HeaderMap) -> bool {
    let (mut json, mut sse) = (false, false);
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        if value.contains([';', '"']) {
            return false;
        }
        for essence in value.split(',').map(str::trim) {
            json |= essence.eq_ignore_ascii_case(JSON);
            sse |= essence.eq_ignore_ascii_case(EVENT_STREAM);
        }
    }
    json && sse
}

/// The one `Host` header names an allowed host, compared as the SDK compares them (host
/// case-insensitive without brackets; an allowed entry without a port allows any port).
fn host_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    let Some(Some(host)) = single(headers, header::HOST.as_str()) else {
        return false;
    };
    let Ok(host) = axum::http::uri::Authority::try_from(host) else {
        return false;
    };
    if allowed.is_empty() {
        return true;
    }
    let norm = |h: &str| h.trim_matches('[').trim_matches(']').to_ascii_lowercase();
    let (name, port) = (norm(host.host()), host.port_u16());
    allowed.iter().any(|a| {
        let a = a.trim();
        if a.is_empty() {
            return false;
        }
        let (h, p) = match axum::http::uri::Authority::try_from(a) {
            Ok(auth) => (norm(auth.host()), auth.port_u16()),
            Err(_) => (norm(a), None),
        };
        h == name && p.is_none_or(|p| port == Some(p))
    })
}
