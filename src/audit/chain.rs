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
    /// Set when the stored text differs from what was submitted (see [`sanitize`]) or the
    /// row was isolated from a batch the database refused: a JSON object saying what and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<String>,
    #[serde(flatten)]
    pub event: AuditEvent,
}

/// The exact bytes that are hashed: a JSON array with a fixed field order. `flags` is
/// appended only when present, and then `person` as `{"person": ...}` only when present (an
/// object, so it cannot be read as flags), so rows written before either existed keep their
/// hashes.
pub fn canonical(
    chain: &str,
    seq: i64,
    instance: &str,
    flags: Option<&str>,
    e: &AuditEvent,
) -> String {
    let mut fields = json!([
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
    ]);
    if let (Some(f), Some(a)) = (flags, fields.as_array_mut()) {
        a.push(json!(f));
    }
    if let (Some(p), Some(a)) = (&e.person, fields.as_array_mut()) {
        a.push(json!({ "person": p }));
    }
    fields.to_string()
}

pub fn link(prev_hash: &str, canonical: &str) -> String {
    let mut h = Sha256::new();
    h.update(prev_hash.as_bytes());
    h.update(b"\n");
    h.update(canonical.as_bytes());
    hex::encode(h.finalize())
}

/// Appends `event` after a chain's last `(seq, hash)`, sanitized first: every row that is
/// hashed and stored went through here, whoever built the event.
pub fn extend(chain: &str, last: (i64, &str), instance: &str, event: AuditEvent) -> ChainedEvent {
    let mut event = event;
    let changed = sanitize(&mut event);
    let flags = (!changed.is_empty()).then(|| json!({ "sanitized": changed }).to_string());
    extend_flagged(chain, last, instance, flags, event)
}

/// Like [`extend`], with `flags` given and `event` taken as it is (already made safe).
pub fn extend_flagged(
    chain: &str,
    last: (i64, &str),
    instance: &str,
    flags: Option<String>,
    event: AuditEvent,
) -> ChainedEvent {
    let seq = last.0 + 1;
    let hash = link(
        last.1,
        &canonical(chain, seq, instance, flags.as_deref(), &event),
    );
    ChainedEvent {
        id: None,
        chain: chain.to_owned(),
        chain_seq: seq,
        prev_hash: last.1.to_owned(),
        hash,
        instance: instance.to_owned(),
        flags,
        event,
    }
}

/// Longest identifier-like field kept (names, ids, addresses, user agents).
pub const MAX_SHORT_FIELD: usize = 1024;
/// Longest free-text field kept (error, arguments, result, details).
pub const MAX_LONG_FIELD: usize = 1 << 20;

/// The text a NUL byte is stored as. It is the JSON escape of NUL, so JSON text (arguments,
/// details) stays valid JSON meaning the same thing; in plain fields the row's flags say
/// the field was rewritten.
pub const NUL_ESCAPE: &str = "\\u0000";

/// Makes every text field storable, whatever a caller put in it: Postgres refuses NUL in
/// text (and one refused row would fail the whole group-commit batch), and a field past its
/// size cap is cut. Returns the names of the fields it changed. Rust strings are valid
/// UTF-8 by construction; bytes from the wire are decoded lossily before they get here.
pub fn sanitize(e: &mut AuditEvent) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut one = |name: &'static str, v: &mut String, cap: usize| {
        if clean(v, cap) {
            changed.push(name);
        }
    };
    one("event_type", &mut e.event_type, MAX_SHORT_FIELD);
    one("outcome", &mut e.outcome, MAX_SHORT_FIELD);
    for (name, v, cap) in [
        ("agent", &mut e.agent, MAX_SHORT_FIELD),
        ("client_id", &mut e.client_id, MAX_SHORT_FIELD),
        ("jti", &mut e.jti, MAX_SHORT_FIELD),
        ("admin_user", &mut e.admin_user, MAX_SHORT_FIELD),
        ("tool", &mut e.tool, MAX_SHORT_FIELD),
        ("resource", &mut e.resource, MAX_SHORT_FIELD),
        ("remote_addr", &mut e.remote_addr, MAX_SHORT_FIELD),
        ("user_agent", &mut e.user_agent, MAX_SHORT_FIELD),
        ("request_id", &mut e.request_id, MAX_SHORT_FIELD),
        ("call_id", &mut e.call_id, MAX_SHORT_FIELD),
        ("result_sha256", &mut e.result_sha256, MAX_SHORT_FIELD),
        ("error", &mut e.error, MAX_LONG_FIELD),
        ("arguments", &mut e.arguments, MAX_LONG_FIELD),
        ("result", &mut e.result, MAX_LONG_FIELD),
        ("details", &mut e.details, MAX_LONG_FIELD),
        ("person", &mut e.person, MAX_SHORT_FIELD),
    ] {
        if let Some(v) = v {
            one(name, v, cap);
        }
    }
    changed
}

