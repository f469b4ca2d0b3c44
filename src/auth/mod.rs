//! Credentials and their checks: token signing keys, access-token JWTs, client secrets and
//! client assertions; and every check of a credential a request presents (the admin token, a
//! bearer token, an OAuth client, a sign-in, a session), each with its audit record and its
//! limit, so that a surface only translates the verdict into its own answer.

pub mod admin;
pub mod authorize;
pub mod bearer;
pub mod cimd;
pub mod client;
pub mod keys;
pub mod redirect;
pub mod scope;
pub mod secrets;
pub mod session;
pub mod signin;
pub mod token;

use std::net::IpAddr;

use crate::audit::RequestOrigin;

/// The source address of a request, as the limits count it; `None` when it is not known.
pub fn source_of(origin: Option<&RequestOrigin>) -> Option<IpAddr> {
    origin
        .and_then(|o| o.remote_addr.as_deref())
        .and_then(|a| a.parse().ok())
}
