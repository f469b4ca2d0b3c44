//! Command line and environment: every flag also reads a `TOOLGATE_*` variable.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "toolgate",
    version,
    about = "Serve tools to AI agents, each agent only its share"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format.
    #[arg(
        long,
        global = true,
        env = "TOOLGATE_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the tools over MCP and REST, with the OAuth server and the admin API.
    Serve(Box<ServeArgs>),
    /// Apply database migrations and exit.
    Migrate(MigrateArgs),
    /// Policies as code: check, apply or export the `policies/` folder.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// OAuth clients of agents.
    Client {
        #[command(subcommand)]
        command: ClientCommand,
    },
    /// The audit log: export it, verify its hash chains.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Token signing keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Accounts of the admin UI.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Tools of pinned groups held for approval: list, approve or reject them.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// Agents, through a running server's admin API (live on every instance, audited).
    Agent {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// Grants of agents, through a running server's admin API.
    Grant {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        command: GrantCommand,
    },
    /// Accounts of the admin UI and who may act as an agent, through a running server's admin API.
    User {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        command: UserCommand,
    },
    /// The keys that encrypt stored credentials: make one, re-wrap under the first.
    Secrets {
        #[command(subcommand)]
        command: SecretsCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Print a new key-encryption key, `<id>:<base64>`, for --credential-key.
    Keygen {
        /// The key's id (stored beside each value it wraps).
        #[arg(long, default_value = "k1")]
        id: String,
    },
    /// Re-wrap every stored credential's data key under the first --credential-key (values
    /// are not re-encrypted). Safe while serving: instances given both keys open either.
    RotateKek {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        keys: CredentialKeyArgs,
    },
}

/// The key-encryption keys of stored credentials.
#[derive(Debug, Clone, Args, Default)]
pub struct CredentialKeyArgs {
    /// Key-encryption keys of stored credentials, `<id>:<base64 of 32 bytes>` (from `toolgate
    /// secrets keygen`), comma-separated: the first wraps new values, every one opens. Never
    /// stored in the database; without one, credentials can be neither stored nor used.
    #[arg(
        long = "credential-key",
        env = "TOOLGATE_CREDENTIAL_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub credential_keys: Vec<String>,
    /// A file of such keys, one per line (after any --credential-key).
    #[arg(long, env = "TOOLGATE_CREDENTIAL_KEY_FILE")]
    pub credential_key_file: Option<PathBuf>,
}

impl CredentialKeyArgs {
    /// The key ring these arguments name.
    pub fn ring(&self) -> anyhow::Result<crate::credentials::KeyRing> {
        let mut specs = self.credential_keys.clone();
        if let Some(path) = &self.credential_key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
            specs.extend(text.lines().map(str::to_owned));
        }
        crate::credentials::KeyRing::parse(&specs).map_err(|e| anyhow::anyhow!(e))
    }
}

/// Where the admin API is, and its token.
#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// The server's public URL.
    #[arg(
        long,
        env = "TOOLGATE_URL",
        default_value = "http://127.0.0.1:8787",
        global = true
    )]
    pub url: String,
    /// The admin API's bearer token (the server's --admin-token).
    #[arg(
        long,
        env = "TOOLGATE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    pub admin_token: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Every agent, with its grants and how many tools each matches.
    List,
    /// One agent: grants, tools it sees, limits, rules, people.
    Show { name: String },
    /// Create an agent (no grants yet).
    Create {
        name: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Delete an agent, its grants and its clients.
    Delete { name: String },
}

