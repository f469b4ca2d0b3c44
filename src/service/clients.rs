//! OAuth clients: agents' confidential clients and the public clients of interactive hosts.

use serde::Serialize;
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
