//! Client secrets: random, shown once, stored as argon2 hashes.
//!
//! Verifying one costs the hash's memory (19 MiB with the crate's recommended parameters), and
//! anyone on the network can ask for a verification by sending a wrong secret. Two things keep
//! that bounded: at most [`CONCURRENT_VERIFICATIONS`] run at once, and they run in buffers
//! allocated once and reused, so the allocator never gets the chance to keep freed 19 MiB
//! blocks per thread (glibc raises its mmap threshold after the first free and then serves
//! such blocks from per-thread arenas it does not return).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

use argon2::password_hash::{Output, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Argon2 verifications running at once in this process; each holds one memory buffer.
pub const CONCURRENT_VERIFICATIONS: usize = 2;
/// How long a check waits for a free verification before it is answered "busy" (503).
pub const VERIFY_WAIT: Duration = Duration::from_secs(2);
/// Checks allowed to wait at once; beyond, "busy" comes at once, so a flood cannot queue up.
const MAX_WAITING: usize = 64;
/// Largest argon2 memory cost (KiB) a stored hash may ask for: the buffers grow to fit the
/// hashes actually stored, never to what a corrupted row claims.
const MAX_MEMORY_KIB: u32 = 64 * 1024;

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

/// Hashes a secret or password (argon2id, the crate's recommended parameters), in a pooled
/// buffer like a verification: the crate's own `hash_password` allocates its 19 MiB of working
/// memory anew each time, and the allocator kept those buffers, one per thread that hashed,
/// so that creating a thousand clients grew the gateway by hundreds of megabytes.
pub fn hash(secret: &str) -> anyhow::Result<String> {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    let argon2 = Argon2::default();
    let params = argon2.params().clone();
    let mut salt_buf = [0u8; 64];
    let salt_bytes = salt
        .as_salt()
        .decode_b64(&mut salt_buf)
        .map_err(|e| anyhow::anyhow!("hashing failed: {e}"))?;
    let mut out = vec![0u8; params.output_len().unwrap_or(Params::DEFAULT_OUTPUT_LEN)];
    {
        let mut lease = lease();
        let blocks = lease
            .0
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("hashing failed: no buffer"))?;
        if blocks.len() < params.block_count() {
            blocks.resize(params.block_count(), Block::default());
        }
        argon2
            .hash_password_into_with_memory(
                secret.as_bytes(),
                salt_bytes,
                &mut out,
                &mut blocks[..params.block_count()],
            )
            .map_err(|e| anyhow::anyhow!("hashing failed: {e}"))?;
    }
    let phc = PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::default().into()),
        params: (&params)
            .try_into()
            .map_err(|e| anyhow::anyhow!("hashing failed: {e}"))?,
        salt: Some(salt.as_salt()),
        hash: Some(Output::new(&out).map_err(|e| anyhow::anyhow!("hashing failed: {e}"))?),
    };
    Ok(phc.to_string())
}

/// The argon2 working memory, allocated on first use and then only lent out.
struct Buffers {
    free: Mutex<Vec<Vec<Block>>>,
    returned: Condvar,
}

static BUFFERS: LazyLock<Buffers> = LazyLock::new(|| Buffers {
    free: Mutex::new((0..CONCURRENT_VERIFICATIONS).map(|_| Vec::new()).collect()),
    returned: Condvar::new(),
});

/// A borrowed buffer; goes back to the pool even if hashing panics, emptied: its 19 MiB are
/// freed after each use, and [`crate::memory::return_large_allocations`] makes the allocator give them
/// back to the system, so that a gateway that checked a secret once does not keep 38 MiB
/// for the rest of its life. The pool still bounds how many exist at once.
struct Lease(Option<Vec<Block>>);

impl Drop for Lease {
    fn drop(&mut self) {
        if self.0.take().is_some() {
            BUFFERS
                .free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Vec::new());
            BUFFERS.returned.notify_one();
        }
    }
}

