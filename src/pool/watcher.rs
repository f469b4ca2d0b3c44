//! Watches the tools directory and reloads the pool when a folder changes, without a restart.

use std::path::PathBuf;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// However long a burst of changes lasts, a reload comes at least this many quiet periods
/// after its first change: a folder touched without pause must not keep the pool from
/// loading (and so its changes from being held and recorded).
const MAX_WAIT_PERIODS: u32 = 8;

/// Calls `reload` after each burst of file changes under `dir` settles.
///
/// Editors write files in several steps; waiting for a quiet period avoids loading a
/// half-written `openapi.json` and reporting an error that fixes itself a moment later. Events
/// of a burst are not kept one by one: the reload compares what it reads with the previous load
/// (contents and file identities, see [`super::loader::restored_since`]), so a change undone
/// within the burst is still found.
pub fn spawn<F>(
    dir: PathBuf,
    debounce: Duration,
    reload: F,
) -> anyhow::Result<notify::RecommendedWatcher>
where
    F: Fn() + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut watcher =
        notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(e) if !matches!(e.kind, notify::EventKind::Access(_)) => {
                let _ = tx.send(());
            }
            Ok(_) => {}
            Err(e) => {
                // Events may have been lost (a full kernel queue): read everything again.
                tracing::warn!(error = %e, "tools directory watch error");
                let _ = tx.send(());
            }
        })?;
    watcher.watch(&dir, RecursiveMode::Recursive)?;
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            let deadline = tokio::time::Instant::now() + debounce * MAX_WAIT_PERIODS;
            // Drain the burst: keep waiting while events keep arriving, up to the deadline.
            loop {
                let wait =
                    debounce.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
                if wait.is_zero() {
                    break;
                }
                match tokio::time::timeout(wait, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            reload();
        }
    });
    Ok(watcher)
}
