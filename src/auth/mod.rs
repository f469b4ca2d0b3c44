//! Credentials: token signing keys, access-token JWTs, client secrets and client assertions.

pub mod cimd;
pub mod keys;
pub mod redirect;
pub mod secrets;
pub mod token;
