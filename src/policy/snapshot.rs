//! The immutable policy snapshot each instance serves from.
//!
//! Postgres holds the truth; every instance keeps this snapshot behind an atomic pointer and
//! rebuilds it when Postgres notifies a change or the pool reloads. The request path reads
//! the snapshot and never queries Postgres.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::arguments::{self, ArgumentRules, RuleProblem};
use super::{GrantTarget, TokenScope, may_use};
use crate::limits::{Limit, LimitForm};
use crate::pool::{Catalog, Tool};
use crate::search::SearchIndex;

/// How an agent's `tools/list` is shaped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Discovery {
    /// Every visible tool.
    #[default]
    Full,
    /// A search meta-tool and a call meta-tool, plus pinned tools.
    Search,
    /// The meta-tools (search, load, call), the index of every visible tool (name and one
    /// line) in the search tool's description, plus pinned tools.
    Index,
    /// Full while the visible tools fit a token budget, the index while it fits its own,
    /// search above both.
    Auto,
}

impl Discovery {
    pub fn as_str(self) -> &'static str {
        match self {
            Discovery::Full => "full",
            Discovery::Search => "search",
            Discovery::Index => "index",
            Discovery::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "full" => Some(Discovery::Full),
            "search" => Some(Discovery::Search),
            "index" => Some(Discovery::Index),
            "auto" => Some(Discovery::Auto),
            _ => None,
        }
    }
}

/// Where an agent or a group is edited when not in the admin UI and API: `managed: files` in
/// its policy file makes it read-only everywhere but `policy apply`. Only `files` exists: a
/// source the gateway cannot see (`git`, a CMDB) is still files by the time it is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Managed {
    Files,
}

impl Managed {
    pub fn as_str(self) -> &'static str {
        match self {
            Managed::Files => "files",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "files" => Some(Managed::Files),
            _ => None,
        }
    }
}

/// One grant as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GrantRecord {
    pub id: Uuid,
    pub target: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

/// A rate limit as stored: for the whole agent when `pattern` is `None`. In JSON it is the
/// written form with the pattern beside it: `{"pattern": "weather", "per_minute": 30, "burst": 5}`.
/// The pattern is parsed where it is read, so the limiter matches calls against it as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitRecord {
    pub pattern: Option<GrantTarget>,
    pub limit: Limit,
}

/// The JSON form. Written out rather than flattened: serde cannot deny unknown fields
/// through `flatten`, and a misspelt `per_minut` must be an error, not an absent key.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitJson {
    pattern: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    per_second: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    per_minute: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    per_hour: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burst: Option<f64>,
}

impl Serialize for RateLimitRecord {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("pattern", &self.pattern)?;
        // The limit's own form, so numbers are written as the admin wrote them.
        let form = serde_json::to_value(self.limit).map_err(serde::ser::Error::custom)?;
        if let serde_json::Value::Object(o) = form {
            for (k, v) in o {
                m.serialize_entry(&k, &v)?;
            }
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for RateLimitRecord {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let j = RateLimitJson::deserialize(d)?;
        let form = LimitForm {
            per_second: j.per_second,
            per_minute: j.per_minute,
            per_hour: j.per_hour,
            burst: j.burst,
        };
        let limit = form.parse().map_err(serde::de::Error::custom)?;
        let pattern = j
            .pattern
            .map(|p| GrantTarget::parse(&p))
            .transpose()
            .map_err(serde::de::Error::custom)?;
        Ok(Self { pattern, limit })
    }
}

/// An agent as stored, with its grants and limits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentRecord {
    pub id: Uuid,
    pub name: String,
    pub description: String,
    pub notes: String,
    pub discovery: Discovery,
    pub pinned: Vec<String>,
    /// `Some(Files)`: changed only by `policy apply`.
    pub managed: Option<Managed>,
    pub grants: Vec<GrantRecord>,
    pub limits: Vec<RateLimitRecord>,
    /// Argument rules, per tool or group.
    pub arguments: Vec<ArgumentRules>,
    /// Approval rules, per tool, group or `@destructive`.
    pub approvals: Vec<super::approvals::ApprovalRule>,
    /// People who may act as this agent through an interactive host, by username.
    pub users: Vec<String>,
}

/// An OAuth client as the token verifier needs it.
#[derive(Debug, Clone)]
pub struct ClientRecord {
    pub client_id: String,
    pub agent: String,
}

/// A person's consent that a host acts as an agent, while it is not revoked. Tokens issued
/// from it are checked against it on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveAuthorization {
    pub id: Uuid,
    pub client_id: String,
    pub agent: String,
    pub username: String,
}

/// A public key that may have signed a token.
#[derive(Debug, Clone)]
pub struct VerifyKey {
    pub kid: String,
    pub public_key: Vec<u8>,
}

/// Which groups are pinned and what their tools' approved definitions are.
#[derive(Debug, Clone, Default)]
pub struct PinState {
    pub groups: HashSet<String>,
    /// Approved content hash by tool name.
    pub approved: HashMap<String, String>,
}

