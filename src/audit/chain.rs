//! Tamper evidence: every row carries sha256(prev_hash || canonical row).
//!
//! Chains are per writer: each running instance has its own (named after the instance and
//! its start), and admin changes form the `control-plane` chain, extended inside the change's
//! own transaction. A chain is checked by recomputing each hash from the stored columns and
//! by its sequence numbers having no gap.

use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::AuditEvent;

/// The `prev_hash` of a chain's first row.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The name of the chain admin changes are written to.
pub const CONTROL_PLANE: &str = "control-plane";

/// A chained row: what is stored and exported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainedEvent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    pub chain: String,
    pub chain_seq: i64,
    pub prev_hash: String,
    pub hash: String,
    pub instance: String,
    #[serde(flatten)]
    pub event: AuditEvent,
}

/// The exact bytes that are hashed: a JSON array with a fixed field order.
pub fn canonical(chain: &str, seq: i64, instance: &str, e: &AuditEvent) -> String {
    json!([
        chain,
        seq,
        instance,
        e.at.timestamp_micros(),
        e.event_type,
        e.outcome,
        e.agent,
        e.client_id,
        e.jti,
        e.admin_user,
        e.tool,
        e.resource,
        e.remote_addr,
        e.user_agent,
        e.request_id,
        e.call_id,
        e.exit_code,
        e.error,
        e.latency_us,
        e.bytes_in,
        e.bytes_out,
        e.arguments,
        e.result_sha256,
        e.result,
        e.details,
    ])
    .to_string()
}

pub fn link(prev_hash: &str, canonical: &str) -> String {
    let mut h = Sha256::new();
    h.update(prev_hash.as_bytes());
    h.update(b"\n");
    h.update(canonical.as_bytes());
    hex::encode(h.finalize())
}

/// Appends `event` after a chain's last `(seq, hash)`.
pub fn extend(chain: &str, last: (i64, &str), instance: &str, event: AuditEvent) -> ChainedEvent {
    let seq = last.0 + 1;
    let hash = link(last.1, &canonical(chain, seq, instance, &event));
    ChainedEvent {
        id: None,
        chain: chain.to_owned(),
        chain_seq: seq,
        prev_hash: last.1.to_owned(),
        hash,
        instance: instance.to_owned(),
        event,
    }
}

/// The first problem found while walking chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenLink {
    pub chain: String,
    pub chain_seq: i64,
    pub id: Option<i64>,
    pub reason: String,
}

/// Walks rows (any chains, each in `chain_seq` order) and reports the first broken link.
#[derive(Debug, Default)]
pub struct Verifier {
    last: std::collections::HashMap<String, (i64, String)>,
    pub rows: u64,
    /// Chains whose first rows were dropped by retention: their walk starts mid-chain.
    pub trimmed_chains: Vec<String>,
}

impl Verifier {
    pub fn check(&mut self, row: &ChainedEvent) -> Result<(), BrokenLink> {
        self.rows += 1;
        let broken = |reason: String| BrokenLink {
            chain: row.chain.clone(),
            chain_seq: row.chain_seq,
            id: row.id,
            reason,
        };
        let expected = link(
            &row.prev_hash,
            &canonical(&row.chain, row.chain_seq, &row.instance, &row.event),
        );
        if expected != row.hash {
            return Err(broken(
                "the row's content does not match its hash (edited after it was written)".into(),
            ));
        }
        match self.last.get(&row.chain) {
            Some((seq, hash)) => {
                if row.chain_seq != seq + 1 {
                    return Err(broken(format!(
                        "rows {} to {} of the chain are missing",
                        seq + 1,
                        row.chain_seq - 1
                    )));
                }
                if row.prev_hash != *hash {
                    return Err(broken(
                        "prev_hash does not match the previous row's hash".into(),
                    ));
                }
            }
            None => {
                if row.chain_seq == 1 && row.prev_hash != GENESIS {
                    return Err(broken(
                        "the chain's first row does not start from the genesis hash".into(),
                    ));
                }
                if row.chain_seq != 1 {
                    self.trimmed_chains.push(row.chain.clone());
                }
            }
        }
        self.last
            .insert(row.chain.clone(), (row.chain_seq, row.hash.clone()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(n: i64) -> AuditEvent {
        AuditEvent {
            latency_us: Some(n),
            ..AuditEvent::new(
                crate::audit::EventKind::ToolCall,
                crate::audit::Outcome::Success,
            )
        }
    }

    #[test]
    fn a_chain_verifies_and_an_edit_is_found() {
        let a = extend("c", (0, GENESIS), "i", ev(1));
        let b = extend("c", (a.chain_seq, &a.hash), "i", ev(2));
        let mut v = Verifier::default();
        assert!(v.check(&a).is_ok() && v.check(&b).is_ok());

        let mut edited = b.clone();
        edited.event.outcome = "denied".into();
        let mut v = Verifier::default();
        v.check(&a).unwrap();
        assert!(v.check(&edited).unwrap_err().reason.contains("edited"));
    }

    #[test]
    fn a_missing_row_is_found() {
        let a = extend("c", (0, GENESIS), "i", ev(1));
        let b = extend("c", (a.chain_seq, &a.hash), "i", ev(2));
        let c = extend("c", (b.chain_seq, &b.hash), "i", ev(3));
        let mut v = Verifier::default();
        v.check(&a).unwrap();
        assert!(v.check(&c).unwrap_err().reason.contains("missing"));
    }
}
