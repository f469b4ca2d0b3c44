//! Credentials: the values a tool needs to act for its caller (an agent's API token, a
//! person's), kept in PostgreSQL under envelope encryption and handed to a call only as the
//! slots its group declares (`x-toolgate-credentials`).
//!
//! Each value is encrypted under a data key of its own (AES-256-GCM, `ring`), and that data key
//! under a key-encryption key (KEK) given to the gateway from outside (`--credential-key`,
//! never in the database). Several KEKs may be given at once: the first wraps, all unwrap, so a
//! new key is rolled out by putting it first, running `toolgate secrets rotate-kek` (which
//! re-wraps the data keys, not the values) and then dropping the old one. Both layers are bound
//! to the slot (owner, group, name) as associated data: a database user who copies one agent's
//! ciphertext onto another agent's row gets a value that does not open, not a swapped identity.
//!
//! The request path reads the sealed rows from memory (re-read on every change, NOTIFY) and
//! opens only the slots of the call it serves.

pub mod exchange;
pub mod oauth;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use base64::Engine;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

/// Largest value accepted for one credential.
pub const MAX_VALUE_BYTES: usize = 16 * 1024;

/// Whose value fills a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Per {
    /// Each agent its own, set by an admin.
    Agent,
    /// Each person a host acts for their own.
    Person,
    /// One value for every caller.
    Shared,
}

impl Per {
    pub fn as_str(self) -> &'static str {
        match self {
            Per::Agent => "agent",
            Per::Person => "person",
            Per::Shared => "shared",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "agent" => Some(Per::Agent),
            "person" => Some(Per::Person),
            "shared" => Some(Per::Shared),
            _ => None,
        }
    }
}

/// One stored credential's place: whose (`owner`, empty for shared), for which group's slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct SlotKey {
    pub per: Per,
    pub owner: String,
    pub group: String,
    pub name: String,
}

impl SlotKey {
    /// What both encryption layers are bound to.
    fn aad(&self) -> Vec<u8> {
        let mut aad = b"toolgate-credential\0".to_vec();
        for part in [self.per.as_str(), &self.owner, &self.group, &self.name] {
            aad.extend_from_slice(part.as_bytes());
            aad.push(0);
        }
        aad
    }
}

/// A stored value, as the database holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub kek_id: String,
    pub wrapped_key: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed")
            .field("kek_id", &self.kek_id)
            .finish_non_exhaustive()
    }
}

/// Why a credential could not be sealed or opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error(
        "no credential key is configured (--credential-key or TOOLGATE_CREDENTIAL_KEYS): credentials cannot be stored or used"
    )]
    NoKey,
    #[error("the credential key `{0}` that wrapped this value is not configured")]
    UnknownKey(String),
    #[error("the stored value does not open: it was altered, or moved from another slot")]
    Corrupt,
    #[error("the system's random source or AES-GCM failed")]
    Crypto,
}

fn random<const N: usize>() -> Result<Zeroizing<[u8; N]>, CredentialError> {
    let mut bytes = Zeroizing::new([0u8; N]);
    SystemRandom::new()
        .fill(bytes.as_mut())
        .map_err(|_| CredentialError::Crypto)?;
    Ok(bytes)
}

/// The key-encryption keys, the first of which wraps.
pub struct KeyRing {
    keys: Vec<(String, LessSafeKey)>,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|(id, _)| id))
            .finish()
    }
}

impl KeyRing {
    /// Parses `<id>:<base64 of 32 bytes>` entries (a file's lines, or a list).
    pub fn parse<S: AsRef<str>>(specs: &[S]) -> Result<Self, String> {
        let mut keys: Vec<(String, LessSafeKey)> = Vec::new();
        for spec in specs {
            let spec = spec.as_ref().trim();
            if spec.is_empty() || spec.starts_with('#') {
                continue;
            }
            let (id, b64) = spec.split_once(':').ok_or_else(|| {
                "a credential key is `<id>:<base64 of 32 random bytes>` (make one with `toolgate secrets keygen`)".to_owned()
            })?;
            if id.is_empty()
                || id.len() > 64
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(format!(
                    "credential key id `{id}`: 1 to 64 letters, digits, `-` or `_`"
                ));
            }
            let bytes = Zeroizing::new(
                base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|_| format!("credential key `{id}` is not base64"))?,
            );
            let key = UnboundKey::new(&AES_256_GCM, &bytes)
                .map_err(|_| format!("credential key `{id}` must be 32 bytes"))?;
            if keys.iter().any(|(k, _)| k == id) {
                return Err(format!("credential key id `{id}` is given twice"));
            }
            keys.push((id.to_owned(), LessSafeKey::new(key)));
        }
        Ok(Self { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key that wraps new data keys.
    pub fn current(&self) -> Option<&str> {
        self.keys.first().map(|(id, _)| id.as_str())
    }

    fn key(&self, id: &str) -> Option<&LessSafeKey> {
        self.keys.iter().find(|(k, _)| k == id).map(|(_, key)| key)
    }

    /// A fresh `<id>:<base64>` key.
    pub fn generate(id: &str) -> Result<String, CredentialError> {
        let bytes = random::<32>()?;
        Ok(format!(
            "{id}:{}",
            base64::engine::general_purpose::STANDARD.encode(bytes.as_ref())
        ))
    }
}

/// `nonce || ciphertext || tag` of `plain` under `key`.
fn seal_with(key: &LessSafeKey, aad: &[u8], plain: &[u8]) -> Result<Vec<u8>, CredentialError> {
    let nonce = random::<NONCE_LEN>()?;
    let mut out = plain.to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(*nonce),
        Aad::from(aad),
        &mut out,
    )
    .map_err(|_| CredentialError::Crypto)?;
    let mut sealed = nonce.to_vec();
    sealed.extend_from_slice(&out);
    Ok(sealed)
}

