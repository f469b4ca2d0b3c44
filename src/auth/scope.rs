//! The scopes a token may be asked for: `tools` (every tool the agent is granted, following its
//! live grants) or `tools:<group>` / `tools:<group>__<tool>` (never wider than these), within
//! what the agent is granted. The OpenID scopes desktop hosts ask for by habit are accepted
//! and ignored.

use crate::policy::{ALL_TOOLS_SCOPE, GrantTarget, TokenScope};

/// Scopes a client may ask for that toolgate has nothing to grant for: requested by OpenID
/// clients and bridges (`mcp-remote`) by default. They are accepted and left out of the issued
/// scope (RFC 6749 §3.3: the response says what was granted).
pub const IGNORED_SCOPES: [&str; 4] = ["openid", "email", "profile", "offline_access"];

/// The scopes published in both metadata documents' `scopes_supported`: the generic ones
/// only, never a group name (that would tell any stranger what the pool holds).
pub const SUPPORTED_SCOPES: [&str; 1] = [ALL_TOOLS_SCOPE];

/// Longest `scope` parameter read.
pub const MAX_SCOPE_LEN: usize = 4096;

/// A `scope` parameter, parsed: its form is checked before anyone knows which agent it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requested {
    /// No scope, only ignored ones, or `tools`: everything the agent is granted, live.
    AllGranted,
    /// Explicit targets, to be checked against the agent's grants.
    Targets(Vec<GrantTarget>),
}

/// Parses a requested `scope` (`tools:search tools:weather__current`, `tools`, `openid …`).
/// A word that is none of our forms and not an ignored OpenID scope is an error.
pub fn parse(scope: Option<&str>) -> Result<Requested, String> {
    let scope = scope.unwrap_or_default();
    if scope.len() > MAX_SCOPE_LEN {
        return Err("scope is too long".into());
    }
    let mut all = false;
    let mut targets = Vec::new();
    for item in scope.split_whitespace() {
        if item == ALL_TOOLS_SCOPE {
            all = true;
            continue;
        }
        if IGNORED_SCOPES.contains(&item) {
            continue;
        }
        let target = item
            .strip_prefix("tools:")
            .and_then(|t| GrantTarget::parse(t).ok())
            .ok_or_else(|| {
                format!(
                    "unknown scope `{}`; scopes look like `tools`, `tools:<group>` or `tools:<group>__<tool>`",
                    crate::audit::bounded(item)
                )
            })?;
        if !targets.contains(&target) {
            targets.push(target);
        }
    }
    // `tools` covers every explicit target; asking for both is asking for everything.
    if all || targets.is_empty() {
        Ok(Requested::AllGranted)
    } else {
        Ok(Requested::Targets(targets))
    }
}

impl Requested {
    /// What a token for an agent holding `grants` may carry.
    ///
    /// A well-formed target the agent is not granted is left out of the token (RFC 6749 §3.3
    /// lets the server issue less than asked): MCP clients request every scope the metadata
    /// lists. If no target asked for is granted, the request fails with `invalid_scope`.
    pub fn grant(&self, grants: &[GrantTarget]) -> Result<TokenScope, String> {
        let Requested::Targets(targets) = self else {
            return Ok(TokenScope::AllGranted);
        };
        let out: Vec<GrantTarget> = targets
            .iter()
            .filter(|target| {
                grants.iter().any(|g| match (target, g) {
                    (GrantTarget::Group(a), GrantTarget::Group(b)) => a == b,
                    (GrantTarget::Tool(t), g) => g.matches(t.as_str()),
                    (GrantTarget::Group(_), GrantTarget::Tool(_)) => false,
                })
            })
            .cloned()
            .collect();
        if out.is_empty() {
            let asked: Vec<String> = targets.iter().map(|t| format!("tools:{t}")).collect();
            return Err(format!(
                "none of the requested scopes (`{}`) is granted to this agent",
                asked.join(" ")
            ));
        }
        Ok(TokenScope::Only(out))
    }
}

/// Parses `scope` and narrows it to what an agent holding `grants` may carry.
pub fn narrow(grants: &[GrantTarget], scope: Option<&str>) -> Result<TokenScope, String> {
    parse(scope)?.grant(grants)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> GrantTarget {
        GrantTarget::parse(s).unwrap()
    }

    fn only(targets: &[&str]) -> TokenScope {
        TokenScope::Only(targets.iter().map(|t| g(t)).collect())
    }

    #[test]
    fn scope_narrows_but_never_widens() {
        let grants = [g("search"), g("weather__current")];
        assert_eq!(narrow(&grants, None).unwrap(), TokenScope::AllGranted);
        assert_eq!(
            narrow(&grants, Some("tools")).unwrap(),
            TokenScope::AllGranted
        );
        assert_eq!(
            narrow(&grants, Some("tools:search")).unwrap(),
            only(&["search"])
        );
        assert_eq!(
            narrow(&grants, Some("tools:search__query")).unwrap(),
            only(&["search__query"])
        );
        assert!(narrow(&grants, Some("tools:weather")).is_err());
        assert_eq!(
            narrow(&grants, Some("tools:weather tools:search")).unwrap(),
            only(&["search"])
        );
        assert!(narrow(&grants, Some("admin")).is_err());
        assert!(narrow(&grants, Some("tools:")).is_err());
    }

    #[test]
    fn openid_scopes_are_accepted_and_left_out() {
        let grants = [g("search")];
        assert_eq!(
            narrow(&grants, Some("openid email profile offline_access")).unwrap(),
            TokenScope::AllGranted
        );
        assert_eq!(
            narrow(&grants, Some("openid tools:search")).unwrap(),
            only(&["search"])
        );
        assert_eq!(
            narrow(&grants, Some("openid tools:search"))
                .unwrap()
                .to_scope_string(),
            "tools:search"
        );
        assert_eq!(TokenScope::AllGranted.to_scope_string(), "tools");
    }

    #[test]
    fn tools_with_targets_is_everything() {
        assert_eq!(
            narrow(&[g("search")], Some("tools tools:search")).unwrap(),
            TokenScope::AllGranted
        );
    }

    #[test]
    fn the_form_is_checked_before_the_agent_is_known() {
        assert_eq!(
            parse(Some("tools:nobody_has_this")).unwrap(),
            Requested::Targets(vec![g("nobody_has_this")])
        );
        assert!(parse(Some("write")).is_err());
        assert!(parse(Some(&"tools ".repeat(2000))).is_err());
    }
}
