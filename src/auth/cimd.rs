//! Client ID Metadata Documents: a `client_id` that is an https URL names a JSON document,
//! published by the host, that says what the client is called and where it may be redirected.
//!
//! Fetching a URL an outsider chose is server-side request forgery waiting to happen, so the
//! fetch is fenced: https only, the host resolved once and every address it resolves to must
//! be public (in no IANA special-purpose block, IPv4 or IPv6, and for IPv6 in global unicast:
//! see [`SPECIAL_V4`] and [`SPECIAL_V6`]), the
//! connection made to that vetted address only (so a second DNS answer cannot rebind it), no
//! redirects, no proxy, 64 KiB read incrementally, 5 s in all. Documents are cached in a
//! bounded map for what their `Cache-Control: max-age` says, within limits.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Largest document read.
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024;
/// Whole fetch, from resolving the name to the last byte.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Documents kept at most; when full, expired ones go, then the whole cache.
const MAX_CACHED: usize = 1024;
/// How long a document is kept when it says nothing, and at most whatever it says.
const DEFAULT_TTL: Duration = Duration::from_secs(300);
const MAX_TTL: Duration = Duration::from_secs(3600);
/// Longest client id URL accepted (it is stored with every consent and audit row).
const MAX_URL: usize = 512;
const MAX_REDIRECT_URIS: usize = 20;
const MAX_NAME: usize = 200;

/// What the authorization server takes from a metadata document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientMetadata {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
}

/// Why a client id URL was not accepted; shown to the person on the authorize page.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CimdError {
    #[error("the client_id URL is not valid: {0}")]
    BadUrl(String),
    /// The host does not resolve, or resolves to an address that is not public. One message
    /// for both, naming no address: a stranger must not learn from this page what a name
    /// resolves to, nor whether it resolves at all (inside names would otherwise show).
    #[error(
        "this server will not connect to the client's host: it must resolve, and only to public addresses"
    )]
    Unreachable,
    #[error("fetching the client's metadata document failed: {0}")]
    Fetch(String),
    #[error("the client's metadata document took longer than {} s", FETCH_TIMEOUT.as_secs())]
    Timeout,
    #[error("the client's metadata document is larger than {} KiB", MAX_DOCUMENT_BYTES / 1024)]
    TooLarge,
    #[error("the client's metadata document is not valid: {0}")]
    Invalid(String),
}

/// IPv4 blocks never fetched from: every entry of IANA's IPv4 Special-Purpose Address
/// Registry (RFC 6890 and its updates), multicast and the reserved 240/4. Some of these are
/// "globally reachable" in the registry's sense (AS112, AMT, the PCP and TURN anycasts): no
/// metadata document is served from them, and a refusal costs nothing.
pub const SPECIAL_V4: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 8, "\"this network\" (RFC 791)"),
    ([10, 0, 0, 0], 8, "private use (RFC 1918)"),
    (
        [100, 64, 0, 0],
        10,
        "shared address space, CGNAT (RFC 6598)",
    ),
    ([127, 0, 0, 0], 8, "loopback (RFC 1122)"),
    ([169, 254, 0, 0], 16, "link local (RFC 3927)"),
    ([172, 16, 0, 0], 12, "private use (RFC 1918)"),
    (
        [192, 0, 0, 0],
        24,
        "IETF protocol assignments, DS-Lite, PCP/TURN anycast, NAT64 discovery (RFC 6890)",
    ),
    ([192, 0, 2, 0], 24, "documentation TEST-NET-1 (RFC 5737)"),
    ([192, 31, 196, 0], 24, "AS112-v4 (RFC 7535)"),
    ([192, 52, 193, 0], 24, "AMT (RFC 7450)"),
    (
        [192, 88, 99, 0],
        24,
        "6to4 relay anycast, deprecated (RFC 7526)",
    ),
    ([192, 168, 0, 0], 16, "private use (RFC 1918)"),
    (
        [192, 175, 48, 0],
        24,
        "direct delegation AS112 service (RFC 7534)",
    ),
    ([198, 18, 0, 0], 15, "benchmarking (RFC 2544)"),
    ([198, 51, 100, 0], 24, "documentation TEST-NET-2 (RFC 5737)"),
    ([203, 0, 113, 0], 24, "documentation TEST-NET-3 (RFC 5737)"),
    ([224, 0, 0, 0], 4, "multicast (RFC 5771)"),
    (
        [240, 0, 0, 0],
        4,
        "reserved, and the limited broadcast 255.255.255.255 (RFC 1112, RFC 919)",
    ),
];

