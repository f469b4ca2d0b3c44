//! OAuth clients: agents' confidential clients and the public clients of interactive hosts.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Plane, Result, ServiceError};
use crate::auth::secrets;
use crate::db;
use crate::policy::snapshot::Parts;

/// A client's credentials, shown once.
#[derive(Debug, Serialize)]
pub struct NewClient {
    pub client_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    pub agent: String,
}

/// Creates an OAuth client: with a secret, or with public keys for private_key_jwt.
pub async fn create<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    agent: &str,
    description: &str,
    jwks: Option<Value>,
) -> Result<NewClient> {
    if let Some(j) = &jwks {
        serde_json::from_value::<jsonwebtoken::jwk::JwkSet>(j.clone())
            .map_err(|e| ServiceError::Invalid(format!("jwks is not a JWK set: {e}")))?;
    }
    let (client_id, secret) = secrets::new_client_credentials();
    let secret = if jwks.is_some() { None } else { Some(secret) };
    let hash = match &secret {
        Some(s) => {
            let s = s.clone();
            Some(
                tokio::task::spawn_blocking(move || secrets::hash(&s))
                    .await
                    .map_err(anyhow::Error::from)??,
            )
        }
        None => None,
    };
    let on = on.into();
    let mut tx = on.db().begin().await?;
    if !db::clients::create_client(
        &mut tx,
        actor,
        agent,
        &client_id,
        hash.as_deref(),
        jwks.as_ref(),
        description,
    )
    .await?
    {
        return Err(ServiceError::NotFound(format!("agent `{agent}`")));
    }
    tx.commit().await?;
    // The agents too: the client's first token takes its agent's grants from this snapshot,
    // and the agent may have been made a moment ago through another instance.
    on.refresh(Parts::of_table("oauth_clients") | Parts::AGENTS)
        .await;
    Ok(NewClient {
        client_id,
        client_secret: secret,
        agent: agent.to_owned(),
    })
}

pub async fn delete<'a>(on: impl Into<Plane<'a>>, actor: &str, client_id: &str) -> Result<()> {
    let on = on.into();
    let mut tx = on.db().begin().await?;
    if !db::clients::delete_client(&mut tx, actor, client_id).await? {
        return Err(ServiceError::NotFound(format!("client `{client_id}`")));
    }
    tx.commit().await?;
    on.refresh(Parts::of_table("oauth_clients")).await;
    Ok(())
}

/// Registers (or replaces) a public client for hosts without a metadata document.
pub async fn put_public<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    client_id: &str,
    client_name: &str,
    redirect_uris: &[String],
) -> Result<()> {
    if client_id.is_empty()
        || client_id.len() > 128
        || !client_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
        || crate::auth::cimd::is_url_client_id(client_id)
    {
        return Err(ServiceError::Invalid(format!(
            "client id `{client_id}` must be 1-128 letters, digits, `_`, `.`, `:` or `-` (and not a URL: URL client ids are metadata documents)"
        )));
    }
    let name = client_name.trim();
    if name.is_empty() || name.chars().count() > 200 || name.chars().any(char::is_control) {
        return Err(ServiceError::Invalid(
            "client_name must be 1-200 characters without control characters".into(),
        ));
    }
    if redirect_uris.is_empty() || redirect_uris.len() > 20 {
        return Err(ServiceError::Invalid(
            "redirect_uris must list 1 to 20 URLs".into(),
        ));
    }
    for u in redirect_uris {
        crate::auth::redirect::check_registered_redirect(u).map_err(ServiceError::Invalid)?;
    }
    let on = on.into();
    let mut tx = on.db().begin().await?;
    db::public_clients::put_public_client(&mut tx, actor, client_id, name, redirect_uris).await?;
    tx.commit().await?;
    on.refresh(Parts::of_table("oauth_clients")).await;
    Ok(())
}

pub async fn delete_public<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    client_id: &str,
) -> Result<()> {
    let on = on.into();
    let mut tx = on.db().begin().await?;
    if !db::public_clients::delete_public_client(&mut tx, actor, client_id).await? {
        return Err(ServiceError::NotFound(format!(
            "public client `{client_id}`"
        )));
    }
    tx.commit().await?;
    on.refresh(Parts::of_table("oauth_clients")).await;
    Ok(())
}

/// Confidential clients, of one agent or all.
pub async fn list<'a>(
    on: impl Into<Plane<'a>>,
    agent: Option<&str>,
) -> Result<Vec<db::clients::ClientSummary>> {
    Ok(db::clients::clients(on.into().db(), agent).await?)
}

/// Public clients registered for hosts without a metadata document.
pub async fn list_public<'a>(
    on: impl Into<Plane<'a>>,
) -> Result<Vec<db::public_clients::PublicClient>> {
    Ok(db::public_clients::public_clients(on.into().db()).await?)
}

/// How long a held registration waits for an admin's approval before it is deleted.
pub const HELD_FOR: chrono::TimeDelta = chrono::TimeDelta::hours(24);
/// How long an approved (or `open`) registration may go without anyone signing in through it
/// before it is deleted.
pub const UNUSED_FOR: chrono::TimeDelta = chrono::TimeDelta::days(7);
/// Dynamic registrations nobody has signed in through yet, at most: however many addresses
/// strangers have, the table and the admin's queue stay this small.
pub const MAX_UNUSED_REGISTRATIONS: i64 = 200;
/// Redirect URIs one registration may list (a host needs one, sometimes two).
pub const MAX_REGISTERED_REDIRECTS: usize = 5;
/// The name a host that gives none is shown under.
const UNNAMED: &str = "Unnamed application";

