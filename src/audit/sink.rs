//! Push, not only pull: audit sinks (`serve --audit-sink URL`, repeatable).
//!
//! Each sink is delivered from a durable cursor in PostgreSQL (`audit_sink_cursors`), shared
//! by the instances: one at a time holds the sink's row lock, reads the rows after the cursor
//! in commit order (see `after_id`), sends them, and moves the cursor once the receiver has
//! taken them. Delivery is at least once: a batch sent but not acknowledged (a receiver killed
//! mid-batch, an instance stopped) is sent again; each record carries its row id to tell a
//! duplicate. Sinks run beside the request path and never touch it: a sink that is down only
//! grows its lag, retried with backoff.
//!
//! Schemes: `syslog+tcp://host:port` and `syslog+tls://host:port` (RFC 5424 over RFC 6587
//! octet counting, CEF or OCSF JSON as the message; `?ca=/path.pem` for a private CA),
//! `http(s)://host/path` (batches of JSON lines, or Splunk HEC with `?format=hec`; the URL's
//! password is sent as a bearer token, `Splunk <token>` for HEC), and `otlp+http://host:port`
//! (OpenTelemetry logs, OTLP/HTTP protobuf, to `/v1/logs`). `?format=ocsf|cef|jsonl`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::chain::ChainedEvent;
use super::siem;
use crate::db;
use crate::db::sinks::Position;

/// Rows per batch.
const BATCH: i64 = 500;
/// How often an idle sink looks for new rows.
const POLL: Duration = Duration::from_millis(500);
/// Longest wait between attempts at a sink that is down.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// One send's deadline.
const SEND_TIMEOUT: Duration = Duration::from_secs(15);
/// How long rows written to a syslog connection may still be lost with it. Syslog over TCP
/// has no acknowledgement: a receiver that stops drops what its socket and queues held, and
/// the writes had succeeded. When a connection ends, the batches written on it this recently
/// are sent again (each message carries its row id, so a receiver can drop the duplicates).
const SYSLOG_REPLAY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkFormat {
    Ocsf,
    Cef,
    Jsonl,
    /// Splunk's HTTP Event Collector: one `{"time", "event": row}` object per row.
    Hec,
}

/// Not `Debug`: it holds the sink's token.
#[derive(Clone)]
enum Transport {
    Syslog {
        host: String,
        port: u16,
        tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
    },
    Http {
        url: url::Url,
        token: Option<String>,
    },
    Otlp {
        url: url::Url,
    },
}

