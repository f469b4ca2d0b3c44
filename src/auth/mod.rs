//! Credentials: token signing keys, access-token JWTs, client secrets and client assertions.

pub mod keys;
pub mod secrets;
pub mod token;