/// A host's registration request (RFC 7591 §2). Fields this server does not use (`client_uri`,
/// `logo_uri`, `software_id`, ...) are ignored: none is shown to anyone, so none can mislead.
#[derive(Debug, Default, Deserialize)]
pub struct RegistrationRequest {
    #[serde(default)]
    pub redirect_uris: Vec<String>,
    pub client_name: Option<String>,
    pub grant_types: Option<Vec<String>>,
    pub response_types: Option<Vec<String>>,
    pub token_endpoint_auth_method: Option<String>,
}

/// Why a registration was refused, in RFC 7591 §3.2.2's terms.
#[derive(Debug)]
pub enum RegistrationError {
    /// `invalid_redirect_uri`.
    RedirectUri(String),
    /// `invalid_client_metadata`.
    Metadata(String),
    /// Too many registrations wait for their first use: try later.
    Full,
    Failed(ServiceError),
}

impl<E: Into<ServiceError>> From<E> for RegistrationError {
    fn from(e: E) -> Self {
        Self::Failed(e.into())
    }
}

/// Characters that let a name read as another on the consent page: controls, zero-width
/// characters and bidirectional overrides ("Claude" spelt backwards behind U+202E).
fn misleads(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

/// Registers a host that registered itself: a public client (PKCE, no secret), `held` until an
/// admin approves it unless the server runs with `--oauth-registration open`. Expired unused
/// registrations are cleared first, so the cap counts only live ones.
pub async fn register<'a>(
    on: impl Into<Plane<'a>>,
    request: &RegistrationRequest,
    source: Option<IpAddr>,
    held: bool,
) -> std::result::Result<db::public_clients::PublicClient, RegistrationError> {
    let metadata = RegistrationError::Metadata;
    if request.redirect_uris.is_empty() {
        return Err(RegistrationError::RedirectUri(
            "redirect_uris must list at least one URL".into(),
        ));
    }
    if request.redirect_uris.len() > MAX_REGISTERED_REDIRECTS {
        return Err(RegistrationError::RedirectUri(format!(
            "redirect_uris may list at most {MAX_REGISTERED_REDIRECTS} URLs"
        )));
    }
    for u in &request.redirect_uris {
        crate::auth::redirect::check_registered_redirect(u)
            .map_err(RegistrationError::RedirectUri)?;
    }
    match request.token_endpoint_auth_method.as_deref() {
        None | Some("none") => {}
        Some(_) => {
            return Err(metadata(
                "token_endpoint_auth_method must be `none`: hosts register as public clients that prove themselves with PKCE; agents' confidential clients are made by an admin".into(),
            ));
        }
    }
    if let Some(grants) = &request.grant_types
        && let Some(g) = grants
            .iter()
            .find(|g| !matches!(g.as_str(), "authorization_code" | "refresh_token"))
    {
        return Err(metadata(format!(
            "grant_types may hold only authorization_code and refresh_token, not `{g}`"
        )));
    }
    if let Some(types) = &request.response_types
        && types.iter().any(|t| t != "code")
    {
        return Err(metadata("response_types may hold only `code`".into()));
    }
    let name = match request.client_name.as_deref().map(str::trim) {
        None | Some("") => UNNAMED.to_owned(),
        Some(n) if n.chars().count() > 200 || n.chars().any(misleads) => {
            return Err(metadata(
                "client_name must be at most 200 characters, without control, zero-width or direction-changing characters".into(),
            ));
        }
        Some(n) => n.to_owned(),
    };
    let client_id = format!("dyn-{}", &crate::auth::secrets::random_token()[..22]);
    let source = source.map(|ip| ip.to_string());
    let now = chrono::Utc::now();
    let on = on.into();
    let mut tx = on.db().begin().await?;
    db::public_clients::delete_expired(&mut tx).await?;
    if db::public_clients::unused_dynamic_count(&mut tx).await? >= MAX_UNUSED_REGISTRATIONS {
        return Err(RegistrationError::Full);
    }
    db::public_clients::register_dynamic(
        &mut tx,
        &db::public_clients::NewDynamic {
            client_id: &client_id,
            client_name: &name,
            redirect_uris: &request.redirect_uris,
            registered_from: source.as_deref(),
            held,
            expires_at: now + if held { HELD_FOR } else { UNUSED_FOR },
        },
    )
    .await?;
    let client = db::public_clients::public_client_by_id_in(&mut tx, &client_id)
        .await?
        .ok_or_else(|| ServiceError::NotFound(format!("public client `{client_id}`")))?;
    tx.commit().await?;
    Ok(client)
}

/// Approves a held registration: hosts may now sign people in through it. It is deleted if
/// nobody does within [`UNUSED_FOR`].
pub async fn approve_public<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    client_id: &str,
) -> Result<()> {
    let on = on.into();
    let mut tx = on.db().begin().await?;
    if !db::public_clients::approve(&mut tx, actor, client_id, chrono::Utc::now() + UNUSED_FOR)
        .await?
    {
        return Err(ServiceError::NotFound(format!(
            "held registration `{client_id}`"
        )));
    }
    tx.commit().await?;
    Ok(())
}
