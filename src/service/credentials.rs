//! Stored credentials: set (write-only), delete, list by name, and re-wrap under a new key.
//! Values enter here and leave only sealed; every change is on record by name.

use std::collections::HashMap;

use sqlx::PgPool;

use super::{Result, ServiceError, refresh};
use crate::credentials::{self, KeyRing, MAX_VALUE_BYTES, Per, SlotKey};
use crate::db;
use crate::db::credentials::CredentialInfo;
use crate::policy::snapshot::Parts;
use crate::pool::env::ScriptVar;
use crate::state::AppState;

/// Checks a slot's parts: a group name and a variable name, as the loader parses them.
pub fn slot(per: Per, owner: &str, group: &str, name: &str) -> Result<SlotKey> {
    crate::names::GroupName::parse(group).map_err(|e| ServiceError::Invalid(e.to_string()))?;
    ScriptVar::parse(name).map_err(ServiceError::Invalid)?;
    Ok(SlotKey {
        per,
        owner: owner.to_owned(),
        group: group.to_owned(),
        name: name.to_owned(),
    })
}

/// Who owns credentials of kind `per`: the agent or account must exist.
async fn owner_exists(state: &AppState, per: Per, owner: &str) -> Result<()> {
    let mut conn = state.db.acquire().await?;
    let found = match per {
        Per::Shared => true,
        Per::Agent => db::agents::managed_by(&mut conn, owner).await?.is_some(),
        Per::Person => db::accounts::get(&mut conn, owner).await?.is_some(),
    };
    if found {
        Ok(())
    } else {
        Err(ServiceError::NotFound(format!(
            "{} `{owner}`",
            per.as_str()
        )))
    }
}

/// Stores `value` for `slot` (replacing any), sealed under the current key.
pub async fn set(state: &AppState, actor: &str, slot: &SlotKey, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(ServiceError::Invalid(
            "the value is empty: to clear a credential, DELETE it".into(),
        ));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(ServiceError::Invalid(format!(
            "a credential is at most {} KiB",
            MAX_VALUE_BYTES / 1024
        )));
    }
    if value.contains('\0') {
        return Err(ServiceError::Invalid(
            "a credential cannot contain a NUL byte (it is passed in an environment variable)"
                .into(),
        ));
    }
    if let Some(s) = state
        .upstreams
        .slots(&slot.group)
        .iter()
        .find(|s| !s.typed() && s.slot.name.as_str() == slot.name)
    {
        return Err(ServiceError::Invalid(if s.exchange.is_some() {
            format!(
                "`{}` of `{}` is obtained for each caller from the token service its `exchange` names, not set by a value",
                slot.name, slot.group
            )
        } else {
            format!(
                "`{}` of `{}` is filled by the person connecting to the upstream's authorization server (Connect, on My connections), not by a value",
                slot.name, slot.group
            )
        }));
    }
    owner_exists(state, slot.per, &slot.owner).await?;
    let sealed = credentials::seal(&state.settings.credential_keys, slot, value.as_bytes())
        .map_err(|e| ServiceError::Conflict(e.to_string()))?;
    let mut tx = state.db.begin().await?;
    db::credentials::put(
        &mut tx,
        actor,
        crate::audit::AdminAction::CredentialSet,
        slot,
        &sealed,
        None,
    )
    .await?;
    tx.commit().await?;
    refresh(state, Parts::CREDENTIALS).await;
    Ok(())
}

/// Deletes the value of `slot`.
pub async fn delete(state: &AppState, actor: &str, slot: &SlotKey) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::credentials::delete(&mut tx, actor, slot).await? {
        return Err(ServiceError::NotFound(format!(
            "credential `{}` of group `{}`",
            slot.name, slot.group
        )));
    }
    tx.commit().await?;
    refresh(state, Parts::CREDENTIALS).await;
    Ok(())
}

/// The credentials stored for one owner: names, key, dates; never values.
pub async fn list(state: &AppState, per: Per, owner: &str) -> Result<Vec<CredentialInfo>> {
    owner_exists(state, per, owner).await?;
    let mut conn = state.db.acquire().await?;
    Ok(db::credentials::list(&mut conn, per, owner).await?)
}

