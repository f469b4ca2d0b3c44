//! The immutable policy snapshot each instance serves from.
//!
//! Postgres holds the truth; every instance keeps this snapshot behind an atomic pointer and
//! rebuilds it when Postgres notifies a change or the pool reloads. The request path reads
//! the snapshot and never queries Postgres.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{GrantTarget, may_use};
use crate::pool::{Catalog, Tool};

/// How an agent's `tools/list` is shaped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Discovery {
    /// Every visible tool.
    #[default]
    Full,
    /// A search meta-tool and a call meta-tool, plus pinned tools.
    Search,
    /// Full while the visible tools fit a token budget, search above it.
    Auto,
}

impl Discovery {
    pub fn as_str(self) -> &'static str {
        match self {
            Discovery::Full => "full",
            Discovery::Search => "search",
            Discovery::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "full" => Some(Discovery::Full),
            "search" => Some(Discovery::Search),
            "auto" => Some(Discovery::Auto),
            _ => None,
        }
    }
}

/// One grant as stored.
#[derive(Debug, Clone, Serialize)]
pub struct GrantRecord {
    pub id: Uuid,
    pub target: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

/// A rate limit as stored: for the whole agent when `pattern` is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitRecord {
    pub pattern: Option<String>,
    pub per_second: u32,
    pub burst: u32,
}

/// An agent as stored, with its grants and limits.
#[derive(Debug, Clone, Serialize)]
pub struct AgentRecord {
    pub id: Uuid,
    pub name: String,
    pub description: String,
    pub notes: String,
    pub discovery: Discovery,
    pub pinned: Vec<String>,
    pub grants: Vec<GrantRecord>,
    pub limits: Vec<RateLimitRecord>,
}

/// An OAuth client as the token verifier needs it.
#[derive(Debug, Clone)]
pub struct ClientRecord {
    pub client_id: String,
    pub agent: String,
}

/// A public key that may have signed a token.
#[derive(Debug, Clone)]
pub struct VerifyKey {
    pub kid: String,
    pub public_key: Vec<u8>,
}

/// The control-plane state as read from Postgres in one go.
#[derive(Debug, Clone, Default)]
pub struct PolicyState {
    pub agents: Vec<AgentRecord>,
    pub clients: Vec<ClientRecord>,
    pub revoked: Vec<Uuid>,
    pub keys: Vec<VerifyKey>,
}

/// Who is calling: established from a verified token (or the dev-agent flag).
#[derive(Debug, Clone)]
pub struct Principal {
    pub agent: String,
    pub client_id: String,
    pub jti: Option<Uuid>,
    /// The prefixes the token carries; the live grants narrow them further.
    pub prefixes: Vec<GrantTarget>,
}

/// How one grant fares against the current catalog.
#[derive(Debug, Clone, Serialize)]
pub struct GrantMatch {
    pub id: Uuid,
    pub target: String,
    pub matched_tools: usize,
    /// Nearest existing names when nothing matches.
    pub suggestions: Vec<String>,
}

/// One agent, precomputed for the hot path.
#[derive(Debug)]
pub struct AgentView {
    pub record: AgentRecord,
    pub grants: Vec<GrantTarget>,
    pub grant_matches: Vec<GrantMatch>,
    /// Every tool the live grants match, in name order.
    pub visible: Vec<Arc<Tool>>,
}

impl AgentView {
    /// Grants that match nothing: the silent typo this product exists to make loud.
    pub fn zero_match_grants(&self) -> impl Iterator<Item = &GrantMatch> {
        self.grant_matches.iter().filter(|g| g.matched_tools == 0)
    }
}

/// Everything a request needs to decide, in memory.
#[derive(Debug, Default)]
pub struct PolicySnapshot {
    pub catalog: Arc<Catalog>,
    agents: HashMap<String, Arc<AgentView>>,
    clients: HashMap<String, String>,
    revoked: HashSet<Uuid>,
    keys: HashMap<String, Vec<u8>>,
}

