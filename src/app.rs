//! Application state, the router of the three surfaces, and the `serve` life cycle.

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use sqlx::PgPool;

use tokio::net::TcpListener;

use crate::config::{RedisFailureMode, ScriptSandbox, ServeArgs};
use crate::metrics::Metrics;
use crate::policy::snapshot::{Parts, PolicyHandle};
use crate::pool::loader::{LoaderSettings, load_pool};
use crate::pool::runner::OutputLimits;
use crate::pool::sandbox::{Mode, SandboxSettings, ScriptUser};
use crate::{api, db, http, mcp, oauth, rest, web};

/// Settings resolved from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Token issuer and base of every public URL, without a trailing slash.
    pub issuer: String,
    /// The canonical `/mcp` URL: the audience of access tokens.
    pub audience: String,
    pub tools_dir: PathBuf,
    pub dev_agent: Option<String>,
    pub admin_token: Option<String>,
    pub token_ttl: Duration,
    pub page_size: usize,
    /// `tools/list` answered before the SDK when the request allows (`mcp::list`).
    pub mcp_fast_list: bool,
    /// Tokens of tool definitions up to which `discovery: auto` lists in full.
    pub search_token_budget: usize,
    pub allowed_hosts: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub loader: LoaderSettings,
    pub audit_retention_days: u32,
    pub token_rate: (u32, u32),
    /// Where agent limits are counted across instances; `None`: in each instance.
    pub limits_store: Option<crate::limits::StoreSettings>,
    pub output: OutputLimits,
    /// Names this instance in logs, metrics and the audit log.
    pub instance: String,
    /// Reverse proxies whose `X-Forwarded-For` names the client (see [`crate::http::client_addr`]).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Client ID Metadata Documents may be fetched from inside addresses (development only).
    pub cimd_allow_private: bool,
    /// Admin UI session lifetimes and sign-in methods.
    pub accounts: web::session::AccountSettings,
    /// Admin sign-in with an OpenID Provider, when configured.
    pub sso: Option<web::sso::SsoSettings>,
    /// Timeouts, connection and audit-row bounds for clients that proved nothing.
    pub perimeter: crate::config::PerimeterArgs,
}

