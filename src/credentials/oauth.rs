//! Per-person OAuth to an upstream's authorization server: toolgate is the OAuth client, the
//! person signs in there once ("Connect" on My connections) and the grant (access and refresh
//! token) is stored sealed in the person's slot, refreshed ahead of its expiry.
//!
//! The authorization server is found as the MCP authorization spec says: the upstream's
//! protected-resource metadata (RFC 9728) names it, its own metadata (RFC 8414, or OpenID
//! discovery) gives the endpoints. Every request asks for the upstream as `resource`
//! (RFC 8707), so a token is good for that upstream only. PKCE S256 always; a server that does
//! not say it supports S256 is refused.
//!
//! Everything fetched here comes from outside (an upstream an admin configured, and whatever
//! server it names): no redirects are followed, answers are bounded and parsed strictly,
//! endpoints must be https (http only on a loopback host).

use std::time::Duration;

use chrono::{DateTime, Utc};
use oauth2::basic::{BasicClient, BasicErrorResponseType};
use oauth2::{
    AuthUrl, AuthorizationCode, ClientId, ClientSecret, CsrfToken, PkceCodeChallenge,
    PkceCodeVerifier, RedirectUrl, RefreshToken, RequestTokenError, Scope, TokenResponse, TokenUrl,
};
use serde::{Deserialize, Serialize};

/// Largest metadata document or token answer read from a server.
const MAX_METADATA_BYTES: usize = 64 * 1024;
/// Longest access or refresh token kept (the grant is sealed whole, and the access token goes
/// out on every call of its person).
pub(super) const MAX_TOKEN_CHARS: usize = 8 * 1024;
/// A grant is never due again sooner than this after it was stored: a server that issues
/// tokens expiring at once must not keep the refresher (and itself) busy.
const MIN_REFRESH_SECS: i64 = 5;
/// How long one request to a server may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// A grant is refreshed when this much of its lifetime is left, or half of it if that is
/// later: a one-hour token five minutes before it expires, a twenty-second one after ten.
const REFRESH_AHEAD: i64 = 300;

/// A slot filled by connecting to the upstream's authorization server, as written under the
/// slot (`oauth:`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotOAuth {
    /// toolgate's client id at that server (registered there by an admin).
    pub client_id: String,
    /// The environment variable holding the client secret, for a confidential client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_env: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// The authorization server's issuer. When set it is used as is, and the upstream's
    /// protected-resource metadata is not read (it cannot send people elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
}

impl SlotOAuth {
    pub fn validate(&self) -> Result<(), String> {
        if self.client_id.trim().is_empty() || self.client_id.len() > 256 {
            return Err("`oauth.client_id` is needed (at most 256 characters)".into());
        }
        if let Some(i) = &self.issuer {
            endpoint(i).map_err(|e| format!("`oauth.issuer`: {e}"))?;
        }
        if self.scopes.len() > 32 || self.scopes.iter().any(|s| !is_scope_token(s)) {
            return Err(
                "`oauth.scopes`: at most 32 scopes, each printable ASCII without spaces or quotes"
                    .into(),
            );
        }
        Ok(())
    }

    fn secret(&self) -> Result<Option<ClientSecret>, String> {
        match &self.client_secret_env {
            None => Ok(None),
            Some(var) => std::env::var(var)
                .map(|s| Some(ClientSecret::new(s)))
                .map_err(|_| format!("environment variable `{var}` is not set")),
        }
    }
}

/// RFC 6749's scope-token: `%x21 / %x23-5B / %x5D-7E`.
pub(super) fn is_scope_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
}

/// A person's grant, as sealed in their slot.
#[derive(Clone, Serialize, Deserialize)]
pub struct Grant {
    pub access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    pub token_endpoint: String,
    pub resource: String,
    /// Why the last refresh was refused: the person must connect again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("expires_at", &self.expires_at)
            .field("token_endpoint", &self.token_endpoint)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Grant {
    /// The grant a slot's opened value holds; `None` for a value that is not one (typed by
    /// hand into a slot that is meant to be connected).
    pub fn parse(value: &[u8]) -> Option<Self> {
        serde_json::from_slice(value).ok()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|e| e <= now.timestamp())
    }

