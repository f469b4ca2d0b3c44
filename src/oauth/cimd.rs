//! Client ID Metadata Documents: a `client_id` that is an https URL names a JSON document,
//! published by the host, that says what the client is called and where it may be redirected.
//!
//! Fetching a URL an outsider chose is server-side request forgery waiting to happen, so the
//! fetch is fenced: https only, the host resolved once and every address it resolves to must
//! be public (no private, loopback, link-local, CGNAT, multicast or unspecified address), the
//! connection made to that vetted address only (so a second DNS answer cannot rebind it), no
//! redirects, no proxy, 64 KiB read incrementally, 5 s in all. Documents are cached in a
//! bounded map for what their `Cache-Control: max-age` says, within limits.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
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
    #[error("the client's host resolves to an address this server will not connect to ({0})")]
    Forbidden(IpAddr),
    #[error("the client's host could not be resolved")]
    Unresolved,
    #[error("fetching the client's metadata document failed: {0}")]
    Fetch(String),
    #[error("the client's metadata document took longer than {} s", FETCH_TIMEOUT.as_secs())]
    Timeout,
    #[error("the client's metadata document is larger than {} KiB", MAX_DOCUMENT_BYTES / 1024)]
    TooLarge,
    #[error("the client's metadata document is not valid: {0}")]
    Invalid(String),
}

/// Whether this server may connect to `ip` when fetching an outsider's document.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            // An IPv4 address dressed as IPv6 is judged as what it is.
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated) fec0::/10
                || (s[0] == 0x64 && s[1] == 0xff9b) // NAT64 64:ff9b::/96 reaches IPv4 inside
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x2002)) // 6to4 embeds an IPv4 address
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    !(ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_unspecified()
        || ip.is_documentation()
        || o[0] == 0 // "this network"
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // CGNAT 100.64.0.0/10
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking 198.18.0.0/15
        || o[0] >= 240) // reserved
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
    entries: Mutex<HashMap<String, (Instant, Arc<ClientMetadata>)>>,
}

impl CimdCache {
    pub fn new(allow_private: bool) -> Self {
        Self {
            allow_private,
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
            Some(url::Host::Domain(name)) => tokio::net::lookup_host((name, port))
                .await
                .map_err(|_| CimdError::Unresolved)?
                .collect(),
            None => return Err(CimdError::BadUrl("no host".into())),
        };
        if addrs.is_empty() {
            return Err(CimdError::Unresolved);
        }
        // Every answer must be fit: a name that also resolves inside is refused outright.
        if !self.allow_private
            && let Some(bad) = addrs.iter().find(|a| !is_public(a.ip()))
        {
            return Err(CimdError::Forbidden(bad.ip()));
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
        super::authorize::check_registered_redirect(u).map_err(CimdError::Invalid)?;
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

    #[test]
    fn inside_addresses_are_refused() {
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
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
        ] {
            assert!(!is_public(a.parse().unwrap()), "{a} must be refused");
        }
        for a in ["93.184.216.34", "100.128.0.1", "2606:4700::1111", "8.8.8.8"] {
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
