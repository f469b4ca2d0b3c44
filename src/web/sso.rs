//! Admin sign-in with an OpenID Provider: discovery, authorization code with PKCE, `state`
//! and `nonce`, ID token validation (by the `openidconnect` crate), then a role mapped from
//! one claim.
//!
//! The flow's secrets (nonce, PKCE verifier) stay in Postgres under the hash of `state`, so any
//! instance can answer the callback; the browser holds `state` in a cookie of its own, and a
//! callback is accepted only from the browser that started it (no login CSRF) and only once.
//! A federated account is unique by issuer + subject and never linked to a local account of the
//! same name; its role is re-evaluated from the claims at every sign-in.

use std::time::{Duration, Instant};

use askama::Template;
use axum::Extension;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreAuthenticationFlow, CoreErrorResponseType,
    CoreGenderClaim, CoreJsonWebKey, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm,
    CoreProviderMetadata, CoreRevocableToken, CoreRevocationErrorResponse,
    CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    AccessTokenHash, AdditionalClaims, AuthorizationCode, Client, ClientId, ClientSecret,
    CsrfToken, EmptyExtraTokenFields, EndpointMaybeSet, EndpointNotSet, EndpointSet, IdTokenFields,
    IssuerUrl, Nonce, OAuth2TokenResponse, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope,
    StandardErrorResponse, StandardTokenResponse, TokenResponse,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::WebState;
use super::error::WebError;
use super::session::{self, Role, random_token, sha256_hex};
use crate::audit::RequestOrigin;
use crate::auth::signin;
use crate::config::OidcArgs;
use crate::db;

/// The cookie holding `state` between the redirect to the provider and its callback.
const FLOW_COOKIE: &str = "toolgate_sso";
/// How long a sign-in may stay at the provider.
const FLOW_MINUTES: i64 = 10;
/// How long discovered metadata (endpoints and signing keys) is reused.
const METADATA_TTL: Duration = Duration::from_secs(600);
/// Longest claim value, error code or username taken from the provider.
const MAX_CLAIM_CHARS: usize = 256;

/// Whatever claims come besides the standard ones (the role claim among them).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ExtraClaims {
    #[serde(flatten)]
    claims: serde_json::Map<String, Value>,
}

impl AdditionalClaims for ExtraClaims {}

type Fields = IdTokenFields<
    ExtraClaims,
    EmptyExtraTokenFields,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;
type OidcClient = Client<
    ExtraClaims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    StandardTokenResponse<Fields, CoreTokenType>,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// SSO as configured by the `--oidc-*` flags.
#[derive(Clone)]
pub struct SsoSettings {
    pub issuer: String,
    pub client_id: String,
    client_secret: Option<String>,
    /// `<public-url>/admin/sso/callback`.
    pub redirect_url: String,
    pub scopes: Vec<String>,
    pub role_claim: String,
    /// Claim value → role, in the order given.
    pub role_map: Vec<(String, Role)>,
    /// Claim value → approver set; empty: sets are not the provider's to say.
    pub approver_map: Vec<(String, String)>,
    /// Shown on the button: "Sign in with <name>".
    pub provider_name: String,
}

impl std::fmt::Debug for SsoSettings {
    // The client secret never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsoSettings")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "***"))
            .field("redirect_url", &self.redirect_url)
            .field("role_claim", &self.role_claim)
            .finish_non_exhaustive()
    }
}

