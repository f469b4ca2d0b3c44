//! Access tokens: RFC 9068 JWTs (`typ: at+jwt`), signed with Ed25519, carrying the agent's
//! tool prefixes.

use std::time::Duration;

use chrono::Utc;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::policy::snapshot::{PolicySnapshot, Principal};
use crate::policy::{GrantTarget, TokenScope};

pub const TOKEN_TYPE: &str = "at+jwt";

/// Clock skew tolerated between us and whoever made a JWT, for `exp`, `nbf` and `iat`: enough
/// for hosts kept in sync by NTP, too little to make a token meant for later usable now. Used
/// for what others sign (client assertions, ID tokens).
pub const CLOCK_LEEWAY_SECS: u64 = 60;

/// Default skew tolerated on our own access tokens (`--token-leeway-secs`): they are issued and
/// checked by the gateway itself, so only the clocks of its instances can differ.
pub const ACCESS_TOKEN_LEEWAY_SECS: u64 = 5;

/// What an access token must say to be ours: issuer, audience, and the clock skew tolerated.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
    pub leeway_secs: u64,
}

/// Refuses an `iat` (issued at) in the future: jsonwebtoken checks `exp` and `nbf` only, and a
/// token claiming to be issued later than now was not made by a correct clock.
pub fn check_iat(iat: Option<i64>, now: i64) -> Result<(), String> {
    match iat {
        Some(iat) if iat > now + CLOCK_LEEWAY_SECS as i64 => {
            Err(format!("iat {iat} is in the future (now {now})"))
        }
        _ => Ok(()),
    }
}

/// The claims of an access token (DESIGN's external contract).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AccessClaims {
    pub iss: String,
    pub sub: String,
    pub client_id: String,
    pub aud: String,
    pub iat: i64,
    pub exp: i64,
    pub jti: String,
    pub scope: String,
    pub tool_prefixes: Vec<String>,
    /// The person a host acts for (RFC 8693 §4.1), on tokens obtained by sign-in and consent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<Actor>,
    /// The consent those tokens were issued under: checked live on every request, so that
    /// revoking it ends them at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_id: Option<String>,
}

/// An RFC 8693 actor claim: who is acting.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Actor {
    pub sub: String,
}

impl AccessClaims {
    /// Claims for `agent`'s client: `scope` says what the token reaches; `grants` are the
    /// agent's grants now, carried in `tool_prefixes` for a token that follows them (what the
    /// agent held at issuance; the live grants decide on every request).
    pub fn new(
        issuer: &str,
        audience: &str,
        agent: &str,
        client_id: &str,
        scope: &TokenScope,
        grants: &[GrantTarget],
        lifetime: Duration,
    ) -> Self {
        let now = Utc::now().timestamp();
        let carried = match scope {
            TokenScope::AllGranted => grants,
            TokenScope::Only(targets) => targets.as_slice(),
        };
        Self {
            iss: issuer.to_owned(),
            sub: agent.to_owned(),
            client_id: client_id.to_owned(),
            aud: audience.to_owned(),
            iat: now,
            exp: now + lifetime.as_secs() as i64,
            jti: Uuid::new_v4().to_string(),
            scope: scope.to_scope_string(),
            tool_prefixes: carried.iter().map(GrantTarget::to_prefix).collect(),
            act: None,
            authorization_id: None,
        }
    }

    /// These claims, for a host acting for `person` under `authorization`.
    pub fn acting_for(mut self, person: &str, authorization: Uuid) -> Self {
        self.act = Some(Actor {
            sub: person.to_owned(),
        });
        self.authorization_id = Some(authorization.to_string());
        self
    }
}

/// Signs claims with the current key.
pub fn sign(claims: &AccessClaims, kid: &str, private_pkcs8: &[u8]) -> anyhow::Result<String> {
    let mut header = Header::new(Algorithm::EdDSA);
    header.typ = Some(TOKEN_TYPE.to_owned());
    header.kid = Some(kid.to_owned());
    Ok(jsonwebtoken::encode(
        &header,
        claims,
        &EncodingKey::from_ed_der(private_pkcs8),
    )?)
}

/// Why a token was refused. The reason is logged at debug level and audited, never sent: the
/// caller only learns that its token is invalid.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("no bearer token")]
    Missing,
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("algorithm {0} is not accepted")]
    Algorithm(String),
    #[error("token type must be at+jwt")]
    Type,
    #[error("unknown signing key")]
    UnknownKey,
    #[error("token has expired")]
    Expired,
    #[error("invalid token: {0}")]
    Invalid(String),
    #[error("token was revoked")]
    Revoked,
    #[error("the token's client no longer exists")]
    UnknownClient,
    #[error("the token's authorization was revoked")]
    AuthorizationRevoked,
}

impl TokenError {
    /// The refusal in a few fixed words, whatever the token held (refusals of one kind from
    /// one source are summarised together, see `limits::refusals`).
    pub fn kind(&self) -> &'static str {
        match self {
            TokenError::Missing => "no bearer token",
            TokenError::Malformed(_) => "malformed token",
            TokenError::Algorithm(_) => "algorithm not accepted",
            TokenError::Type => "wrong token type",
            TokenError::UnknownKey => "unknown signing key",
            TokenError::Expired => "expired",
            TokenError::Invalid(_) => "invalid token",
            TokenError::Revoked => "token revoked",
            TokenError::UnknownClient => "token's client gone",
            TokenError::AuthorizationRevoked => "token's authorization revoked",
        }
    }
}

