//! An upstream's own credentials stay between the gateway and the upstream: whatever the
//! upstream says back (a result, an `isError` text, a JSON-RPC error, a connection error) is
//! scrubbed of them before an agent, the audit log or an admin page sees it. An upstream that
//! echoes "invalid token sk-…" would otherwise hand its caller the key to go around the
//! gateway's grants, limits and audit.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::UpstreamSpec;

/// A header or environment variable whose name holds one of these words carries a credential.
const SECRET_WORDS: [&str; 10] = [
    "auth",
    "cookie",
    "credential",
    "key",
    "pass",
    "private",
    "secret",
    "session",
    "signature",
    "token",
];

/// Values shorter than this are not treated as credentials: they cannot be told apart from
/// ordinary words in an answer, and no credential worth the name is that short.
const MIN_CREDENTIAL: usize = 8;

fn names_a_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| name.contains(w))
}

/// Adds `value` and the forms an upstream is likely to quote instead: the token after an
/// auth scheme (`Bearer abc` -> `abc`), and for `Basic` the decoded `user:password` and
/// password.
fn add(out: &mut Vec<String>, value: &str) {
    use base64::Engine;
    let value = value.trim();
    out.push(value.to_owned());
    if let Some((scheme, rest)) = value.split_once(' ') {
        let rest = rest.trim();
        out.push(rest.to_owned());
        if scheme.eq_ignore_ascii_case("basic")
            && let Some(pair) = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
        {
            if let Some((_, password)) = pair.split_once(':') {
                out.push(password.to_owned());
            }
            out.push(pair);
        }
    }
}

/// The credentials `spec` configures: header values and environment values whose names say
/// they are secret, and the OAuth client secret; `extra` adds those obtained at connection
/// (an OAuth access token).
pub(super) fn of(spec: &UpstreamSpec, extra: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, value) in spec.headers.iter().chain(&spec.env) {
        if names_a_secret(name) {
            add(&mut out, value);
        }
    }
    if let Some(secret) = spec
        .oauth
        .as_ref()
        .and_then(|o| std::env::var(&o.client_secret_env).ok())
    {
        add(&mut out, &secret);
    }
    for token in extra {
        add(&mut out, token);
    }
    out.retain(|c| c.len() >= MIN_CREDENTIAL);
    // Longest first, so that a credential containing another is replaced whole.
    out.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    out.dedup();
    out
}

/// A spec as the audit chain records it: values of headers and environment variables whose
/// names say they are secret are replaced (a change record is exported and streamed; the
/// upstream's own token must not travel with it).
pub fn on_record(spec: &Value) -> Value {
    let mut spec = spec.clone();
    for field in ["headers", "env"] {
        if let Some(Value::Object(map)) = spec.get_mut(field) {
            for (name, value) in map.iter_mut() {
                if names_a_secret(name) {
                    *value = Value::String("[redacted]".into());
                }
            }
        }
    }
    spec
}

/// `text` with every credential replaced.
pub(super) fn scrub_text(text: &str, credentials: &[String]) -> String {
    if credentials.is_empty() {
        return text.to_owned();
    }
    crate::audit::scrub(text, credentials)
}

fn scrub_value(v: &mut Value, credentials: &[String]) {
    match v {
        Value::String(s) => {
            let clean = scrub_text(s, credentials);
            if clean != *s {
                *s = clean;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| scrub_value(i, credentials)),
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let clean = scrub_text(&key, credentials);
                if clean != key
                    && let Some(v) = map.remove(&key)
                {
                    map.insert(clean.clone(), v);
                }
                if let Some(v) = map.get_mut(&clean) {
                    scrub_value(v, credentials);
                }
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// An upstream's answer with every credential replaced in every string, keys included; the
/// structure is kept. `None` if the scrubbed answer no longer reads as one (it then must not
/// be passed on at all).
pub(super) fn scrub<T: Serialize + DeserializeOwned>(
    answer: T,
    credentials: &[String],
) -> Option<T> {
    if credentials.is_empty() {
        return Some(answer);
    }
    let mut v = serde_json::to_value(&answer).ok()?;
    scrub_value(&mut v, credentials);
    serde_json::from_value(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> UpstreamSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn credentials_are_the_secret_headers_and_variables_and_their_likely_quotes() {
        use base64::Engine;
        let basic = base64::engine::general_purpose::STANDARD.encode("robot:hunter2hunter2");
        let http = spec(json!({"transport": "http", "url": "https://u.example/mcp",
            "headers": {"Authorization": "Bearer abcdefgh12345678", "X-Api-Key": "k-0123456789",
                        "Proxy-Authorization": format!("Basic {basic}"), "Accept": "application/json"}}));
        let got = of(&http, &["access-token-xyz123".into()]);
        for want in [
            "Bearer abcdefgh12345678",
            "abcdefgh12345678",
            "k-0123456789",
            "robot:hunter2hunter2",
            "hunter2hunter2",
            "access-token-xyz123",
        ] {
            assert!(
                got.contains(&want.to_owned()),
                "{want} missing from {got:?}"
            );
        }
        assert!(
            !got.iter().any(|c| c.contains("application/json")),
            "{got:?}"
        );
        let stdio = spec(json!({"transport": "stdio", "command": "srv",
            "env": {"GITHUB_TOKEN": "ghp_0123456789abcdef", "MODE": "production", "PIN": "1234"}}));
        assert_eq!(of(&stdio, &[]), ["ghp_0123456789abcdef"]);
    }

    #[test]
    fn an_answer_keeps_its_shape_and_loses_the_credential_in_every_form() {
        let creds = vec!["s3cr3t\"value!".to_owned(), "plain-credential".to_owned()];
        let answer = json!({
            "content": [{"type": "text", "text": "denied: plain-credential"}],
            "structuredContent": {"echo": "s3cr3t\"value!", "plain-credential": 1},
            "isError": true,
        });
        let clean: Value = scrub(answer, &creds).unwrap();
        let text = clean.to_string();
        assert!(
            !text.contains("plain-credential") && !text.contains("s3cr3t"),
            "{text}"
        );
        assert_eq!(clean["content"][0]["text"], "denied: [REDACTED]");
        assert_eq!(clean["isError"], true);
        assert_eq!(clean["structuredContent"]["[REDACTED]"], 1);
    }
}