#[derive(Debug, Subcommand)]
pub enum GrantCommand {
    /// Grant `target` (a group, `group__tool`, or `*`) to `agent`; warns when it matches nothing.
    Add { agent: String, target: String },
    /// Take a grant away: live on the agent's next request.
    Remove { agent: String, target: String },
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Accounts of the admin UI.
    List,
    /// Create an account; the password is read from standard input (one line).
    Create {
        username: String,
        #[arg(long, value_parser = ["admin", "auditor", "viewer", "member"])]
        role: String,
    },
    /// Change an account's role.
    Role {
        username: String,
        #[arg(value_parser = ["admin", "auditor", "viewer", "member"])]
        role: String,
    },
    /// Let `username` act as `agent` through an interactive host.
    AddToAgent { agent: String, username: String },
    /// No longer: their host authorizations for the agent are revoked.
    RemoveFromAgent { agent: String, username: String },
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// After migrating, grant this existing role what serving needs and no more: the
    /// control-plane tables in full, the audit log only to append and read (no UPDATE,
    /// DELETE, TRUNCATE or ALTER). Run as the owner role, again after every upgrade.
    #[arg(long, env = "TOOLGATE_SERVING_ROLE")]
    pub serving_role: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL URL; `serve` and `migrate` create the database if it does not exist.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://localhost/toolgate"
    )]
    pub database_url: String,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub credential_keys: CredentialKeyArgs,
    #[command(flatten)]
    pub perimeter: PerimeterArgs,
    /// Address to listen on.
    #[arg(long, env = "TOOLGATE_BIND", default_value = "127.0.0.1:8787")]
    pub bind: SocketAddr,
    /// Serve `/metrics` (and `/healthz`, `/readyz`) on this address instead, e.g. an
    /// interface only the monitoring network reaches; the main address then answers 404 there.
    #[arg(long, env = "TOOLGATE_METRICS_BIND")]
    pub metrics_bind: Option<SocketAddr>,
    /// Folder of script tool groups.
    #[arg(long, env = "TOOLGATE_TOOLS_DIR", default_value = "./tools")]
    pub tools_dir: PathBuf,
    /// Policies folder, applied on first start into an empty database.
    #[arg(long, env = "TOOLGATE_POLICIES_DIR", default_value = "./policies")]
    pub policies_dir: PathBuf,
    /// Public base URL: the token issuer, and `<url>/mcp` is the token audience.
    #[arg(long, env = "TOOLGATE_PUBLIC_URL")]
    pub public_url: Option<url::Url>,
    /// Extra `Host` values accepted on /mcp (the public URL's host is always accepted).
    #[arg(
        long = "allowed-host",
        env = "TOOLGATE_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed on /mcp; requests with any other `Origin` get 403.
    #[arg(
        long = "allowed-origin",
        env = "TOOLGATE_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
    /// Treat unauthenticated requests as this agent (local development only; loopback binds only).
    #[arg(long, env = "TOOLGATE_DEV_AGENT")]
    pub dev_agent: Option<String>,
    /// Let Client ID Metadata Documents be fetched over http and from loopback or private
    /// addresses (local development and tests only: it opens the fetch to the inside network).
    #[arg(long, env = "TOOLGATE_OAUTH_CIMD_ALLOW_PRIVATE")]
    pub oauth_cimd_allow_private: bool,
    /// Also trust the certificate authorities in this PEM file when fetching Client ID
    /// Metadata Documents over https (an organisation's private CA; the public roots stay
    /// trusted).
    #[arg(long, env = "TOOLGATE_OAUTH_CIMD_CA_FILE", value_name = "PEM")]
    pub oauth_cimd_ca_file: Option<std::path::PathBuf>,
    /// Dynamic Client Registration (RFC 7591) at `/oauth/register`, which `mcp-remote` and
    /// desktop hosts need: `held` (a registration waits for an admin's approval before its
    /// first sign-in), `open` (usable at once; for trusted networks), `off` (no endpoint).
    #[arg(long, env = "TOOLGATE_OAUTH_REGISTRATION", default_value = "held")]
    pub oauth_registration: Registration,
    /// Bearer token for the JSON admin API (/api/v1).
    #[arg(long, env = "TOOLGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Access token lifetime in seconds (5 to 86400).
    #[arg(long, env = "TOOLGATE_TOKEN_TTL_SECS", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(5..=86_400))]
    pub token_ttl_secs: u64,
    /// Seconds an access token is still accepted past its `exp` (and before its `iat`/`nbf`):
    /// the clock skew tolerated between the gateway's instances (0 to 300).
    #[arg(long, env = "TOOLGATE_TOKEN_LEEWAY_SECS",
          default_value_t = crate::auth::token::ACCESS_TOKEN_LEEWAY_SECS,
          value_parser = clap::value_parser!(u64).range(0..=300))]
    pub token_leeway_secs: u64,
    /// Default script timeout in milliseconds (an operation may set `x-toolgate-timeout-ms`).
    #[arg(long, env = "TOOLGATE_SCRIPT_TIMEOUT_MS", default_value_t = 30_000)]
    pub script_timeout_ms: u64,
    /// Largest stdout a script may print, in bytes.
    #[arg(long, env = "TOOLGATE_MAX_STDOUT_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_stdout_bytes: usize,
    /// Confinement of tool scripts: `auto` uses what the kernel has and warns at start about
    /// the rest, `required` refuses to start unless every layer works, `off` runs them unconfined.
    #[arg(long, env = "TOOLGATE_SCRIPT_SANDBOX", default_value = "auto")]
    pub script_sandbox: ScriptSandbox,
    /// Run tool scripts under this user's uid, gid and groups (a gateway running as root
    /// runs them as `nobody` without it).
    #[arg(long, env = "TOOLGATE_SCRIPT_USER")]
    pub script_user: Option<String>,
    /// Extra paths sandboxed scripts may read and execute (besides the system paths, the
    /// directories on PATH and their prefixes, and the script's own folder).
    #[arg(
        long = "script-read-path",
        env = "TOOLGATE_SCRIPT_READ_PATHS",
        value_delimiter = ','
    )]
    pub script_read_paths: Vec<PathBuf>,
    /// Where the gateway keeps its read-only copies of the scripts it loaded and hashed (calls
    /// run these, not the tools folder's files); a directory of this process is made inside.
    /// Default: the system temporary directory. Must not be writable by tool authors.
    #[arg(long, env = "TOOLGATE_SCRIPT_COPIES_DIR")]
    pub script_copies_dir: Option<PathBuf>,
    /// How many copies of one tool may run at once.
    #[arg(long, env = "TOOLGATE_MAX_CONCURRENCY_PER_TOOL", default_value_t = 8)]
    pub max_concurrency_per_tool: usize,
    /// Audit partitions older than this many days are dropped.
    #[arg(long, env = "TOOLGATE_AUDIT_RETENTION_DAYS", default_value_t = 365)]
    pub audit_retention_days: u32,
    /// Push the audit log to a SIEM, at least once, from a cursor kept in the database and
    /// shared by the instances (repeatable; comma-separated in the variable):
    /// `syslog+tcp://host:port`, `syslog+tls://host:port[?ca=/ca.pem]`,
    /// `https://[:token@]host/path[?format=hec]`, `otlp+http://host:4318`; each with
    /// `?format=ocsf|cef|jsonl`. See docs/audit-schema.md.
    #[arg(
        long = "audit-sink",
        env = "TOOLGATE_AUDIT_SINK",
        value_delimiter = ','
    )]
    pub audit_sink: Vec<String>,
    /// Where approvers are told of a call that waits for them: `<approver>=<url>`, one per
    /// role or approver set (repeatable; comma-separated in the environment). A
    /// Slack-compatible JSON POST (`text`, plus the request under `approval`) with a link to
    /// the inbox, signed with `--approval-webhook-secret`, retried with backoff.
    #[arg(
        long = "approval-webhook",
        env = "TOOLGATE_APPROVAL_WEBHOOKS",
        value_delimiter = ','
    )]
    pub approval_webhooks: Vec<String>,
    /// How long a call that waits for approval is held open for a decision before the caller
    /// is told to come back: a 2025-era call (with progress notifications when it asked for
    /// them) and a 2026-07-28 client's retry. Keep it below the clients' timeouts; 0 answers
    /// at once.
    #[arg(long, env = "TOOLGATE_APPROVAL_HOLD_SECS", default_value_t = 20)]
    pub approval_hold_secs: u64,
    /// Signs each webhook: `X-Toolgate-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of
    /// "<t>.<body>">`.
    #[arg(long, env = "TOOLGATE_APPROVAL_WEBHOOK_SECRET", hide_env_values = true)]
    pub approval_webhook_secret: Option<String>,
    /// Ed25519 private key (from `toolgate audit keygen`) that signs audit checkpoints. Keep
    /// it out of the database; without it, a re-hashed chain cannot be detected.
    #[arg(long, env = "TOOLGATE_AUDIT_CHECKPOINT_KEY")]
    pub audit_checkpoint_key: Option<PathBuf>,
    /// Longest time, in seconds, a new audit row waits to be covered by a signed checkpoint
    /// (nothing is signed while no row arrives; a drain signs the last rows).
    #[arg(long, env = "TOOLGATE_AUDIT_CHECKPOINT_SECS", default_value_t = 5)]
    pub audit_checkpoint_secs: u64,
    /// After SIGTERM, the seconds within which the process exits: calls in flight finish and
    /// the audit log is flushed first; whatever is still running then is abandoned.
    #[arg(long, env = "TOOLGATE_DRAIN_TIMEOUT_SECS", default_value_t = 30)]
    pub drain_timeout_secs: u64,
    /// After SIGTERM, the seconds new requests are still served while `/readyz` answers 503,
    /// so load balancers stop routing here before the listener closes (at most the timeout).
    #[arg(long, env = "TOOLGATE_DRAIN_GRACE_SECS", default_value_t = 5)]
    pub drain_grace_secs: u64,
    /// Token requests allowed per second from one client IP (against secret guessing).
    #[arg(long, env = "TOOLGATE_TOKEN_RATE_PER_IP", default_value_t = 5)]
    pub token_rate_per_ip: u32,
    /// Burst of token requests allowed from one client IP.
    #[arg(long, env = "TOOLGATE_TOKEN_BURST_PER_IP", default_value_t = 20)]
    pub token_burst_per_ip: u32,
    /// Addresses or networks of reverse proxies (load balancers) whose `X-Forwarded-For` is
    /// believed: the client is the first address, read from the right, that is not one of them.
    /// Without it the peer address is the client, whatever the header says.
    #[arg(
        long = "trusted-proxy",
        env = "TOOLGATE_TRUSTED_PROXIES",
        value_delimiter = ',',
        value_parser = parse_net
    )]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Redis URL for rate-limit counters shared by every instance (`redis://host:6379/0`).
    /// Without it, each instance counts its own.
    #[arg(long, env = "TOOLGATE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// When Redis cannot answer a limit check in time: `open` counts in this instance
    /// instead, `closed` refuses the request with 503.
    #[arg(
        long,
        env = "TOOLGATE_REDIS_FAILURE_MODE",
        value_enum,
        default_value = "open"
    )]
    pub redis_failure_mode: RedisFailureMode,
    /// Put before every Redis key, so several deployments can share one Redis.
    #[arg(
        long,
        env = "TOOLGATE_REDIS_KEY_PREFIX",
        default_value = "toolgate:rl:"
    )]
    pub redis_key_prefix: String,
    /// How long a limit check waits for Redis before the failure mode applies.
    #[arg(long, env = "TOOLGATE_REDIS_TIMEOUT_MS", default_value_t = 50)]
    pub redis_timeout_ms: u64,
    /// An admin UI session ends after this many minutes without a request.
    #[arg(long, env = "TOOLGATE_SESSION_IDLE_MINUTES", default_value_t = 30)]
    pub session_idle_minutes: u64,
    /// An admin UI session ends this many hours after sign-in, however active.
    #[arg(long, env = "TOOLGATE_SESSION_MAX_HOURS", default_value_t = 12)]
    pub session_max_hours: u64,
    /// Local password sign-in to the admin UI; `off` leaves only the OpenID Provider (keep it
    /// `on`, or be ready to restart with it `on`, for break-glass accounts).
    #[arg(
        long,
        env = "TOOLGATE_PASSWORD_SIGN_IN",
        value_enum,
        default_value = "on"
    )]
    pub password_sign_in: OnOff,
    #[command(flatten)]
    pub oidc: OidcArgs,
    /// Page size of tools/list.
    #[arg(long, env = "TOOLGATE_PAGE_SIZE", default_value_t = 100)]
    pub page_size: usize,
    /// Answer plain `tools/list` requests from the tools' serialized definitions, before the
    /// MCP SDK (the same bytes, faster); `off` sends every request through the SDK.
    #[arg(long, env = "TOOLGATE_MCP_FAST_LIST", value_enum, default_value = "on")]
    pub mcp_fast_list: OnOff,
    /// `discovery: auto` agents get their tools in full up to this many tokens of definitions,
    /// and the search meta-tools above it.
    #[arg(long, env = "TOOLGATE_SEARCH_TOKEN_BUDGET", default_value_t = crate::search::DEFAULT_TOKEN_BUDGET)]
    pub search_token_budget: usize,
    /// `discovery: auto` agents over `--search-token-budget` get the index (every tool's name
    /// and one line) while it costs at most this many tokens, and search alone above it.
    #[arg(long, env = "TOOLGATE_INDEX_TOKEN_BUDGET", default_value_t = crate::search::DEFAULT_INDEX_BUDGET)]
    pub index_token_budget: usize,
    /// A static embedding table for `search_tools` (made by `bench/embeddings/setup.sh`): its
    /// vectors are fused with the word ranker. Without it, search is the word ranker alone.
    #[arg(long, env = "TOOLGATE_SEARCH_EMBEDDINGS")]
    pub search_embeddings: Option<std::path::PathBuf>,
}

