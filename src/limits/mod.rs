//! Rate limits: per agent, per agent × tool pattern (both from the policy snapshot), per
//! client IP on the token endpoint, and failed credential checks per source IP and per
//! client id.
//!
//! The agent limits are counted in Redis when a store is configured ([`SharedStore`]), so
//! every instance draws on one budget; otherwise, and while the store is down in the `open`
//! failure mode, in this process, where each instance enforces the limit on its own share of
//! the traffic. The credential and token-endpoint limits are always per instance.

pub mod rate;
mod shared;

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

pub use rate::{Limit, LimitForm, MAX_RATE, Period};
pub use shared::{FailureMode, SharedStore, StoreSettings};

use crate::policy::GrantTarget;
use crate::policy::snapshot::{AgentView, RateLimitRecord};

fn quota(per_second: u32, burst: u32) -> Quota {
    let rate = NonZeroU32::new(per_second.max(1)).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(burst.max(1)).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rate).allow_burst(burst)
}

/// The in-process quota of a limit: one request per interval, `burst` at once.
fn limit_quota(limit: &Limit) -> Quota {
    let burst = NonZeroU32::new(limit.burst()).unwrap_or(NonZeroU32::MIN);
    Quota::with_period(limit.interval())
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
        .allow_burst(burst)
}

type Key = (String, Option<String>);

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A limit is exhausted: retry after this long.
    Exhausted(Duration),
    /// The shared store could not be asked and the failure mode is `closed`.
    StoreUnavailable(Duration),
}

pub struct RateLimits {
    agents: Mutex<HashMap<Key, (RateLimitRecord, Arc<DefaultDirectRateLimiter>)>>,
    shared: Option<SharedStore>,
    token_ip: DefaultKeyedRateLimiter<IpAddr>,
    failed_by_ip: Failures<IpAddr>,
    failed_by_client: Failures<String>,
    clock: DefaultClock,
}

/// Failed credential checks one source IP may make at once, then one more per second. One
/// budget for every endpoint that checks a credential (`/oauth/token`, `/oauth/revoke`,
/// `/oauth/introspect`, the admin API), so spreading guesses over them gains nothing.
pub const FAILURES_PER_IP: (u32, Duration) = (20, Duration::from_secs(1));
/// Failed checks against one client id at once, then one more every 2 s: bounds the guesses at
/// one client's secret however many addresses the guesser has.
pub const FAILURES_PER_CLIENT: (u32, Duration) = (10, Duration::from_secs(2));
/// Distinct sources remembered per failure limiter; beyond it, new sources are refused until
/// old ones have recovered (a spray of addresses must not grow memory without bound).
const MAX_TRACKED: usize = 100_000;
/// Client ids are attacker-chosen text: only this much of one is a key.
const MAX_CLIENT_KEY: usize = 128;

/// A generic cell rate algorithm per key, written out because the check must be charged up
/// front and refunded on success, which `governor` cannot do: charging only after a failure
/// would let a burst of concurrent guesses all pass the check before any is counted.
struct Failures<K> {
    /// Per key, the theoretical arrival time of the next charge.
    tat: Mutex<HashMap<K, Instant>>,
    burst: u32,
    every: Duration,
}

impl<K: Eq + Hash + Clone> Failures<K> {
    fn new((burst, every): (u32, Duration)) -> Self {
        Self {
            tat: Mutex::new(HashMap::new()),
            burst: burst.max(1),
            every,
        }
    }

    /// Charges one failure to `key`, or says how long to wait when its budget is spent.
    fn charge(&self, key: &K, now: Instant) -> Result<(), Duration> {
        let mut map = self.tat.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_TRACKED && !map.contains_key(key) {
            map.retain(|_, tat| *tat > now);
            if map.len() >= MAX_TRACKED {
                return Err(self.every);
            }
        }
        let tat = map.get(key).copied().unwrap_or(now).max(now);
        let next = tat + self.every;
        let window = self.every * self.burst;
        if next.duration_since(now) > window {
            return Err(next.duration_since(now) - window);
        }
        map.insert(key.clone(), next);
        Ok(())
    }

    /// Takes back a charge: the credential turned out right.
    fn refund(&self, key: &K) {
        let mut map = self.tat.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tat) = map.get_mut(key) {
            *tat = tat.checked_sub(self.every).unwrap_or(*tat);
        }
    }

    fn shrink(&self, now: Instant) {
        let mut map = self.tat.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, tat| *tat > now);
    }
}

/// The address a failure is charged to: IPv6 by /64, since one host usually holds a whole /64.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            let mut o = v6.octets();
            o[8..].fill(0);
            IpAddr::V6(o.into())
        }
        v4 => v4,
    }
}