impl Settings {
    pub fn from_args(args: &ServeArgs) -> anyhow::Result<Self> {
        if args.dev_agent.is_some() && !args.bind.ip().is_loopback() {
            anyhow::bail!(
                "--dev-agent treats unauthenticated requests as an agent; it is refused on a non-loopback bind ({})",
                args.bind
            );
        }
        if args.oauth_cimd_allow_private && !args.bind.ip().is_loopback() {
            anyhow::bail!(
                "--oauth-cimd-allow-private lets outsiders make this server fetch inside addresses; it is refused on a non-loopback bind ({})",
                args.bind
            );
        }
        let public = match &args.public_url {
            Some(u) => u.clone(),
            None => url::Url::parse(&format!("http://{}", args.bind))?,
        };
        let issuer = public.as_str().trim_end_matches('/').to_owned();
        let issuer_for_sso = issuer.clone();
        let mut allowed_hosts = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        if let Some(host) = public.host_str() {
            allowed_hosts.push(host.to_owned());
        }
        allowed_hosts.extend(args.allowed_hosts.iter().cloned());
        if let Some(url) = args.redis_url.as_ref().filter(|u| !u.is_empty()) {
            crate::limits::SharedStore::check_url(url)?;
        }
        if let Some(path) = &args.search_embeddings {
            // Read once per process, before any snapshot (and so any search index) is built.
            let model =
                crate::search::embed::StaticModel::load(path).map_err(anyhow::Error::msg)?;
            tracing::info!(table = %path.display(), ?model, "search embeddings loaded");
            if let Err(e) = crate::search::embed::install(model) {
                tracing::warn!(error = %e, "search embeddings: keeping the table loaded first");
            }
        }
        let mut allowed_origins = vec![origin_of(&public)];
        allowed_origins.extend(args.allowed_origins.iter().cloned());
        Ok(Self {
            audience: format!("{issuer}/mcp"),
            issuer,
            tools_dir: args.tools_dir.clone(),
            dev_agent: args.dev_agent.clone(),
            admin_token: args.admin_token.clone().filter(|t| !t.is_empty()),
            token_ttl: Duration::from_secs(args.token_ttl_secs.clamp(30, 86_400)),
            page_size: args.page_size.clamp(1, 1000),
            mcp_fast_list: args.mcp_fast_list == crate::config::OnOff::On,
            search_token_budget: args.search_token_budget,
            allowed_hosts,
            allowed_origins,
            loader: LoaderSettings {
                default_timeout: Duration::from_millis(args.script_timeout_ms.max(1)),
                max_concurrency_per_tool: args.max_concurrency_per_tool.max(1),
                sandbox: Arc::new(sandbox_settings(args)?),
                script_env: Arc::new(crate::pool::env::PrefixedEnv::from_process()),
                copies: Some(script_copies(args)?),
            },
            audit_retention_days: args.audit_retention_days.max(1),
            token_rate: (args.token_rate_per_ip, args.token_burst_per_ip),
            limits_store: args
                .redis_url
                .as_ref()
                .filter(|u| !u.is_empty())
                .map(|url| crate::limits::StoreSettings {
                    url: url.clone(),
                    key_prefix: args.redis_key_prefix.clone(),
                    failure_mode: match args.redis_failure_mode {
                        RedisFailureMode::Open => crate::limits::FailureMode::Open,
                        RedisFailureMode::Closed => crate::limits::FailureMode::Closed,
                    },
                    timeout: Duration::from_millis(args.redis_timeout_ms.clamp(1, 10_000)),
                }),
            output: OutputLimits {
                max_stdout: args.max_stdout_bytes.max(1024),
                ..OutputLimits::default()
            },
            instance: crate::audit::instance_name().to_owned(),
            trusted_proxies: args.trusted_proxies.clone(),
            cimd_allow_private: args.oauth_cimd_allow_private,
            accounts: web::session::AccountSettings::from_args(args),
            sso: web::sso::SsoSettings::from_args(&args.oidc, &issuer_for_sso)?,
            perimeter: args.perimeter.clone(),
        })
    }
}

fn sandbox_settings(args: &ServeArgs) -> anyhow::Result<SandboxSettings> {
    let mode = match args.script_sandbox {
        ScriptSandbox::Auto => Mode::Auto,
        ScriptSandbox::Required => Mode::Required,
        ScriptSandbox::Off => Mode::Off,
    };
    let user = match &args.script_user {
        Some(name) => Some(ScriptUser::lookup(name).map_err(anyhow::Error::msg)?),
        None => None,
    };
    Ok(SandboxSettings::new(mode, user, &args.script_read_paths))
}

/// This process's directory of script copies, under `--script-copies-dir`.
fn script_copies(args: &ServeArgs) -> anyhow::Result<Arc<crate::pool::copies::ScriptCopies>> {
    let base = args
        .script_copies_dir
        .clone()
        .unwrap_or_else(std::env::temp_dir);
    crate::pool::copies::ScriptCopies::create(&base).map_err(|e| {
        anyhow::anyhow!(
            "cannot make a directory for the script copies in {} (--script-copies-dir): {e}",
            base.display()
        )
    })
}

