//! The scopes a token may be narrowed to: `tools:<group>` or `tools:<group>__<tool>`, within
//! what the agent is granted.

use crate::policy::GrantTarget;

/// Narrows the agent's live grants by a requested `scope` (`tools:search tools:weather__current`).
///
/// A scope that is not of our form is an error. A well-formed scope the agent is not granted
/// is left out of the token (RFC 6749 §3.3 lets the server issue less than asked, and the
/// response says what was issued): MCP clients request every scope the protected-resource
/// metadata lists. If nothing requested is granted, the request fails with `invalid_scope`.
pub fn narrow(grants: &[GrantTarget], scope: Option<&str>) -> Result<Vec<GrantTarget>, String> {
    let Some(scope) = scope.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(grants.to_vec());
    };
    let mut out = Vec::new();
    for item in scope.split_whitespace() {
        let target = item.strip_prefix("tools:").and_then(|t| GrantTarget::parse(t).ok()).ok_or_else(|| {
            format!("unknown scope `{item}`; scopes look like `tools:<group>` or `tools:<group>__<tool>`")
        })?;
        let covered = grants.iter().any(|g| match (&target, g) {
            (GrantTarget::Group(a), GrantTarget::Group(b)) => a == b,
            (GrantTarget::Tool(t), g) => g.matches(t.as_str()),
            (GrantTarget::Group(_), GrantTarget::Tool(_)) => false,
        });
        if covered && !out.contains(&target) {
            out.push(target);
        }
    }
    if out.is_empty() {
        return Err(format!(
            "none of the requested scopes (`{scope}`) is granted to this agent"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> GrantTarget {
        GrantTarget::parse(s).unwrap()
    }

    #[test]
    fn scope_narrows_but_never_widens() {
        let grants = [g("search"), g("weather__current")];
        assert_eq!(narrow(&grants, None).unwrap(), grants.to_vec());
        assert_eq!(
            narrow(&grants, Some("tools:search")).unwrap(),
            vec![g("search")]
        );
        assert_eq!(
            narrow(&grants, Some("tools:search__query")).unwrap(),
            vec![g("search__query")]
        );
        assert!(narrow(&grants, Some("tools:weather")).is_err());
        assert_eq!(
            narrow(&grants, Some("tools:weather tools:search")).unwrap(),
            vec![g("search")]
        );
        assert!(narrow(&grants, Some("admin")).is_err());
    }
}