/// One credential check in progress, already counted as a failure against its source and
/// client id; [`CredentialAttempt::succeeded`] takes that back. Dropping it unsettled (a wrong
/// credential, or a request abandoned halfway) leaves the failure counted.
#[must_use = "a credential attempt counts as failed unless `succeeded` is called"]
pub struct CredentialAttempt<'a> {
    limits: &'a RateLimits,
    ip: Option<IpAddr>,
    client: Option<String>,
}

impl CredentialAttempt<'_> {
    /// The credential was right: no failure is counted.
    pub fn succeeded(self) {
        self.refund();
    }

    /// The check could not be made (overload, database down): no failure is counted.
    pub fn not_checked(self) {
        self.refund();
    }

    fn refund(self) {
        if let Some(ip) = &self.ip {
            self.limits.failed_by_ip.refund(ip);
        }
        if let Some(c) = &self.client {
            self.limits.failed_by_client.refund(c);
        }
    }
}

impl RateLimits {
    /// Limits counted in this process only.
    pub fn new(token_per_second: u32, token_burst: u32) -> Self {
        Self::with_store(token_per_second, token_burst, None)
    }

    /// Agent limits counted in `shared` when given.
    pub fn with_store(
        token_per_second: u32,
        token_burst: u32,
        shared: Option<SharedStore>,
    ) -> Self {
        Self {
            agents: Mutex::new(HashMap::new()),
            shared,
            token_ip: RateLimiter::keyed(quota(token_per_second, token_burst)),
            failed_by_ip: Failures::new(FAILURES_PER_IP),
            failed_by_client: Failures::new(FAILURES_PER_CLIENT),
            clock: DefaultClock::default(),
        }
    }