/// Says at start what the sandbox cannot confine here; in `required` mode that is fatal.
fn check_sandbox(settings: &SandboxSettings) -> anyhow::Result<()> {
    crate::pool::sandbox::sweep_stale_call_dirs();
    if settings.mode == Mode::Off {
        tracing::warn!(
            "--script-sandbox off: tool scripts run unconfined, with the gateway's uid and the whole filesystem"
        );
        return Ok(());
    }
    let gaps = crate::pool::sandbox::host().gaps();
    if gaps.is_empty() {
        tracing::info!(user = ?settings.identity().map(|u| &u.name), "tool scripts run sandboxed (Landlock, PID namespace, mount and network namespaces, a user namespace per call, resource limits)");
        return Ok(());
    }
    if settings.mode == Mode::Required {
        anyhow::bail!(
            "--script-sandbox required, but this host cannot confine tool scripts fully:\n- {}",
            gaps.join("\n- ")
        );
    }
    for gap in &gaps {
        tracing::warn!(gap = %gap, "tool scripts are not fully confined on this host");
    }
    Ok(())
}

fn origin_of(u: &url::Url) -> String {
    u.origin().ascii_serialization()
}

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
    pub cimd: crate::oauth::cimd::CimdCache,
    /// Admin sign-in with an OpenID Provider; `None` when not configured.
    pub sso: Option<web::sso::Sso>,
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
        );
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
            cimd: crate::oauth::cimd::CimdCache::new(settings.cimd_allow_private),
            sso: settings.sso.clone().map(web::sso::Sso::new),
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

impl Settings {
    /// Rows of the `tools` table this instance owns: tools from its tools folder.
    pub fn instance_origin(&self) -> String {
        format!("folder:{}", self.tools_dir.display())
    }
}

/// The whole HTTP surface.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(http::ops_router())
        .merge(oauth::router())
        .nest("/api/v1", api::router(state.clone()))
        .merge(rest::router(state.clone()))
        .merge(mcp::router(state.clone()))
        .merge(web::router(state.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            http::observe,
        ))
        .layer(http::request_id_layers())
        .with_state(state)
}

/// Keeps the snapshot in step with Postgres: LISTEN for changes, and re-read everything after
/// each reconnect (a notification sent while disconnected is otherwise lost).
pub fn spawn_policy_listener(state: AppState) {
    spawn_listener(state, None);
}

