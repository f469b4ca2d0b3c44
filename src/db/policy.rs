//! Agents, grants, limits, OAuth clients, signing keys and revoked tokens.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::record_change;
use crate::limits::{Limit, Period};
use crate::policy::arguments::ArgumentRules;
use crate::policy::snapshot::{
    AgentRecord, ClientRecord, Discovery, GrantRecord, Parts, PolicyState, RateLimitRecord,
    VerifyKey,
};

/// Reads everything the policy snapshot is built from, in one repeatable-read transaction so
/// that the snapshot never mixes two states.
pub async fn load_state(pool: &PgPool) -> sqlx::Result<PolicyState> {
    load_parts(pool, Parts::ALL).await
}

/// Reads the `parts` of the policy state, in one repeatable-read transaction; the other
/// fields are left empty, for [`crate::policy::snapshot::PolicyHandle::merge_state`].
pub async fn load_parts(pool: &PgPool, parts: Parts) -> sqlx::Result<PolicyState> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let mut state = PolicyState::default();
    if parts.contains(Parts::AGENTS) {
        state.agents = agents(&mut tx).await?;
    }
    if parts.contains(Parts::CLIENTS) {
        state.clients = sqlx::query(
            "SELECT c.client_id, a.name FROM oauth_clients c JOIN agents a ON a.id = c.agent_id",
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|r| ClientRecord {
            client_id: r.get(0),
            agent: r.get(1),
        })
        .collect();
    }
    if parts.contains(Parts::REVOKED) {
        state.revoked =
            sqlx::query_scalar("SELECT jti FROM revoked_tokens WHERE expires_at > now()")
                .fetch_all(&mut *tx)
                .await?;
    }
    if parts.contains(Parts::KEYS) {
        state.keys = verify_keys(&mut tx).await?;
    }
    if parts.contains(Parts::PINS) {
        state.pins = super::pins::load(&mut tx).await?;
    }
    if parts.contains(Parts::AUTHORIZATIONS) {
        state.authorizations = super::authorizations::live(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(state)
}

async fn agents(conn: &mut PgConnection) -> sqlx::Result<Vec<AgentRecord>> {
    let mut grants: HashMap<Uuid, Vec<GrantRecord>> = HashMap::new();
    for r in sqlx::query(
        "SELECT id, agent_id, target, created_by, created_at FROM agent_grants ORDER BY target",
    )
    .fetch_all(&mut *conn)
    .await?
    {
        grants.entry(r.get(1)).or_default().push(GrantRecord {
            id: r.get(0),
            target: r.get(2),
            created_by: r.get(3),
            created_at: r.get(4),
        });
    }
    let mut limits: HashMap<Uuid, Vec<RateLimitRecord>> = HashMap::new();
    for r in sqlx::query(
        "SELECT agent_id, pattern, rate, period, burst FROM rate_limits ORDER BY pattern NULLS FIRST",
    )
    .fetch_all(&mut *conn)
    .await?
    {
        let period: String = r.get(3);
        let limit = Period::parse(&period)
            .ok_or_else(|| format!("unknown period {period:?}"))
            .and_then(|p| {
                let burst = r.get::<Option<i32>, _>(4).map(|b| b.max(0) as u32);
                Limit::new(r.get(2), p, burst)
            })
            // The table's checks admit only what `Limit::new` does; a row that slips past
            // them is a corrupt database, reported as such rather than served loosely.
            .map_err(|e| sqlx::Error::Decode(format!("rate_limits row: {e}").into()))?;
        limits.entry(r.get(0)).or_default().push(RateLimitRecord {
            pattern: r.get(1),
            limit,
        });
    }
    let mut arguments: HashMap<Uuid, Vec<ArgumentRules>> = HashMap::new();
    for r in
        sqlx::query("SELECT agent_id, target, params FROM agent_argument_rules ORDER BY target")
            .fetch_all(&mut *conn)
            .await?
    {
        let params: Value = r.get(2);
        // Checked when written; a row that does not parse is a corrupt database, reported as
        // such rather than served without its rules.
        let params = crate::policy::arguments::parse_params(&params)
            .map_err(|e| sqlx::Error::Decode(format!("agent_argument_rules row: {e}").into()))?;
        arguments.entry(r.get(0)).or_default().push(ArgumentRules {
            target: r.get(1),
            params,
        });
    }
    let mut users = super::authorizations::agent_users(&mut *conn).await?;
    let rows = sqlx::query(
        "SELECT id, name, description, notes, discovery, pinned FROM agents ORDER BY name",
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let id: Uuid = r.get(0);
            AgentRecord {
                id,
                name: r.get(1),
                description: r.get(2),
                notes: r.get(3),
                discovery: Discovery::parse(r.get::<&str, _>(4)).unwrap_or_default(),
                pinned: r.get(5),
                grants: grants.remove(&id).unwrap_or_default(),
                limits: limits.remove(&id).unwrap_or_default(),
                arguments: arguments.remove(&id).unwrap_or_default(),
                users: users.remove(&id).unwrap_or_default(),
            }
        })
        .collect())
}

