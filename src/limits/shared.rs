//! Agent limits counted in Redis, shared by every instance: one GCRA step per request, in a
//! Lua script that checks every limit of the request against Redis's own clock and charges
//! them all or none.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::policy::GrantTarget;
use crate::policy::snapshot::RateLimitRecord;

/// What a check does when the store cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Count in this process instead (each instance enforces the limit on its own).
    Open,
    /// Refuse the request as unavailable.
    Closed,
}

/// The `Retry-After` of a request refused because the store is down (`closed` mode).
pub const CLOSED_RETRY_AFTER: Duration = Duration::from_secs(1);
/// While the store is failing, checks skip it and take the failure path for this long before
/// one tries again: an outage costs each request nothing, not a timeout each.
const RETRY_EVERY: Duration = Duration::from_millis(250);

#[derive(Clone)]
pub struct StoreSettings {
    pub url: String,
    /// Put before every key, so several deployments (or tests) can share one Redis.
    pub key_prefix: String,
    pub failure_mode: FailureMode,
    /// How long one check may wait for Redis before it counts as failed.
    pub timeout: Duration,
}

impl StoreSettings {
    /// The URL without its password, for logs.
    pub fn shown_url(&self) -> String {
        match url::Url::parse(&self.url) {
            Ok(mut u) => {
                if u.password().is_some() {
                    let _ = u.set_password(Some("***"));
                }
                u.to_string()
            }
            Err(_) => "(unparsable URL)".into(),
        }
    }
}

/// Never prints the URL's password.
impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("url", &self.shown_url())
            .field("key_prefix", &self.key_prefix)
            .field("failure_mode", &self.failure_mode)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// GCRA over every limit of one request. `KEYS[i]` is a limit's key, `ARGV[2i-1]` its
/// emission interval in microseconds, `ARGV[2i]` its burst; a key holds its theoretical
/// arrival time in microseconds of the server's clock. Every limit is tested before any is
/// charged. Returns `{1, 0}` when admitted, `{0, wait_us}` when not.
const GCRA: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local wait = 0
local tats = {}
for i, key in ipairs(KEYS) do
  local interval = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  local next_tat = tat + interval
  local over = next_tat - burst * interval - now
  if over > wait then wait = over end
  tats[i] = next_tat
end
if wait > 0 then return {0, math.ceil(wait)} end
for i, key in ipairs(KEYS) do
  -- The key lives until its bucket is full again, when it would say nothing anyway.
  local ttl = math.floor((tats[i] - now) / 1000) + 1
  redis.call('SET', key, string.format('%.0f', tats[i]), 'PX', ttl)
end
return {1, 0}
"#;

pub struct SharedStore {
    conn: ConnectionManager,
    script: redis::Script,
    prefix: String,
    mode: FailureMode,
    timeout: Duration,
    /// Set from the first failure of an outage to the next success: warn once per outage.
    down: AtomicBool,
    /// While down, when (ms after `epoch`) a check may try the store again.
    retry_at: AtomicU64,
    epoch: Instant,
    errors: IntCounter,
}

