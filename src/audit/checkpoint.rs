//! Signed checkpoints: snapshots of every chain head, signed with an Ed25519 key that is
//! never stored in Postgres.
//!
//! Whoever can write the database can re-hash a chain after editing it and rewrite the
//! heads to match; they cannot sign. A verifier that holds only the public key checks that
//! every row a checkpoint names still carries the signed hash, so an edit made after a
//! checkpoint, however carefully re-chained, is found.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use chrono::{DateTime, Utc};
use ring::signature::{self, Ed25519KeyPair, KeyPair};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use super::chain::{ChainHead, Expectations};

/// A checkpoint as stored and exported: the signed bytes and their signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedCheckpoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    pub at: DateTime<Utc>,
    pub key_id: String,
    /// Canonical JSON of a [`CheckpointBody`]: these exact bytes are signed.
    pub body: String,
    /// Ed25519 signature over `body`, hex.
    pub signature: String,
}

/// What a checkpoint attests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointBody {
    pub format: String,
    pub at: DateTime<Utc>,
    pub key_id: String,
    /// Chain heads as they were at `at`: every head for a checkpoint signed on demand or the
    /// first one a serving instance signs, then only the heads that moved since its previous
    /// checkpoint (each listed head is a row that must keep its hash, whatever else is listed).
    pub heads: Vec<ChainHead>,
    /// Partitions retention had dropped by then.
    pub retired_partitions: Vec<String>,
}

const FORMAT: &str = "toolgate-audit-checkpoint-v1";

/// Names a key by its public half, so a verifier can tell which key signed what.
fn key_id(public: &[u8]) -> String {
    hex::encode(Sha256::digest(public))[..16].to_owned()
}

/// The private key a serving instance signs with.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    id: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({})", self.id)
    }
}

fn read_base64(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    use base64::Engine;
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the {what} {}: {e}", path.display()))?;
    let b64: String = text
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<String>()
        .split_whitespace()
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| anyhow::anyhow!("the {what} {} is not base64: {e}", path.display()))
}

impl SigningKey {
    /// Reads a PKCS#8 Ed25519 key (PEM or bare base64), as written by `audit keygen`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let der = read_base64(path, "checkpoint key")?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| {
            anyhow::anyhow!(
                "the checkpoint key {} is not a PKCS#8 Ed25519 private key: {e}",
                path.display()
            )
        })?;
        let id = key_id(pair.public_key().as_ref());
        Ok(Self { pair, id })
    }

    /// Writes a new private key to `private` (mode 0600, never over an existing file) and
    /// its public half to `public`; returns the key id.
    pub fn generate(private: &Path, public: &Path) -> anyhow::Result<String> {
        use base64::Engine;
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let rng = ring::rand::SystemRandom::new();
        let der = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|e| anyhow::anyhow!("cannot generate a key: {e}"))?;
        let pair = Ed25519KeyPair::from_pkcs8(der.as_ref())
            .map_err(|e| anyhow::anyhow!("cannot read the generated key: {e}"))?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(private)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", private.display()))?;
        writeln!(
            f,
            "-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----"
        )?;
        let public_b64 = base64::engine::general_purpose::STANDARD.encode(pair.public_key());
        std::fs::write(public, format!("{public_b64}\n"))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", public.display()))?;
        Ok(key_id(pair.public_key().as_ref()))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Signs the heads and ledger as they are now.
    pub fn sign(&self, expect: &Expectations, at: DateTime<Utc>) -> SignedCheckpoint {
        self.sign_heads(expect.heads.clone(), expect, at)
    }

    /// Signs `heads` (some of those in `expect`) and the ledger of `expect`.
    fn sign_heads(
        &self,
        heads: Vec<ChainHead>,
        expect: &Expectations,
        at: DateTime<Utc>,
    ) -> SignedCheckpoint {
        let body = CheckpointBody {
            format: FORMAT.into(),
            at,
            key_id: self.id.clone(),
            heads,
            retired_partitions: expect.retired.iter().map(|r| r.partition.clone()).collect(),
        };
        let body = serde_json::to_string(&body).unwrap_or_default();
        let signature = hex::encode(self.pair.sign(body.as_bytes()).as_ref());
        SignedCheckpoint {
            id: None,
            at,
            key_id: self.id.clone(),
            body,
            signature,
        }
    }
}

