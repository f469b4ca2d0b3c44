//! Watches the tools directory and reloads the pool when a folder changes, without a restart.

use std::path::PathBuf;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Calls `reload` after each burst of file changes under `dir` settles.
///
/// Editors write files in several steps; waiting for a quiet period avoids loading a
/// half-written `openapi.json` and reporting an error that fixes itself a moment later.
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
            Err(e) => tracing::warn!(error = %e, "tools directory watch error"),
        })?;
    watcher.watch(&dir, RecursiveMode::Recursive)?;
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            // Drain the burst: keep waiting while events keep arriving.
            loop {
                match tokio::time::timeout(debounce, rx.recv()).await {
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
