//! Sessions of the admin UI: 256 random bits in the browser's cookie, only their sha256 in
//! Postgres (with the session's CSRF token), so a copy of the table signs no one in.

use std::time::Duration;

use uuid::Uuid;

use super::secrets::{random_token, sha256_hex};
use crate::audit::RequestOrigin;
use crate::db;
use crate::db::sessions::SessionRecord;
use crate::state::AppState;

/// The live session a browser's cookie `token` holds, if any: one unused for `idle` has ended.
/// The session's hash comes with it, as what names it from then on.
pub async fn find(
    state: &AppState,
    token: &str,
    idle: Duration,
) -> sqlx::Result<Option<(SessionRecord, String)>> {
    let hash = sha256_hex(token);
    Ok(db::sessions::session(&state.db, &hash, idle)
        .await?
        .map(|record| (record, hash)))
}

/// Opens a session of `lifetime` for `user_id` (checked and signed in by the caller); the
/// token the browser keeps.
pub(super) async fn open(
    state: &AppState,
    user_id: Uuid,
    origin: Option<&RequestOrigin>,
    lifetime: Duration,
) -> sqlx::Result<String> {
    let token = random_token();
    let expires = chrono::Utc::now()
        + chrono::Duration::from_std(lifetime).unwrap_or(chrono::Duration::hours(12));
    db::sessions::create_session(
        &state.db,
        &sha256_hex(&token),
        user_id,
        &random_token(),
        expires,
        origin.and_then(|o| o.remote_addr.as_deref()),
        origin.and_then(|o| o.user_agent.as_deref()),
    )
    .await?;
    Ok(token)
}