/// What a re-wrap did.
#[derive(Debug, Default, serde::Serialize)]
pub struct Rekeyed {
    pub key: String,
    pub rewrapped: usize,
    pub already: usize,
    /// Values changed while the re-wrap ran (they were sealed under the current key anyway).
    pub raced: usize,
}

/// Re-wraps every stored value's data key under the ring's first key, one row at a time
/// (each row either its old wrapping or its new one: instances given both keys open either
/// throughout). On record as one `credential.rekey` change.
pub async fn rotate_kek(pool: &PgPool, ring: &KeyRing, actor: &str) -> Result<Rekeyed> {
    let key = ring
        .current()
        .ok_or_else(|| ServiceError::Invalid(credentials::CredentialError::NoKey.to_string()))?
        .to_owned();
    let rows: HashMap<SlotKey, credentials::Sealed> = {
        let mut conn = pool.acquire().await?;
        db::credentials::load_sealed(&mut conn).await?
    };
    let mut done = Rekeyed {
        key: key.clone(),
        ..Rekeyed::default()
    };
    for (slot, sealed) in &rows {
        let Some(to) = credentials::rewrap(ring, slot, sealed).map_err(|e| {
            ServiceError::Conflict(format!(
                "credential `{}` of group `{}` ({} `{}`): {e}",
                slot.name,
                slot.group,
                slot.per.as_str(),
                slot.owner
            ))
        })?
        else {
            done.already += 1;
            continue;
        };
        let mut conn = pool.acquire().await?;
        if db::credentials::rewrap(&mut conn, slot, sealed, &to).await? {
            done.rewrapped += 1;
        } else {
            done.raced += 1;
        }
    }
    let mut tx = pool.begin().await?;
    db::record_change(
        &mut tx,
        actor,
        crate::audit::AdminAction::CredentialRekey,
        "credentials",
        None,
        Some(serde_json::json!({"key": key, "rewrapped": done.rewrapped})),
    )
    .await?;
    tx.commit().await?;
    Ok(done)
}

/// The credential slots an agent's tools have that it cannot fill: its own (`per: agent`) or
/// the shared ones with no value. Flagged like a zero-match grant: its calls of those tools
/// would fail. Person slots depend on who signs in, and are not flagged.
pub fn problems(state: &AppState, agent: &crate::policy::snapshot::AgentView) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for tool in &agent.visible {
        let upstream_slots;
        let (group, slots): (&str, Vec<&crate::pool::CredentialSlot>) = match &tool.exec {
            crate::pool::Execution::Script(spec) => {
                (&spec.group.name, spec.group.credentials.iter().collect())
            }
            crate::pool::Execution::Upstream { upstream, .. } => {
                upstream_slots = state.upstreams.slots(upstream);
                // An exchanged slot has no stored value to miss.
                (
                    upstream,
                    upstream_slots
                        .iter()
                        .filter(|s| s.exchange.is_none())
                        .map(|s| &s.slot)
                        .collect(),
                )
            }
        };
        for slot in slots {
            let owner = match slot.per {
                Per::Agent => agent.record.name.clone(),
                Per::Shared => String::new(),
                Per::Person => continue,
            };
            let key = SlotKey {
                per: slot.per,
                owner,
                group: group.to_owned(),
                name: slot.name.to_string(),
            };
            if seen.insert(key.clone()) && !state.credentials.has(&key) {
                out.push(match slot.per {
                    Per::Shared => format!(
                        "group `{}` needs the shared credential `{}`, which is not set: its calls fail until PUT /api/v1/credentials/{}/{}",
                        key.group, key.name, key.group, key.name
                    ),
                    _ => format!(
                        "group `{}` needs this agent's credential `{}`, which is not set: its calls fail until PUT /api/v1/agents/{}/credentials/{}/{}",
                        key.group, key.name, key.owner, key.group, key.name
                    ),
                });
            }
        }
    }
    out
}