impl PinState {
    /// A tool of a pinned group is held while its definition is not the approved one (a new
    /// tool has none). The previously approved definition is not served in its place: this
    /// instance no longer has it, and serving stale text under a new script would be worse.
    /// A script tool loaded before its group was pinned is held too, until the load that
    /// copies its script: until then a call would run the folder's file, not the hashed bytes.
    pub fn holds(&self, tool: &Tool) -> bool {
        self.groups.contains(tool.group())
            && (!self
                .approved
                .get(tool.name.as_str())
                .is_some_and(|h| tool.content_hash == *h)
                || matches!(&tool.exec, crate::pool::Execution::Script(s) if s.awaits_copy()))
    }
}

/// Which parts of the control plane a change touched, so that a reload re-reads only those:
/// a new client or a revoked token must not re-read 10,000 agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Parts(u8);

impl Parts {
    pub const AGENTS: Parts = Parts(1);
    pub const CLIENTS: Parts = Parts(1 << 1);
    pub const REVOKED: Parts = Parts(1 << 2);
    pub const KEYS: Parts = Parts(1 << 3);
    pub const PINS: Parts = Parts(1 << 4);
    pub const AUTHORIZATIONS: Parts = Parts(1 << 5);
    /// Not in [`PolicyState`]: the upstream supervisors follow the `upstreams` table.
    pub const UPSTREAMS: Parts = Parts(1 << 6);
    /// Not in [`PolicyState`]: the sealed credentials, held by the credential store.
    pub const CREDENTIALS: Parts = Parts(1 << 7);
    pub const ALL: Parts = Parts(u8::MAX);
    /// Every part held in [`PolicyState`].
    pub const ALL_STATE: Parts = Parts((1 << 6) - 1);

    /// What a change to `table` touches: the payload of a `toolgate_policy` notification.
    /// A table this version does not know (a newer instance's migration, a hand-made NOTIFY)
    /// touches everything.
    pub fn of_table(table: &str) -> Parts {
        match table {
            // Clients and authorizations name their agent: an agent renamed or deleted
            // changes them too.
            "agents" => Parts::AGENTS | Parts::CLIENTS | Parts::AUTHORIZATIONS,
            "agent_grants"
            | "rate_limits"
            | "agent_argument_rules"
            | "agent_approval_rules"
            | "agent_users" => Parts::AGENTS,
            // Deleting a client deletes its authorizations.
            "oauth_clients" => Parts::CLIENTS | Parts::AUTHORIZATIONS,
            "revoked_tokens" => Parts::REVOKED,
            "signing_keys" => Parts::KEYS,
            "tool_groups" | "tool_approvals" => Parts::PINS,
            "oauth_authorizations" => Parts::AUTHORIZATIONS,
            "upstreams" => Parts::UPSTREAMS,
            "credentials" => Parts::CREDENTIALS,
            _ => Parts::ALL,
        }
    }

    pub fn contains(self, other: Parts) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn intersects(self, other: Parts) -> bool {
        self.0 & other.0 != 0
    }
}

impl std::ops::BitOr for Parts {
    type Output = Parts;
    fn bitor(self, other: Parts) -> Parts {
        Parts(self.0 | other.0)
    }
}

impl std::ops::BitOrAssign for Parts {
    fn bitor_assign(&mut self, other: Parts) {
        self.0 |= other.0;
    }
}

/// The control-plane state as read from Postgres in one go.
#[derive(Debug, Clone, Default)]
pub struct PolicyState {
    pub pins: PinState,
    pub agents: Vec<AgentRecord>,
    pub clients: Vec<ClientRecord>,
    pub revoked: Vec<Uuid>,
    pub keys: Vec<VerifyKey>,
    pub authorizations: Vec<LiveAuthorization>,
}

/// Who is calling: established from a verified token (or the dev-agent flag).
#[derive(Debug, Clone)]
pub struct Principal {
    pub agent: String,
    pub client_id: String,
    pub jti: Option<Uuid>,
    /// What the token reaches within the live grants: all of them, or the targets it was
    /// issued for.
    pub scope: TokenScope,
    /// The person a host acts for (the token's `act`), when it was obtained by sign-in.
    pub person: Option<String>,
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
    /// Every tool the live grants match, in name order; a tool its argument rules narrow is
    /// this agent's narrowed copy.
    pub visible: Vec<Arc<Tool>>,
    /// The narrowed copies, by name.
    pub(crate) narrowed: HashMap<String, Arc<Tool>>,
    /// Argument rules that cannot do what their author meant.
    pub argument_problems: Vec<RuleProblem>,
    /// Approval rules, compiled for the core path.
    pub approvals: Vec<super::approvals::CompiledApproval>,
}

impl AgentView {
    /// Grants that match nothing: the silent typo this product exists to make loud.
    pub fn zero_match_grants(&self) -> impl Iterator<Item = &GrantMatch> {
        self.grant_matches.iter().filter(|g| g.matched_tools == 0)
    }

