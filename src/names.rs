//! The names the gateway is configured with: agents, tool groups and people. Each has one
//! rule, checked once where the name enters (a file, the API, the UI, the CLI, a tool folder);
//! past that edge a name is its type, so no later code checks it again or checks it
//! differently.

use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

pub use crate::pool::{SEPARATOR, ToolName};

/// Longest agent, group or user name.
pub const MAX_NAME: usize = 64;

/// Why a string is not a name; the message names the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError(String);

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NameError {}

impl From<NameError> for String {
    fn from(e: NameError) -> Self {
        e.0
    }
}

/// Characters allowed in agent, group, operation and tool names.
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// Characters allowed in a username: those of a name, and `@` (people sign in with e-mail
/// addresses).
pub fn is_username_char(c: char) -> bool {
    is_name_char(c) || c == '@'
}

/// The parts every name type shares: the string, read-only, and serde through `parse`.
macro_rules! name_type {
    ($name:ident) => {
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl std::str::FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::parse(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = NameError;
            fn try_from(s: &str) -> Result<Self, NameError> {
                Self::parse(s)
            }
        }

        impl From<$name> for String {
            fn from(n: $name) -> String {
                n.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// An agent's name: 1-64 letters, digits, `_`, `.` or `-`. It is a folder name under
/// `policies/agents/` and a path segment of the agent's endpoints, so nothing else.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AgentName(String);

impl AgentName {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.is_empty() || s.len() > MAX_NAME || !s.chars().all(is_name_char) {
            return Err(NameError(format!(
                "agent name `{s}` must be 1-64 letters, digits, `_`, `.` or `-`"
            )));
        }
        Ok(Self(s.to_owned()))
    }
}

name_type!(AgentName);

/// A tool group's name: a script folder (or its `x-toolgate-group`), or an upstream server.
/// 1-64 letters, digits, `_`, `.` or `-`, without `__` and not ending in `_`: a tool is named
/// `<group>__<operation>`, and its group is read back off the name up to the first `__`, so a
/// group with `__` in it, or ending in `_`, would be read back as another group. The loader,
/// the upstreams and the grants all parse groups here, so a group that loads can be granted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupName(String);

impl GroupName {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.is_empty()
            || s.len() > MAX_NAME
            || !s.chars().all(is_name_char)
            || s.contains(SEPARATOR)
            || s.ends_with('_')
        {
            return Err(NameError(format!(
                "`{s}` is not a valid group name (1-64 letters, digits, `_`, `.` or `-`, without `__` and not ending in `_`)"
            )));
        }
        Ok(Self(s.to_owned()))
    }
}

name_type!(GroupName);

/// A person's account name: 1-64 letters, digits, `_`, `.`, `@` or `-`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Username(String);

impl Username {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.is_empty() || s.len() > MAX_NAME || !s.chars().all(is_username_char) {
            return Err(NameError(format!(
                "username `{s}` must be 1-64 letters, digits, `_`, `.`, `@` or `-`"
            )));
        }
        Ok(Self(s.to_owned()))
    }
}

name_type!(Username);

#[cfg(test)]
mod tests {
    use super::*;

    fn n(len: usize) -> String {
        "a".repeat(len)
    }

    #[test]
    fn agent_names_are_1_to_64_name_characters() {
        for ok in [
            "a",
            "ops-bot",
            "ops_bot.v2",
            "A9",
            "_x",
            "x_",
            "a__b",
            &n(64),
        ] {
            assert_eq!(AgentName::parse(ok).unwrap().as_str(), ok);
        }
        for bad in ["", &n(65), "a b", "a/b", "../x", "ä", "a@b", "a\0"] {
            let e = AgentName::parse(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("agent name `{bad}` must be 1-64")),
                "{e}"
            );
        }
    }

    #[test]
    fn group_names_are_name_characters_without_the_separator() {
        for ok in ["a", "search", "web-search", "v1.2", "_x", "a_b", &n(64)] {
            assert_eq!(GroupName::parse(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            &n(65),
            "a__b",
            "__",
            "a_",
            "a__",
            "se arch",
            "../etc",
            "a@b",
            "é",
        ] {
            let e = GroupName::parse(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("`{bad}` is not a valid group name")),
                "{e}"
            );
        }
    }

    #[test]
    fn usernames_are_name_characters_and_at() {
        for ok in ["a", "ann@example.com", "a_b-c.d", &n(64)] {
            assert_eq!(Username::parse(ok).unwrap().as_str(), ok);
        }
        for bad in ["", &n(65), "a b", "a/b", "ann:x", "ü"] {
            let e = Username::parse(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("username `{bad}` must be 1-64")),
                "{e}"
            );
        }
    }

    #[test]
    fn names_deserialize_through_their_rule() {
        let g: GroupName = serde_json::from_str("\"search\"").unwrap();
        assert_eq!(g, "search");
        assert_eq!(serde_json::to_string(&g).unwrap(), "\"search\"");
        assert!(serde_json::from_str::<GroupName>("\"a__b\"").is_err());
        assert!(serde_json::from_str::<AgentName>("\"\"").is_err());
        assert!(serde_json::from_str::<Username>("\"a b\"").is_err());
    }
}