/// The public half, all a verifier needs.
pub struct PublicKey {
    bytes: Vec<u8>,
    id: String,
}

impl PublicKey {
    /// Reads a public key as written by `audit keygen` (base64 of the 32 raw bytes).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let bytes = read_base64(path, "public key")?;
        if bytes.len() != 32 {
            anyhow::bail!(
                "the public key {} has {} bytes; an Ed25519 public key has 32",
                path.display(),
                bytes.len()
            );
        }
        let id = key_id(&bytes);
        Ok(Self { bytes, id })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The checkpoint's content, if this key signed exactly these bytes.
    pub fn verify(&self, c: &SignedCheckpoint) -> Result<CheckpointBody, String> {
        let name = c.id.map_or_else(
            || format!("checkpoint of {}", c.at),
            |i| format!("checkpoint #{i}"),
        );
        let sig =
            hex::decode(&c.signature).map_err(|_| format!("{name}: the signature is not hex"))?;
        signature::UnparsedPublicKey::new(&signature::ED25519, &self.bytes)
            .verify(c.body.as_bytes(), &sig)
            .map_err(|_| {
                format!(
                    "{name}: the signature does not verify with key {} (forged or altered)",
                    self.id
                )
            })?;
        let body: CheckpointBody =
            serde_json::from_str(&c.body).map_err(|e| format!("{name}: unreadable body: {e}"))?;
        if body.format != FORMAT {
            return Err(format!("{name}: unknown format {}", body.format));
        }
        Ok(body)
    }
}

/// Signs the current heads and stores the checkpoint; one read and one insert, whatever the
/// number of rows written since the last one.
pub async fn publish(pool: &sqlx::PgPool, key: &SigningKey) -> anyhow::Result<SignedCheckpoint> {
    let mut conn = pool.acquire().await?;
    let expect = crate::db::audit::expectations(&mut conn).await?;
    drop(conn);
    let mut c = key.sign(&expect, super::now_micros());
    c.id = Some(crate::db::checkpoints::insert_checkpoint(pool, &c).await?);
    tracing::info!(checkpoint = c.id, key_id = %c.key_id, chains = expect.heads.len(), signature = %c.signature, "published an audit checkpoint");
    Ok(c)
}

/// A serving instance's signer: it remembers which heads it last signed, so that it signs
/// only when rows arrived and lists only the heads that moved.
struct Signer {
    key: SigningKey,
    /// chain -> (last_seq, last_hash) as last signed by this instance.
    signed: HashMap<String, (i64, String)>,
    retired: usize,
}

impl Signer {
    /// Signs the heads that moved since the last checkpoint, if any did; none otherwise.
    async fn sign_moved(
        &mut self,
        pool: &sqlx::PgPool,
    ) -> anyhow::Result<Option<SignedCheckpoint>> {
        let mut conn = pool.acquire().await?;
        let expect = crate::db::audit::expectations(&mut conn).await?;
        drop(conn);
        let moved: Vec<ChainHead> = expect
            .heads
            .iter()
            .filter(|h| {
                self.signed
                    .get(&h.chain)
                    .is_none_or(|(seq, hash)| *seq != h.last_seq || *hash != h.last_hash)
            })
            .cloned()
            .collect();
        if moved.is_empty() && expect.retired.len() == self.retired {
            return Ok(None);
        }
        let mut c = self.key.sign_heads(moved, &expect, super::now_micros());
        c.id = Some(crate::db::checkpoints::insert_checkpoint(pool, &c).await?);
        for h in &expect.heads {
            self.signed
                .insert(h.chain.clone(), (h.last_seq, h.last_hash.clone()));
        }
        self.retired = expect.retired.len();
        tracing::debug!(checkpoint = c.id, key_id = %c.key_id, signature = %c.signature, "published an audit checkpoint");
        Ok(Some(c))
    }
}