    /// When it should be refreshed: `None` when it cannot be (no refresh token, no expiry, or
    /// refused).
    pub fn refresh_at(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if self.failed.is_some() || self.refresh_token.is_none() {
            return None;
        }
        let expires = self.expires_at?;
        let life = (expires - now.timestamp()).max(0);
        let ahead = REFRESH_AHEAD.min(life / 2);
        DateTime::from_timestamp((expires - ahead).max(now.timestamp() + MIN_REFRESH_SECS), 0)
    }

    /// Whether it was obtained for `upstream_url`: a grant is not sent to an upstream that was
    /// moved elsewhere since (its audience is the old one).
    pub fn for_resource(&self, upstream_url: &str) -> bool {
        url::Url::parse(upstream_url)
            .is_ok_and(|u| u.as_str().trim_end_matches('/') == self.resource.trim_end_matches('/'))
    }

    fn from_response(
        r: &oauth2::basic::BasicTokenResponse,
        token_endpoint: &str,
        resource: &str,
        previous_refresh: Option<String>,
    ) -> Result<Self, String> {
        if r.access_token().secret().len() > MAX_TOKEN_CHARS
            || r.refresh_token()
                .is_some_and(|t| t.secret().len() > MAX_TOKEN_CHARS)
        {
            return Err(format!(
                "the server issued a token longer than {MAX_TOKEN_CHARS} characters"
            ));
        }
        Ok(Grant {
            access_token: r.access_token().secret().clone(),
            // A server that does not rotate refresh tokens keeps the one it gave.
            refresh_token: r
                .refresh_token()
                .map(|t| t.secret().clone())
                .or(previous_refresh),
            expires_at: r
                .expires_in()
                .map(|d| Utc::now().timestamp() + d.as_secs().min(10 * 365 * 86_400) as i64),
            token_endpoint: token_endpoint.to_owned(),
            resource: resource.to_owned(),
            failed: None,
        })
    }
}

/// Where a person is sent, and what comes back to the callback.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    /// The upstream, as the token is requested for it.
    pub resource: String,
}

/// A URL from outside usable as an endpoint: https, or http on a loopback host.
pub(super) fn endpoint(raw: &str) -> Result<url::Url, String> {
    let u = url::Url::parse(raw).map_err(|e| format!("`{raw}` is not a URL: {e}"))?;
    let loopback = match u.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    match u.scheme() {
        "https" => {}
        "http" if loopback => {}
        _ => {
            return Err(format!(
                "`{raw}` must be https (http only on a loopback host)"
            ));
        }
    }
    if u.fragment().is_some() || !u.username().is_empty() || u.password().is_some() {
        return Err(format!("`{raw}` carries a fragment or credentials"));
    }
    Ok(u)
}

pub fn http_client() -> Result<oauth2::reqwest::Client, String> {
    oauth2::reqwest::ClientBuilder::new()
        .redirect(oauth2::reqwest::redirect::Policy::none())
        .timeout(TIMEOUT)
        .build()
        .map_err(|e| e.to_string())
}

