//! The policies folder as the serving gateway sees it: how far the database has drifted from it.

use super::Result;
use crate::policy::files::{self, Drift};
use crate::state::AppState;

/// The drift between `--policies-dir` and the database, or `None` when this gateway has no
/// policies folder (it is then managed from the UI and API alone, and there is nothing to
/// compare). Reads the folder and a few small tables; the agents come from the live snapshot.
pub async fn drift(state: &AppState) -> Result<Option<Drift>> {
    let dir = &state.settings.policies_dir;
    if !dir.join("agents").is_dir() && !dir.join("groups.yaml").is_file() {
        return Ok(None);
    }
    let agents: Vec<_> = state
        .policy
        .load()
        .agents()
        .into_iter()
        .map(|a| a.record.clone())
        .collect();
    Ok(Some(files::drift(&state.db, dir, &agents).await?))
}
