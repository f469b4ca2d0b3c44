//! Helpers shared by the fuzz targets: scratch folders, fixed signing keys, and the text form
//! of a token to be signed at run time (so committed inputs never expire).

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::Value;

/// A folder of this process for files a target writes on every run; in memory where possible,
/// since the loaders under test read real files.
pub fn scratch(name: &str) -> PathBuf {
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("toolgate-fuzz-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the scratch folder");
    dir
}

/// Writes an executable script.
pub fn script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write a script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .expect("make a script executable");
}

pub fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// The signing keys a target may sign with.
pub struct Keys {
    pub ed: Ed25519KeyPair,
    /// Another Ed25519 key: its signatures must never verify.
    pub ed_other: Ed25519KeyPair,
    pub ec: EcdsaKeyPair,
    pub ec_public: Vec<u8>,
    rng: ring::rand::SystemRandom,
}

impl Keys {
    pub fn new() -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("generate a P-256 key");
        let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("read back the P-256 key");
        let ec_public = ec.public_key().as_ref().to_vec();
        Self {
            ed: Ed25519KeyPair::from_seed_unchecked(&[7; 32]).expect("a fixed Ed25519 seed"),
            ed_other: Ed25519KeyPair::from_seed_unchecked(&[8; 32]).expect("a fixed Ed25519 seed"),
            ec,
            ec_public,
            rng,
        }
    }

    pub fn ed_public(&self) -> Vec<u8> {
        self.ed.public_key().as_ref().to_vec()
    }

    /// The public JWK of the P-256 key (uncompressed point `04 || x || y`).
    pub fn ec_jwk(&self, kid: &str) -> Value {
        let (x, y) = self.ec_public[1..].split_at(32);
        serde_json::json!({
            "kty": "EC", "crv": "P-256", "alg": "ES256", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
        })
    }

    fn sign(&self, signer: &str, alg_is_ec: bool, input: &[u8]) -> Vec<u8> {
        match signer {
            "none" => Vec::new(),
            "other" => self.ed_other.sign(input).as_ref().to_vec(),
            "trunc" => self.ed.sign(input).as_ref()[..32].to_vec(),
            _ if alg_is_ec => self
                .ec
                .sign(&self.rng, input)
                .map(|s| s.as_ref().to_vec())
                .unwrap_or_default(),
            _ => self.ed.sign(input).as_ref().to_vec(),
        }
    }
}

impl Default for Keys {
    fn default() -> Self {
        Self::new()
    }
}

/// Turns `<header JSON>\n<payload JSON>[\n<signer>]` into a compact JWS signed now.
///
/// The header and payload are encoded byte for byte as given, except that a top-level payload
/// value `"now+N"` / `"now-N"` becomes the number of seconds since the epoch N from now, so a
/// committed input means the same thing on every replay. The signer is the right key for the
/// header's `alg` unless it says `other` (a key nobody trusts), `none` (no signature) or
/// `trunc` (half a signature).
pub fn signed(keys: &Keys, header: &str, payload: &str, signer: &str) -> String {
    let payload = match serde_json::from_str::<Value>(payload) {
        Ok(Value::Object(mut map)) => {
            let now = now();
            for v in map.values_mut() {
                if let Some(offset) = v
                    .as_str()
                    .and_then(|s| s.strip_prefix("now"))
                    .and_then(|s| s.strip_prefix('+').unwrap_or(s).parse::<i64>().ok())
                {
                    *v = Value::from(now.saturating_add(offset));
                }
            }
            Value::Object(map).to_string()
        }
        _ => payload.to_owned(),
    };
    let alg_is_ec = serde_json::from_str::<Value>(header)
        .ok()
        .and_then(|h| h.get("alg").and_then(Value::as_str).map(|a| a == "ES256"))
        .unwrap_or(false);
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let sig = keys.sign(signer, alg_is_ec, input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
}

/// The payload of a compact JWS, decoded without checking anything.
pub fn payload_of(jwt: &str) -> Option<Value> {
    let part = jwt.split('.').nth(1)?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).ok()?).ok()
}