impl SsoSettings {
    /// `None` when no issuer is configured; an error names what is missing or malformed.
    pub fn from_args(args: &OidcArgs, public_base: &str) -> anyhow::Result<Option<Self>> {
        let Some(issuer) = &args.oidc_issuer else {
            if args.oidc_client_id.is_some() || !args.oidc_role_map.is_empty() {
                anyhow::bail!("--oidc-client-id and --oidc-role-map need --oidc-issuer");
            }
            return Ok(None);
        };
        let client_id = args
            .oidc_client_id
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| anyhow::anyhow!("--oidc-issuer needs --oidc-client-id"))?;
        let client_secret = match (&args.oidc_client_secret, &args.oidc_client_secret_file) {
            (Some(_), Some(_)) => anyhow::bail!(
                "give the OIDC client secret once: TOOLGATE_OIDC_CLIENT_SECRET or --oidc-client-secret-file"
            ),
            (Some(s), None) => Some(s.clone()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| {
                        anyhow::anyhow!("cannot read --oidc-client-secret-file {}: {e}", path.display())
                    })?
                    .trim_end()
                    .to_owned(),
            ),
            (None, None) => None,
        }
        .filter(|s| !s.is_empty());
        let mut role_map = Vec::new();
        for pair in &args.oidc_role_map {
            let (value, role) = pair.rsplit_once('=').ok_or_else(|| {
                anyhow::anyhow!("--oidc-role-map entry `{pair}` is not `claim-value=role`")
            })?;
            let role = Role::parse(role.trim()).ok_or_else(|| {
                anyhow::anyhow!(
                    "--oidc-role-map entry `{pair}`: the role must be admin, auditor, viewer or member"
                )
            })?;
            role_map.push((value.trim().to_owned(), role));
        }
        let mut approver_map = Vec::new();
        for pair in &args.oidc_approver_map {
            let (value, set) = pair.rsplit_once('=').ok_or_else(|| {
                anyhow::anyhow!(
                    "--oidc-approver-map entry `{pair}` is not `claim-value=approver-set`"
                )
            })?;
            let set = set.trim();
            if !crate::policy::approvals::valid_approver(set) {
                anyhow::bail!(
                    "--oidc-approver-map entry `{pair}`: `{set}` is not an approver set name (lowercase letters, digits, _ . -)"
                );
            }
            approver_map.push((value.trim().to_owned(), set.to_owned()));
        }
        if role_map.is_empty() {
            anyhow::bail!(
                "--oidc-issuer needs --oidc-role-map (for example `toolgate-admins=admin`): without it nobody could sign in"
            );
        }
        // Kept as given: the provider's issuer string is compared exactly (Google's has no
        // trailing slash, Auth0's has one).
        let issuer_str = issuer.trim().to_owned();
        let parsed = url::Url::parse(&issuer_str)
            .map_err(|e| anyhow::anyhow!("--oidc-issuer `{issuer_str}` is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "https" | "http") {
            anyhow::bail!("--oidc-issuer must be an https URL (http only for local testing)");
        }
        // Validated once here, so the handlers cannot fail on them.
        IssuerUrl::new(issuer_str.clone())?;
        let redirect_url = format!("{public_base}/admin/sso/callback");
        RedirectUrl::new(redirect_url.clone())?;
        Ok(Some(Self {
            provider_name: args
                .oidc_provider_name
                .clone()
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| parsed.host_str().unwrap_or("your provider").to_owned()),
            issuer: issuer_str,
            client_id,
            client_secret,
            redirect_url,
            scopes: args
                .oidc_scopes
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty() && s != "openid")
                .collect(),
            role_claim: args.oidc_role_claim.clone(),
            role_map,
            approver_map,
        }))
    }

    /// The approver sets `values` map to, sorted; `None` when no map is configured.
    pub fn approver_sets_for(&self, values: &[String]) -> Option<Vec<String>> {
        if self.approver_map.is_empty() {
            return None;
        }
        let mut sets: Vec<String> = self
            .approver_map
            .iter()
            .filter(|(v, _)| values.iter().any(|x| x == v))
            .map(|(_, s)| s.clone())
            .collect();
        sets.sort();
        sets.dedup();
        Some(sets)
    }

    /// The most privileged role any of `values` maps to.
    pub fn role_for(&self, values: &[String]) -> Option<Role> {
        Role::ALL.into_iter().find(|role| {
            self.role_map
                .iter()
                .any(|(v, r)| r == role && values.iter().any(|x| x == v))
        })
    }
}

/// SSO at run time: the settings, an HTTP client, and the provider's metadata once discovered.
pub struct Sso {
    pub settings: SsoSettings,
    http: openidconnect::reqwest::Client,
    metadata: tokio::sync::Mutex<Option<(Instant, CoreProviderMetadata)>>,
}

