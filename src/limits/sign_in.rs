//! Sign-in attempts, counted in Postgres so that every instance counts together.
//!
//! Every attempt counts, right or wrong, as a person signs in a handful of times a day. The
//! source is charged first and, when it is refused, the account is not: one address cannot
//! spend someone's budget (or add rows) faster than its own allows. IPv6 counts per /64.

use std::net::IpAddr;
use std::time::Duration;

use sqlx::PgPool;

use crate::db;

/// Sign-in attempts per client IP, then one more every 6 s.
pub const SIGN_IN_PER_IP: (u32, Duration) = (10, Duration::from_secs(6));
/// Sign-in attempts per username, then one more every 12 s.
pub const SIGN_IN_PER_USER: (u32, Duration) = (5, Duration::from_secs(12));
/// Only this much of a username is a throttle key (as much as an account name may hold).
const MAX_USER_KEY: usize = 64;

/// Takes one sign-in attempt from `source` (and for `account`, when one is named); the wait
/// before the next when either budget is spent.
pub(super) async fn charge(
    db: &PgPool,
    source: IpAddr,
    account: Option<&str>,
) -> sqlx::Result<Result<(), Duration>> {
    let (burst, every) = SIGN_IN_PER_IP;
    if let Err(wait) = db::signin::charge(db, &source_key(source), every, burst).await? {
        return Ok(Err(wait));
    }
    let Some(account) = account else {
        return Ok(Ok(()));
    };
    let (burst, every) = SIGN_IN_PER_USER;
    db::signin::charge(db, &user_key(account), every, burst).await
}

/// The stored key of a source address (a /64 for IPv6).
fn source_key(source: IpAddr) -> String {
    format!("ip:{}", super::source_key(source))
}

/// The stored key of a username: case folded, bounded, without the NUL Postgres refuses.
fn user_key(username: &str) -> String {
    let name: String = username
        .to_lowercase()
        .chars()
        .map(|c| {
            if c == '\0' {
                char::REPLACEMENT_CHARACTER
            } else {
                c
            }
        })
        .take(MAX_USER_KEY)
        .collect();
    let key = format!("user:{name}");
    debug_assert!(key.chars().count() <= db::signin::MAX_KEY);
    key
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_username_key_is_bounded_and_storable() {
        let key = super::user_key(&format!("ADA\0{}", "x".repeat(500)));
        assert!(key.starts_with("user:ada\u{fffd}x"));
        assert_eq!(key.chars().count(), "user:".len() + super::MAX_USER_KEY);
        assert!(!key.contains('\0'));
    }
}