    /// Admits one credential check from `ip` for `client_id` (either may be unknown), before
    /// any work is done for it; the wait before retrying when either has failed too often.
    pub fn credential_attempt(
        &self,
        ip: Option<IpAddr>,
        client_id: Option<&str>,
    ) -> Result<CredentialAttempt<'_>, Duration> {
        let now = Instant::now();
        let ip = ip.map(source_key);
        let client = client_id.map(|c| c.chars().take(MAX_CLIENT_KEY).collect::<String>());
        if let Some(ip) = &ip {
            self.failed_by_ip.charge(ip, now)?;
        }
        if let Some(c) = &client
            && let Err(wait) = self.failed_by_client.charge(c, now)
        {
            // Not admitted: the source is charged for the try, the client id is not.
            return Err(wait);
        }
        Ok(CredentialAttempt {
            limits: self,
            ip,
            client,
        })
    }

    fn limiter(&self, agent: &str, limit: &RateLimitRecord) -> Arc<DefaultDirectRateLimiter> {
        let mut map = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        let key = (agent.to_owned(), limit.pattern.clone());
        match map.get(&key) {
            // An edited limit starts a fresh bucket; an unchanged one keeps counting.
            Some((rec, l)) if rec == limit => l.clone(),
            _ => {
                let l = Arc::new(RateLimiter::direct(limit_quota(&limit.limit)));
                map.insert(key, (limit.clone(), l.clone()));
                l
            }
        }
    }

    /// Takes one request from every limit that applies to `agent` (and `tool`, when the
    /// request is a call), or says why not. With a shared store, all of them in one atomic
    /// step there: a request refused by one limit is charged to none.
    pub async fn check(&self, agent: &AgentView, tool: Option<&str>) -> Result<(), Refusal> {
        let applying: Vec<&RateLimitRecord> = agent
            .record
            .limits
            .iter()
            .filter(|limit| match (&limit.pattern, tool) {
                (None, _) => true,
                (Some(p), Some(t)) => GrantTarget::parse(p).is_ok_and(|g| g.matches(t)),
                (Some(_), None) => false,
            })
            .collect();
        if applying.is_empty() {
            return Ok(());
        }
        if let Some(shared) = &self.shared {
            match shared.check(&agent.record.name, &applying).await {
                Some(verdict) => return verdict.map_err(Refusal::Exhausted),
                None if shared.mode() == FailureMode::Closed => {
                    return Err(Refusal::StoreUnavailable(shared::CLOSED_RETRY_AFTER));
                }
                None => {}
            }
        }
        self.check_local(&agent.record.name, &applying)
            .map_err(Refusal::Exhausted)
    }

    /// The in-process check. `governor` cannot test a limiter without charging it, so here
    /// a request refused by one limit may still have been charged to another.
    fn check_local(&self, agent: &str, applying: &[&RateLimitRecord]) -> Result<(), Duration> {
        let mut wait = Duration::ZERO;
        for limit in applying {
            if let Err(not_until) = self.limiter(agent, limit).check() {
                wait = wait.max(not_until.wait_time_from(self.clock.now()));
            }
        }
        if wait.is_zero() { Ok(()) } else { Err(wait) }
    }

    /// Against client-secret guessing on `/oauth/token`.
    pub fn check_token_ip(&self, ip: IpAddr) -> Result<(), Duration> {
        self.token_ip
            .check_key(&ip)
            .map_err(|n| n.wait_time_from(self.clock.now()))
    }

    /// Forgets idle keys so memory stays bounded.
    pub fn shrink(&self) {
        self.token_ip.retain_recent();
        let now = Instant::now();
        self.failed_by_ip.shrink(now);
        self.failed_by_client.shrink(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::snapshot::{AgentRecord, Discovery};

    fn agent(limits: Vec<RateLimitRecord>) -> AgentView {
        AgentView {
            record: AgentRecord {
                id: uuid::Uuid::nil(),
                name: "a".into(),
                description: String::new(),
                notes: String::new(),
                discovery: Discovery::Full,
                pinned: vec![],
                grants: vec![],
                limits,
                arguments: vec![],
                users: vec![],
            },
            grants: vec![],
            grant_matches: vec![],
            visible: vec![],
            narrowed: Default::default(),
            argument_problems: vec![],
        }
    }

    fn record(pattern: Option<&str>, count: f64, period: Period, burst: u32) -> RateLimitRecord {
        RateLimitRecord {
            pattern: pattern.map(str::to_owned),
            limit: Limit::new(count, period, Some(burst)).unwrap(),
        }
    }

    #[tokio::test]
    async fn a_burst_beyond_the_limit_is_refused_with_a_wait() {
        let limits = RateLimits::new(10, 10);
        let a = agent(vec![record(None, 1.0, Period::Second, 2)]);
        assert!(limits.check(&a, Some("x__y")).await.is_ok());
        assert!(limits.check(&a, Some("x__y")).await.is_ok());
        let Err(Refusal::Exhausted(wait)) = limits.check(&a, Some("x__y")).await else {
            panic!("the third request passed")
        };
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_fractional_rate_per_minute_waits_its_interval() {
        let limits = RateLimits::new(10, 10);
        let a = agent(vec![record(None, 1.5, Period::Minute, 1)]);
        assert!(limits.check(&a, None).await.is_ok());
        let Err(Refusal::Exhausted(wait)) = limits.check(&a, None).await else {
            panic!("the second request passed")
        };
        assert!(
            wait > Duration::from_secs(39) && wait <= Duration::from_secs(40),
            "{wait:?}"
        );
    }

    #[test]
    fn failures_are_refused_beyond_the_burst_and_successes_are_refunded() {
        let limits = RateLimits::new(10, 10);
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        for _ in 0..FAILURES_PER_IP.0 + 5 {
            limits
                .credential_attempt(Some(ip), None)
                .unwrap()
                .succeeded();
        }
        for i in 0..FAILURES_PER_IP.0 {
            let _failed = limits
                .credential_attempt(Some(ip), Some(&format!("c{i}")))
                .unwrap();
        }
        let wait = limits.credential_attempt(Some(ip), None).err().unwrap();
        assert!(wait > Duration::ZERO && wait <= FAILURES_PER_IP.1);
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        assert!(limits.credential_attempt(Some(other), None).is_ok());
    }

    #[test]
    fn a_client_id_is_limited_across_addresses_and_ipv6_counts_per_64() {
        let limits = RateLimits::new(10, 10);
        for i in 0..FAILURES_PER_CLIENT.0 {
            let ip: IpAddr = format!("198.51.100.{i}").parse().unwrap();
            let _failed = limits.credential_attempt(Some(ip), Some("tgc_x")).unwrap();
        }
        let fresh: IpAddr = "203.0.113.1".parse().unwrap();
        assert!(
            limits
                .credential_attempt(Some(fresh), Some("tgc_x"))
                .is_err()
        );
        for i in 0..FAILURES_PER_IP.0 {
            let ip: IpAddr = format!("2001:db8::{i:x}").parse().unwrap();
            let _failed = limits.credential_attempt(Some(ip), None).unwrap();
        }
        let same_64: IpAddr = "2001:db8::ffff".parse().unwrap();
        assert!(limits.credential_attempt(Some(same_64), None).is_err());
    }

    #[tokio::test]
    async fn a_tool_pattern_limit_applies_only_to_its_tools() {
        let limits = RateLimits::new(10, 10);
        let a = agent(vec![record(Some("weather"), 1.0, Period::Second, 1)]);
        assert!(limits.check(&a, Some("weather__current")).await.is_ok());
        assert!(limits.check(&a, Some("weather__current")).await.is_err());
        assert!(limits.check(&a, Some("search__query")).await.is_ok());
    }
}
