//! Ed25519 signing keys and their JWK form.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::KeyPair;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A freshly generated key pair.
pub struct GeneratedKey {
    pub kid: String,
    pub private_pkcs8: Vec<u8>,
    pub public_key: Vec<u8>,
}

/// Generates an Ed25519 key; its `kid` is the RFC 7638 JWK thumbprint.
pub fn generate() -> anyhow::Result<GeneratedKey> {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
        .map_err(|_| anyhow::anyhow!("generating an Ed25519 key failed"))?;
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
        .map_err(|_| anyhow::anyhow!("reading back the Ed25519 key failed"))?;
    let public_key = pair.public_key().as_ref().to_vec();
    Ok(GeneratedKey {
        kid: thumbprint(&public_key),
        private_pkcs8: pkcs8.as_ref().to_vec(),
        public_key,
    })
}

/// RFC 7638 thumbprint of an Ed25519 public key.
pub fn thumbprint(public_key: &[u8]) -> String {
    let canonical = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(public_key)
    );
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}

/// The public JWK of a key.
pub fn jwk(kid: &str, public_key: &[u8]) -> Value {
    json!({
        "kty": "OKP",
        "crv": "Ed25519",
        "alg": "EdDSA",
        "use": "sig",
        "kid": kid,
        "x": URL_SAFE_NO_PAD.encode(public_key),
    })
}
