//! Stored credentials: sealed values per slot and owner. Values are never read back out of
//! this module except sealed; only `credentials` opens them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgConnection;

use crate::audit::AdminAction;
use crate::credentials::{Per, Sealed, SlotKey};

/// What may be shown of a stored credential: never its value.
#[derive(Debug, Clone, Serialize)]
pub struct CredentialInfo {
    pub per: String,
    pub owner: String,
    pub group: String,
    pub name: String,
    pub kek_id: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// A stored row as the store holds it: its slot and its sealed value.
#[derive(sqlx::FromRow)]
struct SealedRow {
    owner_kind: String,
    owner: String,
    group_name: String,
    name: String,
    kek_id: String,
    wrapped_key: Vec<u8>,
    ciphertext: Vec<u8>,
}

impl SealedRow {
    /// `None` for an owner kind this version does not know.
    fn split(self) -> Option<(SlotKey, Sealed)> {
        Some((
            SlotKey {
                per: Per::parse(&self.owner_kind)?,
                owner: self.owner,
                group: self.group_name,
                name: self.name,
            },
            Sealed {
                kek_id: self.kek_id,
                wrapped_key: self.wrapped_key,
                ciphertext: self.ciphertext,
            },
        ))
    }
}

/// Every sealed credential, for the in-memory store.
pub async fn load_sealed(conn: &mut PgConnection) -> sqlx::Result<HashMap<SlotKey, Sealed>> {
    let rows = sqlx::query_as!(
        SealedRow,
        "SELECT owner_kind, owner, group_name, name, kek_id, wrapped_key, ciphertext FROM credentials"
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().filter_map(SealedRow::split).collect())
}

pub fn resource(slot: &SlotKey) -> String {
    match slot.per {
        Per::Shared => format!("credential:shared/{}/{}", slot.group, slot.name),
        per => format!(
            "credential:{}:{}/{}/{}",
            per.as_str(),
            slot.owner,
            slot.group,
            slot.name
        ),
    }
}

/// Stores `sealed` for `slot`, on record by name (never the value) as `action`
/// (`credential.set`, or `credential.connected` for a grant from an authorization server);
/// `refresh_at` is when a grant is due for refresh (`None` for any other value).
pub async fn put(
    conn: &mut PgConnection,
    actor: &str,
    action: AdminAction,
    slot: &SlotKey,
    sealed: &Sealed,
    refresh_at: Option<DateTime<Utc>>,
) -> sqlx::Result<()> {
    let replaced = sqlx::query_scalar!(
        r#"INSERT INTO credentials (owner_kind, owner, group_name, name, kek_id, wrapped_key, ciphertext, created_by, refresh_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (owner_kind, owner, group_name, name) DO UPDATE
             SET kek_id = EXCLUDED.kek_id, wrapped_key = EXCLUDED.wrapped_key,
                 ciphertext = EXCLUDED.ciphertext, created_by = EXCLUDED.created_by,
                 refresh_at = EXCLUDED.refresh_at, updated_at = now()
         RETURNING (xmax <> 0) AS "replaced!""#,
        slot.per.as_str(),
        slot.owner,
        slot.group,
        slot.name,
        sealed.kek_id,
        sealed.wrapped_key,
        sealed.ciphertext,
        actor,
        refresh_at,
    )
    .fetch_one(&mut *conn)
    .await?;
    let shown = json!({"per": slot.per, "owner": slot.owner, "group": slot.group, "name": slot.name, "value": "[stored]"});
    crate::db::record_change(
        conn,
        actor,
        action,
        &resource(slot),
        replaced.then(|| shown.clone()),
        Some(shown),
    )
    .await
}

/// Grants due for refresh, locked for this transaction; rows another instance is refreshing
/// are skipped (it holds their lock), so a refresh token is spent once.
pub async fn take_due(conn: &mut PgConnection, limit: i64) -> sqlx::Result<Vec<(SlotKey, Sealed)>> {
    let rows = sqlx::query_as!(
        SealedRow,
        "SELECT owner_kind, owner, group_name, name, kek_id, wrapped_key, ciphertext
         FROM credentials WHERE refresh_at <= now()
         ORDER BY refresh_at LIMIT $1 FOR UPDATE SKIP LOCKED",
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().filter_map(SealedRow::split).collect())
}

/// After a refresh attempt: the new sealed grant (if any) and when it is next due, on record
/// as `action` (`credential.refreshed` or `credential.refresh_failed`) with `detail`.
pub async fn refreshed(
    conn: &mut PgConnection,
    action: AdminAction,
    slot: &SlotKey,
    sealed: Option<&Sealed>,
    refresh_at: Option<DateTime<Utc>>,
    detail: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE credentials SET refresh_at = $5,
             kek_id = COALESCE($6, kek_id), wrapped_key = COALESCE($7, wrapped_key),
             ciphertext = COALESCE($8, ciphertext), updated_at = now()
         WHERE owner_kind = $1 AND owner = $2 AND group_name = $3 AND name = $4",
        slot.per.as_str(),
        slot.owner,
        slot.group,
        slot.name,
        refresh_at,
        sealed.map(|s| s.kek_id.as_str()),
        sealed.map(|s| s.wrapped_key.as_slice()),
        sealed.map(|s| s.ciphertext.as_slice()),
    )
    .execute(&mut *conn)
    .await?;
    let mut shown =
        json!({"per": slot.per, "owner": slot.owner, "group": slot.group, "name": slot.name});
    if let Some(d) = detail {
        shown["detail"] = json!(d);
    }
    crate::db::record_change(conn, REFRESHER, action, &resource(slot), None, Some(shown)).await
}

