//! `private_key_jwt` client assertions (`auth::client::assertion_client_id` and
//! `auth::client::check_assertion`, the checks `/oauth/token` runs around its client lookup).
//!
//! Input: `<form client_id, or ->\n<raw assertion>`, or
//! `<form client_id>\n<header JSON>\n<payload JSON>[\n<signer>[\n<JWKS JSON>]]`, signed at
//! run time (see `toolgate_fuzz::signed`) and checked against the client's registered JWKS
//! (an Ed25519 and a P-256 key) or, when given, the fuzzed JWKS. Invariant beyond "no panic":
//! an accepted assertion is signed by a registered key, has `iss` = `sub` = the client, our
//! audience, a `jti` that can be stored (bounded, no NUL), no `nbf` or `iat` in the future,
//! and an `exp` that is neither past nor more than the maximum lifetime ahead; a client id
//! that reaches the lookup is no longer than a stored one.

#![no_main]

use std::sync::LazyLock;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use toolgate::auth::token::CLOCK_LEEWAY_SECS;
use toolgate::auth::client::{MAX_ASSERTION_LIFETIME_SECS, assertion_client_id, check_assertion};
use toolgate_fuzz::{Keys, now, signed};

const ISSUER: &str = "http://127.0.0.1:8080";
const CLIENT: &str = "c1";

struct Fixture {
    keys: Keys,
    jwks: Value,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let keys = Keys::new();
    let ed = json!({
        "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "kid": "ed",
        "x": URL_SAFE_NO_PAD.encode(keys.ed_public()),
    });
    let jwks = json!({"keys": [ed, keys.ec_jwk("ec")]});
    Fixture { keys, jwks }
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let f = &*FIXTURE;
    let mut lines = text.splitn(5, '\n');
    let form_client_id = lines.next().filter(|l| *l != "-");
    let Some(first) = lines.next() else {
        return;
    };
    let (assertion, trusted_signature, jwks) = match lines.next() {
        None => (first.to_owned(), false, None),
        Some(payload) => {
            let signer = lines.next().unwrap_or_default();
            let jwks = lines
                .next()
                .and_then(|j| serde_json::from_str::<Value>(j).ok());
            let trusted = !matches!(signer, "other" | "none" | "trunc") && jwks.is_none();
            (signed(&f.keys, first, payload, signer), trusted, jwks)
        }
    };
    let Some(client_id) = assertion_client_id(&assertion, form_client_id) else {
        return;
    };
    assert!(
        client_id.len() <= toolgate::db::assertions::MAX_CLIENT_ID,
        "a client id longer than is stored reached the lookup"
    );
    if let Some(form) = form_client_id {
        assert_eq!(
            form, client_id,
            "the assertion's sub and client_id disagree"
        );
    }
    // The registered client is `c1`; any other id finds no client (and so no JWKS), unless
    // the input brings its own.
    let registered = (client_id == CLIENT).then_some(&f.jwks);
    let Some(verified) =
        check_assertion(&assertion, &client_id, jwks.as_ref().or(registered), ISSUER)
    else {
        return;
    };
    if jwks.is_none() {
        assert!(
            trusted_signature,
            "accepted an assertion no registered key signed: {assertion}"
        );
        assert_eq!(client_id, CLIENT);
    }
    let claims = &verified.claims;
    assert_eq!(claims["iss"].as_str(), Some(client_id.as_str()));
    assert_eq!(claims["sub"].as_str(), Some(client_id.as_str()));
    let audience_ok = |a: &Value| {
        a.as_str()
            .is_some_and(|a| a == ISSUER || a == format!("{ISSUER}/oauth/token"))
    };
    let aud_ok = match &claims["aud"] {
        Value::Array(list) => list.iter().any(audience_ok),
        a => audience_ok(a),
    };
    assert!(
        aud_ok,
        "accepted an assertion for another audience: {claims}"
    );
    let t = now();
    let leeway = CLOCK_LEEWAY_SECS as i64;
    assert!(
        verified.exp >= t - leeway,
        "accepted an expired assertion: {claims}"
    );
    for claim in ["nbf", "iat"] {
        if let Some(at) = claims.get(claim).and_then(Value::as_f64) {
            assert!(
                at as i64 <= t + leeway,
                "accepted an assertion with {claim} ahead: {claims}"
            );
        }
    }
    assert!(
        verified.exp - t <= MAX_ASSERTION_LIFETIME_SECS,
        "accepted an assertion living too long: {claims}"
    );
    assert_eq!(claims["jti"].as_str(), Some(verified.jti.as_str()));
    // The id goes into Postgres as it is: bounded, and without the NUL it refuses.
    assert!(
        !verified.jti.is_empty()
            && verified.jti.len() <= toolgate::db::assertions::MAX_JTI
            && !verified.jti.contains('\0'),
        "accepted a jti that cannot be recorded: {claims}"
    );
});
