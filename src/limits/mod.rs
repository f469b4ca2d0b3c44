//! Rate limits, one mechanism for every surface: what a request is about to do is named by a
//! [`LimitedAction`] (an agent's request or call, a credential check, a bearer token that did
//! not verify, a token request, a sign-in) and [`RateLimits::take`] admits it or says why not.
//! The budgets behind it: per agent and per agent × tool pattern (both from the policy
//! snapshot), per client IP on the token endpoint, failed credential checks per source IP and
//! per client id, and sign-in attempts per source and per account.
//!
//! The agent limits are counted in Redis when a store is configured ([`SharedStore`]), so
//! every instance draws on one budget; otherwise, and while the store is down in the `open`
//! failure mode, in this process, where each instance enforces the limit on its own share of
//! the traffic. Failed credential checks are counted in this process first (so a burst of
//! concurrent guesses is charged before any is checked) and, with a store, in Redis too: a
//! source that spent its budget on one instance is refused on the next instance it fails on.
//! The token-endpoint request limit is per instance. Sign-in attempts are counted in Postgres,
//! so every instance counts together whether or not a store is configured.
//!
//! Every map keyed by something a stranger chooses (a source address, a client id) is bounded:
//! when full, the entries closest to having recovered are forgotten first, so a spray of
//! sources can cost a stranger its own budget but never refuse a source it has not touched.

pub mod rate;
pub mod refusals;
mod shared;
mod sign_in;

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

pub use rate::{Limit, LimitForm, MAX_RATE, Period};
pub use shared::{FailureMode, SharedStore, StoreSettings};
pub use sign_in::{SIGN_IN_PER_IP, SIGN_IN_PER_USER};

use sqlx::PgPool;

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

type Key = (String, Option<GrantTarget>);

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A limit is exhausted: retry after this long.
    Exhausted(Duration),
    /// The store that counts the limit could not be asked and nothing may pass uncounted (the
    /// shared store in the `closed` failure mode, or the database for sign-ins).
    StoreUnavailable(Duration),
}

/// A limit as the IETF rate-limit header fields describe one
/// (draft-ietf-httpapi-ratelimit-headers): `quota` requests per `window_secs`, that is the
/// burst, and the time a spent burst takes to come back whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitPolicy {
    /// `agent` for the agent's own limit, the pattern for a tool's or group's.
    pub name: String,
    pub quota: u32,
    pub window_secs: u64,
}

impl LimitPolicy {
    fn of(record: &RateLimitRecord) -> Self {
        let burst = record.limit.burst();
        Self {
            // Patterns are `[a-z0-9_-]` names; anything else could end the quoted string.
            name: record.pattern.as_ref().map_or_else(
                || "agent".to_owned(),
                |p| {
                    p.to_string()
                        .chars()
                        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*'))
                        .collect()
                },
            ),
            quota: burst,
            window_secs: (record.limit.interval().as_secs_f64() * f64::from(burst))
                .ceil()
                .max(1.0) as u64,
        }
    }
}

/// Which of `agent`'s limits that apply (to `tool`) refused a request told to wait `wait`.
/// A refusal's wait is never longer than one interval of the limit that refused it, so that
/// limit is among those whose interval is at least `wait`; of those, the one earning back
/// slowest is named. The counters (here or in Redis) report only the wait, so when two
/// limits both fit, this is the likelier one, not a certainty; `Retry-After` is exact.
pub fn refusing_policy(
    agent: &AgentView,
    tool: Option<&str>,
    wait: Duration,
) -> Option<LimitPolicy> {
    applying(agent, tool)
        .into_iter()
        .filter(|l| l.limit.interval() + Duration::from_millis(1) >= wait)
        .max_by_key(|l| l.limit.interval())
        .map(LimitPolicy::of)
}

/// The limits of `agent` a request (a call of `tool`, or none) counts against.
fn applying<'a>(agent: &'a AgentView, tool: Option<&str>) -> Vec<&'a RateLimitRecord> {
    agent
        .record
        .limits
        .iter()
        .filter(|limit| match (&limit.pattern, tool) {
            (None, _) => true,
            (Some(p), Some(t)) => p.matches(t),
            (Some(_), None) => false,
        })
        .collect()
}

