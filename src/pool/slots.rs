//! How many calls of one script run at once: a semaphore per script, made on the script's
//! first call and shared by every call of it.
//!
//! A semaphore in every tool cost about 80 bytes a tool, in pools where most tools are never
//! called. Here one exists only while a call of its script is waiting or running. Every copy
//! of a tool (the pool's, an agent's narrowed copy, the same tool after a reload) reaches the
//! same semaphore through the script's path, so the bound holds across all of them; before,
//! a reload gave the new tool a fresh semaphore while the old one's calls were still running.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use tokio::sync::Semaphore;

/// Weak entries: a semaphore is dropped with the last call holding it. Dead entries are swept
/// when the map has doubled since the last sweep, so its size stays within twice the number
/// of scripts with a call in flight (plus a constant), whatever the pool's size.
struct Registry {
    slots: HashMap<(PathBuf, usize), Weak<Semaphore>>,
    sweep_at: usize,
}

const MIN_SWEEP: usize = 64;

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        slots: HashMap::new(),
        sweep_at: MIN_SWEEP,
    })
});

/// The semaphore bounding the calls of `script` to `permits` at once. Hold the returned `Arc`
/// for as long as the permit.
pub fn for_script(script: &Path, permits: usize) -> Arc<Semaphore> {
    // Nothing panics while the lock is held, and the map stays consistent if something did.
    let mut r = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    let key = (script.to_path_buf(), permits);
    if let Some(live) = r.slots.get(&key).and_then(Weak::upgrade) {
        return live;
    }
    let made = Arc::new(Semaphore::new(permits));
    r.slots.insert(key, Arc::downgrade(&made));
    if r.slots.len() >= r.sweep_at {
        r.slots.retain(|_, w| w.strong_count() > 0);
        r.sweep_at = (r.slots.len() * 2).max(MIN_SWEEP);
    }
    made
}

/// How many entries the registry holds (live or not yet swept).
#[cfg(test)]
fn entries() -> usize {
    REGISTRY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .slots
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_of_one_script_share_a_semaphore_and_others_do_not() {
        let a = Path::new("/slots-test/a.sh");
        let _p1 = for_script(a, 2).try_acquire_owned().unwrap();
        let _p2 = for_script(a, 2).try_acquire_owned().unwrap();
        // Both permits are taken through the shared semaphore: a third call must wait.
        assert!(for_script(a, 2).try_acquire_owned().is_err());
        // Another script has its own bound.
        assert!(
            for_script(Path::new("/slots-test/b.sh"), 2)
                .try_acquire_owned()
                .is_ok()
        );
    }

    #[test]
    fn the_registry_stays_bounded_by_the_calls_in_flight() {
        // 10,000 scripts called once each, one at a time: at most the sweep threshold stays.
        for i in 0..10_000 {
            let s = for_script(Path::new(&format!("/slots-bound/{i}.sh")), 1);
            drop(s.try_acquire().unwrap());
        }
        assert!(entries() <= 2 * MIN_SWEEP, "{} entries", entries());
        // A semaphore whose calls are done is made afresh, with all its permits.
        let again = for_script(Path::new("/slots-bound/0.sh"), 1);
        assert_eq!(again.available_permits(), 1);
    }
}