/// Verifies an access token against the snapshot: signature, `alg`/`typ`, `iss`, `aud`, `exp`,
/// `nbf` and `iat` (each with the expected leeway), then that its `jti` is not revoked and
/// its client still exists for its agent.
pub fn verify(
    token: &str,
    snapshot: &PolicySnapshot,
    expected: &Expected<'_>,
) -> Result<(Principal, AccessClaims), TokenError> {
    let signed = verify_signed(token, snapshot, expected)?;
    let principal = admit(&signed, snapshot)?;
    Ok((principal, signed.claims))
}

/// What a token's signature proves, once verified: fixed for the token's life.
#[derive(Debug)]
struct Signed {
    kid: String,
    claims: AccessClaims,
    jti: Uuid,
}

fn verify_signed(
    token: &str,
    snapshot: &PolicySnapshot,
    expected: &Expected<'_>,
) -> Result<Signed, TokenError> {
    let header =
        jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
    if header.alg != Algorithm::EdDSA {
        return Err(TokenError::Algorithm(format!("{:?}", header.alg)));
    }
    if !header.typ.as_deref().is_some_and(|t| {
        t.eq_ignore_ascii_case(TOKEN_TYPE) || t.eq_ignore_ascii_case("application/at+jwt")
    }) {
        return Err(TokenError::Type);
    }
    let kid = header.kid.ok_or(TokenError::UnknownKey)?;
    let key = snapshot.verify_key(&kid).ok_or(TokenError::UnknownKey)?;
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.set_issuer(&[expected.issuer]);
    validation.set_audience(&[expected.audience]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    validation.validate_nbf = true;
    validation.leeway = expected.leeway_secs;
    let data =
        jsonwebtoken::decode::<AccessClaims>(token, &DecodingKey::from_ed_der(key), &validation)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => TokenError::Expired,
                _ => TokenError::Invalid(e.to_string()),
            })?;
    let claims = data.claims;
    let now = Utc::now().timestamp();
    if claims.iat > now + expected.leeway_secs as i64 {
        return Err(TokenError::Invalid(format!(
            "iat {} is in the future (now {now})",
            claims.iat
        )));
    }
    let jti = Uuid::parse_str(&claims.jti)
        .map_err(|_| TokenError::Invalid("jti is not a UUID".into()))?;
    Ok(Signed { kid, claims, jti })
}

/// What can change while a token lives, checked on every request: revocation, and whether its
/// client still exists for its agent.
fn admit(signed: &Signed, snapshot: &PolicySnapshot) -> Result<Principal, TokenError> {
    let claims = &signed.claims;
    if snapshot.is_revoked(&signed.jti) {
        return Err(TokenError::Revoked);
    }
    let person = match &claims.authorization_id {
        // A host acting for a person: its consent must still stand, for this agent, client
        // and person (a public client has no row of its own to check).
        Some(id) => {
            let live = Uuid::parse_str(id)
                .ok()
                .and_then(|id| snapshot.authorization(&id))
                .ok_or(TokenError::AuthorizationRevoked)?;
            let person = claims.act.as_ref().map(|a| a.sub.as_str());
            if live.agent != claims.sub
                || live.client_id != claims.client_id
                || Some(live.username.as_str()) != person
            {
                return Err(TokenError::AuthorizationRevoked);
            }
            Some(live.username.clone())
        }
        None => {
            if snapshot.client_agent(&claims.client_id) != Some(claims.sub.as_str()) {
                return Err(TokenError::UnknownClient);
            }
            None
        }
    };
    Ok(Principal {
        agent: claims.sub.clone(),
        client_id: claims.client_id.clone(),
        jti: Some(signed.jti),
        scope: TokenScope::from_claims(&claims.scope, &claims.tool_prefixes),
        person,
    })
}

/// Most tokens [`VerifiedTokens`] remembers; beyond it, expired ones are dropped, then all.
const MAX_VERIFIED: usize = 8192;

/// Access tokens whose signature was verified, by their exact text, until they expire.
///
/// The Ed25519 check is the costliest step of a cheap request, and an agent sends the same
/// token for its whole life (15 minutes by default). A hit skips only what the signature
/// proves, which cannot change; expiry, the signing key still being trusted (rotation),
/// revocation and the client are checked again on every request, from the snapshot. Only
/// tokens we signed are remembered, so strangers cannot fill it.
#[derive(Debug, Default)]
pub struct VerifiedTokens {
    entries: std::sync::Mutex<std::collections::HashMap<Box<str>, std::sync::Arc<Signed>>>,
}

impl VerifiedTokens {
    /// [`verify`], remembering the signature check.
    pub fn verify(
        &self,
        token: &str,
        snapshot: &PolicySnapshot,
        expected: &Expected<'_>,
    ) -> Result<Principal, TokenError> {
        let lock = || self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Utc::now().timestamp();
        let hit = lock().get(token).cloned();
        let signed = match hit {
            Some(s) => {
                let expired = s.claims.exp + expected.leeway_secs as i64 <= now;
                if expired || snapshot.verify_key(&s.kid).is_none() {
                    lock().remove(token);
                    // The full check names the reason, as for a token never seen.
                    return verify(token, snapshot, expected).map(|(p, _)| p);
                }
                s
            }
            None => {
                let s = std::sync::Arc::new(verify_signed(token, snapshot, expected)?);
                let principal = admit(&s, snapshot)?;
                let mut entries = lock();
                if entries.len() >= MAX_VERIFIED {
                    entries.retain(|_, v| v.claims.exp + expected.leeway_secs as i64 > now);
                    if entries.len() >= MAX_VERIFIED {
                        entries.clear();
                    }
                }
                entries.insert(token.into(), s);
                return Ok(principal);
            }
        };
        admit(&signed, snapshot)
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