impl Sso {
    pub fn new(settings: SsoSettings) -> Self {
        // No redirects: the provider's endpoints are used as discovered, never where a
        // response points (the crate's advice against SSRF).
        let http = openidconnect::reqwest::Client::builder()
            .redirect(openidconnect::reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        Self {
            settings,
            http,
            metadata: tokio::sync::Mutex::new(None),
        }
    }

    /// Discovers on first use (a provider that is down does not stop toolgate from starting)
    /// and again after [`METADATA_TTL`], so rotated signing keys are picked up.
    async fn client(&self) -> Result<OidcClient, WebError> {
        let mut cached = self.metadata.lock().await;
        let fresh = cached
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < METADATA_TTL);
        if !fresh {
            let issuer = IssuerUrl::new(self.settings.issuer.clone())
                .map_err(|e| WebError::Internal(e.into()))?;
            let metadata = CoreProviderMetadata::discover_async(issuer, &self.http)
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, issuer = %self.settings.issuer, "OpenID Provider discovery failed");
                    WebError::Upstream(format!(
                        "{} cannot be reached right now. Try again in a minute.",
                        self.settings.provider_name
                    ))
                })?;
            *cached = Some((Instant::now(), metadata));
        }
        let Some((_, metadata)) = cached.as_ref() else {
            return Err(WebError::Internal(anyhow::anyhow!("no provider metadata")));
        };
        let redirect = RedirectUrl::new(self.settings.redirect_url.clone())
            .map_err(|e| WebError::Internal(e.into()))?;
        Ok(OidcClient::from_provider_metadata(
            metadata.clone(),
            ClientId::new(self.settings.client_id.clone()),
            self.settings.client_secret.clone().map(ClientSecret::new),
        )
        .set_redirect_uri(redirect))
    }

    /// Forgets the metadata, so the next sign-in fetches keys again.
    async fn forget(&self) {
        *self.metadata.lock().await = None;
    }
}

fn sso(state: &WebState) -> Result<&Sso, WebError> {
    state.sso.as_deref().ok_or(WebError::NotFound)
}

fn flow_cookie(state: &WebState, value: &str, max_age: i64) -> HeaderValue {
    session::flow_cookie(state, FLOW_COOKIE, "/admin/sso", value, max_age)
}

fn bounded(s: &str) -> String {
    s.chars().take(MAX_CLAIM_CHARS).collect()
}

#[derive(Deserialize)]
pub struct StartQuery {
    next: Option<String>,
}

/// `GET /admin/sso/start`: sends the browser to the provider.
pub async fn start(
    State(state): State<WebState>,
    origin: Option<Extension<RequestOrigin>>,
    Query(q): Query<StartQuery>,
) -> Result<Response, WebError> {
    let sso = sso(&state)?;
    let origin = origin.map(|Extension(o)| o);
    // Each start stores a row: counted like a password attempt from the same address.
    if let Err(refusal) = signin::admit_provider_sign_in(&state, origin.as_ref()).await {
        return Ok(too_many(super::auth::sign_in_wait(refusal)?));
    }
    let client = sso.client().await?;
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let mut request = client
        .authorize_url(
            CoreAuthenticationFlow::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        )
        .set_pkce_challenge(challenge);
    for scope in &sso.settings.scopes {
        request = request.add_scope(Scope::new(scope.clone()));
    }
    let (url, csrf, nonce) = request.url();
    let flow = db::sso_flows::SsoFlow {
        nonce: nonce.secret().clone(),
        pkce_verifier: verifier.secret().clone(),
        next_url: super::auth::safe_next(q.next.as_deref()),
    };
    db::sso_flows::insert_flow(
        &state.db,
        &sha256_hex(csrf.secret()),
        &flow,
        chrono::Utc::now() + chrono::Duration::minutes(FLOW_MINUTES),
    )
    .await?;
    let mut r = Redirect::to(url.as_str()).into_response();
    r.headers_mut().append(
        header::SET_COOKIE,
        flow_cookie(&state, csrf.secret(), FLOW_MINUTES * 60),
    );
    Ok(r)
}

fn too_many(secs: u64) -> Response {
    let mut r = WebError::TooMany(format!(
        "Too many sign-in attempts. Wait {secs} seconds and try again."
    ))
    .into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

#[derive(Deserialize)]
pub struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    /// RFC 9207: the issuer of this answer, when the provider says (against mix-up attacks).
    iss: Option<String>,
}

/// What the provider says about the person, from the verified ID token (and userinfo).
struct Person {
    issuer: String,
    subject: String,
    preferred_username: Option<String>,
    email: Option<String>,
    role_values: Vec<String>,
}