/// GETs a JSON document, at most [`MAX_METADATA_BYTES`]; `Ok(None)` on a 404.
async fn get_json<T: serde::de::DeserializeOwned>(
    http: &oauth2::reqwest::Client,
    url: &url::Url,
) -> Result<Option<T>, String> {
    let mut resp = http
        .get(url.clone())
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if resp.status() == 404 {
        return Ok(None);
    }
    if !resp.status().is_success() {
        return Err(format!("{url} answered {}", resp.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        if body.len() + chunk.len() > MAX_METADATA_BYTES {
            return Err(format!(
                "{url} answered more than {MAX_METADATA_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| format!("{url} is not the expected document: {e}"))
}

/// `{origin}/.well-known/{name}{path}`, the form RFC 8414 and RFC 9728 share.
fn well_known(base: &url::Url, name: &str) -> url::Url {
    let mut u = base.clone();
    let path = base.path().trim_end_matches('/');
    u.set_path(&format!("/.well-known/{name}{path}"));
    u.set_query(None);
    u
}

#[derive(Deserialize)]
struct ResourceMetadata {
    resource: String,
    #[serde(default)]
    authorization_servers: Vec<String>,
}

#[derive(Deserialize)]
struct ServerMetadata {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    #[serde(default)]
    code_challenge_methods_supported: Vec<String>,
}

/// The endpoints for `upstream_url`'s slot `oauth`.
pub async fn discover(upstream_url: &str, oauth: &SlotOAuth) -> Result<Endpoints, String> {
    let http = http_client()?;
    let upstream = endpoint(upstream_url)?;
    let mut resource = upstream.clone();
    resource.set_fragment(None);
    let issuer = match &oauth.issuer {
        Some(i) => i.clone(),
        None => {
            // RFC 9728 §3.1: the path-inserted form first, then the origin's.
            let mut found = None;
            for url in [
                well_known(&upstream, "oauth-protected-resource"),
                well_known(
                    &upstream.join("/").map_err(|e| e.to_string())?,
                    "oauth-protected-resource",
                ),
            ] {
                if let Some(m) = get_json::<ResourceMetadata>(&http, &url).await? {
                    found = Some(m);
                    break;
                }
            }
            let m = found.ok_or_else(|| {
                format!("the upstream publishes no protected-resource metadata at {}: set `oauth.issuer`", well_known(&upstream, "oauth-protected-resource"))
            })?;
            // RFC 9728 §3.3: the metadata must be about this resource.
            if m.resource.trim_end_matches('/') != resource.as_str().trim_end_matches('/') {
                return Err(format!(
                    "the upstream's metadata is for `{}`, not `{resource}`",
                    m.resource
                ));
            }
            m.authorization_servers
                .into_iter()
                .next()
                .ok_or("the upstream's metadata names no authorization server")?
        }
    };
    let issuer_url = endpoint(&issuer)?;
    let mut metadata = None;
    for url in [well_known(&issuer_url, "oauth-authorization-server"), {
        // OpenID discovery appends rather than inserts.
        let mut u = issuer_url.clone();
        u.set_path(&format!(
            "{}/.well-known/openid-configuration",
            issuer_url.path().trim_end_matches('/')
        ));
        u
    }] {
        if let Some(m) = get_json::<ServerMetadata>(&http, &url).await? {
            metadata = Some(m);
            break;
        }
    }
    let m =
        metadata.ok_or_else(|| format!("`{issuer}` publishes no authorization server metadata"))?;
    // RFC 8414 §3.3: a document naming another issuer is refused (mix-up).
    if m.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
        return Err(format!(
            "`{issuer}`'s metadata names another issuer, `{}`",
            m.issuer
        ));
    }
    if !m
        .code_challenge_methods_supported
        .iter()
        .any(|c| c == "S256")
    {
        return Err(format!("`{issuer}` does not say it supports PKCE S256"));
    }
    endpoint(&m.authorization_endpoint)?;
    endpoint(&m.token_endpoint)?;
    Ok(Endpoints {
        authorization_endpoint: m.authorization_endpoint,
        token_endpoint: m.token_endpoint,
        resource: resource.to_string(),
    })
}

/// Where to send the person, the `state` it carries and the PKCE verifier to keep.
pub fn authorize_url(
    ep: &Endpoints,
    oauth: &SlotOAuth,
    redirect: &str,
) -> Result<(url::Url, String, String), String> {
    let client = BasicClient::new(ClientId::new(oauth.client_id.clone()))
        .set_auth_uri(AuthUrl::new(ep.authorization_endpoint.clone()).map_err(|e| e.to_string())?)
        .set_redirect_uri(RedirectUrl::new(redirect.to_owned()).map_err(|e| e.to_string())?);
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let (url, state) = client
        .authorize_url(CsrfToken::new_random)
        .add_scopes(oauth.scopes.iter().cloned().map(Scope::new))
        .add_extra_param("resource", ep.resource.clone())
        .set_pkce_challenge(challenge)
        .url();
    Ok((url, state.secret().clone(), verifier.secret().clone()))
}

/// The code from the callback, for a grant.
pub async fn exchange(
    oauth: &SlotOAuth,
    token_endpoint: &str,
    resource: &str,
    redirect: &str,
    code: &str,
    verifier: &str,
) -> Result<Grant, String> {
    let mut client = BasicClient::new(ClientId::new(oauth.client_id.clone()))
        .set_token_uri(TokenUrl::new(token_endpoint.to_owned()).map_err(|e| e.to_string())?)
        .set_redirect_uri(RedirectUrl::new(redirect.to_owned()).map_err(|e| e.to_string())?);
    if let Some(s) = oauth.secret()? {
        client = client.set_client_secret(s);
    }
    let r = client
        .exchange_code(AuthorizationCode::new(code.to_owned()))
        .set_pkce_verifier(PkceCodeVerifier::new(verifier.to_owned()))
        .add_extra_param("resource", resource.to_owned())
        .request_async(&Bounded(http_client()?))
        .await
        .map_err(|e| describe(&e))?;
    Grant::from_response(&r, token_endpoint, resource, None)
}

/// Why a refresh did not give a new grant.
#[derive(Debug)]
pub enum RefreshError {
    /// The server refused the refresh token (revoked, expired, or the client removed): only
    /// the person connecting again helps.
    Refused(String),
    /// It may pass (the server is down, a network error): try again later.
    Transient(String),
}

/// A new grant from `grant`'s refresh token.
pub async fn refresh(oauth: &SlotOAuth, grant: &Grant) -> Result<Grant, RefreshError> {
    let rt = grant
        .refresh_token
        .clone()
        .ok_or_else(|| RefreshError::Refused("no refresh token was issued".into()))?;
    let mut client = BasicClient::new(ClientId::new(oauth.client_id.clone())).set_token_uri(
        TokenUrl::new(grant.token_endpoint.clone())
            .map_err(|e| RefreshError::Refused(e.to_string()))?,
    );
    if let Some(s) = oauth.secret().map_err(RefreshError::Transient)? {
        client = client.set_client_secret(s);
    }
    let http = Bounded(http_client().map_err(RefreshError::Transient)?);
    match client
        .exchange_refresh_token(&RefreshToken::new(rt.clone()))
        .add_extra_param("resource", grant.resource.clone())
        .request_async(&http)
        .await
    {
        Ok(r) => Grant::from_response(&r, &grant.token_endpoint, &grant.resource, Some(rt))
            .map_err(RefreshError::Refused),
        Err(RequestTokenError::ServerResponse(e))
            if matches!(
                e.error(),
                BasicErrorResponseType::InvalidGrant
                    | BasicErrorResponseType::InvalidClient
                    | BasicErrorResponseType::UnauthorizedClient
            ) =>
        {
            Err(RefreshError::Refused(bounded(&e.to_string())))
        }
        Err(e) => Err(RefreshError::Transient(describe(&e))),
    }
}

/// oauth2's own reqwest client reads an answer whole, however long; a token endpoint is
/// outside, so this one reads at most [`MAX_METADATA_BYTES`] of it.
pub(super) struct Bounded(pub(super) oauth2::reqwest::Client);

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct BoundedError(String);

impl<'c> oauth2::AsyncHttpClient<'c> for Bounded {
    type Error = BoundedError;
    type Future = std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<oauth2::HttpResponse, BoundedError>>
                + Send
                + 'c,
        >,
    >;

    fn call(&'c self, request: oauth2::HttpRequest) -> Self::Future {
        Box::pin(async move {
            let fail = |e: &dyn std::fmt::Display| BoundedError(e.to_string());
            let request: oauth2::reqwest::Request = request
                .try_into()
                .map_err(|e: oauth2::reqwest::Error| fail(&e))?;
            let mut resp = self.0.execute(request).await.map_err(|e| fail(&e))?;
            let mut answer = oauth2::http::Response::builder().status(resp.status());
            for (name, value) in resp.headers() {
                answer = answer.header(name, value);
            }
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| fail(&e))? {
                if body.len() + chunk.len() > MAX_METADATA_BYTES {
                    return Err(BoundedError(format!(
                        "the token endpoint answered more than {MAX_METADATA_BYTES} bytes"
                    )));
                }
                body.extend_from_slice(&chunk);
            }
            answer.body(body).map_err(|e| fail(&e))
        })
    }
}

fn describe<E: std::error::Error>(e: &E) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    bounded(&out)
}

/// A server's words, bounded (they reach a page and the audit chain).
pub(super) fn bounded(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant_at(now: DateTime<Utc>, expires_in: i64, refresh: bool) -> Grant {
        Grant {
            access_token: "a".into(),
            refresh_token: refresh.then(|| "r".into()),
            expires_at: Some(now.timestamp() + expires_in),
            token_endpoint: "https://as.example/token".into(),
            resource: "https://u.example/mcp".into(),
            failed: None,
        }
    }

    /// Whole seconds, as grants count.
    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(Utc::now().timestamp(), 0).unwrap()
    }

    #[test]
    fn grants_are_refreshed_ahead_of_expiry_and_only_when_they_can_be() {
        let now = now();
        let grant = |expires_in, refresh| grant_at(now, expires_in, refresh);
        let hour = grant(3600, true).refresh_at(now).unwrap();
        assert_eq!((hour - now).num_seconds(), 3300, "five minutes ahead");
        let short = grant(20, true).refresh_at(now).unwrap();
        assert_eq!((short - now).num_seconds(), 10, "half of a short lifetime");
        assert!(grant(3600, false).refresh_at(now).is_none());
        // A token that expires at once is not due again at once.
        let instant = grant(0, true).refresh_at(now).unwrap();
        assert_eq!((instant - now).num_seconds(), MIN_REFRESH_SECS);
        let mut refused = grant(3600, true);
        refused.failed = Some("invalid_grant".into());
        assert!(refused.refresh_at(now).is_none());
        assert!(grant(-1, true).expired(now) && !grant(5, true).expired(now));
        assert!(!format!("{:?}", grant(5, true)).contains("access_token"));
    }

    #[test]
    fn endpoints_from_outside_must_be_https_or_loopback() {
        assert!(endpoint("https://as.example/token").is_ok());
        assert!(endpoint("http://127.0.0.1:4000/token").is_ok());
        assert!(endpoint("http://localhost/token").is_ok());
        for bad in [
            "http://as.example/token",
            "ftp://as.example",
            "https://user:pw@as.example/",
            "https://as.example/#frag",
            "javascript:alert(1)",
        ] {
            assert!(endpoint(bad).is_err(), "{bad}");
        }
        let base = url::Url::parse("https://u.example/v1/mcp").unwrap();
        assert_eq!(
            well_known(&base, "oauth-protected-resource").as_str(),
            "https://u.example/.well-known/oauth-protected-resource/v1/mcp"
        );
    }

    #[test]
    fn scopes_are_scope_tokens() {
        let mut o = SlotOAuth {
            client_id: "c".into(),
            client_secret_env: None,
            scopes: vec!["openid".into(), "repo:read".into()],
            issuer: None,
        };
        assert!(o.validate().is_ok());
        o.scopes = vec!["a b".into()];
        assert!(o.validate().is_err());
        o.scopes = vec!["x\"y".into()];
        assert!(o.validate().is_err());
    }
}
