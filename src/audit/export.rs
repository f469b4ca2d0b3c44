//! Compliance export: CSV (formula-safe) and JSONL (with the chain fields, verifiable offline).

use super::chain::ChainedEvent;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Csv,
    Jsonl,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Csv => "text/csv; charset=utf-8",
            Format::Jsonl => "application/x-ndjson",
        }
    }
}

pub const CSV_HEADER: [&str; 31] = [
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
        "toolgate-audit-v1".to_owned(),
        csv_safe(r.flags.as_deref().unwrap_or("")),
    ];
    let mut w = csv::Writer::from_writer(Vec::new());
    let _ = w.write_record(&record);
    w.into_inner().unwrap_or_default()
}

pub fn jsonl_line(r: &ChainedEvent) -> Vec<u8> {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
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