/// The values of the role claim: a string, or an array of strings (others are ignored).
fn claim_values(claims: &serde_json::Map<String, Value>, name: &str) -> Option<Vec<String>> {
    match claims.get(name)? {
        Value::String(s) => Some(vec![bounded(s)]),
        Value::Array(items) => Some(
            items
                .iter()
                .filter_map(Value::as_str)
                .take(1000)
                .map(bounded)
                .collect(),
        ),
        _ => Some(Vec::new()),
    }
}

/// `GET /admin/sso/callback`: the provider's answer.
pub async fn callback(
    State(state): State<WebState>,
    headers: HeaderMap,
    origin: Option<Extension<RequestOrigin>>,
    Query(q): Query<CallbackQuery>,
) -> Result<Response, WebError> {
    let sso = sso(&state)?;
    let origin = origin.map(|Extension(o)| o);
    let refuse = |who: Option<&str>, why: &str, shown: String| {
        signin::provider_sign_in_refused(&state, origin.as_ref(), who, why);
        let mut r = WebError::Forbidden(shown).into_response();
        r.headers_mut()
            .append(header::SET_COOKIE, flow_cookie(&state, "", 0));
        r
    };
    let from_cookie = session::cookie(&headers, FLOW_COOKIE).unwrap_or("");
    let presented = q.state.as_deref().unwrap_or("");
    let again = "This sign-in did not start in this browser, or took too long. Start again from the sign-in page.";
    if !session::same_token(presented, from_cookie) {
        return Ok(refuse(None, "state mismatch", again.into()));
    }
    let Some(flow) = db::sso_flows::take_flow(&state.db, &sha256_hex(presented)).await? else {
        return Ok(refuse(None, "unknown or expired state", again.into()));
    };
    if q.iss
        .as_deref()
        .is_some_and(|iss| iss != sso.settings.issuer)
    {
        return Ok(refuse(
            None,
            "authorization response from another issuer",
            "This answer came from another provider than the one configured. Start again.".into(),
        ));
    }
    if let Some(error) = &q.error {
        let error = bounded(error);
        return Ok(refuse(
            None,
            &format!("provider error: {error}"),
            format!(
                "{} did not sign you in ({error}).",
                sso.settings.provider_name
            ),
        ));
    }
    let Some(code) = q.code.filter(|c| !c.is_empty() && c.len() <= 4096) else {
        return Err(WebError::BadRequest("The provider sent no code.".into()));
    };
    let person = match verify(sso, code, flow.pkce_verifier, flow.nonce).await {
        Ok(p) => p,
        Err(Refusal::Provider(e)) => {
            tracing::warn!(error = %e, "OpenID Provider sign-in failed");
            return Ok(refuse(
                None,
                "token exchange failed",
                format!(
                    "{} did not complete the sign-in. Start again.",
                    sso.settings.provider_name
                ),
            ));
        }
        Err(Refusal::Token(e)) => {
            tracing::warn!(error = %e, "ID token did not verify");
            sso.forget().await;
            return Ok(refuse(
                None,
                "ID token did not verify",
                "The provider's answer did not verify. Start again.".into(),
            ));
        }
    };
    let shown_name = person
        .preferred_username
        .clone()
        .or_else(|| person.email.clone())
        .unwrap_or_else(|| person.subject.clone());
    let Some(role) = sso.settings.role_for(&person.role_values) else {
        // Taken out of every mapped group: whatever session the account still has ends too.
        let mut tx = state.db.begin().await?;
        db::sessions::end_federated_sessions(&mut tx, &person.issuer, &person.subject).await?;
        tx.commit().await?;
        return Ok(refuse(
            Some(&shown_name),
            "no mapped role",
            format!(
                "Your account at {} ({shown_name}) has no role in toolgate: none of its {} values is mapped to one. Ask an administrator to grant you access.",
                sso.settings.provider_name, sso.settings.role_claim
            ),
        ));
    };
    let candidates = username_candidates(
        person.preferred_username.as_deref(),
        person.email.as_deref(),
        &person.subject,
    );
    let mut tx = state.db.begin().await?;
    let found = db::accounts::sign_in_federated(
        &mut tx,
        &person.issuer,
        &person.subject,
        &candidates,
        role.as_str(),
    )
    .await?;
    tx.commit().await?;
    let (user_id, username) = match found {
        db::accounts::Federated::Account { id, username } => {
            // The provider says which approver sets the person is in, at every sign-in: taken
            // out of a group there, they stop approving here.
            if let Some(sets) = sso.settings.approver_sets_for(&person.role_values) {
                let actor = format!("sso:{}", sso.settings.provider_name);
                let current =
                    crate::db::approvals::approver(&mut *state.db.acquire().await?, &username)
                        .await?
                        .map(|(_, s)| s);
                if current.as_ref() != Some(&sets) {
                    crate::service::approvals::set_approver_sets(&state, &actor, &username, &sets)
                        .await?;
                }
            }
            (id, username)
        }
        db::accounts::Federated::Disabled { username } => {
            return Ok(refuse(
                Some(&username),
                "account disabled",
                "This account is disabled. Ask an administrator.".into(),
            ));
        }
    };
    let session = signin::with_provider(
        &state,
        origin.as_ref(),
        user_id,
        &username,
        state.accounts.session_max,
    )
    .await?;
    let session_cookie = super::auth::session_cookie(&state, &session);
    let mut r = super::view::render(&Continue {
        next: flow.next_url,
    })?;
    r.headers_mut().append(header::SET_COOKIE, session_cookie);
    r.headers_mut()
        .append(header::SET_COOKIE, flow_cookie(&state, "", 0));
    Ok(r)
}

