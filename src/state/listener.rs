//! LISTEN/NOTIFY: the snapshot follows changes committed by any instance or tool.

use std::time::Duration;

use super::AppState;
use crate::policy::snapshot::Parts;

/// Keeps the snapshot in step with Postgres: LISTEN for changes, and re-read everything after
/// each reconnect (a notification sent while disconnected is otherwise lost).
pub fn spawn_policy_listener(state: AppState) {
    spawn_listener(state, None);
}

/// A connection LISTENing on the policy channel.
pub async fn listen(state: &AppState) -> Result<sqlx::postgres::PgListener, String> {
    let mut listener = sqlx::postgres::PgListener::connect_with(&state.db)
        .await
        .map_err(|e| format!("policy listener cannot connect: {e}"))?;
    listener
        .listen("toolgate_policy")
        .await
        .map_err(|e| format!("LISTEN failed: {e}"))?;
    Ok(listener)
}

/// [`spawn_policy_listener`], starting from `first` when the caller has already LISTENed and
/// then read the policy (at start-up: a snapshot of 10,000 agents is not built twice).
pub fn spawn_listener(state: AppState, first: Option<sqlx::postgres::PgListener>) {
    tokio::spawn(async move {
        let mut first = first;
        loop {
            let listener = match first.take() {
                Some(listener) => Some(listener),
                None => match listen(&state).await {
                    Ok(listener) => {
                        if let Err(e) = state.reload_policy().await {
                            tracing::warn!(error = %e, "policy reload failed");
                        }
                        Some(listener)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "policy listener");
                        None
                    }
                },
            };
            if let Some(mut listener) = listener {
                loop {
                    match listener.recv().await {
                        Ok(first) => {
                            // Coalesce a burst of notifications into one reload of what
                            // they name.
                            let mut parts = Parts::of_table(first.payload());
                            while let Some(n) = listener.next_buffered() {
                                parts |= Parts::of_table(n.payload());
                            }
                            if let Err(e) = state.reload_parts(parts).await {
                                tracing::warn!(error = %e, "policy reload failed");
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "policy listener lost its connection");
                            break;
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}