/// One configured sink. Its `Debug` shows only `name`: the transport holds the token.
#[derive(Clone)]
pub struct Sink {
    /// The URL without its credentials: the cursor's key, and what metrics and logs name.
    pub name: String,
    format: SinkFormat,
    transport: Transport,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Sink {
    /// Parses `--audit-sink URL`; an error names what is wrong.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let url = url::Url::parse(raw.trim())
            .map_err(|e| format!("audit sink `{}`: not a URL: {e}", redact(raw)))?;
        let bad = |why: &str| format!("audit sink `{}`: {why}", redact(raw));
        let mut format = None;
        let mut ca = None;
        for (k, v) in url.query_pairs() {
            match k.as_ref() {
                "format" => {
                    format = Some(match v.as_ref() {
                        "ocsf" => SinkFormat::Ocsf,
                        "cef" => SinkFormat::Cef,
                        "jsonl" => SinkFormat::Jsonl,
                        "hec" => SinkFormat::Hec,
                        other => {
                            return Err(bad(&format!(
                                "unknown format `{other}` (ocsf, cef, jsonl, or hec for https)"
                            )));
                        }
                    })
                }
                "ca" => ca = Some(v.into_owned()),
                other => return Err(bad(&format!("unknown parameter `{other}`"))),
            }
        }
        let host = url
            .host_str()
            .ok_or_else(|| bad("no host"))?
            .trim_matches(['[', ']'])
            .to_owned();
        let token = match (url.username(), url.password()) {
            ("", None) => None,
            (_, Some(p)) => Some(percent(p)),
            (u, None) => Some(percent(u)),
        };
        let (transport, default_format) = match url.scheme() {
            "syslog+tcp" | "syslog+tls" => {
                let port = url
                    .port()
                    .ok_or_else(|| bad("a syslog sink needs a port"))?;
                let tls = if url.scheme() == "syslog+tls" {
                    Some(Arc::new(tls_config(ca.as_deref()).map_err(|e| bad(&e))?))
                } else {
                    None
                };
                (Transport::Syslog { host, port, tls }, SinkFormat::Cef)
            }
            "http" | "https" => {
                let mut clean = url.clone();
                let _ = clean.set_username("");
                let _ = clean.set_password(None);
                clean.set_query(None);
                (Transport::Http { url: clean, token }, SinkFormat::Jsonl)
            }
            "otlp+http" | "otlp+https" => {
                let scheme = if url.scheme() == "otlp+https" {
                    "https"
                } else {
                    "http"
                };
                let path = if url.path().is_empty() || url.path() == "/" {
                    "/v1/logs"
                } else {
                    url.path()
                };
                let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
                let target = url::Url::parse(&format!(
                    "{scheme}://{}{port}{path}",
                    url.host_str().unwrap_or_default()
                ))
                .map_err(|e| bad(&e.to_string()))?;
                (Transport::Otlp { url: target }, SinkFormat::Ocsf)
            }
            other => {
                return Err(bad(&format!(
                    "unknown scheme `{other}` (syslog+tcp, syslog+tls, http, https, otlp+http)"
                )));
            }
        };
        let format = format.unwrap_or(default_format);
        if format == SinkFormat::Hec && !matches!(transport, Transport::Http { .. }) {
            return Err(bad("format hec is for http(s) sinks"));
        }
        let mut name = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
        if let Some(p) = url.port() {
            name.push_str(&format!(":{p}"));
        }
        name.push_str(url.path().trim_end_matches('/'));
        name.push_str(&format!("?format={}", format_name(format)));
        Ok(Self {
            name,
            format,
            transport,
        })
    }
}

fn format_name(f: SinkFormat) -> &'static str {
    match f {
        SinkFormat::Ocsf => "ocsf",
        SinkFormat::Cef => "cef",
        SinkFormat::Jsonl => "jsonl",
        SinkFormat::Hec => "hec",
    }
}