/// A page that moves on to the admin UI by itself. A redirect would do, but the browser counts
/// a redirect chain that began at the provider as cross-site and withholds the `Strict` session
/// cookie from it; this page's own navigation is same-site.
#[derive(Template)]
#[template(path = "admin/sso_continue.html")]
struct Continue {
    next: String,
}

enum Refusal {
    /// The provider could not be reached or refused the code.
    Provider(String),
    /// What came back did not verify.
    Token(String),
}

async fn verify(
    sso: &Sso,
    code: String,
    pkce_verifier: String,
    nonce: String,
) -> Result<Person, Refusal> {
    let client = sso
        .client()
        .await
        .map_err(|e| Refusal::Provider(e.to_string()))?;
    let response = client
        .exchange_code(AuthorizationCode::new(code))
        .map_err(|e| Refusal::Provider(e.to_string()))?
        .set_pkce_verifier(PkceCodeVerifier::new(pkce_verifier))
        .request_async(&sso.http)
        .await
        .map_err(|e| Refusal::Provider(e.to_string()))?;
    let id_token = response
        .id_token()
        .ok_or_else(|| Refusal::Token("the token response has no id_token".into()))?;
    let verifier = client.id_token_verifier();
    // Signature, issuer, audience, expiry and nonce.
    let claims = id_token
        .claims(&verifier, &Nonce::new(nonce))
        .map_err(|e| Refusal::Token(e.to_string()))?;
    if let Some(expected) = claims.access_token_hash() {
        let alg = id_token
            .signing_alg()
            .map_err(|e| Refusal::Token(e.to_string()))?;
        let key = id_token
            .signing_key(&verifier)
            .map_err(|e| Refusal::Token(e.to_string()))?;
        let actual = AccessTokenHash::from_token(response.access_token(), alg, key)
            .map_err(|e| Refusal::Token(e.to_string()))?;
        if actual != *expected {
            return Err(Refusal::Token(
                "at_hash does not match the access token".into(),
            ));
        }
    }
    let mut person = Person {
        issuer: claims.issuer().as_str().to_owned(),
        subject: bounded(claims.subject().as_str()),
        preferred_username: claims.preferred_username().map(|u| bounded(u.as_str())),
        email: claims.email().map(|e| bounded(e.as_str())),
        role_values: Vec::new(),
    };
    let from_token = claim_values(&claims.additional_claims().claims, &sso.settings.role_claim);
    match from_token {
        Some(values) => person.role_values = values,
        // Many providers put scope claims only in userinfo; ask it, for this same subject.
        None if client.user_info_url().is_some() => {
            let info: openidconnect::UserInfoClaims<ExtraClaims, CoreGenderClaim> = client
                .user_info(
                    response.access_token().clone(),
                    Some(claims.subject().clone()),
                )
                .map_err(|e| Refusal::Provider(e.to_string()))?
                .request_async(&sso.http)
                .await
                .map_err(|e| Refusal::Provider(e.to_string()))?;
            person.role_values =
                claim_values(&info.additional_claims().claims, &sso.settings.role_claim)
                    .unwrap_or_default();
            if person.preferred_username.is_none() {
                person.preferred_username = info.preferred_username().map(|u| bounded(u.as_str()));
            }
            if person.email.is_none() {
                person.email = info.email().map(|e| bounded(e.as_str()));
            }
        }
        None => {}
    }
    Ok(person)
}