fn open_with(key: &LessSafeKey, aad: &[u8], sealed: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
    if sealed.len() < NONCE_LEN {
        return None;
    }
    let (nonce, rest) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut buf = Zeroizing::new(rest.to_vec());
    let len = key
        .open_in_place(nonce, Aad::from(aad), buf.as_mut_slice())
        .ok()?
        .len();
    buf.truncate(len);
    Some(buf)
}

fn wrap_aad(slot: &SlotKey, kek_id: &str) -> Vec<u8> {
    let mut aad = slot.aad();
    aad.extend_from_slice(kek_id.as_bytes());
    aad
}

/// Encrypts `value` for `slot` under a new data key, wrapped by the current KEK.
pub fn seal(ring: &KeyRing, slot: &SlotKey, value: &[u8]) -> Result<Sealed, CredentialError> {
    let (kek_id, kek) = ring.keys.first().ok_or(CredentialError::NoKey)?;
    let dek_bytes = random::<32>()?;
    let dek = LessSafeKey::new(
        UnboundKey::new(&AES_256_GCM, dek_bytes.as_ref()).map_err(|_| CredentialError::Crypto)?,
    );
    Ok(Sealed {
        kek_id: kek_id.clone(),
        wrapped_key: seal_with(kek, &wrap_aad(slot, kek_id), dek_bytes.as_ref())?,
        ciphertext: seal_with(&dek, &slot.aad(), value)?,
    })
}

fn data_key(
    ring: &KeyRing,
    slot: &SlotKey,
    sealed: &Sealed,
) -> Result<Zeroizing<Vec<u8>>, CredentialError> {
    let kek = ring
        .key(&sealed.kek_id)
        .ok_or_else(|| CredentialError::UnknownKey(sealed.kek_id.clone()))?;
    open_with(kek, &wrap_aad(slot, &sealed.kek_id), &sealed.wrapped_key)
        .ok_or(CredentialError::Corrupt)
}

/// The value `sealed` holds for `slot`.
pub fn open(
    ring: &KeyRing,
    slot: &SlotKey,
    sealed: &Sealed,
) -> Result<Zeroizing<Vec<u8>>, CredentialError> {
    let dek_bytes = data_key(ring, slot, sealed)?;
    let dek = LessSafeKey::new(
        UnboundKey::new(&AES_256_GCM, &dek_bytes).map_err(|_| CredentialError::Corrupt)?,
    );
    open_with(&dek, &slot.aad(), &sealed.ciphertext).ok_or(CredentialError::Corrupt)
}

/// `sealed` with its data key wrapped by the current KEK (the value's ciphertext unchanged);
/// `None` when it already is.
pub fn rewrap(
    ring: &KeyRing,
    slot: &SlotKey,
    sealed: &Sealed,
) -> Result<Option<Sealed>, CredentialError> {
    let (kek_id, kek) = ring.keys.first().ok_or(CredentialError::NoKey)?;
    if &sealed.kek_id == kek_id {
        return Ok(None);
    }
    let dek_bytes = data_key(ring, slot, sealed)?;
    Ok(Some(Sealed {
        kek_id: kek_id.clone(),
        wrapped_key: seal_with(kek, &wrap_aad(slot, kek_id), &dek_bytes)?,
        ciphertext: sealed.ciphertext.clone(),
    }))
}

/// A slot's value opened for one call: wiped from memory when dropped.
pub type Opened = (SlotKey, Zeroizing<Vec<u8>>);

/// The sealed credentials every call may need, in memory, and the keys that open them.
pub struct CredentialStore {
    ring: Arc<KeyRing>,
    sealed: ArcSwap<HashMap<SlotKey, Sealed>>,
    /// When each slot's last use was last written (bounded by the stored slots).
    touched: std::sync::Mutex<HashMap<SlotKey, std::time::Instant>>,
}

