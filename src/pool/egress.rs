//! Where a group's scripts may connect: `x-toolgate-sandbox.egress`, a list of `host:port`
//! pairs (TCP), or `["*"]` for the host's whole network as before egress lists existed.
//!
//! A group with a list runs its scripts in a network namespace of its own with only loopback
//! (see [`super::jail`]); each listed pair is a forwarder the gateway runs: it listens inside
//! that namespace at the address the script dials (the listed IP, or a loopback address that
//! the namespace's `/etc/hosts` gives the listed name) and connects out from the gateway's own
//! network to the listed host and port. Nothing else leaves the namespace: no other TCP, no
//! UDP, no DNS, no way to the gateway's own backends.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

/// Most entries one group may list: each is a listening socket and a task of the gateway's.
pub const MAX_ENTRIES: usize = 64;

/// Most forwarded connections open at once for one group; past it new ones are closed at
/// once. A script that hoards connections spends its own group's budget, no one else's.
pub const MAX_CONNECTIONS: usize = 256;

/// How long the gateway waits for a listed host to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The host of an egress entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EgressHost {
    Ip(IpAddr),
    /// A DNS name, lower-cased; resolved by the gateway at each connection.
    Name(String),
}

/// One `host:port` a group's scripts may reach over TCP.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EgressTarget {
    pub host: EgressHost,
    pub port: u16,
}

impl fmt::Display for EgressTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            EgressHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            EgressHost::Ip(ip) => write!(f, "{ip}:{}", self.port),
            EgressHost::Name(name) => write!(f, "{name}:{}", self.port),
        }
    }
}

impl EgressTarget {
    /// Parses `host:port`: an IPv4 address, a bracketed IPv6 address or a DNS name, and a
    /// port from 1 to 65535.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("`{s}` is not a `host:port` pair: {why}");
        let (host, port) = s.rsplit_once(':').ok_or_else(|| bad("no `:port`"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?;
        let host = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            EgressHost::Ip(IpAddr::V6(
                v6.parse().map_err(|_| bad("not an IPv6 address"))?,
            ))
        } else if let Ok(v4) = host.parse::<Ipv4Addr>() {
            EgressHost::Ip(IpAddr::V4(v4))
        } else if host.contains(':') {
            return Err(bad("an IPv6 address goes in brackets, `[::1]:443`"));
        } else if is_dns_name(host) {
            EgressHost::Name(host.to_ascii_lowercase())
        } else {
            return Err(bad("the host is neither an IP address nor a DNS name"));
        };
        Ok(Self { host, port })
    }
}

/// Letters, digits and `-` in dot-separated labels of 1 to 63 characters, 253 at most in all,
/// the last label not all digits (`1.2.3.400` is a typo of an address, not a name).
fn is_dns_name(s: &str) -> bool {
    let labels: Vec<&str> = s.strip_suffix('.').unwrap_or(s).split('.').collect();
    s.len() <= 253
        && labels.iter().all(|l| {
            (1..=63).contains(&l.len())
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
        && labels
            .last()
            .is_some_and(|l| !l.chars().all(|c| c.is_ascii_digit()))
}

/// A group's egress: the pairs it lists, or the host's whole network.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "Vec<String>")]
pub enum Egress {
    /// Only these pairs, over TCP; by default none.
    Only(Vec<EgressTarget>),
    /// `["*"]`: the host's network, unconfined (as before egress lists existed).
    Any,
}

impl Egress {
    pub fn is_any(&self) -> bool {
        matches!(self, Egress::Any)
    }

    pub fn targets(&self) -> &[EgressTarget] {
        match self {
            Egress::Only(t) => t,
            Egress::Any => &[],
        }
    }
}

impl Default for Egress {
    fn default() -> Self {
        Egress::Only(Vec::new())
    }
}

impl TryFrom<Vec<String>> for Egress {
    type Error = String;

    fn try_from(entries: Vec<String>) -> Result<Self, String> {
        if entries.iter().any(|e| e == "*") {
            return if entries.len() == 1 {
                Ok(Egress::Any)
            } else {
                Err("`*` opens the whole network, so it must be the only entry".into())
            };
        }
        if entries.len() > MAX_ENTRIES {
            return Err(format!(
                "at most {MAX_ENTRIES} entries, found {}",
                entries.len()
            ));
        }
        let mut targets = entries
            .iter()
            .map(|e| EgressTarget::parse(e))
            .collect::<Result<Vec<_>, _>>()?;
        targets.sort();
        targets.dedup();
        Ok(Egress::Only(targets))
    }
}

/// Where a listed pair is dialled inside the namespace: the listed IP itself, or for a name
/// the loopback address `/etc/hosts` gives it there (127.77.0.1, 127.77.0.2, … one per name,
/// in the order of the sorted list).
pub fn listen_address(targets: &[EgressTarget], target: &EgressTarget) -> SocketAddr {
    let ip = match &target.host {
        EgressHost::Ip(ip) => *ip,
        EgressHost::Name(name) => IpAddr::V4(name_address(targets, name)),
    };
    SocketAddr::new(ip, target.port)
}

fn name_address(targets: &[EgressTarget], name: &str) -> Ipv4Addr {
    let mut names: Vec<&str> = targets
        .iter()
        .filter_map(|t| match &t.host {
            EgressHost::Name(n) => Some(n.as_str()),
            EgressHost::Ip(_) => None,
        })
        .collect();
    names.dedup();
    let index = names.iter().position(|n| *n == name).unwrap_or(0) as u32;
    // At most MAX_ENTRIES names, so this stays inside 127.77.0.0/16.
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 77, 0, 1)) + index)
}

