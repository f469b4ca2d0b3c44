//! Access tokens: RFC 9068 JWTs (`typ: at+jwt`), signed with Ed25519, carrying the agent's
//! tool prefixes.

use std::time::Duration;

use chrono::Utc;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::policy::GrantTarget;
use crate::policy::snapshot::{PolicySnapshot, Principal};

pub const TOKEN_TYPE: &str = "at+jwt";

/// Clock skew tolerated between us and whoever made a JWT, for `exp`, `nbf` and `iat`: enough
/// for hosts kept in sync by NTP, too little to make a token meant for later usable now.
pub const CLOCK_LEEWAY_SECS: u64 = 60;

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
}

impl AccessClaims {
    pub fn new(
        issuer: &str,
        audience: &str,
        agent: &str,
        client_id: &str,
        prefixes: &[GrantTarget],
        lifetime: Duration,
    ) -> Self {
        let now = Utc::now().timestamp();
        let prefixes: Vec<String> = prefixes.iter().map(GrantTarget::to_prefix).collect();
        Self {
            iss: issuer.to_owned(),
            sub: agent.to_owned(),
            client_id: client_id.to_owned(),
            aud: audience.to_owned(),
            iat: now,
            exp: now + lifetime.as_secs() as i64,
            jti: Uuid::new_v4().to_string(),
            scope: prefixes
                .iter()
                .map(|p| format!("tools:{}", p.trim_end_matches("__")))
                .collect::<Vec<_>>()
                .join(" "),
            tool_prefixes: prefixes,
        }
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
    #[error("invalid token: {0}")]
    Invalid(String),
    #[error("token was revoked")]
    Revoked,
    #[error("the token's client no longer exists")]
    UnknownClient,
}

/// Verifies an access token against the snapshot: algorithm allow-list (EdDSA only), `typ`,
/// known `kid`, signature, `iss`, `aud`, `exp`, `nbf` and `iat` (within
/// [`CLOCK_LEEWAY_SECS`]), then `jti` not revoked and the client still
/// belonging to the agent.
pub fn verify(
    token: &str,
    snapshot: &PolicySnapshot,
    issuer: &str,
    audience: &str,
) -> Result<(Principal, AccessClaims), TokenError> {
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
    validation.set_issuer(&[issuer]);
    validation.set_audience(&[audience]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    validation.validate_nbf = true;
    validation.leeway = CLOCK_LEEWAY_SECS;
    let data =
        jsonwebtoken::decode::<AccessClaims>(token, &DecodingKey::from_ed_der(key), &validation)
            .map_err(|e| TokenError::Invalid(e.to_string()))?;
    let claims = data.claims;
    check_iat(Some(claims.iat), Utc::now().timestamp()).map_err(TokenError::Invalid)?;
    let jti = Uuid::parse_str(&claims.jti)
        .map_err(|_| TokenError::Invalid("jti is not a UUID".into()))?;
    if snapshot.is_revoked(&jti) {
        return Err(TokenError::Revoked);
    }
    if snapshot.client_agent(&claims.client_id) != Some(claims.sub.as_str()) {
        return Err(TokenError::UnknownClient);
    }
    let prefixes = claims
        .tool_prefixes
        .iter()
        .filter_map(|p| GrantTarget::from_prefix(p))
        .collect();
    Ok((
        Principal {
            agent: claims.sub.clone(),
            client_id: claims.client_id.clone(),
            jti: Some(jti),
            prefixes,
        },
        claims,
    ))
}
