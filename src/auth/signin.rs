//! Signing in to the admin UI and out of it, on record: a password checked against its
//! account, or a person an OpenID Provider vouched for, each attempt within the sign-in limits
//! and each outcome in the audit log. The surface shows the forms and sets the cookies.

use std::time::Duration;

use uuid::Uuid;

use super::{secrets, session};
use crate::audit::{AuditEvent, EventKind, Outcome, RequestOrigin};
use crate::db;
use crate::limits::{LimitedAction, Refusal};
use crate::state::AppState;

/// The surface these records name, as summarised refusals group them.
const SURFACE: &str = "web";
/// Longest claim an SSO record keeps.
const MAX_CLAIM_CHARS: usize = 256;

/// A sign-in could not be decided: the database or the password check failed.
#[derive(Debug, thiserror::Error)]
pub enum SignInFailed {
    #[error("database unavailable")]
    Database(#[from] sqlx::Error),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// The end of a password sign-in.
#[derive(Debug)]
pub enum PasswordSignIn {
    /// Signed in: the new session's token, for the browser's cookie.
    SignedIn { session: String },
    /// Password sign-in is turned off here.
    TurnedOff,
    /// The source or the account tried too often, or the attempt could not be counted.
    Limited(Refusal),
    /// No such account, or not its password (which of the two is not said).
    Wrong,
    /// The password was right, but the account is disabled.
    Disabled,
}

/// Where a request comes from, for the sign-in limits: the unspecified address when it is not
/// known (behind a proxy this is the proxy).
fn source(origin: Option<&RequestOrigin>) -> std::net::IpAddr {
    super::source_of(origin).unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
}

fn password_event(outcome: Outcome, username: &str, origin: Option<&RequestOrigin>) -> AuditEvent {
    let mut e = AuditEvent::new(EventKind::AdminLogin, outcome).from_origin(origin);
    e.admin_user = Some(format!(
        "admin:{}",
        username
            .chars()
            .take(crate::names::MAX_NAME)
            .collect::<String>()
    ));
    e.resource = Some("admin-ui".into());
    e
}

/// Signs `username` in with `password` (when `allowed`: `--password-sign-in on`), opening a
/// session of `lifetime`. Every attempt is counted, right or wrong, against the source and the
/// account; every decided one is audited. A limited attempt is neither checked nor audited.
pub async fn with_password(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    username: &str,
    password: String,
    allowed: bool,
    lifetime: Duration,
) -> Result<PasswordSignIn, SignInFailed> {
    if !allowed {
        state
            .audit
            .record_detached(password_event(Outcome::Denied, username, origin));
        return Ok(PasswordSignIn::TurnedOff);
    }
    let action = LimitedAction::SignIn {
        source: source(origin),
        account: Some(username),
    };
    if let Err(refusal) = state.limits.take(action).await {
        return Ok(PasswordSignIn::Limited(refusal));
    }
    // A name that breaks the username rule names no account: not looked up.
    let user = match crate::names::Username::parse(username) {
        Ok(username) => db::accounts::find_user(&state.db, &username).await?,
        Err(_) => None,
    };
    let stored = user.as_ref().and_then(|u| u.password_hash.clone());
    // argon2 is deliberately slow: keep it off the async workers. An unknown user is checked
    // against a dummy hash, so the timing does not tell which usernames exist.
    let ok = tokio::task::spawn_blocking(move || secrets::verify(&password, stored.as_deref()))
        .await
        .map_err(|e| SignInFailed::Internal(e.into()))?;
    let Some(user) = user.filter(|_| ok) else {
        state
            .audit
            .record_detached(password_event(Outcome::Denied, username, origin));
        return Ok(PasswordSignIn::Wrong);
    };
    // Only after the password verified: a disabled account is not an oracle for guessers.
    if user.disabled {
        state
            .audit
            .record_detached(password_event(Outcome::Denied, &user.username, origin));
        return Ok(PasswordSignIn::Disabled);
    }
    let token = session::open(state, user.id, origin, lifetime).await?;
    let mut conn = state.db.acquire().await?;
    db::accounts::touch_sign_in(&mut conn, user.id).await?;
    state
        .audit
        .record_detached(password_event(Outcome::Success, &user.username, origin));
    Ok(PasswordSignIn::SignedIn { session: token })
}

/// Takes one sign-in attempt through the OpenID Provider from the request's source (the
/// provider names no account before it answers): each start stores a row, so it is counted
/// like a password attempt from the same address.
pub async fn admit_provider_sign_in(
    state: &AppState,
    origin: Option<&RequestOrigin>,
) -> Result<(), Refusal> {
    let action = LimitedAction::SignIn {
        source: source(origin),
        account: None,
    };
    state.limits.take(action).await.map(drop)
}

fn provider_event(
    outcome: Outcome,
    who: Option<&str>,
    error: Option<String>,
    origin: Option<&RequestOrigin>,
) -> AuditEvent {
    let mut e = AuditEvent::new(EventKind::AdminLogin, outcome).from_origin(origin);
    e.admin_user = who.map(|w| {
        format!(
            "admin:{}",
            w.chars().take(MAX_CLAIM_CHARS).collect::<String>()
        )
    });
    e.resource = Some("admin-ui:sso".into());
    e.error = error;
    e
}

/// A callback refusal's reason in fixed words (a provider's error text is the caller's).
fn callback_reason(why: &str) -> &'static str {
    const FIXED: [&str; 5] = [
        "state mismatch",
        "unknown or expired state",
        "authorization response from another issuer",
        "token exchange failed",
        "ID token did not verify",
    ];
    FIXED
        .into_iter()
        .find(|f| *f == why)
        .unwrap_or("provider error")
}

/// Records a refused sign-in through the OpenID Provider, `why` in words. Before the provider
/// has named the person (`who`), anyone could have sent the callback: identical refusals from
/// one source then share a row.
pub fn provider_sign_in_refused(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    who: Option<&str>,
    why: &str,
) {
    let event = provider_event(Outcome::Denied, who, Some(why.to_owned()), origin);
    match who {
        None => state.refusals.record(event, SURFACE, callback_reason(why)),
        Some(_) => state.audit.record_detached(event),
    }
}

/// Signs in the account `user_id` (`username`) the OpenID Provider vouched for, opening a
/// session of `lifetime`; the session's token, for the browser's cookie.
pub async fn with_provider(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    user_id: Uuid,
    username: &str,
    lifetime: Duration,
) -> sqlx::Result<String> {
    let token = session::open(state, user_id, origin, lifetime).await?;
    state.audit.record_detached(provider_event(
        Outcome::Success,
        Some(username),
        None,
        origin,
    ));
    Ok(token)
}

/// Ends the session `session_hash` of `actor`, on record.
pub async fn sign_out(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    actor: String,
    session_hash: &str,
) -> sqlx::Result<()> {
    db::sessions::delete_session(&state.db, session_hash).await?;
    let mut e = AuditEvent::new(EventKind::AdminLogout, Outcome::Success).from_origin(origin);
    e.admin_user = Some(actor);
    e.resource = Some("admin-ui".into());
    state.audit.record_detached(e);
    Ok(())
}