/// How `/oauth/register` treats a host that registers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Registration {
    /// No registration endpoint: hosts use a metadata document or a client an admin made.
    Off,
    /// Registered, then held until an admin approves it.
    Held,
    /// Registered and usable at once.
    Open,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// Admin sign-in with an OpenID Provider: all of issuer, client id and a role mapping, or none.
#[derive(Debug, Clone, Args)]
pub struct OidcArgs {
    /// Issuer URL of the OpenID Provider, exactly as the provider writes it (with or without
    /// a trailing slash: ID tokens must name the same string); its discovery document is
    /// `<issuer>/.well-known/openid-configuration`.
    #[arg(long, env = "TOOLGATE_OIDC_ISSUER")]
    pub oidc_issuer: Option<String>,
    /// The client id registered at the provider; its redirect URL is
    /// `<public-url>/admin/sso/callback`.
    #[arg(long, env = "TOOLGATE_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,
    /// The client secret; prefer the variable or --oidc-client-secret-file, as other users can
    /// read a process's flags.
    #[arg(long, env = "TOOLGATE_OIDC_CLIENT_SECRET", hide_env_values = true)]
    pub oidc_client_secret: Option<String>,
    /// A file holding the client secret (trailing whitespace is ignored).
    #[arg(long, env = "TOOLGATE_OIDC_CLIENT_SECRET_FILE")]
    pub oidc_client_secret_file: Option<PathBuf>,
    /// The provider's name on the sign-in button ("Sign in with <name>"); by default its host.
    #[arg(long, env = "TOOLGATE_OIDC_PROVIDER_NAME")]
    pub oidc_provider_name: Option<String>,
    /// Scopes asked for besides `openid` (some providers need one for the role claim).
    #[arg(
        long = "oidc-scope",
        env = "TOOLGATE_OIDC_SCOPES",
        value_delimiter = ',',
        default_value = "profile,email"
    )]
    pub oidc_scopes: Vec<String>,
    /// The claim (in the ID token, else userinfo) whose values map to roles: a string or an
    /// array of strings.
    #[arg(long, env = "TOOLGATE_OIDC_ROLE_CLAIM", default_value = "groups")]
    pub oidc_role_claim: String,
    /// `claim-value=role` pairs (role: admin, auditor, viewer or member); when several match,
    /// the most privileged role wins; when none does, sign-in is refused.
    #[arg(
        long = "oidc-role-map",
        env = "TOOLGATE_OIDC_ROLE_MAP",
        value_delimiter = ','
    )]
    pub oidc_role_map: Vec<String>,
    /// `claim-value=approver-set` pairs, read from the same claim as roles: at each sign-in
    /// the account's approver sets become those its values map to (the provider is the
    /// source). Without it, approver sets are set through the API only.
    #[arg(
        long = "oidc-approver-map",
        env = "TOOLGATE_OIDC_APPROVER_MAP",
        value_delimiter = ','
    )]
    pub oidc_approver_map: Vec<String>,
}