/// Escapes NUL and cuts `v` to `cap` bytes (on a character boundary); true if it changed.
fn clean(v: &mut String, cap: usize) -> bool {
    let mut changed = false;
    if v.contains('\0') {
        *v = v.replace('\0', NUL_ESCAPE);
        changed = true;
    }
    if v.len() > cap {
        let mut end = cap;
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        let cut = v.len() - end;
        v.truncate(end);
        v.push_str(&format!("...[{cut} bytes cut]"));
        changed = true;
    }
    changed
}

/// The last resort for a row the database refused even sanitized: every character outside
/// printable ASCII escaped, every field cut short, and the reason kept in its flags.
pub fn quarantine(event: &AuditEvent, error: &str) -> (AuditEvent, String) {
    const CAP: usize = 8192;
    let ascii = |s: &str| -> String {
        let mut out = String::with_capacity(s.len().min(CAP));
        for c in s.chars() {
            if out.len() >= CAP {
                out.push_str("...[cut]");
                break;
            }
            if c == ' ' || c.is_ascii_graphic() {
                out.push(c);
            } else {
                out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
            }
        }
        out
    };
    let o = |v: &Option<String>| v.as_deref().map(ascii);
    let e = AuditEvent {
        at: event.at,
        event_type: ascii(&event.event_type),
        outcome: ascii(&event.outcome),
        agent: o(&event.agent),
        client_id: o(&event.client_id),
        jti: o(&event.jti),
        admin_user: o(&event.admin_user),
        tool: o(&event.tool),
        resource: o(&event.resource),
        remote_addr: o(&event.remote_addr),
        user_agent: o(&event.user_agent),
        request_id: o(&event.request_id),
        call_id: o(&event.call_id),
        exit_code: event.exit_code,
        error: o(&event.error),
        latency_us: event.latency_us,
        bytes_in: event.bytes_in,
        bytes_out: event.bytes_out,
        arguments: o(&event.arguments),
        result_sha256: o(&event.result_sha256),
        result: o(&event.result),
        details: o(&event.details),
        person: o(&event.person),
    };
    let flags = json!({"isolated": ascii(error), "escaped": "non-ASCII and control characters as \\u{hex}"});
    (e, flags.to_string())
}

/// What is left of a row when even its escaped form was refused: when and what kind, the
/// refusal, and the hash of the original content so that it can still be matched.
pub fn placeholder(event: &AuditEvent, error: &str) -> (AuditEvent, String) {
    let (q, flags) = quarantine(event, error);
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(event).unwrap_or_default());
    let e = AuditEvent {
        at: event.at,
        event_type: q.event_type,
        outcome: q.outcome,
        ..AuditEvent::default()
    };
    let mut flags: serde_json::Value = serde_json::from_str(&flags).unwrap_or_default();
    flags["placeholder"] = json!(true);
    flags["original_sha256"] = json!(hex::encode(h.finalize()));
    (e, flags.to_string())
}

/// The first problem found while walking chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenLink {
    pub chain: String,
    pub chain_seq: i64,
    pub id: Option<i64>,
    pub reason: String,
}

/// A chain's recorded head: what the database says the chain holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    pub chain: String,
    pub first_seq: i64,
    pub last_seq: i64,
    pub last_hash: String,
    pub rows: i64,
}

/// The rows of one chain that went with a dropped partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredChain {
    pub chain: String,
    pub first_seq: i64,
    pub last_seq: i64,
    pub last_hash: String,
    pub rows: i64,
}

/// One retention-ledger entry: a partition retention dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    pub partition: String,
    pub dropped_at: chrono::DateTime<chrono::Utc>,
    pub dropped_by: String,
    pub chains: Vec<RetiredChain>,
}

/// What must exist: the chain heads and what retention dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectations {
    pub heads: Vec<ChainHead>,
    pub retired: Vec<Retired>,
}

impl Expectations {
    /// The last row of `chain` retention dropped, with the ledger entry that says so.
    fn retired_through(&self, chain: &str) -> Option<(&RetiredChain, &Retired)> {
        self.retired
            .iter()
            .flat_map(|r| r.chains.iter().map(move |c| (c, r)))
            .filter(|(c, _)| c.chain == chain)
            .max_by_key(|(c, _)| c.last_seq)
    }
}