/// The signing key and the one before it: JWKS publishes both so rotation does not cut off
/// tokens already issued.
async fn verify_keys(conn: &mut PgConnection) -> sqlx::Result<Vec<VerifyKey>> {
    Ok(
        sqlx::query("SELECT kid, public_key FROM signing_keys ORDER BY created_at DESC LIMIT 2")
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .map(|r| VerifyKey {
                kid: r.get(0),
                public_key: r.get(1),
            })
            .collect(),
    )
}

/// The fields of an agent that policies and the API set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSettings {
    pub description: String,
    pub notes: String,
    pub discovery: Discovery,
    pub pinned: Vec<String>,
}

pub async fn agent_id(conn: &mut PgConnection, name: &str) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar("SELECT id FROM agents WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await
}

pub async fn create_agent(
    conn: &mut PgConnection,
    actor: &str,
    name: &str,
    s: &AgentSettings,
) -> sqlx::Result<Uuid> {
    let id = Uuid::now_v7();
    sqlx::query("INSERT INTO agents (id, name, description, notes, discovery, pinned) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(id)
        .bind(name)
        .bind(&s.description)
        .bind(&s.notes)
        .bind(s.discovery.as_str())
        .bind(&s.pinned)
        .execute(&mut *conn)
        .await?;
    record_change(
        conn,
        actor,
        "agent.create",
        &format!("agent:{name}"),
        None,
        Some(settings_json(s)),
    )
    .await?;
    Ok(id)
}

pub async fn update_agent(
    conn: &mut PgConnection,
    actor: &str,
    name: &str,
    before: &AgentSettings,
    s: &AgentSettings,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE agents SET description = $2, notes = $3, discovery = $4, pinned = $5, updated_at = now() WHERE name = $1")
        .bind(name)
        .bind(&s.description)
        .bind(&s.notes)
        .bind(s.discovery.as_str())
        .bind(&s.pinned)
        .execute(&mut *conn)
        .await?;
    record_change(
        conn,
        actor,
        "agent.update",
        &format!("agent:{name}"),
        Some(settings_json(before)),
        Some(settings_json(s)),
    )
    .await
}

/// Deletes an agent with its grants, limits and clients. Returns whether it existed.
pub async fn delete_agent(conn: &mut PgConnection, actor: &str, name: &str) -> sqlx::Result<bool> {
    let gone = sqlx::query("DELETE FROM agents WHERE name = $1")
        .bind(name)
        .execute(&mut *conn)
        .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            "agent.delete",
            &format!("agent:{name}"),
            Some(json!({"name": name})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}

fn settings_json(s: &AgentSettings) -> Value {
    json!({"description": s.description, "discovery": s.discovery.as_str(), "pinned": s.pinned})
}

/// Adds a grant; `None` if the agent already has it.
pub async fn add_grant(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    target: &str,
) -> sqlx::Result<Option<Uuid>> {
    let id = Uuid::now_v7();
    let inserted = sqlx::query(
        "INSERT INTO agent_grants (id, agent_id, target, created_by)
         SELECT $1, id, $3, $4 FROM agents WHERE name = $2
         ON CONFLICT (agent_id, target) DO NOTHING",
    )
    .bind(id)
    .bind(agent)
    .bind(target)
    .bind(actor)
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(None);
    }
    record_change(
        conn,
        actor,
        "grant.create",
        &format!("agent:{agent}/grant:{target}"),
        None,
        Some(json!({"agent": agent, "target": target})),
    )
    .await?;
    Ok(Some(id))
}

/// A new agent or a new grant, for [`create_many`].
pub enum Creation<'a> {
    Agent {
        name: &'a str,
        settings: &'a AgentSettings,
    },
    Grant {
        agent: &'a str,
        target: &'a str,
    },
}