impl SharedStore {
    /// Prepares the connection without making it: a Redis that is down at start is an
    /// outage like any other, handled by the failure mode. A malformed URL is an error.
    /// `errors` counts failed checks.
    pub fn connect(settings: &StoreSettings, errors: IntCounter) -> anyhow::Result<Self> {
        let client = redis::Client::open(settings.url.as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_max_delay(Duration::from_secs(2));
        let conn = client.get_connection_manager_lazy(config)?;
        tracing::info!(
            redis = %settings.shown_url(),
            failure_mode = ?settings.failure_mode,
            "agent rate limits are counted in Redis, shared by every instance"
        );
        Ok(Self {
            conn,
            script: redis::Script::new(GCRA),
            prefix: settings.key_prefix.clone(),
            mode: settings.failure_mode,
            timeout: settings.timeout,
            down: AtomicBool::new(false),
            retry_at: AtomicU64::new(0),
            epoch: Instant::now(),
            errors,
        })
    }

    /// Refuses a URL the client cannot use (wrong scheme, malformed), before serving starts.
    pub fn check_url(url: &str) -> anyhow::Result<()> {
        redis::Client::open(url)
            .map(drop)
            .map_err(|e| anyhow::anyhow!("--redis-url: {e}"))
    }

    pub fn mode(&self) -> FailureMode {
        self.mode
    }

    /// The key of one limit. The agent is a hash tag, so all keys of one request fall in one
    /// slot of a Redis Cluster and one script may touch them.
    fn key(&self, agent: &str, pattern: Option<&GrantTarget>) -> String {
        match pattern {
            Some(p) => format!("{}{{{agent}}}:{p}", self.prefix),
            None => format!("{}{{{agent}}}:*", self.prefix),
        }
    }

    /// Charges one failed credential or token check to `source` (a /64 for IPv6) against a
    /// budget of `burst` at once and one more per `every`, counted across every instance:
    /// `Some(Err(wait))` when the source has spent it, `None` when the store could not say in
    /// time (the caller then counts in this process alone).
    pub(super) async fn charge_failure(
        &self,
        source: std::net::IpAddr,
        (burst, every): (u32, Duration),
    ) -> Option<Result<(), Duration>> {
        let now = self.epoch.elapsed().as_millis() as u64;
        if self.down.load(Ordering::Relaxed) && now < self.retry_at.load(Ordering::Relaxed) {
            return None;
        }
        let mut invocation = self.script.prepare_invoke();
        // Its own hash tag, apart from every agent's: `{failed:<source>}` cannot be an
        // agent's `{<agent>}:<pattern>` key.
        invocation
            .key(format!("{}{{failed:{source}}}", self.prefix))
            .arg(every.as_micros().max(1) as u64)
            .arg(burst.max(1));
        self.run(invocation, now).await
    }

    /// Takes one request from every limit in `applying`: `Some(Ok)` admitted, `Some(Err(wait))`
    /// refused, `None` when the store could not say in time.
    pub(super) async fn check(
        &self,
        agent: &str,
        applying: &[&RateLimitRecord],
    ) -> Option<Result<(), Duration>> {
        let now = self.epoch.elapsed().as_millis() as u64;
        if self.down.load(Ordering::Relaxed) && now < self.retry_at.load(Ordering::Relaxed) {
            return None;
        }
        let mut invocation = self.script.prepare_invoke();
        for l in applying {
            // The limit's parameters travel with each call, so an edited limit counts at once.
            invocation
                .key(self.key(agent, l.pattern.as_ref()))
                .arg(l.limit.interval_micros())
                .arg(l.limit.burst());
        }
        self.run(invocation, now).await
    }

    async fn run(
        &self,
        invocation: redis::ScriptInvocation<'_>,
        now: u64,
    ) -> Option<Result<(), Duration>> {
        let mut conn = self.conn.clone();
        let outcome = tokio::time::timeout(
            self.timeout,
            invocation.invoke_async::<(i64, i64)>(&mut conn),
        )
        .await;
        match outcome {
            Ok(Ok((admitted, wait_us))) => {
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!("rate-limit store reachable again; limits are shared");
                }
                Some(if admitted == 1 {
                    Ok(())
                } else {
                    Err(Duration::from_micros(wait_us.max(1) as u64))
                })
            }
            Ok(Err(e)) => {
                self.failed(now, &e.to_string());
                None
            }
            Err(_) => {
                self.failed(now, &format!("no answer within {:?}", self.timeout));
                None
            }
        }
    }

    fn failed(&self, now_ms: u64, why: &str) {
        self.errors.inc();
        self.retry_at
            .store(now_ms + RETRY_EVERY.as_millis() as u64, Ordering::Relaxed);
        if !self.down.swap(true, Ordering::Relaxed) {
            match self.mode {
                FailureMode::Open => tracing::warn!(
                    error = why,
                    "rate-limit store unavailable; counting limits per instance until it is back"
                ),
                FailureMode::Closed => tracing::warn!(
                    error = why,
                    "rate-limit store unavailable; refusing limited requests until it is back"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_never_show_the_password() {
        let s = StoreSettings {
            url: "redis://user:s3cret@cache.internal:6379/2".into(),
            key_prefix: "p:".into(),
            failure_mode: FailureMode::Open,
            timeout: Duration::from_millis(50),
        };
        let shown = format!("{s:?} {}", s.shown_url());
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("cache.internal:6379/2"), "{shown}");
    }
}