type SignNow = oneshot::Sender<anyhow::Result<Option<SignedCheckpoint>>>;

/// The handle of a running publisher, to sign at once what arrived (at drain).
#[derive(Clone)]
pub struct Publisher {
    tx: mpsc::Sender<SignNow>,
}

impl Publisher {
    /// Signs the heads that moved since the last checkpoint now; none if nothing arrived.
    pub async fn sign_now(&self) -> anyhow::Result<Option<SignedCheckpoint>> {
        let (reply, wait) = oneshot::channel();
        self.tx
            .send(reply)
            .await
            .map_err(|_| anyhow::anyhow!("the checkpoint publisher stopped"))?;
        wait.await
            .map_err(|_| anyhow::anyhow!("the checkpoint publisher stopped"))?
    }
}

/// With a key, signs the heads now and then every `every` while rows arrive (nothing is
/// signed when no head moved), and whenever the returned [`Publisher`] asks; without one,
/// says what is not guaranteed. A key that cannot be read stops the start.
///
/// Rows written since the last checkpoint are the unsigned tail: someone who can write the
/// database could delete them and rewrite the heads unseen. `every` bounds how old that
/// tail can grow while the instance runs, and the drain's last checkpoint closes it.
pub fn spawn_publisher(
    pool: sqlx::PgPool,
    key: Option<&Path>,
    every: std::time::Duration,
) -> anyhow::Result<Option<Publisher>> {
    let Some(path) = key else {
        tracing::warn!(
            "no --audit-checkpoint-key: audit checkpoints are not signed, so a chain re-hashed by someone with write access to the database cannot be detected"
        );
        return Ok(None);
    };
    let key = SigningKey::load(path)?;
    let every = every.max(std::time::Duration::from_secs(1));
    tracing::info!(key_id = %key.id(), every_secs = every.as_secs(), "signing audit checkpoints");
    let mut signer = Signer {
        key,
        signed: HashMap::new(),
        retired: 0,
    };
    let (tx, mut rx) = mpsc::channel::<SignNow>(4);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(e) = signer.sign_moved(&pool).await {
                        tracing::warn!(error = %e, "publishing an audit checkpoint failed");
                    }
                }
                asked = rx.recv() => match asked {
                    Some(reply) => {
                        let _ = reply.send(signer.sign_moved(&pool).await);
                    }
                    None => break,
                },
            }
        }
    });
    Ok(Some(Publisher { tx }))
}

/// Of many checkpoints, keeps only those a verifier needs: per key and chain, the one that
/// signed that chain furthest. A row links to every row before it, so the furthest signed
/// row of a chain, found with its signed hash at the end of an intact walk, vouches for
/// every earlier row too. Memory stays at one checkpoint per key and chain, however many
/// were signed (one every few seconds while rows arrive, for years).
#[derive(Default)]
pub struct Needed {
    /// (key id, chain) -> (signed seq, index of the checkpoint that signed it).
    furthest: HashMap<(String, String), (i64, u64)>,
    /// index -> (checkpoint, how many (key, chain) pairs it is the furthest for).
    kept: BTreeMap<u64, (SignedCheckpoint, usize)>,
    offered: u64,
    unreadable: usize,
}

/// Checkpoints whose body is not even readable JSON are kept (a verifier reports them), up
/// to this many.
const MAX_UNREADABLE: usize = 64;

