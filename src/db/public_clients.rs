//! Public OAuth clients (interactive hosts) registered by an admin.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::authorizations::revoke;
use super::record_change;
use crate::audit::AdminAction;

/// A public client an admin registered.
#[derive(Debug, Clone, Serialize)]
pub struct PublicClient {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

pub async fn public_client_by_id(
    pool: &PgPool,
    client_id: &str,
) -> sqlx::Result<Option<PublicClient>> {
    sqlx::query_as!(
        PublicClient,
        "SELECT client_id, client_name, redirect_uris, created_by, created_at
         FROM oauth_public_clients WHERE client_id = $1",
        client_id,
    )
    .fetch_optional(pool)
    .await
}

pub async fn public_clients(pool: &PgPool) -> sqlx::Result<Vec<PublicClient>> {
    sqlx::query_as!(
        PublicClient,
        "SELECT client_id, client_name, redirect_uris, created_by, created_at
         FROM oauth_public_clients ORDER BY client_id"
    )
    .fetch_all(pool)
    .await
}

/// Registers (or replaces) a public client.
pub async fn put_public_client(
    conn: &mut PgConnection,
    actor: &str,
    client_id: &str,
    client_name: &str,
    redirect_uris: &[String],
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO oauth_public_clients (client_id, client_name, redirect_uris, created_by)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (client_id) DO UPDATE SET client_name = $2, redirect_uris = $3",
        client_id,
        client_name,
        redirect_uris,
        actor,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::PublicClientPut,
        &format!("public_client:{client_id}"),
        None,
        Some(json!({"client_id": client_id, "client_name": client_name, "redirect_uris": redirect_uris})),
    )
    .await
}

pub async fn delete_public_client(
    conn: &mut PgConnection,
    actor: &str,
    client_id: &str,
) -> sqlx::Result<bool> {
    let gone = sqlx::query!(
        "DELETE FROM oauth_public_clients WHERE client_id = $1",
        client_id,
    )
    .execute(&mut *conn)
    .await?;
    if gone.rows_affected() == 0 {
        return Ok(false);
    }
    record_change(
        conn,
        actor,
        AdminAction::PublicClientDelete,
        &format!("public_client:{client_id}"),
        Some(json!({"client_id": client_id})),
        None,
    )
    .await?;
    // Its consents go with it: the host can no longer be told apart from an impostor.
    let ids: Vec<Uuid> = sqlx::query_scalar!(
        "SELECT id FROM oauth_authorizations WHERE client_id = $1 AND revoked_at IS NULL",
        client_id,
    )
    .fetch_all(&mut *conn)
    .await?;
    for id in ids {
        revoke(conn, actor, id, None, "the client was deleted").await?;
    }
    Ok(true)
}
