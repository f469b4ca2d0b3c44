//! A caller's own connection to an upstream: when an upstream declares credential slots, each
//! call goes out on a connection (for stdio, a child process) that carries its caller's values
//! and no one else's. Connections are keyed by whose values they carry and what the values
//! are, so a rotated value gets a fresh connection and two callers never share one.
//!
//! Bounded: at most `max_principal_connections` per upstream; to make room the least recently
//! used one that no call holds is closed, and when every one is in use the call is refused
//! rather than queued behind another caller. Reaped: one unused for `principal_idle_secs` is
//! closed (dropping the client ends its session and kills a stdio child).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::service::RunningService;
use sha2::{Digest, Sha256};

use super::{Inject, Listener, UpstreamSlot, UpstreamSpec};
use crate::credentials::Opened;

/// Whose values, and which: a digest, so the map never holds a credential in clear.
pub(super) type Key = [u8; 32];

pub(super) struct Connection {
    /// The upstream's spec with this caller's values injected.
    pub spec: UpstreamSpec,
    pub client: tokio::sync::RwLock<Option<RunningService<RoleClient, Listener>>>,
    /// What the upstream must never repeat to the caller: the values this connection carries,
    /// besides the upstream's own credentials.
    pub scrub: Vec<String>,
    /// Who, for error messages: `agent `a`` and the like (never a value).
    pub whose: String,
    last_used: Mutex<Instant>,
}

impl Connection {
    pub fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*self.last_used.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The key of a call's credentials.
pub(super) fn key(opened: &[Opened]) -> Key {
    let mut h = Sha256::new();
    for (slot, value) in opened {
        for part in [
            slot.per.as_str().as_bytes(),
            slot.owner.as_bytes(),
            slot.name.as_bytes(),
            value.as_slice(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    h.finalize().into()
}

/// The spec of a connection carrying `opened` (the values of `slots`), the values to scrub
/// from its answers, and whose they are.
pub(super) fn build(
    spec: &UpstreamSpec,
    slots: &[UpstreamSlot],
    opened: &[Opened],
) -> Result<Connection, String> {
    let mut spec = spec.clone();
    let mut scrub = Vec::new();
    let mut whose = Vec::new();
    for (key, value) in opened {
        let Some(slot) = slots.iter().find(|s| s.slot.name.as_str() == key.name) else {
            continue;
        };
        let text = std::str::from_utf8(value)
            .map_err(|_| format!("credential `{}` is not UTF-8 text", key.name))?;
        scrub.push(text.to_owned());
        match &slot.inject {
            Inject::Env => {
                spec.env.insert(key.name.clone(), text.to_owned());
            }
            Inject::Header { name, template } => {
                let v = Inject::header_value(template, value)
                    .map_err(|e| format!("credential `{}` cannot be sent: {e}", key.name))?;
                scrub.push(v.to_str().unwrap_or_default().to_owned());
                // The caller's value wins over a static header of the same name.
                spec.headers
                    .retain(|k, _| !k.eq_ignore_ascii_case(name.as_str()));
                spec.headers
                    .insert(name.as_str().to_owned(), template.replace("{}", text));
            }
        }
        let who = match key.per {
            crate::credentials::Per::Shared => "shared".to_owned(),
            per => format!("{} `{}`", per.as_str(), key.owner),
        };
        if !whose.contains(&who) {
            whose.push(who);
        }
    }
    let scrub = super::credentials::of(&spec, &scrub);
    Ok(Connection {
        spec,
        client: tokio::sync::RwLock::new(None),
        scrub,
        whose: whose.join(", "),
        last_used: Mutex::new(Instant::now()),
    })
}

/// The callers' connections of one upstream.
#[derive(Default)]
pub(super) struct Connections {
    map: Mutex<HashMap<Key, Arc<Connection>>>,
}

/// Every connection is held by a call.
#[derive(Debug)]
pub(super) struct Full(pub usize);

impl Connections {
    /// The connection for `key`, made by `make` if there is none; closes idle ones past
    /// `idle`, and the least recently used free one when `max` are open.
    pub fn get(
        &self,
        key: Key,
        max: usize,
        idle: Duration,
        make: impl FnOnce() -> Result<Connection, String>,
    ) -> Result<Result<Arc<Connection>, String>, Full> {
        let mut closed = Vec::new();
        let got = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            closed.extend(reap_locked(&mut map, idle));
            if let Some(c) = map.get(&key) {
                c.touch();
                Ok(Ok(c.clone()))
            } else {
                if map.len() >= max {
                    let now = Instant::now();
                    // Only a connection no call holds (the map's own handle is the only one).
                    let victim = map
                        .iter()
                        .filter(|(_, c)| Arc::strong_count(c) == 1)
                        .max_by_key(|(_, c)| c.idle_for(now))
                        .map(|(k, _)| *k);
                    match victim {
                        Some(k) => closed.extend(map.remove(&k)),
                        None => return Err(Full(map.len())),
                    }
                }
                match make() {
                    Ok(c) => {
                        let c = Arc::new(c);
                        map.insert(key, c.clone());
                        Ok(Ok(c))
                    }
                    Err(e) => Ok(Err(e)),
                }
            }
        };
        // Closed outside the lock: dropping a client ends its session.
        drop(closed);
        got
    }

    /// Forgets `key`'s connection if it is still `conn` (it failed: the next call reconnects).
    pub fn forget(&self, key: &Key, conn: &Arc<Connection>) {
        let removed = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(key) {
                Some(c) if Arc::ptr_eq(c, conn) => map.remove(key),
                _ => None,
            }
        };
        drop(removed);
    }

    /// Closes the connections unused for `idle` that no call holds.
    pub fn reap(&self, idle: Duration) {
        let closed = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            reap_locked(&mut map, idle)
        };
        drop(closed);
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

fn reap_locked(map: &mut HashMap<Key, Arc<Connection>>, idle: Duration) -> Vec<Arc<Connection>> {
    let now = Instant::now();
    let stale: Vec<Key> = map
        .iter()
        .filter(|(_, c)| Arc::strong_count(c) == 1 && c.idle_for(now) >= idle)
        .map(|(k, _)| *k)
        .collect();
    stale.iter().filter_map(|k| map.remove(k)).collect()
}