impl Needed {
    pub fn offer(&mut self, c: SignedCheckpoint) {
        let index = self.offered;
        self.offered += 1;
        let Ok(body) = serde_json::from_str::<CheckpointBody>(&c.body) else {
            if self.unreadable < MAX_UNREADABLE {
                self.unreadable += 1;
                self.kept.insert(index, (c, 1));
            }
            return;
        };
        let mut refs = 0;
        for h in body.heads {
            let slot = (c.key_id.clone(), h.chain);
            match self.furthest.get(&slot) {
                Some((seq, _)) if *seq > h.last_seq => continue,
                Some((_, old)) => {
                    let old = *old;
                    if let Some((_, n)) = self.kept.get_mut(&old) {
                        *n -= 1;
                        if *n == 0 {
                            self.kept.remove(&old);
                        }
                    }
                }
                None => {}
            }
            self.furthest.insert(slot, (h.last_seq, index));
            refs += 1;
        }
        if refs > 0 {
            self.kept.insert(index, (c, refs));
        }
    }

    /// The needed checkpoints, in the order they were offered.
    pub fn into_vec(self) -> Vec<SignedCheckpoint> {
        self.kept.into_values().map(|(c, _)| c).collect()
    }
}

impl FromIterator<SignedCheckpoint> for Needed {
    fn from_iter<I: IntoIterator<Item = SignedCheckpoint>>(iter: I) -> Self {
        let mut n = Self::default();
        iter.into_iter().for_each(|c| n.offer(c));
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_verifies_with_its_public_key_and_not_once_altered() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = (dir.path().join("k"), dir.path().join("k.pub"));
        let id = SigningKey::generate(&private, &public).unwrap();
        assert!(
            SigningKey::generate(&private, &public).is_err(),
            "overwrote a key"
        );
        let key = SigningKey::load(&private).unwrap();
        let verifier = PublicKey::load(&public).unwrap();
        assert_eq!((key.id(), verifier.id()), (id.as_str(), id.as_str()));
        let expect = Expectations {
            heads: vec![ChainHead {
                chain: "c".into(),
                first_seq: 1,
                last_seq: 9,
                last_hash: "ab".into(),
                rows: 9,
            }],
            retired: vec![],
        };
        let c = key.sign(&expect, Utc::now());
        assert_eq!(verifier.verify(&c).unwrap().heads, expect.heads);
        let mut forged = c.clone();
        forged.body = forged.body.replace("\"last_seq\":9", "\"last_seq\":8");
        assert!(
            verifier
                .verify(&forged)
                .unwrap_err()
                .contains("does not verify")
        );
    }

    fn head(chain: &str, seq: i64) -> ChainHead {
        ChainHead {
            chain: chain.into(),
            first_seq: 1,
            last_seq: seq,
            last_hash: format!("{chain}{seq}"),
            rows: seq,
        }
    }

    #[test]
    fn a_verifier_keeps_only_the_furthest_checkpoint_of_each_chain() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = (dir.path().join("k"), dir.path().join("k.pub"));
        SigningKey::generate(&private, &public).unwrap();
        let key = SigningKey::load(&private).unwrap();
        let sign = |heads: Vec<ChainHead>| {
            let expect = Expectations {
                heads,
                retired: vec![],
            };
            key.sign(&expect, Utc::now())
        };
        // Checkpoints every few seconds for a long time: what is kept does not grow with them.
        let mut needed = Needed::default();
        needed.offer(sign(vec![head("a", 1), head("old", 7)]));
        for seq in 2..1_000 {
            needed.offer(sign(vec![head("a", seq)]));
        }
        needed.offer(sign(vec![head("b", 3)]));
        let mut forged = sign(vec![head("x", 1)]);
        forged.body = "not json".into();
        needed.offer(forged.clone());
        let kept = needed.into_vec();
        let bodies: Vec<Vec<(String, i64)>> = kept
            .iter()
            .filter_map(|c| serde_json::from_str::<CheckpointBody>(&c.body).ok())
            .map(|b| b.heads.into_iter().map(|h| (h.chain, h.last_seq)).collect())
            .collect();
        assert_eq!(
            bodies,
            [
                vec![("a".to_owned(), 1), ("old".to_owned(), 7)],
                vec![("a".to_owned(), 999)],
                vec![("b".to_owned(), 3)],
            ]
        );
        // An unreadable one is kept, so that verify reports it.
        assert_eq!(kept.last(), Some(&forged));
    }
}
