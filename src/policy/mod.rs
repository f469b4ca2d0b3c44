//! Who may see and call what: grants, the one decision function, zero-match analysis and the
//! per-instance snapshot the hot path reads.

pub mod approvals;
pub mod arguments;
pub mod files;
pub mod snapshot;
pub mod style;

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::names::GroupName;
use crate::pool::{Catalog, SEPARATOR, Tool, ToolName};

/// What a grant (or a token prefix) gives: a whole group, or one exact tool.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GrantTarget {
    /// Every tool named `<group>__...`.
    Group(GroupName),
    /// Exactly this tool, and no other (not `weather__current_v2` for `weather__current`).
    Tool(ToolName),
}

impl GrantTarget {
    /// Parses a grant as an admin writes it: `search` (a group) or `weather__current` (a tool).
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some((group, op)) = s.split_once(SEPARATOR) {
            if group.is_empty() || op.is_empty() {
                return Err(format!(
                    "`{s}` is neither a group name nor a `<group>__<operation>` tool name"
                ));
            }
            return ToolName::parse(s).map(GrantTarget::Tool);
        }
        GroupName::parse(s)
            .map(GrantTarget::Group)
            .map_err(String::from)
    }

    /// Parses the token form: a group appears as the prefix `search__`.
    pub fn from_prefix(s: &str) -> Option<Self> {
        match s.strip_suffix(SEPARATOR) {
            Some(group) => GroupName::parse(group).ok().map(GrantTarget::Group),
            None => ToolName::parse(s).ok().map(GrantTarget::Tool),
        }
    }

    /// The token form: `search__` for a group, the tool name for a tool.
    pub fn to_prefix(&self) -> String {
        match self {
            GrantTarget::Group(g) => format!("{g}{SEPARATOR}"),
            GrantTarget::Tool(t) => t.as_str().to_owned(),
        }
    }

    pub fn matches(&self, tool: &str) -> bool {
        match self {
            GrantTarget::Group(g) => tool
                .strip_prefix(g.as_str())
                .is_some_and(|rest| rest.starts_with(SEPARATOR) && rest.len() > SEPARATOR.len()),
            GrantTarget::Tool(t) => t.as_str() == tool,
        }
    }

    /// The tools of `catalog` this grant matches, in name order, found by name: the cost
    /// follows what the grant matches, not the size of the pool (every snapshot rebuild asks
    /// this of every grant of every agent).
    pub fn matched_tools<'c>(&self, catalog: &'c Catalog) -> Vec<&'c Arc<Tool>> {
        match self {
            GrantTarget::Group(g) => {
                let prefix = format!("{g}{SEPARATOR}");
                catalog
                    .with_prefix(&prefix)
                    .filter(|t| self.matches(t.name.as_str()))
                    .collect()
            }
            GrantTarget::Tool(t) => catalog.get(t.as_str()).into_iter().collect(),
        }
    }

    /// The names of the tools of `catalog` this grant matches, in name order.
    pub fn matched<'c>(&self, catalog: &'c Catalog) -> Vec<&'c ToolName> {
        self.matched_tools(catalog)
            .into_iter()
            .map(|t| &t.name)
            .collect()
    }
}

impl fmt::Display for GrantTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GrantTarget::Group(g) => f.write_str(g),
            GrantTarget::Tool(t) => f.write_str(t.as_str()),
        }
    }
}

impl Serialize for GrantTarget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GrantTarget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        GrantTarget::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The scope word for "every tool the agent is granted, as its grants stand on each request".
pub const ALL_TOOLS_SCOPE: &str = "tools";

/// What a token lets its agent reach, within the agent's live grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenScope {
    /// Issued without a narrower scope (or for `tools`): follows the live grants, additions
    /// included, so a grant added in the UI reaches the agent on its next request.
    AllGranted,
    /// Issued for explicit `tools:<target>` scopes: never wider than these, whatever is granted
    /// later.
    Only(Vec<GrantTarget>),
}

impl TokenScope {
    /// Whether the token's scope covers `tool` (the live grants are checked beside it).
    pub fn permits(&self, tool: &str) -> bool {
        match self {
            TokenScope::AllGranted => true,
            TokenScope::Only(targets) => targets.iter().any(|t| t.matches(tool)),
        }
    }