/// Where one chain's walk started and ended.
#[derive(Debug, Clone)]
struct Seen {
    first_seq: i64,
    first_prev: String,
    last_seq: i64,
    last_hash: String,
    rows: i64,
}

/// Walks rows (any chains, each in `chain_seq` order) and reports the first broken link;
/// [`Verifier::complete`] then compares what was walked with what must exist.
#[derive(Debug, Default)]
pub struct Verifier {
    seen: std::collections::BTreeMap<String, Seen>,
    pub rows: u64,
    /// Chains whose walk starts mid-chain (their first rows dropped by retention, or
    /// filtered out of an export).
    pub trimmed_chains: Vec<String>,
    /// Hashes that signed checkpoints say rows must have: (chain, seq) -> (hash, checkpoint).
    wanted: std::collections::HashMap<(String, i64), (String, String)>,
    /// Checkpointed rows found with the signed hash.
    pub confirmed: u64,
    /// A filtered walk (an export of some rows): rows of a chain may be left out, so a gap
    /// is not an error, but rows with consecutive seqs must still link.
    pub filtered: bool,
    /// Consecutive pairs whose link was checked.
    pub links: u64,
}

impl Verifier {
    /// Rows at these positions must carry these hashes (from verified checkpoints).
    pub fn want(&mut self, chain: &str, seq: i64, hash: &str, checkpoint: &str) {
        self.wanted.insert(
            (chain.to_owned(), seq),
            (hash.to_owned(), checkpoint.to_owned()),
        );
    }

    /// Checks one row against its own hash, the signed checkpoints and the row before it.
    ///
    /// Whatever is wrong with a row, the walk goes on from it: the next row is judged against
    /// this one (its stored hash, which is what the next row links to), so one broken row is
    /// reported once and the rows after it only for what is wrong with them.
    pub fn check(&mut self, row: &ChainedEvent) -> Result<(), BrokenLink> {
        self.rows += 1;
        let verdict = self.judge(row);
        match self.seen.get_mut(&row.chain) {
            Some(s) => {
                s.last_seq = row.chain_seq;
                s.last_hash.clone_from(&row.hash);
                s.rows += 1;
            }
            None => {
                if row.chain_seq != 1 {
                    self.trimmed_chains.push(row.chain.clone());
                }
                self.seen.insert(
                    row.chain.clone(),
                    Seen {
                        first_seq: row.chain_seq,
                        first_prev: row.prev_hash.clone(),
                        last_seq: row.chain_seq,
                        last_hash: row.hash.clone(),
                        rows: 1,
                    },
                );
            }
        }
        verdict.map_err(|reason| BrokenLink {
            chain: row.chain.clone(),
            chain_seq: row.chain_seq,
            id: row.id,
            reason,
        })
    }

    /// What is wrong with `row`, if anything; the walk's position is not moved here.
    fn judge(&mut self, row: &ChainedEvent) -> Result<(), String> {
        let expected = link(
            &row.prev_hash,
            &canonical(
                &row.chain,
                row.chain_seq,
                &row.instance,
                row.flags.as_deref(),
                &row.event,
            ),
        );
        if let Some((hash, checkpoint)) = self.wanted.remove(&(row.chain.clone(), row.chain_seq)) {
            if hash != row.hash {
                return Err(format!(
                    "the row's hash differs from the one {checkpoint} signed: the chain was re-hashed after it was written"
                ));
            }
            self.confirmed += 1;
        }
        if expected != row.hash {
            return Err(
                "the row's content does not match its hash (edited after it was written)".into(),
            );
        }
        match self.seen.get(&row.chain) {
            Some(s) => {
                let filtered_out = self.filtered && row.chain_seq > s.last_seq + 1;
                if row.chain_seq != s.last_seq + 1 && !filtered_out {
                    return Err(format!(
                        "rows {} to {} of the chain are missing",
                        s.last_seq + 1,
                        row.chain_seq - 1
                    ));
                }
                if !filtered_out {
                    if row.prev_hash != s.last_hash {
                        return Err("prev_hash does not match the previous row's hash".into());
                    }
                    self.links += 1;
                }
            }
            None => {
                if row.chain_seq == 1 && row.prev_hash != GENESIS {
                    return Err("the chain's first row does not start from the genesis hash".into());
                }
            }
        }
        Ok(())
    }

    /// Chains walked, and how many rows each.
    pub fn chains(&self) -> usize {
        self.seen.len()
    }

