//! Token exchange (RFC 8693) as a slot kind: a call's caller — the agent, and the person it acts
//! for when there is one — is exchanged at a security token service (STS) the admin configured
//! for a token meant for the upstream, and that token is what the slot injects.
//!
//! toolgate proves the caller's identity to the STS with a subject token it signs itself: a
//! JWT (`urn:ietf:params:oauth:token-type:jwt`) from the gateway's issuer, verifiable with its
//! published JWKS, shaped as toolgate's own access tokens are — `sub` the agent, `act.sub` the
//! person — but lasting a minute, for the STS as audience, and carrying no grants: it cannot be
//! presented back to toolgate (wrong audience and type) and says nothing the STS should not
//! know. The caller's own bearer token never leaves the gateway (the MCP spec forbids passing
//! it through).
//!
//! Exchanged tokens are cached per (slot, agent, person) until shortly before they expire, so
//! a principal costs the STS one request per token lifetime, and concurrent calls of one
//! principal wait for one exchange rather than each making their own. The cache is bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::oauth::{self, Bounded};

/// RFC 8693's grant type and token type URIs.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
pub const JWT_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// How long a subject token is good for: long enough to reach the STS, no longer.
const SUBJECT_TOKEN_SECS: i64 = 60;
/// An exchanged token is not used in its last this-much of life (or half of it, if shorter):
/// a call that takes it must still be able to carry it to the upstream.
const RENEW_AHEAD: Duration = Duration::from_secs(60);
/// Kept at most this long, whatever the STS says (a token it says never expires included).
const MAX_CACHE: Duration = Duration::from_secs(3600);
/// Kept this long when the STS does not say (`expires_in` is only recommended).
const UNSAID_LIFETIME: Duration = Duration::from_secs(60);
/// Principals' tokens held at once, over all slots.
const MAX_CACHED: usize = 4096;

/// A slot filled by token exchange, as written under the slot (`exchange:`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotExchange {
    /// The STS's token endpoint (https; http only on a loopback host).
    pub token_endpoint: String,
    /// toolgate's client id at the STS.
    pub client_id: String,
    /// The environment variable holding toolgate's client secret there (sent as HTTP Basic);
    /// without one toolgate is a public client and sends its `client_id` in the form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_env: Option<String>,
    /// The `audience` to ask for: the upstream as the STS names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// The subject token's `aud`: the STS as it knows itself (its issuer); the token endpoint
    /// when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_audience: Option<String>,
}

impl SlotExchange {
    pub fn validate(&self) -> Result<(), String> {
        oauth::endpoint(&self.token_endpoint)
            .map_err(|e| format!("`exchange.token_endpoint`: {e}"))?;
        if self.client_id.trim().is_empty() || self.client_id.len() > 256 {
            return Err("`exchange.client_id` is needed (at most 256 characters)".into());
        }
        if let Some(var) = &self.client_secret_env
            && crate::pool::env::ScriptVar::parse(var).is_err()
        {
            return Err(format!(
                "`exchange.client_secret_env`: `{var}` is not an environment variable name"
            ));
        }
        for (field, v) in [
            ("audience", &self.audience),
            ("subject_audience", &self.subject_audience),
        ] {
            if let Some(v) = v
                && (v.is_empty() || v.len() > 2048 || v.chars().any(char::is_control))
            {
                return Err(format!(
                    "`exchange.{field}`: 1 to 2048 characters, no control characters"
                ));
            }
        }
        if self.scopes.len() > 32 || self.scopes.iter().any(|s| !oauth::is_scope_token(s)) {
            return Err(
                "`exchange.scopes`: at most 32 scopes, each printable ASCII without spaces or quotes"
                    .into(),
            );
        }
        Ok(())
    }

    fn secret(&self) -> Result<Option<Zeroizing<String>>, String> {
        match &self.client_secret_env {
            None => Ok(None),
            Some(var) => std::env::var(var)
                .map(|s| Some(Zeroizing::new(s)))
                .map_err(|_| format!("environment variable `{var}` is not set")),
        }
    }

    /// The subject token's audience.
    pub fn subject_audience(&self) -> &str {
        self.subject_audience
            .as_deref()
            .unwrap_or(&self.token_endpoint)
    }
}

/// The claims of the subject token toolgate signs for one exchange.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SubjectClaims {
    pub iss: String,
    /// The agent.
    pub sub: String,
    /// The agent's OAuth client.
    pub client_id: String,
    pub aud: String,
    pub iat: i64,
    pub exp: i64,
    pub jti: String,
    /// The person the agent acts for, as on toolgate's own tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<crate::auth::token::Actor>,
}