fn lease() -> Lease {
    let mut free = BUFFERS.free.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(b) = free.pop() {
            return Lease(Some(b));
        }
        free = BUFFERS
            .returned
            .wait(free)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// Recomputes `phc`'s hash of `secret` in a pooled buffer; blocks while every buffer is lent.
fn verify_pooled(secret: &[u8], phc: &str) -> bool {
    let Ok(parsed) = PasswordHash::new(phc) else {
        return false;
    };
    let (Ok(algorithm), Ok(params)) = (
        Algorithm::try_from(parsed.algorithm),
        Params::try_from(&parsed),
    ) else {
        return false;
    };
    let version = match parsed.version.map(Version::try_from) {
        None => Version::default(),
        Some(Ok(v)) => v,
        Some(Err(_)) => return false,
    };
    let (Some(salt), Some(expected)) = (parsed.salt, parsed.hash) else {
        return false;
    };
    if params.m_cost() > MAX_MEMORY_KIB {
        return false;
    }
    let mut salt_buf = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_buf) else {
        return false;
    };
    let blocks_needed = params.block_count();
    let argon2 = Argon2::new(algorithm, version, params);
    let mut out = vec![0u8; expected.len()];
    let mut lease = lease();
    let Some(blocks) = lease.0.as_mut() else {
        return false;
    };
    if blocks.len() < blocks_needed {
        blocks.resize(blocks_needed, Block::default());
    }
    if argon2
        .hash_password_into_with_memory(secret, salt, &mut out, &mut blocks[..blocks_needed])
        .is_err()
    {
        return false;
    }
    drop(lease);
    // `Output`'s equality is constant-time.
    Output::new(&out).is_ok_and(|o| o == expected)
}

/// Verifies a secret against a stored hash, blocking the thread. With no hash (unknown client
/// or user) a dummy hash is checked anyway, so that timing does not reveal which exist.
pub fn verify(secret: &str, stored: Option<&str>) -> bool {
    static DUMMY: LazyLock<String> =
        LazyLock::new(|| hash("dummy secret for unknown clients").unwrap_or_default());
    match stored {
        Some(h) => verify_pooled(secret.as_bytes(), h),
        None => {
            verify_pooled(secret.as_bytes(), &DUMMY);
            false
        }
    }
}

/// No verification could start within [`VERIFY_WAIT`]: the caller answers 503, not 401.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("too many secret verifications at once")]
pub struct Busy;

/// The bounded, asynchronous front of [`verify`] for network-facing checks.
pub struct Verifier {
    permits: tokio::sync::Semaphore,
    waiting: AtomicUsize,
    /// Moving average of a real verification, in microseconds (0 until the first one).
    typical_micros: AtomicU64,
    hashed: AtomicU64,
    running: AtomicUsize,
    most_running: AtomicUsize,
}

/// One per process: the memory bound is the process's.
pub static VERIFIER: LazyLock<Verifier> = LazyLock::new(|| Verifier {
    permits: tokio::sync::Semaphore::new(CONCURRENT_VERIFICATIONS),
    waiting: AtomicUsize::new(0),
    typical_micros: AtomicU64::new(0),
    hashed: AtomicU64::new(0),
    running: AtomicUsize::new(0),
    most_running: AtomicUsize::new(0),
});

/// What the verifier did so far, to show the bounds hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifierStats {
    /// Real argon2 verifications made.
    pub hashed: u64,
    /// The most checks (real or stand-in) that ever held a slot at once.
    pub most_running: usize,
}

