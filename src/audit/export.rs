//! Compliance export: CSV (formula-safe), JSONL (with the chain fields, verifiable offline),
//! OCSF and CEF (the SIEM forms of [`super::siem`]).

use sha2::{Digest, Sha256};

use super::chain::{BrokenLink, ChainedEvent, Expectations, Verifier};
use super::checkpoint::{PublicKey, SignedCheckpoint};
use crate::db::audit::AuditFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Csv,
    Jsonl,
    /// OCSF 1.8.0 records, one JSON object per line.
    Ocsf,
    /// ArcSight CEF, one line per event.
    Cef,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Jsonl => "jsonl",
            Format::Ocsf => "ocsf",
            Format::Cef => "cef",
        }
    }

    /// The name a download of the export is offered under.
    pub fn file_name(self) -> String {
        match self {
            Format::Ocsf => "toolgate-audit.ocsf.jsonl".into(),
            Format::Cef => "toolgate-audit.cef.log".into(),
            _ => format!("toolgate-audit.{}", self.as_str()),
        }
    }

    /// One row in this format, its line break included. JSONL rows are written by
    /// [`JsonlExport::row`], which also keeps the export's digest.
    pub fn line(self, r: &ChainedEvent) -> Vec<u8> {
        match self {
            Format::Csv => csv_line(r),
            Format::Jsonl => jsonl_line(r),
            Format::Ocsf => {
                let mut l = super::siem::ocsf(r).to_string().into_bytes();
                l.push(b'\n');
                l
            }
            Format::Cef => {
                let mut l = super::siem::cef(r).into_bytes();
                l.push(b'\n');
                l
            }
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Csv => "text/csv; charset=utf-8",
            Format::Jsonl | Format::Ocsf => "application/x-ndjson",
            Format::Cef => "text/plain; charset=utf-8",
        }
    }
}

/// The CSV columns: the fields of a JSONL row (`docs/audit-schema.md`), in the order they
/// were added (new ones at the end, so a reader by position keeps working).
pub const CSV_HEADER: [&str; 34] = [
    "id",
    "at",
    "chain",
    "chain_seq",
    "prev_hash",
    "hash",
    "instance",
    "event_type",
    "outcome",
    "agent",
    "client_id",
    "jti",
    "admin_user",
    "tool",
    "resource",
    "remote_addr",
    "user_agent",
    "request_id",
    "call_id",
    "exit_code",
    "error",
    "latency_us",
    "bytes_in",
    "bytes_out",
    "arguments",
    "result_sha256",
    "result",
    "details",
    "at_unix_us",
    "format",
    "flags",
    "person",
    "category",
    "severity",
];

/// A cell a spreadsheet would run as a formula gets a leading apostrophe.
pub fn csv_safe(cell: &str) -> String {
    if cell.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{cell}")
    } else {
        cell.to_owned()
    }
}

pub fn csv_header() -> Vec<u8> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let _ = w.write_record(CSV_HEADER);
    w.into_inner().unwrap_or_default()
}

pub fn csv_line(r: &ChainedEvent) -> Vec<u8> {
    let e = &r.event;
    let s = |v: &Option<String>| csv_safe(v.as_deref().unwrap_or(""));
    let n = |v: Option<i64>| v.map(|x| x.to_string()).unwrap_or_default();
    let record = [
        r.id.map(|i| i.to_string()).unwrap_or_default(),
        e.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        csv_safe(&r.chain),
        r.chain_seq.to_string(),
        r.prev_hash.clone(),
        r.hash.clone(),
        csv_safe(&r.instance),
        csv_safe(&e.event_type),
        csv_safe(&e.outcome),
        s(&e.agent),
        s(&e.client_id),
        s(&e.jti),
        s(&e.admin_user),
        s(&e.tool),
        s(&e.resource),
        s(&e.remote_addr),
        s(&e.user_agent),
        s(&e.request_id),
        s(&e.call_id),
        e.exit_code.map(|x| x.to_string()).unwrap_or_default(),
        s(&e.error),
        n(e.latency_us),
        n(e.bytes_in),
        n(e.bytes_out),
        s(&e.arguments),
        s(&e.result_sha256),
        s(&e.result),
        s(&e.details),
        e.at.timestamp_micros().to_string(),
        super::siem::ROW_FORMAT.to_owned(),
        csv_safe(r.flags.as_deref().unwrap_or("")),
        s(&e.person),
        super::siem::category(r).as_str().to_owned(),
        super::siem::severity(r).as_str().to_owned(),
    ];
    let mut w = csv::Writer::from_writer(Vec::new());
    let _ = w.write_record(&record);
    w.into_inner().unwrap_or_default()
}