/// What a client that has proved nothing may hold: time to send a request, connections, and
/// rows in the audit log.
#[derive(Debug, Clone, Args)]
pub struct PerimeterArgs {
    /// Seconds a client has to send a request's headers; also how long an idle keep-alive
    /// connection is kept (a trusted proxy's: at least 90, longer than nginx keeps its own).
    #[arg(long, env = "TOOLGATE_HEADER_READ_TIMEOUT_SECS", default_value_t = 30)]
    pub header_read_timeout_secs: u64,
    /// Seconds a client has to send a request's whole body, counted from its headers; a body
    /// still arriving then is answered 408 and its connection closed.
    #[arg(long, env = "TOOLGATE_REQUEST_BODY_TIMEOUT_SECS", default_value_t = 30)]
    pub request_body_timeout_secs: u64,
    /// Connections one source address (an IPv6 /64) may hold open at once; more are closed as
    /// soon as they are accepted. Trusted proxies are exempt. 0: no limit.
    #[arg(
        long,
        env = "TOOLGATE_MAX_CONNECTIONS_PER_SOURCE",
        default_value_t = 256
    )]
    pub max_connections_per_source: usize,
    /// Seconds over which identical refusals from one source (bad tokens, wrong secrets) are
    /// written to the audit log as their first row and one row with their count.
    #[arg(long, env = "TOOLGATE_REFUSAL_SUMMARY_SECS", default_value_t = 60)]
    pub refusal_summary_secs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisFailureMode {
    Open,
    Closed,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ScriptSandbox {
    Auto,
    Required,
    Off,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate the folder against the tool catalog; non-zero exit on any problem.
    Check(PolicyArgs),
    /// Make the database match the folder, in one transaction, and print the diff.
    Apply(PolicyArgs),
    /// Write the database back as policy files.
    Export(PolicyArgs),
}

#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The policies folder.
    #[arg(long, env = "TOOLGATE_POLICIES_DIR", default_value = "./policies")]
    pub dir: PathBuf,
    /// The tools folder the grants are checked against.
    #[arg(long, env = "TOOLGATE_TOOLS_DIR", default_value = "./tools")]
    pub tools_dir: PathBuf,
    /// Show what would change without changing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Refuse to apply when a grant matches no tool.
    #[arg(long)]
    pub strict: bool,
    /// Also remove agents, grants and users the last apply did not write (added in the admin
    /// UI or API since): without it they are kept and listed.
    #[arg(long)]
    pub prune: bool,
}

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Create an OAuth client for an agent; prints client_id and client_secret (shown once).
    Create {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        agent: crate::names::AgentName,
        #[arg(long, default_value = "")]
        description: String,
        /// A JWK set file of the client's public keys, for private_key_jwt.
        #[arg(long)]
        jwks_file: Option<PathBuf>,
    },
    /// List clients (never their secrets).
    List {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        agent: Option<String>,
    },
    /// Delete a client; its tokens stop working at once.
    Delete {
        #[command(flatten)]
        db: DbArgs,
        client_id: String,
    },
    /// Register (or replace) a public client for an interactive host that has no Client ID
    /// Metadata Document: it signs a person in with authorization code + PKCE.
    RegisterPublic {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        client_id: String,
        /// The name people see on the consent page.
        #[arg(long)]
        name: String,
        /// A redirect URI (repeat for several); a loopback http URI may vary its port.
        #[arg(long = "redirect-uri", required = true)]
        redirect_uris: Vec<String>,
    },
    /// Delete a public client; what people authorized for it is revoked.
    DeletePublic {
        #[command(flatten)]
        db: DbArgs,
        client_id: String,
    },
    /// List public clients.
    ListPublic {
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum ToolsCommand {
    /// Held definitions of pinned groups: old and new hash, and a diff of the definitions.
    Pending {
        #[command(flatten)]
        db: DbArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Approve a held definition: every instance serves it within a second.
    Approve {
        #[command(flatten)]
        db: DbArgs,
        /// The tool (`<group>__<tool>`).
        name: String,
        /// The content hash to approve; by default the tool's newest held definition.
        #[arg(long)]
        hash: Option<String>,
    },
    /// Reject a held definition: it stays held, marked rejected.
    Reject {
        #[command(flatten)]
        db: DbArgs,
        name: String,
        /// The content hash to reject; by default the newest one not yet rejected.
        #[arg(long)]
        hash: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create an admin UI account; the password is read from standard input (one line).
    CreateUser {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        username: crate::names::Username,
        /// admin edits everything; auditor reads everything and exports the audit log;
        /// viewer reads everything but tool arguments.
        #[arg(long, value_parser = ["admin", "auditor", "viewer", "member"])]
        role: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Start signing with a new key; the previous one still verifies until the next rotation.
    Rotate {
        #[command(flatten)]
        db: DbArgs,
    },
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Stream the audit log to stdout.
    Export {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long, value_enum, default_value = "jsonl")]
        format: crate::audit::export::Format,
        /// Only events at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Only events before this time (RFC 3339).
        #[arg(long)]
        until: Option<chrono::DateTime<chrono::Utc>>,
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        tool: Option<String>,
        /// One of the kinds the log records (`tool.result`, `admin.change`, ...).
        #[arg(long)]
        event_type: Option<crate::audit::EventKind>,
        /// One of the outcomes the log records (`success`, `denied`, ...).
        #[arg(long)]
        outcome: Option<crate::audit::Outcome>,
        /// Only what this person did: events of tokens a host obtained for them (its `act`
        /// claim), and their own sign-ins, consents and changes.
        #[arg(long)]
        person: Option<String>,
        /// Only events of this OAuth client.
        #[arg(long)]
        client_id: Option<String>,
        /// Only rows committed after this one (an id from the previous export; a JSONL
        /// export's last line names the best one, `next_after_id`; 0 for the first pull):
        /// incremental pulls that neither overlap nor skip a row another instance committed
        /// late.
        #[arg(long)]
        after_id: Option<i64>,
        /// Only events that took at least this many milliseconds (tool calls, upstream
        /// requests).
        #[arg(long)]
        min_latency_ms: Option<i64>,
    },
    /// Check the hash chains, in the database or in an exported JSONL file: every row
    /// unedited, every chain complete up to its recorded head, every gap explained by
    /// retention, and (with --public-key) every signed checkpoint still matched.
    Verify {
        #[command(flatten)]
        db: DbArgs,
        /// A JSONL export to check offline instead of the database.
        #[arg(long)]
        file: Option<PathBuf>,
        /// The checkpoint public key (from `audit keygen`): check signed checkpoints.
        #[arg(long)]
        public_key: Option<PathBuf>,
        /// Checkpoints kept outside the database (`audit checkpoints` output), checked in
        /// addition to those stored with the log.
        #[arg(long)]
        checkpoints: Option<PathBuf>,
    },
    /// Create an Ed25519 key pair for signing checkpoints: the private key for `serve
    /// --audit-checkpoint-key`, the public key (`<private>.pub`) for verifiers.
    Keygen {
        /// Where to write the private key (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign the current chain heads now and store the checkpoint.
    Checkpoint {
        #[command(flatten)]
        db: DbArgs,
        /// The private key (from `audit keygen`).
        #[arg(long, env = "TOOLGATE_AUDIT_CHECKPOINT_KEY")]
        key: PathBuf,
    },
    /// Print the stored checkpoints as JSONL, to keep a copy outside the database.
    Checkpoints {
        #[command(flatten)]
        db: DbArgs,
        /// Only checkpoints with an id above this one (to append to a copy kept elsewhere).
        #[arg(long)]
        after: Option<i64>,
    },
    /// Drop audit partitions older than the retention period, recording each drop (run as
    /// the database owner when the serving role may not drop tables).
    Retention {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long, env = "TOOLGATE_AUDIT_RETENTION_DAYS", default_value_t = 365)]
        days: u32,
    },
}

/// A network (`10.0.0.0/8`) or a single address (`10.1.2.3`, taken as `/32` or `/128`).
fn parse_net(s: &str) -> Result<ipnet::IpNet, String> {
    let s = s.trim();
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{s:?} is neither an IP address nor a network such as 10.0.0.0/8"))
}