/// Undoes a count however the counted part ends (the request may be dropped midway).
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Verifier {
    /// Checks `secret` against `stored` (`None`: no such client). An unknown client takes a
    /// verification slot and as long as a real verification typically takes, without hashing:
    /// neither the answer nor its timing tells it from a wrong secret, and it costs no memory.
    pub async fn check(&self, secret: String, stored: Option<String>) -> Result<bool, Busy> {
        let waiting = Counted(&self.waiting);
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING {
            return Err(Busy);
        }
        let permit = tokio::time::timeout(VERIFY_WAIT, self.permits.acquire())
            .await
            .map_err(|_| Busy)?
            .map_err(|_| Busy)?;
        drop(waiting);
        let running = Counted(&self.running);
        let now_running = self.running.fetch_add(1, Ordering::AcqRel) + 1;
        self.most_running.fetch_max(now_running, Ordering::AcqRel);
        let typical = self.typical_micros.load(Ordering::Relaxed);
        let result = if stored.is_none() && typical > 0 {
            tokio::time::sleep(Duration::from_micros(typical)).await;
            false
        } else {
            // Until a first real verification was timed, an unknown client gets a real
            // (dummy) one, which gives the first measurement.
            let started = Instant::now();
            self.hashed.fetch_add(1, Ordering::Relaxed);
            let ok = tokio::task::spawn_blocking(move || verify(&secret, stored.as_deref()))
                .await
                .unwrap_or(false);
            self.observe(started.elapsed());
            ok
        };
        drop(running);
        drop(permit);
        Ok(result)
    }

    pub fn stats(&self) -> VerifierStats {
        VerifierStats {
            hashed: self.hashed.load(Ordering::Relaxed),
            most_running: self.most_running.load(Ordering::Relaxed),
        }
    }

    fn observe(&self, took: Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        // Races between two updates lose one sample at worst.
        let old = self.typical_micros.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.typical_micros.store(new, Ordering::Relaxed);
    }
}

/// 256 random bits, URL-safe.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

pub fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Compares digests, so that the time taken does not depend on where the strings differ.
pub fn same_token(a: &str, b: &str) -> bool {
    !a.is_empty() && Sha256::digest(a.as_bytes()) == Sha256::digest(b.as_bytes())
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
        assert!(!verify(&secret, Some("not a hash")));
    }

    /// A hash made in a pooled buffer is the crate's own PHC string: the crate's verifier
    /// accepts it, and ours accepts one the crate made (hashes stored before this change).
    #[test]
    fn the_pooled_hash_is_the_crates_own_format_both_ways() {
        use argon2::password_hash::{PasswordHasher, PasswordVerifier};
        let ours = hash("s3cret").unwrap();
        assert!(
            ours.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{ours}"
        );
        let parsed = PasswordHash::new(&ours).unwrap();
        assert!(
            Argon2::default()
                .verify_password(b"s3cret", &parsed)
                .is_ok()
        );
        assert!(
            Argon2::default()
                .verify_password(b"other", &parsed)
                .is_err()
        );
        let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
        let theirs = Argon2::default()
            .hash_password(b"s3cret", &salt)
            .unwrap()
            .to_string();
        assert!(verify("s3cret", Some(&theirs)));
        assert!(!verify("other", Some(&theirs)));
        // Two hashes of one secret differ by their salt.
        assert_ne!(hash("s3cret").unwrap(), ours);
    }

    /// Hashing and verifying give their working memory back: the process's resident memory
    /// after a few of each is what it was, not 19 MiB a buffer more.
    #[test]
    fn hashing_keeps_no_working_memory() {
        crate::memory::return_large_allocations();
        let rss = || {
            std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
                .unwrap()
        };
        let h = hash("warm").unwrap();
        let before = rss();
        std::thread::scope(|s| {
            for _ in 0..CONCURRENT_VERIFICATIONS {
                s.spawn(|| {
                    for _ in 0..3 {
                        assert!(verify("warm", Some(&h)));
                        hash("again").unwrap();
                    }
                });
            }
        });
        let grew = rss().saturating_sub(before);
        assert!(grew < 8 * 1024, "resident memory grew by {grew} KiB");
    }

    #[tokio::test]
    async fn the_bounded_verifier_agrees_with_the_hash() {
        let (_, secret) = new_client_credentials();
        let h = hash(&secret).unwrap();
        assert_eq!(
            VERIFIER.check(secret.clone(), Some(h.clone())).await,
            Ok(true)
        );
        assert_eq!(VERIFIER.check("wrong".into(), Some(h)).await, Ok(false));
        assert_eq!(VERIFIER.check(secret, None).await, Ok(false));
    }
}