pub fn jsonl_line(r: &ChainedEvent) -> Vec<u8> {
    let mut line = super::siem::row(r).to_string().into_bytes();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formula_leading_cells_are_neutralised() {
        assert_eq!(csv_safe("=HYPERLINK(\"x\")"), "'=HYPERLINK(\"x\")");
        assert_eq!(csv_safe("+1"), "'+1");
        assert_eq!(csv_safe("-1"), "'-1");
        assert_eq!(csv_safe("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(csv_safe("plain"), "plain");
    }
}

/// The first line of a JSONL export: what was asked for, and what must exist.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ExportHeader {
    /// The export format; its presence marks the line as the header.
    pub toolgate_audit_export: String,
    pub exported_at: chrono::DateTime<chrono::Utc>,
    /// The filter rows were selected by; none for the whole log.
    pub filter: Option<AuditFilter>,
    /// Chain heads and the retention ledger, read in the same snapshot as the rows.
    pub expect: Expectations,
    pub checkpoints: Vec<SignedCheckpoint>,
}

/// The last line of a JSONL export: how many rows came before it, so a cut file is found.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ExportTrailer {
    pub toolgate_audit_export_end: String,
    pub rows: u64,
    /// For an incremental export (`after_id`): the cursor of the next one, the row at the
    /// latest commit position exported (the same `after_id` again when nothing was new).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after_id: Option<i64>,
    /// sha256 over every exported row's hash and a newline, in order.
    pub digest: String,
}

pub const EXPORT_FORMAT: &str = "toolgate-audit-export-v2";

/// Builds the header and trailer around exported rows.
pub struct JsonlExport {
    rows: u64,
    digest: Sha256,
    next_after_id: Option<i64>,
}

impl JsonlExport {
    pub fn header(
        filter: &AuditFilter,
        expect: Expectations,
        checkpoints: Vec<SignedCheckpoint>,
    ) -> (Self, Vec<u8>) {
        let header = ExportHeader {
            toolgate_audit_export: EXPORT_FORMAT.into(),
            exported_at: chrono::Utc::now(),
            filter: filter.is_filtered().then(|| filter.clone()),
            expect,
            checkpoints,
        };
        let mut line = serde_json::to_vec(&header).unwrap_or_default();
        line.push(b'\n');
        (
            Self {
                rows: 0,
                digest: Sha256::new(),
                next_after_id: filter.after_id,
            },
            line,
        )
    }

    pub fn row(&mut self, r: &ChainedEvent) -> Vec<u8> {
        self.rows += 1;
        self.digest.update(r.hash.as_bytes());
        self.digest.update(b"\n");
        jsonl_line(r)
    }