/// Does what [`create_agent`] and [`add_grant`], called for `items` in order, would do, with
/// the same audit events in the same order, in a few statements: applying a policies folder of
/// 10,000 agents was 100,000 round trips. A grant may name an agent created earlier in `items`.
pub async fn create_many(
    conn: &mut PgConnection,
    actor: &str,
    items: &[Creation<'_>],
) -> sqlx::Result<()> {
    // Ids in item order, as the one-by-one calls would draw them.
    let ids: Vec<Uuid> = items.iter().map(|_| Uuid::now_v7()).collect();
    let (mut a_ids, mut names, mut descriptions, mut notes, mut discovery, mut pinned) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let (mut g_ids, mut g_agents, mut g_targets) = (Vec::new(), Vec::new(), Vec::new());
    for (item, id) in items.iter().zip(&ids) {
        match item {
            Creation::Agent { name, settings } => {
                a_ids.push(*id);
                names.push(*name);
                descriptions.push(settings.description.as_str());
                notes.push(settings.notes.as_str());
                discovery.push(settings.discovery.as_str());
                // Arrays of arrays do not unnest row by row: each list goes as JSON text.
                pinned.push(Value::from(settings.pinned.clone()).to_string());
            }
            Creation::Grant { agent, target } => {
                g_ids.push(*id);
                g_agents.push(*agent);
                g_targets.push(*target);
            }
        }
    }
    if !a_ids.is_empty() {
        sqlx::query(
            "INSERT INTO agents (id, name, description, notes, discovery, pinned)
             SELECT id, name, d, n, disc, ARRAY(SELECT jsonb_array_elements_text(p::jsonb))
             FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                 AS u(id, name, d, n, disc, p)",
        )
        .bind(&a_ids)
        .bind(&names)
        .bind(&descriptions)
        .bind(&notes)
        .bind(&discovery)
        .bind(&pinned)
        .execute(&mut *conn)
        .await?;
    }
    // A grant the agent already has, or of an agent that does not exist, is not inserted
    // and not recorded, as in `add_grant`.
    let inserted: std::collections::HashSet<Uuid> = if g_ids.is_empty() {
        Default::default()
    } else {
        sqlx::query_scalar(
            "INSERT INTO agent_grants (id, agent_id, target, created_by)
             SELECT u.id, a.id, u.target, $4
             FROM UNNEST($1::uuid[], $2::text[], $3::text[]) AS u(id, agent, target)
             JOIN agents a ON a.name = u.agent
             ON CONFLICT (agent_id, target) DO NOTHING
             RETURNING id",
        )
        .bind(&g_ids)
        .bind(&g_agents)
        .bind(&g_targets)
        .bind(actor)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect()
    };
    let events = items
        .iter()
        .zip(&ids)
        .filter_map(|(item, id)| match item {
            Creation::Agent { name, settings } => Some(super::change_event(
                actor,
                "agent.create",
                &format!("agent:{name}"),
                None,
                Some(settings_json(settings)),
            )),
            Creation::Grant { agent, target } => inserted.contains(id).then(|| {
                super::change_event(
                    actor,
                    "grant.create",
                    &format!("agent:{agent}/grant:{target}"),
                    None,
                    Some(json!({"agent": agent, "target": target})),
                )
            }),
        })
        .collect();
    super::record_changes(conn, events).await
}

/// Removes a grant of an agent. Returns whether it existed.
pub async fn remove_grant(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    target: &str,
) -> sqlx::Result<bool> {
    let gone = sqlx::query(
        "DELETE FROM agent_grants g USING agents a WHERE g.agent_id = a.id AND a.name = $1 AND g.target = $2",
    )
    .bind(agent)
    .bind(target)
    .execute(&mut *conn)
    .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            "grant.delete",
            &format!("agent:{agent}/grant:{target}"),
            Some(json!({"agent": agent, "target": target})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}

/// Replaces an agent's rate limits.
pub async fn set_limits(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    before: &[RateLimitRecord],
    limits: &[RateLimitRecord],
) -> sqlx::Result<()> {
    let Some(agent_id) = agent_id(conn, agent).await? else {
        return Ok(());
    };
    sqlx::query("DELETE FROM rate_limits WHERE agent_id = $1")
        .bind(agent_id)
        .execute(&mut *conn)
        .await?;
    for l in limits {
        sqlx::query("INSERT INTO rate_limits (id, agent_id, pattern, rate, period, burst) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(Uuid::now_v7())
            .bind(agent_id)
            .bind(&l.pattern)
            .bind(l.limit.count())
            .bind(l.limit.period().as_str())
            .bind(l.limit.burst_written().map(|b| b as i32))
            .execute(&mut *conn)
            .await?;
    }
    record_change(
        conn,
        actor,
        "rate_limit.set",
        &format!("agent:{agent}"),
        Some(json!(before)),
        Some(json!(limits)),
    )
    .await
}

/// Sets (creates or replaces) an agent's argument rules for one tool or group. Returns
/// whether the agent exists.
pub async fn set_argument_rules(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    rules: &ArgumentRules,
) -> sqlx::Result<bool> {
    let params = json!(rules.params);
    let before: Option<Option<Value>> = sqlx::query_scalar(
        "SELECT (SELECT r.params FROM agent_argument_rules r WHERE r.agent_id = a.id AND r.target = $2)
         FROM agents a WHERE a.name = $1",
    )
    .bind(agent)
    .bind(&rules.target)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(before) = before else {
        return Ok(false);
    };
    sqlx::query(
        "INSERT INTO agent_argument_rules (agent_id, target, params, created_by)
         SELECT id, $2, $3, $4 FROM agents WHERE name = $1
         ON CONFLICT (agent_id, target) DO UPDATE
             SET params = EXCLUDED.params, created_by = EXCLUDED.created_by, updated_at = now()",
    )
    .bind(agent)
    .bind(&rules.target)
    .bind(&params)
    .bind(actor)
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        "arguments.set",
        &format!("agent:{agent}/arguments:{}", rules.target),
        before,
        Some(params),
    )
    .await?;
    Ok(true)
}

/// Removes an agent's argument rules for one tool or group. Returns whether there were any.
pub async fn delete_argument_rules(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    target: &str,
) -> sqlx::Result<bool> {
    let gone: Option<Value> = sqlx::query_scalar(
        "DELETE FROM agent_argument_rules r USING agents a
         WHERE r.agent_id = a.id AND a.name = $1 AND r.target = $2 RETURNING r.params",
    )
    .bind(agent)
    .bind(target)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(before) = gone else {
        return Ok(false);
    };
    record_change(
        conn,
        actor,
        "arguments.delete",
        &format!("agent:{agent}/arguments:{target}"),
        Some(before),
        None,
    )
    .await?;
    Ok(true)
}

/// Group metadata from `policies/groups.yaml`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupMeta {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub owner: String,
    /// `Some(true)`: changed or new tools are held until approved; `None`: the default
    /// (pinned for upstream groups, not for script groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<bool>,
}

pub async fn groups(conn: &mut PgConnection) -> sqlx::Result<Vec<GroupMeta>> {
    Ok(
        sqlx::query("SELECT name, description, owner, pin FROM tool_groups ORDER BY name")
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .map(|r| GroupMeta {
                name: r.get(0),
                description: r.get(1),
                owner: r.get(2),
                pin: r.get(3),
            })
            .collect(),
    )
}

pub async fn upsert_group(
    conn: &mut PgConnection,
    actor: &str,
    before: Option<&GroupMeta>,
    g: &GroupMeta,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO tool_groups (name, description, owner, pin) VALUES ($1, $2, $3, $4)
         ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description, owner = EXCLUDED.owner, pin = EXCLUDED.pin, updated_at = now()",
    )
    .bind(&g.name)
    .bind(&g.description)
    .bind(&g.owner)
    .bind(g.pin)
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        "group.set",
        &format!("group:{}", g.name),
        before.map(|b| json!(b)),
        Some(json!(g)),
    )
    .await
}