/// IPv6 blocks never fetched from: every entry of IANA's IPv6 Special-Purpose Address
/// Registry, the deprecated IPv4-compatible and site-local blocks, and multicast. Every block
/// that embeds an IPv4 address (IPv4-compatible, IPv4-mapped, NAT64, 6to4, Teredo) is refused
/// whatever address it embeds: where such a packet ends up depends on translators this
/// server cannot see. Outside these, only global unicast (`2000::/3`) is fetched from.
pub const SPECIAL_V6: &[([u16; 8], u8, &str)] = &[
    (
        [0, 0, 0, 0, 0, 0, 0, 0],
        96,
        "IPv4-compatible, deprecated; with :: and ::1 (RFC 4291)",
    ),
    ([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, "IPv4-mapped (RFC 4291)"),
    (
        [0, 0, 0, 0, 0xffff, 0, 0, 0],
        96,
        "IPv4-translated (RFC 2765)",
    ),
    (
        [0x64, 0xff9b, 0, 0, 0, 0, 0, 0],
        96,
        "IPv4/IPv6 translation, NAT64 (RFC 6052)",
    ),
    (
        [0x64, 0xff9b, 1, 0, 0, 0, 0, 0],
        48,
        "local-use IPv4/IPv6 translation (RFC 8215)",
    ),
    ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only (RFC 6666)"),
    (
        [0x100, 0, 0, 1, 0, 0, 0, 0],
        64,
        "dummy IPv6 prefix (RFC 9780)",
    ),
    (
        [0x2001, 0, 0, 0, 0, 0, 0, 0],
        23,
        "IETF protocol assignments: PCP/TURN/DNS-SD anycast, benchmarking, AMT, AS112, ORCHID, DETs (RFC 2928)",
    ),
    ([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "Teredo (RFC 4380)"),
    (
        [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
        32,
        "documentation (RFC 3849)",
    ),
    ([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "6to4 (RFC 3056)"),
    (
        [0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0],
        48,
        "direct delegation AS112 service (RFC 7534)",
    ),
    (
        [0x3fff, 0, 0, 0, 0, 0, 0, 0],
        20,
        "documentation (RFC 9637)",
    ),
    (
        [0x5f00, 0, 0, 0, 0, 0, 0, 0],
        16,
        "segment routing SIDs (RFC 9602)",
    ),
    ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique local (RFC 4193)"),
    (
        [0xfe80, 0, 0, 0, 0, 0, 0, 0],
        10,
        "link-local unicast (RFC 4291)",
    ),
    (
        [0xfec0, 0, 0, 0, 0, 0, 0, 0],
        10,
        "site-local, deprecated (RFC 3879)",
    ),
    ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast (RFC 4291)"),
];

// ipnet (already used for trusted proxies) does the prefix arithmetic. A bad prefix length in a
// table would match nothing, which `every_special_purpose_block_is_refused_throughout` catches.
fn in_v4(ip: Ipv4Addr, (net, len, _): &([u8; 4], u8, &str)) -> bool {
    ipnet::Ipv4Net::new(Ipv4Addr::from(*net), *len).is_ok_and(|n| n.contains(&ip))
}

fn in_v6(ip: Ipv6Addr, (net, len, _): &([u16; 8], u8, &str)) -> bool {
    ipnet::Ipv6Net::new(Ipv6Addr::from(*net), *len).is_ok_and(|n| n.contains(&ip))
}

/// The special-purpose block `ip` falls in, if any (for logs and tests).
pub fn special_block(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => SPECIAL_V4.iter().find(|b| in_v4(v4, b)).map(|b| b.2),
        IpAddr::V6(v6) => SPECIAL_V6
            .iter()
            .find(|b| in_v6(v6, b))
            .map(|b| b.2)
            .or_else(|| (v6.segments()[0] & 0xe000 != 0x2000).then_some("not global unicast")),
    }
}

/// Whether this server may connect to `ip` when fetching an outsider's document.
pub fn is_public(ip: IpAddr) -> bool {
    special_block(ip).is_none()
}

/// Whether a `client_id` is meant as a metadata document URL (rather than a registered id).
pub fn is_url_client_id(client_id: &str) -> bool {
    client_id.starts_with("https://") || client_id.starts_with("http://")
}

/// Fetches and caches client metadata documents.
#[derive(Debug)]
pub struct CimdCache {
    /// Development only: http and loopback/private addresses allowed (tests serve documents
    /// from 127.0.0.1).
    allow_private: bool,
    /// Certificate authorities trusted beside the public roots (`--oauth-cimd-ca-file`).
    roots: Vec<reqwest013::Certificate>,
    entries: Mutex<HashMap<String, (Instant, Arc<ClientMetadata>)>>,
}

/// The certificates of a PEM file, for `--oauth-cimd-ca-file`; a file with none is an error
/// at start, not a silent no-op.
pub fn read_roots(path: &std::path::Path) -> anyhow::Result<Vec<reqwest013::Certificate>> {
    use anyhow::Context;
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let certs = reqwest013::Certificate::from_pem_bundle(&pem)
        .with_context(|| format!("{} is not a PEM certificate bundle", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

impl CimdCache {
    pub fn new(allow_private: bool, roots: Vec<reqwest013::Certificate>) -> Self {
        Self {
            allow_private,
            roots,
            entries: Mutex::default(),
        }
    }

    /// The metadata of `client_id`, from the cache or fetched.
    pub async fn get(&self, client_id: &str) -> Result<Arc<ClientMetadata>, CimdError> {
        let lock = || self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if let Some((until, m)) = lock().get(client_id)
            && *until > now
        {
            return Ok(m.clone());
        }
        let (meta, ttl) = tokio::time::timeout(FETCH_TIMEOUT, self.fetch(client_id))
            .await
            .map_err(|_| CimdError::Timeout)??;
        let meta = Arc::new(meta);
        if !ttl.is_zero() {
            let mut entries = lock();
            if entries.len() >= MAX_CACHED {
                entries.retain(|_, (until, _)| *until > now);
                if entries.len() >= MAX_CACHED {
                    entries.clear();
                }
            }
            entries.insert(client_id.to_owned(), (now + ttl, meta.clone()));
        }
        Ok(meta)
    }

    /// Checks the URL, vets the address, fetches and validates; the document and how long to
    /// keep it.
    async fn fetch(&self, client_id: &str) -> Result<(ClientMetadata, Duration), CimdError> {
        let url = self.check_url(client_id)?;
        let host = url
            .host_str()
            .ok_or_else(|| CimdError::BadUrl("no host".into()))?
            .to_owned();
        let port = url.port_or_known_default().unwrap_or(443);
        let addr = self.vetted_address(&url, port).await?;
        let client = reqwest013::Client::builder()
            .redirect(reqwest013::redirect::Policy::none())
            .no_proxy()
            // The name resolves to the address vetted above and nothing else.
            .resolve(host.trim_start_matches('[').trim_end_matches(']'), addr)
            .tls_certs_merge(self.roots.iter().cloned())
            .timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|e| CimdError::Fetch(e.to_string()))?;
        let mut response = client
            .get(url.as_str())
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| CimdError::Fetch(without_url(&e)))?;
        let status = response.status();
        if status.is_redirection() {
            return Err(CimdError::Fetch(format!(
                "it answered with a redirect ({status}); redirects are not followed"
            )));
        }
        if !status.is_success() {
            return Err(CimdError::Fetch(format!("it answered {status}")));
        }
        if response
            .content_length()
            .is_some_and(|l| l > MAX_DOCUMENT_BYTES as u64)
        {
            return Err(CimdError::TooLarge);
        }
        let ttl = cache_ttl(
            response
                .headers()
                .get("cache-control")
                .and_then(|v| v.to_str().ok()),
        );
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| CimdError::Fetch(without_url(&e)))?
        {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(CimdError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok((parse_document(client_id, &body)?, ttl))
    }

    fn check_url(&self, client_id: &str) -> Result<url::Url, CimdError> {
        if client_id.len() > MAX_URL {
            return Err(CimdError::BadUrl(format!("longer than {MAX_URL} bytes")));
        }
        let url = url::Url::parse(client_id).map_err(|e| CimdError::BadUrl(e.to_string()))?;
        match url.scheme() {
            "https" => {}
            "http" if self.allow_private => {}
            _ => return Err(CimdError::BadUrl("it must be an https URL".into())),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(CimdError::BadUrl("it must not carry credentials".into()));
        }
        if url.fragment().is_some() {
            return Err(CimdError::BadUrl("it must not have a fragment".into()));
        }
        if url.path() == "/" || url.path().is_empty() {
            return Err(CimdError::BadUrl("it must have a path".into()));
        }
        // The parser removes dot segments; a URL that needed it is not the one the host
        // publishes as its id.
        if url.as_str() != client_id {
            return Err(CimdError::BadUrl("it is not in its normal form".into()));
        }
        Ok(url)
    }

    async fn vetted_address(&self, url: &url::Url, port: u16) -> Result<SocketAddr, CimdError> {
        let addrs: Vec<SocketAddr> = match url.host() {
            Some(url::Host::Ipv4(ip)) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
            Some(url::Host::Ipv6(ip)) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
            Some(url::Host::Domain(name)) => match tokio::net::lookup_host((name, port)).await {
                Ok(addrs) => addrs.collect(),
                Err(e) => {
                    tracing::info!(host = name, error = %e, "a client metadata document's host does not resolve");
                    return Err(CimdError::Unreachable);
                }
            },
            None => return Err(CimdError::BadUrl("no host".into())),
        };
        if addrs.is_empty() {
            return Err(CimdError::Unreachable);
        }
        // Every answer must be fit: a name that also resolves inside is refused outright.
        if !self.allow_private
            && let Some(bad) = addrs.iter().find(|a| !is_public(a.ip()))
        {
            // The operator may see where it pointed; the page does not say.
            tracing::info!(
                url = %url,
                address = %bad.ip(),
                block = special_block(bad.ip()).unwrap_or(""),
                "a client metadata document's host is not public; not fetched"
            );
            return Err(CimdError::Unreachable);
        }
        Ok(addrs[0])
    }
}

/// A reqwest error's text without the URL (which the person already sees).
fn without_url(e: &reqwest013::Error) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    if e.is_connect() {
        // A certificate the fetch does not trust says so (the host is public by then: the
        // fence ran first), so that a private CA's admin knows what to configure.
        let mut source = std::error::Error::source(e);
        while let Some(inner) = source {
            let text = inner.to_string();
            if text.contains("certificate") {
                return format!(
                    "its TLS certificate is not trusted ({text}); a private CA is trusted with --oauth-cimd-ca-file"
                );
            }
            source = inner.source();
        }
        return "could not connect".into();
    }
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(&format!(" ({u})"), "").replace(u.as_str(), "");
    }
    s
}

/// How long to keep a document: its `max-age` within [0, 1 h]; never for `no-store` or
/// `no-cache`.
fn cache_ttl(cache_control: Option<&str>) -> Duration {
    let Some(cc) = cache_control else {
        return DEFAULT_TTL;
    };
    let mut ttl = DEFAULT_TTL;
    for d in cc.split(',').map(str::trim) {
        let lower = d.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Duration::ZERO;
        }
        if let Some(v) = lower.strip_prefix("max-age=") {
            ttl = v
                .trim_matches('"')
                .parse::<u64>()
                .map(Duration::from_secs)
                .unwrap_or(DEFAULT_TTL)
                .min(MAX_TTL);
        }
    }
    ttl
}

/// Validates a document against the URL it was fetched from.
pub fn parse_document(client_id: &str, body: &[u8]) -> Result<ClientMetadata, CimdError> {
    let bad = |m: &str| CimdError::Invalid(m.to_owned());
    let v: Value = serde_json::from_slice(body).map_err(|_| bad("it is not JSON"))?;
    let o = v
        .as_object()
        .ok_or_else(|| bad("it is not a JSON object"))?;
    if o.get("client_id").and_then(Value::as_str) != Some(client_id) {
        return Err(bad("its client_id is not the URL it was fetched from"));
    }
    let name = o
        .get("client_name")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("client_name is missing"))?;
    if name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(bad("client_name is too long or holds control characters"));
    }
    // Only public clients are served this way: a document claiming a secret is refused.
    match o.get("token_endpoint_auth_method") {
        None => {}
        Some(Value::String(m)) if m == "none" => {}
        Some(_) => {
            return Err(bad(
                "token_endpoint_auth_method must be `none` (public clients with PKCE)",
            ));
        }
    }
    let uris = o
        .get("redirect_uris")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty() && a.len() <= MAX_REDIRECT_URIS)
        .ok_or_else(|| bad("redirect_uris must be a list of 1 to 20 URLs"))?;
    let mut redirect_uris = Vec::new();
    for u in uris {
        let u = u
            .as_str()
            .ok_or_else(|| bad("redirect_uris must be strings"))?;
        super::redirect::check_registered_redirect(u).map_err(CimdError::Invalid)?;
        redirect_uris.push(u.to_owned());
    }
    Ok(ClientMetadata {
        client_id: client_id.to_owned(),
        client_name: name.to_owned(),
        redirect_uris,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first, a middle and the last address of `len` bits at `net` (as u128 offsets).
    fn samples(bits: u32, len: u8) -> [u128; 3] {
        let host = bits - u32::from(len);
        let last = if host == 0 {
            0
        } else {
            u128::MAX >> (128 - host)
        };
        [0, last / 2, last]
    }

    #[test]
    fn every_special_purpose_block_is_refused_throughout() {
        for block in SPECIAL_V4 {
            let base = u32::from(Ipv4Addr::from(block.0));
            for off in samples(32, block.1) {
                let ip = Ipv4Addr::from(base | off as u32);
                assert!(!is_public(ip.into()), "{ip} ({}) must be refused", block.2);
            }
        }
        for block in SPECIAL_V6 {
            let base = u128::from(Ipv6Addr::from(block.0));
            for off in samples(128, block.1) {
                let ip = Ipv6Addr::from(base | off);
                assert!(!is_public(ip.into()), "{ip} ({}) must be refused", block.2);
            }
        }
    }

    #[test]
    fn inside_addresses_are_refused_however_they_are_written() {
        for a in [
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "127.0.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "192.88.99.1",
            "192.0.0.9",
            "::1",
            "::",
            "::7f00:1",
            "::a00:1",
            "fe80::1",
            "fc00::1",
            "fd12::1",
            "ff02::1",
            "fec0::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:8.8.8.8",
            "64:ff9b::a00:1",
            "64:ff9b::808:808",
            "64:ff9b:1::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:db8::1",
            "2002:7f00:1::1",
            "2002:808:808::1",
            "3fff::1",
            "5f00::1",
            "100::1",
            "4000::1",
        ] {
            assert!(!is_public(a.parse().unwrap()), "{a} must be refused");
        }
        for a in [
            "93.184.216.34",
            "100.128.0.1",
            "8.8.8.8",
            "1.1.1.1",
            "192.88.98.255",
            "192.88.100.0",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "2001:200::1",
            "2a00:1450:4001::1",
        ] {
            assert!(is_public(a.parse().unwrap()), "{a} is public");
        }
    }

    #[test]
    fn cache_control_is_honoured_within_limits() {
        assert_eq!(cache_ttl(None), DEFAULT_TTL);
        assert_eq!(cache_ttl(Some("max-age=60")), Duration::from_secs(60));
        assert_eq!(cache_ttl(Some("public, max-age=99999999")), MAX_TTL);
        assert_eq!(cache_ttl(Some("no-store")), Duration::ZERO);
        assert_eq!(cache_ttl(Some("max-age=0")), Duration::ZERO);
    }

    #[test]
    fn a_document_must_name_itself_and_be_public() {
        let id = "https://host.example/client.json";
        let ok = format!(
            r#"{{"client_id":"{id}","client_name":"Host","redirect_uris":["http://127.0.0.1/cb"],"token_endpoint_auth_method":"none"}}"#
        );
        assert!(parse_document(id, ok.as_bytes()).is_ok());
        let other = ok.replace("host.example", "evil.example");
        assert!(parse_document(id, other.as_bytes()).is_err());
        let secret = ok.replace(r#""none""#, r#""client_secret_basic""#);
        assert!(parse_document(id, secret.as_bytes()).is_err());
        assert!(parse_document(id, b"[]").is_err());
    }
}