impl Refusal {
    /// How long the caller should wait before trying again.
    pub fn retry_after(self) -> Duration {
        match self {
            Refusal::Exhausted(d) | Refusal::StoreUnavailable(d) => d,
        }
    }
}

/// What a request is about to do that a limit bounds: the one key of every limit. Whoever
/// takes an action names it by what it is, never by a string of its own making; how it is
/// counted (and where) is this module's business.
#[derive(Debug, Clone, Copy)]
pub enum LimitedAction<'a> {
    /// A request of an agent that names no tool (a listing, a search): its own limits.
    Agent(&'a AgentView),
    /// A call of `tool` by `agent`: its own limits and those of the patterns `tool` matches.
    Call { agent: &'a AgentView, tool: &'a str },
    /// A check of a credential (client secret or assertion, admin token) from `source` for
    /// `client` (either may be unknown), charged before the check and taken back when it
    /// succeeds: see [`Taken::succeeded`].
    CredentialCheck {
        source: Option<IpAddr>,
        client: Option<&'a str>,
    },
    /// A bearer token from `source` that did not verify; a valid one is never counted.
    InvalidBearer { source: Option<IpAddr> },
    /// A request to the token or authorize endpoint from `source`, however it ends.
    TokenRequest { source: Option<IpAddr> },
    /// A host registering itself at `/oauth/register` from `source` (RFC 7591): each one
    /// writes a row, so a source gets a few, then one every few minutes.
    Registration { source: Option<IpAddr> },
    /// A sign-in attempt from `source` for `account`, right or wrong; `None` before an
    /// identity provider has named the account.
    SignIn {
        source: IpAddr,
        account: Option<&'a str>,
    },
}

/// An admitted action. For a credential check it is a failure already counted, which
/// [`Taken::succeeded`] takes back; dropping it unsettled leaves the failure counted. For every
/// other action there is nothing to settle.
#[must_use = "a credential check counts as failed unless `succeeded` is called"]
pub struct Taken<'a> {
    credential: Option<CredentialAttempt<'a>>,
}

impl Taken<'_> {
    fn nothing() -> Self {
        Self { credential: None }
    }

    /// The credential was right: no failure is counted, and the source is remembered as one
    /// its client authenticates from.
    pub fn succeeded(self) {
        if let Some(c) = self.credential {
            c.succeeded();
        }
    }

    /// The check could not be made (overload, database down): no failure is counted.
    pub fn not_checked(self) {
        if let Some(c) = self.credential {
            c.not_checked();
        }
    }
}

pub struct RateLimits {
    agents: Mutex<HashMap<Key, (RateLimitRecord, Arc<DefaultDirectRateLimiter>)>>,
    shared: Option<Arc<SharedStore>>,
    token_ip: DefaultKeyedRateLimiter<IpAddr>,
    registrations_by_ip: DefaultKeyedRateLimiter<IpAddr>,
    failed_by_ip: Arc<Failures<IpAddr>>,
    /// Keyed by a keyed hash of the client id: a stranger's 10,000 made-up client ids cost
    /// eight bytes each here, not their text.
    failed_by_client: Failures<u64>,
    client_hasher: std::collections::hash_map::RandomState,
    /// (client id hash, source) pairs that authenticated recently: such a source is not held
    /// back by its client id's failure budget, which a stranger elsewhere may have spent.
    known_good: Mutex<HashMap<(u64, IpAddr), Instant>>,
    /// Where sign-in attempts are counted; without it none is admitted.
    sign_ins: Option<PgPool>,
    clock: DefaultClock,
}

