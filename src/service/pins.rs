//! Pinned groups and the tool definitions they hold for approval.

use serde::Serialize;

use super::{Plane, Result, ServiceError, refresh};
use crate::db;
use crate::names::GroupName;
use crate::policy::snapshot::Parts;
use crate::state::AppState;

/// A held definition as the API and the UI show it.
#[derive(Debug, Serialize)]
pub struct PendingView {
    #[serde(flatten)]
    pub tool: db::pins::PendingTool,
    /// `pending`, or `rejected` (still held).
    pub status: &'static str,
    /// This instance's catalog has this very definition now; `false` for one superseded by a
    /// later change (approving it would hold what is served instead).
    pub served: bool,
    /// Unified line diff of the approved definition against this one (pretty JSON, sorted
    /// keys); empty when only the script or App file behind the definition changed.
    pub diff: String,
}

fn parse_tool_name(name: &str) -> Result<crate::pool::ToolName> {
    crate::pool::ToolName::parse(name).map_err(ServiceError::Invalid)
}

/// A content hash as the catalog writes them: 64 lowercase hex digits.
pub fn parse_hash(hash: &str) -> Result<&str> {
    if hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(hash)
    } else {
        Err(ServiceError::Invalid(
            "hash must be 64 lowercase hexadecimal digits (a tool's content_hash)".into(),
        ))
    }
}

/// Held definitions of the pinned groups, newest first, with their diffs.
pub async fn pending(state: &AppState) -> Result<Vec<PendingView>> {
    let mut conn = state.db.acquire().await?;
    let rows = db::pins::pending(&mut conn).await?;
    let catalog = state.policy.catalog();
    Ok(rows
        .into_iter()
        .map(|tool| PendingView {
            status: if tool.rejected_at.is_some() {
                "rejected"
            } else {
                "pending"
            },
            served: catalog
                .get(&tool.name)
                .is_some_and(|t| t.content_hash == tool.hash),
            diff: crate::pool::definition::diff(
                tool.previous_definition.as_ref(),
                &tool.definition,
            ),
            tool,
        })
        .collect())
}

/// The hash an approval or rejection is for: the one given, else the one this instance serves
/// (so that an admin never approves a superseded definition by accident), else the newest
/// (the command line has no catalog to say which one is served).
fn decided_hash(on: Plane<'_>, name: &str, hash: Option<&str>) -> Result<Option<String>> {
    match (hash, on.live()) {
        (Some(h), _) => Ok(Some(parse_hash(h)?.to_owned())),
        (None, Some(state)) => Ok(state
            .policy
            .catalog()
            .get(name)
            .map(|t| t.content_hash.hex())),
        (None, None) => Ok(None),
    }
}

/// Approves or rejects the held definition of `name` (see `db::pins::decide`).
pub async fn decide<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    name: &str,
    hash: Option<&str>,
    verdict: db::pins::Verdict,
) -> Result<db::pins::Decision> {
    let on = on.into();
    let name = parse_tool_name(name)?;
    let hash = decided_hash(on, name.as_str(), hash)?;
    let mut tx = on.db().begin().await?;
    let decided = db::pins::decide(&mut tx, actor, name.as_str(), hash.as_deref(), verdict)
        .await?
        .ok_or_else(|| ServiceError::NotFound(format!("a held definition of tool `{name}`")))?;
    tx.commit().await?;
    on.refresh(Parts::ALL).await;
    Ok(decided)
}

/// What pinning a group did.
#[derive(Debug, Serialize)]
pub struct GroupPin {
    pub group: String,
    /// As set (`None`: the default).
    pub pin: Option<bool>,
    /// Whether the group is pinned now, defaults included.
    pub pinned: bool,
    /// Definitions approved as the group's baseline by this change.
    pub approved: usize,
}

/// Sets a group's pin; a group pinned by it has what it serves now approved by `actor`.
pub async fn set_group_pin(
    state: &AppState,
    actor: &str,
    group: &GroupName,
    pin: Option<bool>,
) -> Result<GroupPin> {
    let group = group.as_str();
    let catalog = state.policy.catalog();
    let mut tx = state.db.begin().await?;
    super::editable_group(&mut tx, group).await?;
    let before = db::pins::pinned_groups(&mut tx).await?;
    db::groups::set_pin(&mut tx, actor, group, pin).await?;
    let pinned = db::pins::pinned_groups(&mut tx).await?.contains(group);
    let approved = if pinned && !before.contains(group) {
        db::pins::baseline(&mut tx, actor, group, &catalog).await?
    } else {
        0
    };
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(GroupPin {
        group: group.to_owned(),
        pin,
        pinned,
        approved,
    })
}

/// Held definitions of the pinned groups, newest first, as stored (the command line's view:
/// it has no catalog to say which one is served).
pub async fn held<'a>(on: impl Into<Plane<'a>>) -> Result<Vec<db::pins::PendingTool>> {
    let mut conn = on.into().db().acquire().await?;
    Ok(db::pins::pending(&mut conn).await?)
}
