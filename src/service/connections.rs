//! A person's connections to upstreams' authorization servers: start (discover, PKCE, send the
//! person there), finish (the callback: the code for a grant, sealed in their slot), and the
//! refresher every instance runs, which renews grants ahead of their expiry.
//!
//! Refresh runs in the background, never on a call: the request path reads the sealed grant
//! from memory as it reads any credential. Instances share the work through the database: a
//! due row is taken `FOR UPDATE SKIP LOCKED`, so a (rotating) refresh token is spent by one
//! instance, once. A refusal from the server is kept in the grant (`failed`), on record, and
//! the person's calls say to connect again; the tools stay listed.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sha2::{Digest, Sha256};

use super::{Result, ServiceError, refresh};
use crate::audit::AdminAction;
use crate::credentials::oauth::{self, Grant, RefreshError, SlotOAuth};
use crate::credentials::{self, Per, SlotKey};
use crate::db;
use crate::db::credentials::ConnectFlow;
use crate::policy::snapshot::Parts;
use crate::state::AppState;

/// How long a person may stay at the authorization server.
const FLOW_MINUTES: i64 = 10;
/// How often each instance looks for grants due for refresh.
const TICK: Duration = Duration::from_secs(5);
/// Grants refreshed per transaction (each is one request to its server).
const BATCH: i64 = 16;
/// A refresh that failed for a reason that may pass is tried again this much later.
const RETRY: i64 = 30;

