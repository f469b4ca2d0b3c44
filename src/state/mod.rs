//! The live state every request reads, below the surfaces: settings, the policy snapshot, the
//! tool pool and upstreams, the audit writer, the limiter and caches, and what keeps the snapshot
//! in step with Postgres and the tools folder. No HTTP here and no surface's types: the core path
//! (`gate`), the services and every surface depend on this module, never the reverse.

mod listener;
mod settings;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::db;
use crate::metrics::Metrics;
use crate::policy::snapshot::{Parts, PolicyHandle};
use crate::pool::loader::load_pool;

pub use listener::{listen, spawn_listener, spawn_policy_listener};
pub use settings::Settings;

pub struct Inner {
    pub settings: Settings,
    pub db: PgPool,
    pub policy: PolicyHandle,
    pub metrics: Metrics,
    pub audit: crate::audit::writer::AuditLog,
    pub limits: crate::limits::RateLimits,
    /// Refusals of strangers, summarised per source before they reach `audit`.
    pub refusals: crate::limits::refusals::RefusalLog,
    pub upstreams: crate::upstream::Upstreams,
    /// Access tokens whose signature was already verified.
    pub verified_tokens: crate::auth::token::VerifiedTokens,
    /// Client ID Metadata Documents, fetched and cached.
    pub cimd: crate::auth::cimd::CimdCache,
    /// Stored credentials, sealed, and the keys that open them.
    pub credentials: crate::credentials::CredentialStore,
    /// Tokens obtained by exchange (RFC 8693), per caller, while they are fresh.
    pub exchanges: crate::credentials::exchange::Exchanges,
    /// Set at SIGTERM: `/readyz` answers 503 and responses close their connections.
    draining: std::sync::atomic::AtomicBool,
    /// HTTP requests being served now (what a drain waits for).
    in_flight: std::sync::atomic::AtomicUsize,
    /// Serialises pool reloads so two bursts of file events never interleave.
    reload_lock: std::sync::Mutex<()>,
    /// Serialises writes of the catalog table.
    catalog_sync: tokio::sync::Mutex<()>,
    policy_reload: tokio::sync::Mutex<()>,
}

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

