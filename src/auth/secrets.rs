//! Client secrets: random, shown once, stored as argon2 hashes.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;

/// A new client id (`tgc_…`) and secret (`tgs_…`, 256 random bits).
pub fn new_client_credentials() -> (String, String) {
    let mut id = [0u8; 12];
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut id);
    rand::rngs::OsRng.fill_bytes(&mut secret);
    (
        format!("tgc_{}", URL_SAFE_NO_PAD.encode(id)),
        format!("tgs_{}", URL_SAFE_NO_PAD.encode(secret)),
    )
}

/// Hashes a secret or password (argon2id, the crate's recommended parameters).
pub fn hash(secret: &str) -> anyhow::Result<String> {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| anyhow::anyhow!("hashing failed: {e}"))
}

/// Verifies a secret against a stored hash. With no hash (unknown client) a dummy hash is
/// checked anyway, so that timing does not reveal which client ids exist.
pub fn verify(secret: &str, stored: Option<&str>) -> bool {
    static DUMMY: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| hash("dummy secret for unknown clients").unwrap_or_default());
    let (hash, known) = match stored {
        Some(h) => (h, true),
        None => (DUMMY.as_str(), false),
    };
    let Ok(parsed) = PasswordHash::new(hash) else {
        return false;
    };
    let ok = Argon2::default()
        .verify_password(secret.as_bytes(), &parsed)
        .is_ok();
    ok && known
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_verifies_against_its_hash_only() {
        let (_, secret) = new_client_credentials();
        let h = hash(&secret).unwrap();
        assert!(verify(&secret, Some(&h)));
        assert!(!verify("wrong", Some(&h)));
        assert!(!verify(&secret, None));
    }
}
