//! Confidential OAuth clients: the credentials an agent's software signs in with.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};

use super::record_change;
use crate::audit::AdminAction;
use crate::policy::snapshot::ClientRecord;

/// An OAuth client as the token endpoint needs it.
#[derive(Debug, Clone)]
pub struct ClientCredentials {
    pub client_id: String,
    pub agent: String,
    pub secret_hash: Option<String>,
    pub jwks: Option<Value>,
}

pub async fn client(pool: &PgPool, client_id: &str) -> sqlx::Result<Option<ClientCredentials>> {
    sqlx::query_as!(
        ClientCredentials,
        "SELECT c.client_id, a.name AS agent, c.secret_hash, c.jwks
         FROM oauth_clients c JOIN agents a ON a.id = c.agent_id WHERE c.client_id = $1",
        client_id,
    )
    .fetch_optional(pool)
    .await
}

/// A client as listed to admins (never its secret).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClientSummary {
    pub client_id: String,
    pub agent: String,
    pub description: String,
    pub auth_methods: Vec<&'static str>,
    pub created_at: DateTime<Utc>,
}

pub async fn clients(pool: &PgPool, agent: Option<&str>) -> sqlx::Result<Vec<ClientSummary>> {
    Ok(sqlx::query!(
        r#"SELECT c.client_id, a.name, c.description, c.secret_hash IS NOT NULL AS "has_secret!",
                c.jwks IS NOT NULL AS "has_jwks!", c.created_at
         FROM oauth_clients c JOIN agents a ON a.id = c.agent_id
         WHERE $1::text IS NULL OR a.name = $1 ORDER BY a.name, c.created_at"#,
        agent,
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| {
        let mut auth_methods = Vec::new();
        if r.has_secret {
            auth_methods.extend(["client_secret_basic", "client_secret_post"]);
        }
        if r.has_jwks {
            auth_methods.push("private_key_jwt");
        }
        ClientSummary {
            client_id: r.client_id,
            agent: r.name,
            description: r.description,
            auth_methods,
            created_at: r.created_at,
        }
    })
    .collect())
}

/// Creates a client for an agent; `false` if the agent does not exist.
pub async fn create_client(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    client_id: &str,
    secret_hash: Option<&str>,
    jwks: Option<&Value>,
    description: &str,
) -> sqlx::Result<bool> {
    let inserted = sqlx::query!(
        "INSERT INTO oauth_clients (client_id, agent_id, secret_hash, jwks, description)
         SELECT $1, id, $3, $4, $5 FROM agents WHERE name = $2",
        client_id,
        agent,
        secret_hash,
        jwks,
        description,
    )
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(false);
    }
    record_change(
        conn,
        actor,
        AdminAction::ClientCreate,
        &format!("agent:{agent}/client:{client_id}"),
        None,
        Some(json!({"client_id": client_id, "agent": agent, "private_key_jwt": jwks.is_some()})),
    )
    .await?;
    Ok(true)
}

pub async fn delete_client(
    conn: &mut PgConnection,
    actor: &str,
    client_id: &str,
) -> sqlx::Result<bool> {
    let gone = sqlx::query!("DELETE FROM oauth_clients WHERE client_id = $1", client_id)
        .execute(&mut *conn)
        .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            AdminAction::ClientDelete,
            &format!("client:{client_id}"),
            Some(json!({"client_id": client_id})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}

/// Which agent each client signs in as, for the policy snapshot.
pub(super) async fn records(conn: &mut PgConnection) -> sqlx::Result<Vec<ClientRecord>> {
    sqlx::query_as!(
        ClientRecord,
        "SELECT c.client_id, a.name AS agent FROM oauth_clients c JOIN agents a ON a.id = c.agent_id"
    )
    .fetch_all(&mut *conn)
    .await
}
