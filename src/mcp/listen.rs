//! `subscriptions/listen` (MCP 2026-07-28): a client that holds the stream is told
//! `notifications/tools/list_changed` when what its `tools/list` would show changes — a grant
//! added or removed, a tool changed, held or approved, its discovery mode switched.
//!
//! This is the only era with a stream to push on: the gateway serves the 2025 era statelessly
//! (no session, so no GET stream), and those clients see a change on their next `tools/list`
//! (every list says `ttlMs: 0`).
//!
//! A stream lives no longer than the credentials it was opened with: they are checked again
//! on every policy change, and the stream ends at the token's expiry, at its revocation, or
//! when its client or host authorization goes. Streams are bounded per agent and in all, so
//! that no caller can hold the slots of another.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use rmcp::ErrorData as McpError;
use rmcp::model::{ErrorCode, SubscriptionFilter};
use rmcp::service::SubscriptionContext;
use serde_json::json;

use crate::auth::bearer;
use crate::gate::{Gate, Surface};
use crate::policy::snapshot::Principal;
use crate::state::AppState;

/// Streams held at once by one agent (all its clients and people together).
pub const PER_AGENT: usize = 16;
/// Streams held at once in all.
pub const IN_ALL: usize = 1024;

/// The streams held now, per agent.
#[derive(Debug, Default)]
pub struct Listeners {
    held: Mutex<HashMap<String, usize>>,
}

/// One held stream's place; given back when the stream ends.
pub struct Slot {
    listeners: Arc<Listeners>,
    agent: String,
}

impl Listeners {
    fn admit(self: &Arc<Self>, agent: &str) -> Option<Slot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = held.values().sum();
        let mine = held.get(agent).copied().unwrap_or(0);
        if total >= IN_ALL || mine >= PER_AGENT {
            return None;
        }
        held.insert(agent.to_owned(), mine + 1);
        Some(Slot {
            listeners: self.clone(),
            agent: agent.to_owned(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self
            .listeners
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.agent) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.agent);
            }
        }
    }
}

/// What the gateway pushes: tool list changes, nothing else.
pub fn accepted(requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
    let mut filter = SubscriptionFilter::new();
    filter.tools_list_changed = requested.tools_list_changed.filter(|wanted| *wanted);
    Some(filter)
}

/// What the caller's `tools/list` shows, as a fingerprint: names, definitions (by content
/// hash, and the agent's argument rules narrowing them) and the discovery mode. A change that
/// leaves it equal is not pushed; a rebuilt but equal narrowing may push once needlessly,
/// which costs the client one listing.
fn fingerprint(gate: &Gate<'_>) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    gate.has_meta_tools().hash(&mut h);
    gate.discovery().as_str().hash(&mut h);
    gate.pinned().hash(&mut h);
    for tool in gate.visible() {
        tool.name.as_str().hash(&mut h);
        tool.content_hash.hash(&mut h);
        tool.narrowing.as_ref().map(Arc::as_ptr).hash(&mut h);
    }
    h.finish()
}

/// Holds one stream until the client leaves, its credentials lapse or the server drains.
pub async fn hold(
    state: &AppState,
    listeners: &Arc<Listeners>,
    context: SubscriptionContext,
) -> Result<(), McpError> {
    let authorization = context
        .request_context()
        .extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.headers.get(http::header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let check = || bearer::recheck(state, authorization.as_deref()).ok();
    let Some((principal, _)) = check() else {
        return Ok(());
    };
    let Some(_slot) = listeners.admit(&principal.agent) else {
        return Err(McpError::new(
            ErrorCode(super::RATE_LIMITED),
            format!("too many open subscriptions: at most {PER_AGENT} per agent ({IN_ALL} in all)"),
            Some(json!({"limit": PER_AGENT})),
        ));
    };
    let mut swaps = state.policy.swaps();
    let mut shown = fingerprint(&gate(state, &principal));
    loop {
        let Some((principal, until)) = check() else {
            return Ok(());
        };
        let now = fingerprint(&gate(state, &principal));
        if now != shown {
            shown = now;
            if context.sink().notify_tool_list_changed().await.is_err() {
                return Ok(());
            }
        }
        let expiry = async {
            match until {
                Some(at) => {
                    let left = (at - chrono::Utc::now().timestamp()).max(0) as u64;
                    // One second past the instant, so that the check after it refuses.
                    tokio::time::sleep(std::time::Duration::from_secs(left + 1)).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = context.cancelled() => return Ok(()),
            changed = swaps.changed() => if changed.is_err() { return Ok(()) },
            _ = expiry => {}
        }
    }
}

fn gate<'a>(state: &'a AppState, principal: &'a Principal) -> Gate<'a> {
    Gate::new(state, principal, Surface::Mcp, None)
}
