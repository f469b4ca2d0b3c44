//! Public OAuth clients (interactive hosts) registered by an admin.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::authorizations::revoke;
use super::record_change;
use crate::audit::AdminAction;

/// A public client: one an admin registered, or one a host registered itself (`dynamic`).
#[derive(Debug, Clone, Serialize)]
pub struct PublicClient {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    /// `admin` or `dynamic`.
    pub registration: String,
    /// `active`, or `held` until an admin approves a dynamic registration.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approved_at: Option<DateTime<Utc>>,
    /// A dynamic client never approved, or approved and never used, is deleted after this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

impl PublicClient {
    pub fn is_held(&self) -> bool {
        self.status == "held"
    }

    pub fn is_dynamic(&self) -> bool {
        self.registration == "dynamic"
    }
}

pub async fn public_client_by_id(
    pool: &PgPool,
    client_id: &str,
) -> sqlx::Result<Option<PublicClient>> {
    public_client_by_id_in(&mut *pool.acquire().await?, client_id).await
}

/// The same, inside a transaction.
pub async fn public_client_by_id_in(
    conn: &mut PgConnection,
    client_id: &str,
) -> sqlx::Result<Option<PublicClient>> {
    sqlx::query_as!(
        PublicClient,
        "SELECT client_id, client_name, redirect_uris, created_by, created_at, registration,
                status, registered_from, approved_by, approved_at, expires_at
         FROM oauth_public_clients WHERE client_id = $1",
        client_id,
    )
    .fetch_optional(&mut *conn)
    .await
}

pub async fn public_clients(pool: &PgPool) -> sqlx::Result<Vec<PublicClient>> {
    sqlx::query_as!(
        PublicClient,
        "SELECT client_id, client_name, redirect_uris, created_by, created_at, registration,
                status, registered_from, approved_by, approved_at, expires_at
         FROM oauth_public_clients ORDER BY status = 'active', created_at DESC, client_id"
    )
    .fetch_all(pool)
    .await
}

/// Registers (or replaces) a public client. An admin putting a client a host registered
/// vouches for it: it becomes an admin's client, active, with no expiry.
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
         ON CONFLICT (client_id) DO UPDATE SET client_name = $2, redirect_uris = $3,
             registration = 'admin', status = 'active', expires_at = NULL",
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

/// A host's own registration (RFC 7591), `held` unless `active` is asked for.
pub struct NewDynamic<'a> {
    pub client_id: &'a str,
    pub client_name: &'a str,
    pub redirect_uris: &'a [String],
    pub registered_from: Option<&'a str>,
    pub held: bool,
    pub expires_at: DateTime<Utc>,
}

pub async fn register_dynamic(conn: &mut PgConnection, new: &NewDynamic<'_>) -> sqlx::Result<()> {
    let status = if new.held { "held" } else { "active" };
    sqlx::query!(
        "INSERT INTO oauth_public_clients
             (client_id, client_name, redirect_uris, created_by, registration, status,
              registered_from, expires_at)
         VALUES ($1, $2, $3, 'oauth:register', 'dynamic', $4, $5, $6)",
        new.client_id,
        new.client_name,
        new.redirect_uris,
        status,
        new.registered_from,
        new.expires_at,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        "oauth:register",
        AdminAction::PublicClientRegister,
        &format!("public_client:{}", new.client_id),
        None,
        Some(json!({
            "client_id": new.client_id,
            "client_name": new.client_name,
            "redirect_uris": new.redirect_uris,
            "status": status,
            "registered_from": new.registered_from,
            "expires_at": new.expires_at,
        })),
    )
    .await
}

/// Dynamic registrations no person has authorized yet (held, or approved and unused).
pub async fn unused_dynamic_count(conn: &mut PgConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM oauth_public_clients c
           WHERE c.registration = 'dynamic'
             AND NOT EXISTS (SELECT 1 FROM oauth_authorizations a WHERE a.client_id = c.client_id)"#
    )
    .fetch_one(&mut *conn)
    .await
}

/// Approves a held registration; `false` when there is no such held client.
pub async fn approve(
    conn: &mut PgConnection,
    actor: &str,
    client_id: &str,
    unused_until: DateTime<Utc>,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE oauth_public_clients
         SET status = 'active', approved_by = $2, approved_at = now(), expires_at = $3
         WHERE client_id = $1 AND status = 'held'",
        client_id,
        actor,
        unused_until,
    )
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(false);
    }
    record_change(
        conn,
        actor,
        AdminAction::PublicClientApprove,
        &format!("public_client:{client_id}"),
        Some(json!({"client_id": client_id, "status": "held"})),
        Some(json!({"client_id": client_id, "status": "active", "expires_at": unused_until})),
    )
    .await?;
    Ok(true)
}

/// Deletes the dynamic clients past their expiry that no person ever authorized, each on
/// record. Returns how many went.
pub async fn delete_expired(conn: &mut PgConnection) -> sqlx::Result<usize> {
    let gone = sqlx::query!(
        "DELETE FROM oauth_public_clients c
         WHERE c.registration = 'dynamic' AND c.expires_at < now()
           AND NOT EXISTS (SELECT 1 FROM oauth_authorizations a WHERE a.client_id = c.client_id)
         RETURNING c.client_id, c.status",
    )
    .fetch_all(&mut *conn)
    .await?;
    for row in &gone {
        let (client_id, status) = (&row.client_id, &row.status);
        record_change(
            conn,
            "oauth:register",
            AdminAction::PublicClientDelete,
            &format!("public_client:{client_id}"),
            Some(json!({"client_id": client_id, "status": status, "reason": "expired unused"})),
            None,
        )
        .await?;
    }
    Ok(gone.len())
}
