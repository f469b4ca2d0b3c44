//! Consents (authorizations) of people to interactive hosts, with their codes and refresh
//! tokens.
//!
//! Codes and refresh tokens are stored as sha256 only: a copy of the database is not a set
//! of working credentials.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::record_change;
use crate::audit::AdminAction;
use crate::policy::snapshot::LiveAuthorization;

/// Authorizations that are neither revoked nor past their last refresh token.
pub async fn live(conn: &mut PgConnection) -> sqlx::Result<Vec<LiveAuthorization>> {
    sqlx::query_as!(
        LiveAuthorization,
        "SELECT z.id, z.client_id, a.name AS agent, z.username FROM oauth_authorizations z
         JOIN agents a ON a.id = z.agent_id
         WHERE z.revoked_at IS NULL AND z.expires_at > now()"
    )
    .fetch_all(&mut *conn)
    .await
}

/// A consent, as its person and the admins see it.
#[derive(Debug, Clone, Serialize)]
pub struct AuthorizationSummary {
    pub id: Uuid,
    pub client_id: String,
    pub client_name: String,
    pub agent: String,
    pub username: String,
    pub scope: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revoked_by: Option<String>,
}

/// Authorizations, newest first: of one person, or everyone's.
pub async fn list(
    pool: &PgPool,
    username: Option<&str>,
) -> sqlx::Result<Vec<AuthorizationSummary>> {
    sqlx::query_as!(
        AuthorizationSummary,
        "SELECT z.id, z.client_id, z.client_name, a.name AS agent, z.username, z.scope,
                z.created_at, z.expires_at, z.revoked_at, z.revoked_by
         FROM oauth_authorizations z JOIN agents a ON a.id = z.agent_id
         WHERE ($1::text IS NULL OR z.username = $1)
         ORDER BY z.created_at DESC LIMIT 500",
        username,
    )
    .fetch_all(pool)
    .await
}

/// What a person consented to, and the code that carries it to the host.
pub struct NewAuthorization<'a> {
    pub id: Uuid,
    pub client_id: &'a str,
    pub client_name: &'a str,
    pub agent: &'a str,
    pub username: &'a str,
    pub scope: &'a str,
    pub code_hash: &'a str,
    pub redirect_uri: &'a str,
    pub code_challenge: &'a str,
    pub resource: &'a str,
    pub code_expires: DateTime<Utc>,
}

/// Records a consent and its code; `false` if the agent does not exist or the person may no
/// longer act as it (checked here, in the transaction, not only on the page).
pub async fn create(
    conn: &mut PgConnection,
    actor: &str,
    n: &NewAuthorization<'_>,
) -> sqlx::Result<bool> {
    let inserted = sqlx::query!(
        "INSERT INTO oauth_authorizations (id, client_id, client_name, agent_id, username, scope, expires_at)
         SELECT $1, $2, $3, a.id, $5, $6, $7 FROM agents a
         JOIN agent_users u ON u.agent_id = a.id AND u.username = $5
         WHERE a.name = $4",
        n.id,
        n.client_id,
        n.client_name,
        n.agent,
        n.username,
        n.scope,
        // Until the code is exchanged for the first refresh token.
        n.code_expires,
    )
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(false);
    }
    sqlx::query!(
        "INSERT INTO oauth_codes (code_hash, authorization_id, client_id, redirect_uri, code_challenge, resource, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        n.code_hash,
        n.id,
        n.client_id,
        n.redirect_uri,
        n.code_challenge,
        n.resource,
        n.code_expires,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::AuthorizationCreate,
        &format!("authorization:{}", n.id),
        None,
        Some(
            json!({"client_id": n.client_id, "client_name": n.client_name, "agent": n.agent,
            "username": n.username, "scope": n.scope}),
        ),
    )
    .await?;
    Ok(true)
}

/// A code, once taken.
#[derive(Debug)]
pub struct TakenCode {
    pub authorization_id: Uuid,
    pub client_id: String,
    pub redirect_uri: String,
    pub code_challenge: String,
    pub resource: String,
    pub agent: String,
    pub username: String,
    pub scope: String,
}

/// How taking a code or a refresh token went.
#[derive(Debug)]
pub enum Taken<T> {
    Ok(T),
    /// Unknown, expired, or its authorization revoked.
    Invalid,
    /// Already used: presented again, by the host or by whoever stole it.
    Replayed(Uuid),
}