    pub fn trailer(self) -> Vec<u8> {
        let t = ExportTrailer {
            toolgate_audit_export_end: EXPORT_FORMAT.into(),
            rows: self.rows,
            digest: hex::encode(self.digest.finalize()),
            next_after_id: self.next_after_id,
        };
        let mut line = serde_json::to_vec(&t).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// One pass of `audit verify`, over the database or an export: rows fed in chain order,
/// then [`Verification::finish`] says what holds and what does not.
pub struct Verification {
    pub verifier: Verifier,
    expect: Option<Expectations>,
    filter: Option<AuditFilter>,
    /// Broken rows, the first [`MAX_BROKEN_SHOWN`] of them; `more_broken` counts the rest.
    broken: Vec<BrokenLink>,
    more_broken: u64,
    problems: Vec<String>,
    notes: Vec<String>,
    checkpoints_verified: usize,
    newest_checkpoint: Option<chrono::DateTime<chrono::Utc>>,
    /// Per chain, the furthest row a verified checkpoint signed.
    signed_through: std::collections::HashMap<String, i64>,
    /// Per chain, the rows walked past its furthest signed row.
    unsigned: std::collections::BTreeMap<String, UnsignedTail>,
    digest: Sha256,
    keyed: bool,
}

/// The rows of one chain newer than any checkpoint: deleting them (and rewriting the head)
/// cannot be detected, so verify says how many and since when.
#[derive(Debug, Clone)]
struct UnsignedTail {
    first_seq: i64,
    last_seq: i64,
    rows: u64,
    since: chrono::DateTime<chrono::Utc>,
}

/// Chains named one by one in the unsigned-tail report; the rest are counted.
const TAIL_CHAINS_SHOWN: usize = 10;

impl Verification {
    /// `expect` is none for an export without a header (written before headers existed).
    /// Checkpoints are checked with `key` (if given): a bad signature is a problem, a good
    /// one makes every row it names required to carry the signed hash.
    pub fn new(
        expect: Option<Expectations>,
        filter: Option<AuditFilter>,
        checkpoints: &[SignedCheckpoint],
        key: Option<&PublicKey>,
    ) -> Self {
        let mut v = Self {
            verifier: Verifier::default(),
            expect,
            filter,
            broken: Vec::new(),
            more_broken: 0,
            problems: Vec::new(),
            notes: Vec::new(),
            checkpoints_verified: 0,
            newest_checkpoint: None,
            signed_through: std::collections::HashMap::new(),
            unsigned: std::collections::BTreeMap::new(),
            digest: Sha256::new(),
            keyed: key.is_some(),
        };
        v.verifier.filtered = v.filter.is_some();
        if let Some(key) = key {
            for c in checkpoints {
                if c.key_id != key.id() {
                    v.notes.push(format!(
                        "checkpoint{} was signed by another key ({}); not checked",
                        c.id.map(|i| format!(" #{i}")).unwrap_or_default(),
                        c.key_id
                    ));
                    continue;
                }
                match key.verify(c) {
                    Ok(body) => {
                        v.checkpoints_verified += 1;
                        v.newest_checkpoint = v.newest_checkpoint.max(Some(body.at));
                        let name = c.id.map_or_else(
                            || format!("the checkpoint of {}", body.at),
                            |i| format!("checkpoint #{i}"),
                        );
                        for h in &body.heads {
                            v.verifier.want(&h.chain, h.last_seq, &h.last_hash, &name);
                            let through = v.signed_through.entry(h.chain.clone()).or_default();
                            *through = (*through).max(h.last_seq);
                        }
                    }
                    Err(e) => v.problems.push(e),
                }
            }
        }
        v
    }

    /// Checks one row; every broken one is reported, and the walk goes on from it.
    pub fn row(&mut self, r: &ChainedEvent) {
        self.digest.update(r.hash.as_bytes());
        self.digest.update(b"\n");
        if self.keyed
            && self
                .signed_through
                .get(&r.chain)
                .is_none_or(|s| r.chain_seq > *s)
        {
            match self.unsigned.get_mut(&r.chain) {
                Some(t) => {
                    t.rows += 1;
                    t.first_seq = t.first_seq.min(r.chain_seq);
                    t.last_seq = t.last_seq.max(r.chain_seq);
                    t.since = t.since.min(r.event.at);
                }
                None => {
                    self.unsigned.insert(
                        r.chain.clone(),
                        UnsignedTail {
                            first_seq: r.chain_seq,
                            last_seq: r.chain_seq,
                            rows: 1,
                            since: r.event.at,
                        },
                    );
                }
            }
        }
        if let Err(b) = self.verifier.check(r) {
            if self.broken.len() < MAX_BROKEN_SHOWN {
                self.broken.push(b);
            } else {
                self.more_broken += 1;
            }
        }
    }

    /// The verdict: lines to print, and whether everything held. `trailer` is the export's
    /// last line (none for the database, or for a file that has none).
    pub fn finish(
        mut self,
        trailer: Option<&ExportTrailer>,
        from_file: bool,
    ) -> (bool, Vec<String>) {
        let mut out = Vec::new();
        let mut broken: Vec<String> = self
            .broken
            .iter()
            .map(|b| {
                format!(
                    "chain {} at chain_seq {}{}: {}",
                    b.chain,
                    b.chain_seq,
                    b.id.map(|i| format!(" (id {i})")).unwrap_or_default(),
                    b.reason
                )
            })
            .collect();
        if self.more_broken > 0 {
            broken.push(format!("and {} more broken rows", self.more_broken));
        }
        self.problems.splice(0..0, broken);
        let walked = self.verifier.rows;
        if from_file && self.expect.is_some() {
            match trailer {
                None => self.problems.push(format!(
                    "the export ends after {walked} rows without its closing line: it was cut short"
                )),
                Some(t) if t.rows != walked => self.problems.push(format!(
                    "the export says it holds {} rows but {walked} were read: rows were removed or added",
                    t.rows
                )),
                Some(t) if t.digest != hex::encode(self.digest.clone().finalize()) => self
                    .problems
                    .push("the export's rows differ from those it was written with (digest mismatch)".into()),
                Some(_) => {}
            }
        }
        match (&self.expect, &self.filter) {
            (Some(expect), None) => {
                let (problems, notes) = self.verifier.complete(expect);
                self.problems.extend(problems);
                self.notes.extend(notes);
            }
            (Some(_), Some(f)) => {
                let unconfirmed = self.verifier.unconfirmed();
                self.notes.push(format!(
                    "filtered export ({}): {walked} rows; each row's hash and {} links between consecutive rows checked within the selection; completeness against the chain heads cannot be checked on a filtered export{}",
                    describe(f),
                    self.verifier.links,
                    if unconfirmed > 0 { format!(" ({unconfirmed} checkpointed rows fall outside it)") } else { String::new() }
                ));
            }
            (None, _) => {
                for c in &self.verifier.trimmed_chains {
                    self.notes.push(format!(
                        "chain {c} starts mid-chain; this export has no header, so it cannot say whether retention dropped the first rows"
                    ));
                }
                self.notes.push(
                    "this export has no header or closing line (an older format): a cut or a removed chain cannot be detected".into(),
                );
            }
        }
        let ok = self.problems.is_empty();
        if ok {
            out.push(format!(
                "ok: {walked} rows in {} chains, every hash chain intact{}",
                self.verifier.chains(),
                if self.filter.is_none() && self.expect.is_some() {
                    " and complete up to its recorded head"
                } else {
                    ""
                }
            ));
        } else {
            for p in &self.problems {
                out.push(format!("BROKEN: {p}"));
            }
        }
        for n in &self.notes {
            out.push(format!("note: {n}"));
        }
        if self.keyed {
            out.push(format!(
                "checkpoints: {} verified{}, {} checkpointed rows found with their signed hashes",
                self.checkpoints_verified,
                self.newest_checkpoint
                    .map(|t| format!(
                        " (newest {})",
                        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ))
                    .unwrap_or_default(),
                self.verifier.confirmed
            ));
            if self.checkpoints_verified == 0 {
                out.push("warning: no checkpoint signed by this key was found: a re-hashed chain, or a log emptied together with its heads, cannot be detected".into());
            }
            out.extend(self.unsigned_tail());
        } else {
            out.push("warning: no --public-key given, so signed checkpoints were not checked: a chain edited and re-hashed by someone with write access to the database (heads included) cannot be detected".into());
        }
        (ok, out)
    }
}

impl Verification {
    /// "unsigned tail: N rows since T", then the chains they are in: the rows no checkpoint
    /// covers, whose deletion (with the heads rewritten) a verifier could not see.
    fn unsigned_tail(&self) -> Vec<String> {
        let time = |t: chrono::DateTime<chrono::Utc>| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        };
        let rows: u64 = self.unsigned.values().map(|t| t.rows).sum();
        let Some(since) = self.unsigned.values().map(|t| t.since).min() else {
            return vec![
                "unsigned tail: none (every row walked is covered by a signed checkpoint)".into(),
            ];
        };
        let mut out = vec![format!(
            "unsigned tail: {rows} rows since {} (newer than the last checkpoint of their chain: deleting them with the heads rewritten could not be detected{})",
            time(since),
            if self.filter.is_some() {
                "; counted within this filtered export"
            } else {
                ""
            }
        )];
        let mut chains: Vec<(&String, &UnsignedTail)> = self.unsigned.iter().collect();
        chains.sort_by_key(|(_, t)| std::cmp::Reverse(t.since));
        for (chain, t) in chains.iter().take(TAIL_CHAINS_SHOWN) {
            let signed = self.signed_through.get(*chain).map_or_else(
                || "no row of it is signed".to_owned(),
                |s| format!("signed through row {s}"),
            );
            out.push(format!(
                "  chain {chain}: {} rows, {} to {}, since {} ({signed})",
                t.rows,
                t.first_seq,
                t.last_seq,
                time(t.since)
            ));
        }
        if chains.len() > TAIL_CHAINS_SHOWN {
            out.push(format!(
                "  and {} more chains",
                chains.len() - TAIL_CHAINS_SHOWN
            ));
        }
        out
    }
}

/// Broken rows named one by one in a verdict; beyond, they are counted.
const MAX_BROKEN_SHOWN: usize = 100;

/// Every filter of an export, as the verdict's note names them.
fn describe(f: &AuditFilter) -> String {
    let mut parts = Vec::new();
    if let Some(v) = f.since {
        parts.push(format!("since {}", v.to_rfc3339()));
    }
    if let Some(v) = f.until {
        parts.push(format!("until {}", v.to_rfc3339()));
    }
    for (name, v) in [
        ("agent", f.agent.as_deref()),
        ("tool", f.tool.as_deref()),
        ("event_type", f.event_type.map(super::EventKind::as_str)),
        ("outcome", f.outcome.map(super::Outcome::as_str)),
        ("person", f.person.as_deref()),
        ("client_id", f.client_id.as_deref()),
    ] {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            parts.push(format!("{name}={v}"));
        }
    }
    if let Some(v) = f.min_latency_ms {
        parts.push(format!("min_latency_ms={v}"));
    }
    if let Some(v) = f.after_id {
        parts.push(format!("after_id={v}"));
    }
    parts.join(", ")
}

