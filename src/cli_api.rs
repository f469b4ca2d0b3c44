//! `toolgate agent|grant|user`: the admin API from the command line.
//!
//! These go through a running server rather than the database: the server's services make the
//! change, audit it (as the API), and every instance sees it on its next request, exactly as
//! for the admin UI. The command prints the API's JSON answer; an error answer is an error
//! exit with the server's message.

use std::process::ExitCode;

use serde_json::{Value, json};

use crate::config::{AgentCommand, ApiArgs, GrantCommand, UserCommand};

struct Api {
    base: String,
    token: String,
    http: reqwest013::Client,
}

impl Api {
    fn new(args: ApiArgs) -> anyhow::Result<Self> {
        let token = args.admin_token.filter(|t| !t.is_empty()).ok_or_else(|| {
            anyhow::anyhow!("the admin API needs its token: --admin-token or TOOLGATE_ADMIN_TOKEN")
        })?;
        Ok(Self {
            base: format!("{}/api/v1", args.url.trim_end_matches('/')),
            token,
            http: reqwest013::Client::builder()
                .timeout(std::time::Duration::from_secs(30))
                .build()?,
        })
    }

    /// `path` segments are escaped here: a name never changes which route is called.
    async fn call(
        &self,
        method: Method,
        path: &[&str],
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut url = url::Url::parse(&self.base)?;
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("--url cannot be a base URL"))?
            .extend(path);
        let mut req = self
            .http
            .request(method, url.clone())
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if !status.is_success() {
            let message = body["error"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| text.trim().to_owned());
            anyhow::bail!("{status}: {message}");
        }
        Ok(body)
    }
}

fn print(v: &Value) -> anyhow::Result<ExitCode> {
    if !v.is_null() {
        println!("{}", serde_json::to_string_pretty(v)?);
    }
    Ok(ExitCode::SUCCESS)
}

use reqwest013::Method;

pub async fn agent(api: ApiArgs, command: AgentCommand) -> anyhow::Result<ExitCode> {
    let api = Api::new(api)?;
    match command {
        AgentCommand::List => print(&api.call(Method::GET, &["agents"], None).await?),
        AgentCommand::Show { name } => {
            print(&api.call(Method::GET, &["agents", &name], None).await?)
        }
        AgentCommand::Create { name, description } => print(
            &api.call(
                Method::POST,
                &["agents"],
                Some(json!({"name": name, "description": description})),
            )
            .await?,
        ),
        AgentCommand::Delete { name } => {
            api.call(Method::DELETE, &["agents", &name], None).await?;
            println!("deleted agent {name}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub async fn grant(api: ApiArgs, command: GrantCommand) -> anyhow::Result<ExitCode> {
    let api = Api::new(api)?;
    match command {
        GrantCommand::Add { agent, target } => {
            let added = api
                .call(
                    Method::POST,
                    &["agents", &agent, "grants"],
                    Some(json!({"target": target})),
                )
                .await?;
            if let Some(w) = added["warning"].as_str() {
                eprintln!("warning: {w}");
            }
            print(&added)
        }
        GrantCommand::Remove { agent, target } => {
            api.call(Method::DELETE, &["agents", &agent, "grants", &target], None)
                .await?;
            println!("removed the grant {target} from {agent}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub async fn user(api: ApiArgs, command: UserCommand) -> anyhow::Result<ExitCode> {
    let api = Api::new(api)?;
    match command {
        UserCommand::List => print(&api.call(Method::GET, &["users"], None).await?),
        UserCommand::Create { username, role } => {
            let mut password = String::new();
            std::io::stdin().read_line(&mut password)?;
            let password = password.trim_end_matches(['\n', '\r']);
            print(
                &api.call(
                    Method::POST,
                    &["users"],
                    Some(json!({"username": username, "password": password, "role": role})),
                )
                .await?,
            )
        }
        UserCommand::Role { username, role } => print(
            &api.call(
                Method::PUT,
                &["users", &username, "role"],
                Some(json!({"role": role})),
            )
            .await?,
        ),
        UserCommand::AddToAgent { agent, username } => {
            api.call(Method::PUT, &["agents", &agent, "users", &username], None)
                .await?;
            println!("{username} may now act as {agent} through a host");
            Ok(ExitCode::SUCCESS)
        }
        UserCommand::RemoveFromAgent { agent, username } => {
            api.call(
                Method::DELETE,
                &["agents", &agent, "users", &username],
                None,
            )
            .await?;
            println!(
                "{username} may no longer act as {agent}; their host authorizations for it are revoked"
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
