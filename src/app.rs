//! The composition root: builds the live state ([`crate::state`]) from `serve`'s flags, mounts
//! the surfaces' routers over it, and runs the `serve` life cycle (start-up, drain).

use std::time::Duration;

use axum::Router;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::config::ServeArgs;
use crate::pool::loader::load_pool;
use crate::pool::sandbox::{Mode, SandboxSettings};
use crate::state::{AppState, Settings};
use crate::{api, db, http, mcp, oauth, rest, web};

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

/// What the surfaces need beyond the live state, resolved from `serve`'s flags and handed to
/// each when it is mounted.
#[derive(Clone)]
pub struct Surfaces {
    pub web: web::Config,
}

impl Surfaces {
    pub fn from_args(args: &ServeArgs, settings: &Settings) -> anyhow::Result<Self> {
        Ok(Self {
            web: web::Config::from_args(args, &settings.issuer)?,
        })
    }
}

/// The whole HTTP surface.
pub fn router(state: AppState, surfaces: Surfaces) -> Router {
    Router::new()
        .merge(http::ops_router(state.settings.metrics_bind.is_none()))
        .merge(oauth::router(state.settings.registration))
        .nest("/api/v1", api::router(state.clone()))
        .merge(rest::router(state.clone()))
        .merge(mcp::router(state.clone()))
        .merge(web::router(state.clone(), surfaces.web))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            http::observe,
        ))
        .layer(http::request_id_layers())
        .with_state(state)
}

/// `toolgate serve`.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Scripts, even as root, must not read this process's memory or environment through /proc.
    nix::sys::prctl::set_dumpable(false)?;
    let settings = Settings::from_args(&args)?;
    let surfaces = Surfaces::from_args(&args, &settings)?;
    check_sandbox(&settings.loader.sandbox)?;
    if let Some(agent) = &settings.dev_agent {
        tracing::warn!(agent = %agent, "--dev-agent is set: unauthenticated requests act as this agent; never use it outside local development");
    }
    let pool = db::connect(&args.db.database_url, 16).await?;
    db::migrate(&pool, &args.db.database_url).await?;
    crate::service::keys::ensure_first(&pool).await?;
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
            // Never at start: what the admin UI or API added survives a restart.
            false,
        )
        .await
        {
            Ok(report) => {
                for k in &report.kept {
                    tracing::warn!(kept = %k, "policies folder: not removed at start");
                }
                tracing::info!(
                    changes = report.changes.len(),
                    "applied the policies folder to the empty database"
                )
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not apply the policies folder on first start")
            }
        }
    }
    // Sinks are checked before anything starts: a mistyped URL is an error now, not a log
    // line an hour later.
    let sinks = args
        .audit_sink
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| crate::audit::sink::Sink::parse(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!(e))?;
    let state = AppState::new(settings.clone(), pool);
    crate::audit::rollup::spawn(state.db.clone());
    crate::gate::spawn_approval_sweeper(state.clone());
    crate::service::connections::spawn_refresher(state.clone());
    if !sinks.is_empty() {
        tracing::info!(sinks = ?sinks.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), "audit sinks");
        crate::audit::sink::spawn(state.db.clone(), sinks, state.metrics.clone());
    }
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
    let listener = crate::state::listen(&state)
        .await
        .map_err(|e| tracing::warn!(error = %e, "policy listener"))
        .ok();
    state.reload_policy().await?;
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        "start-up: policy snapshot built"
    );
    crate::memory::trim();
    crate::state::spawn_listener(state.clone(), listener);
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
                crate::memory::trim();
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
    if let Some(addr) = settings.metrics_bind {
        let listener = TcpListener::bind(addr).await?;
        tracing::info!(addr = %listener.local_addr()?, "metrics listening");
        // The same accept loop and bounds as the main address; it stops accepting with it.
        let metrics = crate::listen::serve(
            listener,
            http::metrics_router(state.clone()),
            crate::listen::Bounds::from_settings(&settings),
            stop_accepting.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = metrics.await {
                tracing::error!(error = %e, "the metrics listener failed");
            }
        });
    }
    // axum::serve's loop, with the header and body timeouts and the per-source connection cap.
    let server = crate::listen::serve(
        listener,
        router(state.clone(), surfaces),
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