/// Who refreshes grants, as the audit chain names it.
pub const REFRESHER: &str = "toolgate (credential refresh)";
/// Who exchanges callers' identities for upstream tokens, as the audit chain names it.
pub const EXCHANGER: &str = "toolgate (token exchange)";

/// Postpones a grant whose refresh failed for a reason that may pass (the server was down).
pub async fn postpone(
    conn: &mut PgConnection,
    slot: &SlotKey,
    to: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE credentials SET refresh_at = $5
         WHERE owner_kind = $1 AND owner = $2 AND group_name = $3 AND name = $4",
        slot.per.as_str(),
        slot.owner,
        slot.group,
        slot.name,
        to,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A connection sent to an upstream's authorization server, waiting for its callback.
#[derive(Debug, Clone)]
pub struct ConnectFlow {
    pub username: String,
    pub group_name: String,
    pub name: String,
    pub pkce_verifier: String,
    pub token_endpoint: String,
    pub resource: String,
}

/// Stores a flow under the hash of its `state`, and drops expired ones while at it.
pub async fn insert_flow(
    conn: &mut PgConnection,
    state_sha256: &str,
    flow: &ConnectFlow,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM credential_connect_flows WHERE expires_at < now()")
        .execute(&mut *conn)
        .await?;
    sqlx::query!(
        "INSERT INTO credential_connect_flows
             (state_sha256, username, group_name, name, pkce_verifier, token_endpoint, resource, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        state_sha256,
        flow.username,
        flow.group_name,
        flow.name,
        flow.pkce_verifier,
        flow.token_endpoint,
        flow.resource,
        expires_at,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Takes a live flow out (a callback is answered once).
pub async fn take_flow(
    conn: &mut PgConnection,
    state_sha256: &str,
) -> sqlx::Result<Option<ConnectFlow>> {
    sqlx::query_as!(
        ConnectFlow,
        "DELETE FROM credential_connect_flows
         WHERE state_sha256 = $1 AND expires_at > now()
         RETURNING username, group_name, name, pkce_verifier, token_endpoint, resource",
        state_sha256,
    )
    .fetch_optional(conn)
    .await
}

/// Deletes the value of `slot`; `false` when there was none.
pub async fn delete(conn: &mut PgConnection, actor: &str, slot: &SlotKey) -> sqlx::Result<bool> {
    let gone = sqlx::query!(
        "DELETE FROM credentials WHERE owner_kind = $1 AND owner = $2 AND group_name = $3 AND name = $4",
        slot.per.as_str(),
        slot.owner,
        slot.group,
        slot.name,
    )
    .execute(&mut *conn)
    .await?
    .rows_affected()
        > 0;
    if gone {
        crate::db::record_change(
            conn,
            actor,
            AdminAction::CredentialDelete,
            &resource(slot),
            Some(json!({"per": slot.per, "owner": slot.owner, "group": slot.group, "name": slot.name})),
            None,
        )
        .await?;
    }
    Ok(gone)
}

/// The credentials of one owner (`per`, `owner`), names and dates only.
pub async fn list(
    conn: &mut PgConnection,
    per: Per,
    owner: &str,
) -> sqlx::Result<Vec<CredentialInfo>> {
    sqlx::query_as!(
        CredentialInfo,
        r#"SELECT owner_kind AS per, owner, group_name AS "group", name, kek_id, created_by,
                  created_at, updated_at, last_used_at
           FROM credentials WHERE owner_kind = $1 AND owner = $2
           ORDER BY group_name, name"#,
        per.as_str(),
        owner,
    )
    .fetch_all(conn)
    .await
}

/// Notes that these slots' values were used now.
pub async fn touch(conn: &mut PgConnection, slots: &[SlotKey]) -> sqlx::Result<()> {
    for slot in slots {
        sqlx::query!(
            "UPDATE credentials SET last_used_at = now()
             WHERE owner_kind = $1 AND owner = $2 AND group_name = $3 AND name = $4",
            slot.per.as_str(),
            slot.owner,
            slot.group,
            slot.name,
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Replaces the wrapping of one value, if it is still `from` (a value set meanwhile is left
/// as it is); `true` when replaced.
pub async fn rewrap(
    conn: &mut PgConnection,
    slot: &SlotKey,
    from: &Sealed,
    to: &Sealed,
) -> sqlx::Result<bool> {
    Ok(sqlx::query!(
        "UPDATE credentials SET kek_id = $5, wrapped_key = $6
         WHERE owner_kind = $1 AND owner = $2 AND group_name = $3 AND name = $4
           AND kek_id = $7 AND wrapped_key = $8 AND ciphertext = $9",
        slot.per.as_str(),
        slot.owner,
        slot.group,
        slot.name,
        to.kek_id,
        to.wrapped_key,
        from.kek_id,
        from.wrapped_key,
        from.ciphertext,
    )
    .execute(conn)
    .await?
    .rows_affected()
        > 0)
}