/// Failed credential checks one source IP may make at once, then one more per second. One
/// budget for every endpoint that checks a credential (`/oauth/token`, `/oauth/revoke`,
/// `/oauth/introspect`, the admin API) or a bearer token (`/mcp`, the REST tools), so spreading
/// guesses over them gains nothing.
pub const FAILURES_PER_IP: (u32, Duration) = (20, Duration::from_secs(1));
/// Failed checks against one client id at once, then one more every 2 s: bounds the guesses at
/// one client's secret however many addresses the guesser has.
pub const FAILURES_PER_CLIENT: (u32, Duration) = (10, Duration::from_secs(2));
/// Distinct keys remembered per failure limiter (about 40 bytes each); beyond it, the keys
/// closest to having recovered are forgotten, a tenth at a time.
const MAX_TRACKED: usize = 100_000;
/// Sources remembered as having authenticated a client, and for how long.
const MAX_KNOWN_GOOD: usize = 10_000;
const KNOWN_GOOD_FOR: Duration = Duration::from_secs(24 * 3600);
/// Dynamic client registrations one source may make at once, then one more per interval:
/// a host registers once per install, so a handful is plenty, and each writes a row.
pub const REGISTRATIONS_PER_IP: (u32, Duration) = (5, Duration::from_secs(360));
/// Token-endpoint sources remembered before idle ones are forgotten (besides the periodic
/// shrink).
const MAX_TOKEN_SOURCES: usize = 100_000;

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
            evict(&mut map, now);
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

    /// Refuses `key` until `until` (another instance saw it spend its budget).
    fn block_until(&self, key: &K, until: Instant) {
        let mut map = self.tat.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_TRACKED && !map.contains_key(key) {
            evict(&mut map, Instant::now());
        }
        // At `until` the next charge is admitted again: tat + every - until = window.
        let tat = (until + self.every * self.burst).checked_sub(self.every);
        if let Some(tat) = tat {
            let entry = map.entry(key.clone()).or_insert(tat);
            *entry = (*entry).max(tat);
        }
    }

    fn shrink(&self, now: Instant) {
        let mut map = self.tat.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, tat| *tat > now);
    }

    fn len(&self) -> usize {
        self.tat.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Makes room in a full map: the recovered keys go, and if that is not a tenth of it, the
/// tenth closest to recovering (the least charged) goes too. A new key is never refused for
/// want of room: that would let a spray of made-up sources lock out everyone else.
fn evict<K: Eq + Hash + Clone>(map: &mut HashMap<K, Instant>, now: Instant) {
    map.retain(|_, tat| *tat > now);
    let room = MAX_TRACKED / 10;
    if map.len() + room <= MAX_TRACKED {
        return;
    }
    let mut tats: Vec<Instant> = map.values().copied().collect();
    let cut = map.len() + room - MAX_TRACKED;
    let (_, nth, _) = tats.select_nth_unstable(cut.saturating_sub(1));
    let nth = *nth;
    let mut left = cut;
    map.retain(|_, tat| {
        if left > 0 && *tat <= nth {
            left -= 1;
            false
        } else {
            true
        }
    });
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
/// credential, or a request abandoned halfway) leaves the failure counted, and tells the
/// shared store when there is one.
struct CredentialAttempt<'a> {
    limits: &'a RateLimits,
    ip: Option<IpAddr>,
    client: Option<u64>,
    /// Whether the client id's budget was charged (a known-good source past it is not).
    client_charged: bool,
    settled: bool,
}

impl CredentialAttempt<'_> {
    /// The credential was right: no failure is counted, and the source is remembered as one
    /// this client authenticates from.
    fn succeeded(mut self) {
        if let (Some(c), Some(ip)) = (self.client, self.ip) {
            self.limits.remember_good(c, ip);
        }
        self.refund();
    }

    /// The check could not be made (overload, database down): no failure is counted.
    fn not_checked(mut self) {
        self.refund();
    }

    fn refund(&mut self) {
        self.settled = true;
        if let Some(ip) = &self.ip {
            self.limits.failed_by_ip.refund(ip);
        }
        if let Some(c) = &self.client
            && self.client_charged
        {
            self.limits.failed_by_client.refund(c);
        }
    }
}

impl Drop for CredentialAttempt<'_> {
    fn drop(&mut self) {
        if !self.settled
            && let Some(ip) = self.ip
        {
            self.limits.share_failure(ip);
        }
    }
}

impl RateLimits {
    /// Limits counted in this process only.
    pub fn new(token_per_second: u32, token_burst: u32) -> Self {
        Self::with_store(token_per_second, token_burst, None)
    }