    /// The first approval rule that asks for a call of `tool` with `args`, if any.
    pub fn approval_for(
        &self,
        tool: &Tool,
        args: &serde_json::Value,
    ) -> Option<&super::approvals::CompiledApproval> {
        self.approvals.iter().find(|r| r.asks(tool, args))
    }
}

/// Memo key of a `tools/list` token count: the agent and its token's targets (sorted), or
/// `None` for a token that follows all of the agent's grants.
/// Whose list (agent, token scope) and which: the definitions (`false`) or the index mode's.
type ListKey = (String, Option<Vec<String>>, bool);

/// Bound on the token-count memo; it is cleared, not evicted, when full.
const MAX_MEMO: usize = 4096;

/// Everything a request needs to decide, in memory.
#[derive(Debug, Default)]
pub struct PolicySnapshot {
    pub catalog: Arc<Catalog>,
    /// The catalog's search index: rebuilt with the catalog, shared by policy-only rebuilds.
    search: Arc<SearchIndex>,
    agents: HashMap<String, Arc<AgentView>>,
    clients: HashMap<String, String>,
    revoked: HashSet<Uuid>,
    /// Authorizations not revoked, by id.
    authorizations: HashMap<Uuid, LiveAuthorization>,
    /// Tools of the catalog that no agent may see or call: pinned and not approved as they are.
    held: HashSet<String>,
    keys: HashMap<String, Vec<u8>>,
    /// Tokens of visible tools' definitions, computed on first use: a pure function of this
    /// snapshot, so it lives and dies with it.
    list_tokens: Mutex<HashMap<ListKey, usize>>,
    pool_tokens: OnceLock<usize>,
    /// Index mode's `search_tools` per caller's view, built on first use: the same bytes for
    /// every listing of one view, until visibility or a definition changes.
    indexes: Mutex<IndexMemo>,
}

/// The built indexes and their bytes: cleared when they would pass [`MAX_INDEX_BYTES`].
#[derive(Debug, Default)]
struct IndexMemo {
    by_view: HashMap<ListKey, Arc<crate::search::IndexTool>>,
    bytes: usize,
}

/// Bound on the memory the index memo holds (an index of 100,000 tools is megabytes).
const MAX_INDEX_BYTES: usize = 32 << 20;

impl PolicySnapshot {
    /// A snapshot with a search index built for `catalog`.
    pub fn build(catalog: Arc<Catalog>, state: &PolicyState) -> Self {
        let search = Arc::new(SearchIndex::build(&catalog, None));
        Self::build_indexed(catalog, search, state)
    }

    /// A snapshot over `catalog` and its already built `search` index.
    pub fn build_indexed(
        catalog: Arc<Catalog>,
        search: Arc<SearchIndex>,
        state: &PolicyState,
    ) -> Self {
        Self::rebuild(None, catalog, search, state)
    }