/// A connection LISTENing on the policy channel.
async fn listen(state: &AppState) -> Result<sqlx::postgres::PgListener, String> {
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
fn spawn_listener(state: AppState, first: Option<sqlx::postgres::PgListener>) {
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

/// `toolgate serve`.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Scripts, even as root, must not read this process's memory or environment through /proc.
    nix::sys::prctl::set_dumpable(false)?;
    let settings = Settings::from_args(&args)?;
    check_sandbox(&settings.loader.sandbox)?;
    if let Some(agent) = &settings.dev_agent {
        tracing::warn!(agent = %agent, "--dev-agent is set: unauthenticated requests act as this agent; never use it outside local development");
    }
    let pool = db::connect(&args.db.database_url, 16).await?;
    db::migrate(&pool, &args.db.database_url).await?;
    crate::oauth::ensure_signing_key(&pool).await?;
    if let Some(copies) = &settings.loader.copies {
        // The first load copies the pinned groups' scripts, rather than a second one after
        // the policy is read.
        let mut conn = pool.acquire().await?;
        copies.set_pinned(
            db::pins::pinned_groups(&mut conn)
                .await?
                .into_iter()
                .collect(),
        );
    }
    let mut first_load = None;
    // Start-up stages are timed at `info`: what a large pool costs to start is read here.
    let started = std::time::Instant::now();
    if db::agents::is_empty(&pool).await? && args.policies_dir.is_dir() {
        let catalog = first_load.insert(load_pool(&settings.tools_dir, None, &settings.loader));
        tracing::info!(
            tools = catalog.len(),
            ms = started.elapsed().as_millis() as u64,
            "start-up: tool pool read"
        );
        match crate::policy::files::apply_dir(
            &pool,
            &args.policies_dir,
            catalog,
            "toolgate serve (first start)",
            false,
            false,
        )
        .await
        {
            Ok(report) => tracing::info!(
                changes = report.changes.len(),
                "applied the policies folder to the empty database"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "could not apply the policies folder on first start")
            }
        }
    }
    let state = AppState::new(settings.clone(), pool);
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        "start-up: policies applied"
    );
    let n = match first_load {
        Some(catalog) => state.install_pool(catalog),
        None => state.reload_pool(),
    };
    tracing::info!(tools = n, dir = %settings.tools_dir.display(), ms = started.elapsed().as_millis() as u64, "tool pool loaded");
    // LISTEN before the policy is read, so that a change committed after the read is
    // notified, and the listener need not read it again.
    let listener = listen(&state)
        .await
        .map_err(|e| tracing::warn!(error = %e, "policy listener"))
        .ok();
    state.reload_policy().await?;
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        "start-up: policy snapshot built"
    );
    spawn_listener(state.clone(), listener);
    let _watcher = {
        let state = state.clone();
        let handle = tokio::runtime::Handle::current();
        crate::pool::watcher::spawn(
            settings.tools_dir.clone(),
            Duration::from_millis(250),
            move || {
                let _enter = handle.enter();
                let n = state.reload_pool();
                tracing::info!(tools = n, "tool pool reloaded");
            },
        )
        .map_err(
            |e| tracing::warn!(error = %e, "cannot watch the tools directory; hot reload is off"),
        )
        .ok()
    };
    {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(600));
            loop {
                tick.tick().await;
                let _ = db::revocations::prune_revocations(&state.db).await;
                let _ = db::authorizations::prune_codes(&state.db).await;
                state.limits.shrink();
                if let Err(e) =
                    crate::audit::apply_retention(&state.db, state.settings.audit_retention_days)
                        .await
                {
                    tracing::warn!(error = %e, "audit retention failed (a serving role that may not drop tables needs `toolgate audit retention` run as the owner)");
                }
            }
        });
    }
    {
        // Short-lived shared rows (a sign-in key lives a minute, an assertion id ten): pruned
        // often, so a spray of attempts leaves little behind.
        let db = state.db.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SHARED_STATE_PRUNE_EVERY);
            loop {
                tick.tick().await;
                if let Err(e) = prune_shared_state(&db).await {
                    tracing::warn!(error = %e, "pruning used assertion ids and sign-in throttles failed");
                }
            }
        });
    }
    let checkpoints = crate::audit::checkpoint::spawn_publisher(
        state.db.clone(),
        args.audit_checkpoint_key.as_deref(),
        Duration::from_secs(args.audit_checkpoint_secs),
    )?;
    let listener = TcpListener::bind(args.bind).await?;
    tracing::info!(addr = %listener.local_addr()?, issuer = %settings.issuer, "toolgate listening");
    let drain = Drain::from_args(&args);
    let stop_accepting = tokio_util::sync::CancellationToken::new();
    // axum::serve's loop, with the header and body timeouts and the per-source connection cap.
    let server = crate::listen::serve(
        listener,
        router(state.clone()),
        crate::listen::Bounds::from_settings(&settings),
        stop_accepting.clone(),
    );
    let mut server = std::pin::pin!(server);
    let ended = tokio::select! {
        r = &mut server => r.map_err(anyhow::Error::from),
        () = shutdown_signal() => {
            drain
                .run(&state, server, stop_accepting, checkpoints.as_ref())
                .await
        }
    };
    // Scripts die with the gateway; their groups' temporary directories go now, not at the
    // next start.
    crate::pool::jail::remove_all_directories();
    ended
}

/// How often used assertion ids and idle sign-in throttles are deleted.
const SHARED_STATE_PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Deletes the used client-assertion ids that can no longer be presented and the sign-in
/// throttle keys back at their full burst; returns how many of each.
pub async fn prune_shared_state(db: &PgPool) -> sqlx::Result<(u64, u64)> {
    Ok((
        db::assertions::prune(db).await?,
        db::signin::prune(db).await?,
    ))
}