fn percent(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// A sink URL as it may be logged: without its credentials.
fn redact(raw: &str) -> String {
    match url::Url::parse(raw.trim()) {
        Ok(mut u) => {
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.to_string()
        }
        Err(_) => "(unparseable)".into(),
    }
}

fn tls_config(ca: Option<&str>) -> Result<tokio_rustls::rustls::ClientConfig, String> {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca {
        let pem =
            std::fs::read(path).map_err(|e| format!("cannot read the CA file {path}: {e}"))?;
        use rustls::pki_types::pem::PemObject;
        let mut n = 0;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("the CA file {path}: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("the CA file {path}: {e}"))?;
            n += 1;
        }
        if n == 0 {
            return Err(format!("the CA file {path} holds no certificate"));
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

/// Starts one delivery task per sink.
pub fn spawn(pool: PgPool, sinks: Vec<Sink>, metrics: crate::metrics::Metrics) {
    for sink in sinks {
        tokio::spawn(run(pool.clone(), sink, metrics.clone()));
    }
}

/// A syslog connection kept between batches.
enum Conn {
    Tcp(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

struct Deliverer {
    sink: Sink,
    http: Option<oauth2::reqwest::Client>,
    conn: Option<Conn>,
    /// When each batch written on `conn` in the last [`SYSLOG_REPLAY`] was sent, and the
    /// cursor before it.
    written: std::collections::VecDeque<(tokio::time::Instant, Position)>,
    /// Where to take the cursor back to before the next batch: the connection ended.
    rewind: Option<Position>,
}

async fn run(pool: PgPool, sink: Sink, metrics: crate::metrics::Metrics) {
    let mut backoff = Duration::from_secs(1);
    while let Err(e) = db::sinks::ensure(&pool, &sink.name).await {
        tracing::warn!(sink = %sink.name, error = %e, "audit sink: cannot create its cursor; retrying");
        tokio::time::sleep(backoff).await;
    }
    let http = match sink.transport {
        Transport::Http { .. } | Transport::Otlp { .. } => oauth2::reqwest::ClientBuilder::new()
            .redirect(oauth2::reqwest::redirect::Policy::none())
            .timeout(SEND_TIMEOUT)
            .build()
            .ok(),
        Transport::Syslog { .. } => None,
    };
    let mut d = Deliverer {
        sink,
        http,
        conn: None,
        written: Default::default(),
        rewind: None,
    };
    loop {
        // An idle connection is watched too: rows the receiver lost come again without
        // waiting for new ones.
        d.probe().await;
        if let Some(to) = d.rewind.take() {
            tracing::info!(sink = %d.sink.name, after_id = to.id, "audit sink: the connection ended; sending its last rows again");
            if let Err(e) = super::follow::rewind(&pool, &d.sink.name, &to).await {
                tracing::warn!(sink = %d.sink.name, error = %e, "audit sink: cannot take the cursor back");
                d.rewind = Some(to);
            }
        }
        match d.once(&pool).await {
            Ok(n) => {
                backoff = Duration::from_secs(1);
                if n > 0 {
                    metrics
                        .sink_rows
                        .with_label_values(&[d.sink.name.as_str()])
                        .inc_by(n as u64);
                }
                if n < BATCH as usize {
                    tokio::time::sleep(POLL).await;
                }
            }
            Err(e) => {
                d.lost();
                metrics
                    .sink_errors
                    .with_label_values(&[d.sink.name.as_str()])
                    .inc();
                tracing::warn!(sink = %d.sink.name, error = %e, retry_in_ms = backoff.as_millis() as u64, "audit sink: delivery failed");
                let _ = db::sinks::failed(&pool, &d.sink.name, &e).await;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

impl Deliverer {
    /// One batch: rows delivered (0 when nothing is new or another instance has the sink).
    async fn once(&mut self, pool: &PgPool) -> Result<usize, String> {
        let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
        let Some(batch) = super::follow::next(pool, &mut tx, &self.sink.name, BATCH)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(0);
        };
        tokio::time::timeout(SEND_TIMEOUT, self.send(&batch.rows))
            .await
            .map_err(|_| "timed out".to_owned())??;
        if self.conn.is_some() {
            let now = tokio::time::Instant::now();
            while self
                .written
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > SYSLOG_REPLAY)
            {
                self.written.pop_front();
            }
            self.written.push_back((now, batch.from.clone()));
        }
        super::follow::done(&mut tx, &self.sink.name, &batch)
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(batch.rows.len())
    }

    /// The syslog connection ended (or failed): the rows written on it lately may be lost.
    fn lost(&mut self) {
        self.conn = None;
        let now = tokio::time::Instant::now();
        if let Some((_, from)) = self
            .written
            .iter()
            .find(|(at, _)| now.duration_since(*at) <= SYSLOG_REPLAY)
        {
            self.rewind = Some(from.clone());
        }
        self.written.clear();
    }

    /// Whether the receiver closed the syslog connection: a closed one still takes writes
    /// into the kernel's buffer, and they would be lost. Over TLS the end comes as a
    /// close_notify record before the FIN, so a peek on the socket sees a byte and not the
    /// end: read through the TLS layer, which turns either into end-of-stream or an error.
    /// The receiver never sends data, so whatever arrives is the end or noise to discard.
    async fn probe(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let mut b = [0u8; 64];
        let probe = match conn {
            Conn::Tcp(s) => tokio::time::timeout(Duration::ZERO, s.peek(&mut b[..1])).await,
            Conn::Tls(s) => tokio::time::timeout(Duration::ZERO, s.read(&mut b)).await,
        };
        if let Ok(Ok(0)) | Ok(Err(_)) = probe {
            self.lost();
        }
    }

    async fn send(&mut self, rows: &[ChainedEvent]) -> Result<(), String> {
        match self.sink.transport.clone() {
            Transport::Syslog { host, port, tls } => self.syslog(&host, port, tls, rows).await,
            Transport::Http { url, token } => {
                let (body, content_type) = match self.sink.format {
                    SinkFormat::Hec => (lines(rows, hec), "application/json"),
                    SinkFormat::Cef => (lines(rows, siem::cef), "text/plain; charset=utf-8"),
                    SinkFormat::Ocsf => (
                        lines(rows, |r| siem::ocsf(r).to_string()),
                        "application/x-ndjson",
                    ),
                    SinkFormat::Jsonl => (
                        lines(rows, |r| siem::row(r).to_string()),
                        "application/x-ndjson",
                    ),
                };
                let mut req = self
                    .http
                    .as_ref()
                    .ok_or("no HTTP client")?
                    .post(url)
                    .header("content-type", content_type)
                    .body(body);
                if let Some(t) = token {
                    let scheme = if self.sink.format == SinkFormat::Hec {
                        "Splunk"
                    } else {
                        "Bearer"
                    };
                    req = req.header("authorization", format!("{scheme} {t}"));
                }
                let resp = req.send().await.map_err(|e| e.to_string())?;
                if !resp.status().is_success() {
                    return Err(format!("the receiver answered {}", resp.status()));
                }
                Ok(())
            }
            Transport::Otlp { url } => {
                let body = otlp_logs(rows, self.sink.format);
                let resp = self
                    .http
                    .as_ref()
                    .ok_or("no HTTP client")?
                    .post(url)
                    .header("content-type", "application/x-protobuf")
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if !resp.status().is_success() {
                    return Err(format!("the receiver answered {}", resp.status()));
                }
                Ok(())
            }
        }
    }

    async fn syslog(
        &mut self,
        host: &str,
        port: u16,
        tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
        rows: &[ChainedEvent],
    ) -> Result<(), String> {
        self.probe().await;
        if self.conn.is_none() {
            let tcp = tokio::net::TcpStream::connect((host, port))
                .await
                .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            self.conn = Some(match tls {
                None => Conn::Tcp(tcp),
                Some(cfg) => {
                    let name =
                        tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_owned())
                            .map_err(|e| e.to_string())?;
                    let s = tokio_rustls::TlsConnector::from(cfg)
                        .connect(name, tcp)
                        .await
                        .map_err(|e| format!("TLS with {host}:{port}: {e}"))?;
                    Conn::Tls(Box::new(s))
                }
            });
        }
        let mut out = Vec::new();
        for r in rows {
            let frame = syslog_frame(r, self.sink.format);
            out.extend_from_slice(format!("{} ", frame.len()).as_bytes());
            out.extend_from_slice(frame.as_bytes());
        }
        let res = match self.conn.as_mut() {
            Some(Conn::Tcp(s)) => {
                async {
                    s.write_all(&out).await?;
                    s.flush().await
                }
                .await
            }
            Some(Conn::Tls(s)) => {
                async {
                    s.write_all(&out).await?;
                    s.flush().await
                }
                .await
            }
            None => return Err("not connected".into()),
        };
        res.map_err(|e| format!("writing to {host}:{port}: {e}"))
    }
}

fn lines(rows: &[ChainedEvent], f: impl Fn(&ChainedEvent) -> String) -> Vec<u8> {
    let mut out = Vec::new();
    for r in rows {
        out.extend_from_slice(f(r).as_bytes());
        out.push(b'\n');
    }
    out
}

fn hec(r: &ChainedEvent) -> String {
    serde_json::json!({
        "time": r.event.at.timestamp_micros() as f64 / 1e6,
        "host": r.instance,
        "source": "toolgate",
        "sourcetype": "toolgate:audit",
        "event": siem::row(r),
    })
    .to_string()
}

/// RFC 5424: facility 13 (log audit), the row's severity, the event type as MSGID, the row id
/// and hash as structured data, and the record as the message.
fn syslog_frame(r: &ChainedEvent, format: SinkFormat) -> String {
    let pri = 13 * 8 + u32::from(siem::severity(r).syslog());
    let host: String = r
        .instance
        .split(':')
        .next()
        .unwrap_or("-")
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(255)
        .collect();
    let msgid: String = r
        .event
        .event_type
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(32)
        .collect();
    let msg = match format {
        SinkFormat::Ocsf => siem::ocsf(r).to_string(),
        SinkFormat::Jsonl | SinkFormat::Hec => siem::row(r).to_string(),
        SinkFormat::Cef => siem::cef(r),
    };
    format!(
        "<{pri}>1 {} {} toolgate - {} [toolgate@32473 id=\"{}\" chain_seq=\"{}\"] {msg}",
        r.event
            .at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        if host.is_empty() { "-".into() } else { host },
        if msgid.is_empty() { "-".into() } else { msgid },
        r.id.unwrap_or_default(),
        r.chain_seq,
    )
}

/// An OTLP `ExportLogsServiceRequest`: one log record per row, the record (OCSF by default) as
/// its body, the row id, event type and chain as attributes.
fn otlp_logs(rows: &[ChainedEvent], format: SinkFormat) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use prost::Message;
    let s = |v: String| {
        Some(AnyValue {
            value: Some(V::StringValue(v)),
        })
    };
    let kv = |k: &str, v: Option<AnyValue>| KeyValue {
        key: k.into(),
        value: v,
        ..Default::default()
    };
    let records = rows
        .iter()
        .map(|r| {
            let sev = siem::severity(r);
            let body = match format {
                SinkFormat::Cef => siem::cef(r),
                SinkFormat::Jsonl | SinkFormat::Hec => siem::row(r).to_string(),
                SinkFormat::Ocsf => siem::ocsf(r).to_string(),
            };
            let nanos = r.event.at.timestamp_micros().max(0) as u64 * 1000;
            LogRecord {
                time_unix_nano: nanos,
                observed_time_unix_nano: nanos,
                severity_number: match sev {
                    siem::Severity::Info => 9,
                    siem::Severity::Low => 10,
                    siem::Severity::Medium => 13,
                },
                severity_text: sev.as_str().to_uppercase(),
                event_name: format!("toolgate.audit.{}", r.event.event_type),
                body: s(body),
                attributes: vec![
                    kv(
                        "toolgate.audit.id",
                        Some(AnyValue {
                            value: Some(V::IntValue(r.id.unwrap_or_default())),
                        }),
                    ),
                    kv("toolgate.audit.event_type", s(r.event.event_type.clone())),
                    kv("toolgate.audit.outcome", s(r.event.outcome.clone())),
                    kv("toolgate.audit.chain", s(r.chain.clone())),
                    kv("toolgate.audit.hash", s(r.hash.clone())),
                ],
                ..Default::default()
            }
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![kv("service.name", s("toolgate".into()))],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "toolgate.audit".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                log_records: records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_urls_parse_and_their_names_hold_no_secret() {
        let s = Sink::parse("https://user:s3cret@siem.example:8088/services/collector?format=hec")
            .unwrap();
        assert_eq!(
            s.name,
            "https://siem.example:8088/services/collector?format=hec"
        );
        let s = Sink::parse("syslog+tcp://127.0.0.1:6514").unwrap();
        assert_eq!(s.name, "syslog+tcp://127.0.0.1:6514?format=cef");
        let s = Sink::parse("otlp+http://127.0.0.1:4318").unwrap();
        assert!(matches!(&s.transport, Transport::Otlp { url } if url.path() == "/v1/logs"));
        for bad in [
            "ftp://x",
            "syslog+tcp://host",
            "https://x/?format=xml",
            "syslog+tcp://h:1?format=hec",
            "https://x/?token=abc",
        ] {
            let e = Sink::parse(bad).unwrap_err();
            assert!(e.starts_with("audit sink"), "{e}");
        }
        let e = Sink::parse("https://u:topsecret@x/?format=xml").unwrap_err();
        assert!(!e.contains("topsecret"), "{e}");
    }
}
