//! What `serve`'s flags resolve to for the core: issuer and audience, the tools folder and its
//! loader, limits, the perimeter's bounds. A surface's own settings (the admin UI's sessions
//! and sign-in methods) live with that surface and are handed to it when it is mounted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{RedisFailureMode, ScriptSandbox, ServeArgs};
use crate::pool::loader::LoaderSettings;
use crate::pool::runner::OutputLimits;
use crate::pool::sandbox::{Mode, SandboxSettings, ScriptUser};

/// Settings resolved from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Token issuer and base of every public URL, without a trailing slash.
    pub issuer: String,
    /// The canonical `/mcp` URL: the audience of access tokens.
    pub audience: String,
    pub tools_dir: PathBuf,
    /// The policies folder, compared with the database on the dashboard.
    pub policies_dir: PathBuf,
    pub dev_agent: Option<String>,
    pub admin_token: Option<String>,
    pub token_ttl: Duration,
    /// Clock skew tolerated on access tokens, in seconds.
    pub token_leeway_secs: u64,
    pub page_size: usize,
    /// `tools/list` answered before the SDK when the request allows (`mcp::list`).
    pub mcp_fast_list: bool,
    /// Tokens of tool definitions up to which `discovery: auto` lists in full.
    pub search_token_budget: usize,
    pub index_token_budget: usize,
    /// A listener of its own for `/metrics`; `None`: served on the main address.
    pub metrics_bind: Option<std::net::SocketAddr>,
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
    /// Reverse proxies whose `X-Forwarded-For` names the client (see `http::client_addr`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Client ID Metadata Documents may be fetched from inside addresses (development only).
    pub cimd_allow_private: bool,
    /// Certificate authorities trusted for those fetches beside the public roots.
    pub cimd_roots: Vec<reqwest013::Certificate>,
    /// What `/oauth/register` does with a host that registers itself.
    pub registration: crate::config::Registration,
    /// Timeouts, connection and audit-row bounds for clients that proved nothing.
    pub perimeter: crate::config::PerimeterArgs,
    /// Approver (role or set) → the webhook that tells them of a waiting call.
    pub approval_webhooks: Vec<(String, url::Url)>,
    pub approval_webhook_secret: Option<String>,
    /// How long a modern client's retry waits for a decision.
    pub approval_hold: Duration,
    /// The keys that open stored credentials (empty: none can be stored or used).
    pub credential_keys: Arc<crate::credentials::KeyRing>,
}

impl Settings {
    /// What an access token must say to be accepted here.
    pub fn expected_token(&self) -> crate::auth::token::Expected<'_> {
        crate::auth::token::Expected {
            issuer: &self.issuer,
            audience: &self.audience,
            leeway_secs: self.token_leeway_secs,
        }
    }

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
        let approval_webhooks = approval_webhooks(&args.approval_webhooks)?;
        let mut allowed_origins = vec![origin_of(&public)];
        allowed_origins.extend(args.allowed_origins.iter().cloned());
        Ok(Self {
            audience: format!("{issuer}/mcp"),
            issuer,
            tools_dir: args.tools_dir.clone(),
            policies_dir: args.policies_dir.clone(),
            dev_agent: args.dev_agent.clone(),
            admin_token: args.admin_token.clone().filter(|t| !t.is_empty()),
            token_ttl: Duration::from_secs(args.token_ttl_secs.clamp(5, 86_400)),
            token_leeway_secs: args.token_leeway_secs.min(300),
            page_size: args.page_size.clamp(1, 1000),
            mcp_fast_list: args.mcp_fast_list == crate::config::OnOff::On,
            search_token_budget: args.search_token_budget,
            index_token_budget: args.index_token_budget,
            metrics_bind: args.metrics_bind,
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
            approval_webhooks,
            approval_hold: Duration::from_secs(args.approval_hold_secs.min(120)),
            credential_keys: Arc::new(args.credential_keys.ring()?),
            approval_webhook_secret: args
                .approval_webhook_secret
                .clone()
                .filter(|s| !s.is_empty()),
            trusted_proxies: args.trusted_proxies.clone(),
            cimd_allow_private: args.oauth_cimd_allow_private,
            cimd_roots: match &args.oauth_cimd_ca_file {
                None => Vec::new(),
                Some(path) => crate::auth::cimd::read_roots(path)?,
            },
            registration: args.oauth_registration,
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

fn origin_of(u: &url::Url) -> String {
    u.origin().ascii_serialization()
}

impl Settings {
    /// Rows of the `tools` table this instance owns: tools from its tools folder.
    pub fn instance_origin(&self) -> String {
        format!("folder:{}", self.tools_dir.display())
    }

    /// The budgets `discovery: auto` chooses by.
    pub fn budgets(&self) -> crate::search::Budgets {
        crate::search::Budgets {
            full: self.search_token_budget,
            index: self.index_token_budget,
        }
    }
}

/// `<approver>=<url>` pairs, checked now: a mistyped webhook is an error at start, not a
/// silence when a call waits.
fn approval_webhooks(specs: &[String]) -> anyhow::Result<Vec<(String, url::Url)>> {
    specs
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let (who, url) = s.split_once('=').ok_or_else(|| {
                anyhow::anyhow!("--approval-webhook {s:?}: write <approver>=<url>")
            })?;
            let who = who.trim();
            if !crate::policy::approvals::valid_approver(who) {
                anyhow::bail!(
                    "--approval-webhook {s:?}: `{who}` is not a role or approver set name"
                );
            }
            let url = url::Url::parse(url.trim())
                .map_err(|e| anyhow::anyhow!("--approval-webhook {s:?}: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") {
                anyhow::bail!("--approval-webhook {s:?}: the URL must be http or https");
            }
            Ok((who.to_owned(), url))
        })
        .collect()
}