    /// [`Self::build_indexed`], reusing what `previous` computed that cannot have changed: an
    /// agent whose record is the same, over the same catalog with the same tools held, has the
    /// same view. A change to one agent or client then costs that agent's view, not every
    /// agent's (10,000 agents over 100,000 tools: the grant matching is most of a rebuild).
    fn rebuild(
        previous: Option<&PolicySnapshot>,
        catalog: Arc<Catalog>,
        search: Arc<SearchIndex>,
        state: &PolicyState,
    ) -> Self {
        let held: HashSet<String> = catalog
            .tools()
            .filter(|t| state.pins.holds(t))
            .map(|t| t.name.as_str().to_owned())
            .collect();
        let reusable = previous.filter(|p| Arc::ptr_eq(&p.catalog, &catalog) && p.held == held);
        let agents = state
            .agents
            .iter()
            .map(|a| {
                if let Some(view) = reusable
                    .and_then(|p| p.agents.get(&a.name))
                    .filter(|v| v.record == *a)
                {
                    return (a.name.clone(), view.clone());
                }
                // Each stored grant parsed once, here: the live grants the calls are decided
                // by are these. One that does not parse (written before its rule) grants
                // nothing, and is still listed, so that an admin sees it and removes it.
                let parsed: Vec<Option<GrantTarget>> = a
                    .grants
                    .iter()
                    .map(|g| GrantTarget::parse(&g.target).ok())
                    .collect();
                let grants: Vec<GrantTarget> = parsed.iter().flatten().cloned().collect();
                let grant_matches = a
                    .grants
                    .iter()
                    .zip(&parsed)
                    .map(|(g, t)| {
                        let matched = t
                            .as_ref()
                            .map(|t| {
                                let matched = t.matched(&catalog);
                                matched
                                    .iter()
                                    .filter(|n| !held.contains(n.as_str()))
                                    .count()
                            })
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
                // The union of what each grant matches, in name order; found by name, so a
                // rebuild costs what the agents see, not agents × pool.
                let visible: Vec<Arc<Tool>> = grants
                    .iter()
                    .flat_map(|g| g.matched_tools(&catalog))
                    .filter(|t| !held.contains(t.name.as_str()))
                    .map(|t| (t.name.as_str(), t))
                    .collect::<std::collections::BTreeMap<_, _>>()
                    .into_values()
                    .cloned()
                    .collect();
                // Agents without rules (most) share the pool's tools as they are.
                let analysis = if a.arguments.is_empty() {
                    arguments::Analysis::default()
                } else {
                    arguments::analyse(&a.name, &a.arguments, &visible, &catalog)
                };
                let visible = visible
                    .into_iter()
                    .map(|t| analysis.narrowed.get(t.name.as_str()).cloned().unwrap_or(t))
                    .collect();
                (
                    a.name.clone(),
                    Arc::new(AgentView {
                        record: a.clone(),
                        grants,
                        grant_matches,
                        visible,
                        narrowed: analysis.narrowed,
                        argument_problems: analysis.problems,
                        approvals: a
                            .approvals
                            .iter()
                            .cloned()
                            .map(super::approvals::CompiledApproval::new)
                            .collect(),
                    }),
                )
            })
            .collect();
        Self {
            catalog,
            search,
            agents,
            clients: state
                .clients
                .iter()
                .map(|c| (c.client_id.clone(), c.agent.clone()))
                .collect(),
            revoked: state.revoked.iter().copied().collect(),
            authorizations: state
                .authorizations
                .iter()
                .map(|a| (a.id, a.clone()))
                .collect(),
            held,
            keys: state
                .keys
                .iter()
                .map(|k| (k.kid.clone(), k.public_key.clone()))
                .collect(),
            list_tokens: Mutex::default(),
            pool_tokens: OnceLock::new(),
            indexes: Mutex::default(),
        }
    }

    /// The catalog's search index; search it through [`Self::visible`].
    pub fn search_index(&self) -> &SearchIndex {
        &self.search
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

    /// An authorization that has not been revoked.
    pub fn authorization(&self, id: &Uuid) -> Option<&LiveAuthorization> {
        self.authorizations.get(id)
    }

    /// Whether a live authorization lets `username` act as `agent` through `client_id`.
    pub fn has_authorization(&self, agent: &str, client_id: &str, username: &str) -> bool {
        self.authorizations
            .values()
            .any(|a| a.agent == agent && a.client_id == client_id && a.username == username)
    }

    /// Whether `username` may act as `agent` through an interactive host.
    pub fn may_act_as(&self, username: &str, agent: &str) -> bool {
        self.agents
            .get(agent)
            .is_some_and(|a| a.record.users.iter().any(|u| u == username))
    }

    /// The agents `username` may act as, in name order.
    pub fn agents_of_user(&self, username: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .agents
            .values()
            .filter(|a| a.record.users.iter().any(|u| u == username))
            .map(|a| a.record.name.clone())
            .collect();
        v.sort();
        v
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
        match &principal.scope {
            TokenScope::AllGranted => agent.visible.clone(),
            scope => agent
                .visible
                .iter()
                .filter(|t| may_use(&agent.grants, scope, t.name.as_str()))
                .cloned()
                .collect(),
        }
    }

    /// The tool `name` if `principal` may call it; `None` whether it is unknown or not granted,
    /// so that a tool's existence does not leak.
    pub fn resolve(&self, principal: &Principal, name: &str) -> Option<Arc<Tool>> {
        let agent = self.agents.get(&principal.agent)?;
        if !may_use(&agent.grants, &principal.scope, name) {
            return None;
        }
        if self.held.contains(name) {
            return None;
        }
        agent
            .narrowed
            .get(name)
            .or_else(|| self.catalog.get(name))
            .cloned()
    }

    /// Whether `name` is a catalog tool held for approval (admin views only: to an agent a
    /// held tool is simply not there).
    pub fn is_held(&self, name: &str) -> bool {
        self.held.contains(name)
    }

    /// How many tools are held for approval.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    /// How `principal`'s `tools/list` is served, with `Auto` resolved against `budgets` by
    /// the tokens of what this principal sees.
    pub fn effective_discovery(
        &self,
        principal: &Principal,
        budgets: crate::search::Budgets,
    ) -> Discovery {
        let Some(agent) = self.agents.get(&principal.agent) else {
            return Discovery::Full;
        };
        crate::search::resolve_discovery(
            agent.record.discovery,
            || self.list_tokens(principal),
            || self.index_tokens(principal, &agent.record.pinned),
            budgets,
        )
    }

    /// Tokens of the `tools/list` entries of the tools `principal` sees.
    pub fn list_tokens(&self, principal: &Principal) -> usize {
        self.memo(self.list_key(principal, false), || {
            crate::cost::tools_list_tokens(&self.visible(principal))
        })
    }

    /// Tokens of `principal`'s index-mode `tools/list`.
    fn index_tokens(&self, principal: &Principal, pinned: &[String]) -> usize {
        self.memo(self.list_key(principal, true), || {
            let entries = crate::search::index_entries_with(
                pinned,
                &self.visible(principal),
                self.index_tool(principal),
            );
            crate::cost::definitions_tokens(
                &entries
                    .iter()
                    .map(crate::search::Listed::definition)
                    .collect::<Vec<_>>(),
            )
        })
    }

    fn list_key(&self, principal: &Principal, index: bool) -> ListKey {
        let key = match &principal.scope {
            TokenScope::AllGranted => None,
            TokenScope::Only(targets) => {
                let mut prefixes: Vec<String> = targets.iter().map(|p| p.to_prefix()).collect();
                prefixes.sort();
                prefixes.dedup();
                Some(prefixes)
            }
        };
        (principal.agent.clone(), key, index)
    }

    /// Tokens of the `tools/list` entries of every tool `agent`'s live grants match.
    pub fn agent_list_tokens(&self, agent: &AgentView) -> usize {
        self.memo((agent.record.name.clone(), None, false), || {
            crate::cost::tools_list_tokens(&agent.visible)
        })
    }

    /// Tokens of `agent`'s index-mode `tools/list` (all its grants).
    pub fn agent_index_tokens(&self, agent: &AgentView) -> usize {
        self.memo((agent.record.name.clone(), None, true), || {
            crate::cost::definitions_tokens(&crate::search::index_listing(
                &agent.record.pinned,
                &agent.visible,
                self.catalog.group_summaries(),
            ))
        })
    }

    /// Tokens of the `tools/list` entries of the whole pool.
    pub fn pool_list_tokens(&self) -> usize {
        *self
            .pool_tokens
            .get_or_init(|| crate::cost::tools_list_tokens(self.catalog.tools()))
    }

    /// `principal`'s index-mode `search_tools`, the index of what it sees in its description.
    pub fn index_tool(&self, principal: &Principal) -> Arc<crate::search::IndexTool> {
        let key = self.list_key(principal, true);
        let lock = || self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = lock().by_view.get(&key) {
            return t.clone();
        }
        // Built outside the lock: one view's index does not wait for another's.
        let built = Arc::new(crate::search::index_tool(
            &self.visible(principal),
            self.catalog.group_summaries(),
        ));
        let size = built.json.len() * 2;
        let mut memo = lock();
        if memo.bytes + size > MAX_INDEX_BYTES || memo.by_view.len() >= MAX_MEMO {
            memo.by_view.clear();
            memo.bytes = 0;
        }
        if size <= MAX_INDEX_BYTES && memo.by_view.insert(key, built.clone()).is_none() {
            memo.bytes += size;
        }
        built
    }

    fn memo(&self, key: ListKey, count: impl FnOnce() -> usize) -> usize {
        let lock = || self.list_tokens.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = lock().get(&key) {
            return *n;
        }
        // Counted outside the lock: tokenizing a large list takes milliseconds.
        let n = count();
        let mut memo = lock();
        if memo.len() >= MAX_MEMO {
            memo.clear();
        }
        memo.insert(key, n);
        n
    }

    /// Number of grants that match no tool, across all agents.
    pub fn zero_match_grant_count(&self) -> usize {
        self.agents
            .values()
            .map(|a| a.zero_match_grants().count())
            .sum()
    }

    /// Number of argument rules that cannot do what their author meant, across all agents.
    pub fn argument_problem_count(&self) -> usize {
        self.agents
            .values()
            .map(|a| a.argument_problems.len())
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

/// The inputs a snapshot is built from; the search index follows the catalog.
#[derive(Debug, Default)]
struct Inputs {
    catalog: Arc<Catalog>,
    search: Arc<SearchIndex>,
    state: Arc<PolicyState>,
}

impl Inputs {
    /// The snapshot of these inputs; agents unchanged since `previous` keep their views.
    fn snapshot(&self, previous: &PolicySnapshot) -> Arc<PolicySnapshot> {
        Arc::new(PolicySnapshot::rebuild(
            Some(previous),
            self.catalog.clone(),
            self.search.clone(),
            &self.state,
        ))
    }
}

/// The current snapshot, swapped atomically when either input changes.
#[derive(Debug)]
pub struct PolicyHandle {
    current: ArcSwap<PolicySnapshot>,
    inputs: Mutex<Inputs>,
    /// Ticks after every swap: what held MCP streams (`subscriptions/listen`) wait on.
    swapped: tokio::sync::watch::Sender<()>,
}

impl Default for PolicyHandle {
    fn default() -> Self {
        Self {
            current: ArcSwap::from_pointee(PolicySnapshot::default()),
            inputs: Mutex::new(Inputs::default()),
            swapped: tokio::sync::watch::channel(()).0,
        }
    }
}

impl PolicyHandle {
    pub fn load(&self) -> Arc<PolicySnapshot> {
        self.current.load_full()
    }

    /// Wakes after every snapshot swap (of the catalog or the control-plane state).
    pub fn swaps(&self) -> tokio::sync::watch::Receiver<()> {
        self.swapped.subscribe()
    }

    /// Swaps in a new catalog and its search index (unchanged tools keep their analysis).
    pub fn set_catalog(&self, catalog: Arc<Catalog>) {
        let mut inputs = self.inputs.lock().unwrap_or_else(|p| p.into_inner());
        let t = std::time::Instant::now();
        inputs.search = Arc::new(SearchIndex::build(&catalog, Some(&inputs.search)));
        let indexed = t.elapsed();
        inputs.catalog = catalog;
        self.current.store(inputs.snapshot(&self.current.load()));
        self.swapped.send_replace(());
        tracing::debug!(
            index_ms = indexed.as_millis() as u64,
            ms = t.elapsed().as_millis() as u64,
            "search index and policy snapshot rebuilt"
        );
    }

    /// Swaps in new control-plane state; the catalog's search index is reused as it is.
    pub fn set_state(&self, state: PolicyState) {
        let mut inputs = self.inputs.lock().unwrap_or_else(|p| p.into_inner());
        let t = std::time::Instant::now();
        inputs.state = Arc::new(state);
        self.current.store(inputs.snapshot(&self.current.load()));
        self.swapped.send_replace(());
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            "policy snapshot rebuilt"
        );
    }

    /// Swaps in the `parts` of `fresh`, keeping the others of the current state: what a
    /// reload that re-read only those parts found.
    pub fn merge_state(&self, parts: Parts, fresh: PolicyState) {
        let mut inputs = self.inputs.lock().unwrap_or_else(|p| p.into_inner());
        let t = std::time::Instant::now();
        let old = &inputs.state;
        let mut next = fresh;
        if !parts.contains(Parts::AGENTS) {
            next.agents = old.agents.clone();
        }
        if !parts.contains(Parts::CLIENTS) {
            next.clients = old.clients.clone();
        }
        if !parts.contains(Parts::REVOKED) {
            next.revoked = old.revoked.clone();
        }
        if !parts.contains(Parts::KEYS) {
            next.keys = old.keys.clone();
        }
        if !parts.contains(Parts::PINS) {
            next.pins = old.pins.clone();
        }
        if !parts.contains(Parts::AUTHORIZATIONS) {
            next.authorizations = old.authorizations.clone();
        }
        inputs.state = Arc::new(next);
        self.current.store(inputs.snapshot(&self.current.load()));
        self.swapped.send_replace(());
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            "policy snapshot rebuilt"
        );
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.load().catalog.clone()
    }

    /// The groups pinned now.
    pub fn pinned_groups(&self) -> HashSet<String> {
        let inputs = self.inputs.lock().unwrap_or_else(|p| p.into_inner());
        inputs.state.pins.groups.clone()
    }
}

#[cfg(test)]
mod incremental {
    use super::*;

    fn catalog(names: &[&str]) -> Arc<Catalog> {
        let defs: Vec<serde_json::Value> = names
            .iter()
            .map(|n| serde_json::json!({"name": n, "description": "A tool.", "inputSchema": {"type": "object"}}))
            .collect();
        Arc::new(crate::search::catalog_from_definitions(&serde_json::Value::Array(defs)).unwrap())
    }

    fn agent(name: &str, grants: &[&str]) -> AgentRecord {
        AgentRecord {
            id: Uuid::nil(),
            name: name.into(),
            description: String::new(),
            notes: String::new(),
            discovery: Discovery::Full,
            pinned: Vec::new(),
            managed: None,
            grants: grants
                .iter()
                .map(|g| GrantRecord {
                    id: Uuid::nil(),
                    target: (*g).into(),
                    created_by: "test".into(),
                    created_at: chrono::DateTime::UNIX_EPOCH,
                })
                .collect(),
            limits: Vec::new(),
            arguments: Vec::new(),
            approvals: Vec::new(),
            users: Vec::new(),
        }
    }

    fn state(agents: Vec<AgentRecord>) -> PolicyState {
        PolicyState {
            agents,
            ..PolicyState::default()
        }
    }

    fn visible(handle: &PolicyHandle, agent: &str) -> Vec<String> {
        let snap = handle.load();
        snap.agent(agent)
            .unwrap()
            .visible
            .iter()
            .map(|t| t.name.as_str().to_owned())
            .collect()
    }

    /// A change to one agent rebuilds that agent's view and keeps the others' as they were;
    /// a new catalog, or a change to what is held, rebuilds every view.
    #[test]
    fn a_rebuild_keeps_the_views_of_unchanged_agents_only() {
        let handle = PolicyHandle::default();
        handle.set_catalog(catalog(&["a__one", "a__two", "b__one"]));
        handle.set_state(state(vec![agent("x", &["a"]), agent("y", &["b"])]));
        let (x0, y0) = {
            let s = handle.load();
            (s.agent("x").unwrap().clone(), s.agent("y").unwrap().clone())
        };

        // y gains a grant: x's view is the same one, y's is new and sees it.
        handle.set_state(state(vec![
            agent("x", &["a"]),
            agent("y", &["b", "a__two"]),
        ]));
        let s = handle.load();
        assert!(Arc::ptr_eq(s.agent("x").unwrap(), &x0));
        assert!(!Arc::ptr_eq(s.agent("y").unwrap(), &y0));
        assert_eq!(visible(&handle, "y"), ["a__two", "b__one"]);
        assert_eq!(visible(&handle, "x"), ["a__one", "a__two"]);

        // An agent that is gone is gone, whatever was kept.
        handle.set_state(state(vec![agent("x", &["a"])]));
        assert!(handle.load().agent("y").is_none());

        // A new catalog: every view is rebuilt against it.
        let x1 = handle.load().agent("x").unwrap().clone();
        handle.set_catalog(catalog(&["a__one", "a__three", "b__one"]));
        assert!(!Arc::ptr_eq(handle.load().agent("x").unwrap(), &x1));
        assert_eq!(visible(&handle, "x"), ["a__one", "a__three"]);

        // A pin that holds a tool: the same records, and the held tool leaves the view.
        let x2 = handle.load().agent("x").unwrap().clone();
        let mut pinned = state(vec![agent("x", &["a"])]);
        pinned.pins.groups.insert("a".into());
        pinned.pins.approved.insert(
            "a__one".into(),
            handle.catalog().get("a__one").unwrap().content_hash.hex(),
        );
        handle.set_state(pinned);
        assert!(!Arc::ptr_eq(handle.load().agent("x").unwrap(), &x2));
        assert_eq!(visible(&handle, "x"), ["a__one"]);
    }
}

#[cfg(test)]
mod scale {
    use super::*;

    /// This process's resident memory, in bytes.
    fn rss() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            .unwrap_or(0)
            * 1024
    }

    /// `agents` agents, agent `a` granted group `g{a % groups}`, as `bench/scale.sh` makes them.
    fn agents_of_one_group_each(agents: usize, groups: usize) -> PolicyState {
        PolicyState {
            agents: (0..agents)
                .map(|a| AgentRecord {
                    id: Uuid::nil(),
                    name: format!("agent{a:05}"),
                    description: String::new(),
                    notes: String::new(),
                    discovery: Discovery::Full,
                    pinned: Vec::new(),
                    managed: None,
                    grants: vec![GrantRecord {
                        id: Uuid::nil(),
                        target: format!("g{:05}", a % groups),
                        created_by: "scale".into(),
                        created_at: Utc::now(),
                    }],
                    limits: Vec::new(),
                    arguments: Vec::new(),
                    approvals: Vec::new(),
                    users: Vec::new(),
                })
                .collect(),
            ..PolicyState::default()
        }
    }

    /// Memory per tool and per agent, as the scale benchmark's pool has them: tool folders
    /// like `bench/scale.sh` writes, loaded by the loader, indexed, then a snapshot with one
    /// agent per group. A measurement, not a test:
    /// `cargo nextest run --release --lib --run-ignored only -E 'test(memory_at_scale)' --no-capture`
    /// (`SCALE_TOOLS`, default 20,000 in groups of 20). With `SCALE_FORGET=1` the pool and the
    /// snapshot are never freed, so that a heap profiler's leak report is what they hold
    /// (`heaptrack <test binary> --exact policy::snapshot::scale::memory_at_scale --ignored`).
    #[test]
    #[ignore = "a measurement; run on demand"]
    fn memory_at_scale() {
        use std::os::unix::fs::PermissionsExt;
        let tools: usize = std::env::var("SCALE_TOOLS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let (per_group, groups) = (20, tools / 20);
        let dir = tempfile::tempdir().unwrap();
        for g in 0..groups {
            let folder = dir.path().join(format!("g{g:05}"));
            std::fs::create_dir(&folder).unwrap();
            let mut paths = serde_json::Map::new();
            for o in 0..per_group {
                let op = format!("op{o:02}");
                paths.insert(format!("/{op}"), serde_json::json!({"post": {
                    "operationId": op,
                    "summary": format!("Operation {o} of group {g}"),
                    "description": format!("Does thing number {o} for group {g}: a generated tool of the scale benchmark."),
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {
                        "type": "object", "properties": {"q": {"type": "string", "maxLength": 100}}}}}},
                    "responses": {"200": {"description": "ok"}}}}));
                let script = folder.join(format!("{op}.sh"));
                std::fs::write(&script, "#!/bin/sh\ncat\n").unwrap();
                std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            let doc = serde_json::json!({"openapi": "3.1.0", "info": {"title": "g", "version": "1"}, "paths": paths});
            std::fs::write(folder.join("openapi.json"), doc.to_string()).unwrap();
        }
        let settings = crate::pool::loader::LoaderSettings::default();
        let before = rss();
        let t = std::time::Instant::now();
        let catalog = Arc::new(crate::pool::loader::load_pool(dir.path(), None, &settings));
        let loaded = t.elapsed().as_secs_f64();
        let after_pool = rss();
        assert_eq!(catalog.len(), groups * per_group);
        let t = std::time::Instant::now();
        let search = Arc::new(SearchIndex::build(&catalog, None));
        let indexed = t.elapsed().as_secs_f64();
        let after_index = rss();
        let state = agents_of_one_group_each(groups, groups);
        let t = std::time::Instant::now();
        let snapshot = PolicySnapshot::build_indexed(catalog.clone(), search, &state);
        let built = t.elapsed().as_secs_f64();
        let after_snapshot = rss();
        assert_eq!(snapshot.agents().len(), groups);
        let per = |bytes: usize, n: usize| bytes as f64 / n as f64;
        println!(
            "{} tools: loaded {loaded:.2} s, {:.0} B per tool; search index {indexed:.2} s, {:.0} B per tool; \
             snapshot of {groups} agents {built:.3} s, {:.0} B per agent (state included)",
            catalog.len(),
            per(after_pool.saturating_sub(before), catalog.len()),
            per(after_index.saturating_sub(after_pool), catalog.len()),
            per(after_snapshot.saturating_sub(after_index), groups),
        );
        if std::env::var_os("SCALE_FORGET").is_some() {
            std::mem::forget((catalog, snapshot));
        }
    }

    /// What a snapshot rebuild costs at scale: 100,000 tools in 5,000 groups, 10,000 agents
    /// granted one group each, against a scan of the pool per agent (what every rebuild did
    /// before grants were resolved by name) in the same run. A measurement, not a timed test:
    /// `cargo nextest run --release --lib --run-ignored only -E 'test(rebuild_at_scale)' --no-capture`
    #[test]
    #[ignore = "a measurement; run on demand"]
    fn rebuild_at_scale() {
        let (groups, per_group, agents) = (5_000, 20, 10_000);
        let defs: Vec<serde_json::Value> = (0..groups)
            .flat_map(|g| {
                (0..per_group).map(move |o| {
                    serde_json::json!({"name": format!("g{g:05}__op{o:02}"),
                        "description": "A generated tool.", "inputSchema": {"type": "object"}})
                })
            })
            .collect();
        let t = std::time::Instant::now();
        let catalog = Arc::new(
            crate::search::catalog_from_definitions(&serde_json::Value::Array(defs)).unwrap(),
        );
        println!(
            "catalog of {} tools: {:.2} s",
            catalog.len(),
            t.elapsed().as_secs_f64()
        );
        let state = agents_of_one_group_each(agents, groups);
        let search = Arc::new(SearchIndex::default());
        let t = std::time::Instant::now();
        let snapshot = PolicySnapshot::build_indexed(catalog.clone(), search, &state);
        let rebuild = t.elapsed().as_secs_f64();
        let seen: usize = snapshot.agents().iter().map(|a| a.visible.len()).sum();
        assert_eq!(seen, agents * per_group);
        // What a change to one agent costs: the others keep their views.
        let mut changed = state.clone();
        changed.agents[0].grants[0].target = "g00001".into();
        let t = std::time::Instant::now();
        let after = PolicySnapshot::rebuild(
            Some(&snapshot),
            catalog.clone(),
            snapshot.search.clone(),
            &changed,
        );
        let incremental = t.elapsed().as_secs_f64();
        assert_eq!(
            after.agent("agent00000").unwrap().visible[0].name.as_str(),
            "g00001__op00"
        );
        println!("rebuild after one agent's change, the other views kept: {incremental:.3} s");
        let t = std::time::Instant::now();
        let mut scanned = 0;
        for a in &state.agents {
            let g = GrantTarget::parse(&a.grants[0].target).unwrap();
            scanned += catalog
                .tools()
                .filter(|t| g.matches(t.name.as_str()))
                .count()
                * 2;
        }
        let scan = t.elapsed().as_secs_f64();
        assert_eq!(scanned, seen * 2);
        println!(
            "rebuild with {agents} agents: {rebuild:.3} s; the two scans per agent it replaced: {scan:.3} s ({:.0}x)",
            scan / rebuild
        );
    }
}

#[cfg(test)]
mod limit_records {
    use super::*;

    /// A limit's pattern is parsed as it is read, and written back as it was: the JSON (API,
    /// files, the database) keeps its shape.
    #[test]
    fn a_limit_pattern_is_parsed_when_read_and_written_as_before() {
        for text in [
            r#"{"pattern":"weather","per_minute":30,"burst":5}"#,
            r#"{"pattern":"weather__current","per_second":0.2,"burst":1}"#,
            r#"{"pattern":null,"per_hour":100}"#,
        ] {
            let r: RateLimitRecord = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&r).unwrap(), text);
        }
        let r: RateLimitRecord =
            serde_json::from_str(r#"{"pattern":"weather","per_minute":30}"#).unwrap();
        assert_eq!(r.pattern, Some(GrantTarget::parse("weather").unwrap()));
        for bad in ["se arch", "a_", "__"] {
            let e = serde_json::from_value::<RateLimitRecord>(
                serde_json::json!({"pattern": bad, "per_minute": 30}),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}