/// Marks a code used, once: concurrent exchanges of one code see one winner.
pub async fn take_code(conn: &mut PgConnection, code_hash: &str) -> sqlx::Result<Taken<TakenCode>> {
    let taken = sqlx::query_as!(
        TakenCode,
        "UPDATE oauth_codes c SET used_at = now()
         FROM oauth_authorizations z JOIN agents a ON a.id = z.agent_id
         WHERE c.code_hash = $1 AND c.used_at IS NULL AND c.expires_at > now()
           AND z.id = c.authorization_id AND z.revoked_at IS NULL
         RETURNING c.authorization_id, c.client_id, c.redirect_uri, c.code_challenge, c.resource,
                   a.name AS agent, z.username, z.scope",
        code_hash,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(taken) = taken {
        return Ok(Taken::Ok(taken));
    }
    let used: Option<Uuid> = sqlx::query_scalar!(
        "SELECT authorization_id FROM oauth_codes WHERE code_hash = $1 AND used_at IS NOT NULL",
        code_hash,
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(used.map_or(Taken::Invalid, Taken::Replayed))
}

/// A refresh token's authorization, once taken.
#[derive(Debug)]
pub struct TakenRefresh {
    pub authorization_id: Uuid,
    pub client_id: String,
    pub agent: String,
    pub username: String,
    pub scope: String,
}

/// Marks a refresh token used, once.
pub async fn take_refresh(
    conn: &mut PgConnection,
    token_hash: &str,
) -> sqlx::Result<Taken<TakenRefresh>> {
    let taken = sqlx::query_as!(
        TakenRefresh,
        "UPDATE oauth_refresh_tokens t SET used_at = now()
         FROM oauth_authorizations z JOIN agents a ON a.id = z.agent_id
         WHERE t.token_hash = $1 AND t.used_at IS NULL AND t.expires_at > now()
           AND z.id = t.authorization_id AND z.revoked_at IS NULL
         RETURNING t.authorization_id, z.client_id, a.name AS agent, z.username, z.scope",
        token_hash,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(taken) = taken {
        return Ok(Taken::Ok(taken));
    }
    let used: Option<Uuid> = sqlx::query_scalar!(
        "SELECT authorization_id FROM oauth_refresh_tokens WHERE token_hash = $1 AND used_at IS NOT NULL",
        token_hash,
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(used.map_or(Taken::Invalid, Taken::Replayed))
}

/// Issues the next refresh token of an authorization, which lives as long as it.
pub async fn insert_refresh(
    conn: &mut PgConnection,
    authorization_id: Uuid,
    token_hash: &str,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO oauth_refresh_tokens (token_hash, authorization_id, expires_at) VALUES ($1, $2, $3)",
        token_hash,
        authorization_id,
        expires_at,
    )
    .execute(&mut *conn)
    .await?;
    // Used refresh tokens are kept until the authorization ends, so that a replay is seen.
    sqlx::query!(
        "UPDATE oauth_authorizations SET expires_at = $2 WHERE id = $1",
        authorization_id,
        expires_at,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Revokes an authorization (of `username` only, when given): its refresh tokens are
/// deleted and its access tokens fail on their next request, once the snapshot has it.
/// `false` if there was no such live authorization.
pub async fn revoke(
    conn: &mut PgConnection,
    actor: &str,
    id: Uuid,
    username: Option<&str>,
    reason: &str,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE oauth_authorizations SET revoked_at = now(), revoked_by = $2, revoked_reason = $4
         WHERE id = $1 AND revoked_at IS NULL AND ($3::text IS NULL OR username = $3)",
        id,
        actor,
        username,
        reason,
    )
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(false);
    }
    sqlx::query!(
        "DELETE FROM oauth_refresh_tokens WHERE authorization_id = $1",
        id,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::AuthorizationRevoke,
        &format!("authorization:{id}"),
        None,
        Some(json!({"reason": reason})),
    )
    .await?;
    Ok(true)
}

/// Revokes every live authorization of a person (their account is disabled or deleted: no
/// host may go on acting for them). Returns how many were revoked.
pub async fn revoke_all_of(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    reason: &str,
) -> sqlx::Result<usize> {
    let ids: Vec<Uuid> = sqlx::query_scalar!(
        "SELECT id FROM oauth_authorizations WHERE username = $1 AND revoked_at IS NULL",
        username,
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut revoked = 0;
    for id in ids {
        if revoke(conn, actor, id, None, reason).await? {
            revoked += 1;
        }
    }
    Ok(revoked)
}

/// Drops codes past their life (used or not) once no replay of them can matter.
pub async fn prune_codes(pool: &PgPool) -> sqlx::Result<u64> {
    Ok(
        sqlx::query!("DELETE FROM oauth_codes WHERE expires_at < now() - interval '1 day'")
            .execute(pool)
            .await?
            .rows_affected(),
    )
}

/// The authorization and client a refresh token (used or not) belongs to.
pub async fn of_refresh_token(
    pool: &PgPool,
    token_hash: &str,
) -> sqlx::Result<Option<(Uuid, String)>> {
    Ok(sqlx::query!(
        "SELECT z.id, z.client_id FROM oauth_refresh_tokens t
         JOIN oauth_authorizations z ON z.id = t.authorization_id
         WHERE t.token_hash = $1",
        token_hash,
    )
    .fetch_optional(pool)
    .await?
    .map(|r| (r.id, r.client_id)))
}

/// Live (neither revoked nor expired) authorizations for `agent`, counted per person.
pub async fn live_counts_for_agent(
    conn: &mut PgConnection,
    agent: &str,
) -> sqlx::Result<std::collections::BTreeMap<String, i64>> {
    Ok(sqlx::query!(
        r#"SELECT z.username, count(*) AS "n!" FROM oauth_authorizations z
         JOIN agents a ON a.id = z.agent_id
         WHERE a.name = $1 AND z.revoked_at IS NULL AND z.expires_at > now()
         GROUP BY z.username"#,
        agent,
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.username, r.n))
    .collect())
}