/// The `/etc/hosts` lines that give each listed name its loopback address.
pub fn hosts_lines(targets: &[EgressTarget]) -> String {
    let mut out = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for t in targets {
        if let EgressHost::Name(name) = &t.host
            && seen.insert(name.as_str())
        {
            out.push_str(&format!("{} {name}\n", name_address(targets, name)));
        }
    }
    out
}

/// Serves one listed pair: accepts inside the group's namespace, connects from the gateway's.
/// Every connection ends when either side closes; all end when the task is aborted (the group
/// was unloaded).
pub async fn forward(
    listener: tokio::net::TcpListener,
    target: EgressTarget,
    budget: Arc<tokio::sync::Semaphore>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            // Reap finished connections so the set does not grow with every one ever made.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (mut inbound, _) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, say: wait a little rather than spin.
                tracing::warn!(target = %target, error = %e, "egress forwarder cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = budget.clone().try_acquire_owned() else {
            tracing::warn!(target = %target, limit = MAX_CONNECTIONS, "egress connection refused: the group has too many open");
            continue;
        };
        let target = target.clone();
        connections.spawn(async move {
            let _permit = permit;
            let connect = match &target.host {
                EgressHost::Ip(ip) => {
                    tokio::time::timeout(
                        CONNECT_TIMEOUT,
                        tokio::net::TcpStream::connect((*ip, target.port)),
                    )
                    .await
                }
                EgressHost::Name(name) => {
                    tokio::time::timeout(
                        CONNECT_TIMEOUT,
                        tokio::net::TcpStream::connect((name.as_str(), target.port)),
                    )
                    .await
                }
            };
            match connect {
                Ok(Ok(mut outbound)) => {
                    let _ = outbound.set_nodelay(true);
                    let _ = inbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(target = %target, error = %e, "egress connection failed");
                }
                Err(_) => {
                    tracing::debug!(target = %target, "egress connection timed out");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(entries: &[&str]) -> Result<Egress, String> {
        Egress::try_from(entries.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn entries_are_ips_bracketed_v6_or_names_with_a_port() {
        let e = egress(&["Api.Example.com:443", "10.0.0.5:5432", "[fd00::1]:80"]).unwrap();
        let shown: Vec<String> = e.targets().iter().map(|t| t.to_string()).collect();
        assert_eq!(
            shown,
            ["10.0.0.5:5432", "[fd00::1]:80", "api.example.com:443"]
        );
        assert_eq!(egress(&["*"]).unwrap(), Egress::Any);
        assert_eq!(egress(&[]).unwrap(), Egress::Only(vec![]));
        for (bad, why) in [
            ("example.com", "no `:port`"),
            ("example.com:0", "port must be"),
            ("example.com:70000", "port must be"),
            ("::1:80", "in brackets"),
            ("[nope]:80", "not an IPv6"),
            ("1.2.3.400:80", "neither"),
            ("-x.com:80", "neither"),
            ("a b:80", "neither"),
        ] {
            let e = egress(&[bad]).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let e = egress(&["*", "a.com:1"]).unwrap_err();
        assert!(e.contains("only entry"), "{e}");
        let many: Vec<String> = (1..=65).map(|p| format!("a.com:{p}")).collect();
        assert!(Egress::try_from(many).unwrap_err().contains("at most 64"));
    }

    #[test]
    fn names_get_one_loopback_address_each() {
        let e = egress(&["b.example:1", "a.example:2", "a.example:3", "10.1.1.1:4"]).unwrap();
        let t = e.targets();
        let addr = |s: &str| listen_address(t, &EgressTarget::parse(s).unwrap()).to_string();
        assert_eq!(addr("a.example:2"), "127.77.0.1:2");
        assert_eq!(addr("a.example:3"), "127.77.0.1:3");
        assert_eq!(addr("b.example:1"), "127.77.0.2:1");
        assert_eq!(addr("10.1.1.1:4"), "10.1.1.1:4");
        assert_eq!(
            hosts_lines(t),
            "127.77.0.1 a.example\n127.77.0.2 b.example\n"
        );
    }
}