pub async fn delete_group(conn: &mut PgConnection, actor: &str, name: &str) -> sqlx::Result<bool> {
    let gone = sqlx::query("DELETE FROM tool_groups WHERE name = $1")
        .bind(name)
        .execute(&mut *conn)
        .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            "group.delete",
            &format!("group:{name}"),
            Some(json!({"name": name})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}

/// An OAuth client as the token endpoint needs it.
#[derive(Debug, Clone)]
pub struct ClientCredentials {
    pub client_id: String,
    pub agent: String,
    pub secret_hash: Option<String>,
    pub jwks: Option<Value>,
}

pub async fn client(pool: &PgPool, client_id: &str) -> sqlx::Result<Option<ClientCredentials>> {
    Ok(sqlx::query(
        "SELECT c.client_id, a.name, c.secret_hash, c.jwks FROM oauth_clients c JOIN agents a ON a.id = c.agent_id WHERE c.client_id = $1",
    )
    .bind(client_id)
    .fetch_optional(pool)
    .await?
    .map(|r| ClientCredentials { client_id: r.get(0), agent: r.get(1), secret_hash: r.get(2), jwks: r.get(3) }))
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
    Ok(sqlx::query(
        "SELECT c.client_id, a.name, c.description, c.secret_hash IS NOT NULL, c.jwks IS NOT NULL, c.created_at
         FROM oauth_clients c JOIN agents a ON a.id = c.agent_id
         WHERE $1::text IS NULL OR a.name = $1 ORDER BY a.name, c.created_at",
    )
    .bind(agent)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| {
        let mut auth_methods = Vec::new();
        if r.get::<bool, _>(3) {
            auth_methods.extend(["client_secret_basic", "client_secret_post"]);
        }
        if r.get::<bool, _>(4) {
            auth_methods.push("private_key_jwt");
        }
        ClientSummary { client_id: r.get(0), agent: r.get(1), description: r.get(2), auth_methods, created_at: r.get(5) }
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
    let inserted = sqlx::query(
        "INSERT INTO oauth_clients (client_id, agent_id, secret_hash, jwks, description)
         SELECT $1, id, $3, $4, $5 FROM agents WHERE name = $2",
    )
    .bind(client_id)
    .bind(agent)
    .bind(secret_hash)
    .bind(jwks)
    .bind(description)
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(false);
    }
    record_change(
        conn,
        actor,
        "client.create",
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
    let gone = sqlx::query("DELETE FROM oauth_clients WHERE client_id = $1")
        .bind(client_id)
        .execute(&mut *conn)
        .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            "client.delete",
            &format!("client:{client_id}"),
            Some(json!({"client_id": client_id})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}

/// The key that signs new tokens.
pub struct SigningKey {
    pub kid: String,
    pub private_pkcs8: Vec<u8>,
}

pub async fn current_signing_key(pool: &PgPool) -> sqlx::Result<Option<SigningKey>> {
    Ok(sqlx::query("SELECT kid, private_pkcs8 FROM signing_keys WHERE retired_at IS NULL ORDER BY created_at DESC LIMIT 1")
        .fetch_optional(pool)
        .await?
        .map(|r| SigningKey { kid: r.get(0), private_pkcs8: r.get(1) }))
}

/// Adds a new signing key and retires the others from signing (they still verify until the
/// next rotation).
pub async fn insert_signing_key(
    conn: &mut PgConnection,
    actor: &str,
    kid: &str,
    private_pkcs8: &[u8],
    public_key: &[u8],
) -> sqlx::Result<()> {
    sqlx::query("UPDATE signing_keys SET retired_at = now() WHERE retired_at IS NULL")
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO signing_keys (kid, algorithm, private_pkcs8, public_key) VALUES ($1, 'EdDSA', $2, $3)")
        .bind(kid)
        .bind(private_pkcs8)
        .bind(public_key)
        .execute(&mut *conn)
        .await?;
    record_change(
        conn,
        actor,
        "key.rotate",
        &format!("key:{kid}"),
        None,
        Some(json!({"kid": kid})),
    )
    .await
}

pub async fn has_signing_key(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM signing_keys WHERE retired_at IS NULL)")
        .fetch_one(&mut *conn)
        .await
}

/// Public keys to publish in JWKS (current and previous).
pub async fn published_keys(pool: &PgPool) -> sqlx::Result<Vec<VerifyKey>> {
    let mut conn = pool.acquire().await?;
    verify_keys(&mut conn).await
}

pub async fn revoke(
    conn: &mut PgConnection,
    actor: &str,
    jti: Uuid,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO revoked_tokens (jti, expires_at, revoked_by) VALUES ($1, $2, $3) ON CONFLICT (jti) DO NOTHING")
        .bind(jti)
        .bind(expires_at)
        .bind(actor)
        .execute(&mut *conn)
        .await?;
    record_change(
        conn,
        actor,
        "token.revoke",
        &format!("token:{jti}"),
        None,
        Some(json!({"jti": jti})),
    )
    .await
}

/// Drops revocations of tokens that have expired anyway.
pub async fn prune_revocations(pool: &PgPool) -> sqlx::Result<u64> {
    Ok(
        sqlx::query("DELETE FROM revoked_tokens WHERE expires_at < now() - interval '1 hour'")
            .execute(pool)
            .await?
            .rows_affected(),
    )
}

/// Whether any agent exists (first start applies the policies folder into an empty database).
pub async fn is_empty(pool: &PgPool) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT NOT EXISTS (SELECT 1 FROM agents)")
        .fetch_one(pool)
        .await
}

/// Upstream specs by group name.
pub async fn upstreams(
    conn: &mut PgConnection,
) -> sqlx::Result<std::collections::BTreeMap<String, Value>> {
    Ok(
        sqlx::query("SELECT name, spec FROM upstreams ORDER BY name")
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
    )
}

pub async fn set_upstream(
    conn: &mut PgConnection,
    actor: &str,
    name: &str,
    before: Option<&Value>,
    spec: &Value,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO upstreams (name, spec) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, updated_at = now()",
    )
    .bind(name)
    .bind(spec)
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        "upstream.set",
        &format!("upstream:{name}"),
        before.cloned(),
        Some(spec.clone()),
    )
    .await
}

pub async fn delete_upstream(
    conn: &mut PgConnection,
    actor: &str,
    name: &str,
) -> sqlx::Result<bool> {
    let gone = sqlx::query("DELETE FROM upstreams WHERE name = $1")
        .bind(name)
        .execute(&mut *conn)
        .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            "upstream.delete",
            &format!("upstream:{name}"),
            Some(json!({"name": name})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}