impl SubjectClaims {
    pub fn new(
        issuer: &str,
        audience: &str,
        agent: &str,
        client_id: &str,
        person: Option<&str>,
    ) -> Self {
        let now = chrono::Utc::now().timestamp();
        Self {
            iss: issuer.to_owned(),
            sub: agent.to_owned(),
            client_id: client_id.to_owned(),
            aud: audience.to_owned(),
            iat: now,
            exp: now + SUBJECT_TOKEN_SECS,
            jti: uuid::Uuid::new_v4().to_string(),
            act: person.map(|p| crate::auth::token::Actor { sub: p.to_owned() }),
        }
    }

    /// Signed with the gateway's current key. `typ` is plain `JWT`, not toolgate's access
    /// token type, so toolgate itself never accepts one.
    pub fn sign(&self, kid: &str, private_pkcs8: &[u8]) -> Result<String, String> {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.typ = Some("JWT".to_owned());
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(
            &header,
            self,
            &jsonwebtoken::EncodingKey::from_ed_der(private_pkcs8),
        )
        .map_err(|e| format!("cannot sign the subject token: {e}"))
    }
}

/// A token the STS issued.
pub struct Exchanged {
    pub token: Zeroizing<String>,
    /// Seconds the STS said it lasts, if it said.
    pub expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    issued_token_type: Option<String>,
    token_type: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

/// Exchanges `subject_token` at the slot's STS.
pub async fn exchange(spec: &SlotExchange, subject_token: &str) -> Result<Exchanged, String> {
    let secret = spec.secret()?;
    let request = build_request(spec, secret.as_deref().map(String::as_str), subject_token)?;
    let answer = oauth2::AsyncHttpClient::call(&Bounded(oauth::http_client()?), request)
        .await
        .map_err(|e| format!("the token service is unreachable: {e}"))?;
    let status = answer.status();
    if !status.is_success() {
        return Err(match serde_json::from_slice::<ErrorAnswer>(answer.body()) {
            Ok(e) => oauth::bounded(&format!(
                "the token service refused: {}{}",
                e.error,
                e.error_description
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            )),
            Err(_) => format!("the token service answered HTTP {status}"),
        });
    }
    let t: TokenAnswer = serde_json::from_slice(answer.body())
        .map_err(|_| "the token service's answer is not an RFC 8693 token response".to_owned())?;
    if !t.token_type.eq_ignore_ascii_case("bearer") {
        return Err(oauth::bounded(&format!(
            "the token service issued a `{}` token; a bearer token is needed",
            t.token_type
        )));
    }
    if let Some(ty) = &t.issued_token_type
        && ty != ACCESS_TOKEN_TYPE
        && ty != JWT_TOKEN_TYPE
    {
        return Err(oauth::bounded(&format!(
            "the token service issued a `{ty}`, not an access token"
        )));
    }
    // It goes out in a header on every call of this principal.
    if t.access_token.is_empty()
        || t.access_token.len() > oauth::MAX_TOKEN_CHARS
        || !t.access_token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(format!(
            "the token service issued a token that is empty, longer than {} characters or not printable ASCII",
            oauth::MAX_TOKEN_CHARS
        ));
    }
    Ok(Exchanged {
        token: Zeroizing::new(t.access_token),
        expires_in: t.expires_in,
    })
}

/// The exchange's form POST (built apart: the form encoder must not live across an await).
fn build_request(
    spec: &SlotExchange,
    secret: Option<&str>,
    subject_token: &str,
) -> Result<oauth2::HttpRequest, String> {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("grant_type", GRANT_TYPE)
        .append_pair("subject_token", subject_token)
        .append_pair("subject_token_type", JWT_TOKEN_TYPE)
        .append_pair("requested_token_type", ACCESS_TOKEN_TYPE);
    if let Some(a) = &spec.audience {
        form.append_pair("audience", a);
    }
    if !spec.scopes.is_empty() {
        form.append_pair("scope", &spec.scopes.join(" "));
    }
    let mut request = oauth2::http::Request::builder()
        .method(oauth2::http::Method::POST)
        .uri(&spec.token_endpoint)
        .header(
            oauth2::http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .header(oauth2::http::header::ACCEPT, "application/json");
    match secret {
        // RFC 6749 §2.3.1: both parts form-encoded, then Basic.
        Some(secret) => {
            let enc =
                |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let basic = Zeroizing::new(format!("{}:{}", enc(&spec.client_id), enc(secret)));
            request = request.header(
                oauth2::http::header::AUTHORIZATION,
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(basic.as_bytes())
                ),
            );
        }
        None => {
            form.append_pair("client_id", &spec.client_id);
        }
    }
    request
        .body(form.finish().into_bytes())
        .map_err(|e| e.to_string())
}

