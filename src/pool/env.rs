//! A script's environment: declared by its group (`x-toolgate-env`), valued by a source of its
//! own, never borrowed from the gateway.
//!
//! A group that lists `API_KEY` gets `API_KEY` from the gateway's `TOOLGATE_SCRIPT_ENV_API_KEY`,
//! not from the gateway's `API_KEY`: the gateway's environment holds its own secrets (the admin
//! token, the database URL, the OIDC client secret, whatever a library reads from it), and a tool
//! author's list of names must not reach them. The source is a trait so that other sources
//! (per-agent credentials) can be added without touching the loader or the runner.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::fmt;
use std::sync::{LazyLock, Mutex, PoisonError};

/// The prefix of the gateway variables that hold script variables' values.
pub const SCRIPT_ENV_PREFIX: &str = "TOOLGATE_SCRIPT_ENV_";

/// Variables the gateway sets itself: from its own environment for every script (`PATH`,
/// `HOME`, `LANG`, `TZ`), or for each call (`TMPDIR`, `TRACEPARENT`, `TRACESTATE`).
pub const GATEWAY_SET: [&str; 7] = [
    "PATH",
    "HOME",
    "LANG",
    "TZ",
    "TMPDIR",
    "TRACEPARENT",
    "TRACESTATE",
];

/// A name of `x-toolgate-env`, checked: letters, digits and `_`, not a name the gateway sets,
/// not in the gateway's own `TOOLGATE_` namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScriptVar(Box<str>);

impl ScriptVar {
    /// Parses one entry, saying what is wrong with it.
    pub fn parse(name: &str) -> Result<Self, String> {
        if name.is_empty()
            || name.starts_with(|c: char| c.is_ascii_digit())
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(format!(
                "`{name}` is not a variable name (letters, digits and `_`, not starting with a digit)"
            ));
        }
        if name.starts_with("TOOLGATE_") {
            return Err(format!(
                "`{name}` is the gateway's own configuration, which is never passed to scripts; a script variable `X` gets its value from the gateway's `{SCRIPT_ENV_PREFIX}X`"
            ));
        }
        if GATEWAY_SET.contains(&name) {
            return Err(format!(
                "`{name}` is set by the gateway for every script; it cannot be declared"
            ));
        }
        Ok(Self(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ScriptVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a source is asked: one declared variable of one group's script. A struct, so that the
/// call's agent can be added for per-agent sources without changing every implementation.
#[derive(Debug, Clone, Copy)]
pub struct VarRequest<'a> {
    pub group: &'a str,
    pub name: &'a ScriptVar,
}

/// Where declared variables get their values.
pub trait ScriptEnv: fmt::Debug + Send + Sync {
    /// The value of the requested variable; `None` leaves it unset.
    fn value(&self, request: VarRequest<'_>) -> Option<OsString>;

    /// The gateway variable an operator sets to give `name` a value (for messages).
    fn source_of(&self, name: &ScriptVar) -> String;
}

/// Values from the gateway's `TOOLGATE_SCRIPT_ENV_<NAME>` variables, read once at start: the
/// same for every group that declares `<NAME>`.
#[derive(Debug, Default, Clone)]
pub struct PrefixedEnv {
    values: BTreeMap<String, OsString>,
}

impl PrefixedEnv {
    /// The `TOOLGATE_SCRIPT_ENV_*` variables of this process.
    pub fn from_process() -> Self {
        Self::from_vars(std::env::vars_os())
    }

    /// The `TOOLGATE_SCRIPT_ENV_*` variables among `vars`; the others are ignored.
    pub fn from_vars(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Self {
        let values = vars
            .into_iter()
            .filter_map(|(k, v)| {
                let name = k.to_str()?.strip_prefix(SCRIPT_ENV_PREFIX)?;
                (!name.is_empty()).then(|| (name.to_owned(), v))
            })
            .collect();
        Self { values }
    }
}

impl ScriptEnv for PrefixedEnv {
    fn value(&self, request: VarRequest<'_>) -> Option<OsString> {
        self.values.get(request.name.as_str()).cloned()
    }

    fn source_of(&self, name: &ScriptVar) -> String {
        format!("{SCRIPT_ENV_PREFIX}{name}")
    }
}

/// Warns, once per group and name in this process, when a group declares a variable that its
/// source leaves unset while the gateway's own environment has it: before the declared source
/// existed, that value was passed through, and an upgrade silently leaving the script without
/// it would look like a tool bug.
pub fn warn_if_borrowed_before(source: &dyn ScriptEnv, group: &str, names: &[ScriptVar]) {
    static WARNED: LazyLock<Mutex<HashSet<(String, ScriptVar)>>> =
        LazyLock::new(|| Mutex::new(HashSet::new()));
    for name in names {
        if std::env::var_os(name.as_str()).is_none()
            || source.value(VarRequest { group, name }).is_some()
        {
            continue;
        }
        let first = WARNED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((group.to_owned(), name.clone()));
        if first {
            tracing::warn!(
                group,
                variable = %name,
                source = %source.source_of(name),
                "`x-toolgate-env` declares a variable that the gateway's own environment has but its source does not: scripts get it only from the source, so it is unset for them"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateways_own_names_and_the_ones_it_sets_are_refused() {
        for bad in [
            "TOOLGATE_ADMIN_TOKEN",
            "TOOLGATE_SCRIPT_ENV_X",
            "PATH",
            "TMPDIR",
        ] {
            assert!(ScriptVar::parse(bad).is_err(), "{bad}");
        }
        for bad in ["", "A-B", "1X", "A B", "Ä"] {
            let e = ScriptVar::parse(bad).unwrap_err();
            assert!(e.contains("not a variable name"), "{bad}: {e}");
        }
        let e = ScriptVar::parse("TOOLGATE_OIDC_CLIENT_SECRET").unwrap_err();
        assert!(e.contains("TOOLGATE_SCRIPT_ENV_X"), "{e}");
        assert_eq!(ScriptVar::parse("API_KEY").unwrap().as_str(), "API_KEY");
    }

    #[test]
    fn values_come_only_from_the_prefixed_variables() {
        let env = PrefixedEnv::from_vars([
            ("API_KEY".into(), "borrowed".into()),
            ("DATABASE_URL".into(), "postgres://gateway".into()),
            ("TOOLGATE_SCRIPT_ENV_API_KEY".into(), "declared".into()),
            ("TOOLGATE_SCRIPT_ENV_".into(), "no name".into()),
        ]);
        let ask = |n: &str| {
            env.value(VarRequest {
                group: "g",
                name: &ScriptVar::parse(n).unwrap(),
            })
        };
        assert_eq!(ask("API_KEY"), Some("declared".into()));
        assert_eq!(ask("DATABASE_URL"), None);
    }
}