/// The callback every connection comes back to.
pub fn redirect_uri(state: &AppState) -> String {
    format!("{}/admin/connections/callback", state.settings.issuer)
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// The slot's `oauth` settings and the upstream's URL, if `group`/`name` is a connected slot.
fn connected_slot(state: &AppState, group: &str, name: &str) -> Option<(Arc<SlotOAuth>, String)> {
    let oauth = state
        .upstreams
        .slots(group)
        .iter()
        .find(|s| s.slot.name.as_str() == name && s.slot.per == Per::Person)?
        .oauth
        .clone()?;
    Some((oauth, state.upstreams.url(group)?))
}

/// Whether `group`/`name` is filled by connecting rather than by a value.
pub fn is_connected_slot(state: &AppState, group: &str, name: &str) -> bool {
    connected_slot(state, group, name).is_some()
}

/// What is wrong with a person's stored grant, if anything (`None` also when none is stored).
pub fn trouble(state: &AppState, slot: &SlotKey) -> Option<String> {
    let value = state.credentials.value(slot).ok()??;
    match Grant::parse(&value) {
        None => Some("it holds no grant: connect".into()),
        Some(g) if g.failed.is_some() => Some(format!(
            "the authorization server refused to renew it ({}): connect again",
            g.failed.unwrap_or_default()
        )),
        Some(g) if g.expired(Utc::now()) => Some("expired: connect again".into()),
        Some(_) => None,
    }
}

/// Starts `username`'s connection for slot `group`/`name`: where to send their browser, and
/// the flow's `state` (the browser keeps it, to prove at the callback that it started it).
pub async fn start(
    state: &AppState,
    username: &str,
    group: &str,
    name: &str,
) -> Result<(String, String)> {
    let (o, url) = connected_slot(state, group, name).ok_or_else(|| {
        ServiceError::NotFound(format!("connection `{name}` of upstream `{group}`"))
    })?;
    if state.settings.credential_keys.is_empty() {
        return Err(ServiceError::Conflict(
            credentials::CredentialError::NoKey.to_string(),
        ));
    }
    let endpoints = oauth::discover(&url, &o).await.map_err(|e| {
        tracing::warn!(upstream = %group, error = %e, "discovering an upstream's authorization server failed");
        ServiceError::Conflict(format!(
            "the authorization server of upstream `{group}` cannot be used right now: {e}"
        ))
    })?;
    let (to, csrf, verifier) = oauth::authorize_url(&endpoints, &o, &redirect_uri(state))
        .map_err(ServiceError::Invalid)?;
    let flow = ConnectFlow {
        username: username.to_owned(),
        group_name: group.to_owned(),
        name: name.to_owned(),
        pkce_verifier: verifier,
        token_endpoint: endpoints.token_endpoint,
        resource: endpoints.resource,
    };
    let mut conn = state.db.acquire().await?;
    db::credentials::insert_flow(
        &mut conn,
        &sha256_hex(&csrf),
        &flow,
        Utc::now() + chrono::Duration::minutes(FLOW_MINUTES),
    )
    .await?;
    Ok((to.to_string(), csrf))
}

/// The callback: the flow `state` (which the surface has checked came back to the browser that
/// started it, so a link carrying someone else's code cannot put their grant in this person's
/// slot) and the server's `code` become a grant in the slot of the person who started it.
/// Returns the slot's `(group, name)`.
pub async fn finish(state: &AppState, flow_state: &str, code: &str) -> Result<(String, String)> {
    let mut conn = state.db.acquire().await?;
    // Taken out: a callback is answered once.
    let flow = db::credentials::take_flow(&mut conn, &sha256_hex(flow_state))
        .await?
        .ok_or_else(|| {
            ServiceError::Invalid(
                "this connection is unknown, expired, already finished, or started by someone else: start it again from My connections".into(),
            )
        })?;
    drop(conn);
    let (o, _) = connected_slot(state, &flow.group_name, &flow.name).ok_or_else(|| {
        ServiceError::NotFound(format!(
            "connection `{}` of upstream `{}`",
            flow.name, flow.group_name
        ))
    })?;
    let grant = oauth::exchange(
        &o,
        &flow.token_endpoint,
        &flow.resource,
        &redirect_uri(state),
        code,
        &flow.pkce_verifier,
    )
    .await
    .map_err(|e| {
        ServiceError::Conflict(format!(
            "the authorization server of upstream `{}` did not give a token: {e}",
            flow.group_name
        ))
    })?;
    let slot = super::credentials::slot(Per::Person, &flow.username, &flow.group_name, &flow.name)?;
    let sealed = credentials::seal(&state.settings.credential_keys, &slot, &grant.to_bytes())
        .map_err(|e| ServiceError::Conflict(e.to_string()))?;
    let mut tx = state.db.begin().await?;
    db::credentials::put(
        &mut tx,
        &format!("admin:{}", flow.username),
        AdminAction::CredentialConnected,
        &slot,
        &sealed,
        grant.refresh_at(Utc::now()),
    )
    .await?;
    tx.commit().await?;
    refresh(state, Parts::CREDENTIALS).await;
    Ok((flow.group_name, flow.name))
}

/// Refreshes up to [`BATCH`] grants due now, one transaction each (a row is locked only while
/// its own server answers, so one slow server holds up no other grant); how many were handled.
pub async fn refresh_due(state: &AppState) -> Result<usize> {
    let mut n = 0;
    while n < BATCH as usize {
        let mut tx = state.db.begin().await?;
        let Some((slot, sealed)) = db::credentials::take_due(&mut tx, 1).await?.pop() else {
            break;
        };
        refresh_one(state, &mut tx, &slot, &sealed).await?;
        tx.commit().await?;
        n += 1;
    }
    if n > 0 {
        refresh(state, Parts::CREDENTIALS).await;
    }
    Ok(n)
}

async fn refresh_one(
    state: &AppState,
    tx: &mut sqlx::PgConnection,
    slot: &SlotKey,
    sealed: &credentials::Sealed,
) -> Result<()> {
    let ring = &state.settings.credential_keys;
    let grant = credentials::open(ring, slot, sealed)
        .ok()
        .and_then(|v| Grant::parse(&v));
    let (Some(grant), Some((o, _))) = (grant, connected_slot(state, &slot.group, &slot.name))
    else {
        // Not a grant any more (or this instance does not know the upstream yet): not due.
        db::credentials::postpone(tx, slot, Utc::now() + chrono::Duration::seconds(RETRY)).await?;
        return Ok(());
    };
    let (action, outcome) = match oauth::refresh(&o, &grant).await {
        Ok(new) => (AdminAction::CredentialRefreshed, Ok(new)),
        Err(RefreshError::Transient(e)) => {
            tracing::warn!(upstream = %slot.group, person = %slot.owner, error = %e, "refreshing a connection failed; trying again");
            db::credentials::postpone(tx, slot, Utc::now() + chrono::Duration::seconds(RETRY))
                .await?;
            return Ok(());
        }
        Err(RefreshError::Refused(why)) => (AdminAction::CredentialRefreshFailed, Err(why)),
    };
    let (grant, detail) = match outcome {
        Ok(new) => (new, None),
        Err(why) => (
            Grant {
                failed: Some(why.clone()),
                ..grant
            },
            Some(why),
        ),
    };
    let resealed = credentials::seal(ring, slot, &grant.to_bytes())
        .map_err(|e| ServiceError::Conflict(e.to_string()))?;
    db::credentials::refreshed(
        tx,
        action,
        slot,
        Some(&resealed),
        grant.refresh_at(Utc::now()),
        detail.as_deref(),
    )
    .await?;
    Ok(())
}

/// Every instance refreshes the grants that fall due, in the background.
pub fn spawn_refresher(state: AppState) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // A full batch may mean more are due: go on at once.
            loop {
                match refresh_due(&state).await {
                    Ok(n) if n as i64 == BATCH => continue,
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "refreshing connections failed");
                        break;
                    }
                }
            }
        }
    });
}