/// Whose token, for which slot (and which settings of it: a changed slot is a new key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExchangeKey {
    pub group: String,
    pub slot: String,
    pub agent: String,
    pub person: Option<String>,
    pub spec: Arc<SlotExchange>,
}

struct Cached {
    token: Zeroizing<String>,
    /// From when it is not used any more.
    stale_at: Instant,
}

type Entry = Arc<tokio::sync::Mutex<Option<Cached>>>;

/// The exchanged tokens each instance holds.
#[derive(Default)]
pub struct Exchanges {
    entries: Mutex<HashMap<ExchangeKey, Entry>>,
}

impl std::fmt::Debug for Exchanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchanges").finish_non_exhaustive()
    }
}

/// Whether a token came from the cache or was just exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Cached,
    /// Exchanged now; it lasts this many seconds, if the STS said.
    Exchanged(Option<u64>),
}

impl Exchanges {
    /// The principal's token for `key`: the cached one while it is fresh, else one `fetch`
    /// gets (calls of the same principal wait for it rather than fetching too).
    pub async fn token<F, Fut>(
        &self,
        key: ExchangeKey,
        fetch: F,
    ) -> Result<(Zeroizing<String>, Source), String>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Exchanged, String>>,
    {
        let entry = self.entry(key);
        let mut held = entry.lock().await;
        let now = Instant::now();
        if let Some(c) = held.as_ref()
            && c.stale_at > now
        {
            return Ok((c.token.clone(), Source::Cached));
        }
        // A failure is not cached: the next call asks again (the STS may be back).
        *held = None;
        let got = fetch().await?;
        let life = got
            .expires_in
            .map(Duration::from_secs)
            .unwrap_or(UNSAID_LIFETIME)
            .min(MAX_CACHE);
        let stale_at = Instant::now() + life - RENEW_AHEAD.min(life / 2);
        *held = Some(Cached {
            token: got.token.clone(),
            stale_at,
        });
        Ok((got.token, Source::Exchanged(got.expires_in)))
    }

    fn entry(&self, key: ExchangeKey) -> Entry {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.get(&key) {
            return e.clone();
        }
        if entries.len() >= MAX_CACHED {
            // Stale or empty entries nobody is using go first; if none, the one that goes
            // stale soonest. An entry in use (locked, or handed out) is never dropped from
            // under its caller: it is only forgotten by the map.
            let now = Instant::now();
            entries.retain(|_, e| {
                Arc::strong_count(e) > 1
                    || e.try_lock()
                        .map(|c| c.as_ref().is_some_and(|c| c.stale_at > now))
                        .unwrap_or(true)
            });
            if entries.len() >= MAX_CACHED {
                let soonest = entries
                    .iter()
                    .filter_map(|(k, e)| {
                        let c = e.try_lock().ok()?;
                        Some((k.clone(), c.as_ref().map(|c| c.stale_at)))
                    })
                    .min_by_key(|(_, at)| *at)
                    .map(|(k, _)| k);
                match soonest {
                    Some(k) => {
                        entries.remove(&k);
                    }
                    // Every entry is in use at this moment: this caller's token is not kept.
                    None => return Arc::new(tokio::sync::Mutex::new(None)),
                }
            }
        }
        let e: Entry = Arc::new(tokio::sync::Mutex::new(None));
        entries.insert(key, e.clone());
        e
    }

