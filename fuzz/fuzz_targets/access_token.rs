//! Access-token verification (`auth::token::verify`): raw tokens, and tokens built from a
//! fuzzed header and payload and signed at run time with the gateway's key, so the claim
//! checks behind the signature are reached too.
//!
//! Input: one line is a raw token; `<header JSON>\n<payload JSON>[\n<signer>]` is signed (see
//! `toolgate_fuzz::signed`). Invariant beyond "no panic": an accepted token is signed by the
//! trusted key, is EdDSA `at+jwt`, names our issuer and audience, has not expired, is
//! already valid (`nbf`, `iat`), is not revoked and belongs to a live client of its agent.

#![no_main]

use std::sync::{Arc, LazyLock};

use libfuzzer_sys::fuzz_target;
use toolgate::auth::token::{ACCESS_TOKEN_LEEWAY_SECS, Expected, TOKEN_TYPE, verify};
use toolgate::policy::snapshot::{ClientRecord, PolicySnapshot, PolicyState, VerifyKey};
use toolgate_fuzz::{Keys, now, signed};

const ISSUER: &str = "http://127.0.0.1:8080";
const AUDIENCE: &str = "http://127.0.0.1:8080/mcp";
const EXPECTED: Expected<'static> = Expected {
    issuer: ISSUER,
    audience: AUDIENCE,
    leeway_secs: ACCESS_TOKEN_LEEWAY_SECS,
};
const REVOKED: &str = "0190c4a8-0000-7000-8000-000000000001";

struct Fixture {
    keys: Keys,
    snapshot: PolicySnapshot,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let keys = Keys::new();
    let state = PolicyState {
        agents: Vec::new(),
        clients: vec![ClientRecord {
            client_id: "c1".into(),
            agent: "a1".into(),
        }],
        revoked: vec![REVOKED.parse().unwrap()],
        keys: vec![VerifyKey {
            kid: "k1".into(),
            public_key: keys.ed_public(),
        }],
        ..PolicyState::default()
    };
    let snapshot = PolicySnapshot::build(Arc::default(), &state);
    Fixture { keys, snapshot }
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let f = &*FIXTURE;
    let mut lines = text.splitn(3, '\n');
    let first = lines.next().unwrap_or_default();
    let (token, trusted_signature) = match lines.next() {
        None => (first.to_owned(), false),
        Some(payload) => {
            let signer = lines.next().unwrap_or_default();
            let trusted = !matches!(signer, "other" | "none" | "trunc");
            (signed(&f.keys, first, payload, signer), trusted)
        }
    };
    let Ok((principal, claims)) = verify(&token, &f.snapshot, &EXPECTED) else {
        return;
    };
    assert!(
        trusted_signature,
        "accepted a token the trusted key did not sign: {token}"
    );
    let header = jsonwebtoken::decode_header(&token).expect("an accepted token has a header");
    assert_eq!(header.alg, jsonwebtoken::Algorithm::EdDSA);
    assert!(header.typ.as_deref().is_some_and(
        |t| t.eq_ignore_ascii_case(TOKEN_TYPE) || t.eq_ignore_ascii_case("application/at+jwt")
    ));
    assert_eq!(claims.iss, ISSUER);
    assert_eq!(claims.aud, AUDIENCE);
    let (t, leeway) = (now(), ACCESS_TOKEN_LEEWAY_SECS as i64);
    assert!(
        claims.exp >= t - leeway,
        "accepted an expired token: {claims:?}"
    );
    assert!(
        claims.iat <= t + leeway,
        "accepted a token issued in the future: {claims:?}"
    );
    let payload = toolgate_fuzz::payload_of(&token).expect("an accepted token has a payload");
    if let Some(nbf) = payload.get("nbf").and_then(serde_json::Value::as_f64) {
        assert!(
            nbf as i64 <= t + leeway,
            "accepted a token not yet valid: {payload}"
        );
    }
    assert_ne!(
        principal.jti,
        Some(REVOKED.parse().unwrap()),
        "accepted a revoked token"
    );
    assert_eq!(
        (claims.sub.as_str(), claims.client_id.as_str()),
        ("a1", "c1")
    );
    assert_eq!(principal.agent, "a1");
    assert_eq!(principal.client_id, "c1");
});