/// The whole export as a stream of chunks: for JSONL a header (filter, heads, ledger,
/// checkpoints, from the same snapshot as the rows), the rows, and a closing line; for CSV
/// a header row and the rows. One row in memory at a time, whatever the range.
pub fn stream(
    pool: sqlx::PgPool,
    format: Format,
    filter: AuditFilter,
) -> impl futures::Stream<Item = Result<bytes::Bytes, sqlx::Error>> + Send + 'static {
    use crate::db::audit::Snapshot;
    use futures::StreamExt;
    struct State {
        items: futures::stream::BoxStream<'static, sqlx::Result<Snapshot>>,
        jsonl: Option<JsonlExport>,
        format: Format,
        filter: AuditFilter,
        failed: bool,
    }
    let state = State {
        items: crate::db::audit::snapshot(pool, filter.clone()).boxed(),
        jsonl: None,
        format,
        filter,
        failed: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.failed {
            return None;
        }
        let chunk = match st.items.next().await {
            Some(Ok(Snapshot::Expect(e))) => match st.format {
                Format::Jsonl => {
                    let (expect, checkpoints) = *e;
                    let (j, header) = JsonlExport::header(&st.filter, expect, checkpoints);
                    st.jsonl = Some(j);
                    Ok(header)
                }
                Format::Csv => Ok(csv_header()),
                // Each record stands alone.
                Format::Ocsf | Format::Cef => Ok(Vec::new()),
            },
            Some(Ok(Snapshot::Cursor(next))) => {
                if let (Some(j), Some(next)) = (st.jsonl.as_mut(), next) {
                    j.next_after_id = Some(next);
                }
                Ok(Vec::new())
            }
            Some(Ok(Snapshot::Row(row))) => Ok(match st.jsonl.as_mut() {
                Some(j) => j.row(&row),
                None => st.format.line(&row),
            }),
            // A failed read ends the export without its closing line, so that verify
            // says it was cut short.
            Some(Err(e)) => {
                st.failed = true;
                Err(e)
            }
            None => {
                return st
                    .jsonl
                    .take()
                    .map(|j| (Ok(bytes::Bytes::from(j.trailer())), st));
            }
        };
        Some((chunk.map(bytes::Bytes::from), st))
    })
}
