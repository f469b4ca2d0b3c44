//! Refusals of requests that proved nothing (no token or a bad one, a wrong client secret or
//! admin token, a token request past its limit), summarised in the audit log.
//!
//! The first refusal of a kind from a source is written at once, as every refusal used to be;
//! the identical ones that follow within the window are only counted, and written as one row
//! with their count when the window ends (or at drain). Two refusals are identical when they
//! come from the same source (an IPv6 /64 counting as one), on the same surface, with the same
//! event type, outcome and reason, a reason being a few fixed words chosen by the surface,
//! never text the stranger sent. A flood of bad tokens from one address thus costs two rows
//! per window, the first never dropped nor delayed, and the count never lost.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::audit::AuditEvent;
use crate::audit::writer::AuditLog;

/// Windows open at once at most (one per source × kind of refusal, each holding its first
/// event, at most a few KiB). When full, the ended windows are written out, and if that frees
/// nothing, all of them: a count is written early, never dropped.
const MAX_OPEN: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    source: Option<IpAddr>,
    surface: &'static str,
    event_type: String,
    outcome: String,
    reason: &'static str,
}

struct Window {
    opened: Instant,
    first_at: DateTime<Utc>,
    last_at: DateTime<Utc>,
    /// Refusals after the first one.
    repeats: u64,
    /// The first refusal, whose source, user agent and resource the summary repeats.
    first: AuditEvent,
}

struct Shared {
    audit: AuditLog,
    window: Duration,
    open: Mutex<HashMap<Key, Window>>,
}

/// The summarising log of refusals; cheap to share (`state.refusals`).
pub struct RefusalLog {
    shared: Arc<Shared>,
}

impl RefusalLog {
    /// Summarises over `window`; writes through `audit`. Within a Tokio runtime, a task writes
    /// the summaries of ended windows out even when their source has gone quiet.
    pub fn new(audit: AuditLog, window: Duration) -> Self {
        let window = window.max(Duration::from_millis(100));
        let shared = Arc::new(Shared {
            audit,
            window,
            open: Mutex::new(HashMap::new()),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let weak: Weak<Shared> = Arc::downgrade(&shared);
            let every = (window / 2).clamp(Duration::from_millis(50), Duration::from_secs(30));
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(shared) = weak.upgrade() else { return };
                    shared.write_out(|w| w.opened.elapsed() >= shared.window);
                }
            });
        }
        Self { shared }
    }

    /// Records the refusal `event` (already stamped with its origin) of a request on
    /// `surface`, for `reason`: written now if it is the first of its kind from its source in
    /// the window, counted otherwise.
    pub fn record(&self, event: AuditEvent, surface: &'static str, reason: &'static str) {
        let source = event
            .remote_addr
            .as_deref()
            .and_then(|a| a.parse::<IpAddr>().ok())
            .map(super::source_key);
        let key = Key {
            source,
            surface,
            event_type: event.event_type.clone(),
            outcome: event.outcome.clone(),
            reason,
        };
        let mut open = self.shared.lock();
        if let Some(w) = open.get_mut(&key) {
            if w.opened.elapsed() < self.shared.window {
                w.repeats += 1;
                w.last_at = event.at;
                return;
            }
            // The window ended: its count goes out, and this refusal opens the next one.
            if let Some(w) = open.remove(&key) {
                self.shared.write_summary(&key, w);
            }
        }
        if open.len() >= MAX_OPEN {
            let window = self.shared.window;
            let ended: Vec<Key> = open
                .iter()
                .filter(|(_, w)| w.opened.elapsed() >= window)
                .map(|(k, _)| k.clone())
                .collect();
            let all = ended.is_empty();
            let keys = if all {
                open.keys().cloned().collect()
            } else {
                ended
            };
            for k in keys {
                if let Some(w) = open.remove(&k) {
                    self.shared.write_summary(&k, w);
                }
            }
        }
        open.insert(
            key,
            Window {
                opened: Instant::now(),
                first_at: event.at,
                last_at: event.at,
                repeats: 0,
                first: event.clone(),
            },
        );
        drop(open);
        self.shared.audit.record_detached(event);
    }

    /// Writes every open window's count out now (at drain, before the audit log's last
    /// flush, and in tests).
    pub fn flush(&self) {
        self.shared.write_out(|_| true);
    }

    /// Windows open now.
    pub fn open_windows(&self) -> usize {
        self.shared.lock().len()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Window>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the windows `done` picks and writes their summaries.
    fn write_out(&self, done: impl Fn(&Window) -> bool) {
        let closed: Vec<(Key, Window)> = {
            let mut open = self.lock();
            let keys: Vec<Key> = open
                .iter()
                .filter(|(_, w)| done(w))
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| open.remove(&k).map(|w| (k, w)))
                .collect()
        };
        for (k, w) in closed {
            self.write_summary(&k, w);
        }
    }

    /// One row saying how many refusals followed the first, if any did.
    fn write_summary(&self, key: &Key, w: Window) {
        if w.repeats == 0 {
            return;
        }
        let mut e = w.first;
        e.at = crate::audit::now_micros();
        e.request_id = None;
        e.client_id = None;
        e.error = Some(format!(
            "{}: {} more identical refusal{} from this source from {} to {}",
            key.reason,
            w.repeats,
            if w.repeats == 1 { "" } else { "s" },
            w.first_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            w.last_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        ));
        e.details = Some(
            json!({"summary": {
                "repeats": w.repeats,
                "reason": key.reason,
                "surface": key.surface,
                "first_at": w.first_at,
                "last_at": w.last_at,
                "window_secs": self.window.as_secs_f64(),
            }})
            .to_string(),
        );
        self.audit.record_detached(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{EventKind, Outcome};

    fn refusal(ip: &str) -> AuditEvent {
        let mut e = AuditEvent::new(EventKind::AuthRejected, Outcome::Denied);
        e.remote_addr = Some(ip.to_owned());
        e
    }

    #[tokio::test]
    async fn repeats_are_counted_in_one_window_per_source_and_kind() {
        let log = RefusalLog::new(
            AuditLog::disabled_for_benchmarks(),
            Duration::from_secs(3600),
        );
        for _ in 0..100 {
            log.record(refusal("192.0.2.1"), "mcp", "invalid token");
            log.record(refusal("2001:db8::1"), "mcp", "invalid token");
            // The same /64.
            log.record(refusal("2001:db8::2"), "mcp", "invalid token");
            log.record(refusal("192.0.2.1"), "mcp", "malformed token");
        }
        assert_eq!(log.open_windows(), 3);
        let open = log.shared.lock();
        let repeats: Vec<u64> = open.values().map(|w| w.repeats).collect();
        assert_eq!(repeats.iter().sum::<u64>(), 400 - 3);
    }

    #[tokio::test]
    async fn a_spray_of_sources_keeps_the_open_windows_bounded() {
        let log = RefusalLog::new(
            AuditLog::disabled_for_benchmarks(),
            Duration::from_secs(3600),
        );
        for i in 0..3 * MAX_OPEN as u32 {
            let ip = std::net::Ipv4Addr::from(0x0a00_0000 | i).to_string();
            log.record(refusal(&ip), "mcp", "invalid token");
            log.record(refusal(&ip), "mcp", "invalid token");
        }
        assert!(log.open_windows() <= MAX_OPEN, "{}", log.open_windows());
    }
}