    /// Everything that must exist but was not walked, and every start explained by
    /// retention (as notes). Run after the whole, unfiltered walk.
    pub fn complete(&self, expect: &Expectations) -> (Vec<String>, Vec<String>) {
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        let heads: std::collections::BTreeMap<&str, &ChainHead> =
            expect.heads.iter().map(|h| (h.chain.as_str(), h)).collect();
        for (chain, head) in &heads {
            let retired = expect.retired_through(chain);
            let expected_first = retired.map_or(head.first_seq, |(c, _)| c.last_seq + 1);
            match self.seen.get(*chain) {
                None if expected_first > head.last_seq => {}
                None => problems.push(format!(
                    "chain {chain}: rows {expected_first} to {} are missing: its head says it reached seq {} and no retention dropped them (table truncated, partition dropped or detached, or rows deleted)",
                    head.last_seq, head.last_seq
                )),
                Some(s) => {
                    if s.first_seq > expected_first {
                        problems.push(format!(
                            "chain {chain}: rows {expected_first} to {} are missing and no retention dropped them",
                            s.first_seq - 1
                        ));
                    } else if s.first_seq < expected_first {
                        problems.push(format!(
                            "chain {chain}: the retention ledger says rows up to {} were dropped, yet row {} is present",
                            expected_first - 1,
                            s.first_seq
                        ));
                    } else if let Some((c, r)) = retired {
                        if s.first_prev != c.last_hash {
                            problems.push(format!(
                                "chain {chain}: row {} does not link to the last row retention dropped (partition {})",
                                s.first_seq, r.partition
                            ));
                        } else {
                            notes.push(format!(
                                "chain {chain} starts at seq {}: rows {} to {} were dropped by retention (partition {}, {} by {})",
                                s.first_seq,
                                head.first_seq,
                                c.last_seq,
                                r.partition,
                                r.dropped_at.format("%Y-%m-%d %H:%M UTC"),
                                r.dropped_by
                            ));
                        }
                    }
                    if s.last_seq < head.last_seq {
                        problems.push(format!(
                            "chain {chain}: rows {} to {} are missing: its head says it reached seq {}",
                            s.last_seq + 1,
                            head.last_seq,
                            head.last_seq
                        ));
                    } else if s.last_seq > head.last_seq {
                        problems.push(format!(
                            "chain {chain}: rows {} to {} are beyond its recorded head (written around the audit triggers)",
                            head.last_seq + 1,
                            s.last_seq
                        ));
                    } else if s.last_hash != head.last_hash {
                        problems.push(format!(
                            "chain {chain}: its last row's hash differs from the recorded head: the chain was re-hashed"
                        ));
                    }
                }
            }
        }
        for chain in self.seen.keys() {
            if !heads.contains_key(chain.as_str()) {
                problems.push(format!(
                    "chain {chain}: it has rows but no recorded head (written around the audit triggers, or the heads were rewritten)"
                ));
            }
        }
        for ((chain, seq), (hash, checkpoint)) in &self.wanted {
            let retired = expect
                .retired_through(chain)
                .filter(|(c, _)| c.last_seq >= *seq);
            match retired {
                Some((c, _)) if c.last_seq == *seq && c.last_hash != *hash => problems.push(format!(
                    "chain {chain}: row {seq} as recorded by retention differs from the one {checkpoint} signed"
                )),
                Some(_) => {}
                None => problems.push(format!(
                    "chain {chain}: row {seq}, signed by {checkpoint}, is missing"
                )),
            }
        }
        problems.sort();
        (problems, notes)
    }

    /// Checkpointed positions not walked (for a filtered walk: they may be filtered out).
    pub fn unconfirmed(&self) -> usize {
        self.wanted.len()
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

    #[test]
    fn nul_is_escaped_oversized_fields_are_cut_and_the_row_says_so() {
        let mut e = ev(1);
        e.client_id = Some("a\0b".into());
        e.user_agent = Some("é".repeat(MAX_SHORT_FIELD));
        let row = extend("c", (0, GENESIS), "i", e);
        assert_eq!(row.event.client_id.as_deref(), Some("a\\u0000b"));
        let ua = row.event.user_agent.as_deref().unwrap();
        assert!(
            ua.len() < MAX_SHORT_FIELD + 32 && ua.ends_with("bytes cut]"),
            "{ua}"
        );
        assert_eq!(
            row.flags.as_deref(),
            Some(r#"{"sanitized":["client_id","user_agent"]}"#)
        );
        // The flags are part of what is hashed.
        let mut v = Verifier::default();
        let mut unflagged = row.clone();
        unflagged.flags = None;
        assert!(v.check(&unflagged).is_err());
        assert!(Verifier::default().check(&row).is_ok());
        // A clean event is stored as it is, unflagged.
        assert_eq!(extend("c", (0, GENESIS), "i", ev(2)).flags, None);
    }
}
