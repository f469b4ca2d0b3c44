//! Rate limits: per agent, per agent × tool pattern (both from the policy snapshot), and per
//! client IP on the token endpoint. Counters live in this process: with several instances
//! each enforces the limit on its own share of the traffic.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::policy::GrantTarget;
use crate::policy::snapshot::{AgentView, RateLimitRecord};

fn quota(per_second: u32, burst: u32) -> Quota {
    let rate = NonZeroU32::new(per_second.max(1)).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(burst.max(1)).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rate).allow_burst(burst)
}

type Key = (String, Option<String>);

pub struct RateLimits {
    agents: Mutex<HashMap<Key, (RateLimitRecord, Arc<DefaultDirectRateLimiter>)>>,
    token_ip: DefaultKeyedRateLimiter<IpAddr>,
    clock: DefaultClock,
}

impl RateLimits {
    pub fn new(token_per_second: u32, token_burst: u32) -> Self {
        Self {
            agents: Mutex::new(HashMap::new()),
            token_ip: RateLimiter::keyed(quota(token_per_second, token_burst)),
            clock: DefaultClock::default(),
        }
    }

    fn limiter(&self, agent: &str, limit: &RateLimitRecord) -> Arc<DefaultDirectRateLimiter> {
        let mut map = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        let key = (agent.to_owned(), limit.pattern.clone());
        match map.get(&key) {
            // An edited limit starts a fresh bucket; an unchanged one keeps counting.
            Some((rec, l)) if rec == limit => l.clone(),
            _ => {
                let l = Arc::new(RateLimiter::direct(quota(limit.per_second, limit.burst)));
                map.insert(key, (limit.clone(), l.clone()));
                l
            }
        }
    }

    /// Takes one request from every limit that applies to `agent` (and `tool`, when the
    /// request is a call); the wait before retrying when any is exhausted.
    pub fn check(&self, agent: &AgentView, tool: Option<&str>) -> Result<(), Duration> {
        let mut wait = Duration::ZERO;
        for limit in &agent.record.limits {
            let applies = match (&limit.pattern, tool) {
                (None, _) => true,
                (Some(p), Some(t)) => GrantTarget::parse(p).is_ok_and(|g| g.matches(t)),
                (Some(_), None) => false,
            };
            if !applies {
                continue;
            }
            if let Err(not_until) = self.limiter(&agent.record.name, limit).check() {
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
            },
            grants: vec![],
            grant_matches: vec![],
            visible: vec![],
        }
    }

    #[test]
    fn a_burst_beyond_the_limit_is_refused_with_a_wait() {
        let limits = RateLimits::new(10, 10);
        let a = agent(vec![RateLimitRecord {
            pattern: None,
            per_second: 1,
            burst: 2,
        }]);
        assert!(limits.check(&a, Some("x__y")).is_ok());
        assert!(limits.check(&a, Some("x__y")).is_ok());
        let wait = limits.check(&a, Some("x__y")).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
    }

    #[test]
    fn a_tool_pattern_limit_applies_only_to_its_tools() {
        let limits = RateLimits::new(10, 10);
        let a = agent(vec![RateLimitRecord {
            pattern: Some("weather".into()),
            per_second: 1,
            burst: 1,
        }]);
        assert!(limits.check(&a, Some("weather__current")).is_ok());
        assert!(limits.check(&a, Some("weather__current")).is_err());
        assert!(limits.check(&a, Some("search__query")).is_ok());
    }
}