impl Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    pub fn new(settings: Settings, db: PgPool) -> Self {
        let chain = format!("{}/{}", settings.instance, uuid::Uuid::now_v7());
        let audit =
            crate::audit::writer::AuditLog::spawn(db.clone(), chain, settings.instance.clone());
        Self::with_audit(settings, db, audit)
    }

    pub fn with_audit(
        settings: Settings,
        db: PgPool,
        audit: crate::audit::writer::AuditLog,
    ) -> Self {
        let metrics = Metrics::new();
        // `from_args` has checked the URL, so this cannot fail on it; the connection itself is
        // made on first use, and a Redis that is down is handled by the failure mode.
        let shared = settings.limits_store.as_ref().and_then(|s| {
            crate::limits::SharedStore::connect(s, metrics.rate_limit_store_errors.clone())
                .inspect_err(|e| tracing::error!(error = %e, "cannot use the rate-limit store"))
                .ok()
        });
        let limits = crate::limits::RateLimits::with_store(
            settings.token_rate.0,
            settings.token_rate.1,
            shared,
        )
        .counting_sign_ins_in(db.clone());
        let refusals = crate::limits::refusals::RefusalLog::new(
            audit.clone(),
            Duration::from_secs(settings.perimeter.refusal_summary_secs),
        );
        Self(Arc::new(Inner {
            audit,
            limits,
            refusals,
            upstreams: crate::upstream::Upstreams::default(),
            verified_tokens: Default::default(),
            cimd: crate::auth::cimd::CimdCache::new(
                settings.cimd_allow_private,
                settings.cimd_roots.clone(),
            ),
            credentials: crate::credentials::CredentialStore::new(settings.credential_keys.clone()),
            exchanges: Default::default(),
            settings,
            db,
            policy: PolicyHandle::default(),
            metrics,
            draining: std::sync::atomic::AtomicBool::new(false),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            reload_lock: std::sync::Mutex::new(()),
            catalog_sync: tokio::sync::Mutex::new(()),
            policy_reload: tokio::sync::Mutex::new(()),
        }))
    }

    /// Starts draining: from now on this instance says it is not ready.
    pub fn start_drain(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Counts one request as in flight until the guard is dropped.
    pub fn request_started(&self) -> InFlight {
        self.in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlight(self.clone())
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Reloads the tool pool from disk and swaps it in; returns the new catalog size.
    pub fn reload_pool(&self) -> usize {
        let _guard = self.reload_lock.lock().unwrap_or_else(|p| p.into_inner());
        let previous = self.policy.catalog();
        let scripts = load_pool(
            &self.settings.tools_dir,
            Some(&previous),
            &self.settings.loader,
        );
        self.serve_pool(scripts)
    }

    /// Serves a pool of script tools just loaded from the tools folder (at the first start,
    /// the one the policies were applied against: a large pool is not loaded twice).
    pub fn install_pool(&self, scripts: crate::pool::Catalog) -> usize {
        let _guard = self.reload_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.serve_pool(scripts)
    }

    fn serve_pool(&self, scripts: crate::pool::Catalog) -> usize {
        let catalog = Arc::new(scripts.with_upstreams(self.upstreams.catalog_part()));
        let n = catalog.len();
        self.policy.set_catalog(catalog.clone());
        self.refresh_gauges();
        let state = self.clone();
        tokio::spawn(async move {
            // Syncs run one at a time, in the order of the loads (the lock is fair), and each
            // writes the catalog current when it runs, so a slow older sync can never
            // overwrite a newer one.
            let _one_at_a_time = state.catalog_sync.lock().await;
            let current = state.policy.catalog();
            if let Err(e) =
                db::catalog::sync(&state.db, &current, &state.settings.instance_origin()).await
            {
                tracing::warn!(error = %e, "writing the catalog to the database failed");
            }
            drop(current);
            // But every load's own changes are recorded, even one superseded before this
            // ran: a definition that was on disk for a moment and was loaded is held and
            // recorded, and files changed and restored leave their row.
            state.record_pin_changes(&catalog).await;
            if let Err(e) = db::pins::record_restored(&state.db, catalog.restored()).await {
                tracing::warn!(error = %e, "recording restored tool files failed");
            }
        });
        n
    }

    /// Records the held tools of `catalog` as pending (once across instances) and approves the
    /// first listing of never-approved upstream groups; a first-use approval is then served
    /// here at once, and elsewhere on NOTIFY.
    ///
    /// Boxed: a reload may itself record changes, and the two futures must not contain each
    /// other's types.
    fn record_pin_changes<'a>(
        &'a self,
        catalog: &'a crate::pool::Catalog,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            match db::pins::detect(&self.db, catalog).await {
                Ok(d) => {
                    if d.held > 0 {
                        tracing::warn!(
                            tools = d.held,
                            "tool definitions changed in pinned groups: held until an admin approves them"
                        );
                    }
                    if d.upgraded > 0 {
                        tracing::warn!(
                            tools = d.upgraded,
                            "carried approvals over to the new form of the pin hash, which also covers each operation's responses, method and path and the group's x-toolgate-* settings, as served now (recorded as approved by `hash-upgrade`)"
                        );
                    }
                    if d.first_use > 0 {
                        tracing::info!(
                            tools = d.first_use,
                            "approved the first listing of an upstream group (trust on first use)"
                        );
                    }
                    if (d.first_use > 0 || d.upgraded > 0)
                        && let Err(e) = self.reload_policy().await
                    {
                        tracing::warn!(error = %e, "policy reload failed");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "recording held tool definitions failed"),
            }
        })
    }

    /// Re-reads the control plane from Postgres into the snapshot.
    pub async fn reload_policy(&self) -> sqlx::Result<()> {
        self.reload_parts(Parts::ALL).await
    }

    /// Re-reads the `parts` of the control plane that a change touched.
    pub async fn reload_parts(&self, parts: Parts) -> sqlx::Result<()> {
        // One reload at a time: one that read earlier must not swap in its state after one
        // that read later (a service's own refresh racing the listener's).
        let _one_at_a_time = self.policy_reload.lock().await;
        let t = std::time::Instant::now();
        if parts.intersects(Parts::ALL_STATE) {
            let fresh = db::snapshot::load_parts(&self.db, parts).await?;
            let loaded = t.elapsed();
            self.policy.merge_state(parts, fresh);
            tracing::debug!(
                ?parts,
                load_ms = loaded.as_secs_f64() * 1e3,
                build_ms = (t.elapsed() - loaded).as_secs_f64() * 1e3,
                "policy reloaded"
            );
        }
        if parts.contains(Parts::PINS) {
            self.copy_pinned_groups().await;
        }
        if parts.contains(Parts::UPSTREAMS) {
            self.reconcile_upstreams().await?;
        }
        if parts.contains(Parts::CREDENTIALS) {
            let mut conn = self.db.acquire().await?;
            self.credentials
                .replace(db::credentials::load_sealed(&mut conn).await?);
        }
        self.refresh_gauges();
        if self.policy.load().held_count() > 0 {
            // A group pinned elsewhere (another instance, the command line) may hold tools that
            // only this instance's catalog has: record them too.
            let state = self.clone();
            tokio::spawn(async move {
                let _one_at_a_time = state.catalog_sync.lock().await;
                let catalog = state.policy.catalog();
                state.record_pin_changes(&catalog).await;
            });
        }
        Ok(())
    }

    /// Keeps the script copies in step with the pins: the scripts of a group pinned since its
    /// last load run from its folder (held meanwhile, see `PinState::holds`), so the pool is
    /// loaded again, which copies them, before this returns.
    async fn copy_pinned_groups(&self) {
        let Some(copies) = self.settings.loader.copies.clone() else {
            return;
        };
        let pinned = self.policy.pinned_groups();
        let waiting = self.policy.catalog().tools().any(|t| {
            pinned.contains(t.group())
                && matches!(&t.exec, crate::pool::Execution::Script(s) if s.awaits_copy())
        });
        copies.set_pinned(pinned);
        if waiting {
            let state = self.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || state.reload_pool()).await {
                tracing::warn!(error = %e, "reloading the pool for newly pinned groups failed");
            }
        }
    }

    /// Starts and stops upstream supervisors to match the `upstreams` table. A spec that no
    /// longer parses is logged and left out.
    async fn reconcile_upstreams(&self) -> sqlx::Result<()> {
        let mut conn = self.db.acquire().await?;
        let rows = db::upstreams::upstreams(&mut conn).await?;
        drop(conn);
        let mut specs = std::collections::BTreeMap::new();
        for (name, spec) in rows {
            match serde_json::from_value::<crate::upstream::UpstreamSpec>(spec) {
                Ok(s) => {
                    specs.insert(name, s);
                }
                Err(e) => {
                    tracing::error!(upstream = %name, error = %e, "invalid upstream spec in the database")
                }
            }
        }
        // The supervisors must not keep the state alive: they hold it weakly.
        let weak = Arc::downgrade(&self.0);
        self.upstreams.reconcile(
            &specs,
            Arc::new(move || {
                if let Some(inner) = weak.upgrade() {
                    AppState(inner).reload_pool();
                }
            }),
        );
        Ok(())
    }

    fn refresh_gauges(&self) {
        let snap = self.policy.load();
        self.metrics.pool_tools.set(snap.catalog.len() as i64);
        self.metrics
            .pool_load_errors
            .set(snap.catalog.load_errors().len() as i64);
        self.metrics
            .zero_match_grants
            .set(snap.zero_match_grant_count() as i64);
        self.metrics
            .agents_without_tools
            .set(snap.agents_without_tools() as i64);
        self.metrics
            .argument_rule_problems
            .set(snap.argument_problem_count() as i64);
        self.metrics.tools_held.set(snap.held_count() as i64);
        // Those the snapshot can tell (no tool matched, a `when` that never triggers); an
        // approver nobody is needs the accounts, and shows in the API and the UI.
        self.metrics.approval_rule_problems.set(
            snap.agents()
                .iter()
                .filter(|a| !a.record.approvals.is_empty())
                .map(|a| {
                    crate::policy::approvals::problems(&a.record.approvals, &a.visible, None).len()
                })
                .sum::<usize>() as i64,
        );
    }
}

/// One request in flight; see [`AppState::request_started`].
pub struct InFlight(AppState);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