/// A username from the provider's words, in the account name alphabet (`[A-Za-z0-9_.@-]`,
/// 1-64): other characters become `-`, runs of them one.
pub fn sanitize_username(raw: &str) -> Option<String> {
    let mut out = String::new();
    for c in raw.trim().chars() {
        let c = if crate::names::is_username_char(c) {
            c
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    let out: String = out.trim_matches('-').chars().take(56).collect();
    let out = out.trim_matches('-').to_owned();
    (!out.is_empty()).then_some(out)
}

/// Usernames to try in order: the sanitized preferred_username (else email), then with a
/// number, then one derived from the subject, which another account holds only by chance.
fn username_candidates(preferred: Option<&str>, email: Option<&str>, subject: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(base) = preferred
        .and_then(sanitize_username)
        .or_else(|| email.and_then(sanitize_username))
    {
        out.push(base.clone());
        out.extend((2..=9).map(|n| format!("{base}-{n}")));
    }
    out.push(format!("sso-{}", &sha256_hex(subject)[..16]));
    out.push(format!("sso-{}", &random_token()[..16]));
    out
}

/// Whether the `Sign in with` button and the password form are shown.
pub struct LoginOptions {
    pub provider: Option<String>,
    pub password: bool,
}

pub fn login_options(state: &WebState) -> LoginOptions {
    LoginOptions {
        provider: state.sso.as_ref().map(|s| s.settings.provider_name.clone()),
        password: state.accounts.password_sign_in,
    }
}

#[cfg(test)]
mod tests {
    use super::{Role, SsoSettings, sanitize_username};

    fn settings(map: &[&str]) -> SsoSettings {
        use clap::Parser;
        let mut args = vec![
            "toolgate",
            "serve",
            "--oidc-issuer",
            "https://id.example.com/realms/acme/",
            "--oidc-client-id",
            "toolgate",
        ];
        for m in map {
            args.extend(["--oidc-role-map", m]);
        }
        let crate::config::Command::Serve(serve) =
            crate::config::Cli::try_parse_from(args).unwrap().command
        else {
            unreachable!()
        };
        SsoSettings::from_args(&serve.oidc, "https://gate.example.com")
            .unwrap()
            .unwrap()
    }

    #[test]
    fn the_most_privileged_mapped_role_wins_and_no_match_is_no_role() {
        let s = settings(&["staff=viewer", "ops=admin", "audit=auditor", "bots=member"]);
        let v = |xs: &[&str]| xs.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(s.role_for(&v(&["staff", "ops"])), Some(Role::Admin));
        assert_eq!(s.role_for(&v(&["audit", "staff"])), Some(Role::Auditor));
        assert_eq!(s.role_for(&v(&["bots"])), Some(Role::Member));
        assert_eq!(
            s.role_for(&v(&["Ops", "staff "])),
            None,
            "values match exactly"
        );
        assert_eq!(s.role_for(&[]), None);
        assert_eq!(
            s.redirect_url,
            "https://gate.example.com/admin/sso/callback"
        );
        assert_eq!(
            s.issuer, "https://id.example.com/realms/acme/",
            "kept as given"
        );
        assert_eq!(s.provider_name, "id.example.com");
    }

    #[test]
    fn the_client_secret_stays_out_of_debug_output() {
        let mut s = settings(&["a=admin"]);
        s.client_secret = Some("hunter2-secret".into());
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[test]
    fn provider_usernames_are_sanitized_into_the_account_alphabet() {
        assert_eq!(sanitize_username("alice").as_deref(), Some("alice"));
        assert_eq!(
            sanitize_username("<script>alert(1)</script> eve").as_deref(),
            Some("script-alert-1-script-eve")
        );
        assert_eq!(sanitize_username("José Ñ").as_deref(), Some("Jos"));
        assert_eq!(sanitize_username("  ").as_deref(), None);
        assert_eq!(sanitize_username("ü").as_deref(), None);
        assert!(sanitize_username(&"x".repeat(500)).unwrap().len() <= 56);
    }
}