impl fmt::Debug for CredentialStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialStore")
            .field("keys", &self.ring)
            .field("stored", &self.sealed.load().len())
            .finish()
    }
}

impl CredentialStore {
    pub fn new(ring: Arc<KeyRing>) -> Self {
        Self {
            ring,
            sealed: ArcSwap::from_pointee(HashMap::new()),
            touched: Default::default(),
        }
    }

    pub fn ring(&self) -> &KeyRing {
        &self.ring
    }

    /// Replaces what is held with what the database holds now.
    pub fn replace(&self, rows: HashMap<SlotKey, Sealed>) {
        let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
        touched.retain(|k, _| rows.contains_key(k));
        self.sealed.store(Arc::new(rows));
    }

    /// Whether a value is stored for `slot` (it is not opened).
    pub fn has(&self, slot: &SlotKey) -> bool {
        self.sealed.load().contains_key(slot)
    }

    /// Whether `slot`'s last use is due to be written (once a minute at most).
    pub fn due_for_touch(&self, slot: &SlotKey) -> bool {
        let now = std::time::Instant::now();
        let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
        match touched.get(slot) {
            Some(t) if now.duration_since(*t) < std::time::Duration::from_secs(60) => false,
            _ if !self.sealed.load().contains_key(slot) => false,
            _ => {
                touched.insert(slot.clone(), now);
                true
            }
        }
    }

    /// The value stored for `slot`: `Ok(None)` when there is none.
    pub fn value(&self, slot: &SlotKey) -> Result<Option<Zeroizing<Vec<u8>>>, CredentialError> {
        match self.sealed.load().get(slot) {
            None => Ok(None),
            Some(sealed) => open(&self.ring, slot, sealed).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(ids: &[&str]) -> KeyRing {
        let specs: Vec<String> = ids
            .iter()
            .map(|id| KeyRing::generate(id).unwrap())
            .collect();
        KeyRing::parse(&specs).unwrap()
    }

    fn slot(owner: &str) -> SlotKey {
        SlotKey {
            per: Per::Agent,
            owner: owner.into(),
            group: "github".into(),
            name: "GITHUB_TOKEN".into(),
        }
    }

    #[test]
    fn a_value_opens_for_its_slot_only() {
        let r = ring(&["k1"]);
        let sealed = seal(&r, &slot("a"), b"ghp_secret").unwrap();
        assert_eq!(
            open(&r, &slot("a"), &sealed).unwrap().as_slice(),
            b"ghp_secret"
        );
        assert!(!sealed.ciphertext.windows(10).any(|w| w == b"ghp_secret"));
        // Copied onto another agent's row, it does not open.
        assert_eq!(open(&r, &slot("b"), &sealed), Err(CredentialError::Corrupt));
        let mut flipped = sealed.clone();
        flipped.ciphertext[20] ^= 1;
        assert_eq!(
            open(&r, &slot("a"), &flipped),
            Err(CredentialError::Corrupt)
        );
    }

    #[test]
    fn rotation_rewraps_the_data_key_and_old_keys_still_open_until_then() {
        let old = KeyRing::generate("old").unwrap();
        let new = KeyRing::generate("new").unwrap();
        let before = KeyRing::parse(std::slice::from_ref(&old)).unwrap();
        let sealed = seal(&before, &slot("a"), b"v").unwrap();
        let both = KeyRing::parse(&[new.clone(), old]).unwrap();
        assert_eq!(open(&both, &slot("a"), &sealed).unwrap().as_slice(), b"v");
        let rewrapped = rewrap(&both, &slot("a"), &sealed).unwrap().unwrap();
        assert_eq!(rewrapped.kek_id, "new");
        assert_eq!(rewrapped.ciphertext, sealed.ciphertext);
        assert_eq!(rewrap(&both, &slot("a"), &rewrapped).unwrap(), None);
        let only_new = KeyRing::parse(&[new]).unwrap();
        assert_eq!(
            open(&only_new, &slot("a"), &rewrapped).unwrap().as_slice(),
            b"v"
        );
        assert_eq!(
            open(&only_new, &slot("a"), &sealed),
            Err(CredentialError::UnknownKey("old".into()))
        );
    }

    #[test]
    fn bad_keys_are_refused_with_the_reason() {
        assert!(KeyRing::parse(&["nokey"]).unwrap_err().contains("<id>:"));
        assert!(
            KeyRing::parse(&["k:AAAA"])
                .unwrap_err()
                .contains("32 bytes")
        );
        let k = KeyRing::generate("k").unwrap();
        assert!(
            KeyRing::parse(&[k.clone(), k])
                .unwrap_err()
                .contains("twice")
        );
        assert!(seal(&KeyRing::parse::<&str>(&[]).unwrap(), &slot("a"), b"v").is_err());
    }
}