    /// Agent limits, and the failures of each source, counted in `shared` when given.
    pub fn with_store(
        token_per_second: u32,
        token_burst: u32,
        shared: Option<SharedStore>,
    ) -> Self {
        Self {
            agents: Mutex::new(HashMap::new()),
            shared: shared.map(Arc::new),
            token_ip: RateLimiter::keyed(quota(token_per_second, token_burst)),
            registrations_by_ip: RateLimiter::keyed(
                Quota::with_period(REGISTRATIONS_PER_IP.1)
                    .unwrap_or_else(|| Quota::per_hour(NonZeroU32::MIN))
                    .allow_burst(
                        NonZeroU32::new(REGISTRATIONS_PER_IP.0).unwrap_or(NonZeroU32::MIN),
                    ),
            ),
            failed_by_ip: Arc::new(Failures::new(FAILURES_PER_IP)),
            failed_by_client: Failures::new(FAILURES_PER_CLIENT),
            client_hasher: std::collections::hash_map::RandomState::new(),
            known_good: Mutex::new(HashMap::new()),
            sign_ins: None,
            clock: DefaultClock::default(),
        }
    }

    /// Counts sign-in attempts in `db`, shared by every instance.
    pub fn counting_sign_ins_in(mut self, db: PgPool) -> Self {
        self.sign_ins = Some(db);
        self
    }

    /// Takes `action` from its budgets, or says why it may not happen now. The one entry
    /// point of every limit.
    pub async fn take(&self, action: LimitedAction<'_>) -> Result<Taken<'_>, Refusal> {
        match action {
            LimitedAction::Agent(agent) => self.check(agent, None).await.map(|()| Taken::nothing()),
            LimitedAction::Call { agent, tool } => self
                .check(agent, Some(tool))
                .await
                .map(|()| Taken::nothing()),
            LimitedAction::CredentialCheck { source, client } => self
                .credential_attempt(source, client)
                .map(|c| Taken {
                    credential: Some(c),
                })
                .map_err(Refusal::Exhausted),
            LimitedAction::InvalidBearer { source } => self
                .bearer_failed(source)
                .await
                .map(|()| Taken::nothing())
                .map_err(Refusal::Exhausted),
            LimitedAction::TokenRequest { source } => match source {
                Some(ip) => self
                    .check_token_ip(ip)
                    .map(|()| Taken::nothing())
                    .map_err(Refusal::Exhausted),
                None => Ok(Taken::nothing()),
            },
            LimitedAction::Registration { source } => match source {
                Some(ip) => self
                    .check_registration_ip(ip)
                    .map(|()| Taken::nothing())
                    .map_err(Refusal::Exhausted),
                // No address (a Unix socket): the cap on unused registrations still holds.
                None => Ok(Taken::nothing()),
            },
            LimitedAction::SignIn { source, account } => self
                .sign_in(source, account)
                .await
                .map(|()| Taken::nothing()),
        }
    }

    fn client_key(&self, client_id: &str) -> u64 {
        self.client_hasher.hash_one(client_id)
    }

    fn remember_good(&self, client: u64, ip: IpAddr) {
        let now = Instant::now();
        let mut map = self.known_good.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_KNOWN_GOOD && !map.contains_key(&(client, ip)) {
            map.retain(|_, at| now.duration_since(*at) < KNOWN_GOOD_FOR);
            if map.len() >= MAX_KNOWN_GOOD {
                // Only sources that proved a credential get here: forgetting them all costs
                // each one, at worst, a wait behind its client id's budget.
                map.clear();
            }
        }
        map.insert((client, ip), now);
    }

    fn is_known_good(&self, client: u64, ip: IpAddr) -> bool {
        let map = self.known_good.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&(client, ip))
            .is_some_and(|at| at.elapsed() < KNOWN_GOOD_FOR)
    }