    /// Entries held (for the bound's test).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn spec() -> SlotExchange {
        SlotExchange {
            token_endpoint: "https://sts.example/token".into(),
            client_id: "toolgate".into(),
            client_secret_env: None,
            audience: Some("https://api.example".into()),
            scopes: vec!["read".into()],
            subject_audience: None,
        }
    }

    fn key(agent: &str, person: Option<&str>) -> ExchangeKey {
        ExchangeKey {
            group: "g".into(),
            slot: "TOKEN".into(),
            agent: agent.into(),
            person: person.map(str::to_owned),
            spec: Arc::new(spec()),
        }
    }

    #[test]
    fn settings_from_outside_are_checked() {
        assert!(spec().validate().is_ok());
        let bad = [
            SlotExchange {
                token_endpoint: "http://sts.example/token".into(),
                ..spec()
            },
            SlotExchange {
                client_id: " ".into(),
                ..spec()
            },
            SlotExchange {
                client_secret_env: Some("NOT A VAR".into()),
                ..spec()
            },
            SlotExchange {
                audience: Some("a\nb".into()),
                ..spec()
            },
            SlotExchange {
                scopes: vec!["two words".into()],
                ..spec()
            },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?} was accepted");
        }
    }

    #[tokio::test]
    async fn one_exchange_per_principal_while_fresh_and_concurrent_callers_share_it() {
        let exchanges = Arc::new(Exchanges::default());
        let fetched = Arc::new(AtomicUsize::new(0));
        let mut calls = Vec::new();
        for i in 0..20 {
            let (exchanges, fetched) = (exchanges.clone(), fetched.clone());
            let agent = if i % 2 == 0 { "a" } else { "b" };
            calls.push(tokio::spawn(async move {
                exchanges
                    .token(key(agent, None), || async move {
                        let n = fetched.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Ok(Exchanged {
                            token: Zeroizing::new(format!("{agent}-{n}")),
                            expires_in: Some(600),
                        })
                    })
                    .await
                    .unwrap()
            }));
        }
        let mut tokens = Vec::new();
        for c in calls {
            tokens.push(c.await.unwrap().0.to_string());
        }
        assert_eq!(fetched.load(Ordering::SeqCst), 2, "{tokens:?}");
        assert!(
            tokens
                .iter()
                .all(|t| t.starts_with('a') || t.starts_with('b'))
        );
        // A person's token is another principal's.
        let (_, source) = exchanges
            .token(key("a", Some("alice")), || async {
                Ok(Exchanged {
                    token: Zeroizing::new("a-for-alice".into()),
                    expires_in: Some(600),
                })
            })
            .await
            .unwrap();
        assert_eq!(source, Source::Exchanged(Some(600)));
    }

    #[tokio::test]
    async fn a_token_near_its_end_is_exchanged_again_and_a_failure_is_not_kept() {
        let exchanges = Exchanges::default();
        // No life left: stale at once.
        let first = exchanges
            .token(key("a", None), || async {
                Ok(Exchanged {
                    token: Zeroizing::new("one".into()),
                    expires_in: Some(0),
                })
            })
            .await
            .unwrap();
        assert_eq!(first.1, Source::Exchanged(Some(0)));
        let failed = exchanges
            .token(key("a", None), || async { Err("down".to_owned()) })
            .await;
        assert_eq!(failed.err().as_deref(), Some("down"));
        let again = exchanges
            .token(key("a", None), || async {
                Ok(Exchanged {
                    token: Zeroizing::new("two".into()),
                    expires_in: Some(600),
                })
            })
            .await
            .unwrap();
        assert_eq!(again.0.as_str(), "two");
    }

    #[tokio::test]
    async fn the_cache_is_bounded() {
        let exchanges = Exchanges::default();
        for i in 0..MAX_CACHED + 100 {
            exchanges
                .token(key(&format!("agent-{i}"), None), || async {
                    Ok(Exchanged {
                        token: Zeroizing::new("t".into()),
                        expires_in: Some(600),
                    })
                })
                .await
                .unwrap();
        }
        assert!(exchanges.len() <= MAX_CACHED, "{}", exchanges.len());
    }

    #[test]
    fn the_request_is_rfc_8693s_with_the_client_authenticated_as_rfc_6749_says() {
        let form = |r: &oauth2::HttpRequest| -> HashMap<String, String> {
            url::form_urlencoded::parse(r.body()).into_owned().collect()
        };
        let public = build_request(&spec(), None, "subj").unwrap();
        let f = form(&public);
        assert_eq!(f["grant_type"], GRANT_TYPE);
        assert_eq!(f["subject_token"], "subj");
        assert_eq!(f["subject_token_type"], JWT_TOKEN_TYPE);
        assert_eq!(f["audience"], "https://api.example");
        assert_eq!(f["scope"], "read");
        assert_eq!(f["client_id"], "toolgate");
        assert!(public.headers().get("authorization").is_none());
        let confidential = build_request(&spec(), Some("s3cr:t&"), "subj").unwrap();
        assert!(!form(&confidential).contains_key("client_id"));
        let basic = confidential.headers()["authorization"].to_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(basic.strip_prefix("Basic ").unwrap())
            .unwrap();
        assert_eq!(decoded, b"toolgate:s3cr%3At%26");
    }

    #[test]
    fn the_subject_token_is_not_one_of_toolgates_access_tokens() {
        let c = SubjectClaims::new(
            "https://gw.example",
            "https://sts.example/token",
            "bot",
            "bot-client",
            Some("alice"),
        );
        assert_eq!(c.exp - c.iat, SUBJECT_TOKEN_SECS);
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["act"]["sub"], "alice");
        assert!(v.get("tool_prefixes").is_none() && v.get("scope").is_none());
    }
}