    /// The `scope` claim and token-response field: what was granted (RFC 6749 §3.3).
    pub fn to_scope_string(&self) -> String {
        match self {
            TokenScope::AllGranted => ALL_TOOLS_SCOPE.to_owned(),
            TokenScope::Only(targets) => targets
                .iter()
                .map(|t| format!("tools:{t}"))
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// The scope of a verified token, from its `scope` and `tool_prefixes` claims. A token
    /// whose `scope` holds `tools` follows the live grants; any other is held to the prefixes
    /// it carries (tokens issued before live scopes existed among them).
    pub fn from_claims(scope: &str, tool_prefixes: &[String]) -> Self {
        if scope.split_whitespace().any(|w| w == ALL_TOOLS_SCOPE) {
            return TokenScope::AllGranted;
        }
        TokenScope::Only(
            tool_prefixes
                .iter()
                .filter_map(|p| GrantTarget::from_prefix(p))
                .collect(),
        )
    }
}

/// Decides whether an agent may see and call `tool`.
///
/// Default deny: the tool must be matched by one of the agent's live grants **and** be within
/// its token's scope. Removing a grant therefore takes effect on the next request even for
/// tokens issued before; so does adding one, for tokens that follow the live grants
/// ([`TokenScope::AllGranted`]). Both `tools/list` and `tools/call` (and the REST and OpenAPI
/// surfaces) go through this function.
pub fn may_use(live_grants: &[GrantTarget], scope: &TokenScope, tool: &str) -> bool {
    live_grants.iter().any(|g| g.matches(tool)) && scope.permits(tool)
}

/// The nearest existing group or tool names to a grant that matches nothing.
pub fn suggestions(target: &str, catalog: &Catalog) -> Vec<String> {
    let mut candidates: Vec<String> = catalog.group_names();
    candidates.extend(catalog.tools().map(|t| t.name.as_str().to_owned()));
    let mut scored: Vec<(usize, String)> = candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(target, &c), c))
        .filter(|(d, c)| *d <= (c.len().max(target.len()) / 3).max(2))
        .collect();
    scored.sort();
    scored.into_iter().take(3).map(|(_, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn g(s: &str) -> GrantTarget {
        GrantTarget::parse(s).unwrap()
    }

    #[test]
    fn a_group_grant_matches_its_tools_only() {
        assert!(g("search").matches("search__query"));
        assert!(!g("search").matches("searchx__query"));
        assert!(!g("search").matches("search__"));
        assert!(!g("search").matches("research__query"));
    }

    #[test]
    fn an_exact_grant_matches_that_tool_only() {
        assert!(g("weather__current").matches("weather__current"));
        assert!(!g("weather__current").matches("weather__current_v2"));
        assert!(!g("weather__current").matches("weather__forecast"));
    }

    #[test]
    fn token_prefixes_round_trip() {
        for s in ["search", "weather__current"] {
            let t = g(s);
            assert_eq!(GrantTarget::from_prefix(&t.to_prefix()), Some(t));
        }
        assert_eq!(GrantTarget::from_prefix("__"), None);
    }

    #[test]
    fn may_use_needs_both_a_live_grant_and_the_token_scope() {
        let live = [g("search")];
        let only = |t: &[GrantTarget]| TokenScope::Only(t.to_vec());
        assert!(may_use(&live, &only(&[g("search")]), "search__query"));
        assert!(!may_use(&live, &only(&[g("weather")]), "search__query"));
        assert!(!may_use(&[], &only(&[g("search")]), "search__query"));
        assert!(!may_use(&live, &only(&[]), "search__query"));
        assert!(may_use(&live, &TokenScope::AllGranted, "search__query"));
        assert!(!may_use(&live, &TokenScope::AllGranted, "weather__current"));
        assert!(!may_use(&[], &TokenScope::AllGranted, "search__query"));
    }

    #[test]
    fn a_token_scope_reads_back_from_its_claims() {
        let prefixes = vec!["search__".to_owned()];
        assert_eq!(
            TokenScope::from_claims("tools", &prefixes),
            TokenScope::AllGranted
        );
        assert_eq!(
            TokenScope::from_claims("tools:search", &prefixes),
            TokenScope::Only(vec![g("search")])
        );
        // A scope naming `tools` only as part of a word is not the live scope.
        assert_eq!(
            TokenScope::from_claims("tools:tools", &["tools__".to_owned()]),
            TokenScope::Only(vec![g("tools")])
        );
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9_.-]{0,8}"
            .prop_filter("no separator", |s| !s.contains("__") && !s.ends_with('_'))
    }

    proptest! {
        #[test]
        fn exact_grants_never_match_another_tool(
            group in name(), op in name(), other_group in name(), other_op in name()
        ) {
            let tool = format!("{group}__{op}");
            let other = format!("{other_group}__{other_op}");
            let grant = g(&tool);
            prop_assert!(grant.matches(&tool));
            prop_assert_eq!(grant.matches(&other), tool == other);
        }

        /// Found by name range, the matched tools are exactly those a scan of the whole pool
        /// finds, for groups whose names prefix each other (`a`, `a_b`, `ab`) too.
        #[test]
        fn matched_tools_by_name_equal_a_scan_of_the_pool(
            names in proptest::collection::btree_set(("[ab_]{1,3}", "[a-z]{1,3}"), 0..24),
            grant in "[ab_]{1,3}"
        ) {
            let defs: Vec<serde_json::Value> = names
                .iter()
                .filter(|(g, _)| !g.contains("__") && !g.ends_with('_'))
                .map(|(g, o)| serde_json::json!({
                    "name": format!("{g}__{o}"), "inputSchema": {"type": "object"}}))
                .collect();
            let catalog = crate::search::catalog_from_definitions(&serde_json::Value::Array(defs)).unwrap();
            let Ok(target) = GrantTarget::parse(&grant) else { return Ok(()) };
            let scanned: Vec<&str> = catalog
                .tools()
                .filter(|t| target.matches(t.name.as_str()))
                .map(|t| t.name.as_str())
                .collect();
            let found: Vec<&str> = target.matched(&catalog).iter().map(|n| n.as_str()).collect();
            prop_assert_eq!(found, scanned);
        }

        #[test]
        fn a_group_grant_matches_exactly_the_tools_with_its_prefix(
            group in name(), tool_group in name(), op in name()
        ) {
            let tool = format!("{tool_group}__{op}");
            prop_assert_eq!(g(&group).matches(&tool), tool.starts_with(&format!("{group}__")));
        }
    }
}