    /// Admits one credential check from `ip` for `client_id` (either may be unknown), before
    /// any work is done for it; the wait before retrying when either has failed too often.
    /// A source that authenticated this client recently is not held back by the client id's
    /// budget: a stranger failing against a client id elsewhere cannot lock its agent out.
    fn credential_attempt(
        &self,
        ip: Option<IpAddr>,
        client_id: Option<&str>,
    ) -> Result<CredentialAttempt<'_>, Duration> {
        let now = Instant::now();
        let ip = ip.map(source_key);
        let client = client_id.map(|c| self.client_key(c));
        if let Some(ip) = &ip {
            self.failed_by_ip.charge(ip, now)?;
        }
        let mut client_charged = false;
        if let Some(c) = &client {
            match self.failed_by_client.charge(c, now) {
                Ok(()) => client_charged = true,
                Err(_) if ip.is_some_and(|ip| self.is_known_good(*c, ip)) => {}
                // Not admitted: the source is charged for the try, the client id is not.
                Err(wait) => return Err(wait),
            }
        }
        Ok(CredentialAttempt {
            limits: self,
            ip,
            client,
            client_charged,
            settled: false,
        })
    }

    /// Counts a failed bearer-token check from `ip` (a request with a token that is not
    /// valid), here and in the shared store; the wait before retrying when the source's budget
    /// is spent. A valid token is never counted, nor refused for its source's failures.
    async fn bearer_failed(&self, ip: Option<IpAddr>) -> Result<(), Duration> {
        let Some(ip) = ip.map(source_key) else {
            return Ok(());
        };
        self.failed_by_ip.charge(&ip, Instant::now())?;
        if let Some(shared) = &self.shared
            && let Some(Err(wait)) = shared.charge_failure(ip, FAILURES_PER_IP).await
        {
            self.failed_by_ip.block_until(&ip, Instant::now() + wait);
            return Err(wait);
        }
        Ok(())
    }

    /// Takes one sign-in attempt from `source` for `account` in Postgres. A database that
    /// cannot count refuses the attempt: a sign-in is never let through uncounted.
    async fn sign_in(&self, source: IpAddr, account: Option<&str>) -> Result<(), Refusal> {
        let Some(db) = &self.sign_ins else {
            return Err(Refusal::StoreUnavailable(SIGN_IN_PER_IP.1));
        };
        match sign_in::charge(db, source, account).await {
            Ok(verdict) => verdict.map_err(Refusal::Exhausted),
            Err(e) => {
                tracing::error!(error = %e, "counting a sign-in attempt failed");
                Err(Refusal::StoreUnavailable(SIGN_IN_PER_IP.1))
            }
        }
    }

    /// Tells the shared store of a failure charged here, without waiting for it; if the
    /// store says the source's budget is spent across instances, it is refused here too.
    fn share_failure(&self, ip: IpAddr) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let local = self.failed_by_ip.clone();
        runtime.spawn(async move {
            if let Some(Err(wait)) = shared.charge_failure(ip, FAILURES_PER_IP).await {
                local.block_until(&ip, Instant::now() + wait);
            }
        });
    }

    /// How many keys the failure limiters and the token limiter hold (for tests and metrics).
    pub fn tracked(&self) -> (usize, usize, usize) {
        (
            self.failed_by_ip.len(),
            self.failed_by_client.len(),
            self.token_ip.len(),
        )
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
    /// request is a call), or says why not: [`LimitedAction::Agent`] and
    /// [`LimitedAction::Call`], without a [`Taken`] to hold. With a shared store, all of them in one atomic
    /// step there: a request refused by one limit is charged to none.
    pub async fn check(&self, agent: &AgentView, tool: Option<&str>) -> Result<(), Refusal> {
        let applying = applying(agent, tool);
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

    /// Against client-secret guessing on `/oauth/token`; IPv6 counted per /64 like failures,
    /// so one host cannot make a key of every address it holds.
    fn check_token_ip(&self, ip: IpAddr) -> Result<(), Duration> {
        if self.token_ip.len() >= MAX_TOKEN_SOURCES {
            self.token_ip.retain_recent();
        }
        self.token_ip
            .check_key(&source_key(ip))
            .map_err(|n| n.wait_time_from(self.clock.now()))
    }

    fn check_registration_ip(&self, ip: IpAddr) -> Result<(), Duration> {
        if self.registrations_by_ip.len() >= MAX_TOKEN_SOURCES {
            self.registrations_by_ip.retain_recent();
        }
        self.registrations_by_ip
            .check_key(&source_key(ip))
            .map_err(|n| n.wait_time_from(self.clock.now()))
    }

    /// Forgets idle keys so memory stays bounded.
    pub fn shrink(&self) {
        self.token_ip.retain_recent();
        self.registrations_by_ip.retain_recent();
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
                managed: None,
                grants: vec![],
                limits,
                arguments: vec![],
                approvals: vec![],
                users: vec![],
            },
            grants: vec![],
            grant_matches: vec![],
            visible: vec![],
            narrowed: Default::default(),
            argument_problems: vec![],
            approvals: vec![],
        }
    }

    fn record(pattern: Option<&str>, count: f64, period: Period, burst: u32) -> RateLimitRecord {
        RateLimitRecord {
            pattern: pattern.map(|p| GrantTarget::parse(p).unwrap()),
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

    /// A spray of made-up sources fills the map: a source it never touched is still let in,
    /// and the map stays within its bound.
    #[test]
    fn a_spray_of_sources_never_locks_out_a_new_one() {
        let limits = RateLimits::new(10, 10);
        // All at one instant, so that none has recovered when the map fills.
        let now = Instant::now();
        for i in 0..(MAX_TRACKED as u32 + 5_000) {
            let ip = IpAddr::V6(std::net::Ipv6Addr::from(u128::from(i) << 64));
            let _ = limits.failed_by_ip.charge(&ip, now);
        }
        assert!(limits.tracked().0 <= MAX_TRACKED, "{:?}", limits.tracked());
        let newcomer: IpAddr = "203.0.113.77".parse().unwrap();
        assert!(limits.failed_by_ip.charge(&newcomer, now).is_ok());
    }

    /// Ten thousand made-up client ids, each from its own source: eight bytes of key each.
    #[test]
    fn made_up_client_ids_cost_a_bounded_key_each() {
        let limits = RateLimits::new(10, 10);
        for i in 0..10_000u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 | i));
            let id = format!("tgc_{}{i}", "x".repeat(4000));
            let _failed = limits.credential_attempt(Some(ip), Some(&id));
        }
        assert_eq!(limits.tracked().1, 10_000);
        assert_eq!(
            std::mem::size_of::<(u64, Instant)>(),
            24,
            "a client key and its time"
        );
    }

    #[test]
    fn a_source_that_authenticated_a_client_passes_its_spent_budget() {
        let limits = RateLimits::new(10, 10);
        let home: IpAddr = "192.0.2.1".parse().unwrap();
        limits
            .credential_attempt(Some(home), Some("tgc_a"))
            .unwrap()
            .succeeded();
        for i in 0..FAILURES_PER_CLIENT.0 + 2 {
            let ip: IpAddr = format!("198.51.100.{i}").parse().unwrap();
            let _failed = limits.credential_attempt(Some(ip), Some("tgc_a"));
        }
        let stranger: IpAddr = "203.0.113.1".parse().unwrap();
        assert!(
            limits
                .credential_attempt(Some(stranger), Some("tgc_a"))
                .is_err()
        );
        assert!(limits.credential_attempt(Some(home), Some("tgc_a")).is_ok());
    }

    #[tokio::test]
    async fn a_credential_check_taken_counts_until_it_succeeds() {
        let limits = RateLimits::new(10, 10);
        let source = Some("192.0.2.9".parse().unwrap());
        let check = LimitedAction::CredentialCheck {
            source,
            client: None,
        };
        for _ in 0..FAILURES_PER_IP.0 + 5 {
            limits.take(check).await.unwrap().succeeded();
        }
        for _ in 0..FAILURES_PER_IP.0 {
            let _failed = limits.take(check).await.unwrap();
        }
        let Err(Refusal::Exhausted(wait)) = limits.take(check).await else {
            panic!("a source past its failures was let through")
        };
        assert!(wait > Duration::ZERO && wait <= FAILURES_PER_IP.1);
        // The invalid bearer tokens of that source draw on the same budget.
        let bearer = LimitedAction::InvalidBearer { source };
        assert!(limits.take(bearer).await.is_err());
    }

    #[tokio::test]
    async fn a_sign_in_that_cannot_be_counted_is_refused() {
        let limits = RateLimits::new(10, 10);
        let sign_in = LimitedAction::SignIn {
            source: "192.0.2.10".parse().unwrap(),
            account: Some("ada"),
        };
        assert!(matches!(
            limits.take(sign_in).await,
            Err(Refusal::StoreUnavailable(_))
        ));
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