/// The shutdown sequence after SIGTERM (or Ctrl-C):
///
/// 1. at once, `/readyz` answers 503 and every response asks its client to close the
///    connection;
/// 2. for the grace period, new requests are still served, while load balancers notice;
/// 3. the listener closes; requests in flight run to their end (their audit rows are durable
///    before they answer);
/// 4. the audit log is flushed (events recorded without waiting, such as refused sign-ins),
///    and, with a checkpoint key, a checkpoint is signed over the last rows;
/// 5. the process exits. Whatever is still running at the drain deadline is abandoned, with
///    an error logged; scripts die with the process.
struct Drain {
    grace: Duration,
    timeout: Duration,
    /// The last part of the deadline, kept for flushing the audit log, so that requests
    /// finishing late still leave time to write what they recorded.
    flush_reserve: Duration,
}

impl Drain {
    fn from_args(args: &ServeArgs) -> Self {
        let timeout = Duration::from_secs(args.drain_timeout_secs);
        let flush_reserve = (timeout / 5).min(Duration::from_secs(5));
        Self {
            grace: Duration::from_secs(args.drain_grace_secs).min(timeout - flush_reserve),
            timeout,
            flush_reserve,
        }
    }

    /// Runs the sequence; an error if anything had to be abandoned.
    async fn run<F>(
        self,
        state: &AppState,
        mut server: std::pin::Pin<&mut F>,
        stop_accepting: tokio_util::sync::CancellationToken,
        checkpoints: Option<&crate::audit::checkpoint::Publisher>,
    ) -> anyhow::Result<()>
    where
        F: std::future::Future<Output = std::io::Result<()>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        state.start_drain();
        tracing::info!(
            grace_secs = self.grace.as_secs(),
            timeout_secs = self.timeout.as_secs(),
            in_flight = state.in_flight(),
            "draining: /readyz answers 503; still serving for the grace period"
        );
        let served = tokio::select! {
            () = tokio::time::sleep(self.grace) => None,
            r = server.as_mut() => Some(r),
        };
        stop_accepting.cancel();
        let served = match served {
            Some(r) => Some(r),
            None => {
                tracing::info!(
                    in_flight = state.in_flight(),
                    "draining: the listener is closed; waiting for requests in flight"
                );
                tokio::time::timeout_at(deadline - self.flush_reserve, server.as_mut())
                    .await
                    .ok()
            }
        };
        let mut clean = true;
        match served {
            Some(Ok(())) => tracing::info!("draining: every request has finished"),
            Some(Err(e)) => {
                clean = false;
                tracing::error!(error = %e, "draining: the server failed");
            }
            None => {
                clean = false;
                tracing::error!(
                    in_flight = state.in_flight(),
                    timeout_secs = self.timeout.as_secs(),
                    "drain deadline reached: abandoning the requests still in flight"
                );
            }
        }
        // The counts of refusals still being summarised go out with the last flush.
        state.refusals.flush();
        match tokio::time::timeout_at(deadline, state.audit.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                clean = false;
                tracing::error!(error = %e, "the audit log could not be flushed");
            }
            Err(_) => {
                clean = false;
                tracing::error!("drain deadline reached: the audit log was not flushed in time");
            }
        }
        // The rows since the last periodic checkpoint would otherwise stay unsigned for good.
        if let Some(p) = checkpoints {
            match tokio::time::timeout_at(deadline, p.sign_now()).await {
                Ok(Ok(c)) => {
                    tracing::info!(
                        checkpoint = c.and_then(|c| c.id),
                        "draining: the last audit rows are signed"
                    );
                }
                Ok(Err(e)) => {
                    clean = false;
                    tracing::error!(error = %e, "the last audit checkpoint could not be signed");
                }
                Err(_) => {
                    clean = false;
                    tracing::error!(
                        "drain deadline reached: the last audit checkpoint was not signed"
                    );
                }
            }
        }
        if !clean {
            anyhow::bail!("toolgate stopped with work abandoned (see the errors above)");
        }
        tracing::info!("toolgate stopped");
        Ok(())
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
