//! Tool group metadata (`policies/groups.yaml`): description, owner, and whether it is pinned.

use serde_json::json;
use sqlx::PgConnection;

use super::record_change;
use crate::audit::AdminAction;
use crate::policy::snapshot::Managed;

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
    /// `Some(Files)`: the admin UI and API leave it to `policy apply`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<Managed>,
}

pub async fn groups(conn: &mut PgConnection) -> sqlx::Result<Vec<GroupMeta>> {
    Ok(sqlx::query!(
        "SELECT name, description, owner, pin, managed_by FROM tool_groups ORDER BY name"
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| GroupMeta {
        name: r.name,
        description: r.description,
        owner: r.owner,
        pin: r.pin,
        managed: r.managed_by.as_deref().and_then(Managed::parse),
    })
    .collect())
}

pub async fn upsert_group(
    conn: &mut PgConnection,
    actor: &str,
    before: Option<&GroupMeta>,
    g: &GroupMeta,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO tool_groups (name, description, owner, pin, managed_by) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description, owner = EXCLUDED.owner, pin = EXCLUDED.pin, managed_by = EXCLUDED.managed_by, updated_at = now()",
        &g.name,
        &g.description,
        &g.owner,
        g.pin,
        g.managed.map(Managed::as_str),
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::GroupSet,
        &format!("group:{}", g.name),
        before.map(|b| json!(b)),
        Some(json!(g)),
    )
    .await
}

/// Whether the group's metadata is managed by files (a group without metadata is not); locks
/// its row for the change being checked.
pub async fn managed_by(conn: &mut PgConnection, name: &str) -> sqlx::Result<Option<Managed>> {
    Ok(sqlx::query_scalar!(
        "SELECT managed_by FROM tool_groups WHERE name = $1 FOR UPDATE",
        name
    )
    .fetch_optional(&mut *conn)
    .await?
    .flatten()
    .as_deref()
    .and_then(Managed::parse))
}

pub async fn delete_group(conn: &mut PgConnection, actor: &str, name: &str) -> sqlx::Result<bool> {
    let gone = sqlx::query!("DELETE FROM tool_groups WHERE name = $1", name)
        .execute(&mut *conn)
        .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            AdminAction::GroupDelete,
            &format!("group:{name}"),
            Some(json!({"name": name})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}

/// Sets what `groups.yaml` would say of a group's pin (`None`: nothing, so the default holds),
/// creating the group's metadata row if it has none.
pub async fn set_pin(
    conn: &mut PgConnection,
    actor: &str,
    group: &str,
    pin: Option<bool>,
) -> sqlx::Result<()> {
    let before: Option<Option<bool>> =
        sqlx::query_scalar!("SELECT pin FROM tool_groups WHERE name = $1", group)
            .fetch_optional(&mut *conn)
            .await?;
    sqlx::query!(
        "INSERT INTO tool_groups (name, pin) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET pin = EXCLUDED.pin, updated_at = now()",
        group,
        pin,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::GroupPin,
        &format!("group:{group}"),
        before.map(|p| json!({"pin": p})),
        Some(json!({"pin": pin})),
    )
    .await
}