impl PolicySnapshot {
    pub fn build(catalog: Arc<Catalog>, state: &PolicyState) -> Self {
        let agents = state
            .agents
            .iter()
            .map(|a| {
                let grants: Vec<GrantTarget> = a
                    .grants
                    .iter()
                    .filter_map(|g| GrantTarget::parse(&g.target).ok())
                    .collect();
                let grant_matches = a
                    .grants
                    .iter()
                    .map(|g| {
                        let matched = GrantTarget::parse(&g.target)
                            .map(|t| t.matched(&catalog).len())
                            .unwrap_or(0);
                        GrantMatch {
                            id: g.id,
                            target: g.target.clone(),
                            matched_tools: matched,
                            suggestions: if matched == 0 {
                                super::suggestions(&g.target, &catalog)
                            } else {
                                Vec::new()
                            },
                        }
                    })
                    .collect();
                let visible = catalog
                    .tools()
                    .filter(|t| grants.iter().any(|g| g.matches(t.name.as_str())))
                    .cloned()
                    .collect();
                (
                    a.name.clone(),
                    Arc::new(AgentView {
                        record: a.clone(),
                        grants,
                        grant_matches,
                        visible,
                    }),
                )
            })
            .collect();
        Self {
            catalog,
            agents,
            clients: state
                .clients
                .iter()
                .map(|c| (c.client_id.clone(), c.agent.clone()))
                .collect(),
            revoked: state.revoked.iter().copied().collect(),
            keys: state
                .keys
                .iter()
                .map(|k| (k.kid.clone(), k.public_key.clone()))
                .collect(),
        }
    }

    pub fn agent(&self, name: &str) -> Option<&Arc<AgentView>> {
        self.agents.get(name)
    }

    /// Agents in name order.
    pub fn agents(&self) -> Vec<&Arc<AgentView>> {
        let mut v: Vec<_> = self.agents.values().collect();
        v.sort_by(|a, b| a.record.name.cmp(&b.record.name));
        v
    }

    /// The agent a client belongs to, if the client still exists.
    pub fn client_agent(&self, client_id: &str) -> Option<&str> {
        self.clients.get(client_id).map(String::as_str)
    }

    pub fn is_revoked(&self, jti: &Uuid) -> bool {
        self.revoked.contains(jti)
    }

    pub fn verify_key(&self, kid: &str) -> Option<&[u8]> {
        self.keys.get(kid).map(Vec::as_slice)
    }

    /// The tools `principal` may see, in name order.
    pub fn visible(&self, principal: &Principal) -> Vec<Arc<Tool>> {
        let Some(agent) = self.agents.get(&principal.agent) else {
            return Vec::new();
        };
        agent
            .visible
            .iter()
            .filter(|t| may_use(&agent.grants, &principal.prefixes, t.name.as_str()))
            .cloned()
            .collect()
    }

    /// The tool `name` if `principal` may call it; `None` whether it is unknown or not granted,
    /// so that a tool's existence does not leak.
    pub fn resolve(&self, principal: &Principal, name: &str) -> Option<Arc<Tool>> {
        let agent = self.agents.get(&principal.agent)?;
        if !may_use(&agent.grants, &principal.prefixes, name) {
            return None;
        }
        self.catalog.get(name).cloned()
    }

    /// Number of grants that match no tool, across all agents.
    pub fn zero_match_grant_count(&self) -> usize {
        self.agents
            .values()
            .map(|a| a.zero_match_grants().count())
            .sum()
    }

    /// Number of agents whose grants match no tool at all.
    pub fn agents_without_tools(&self) -> usize {
        self.agents
            .values()
            .filter(|a| a.visible.is_empty())
            .count()
    }
}

/// The current snapshot, swapped atomically when either input changes.
#[derive(Debug)]
pub struct PolicyHandle {
    current: ArcSwap<PolicySnapshot>,
    inputs: Mutex<(Arc<Catalog>, Arc<PolicyState>)>,
}

impl Default for PolicyHandle {
    fn default() -> Self {
        Self {
            current: ArcSwap::from_pointee(PolicySnapshot::default()),
            inputs: Mutex::new((
                Arc::new(Catalog::default()),
                Arc::new(PolicyState::default()),
            )),
        }
    }
}

impl PolicyHandle {
    pub fn load(&self) -> Arc<PolicySnapshot> {
        self.current.load_full()
    }

    pub fn set_catalog(&self, catalog: Arc<Catalog>) {
        let mut inputs = self.inputs.lock().unwrap_or_else(|p| p.into_inner());
        inputs.0 = catalog;
        self.current
            .store(Arc::new(PolicySnapshot::build(inputs.0.clone(), &inputs.1)));
    }

    pub fn set_state(&self, state: PolicyState) {
        let mut inputs = self.inputs.lock().unwrap_or_else(|p| p.into_inner());
        inputs.1 = Arc::new(state);
        self.current
            .store(Arc::new(PolicySnapshot::build(inputs.0.clone(), &inputs.1)));
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.load().catalog.clone()
    }
}
