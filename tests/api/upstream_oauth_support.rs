//! Test support for toolgate as an OAuth client of an upstream MCP server's authorization
//! server: panva's oidc-provider (`tests/oidc-provider/op.mjs`) with a public client, short-lived
//! opaque access tokens and rotating refresh tokens, signed in to through its own development
//! login and consent pages; and the echo upstream (`tests/fixtures/echo-upstream/server.mjs`)
//! as its resource server, which checks tokens at the provider's userinfo endpoint.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, StatusCode};
use reqwest::Url;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::helpers::{repo_path, until};
use crate::upstream::free_port;
use crate::upstream_credentials::Echo;

/// Installs oidc-provider once per checkout (under `target/`) with `npm ci` from the fixture's
/// lock file, and puts a fresh copy of op.mjs beside it (so its import resolves); its path.
///
/// Parallel test processes each install into their own directory and rename it into place, so
/// a half-written install is never seen and the first complete one wins. An install from an
/// older lock file is replaced.
fn op_entry() -> PathBuf {
    let fixture = repo_path("tests/oidc-provider");
    let lock = std::fs::read(fixture.join("package-lock.json")).unwrap();
    let dir = repo_path("target/test-deps-op");
    let current = |dir: &std::path::Path| {
        dir.join("node_modules/oidc-provider/package.json")
            .is_file()
            && std::fs::read(dir.join("package-lock.json")).ok().as_ref() == Some(&lock)
    };
    if !current(&dir) {
        let staging = repo_path(&format!("target/test-deps-op.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).unwrap();
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(fixture.join(file), staging.join(file)).unwrap();
        }
        let out = std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&staging)
            .output()
            .expect("npm is needed to fetch oidc-provider");
        assert!(
            out.status.success(),
            "npm ci failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if dir.exists() && !current(&dir) {
            // A broken or outdated earlier install: replace it.
            let _ = std::fs::remove_dir_all(&dir);
        }
        if std::fs::rename(&staging, &dir).is_err() {
            // Another test process finished first.
            let _ = std::fs::remove_dir_all(&staging);
        }
    }
    assert!(current(&dir), "{} is not installed", dir.display());
    let script = std::fs::read(fixture.join("op.mjs")).unwrap();
    let entry = dir.join("op.mjs");
    if std::fs::read(&entry).ok().as_ref() != Some(&script) {
        // Written aside and renamed: parallel test processes never see half a file.
        let staging = dir.join(format!("op.{}.mjs", std::process::id()));
        std::fs::write(&staging, &script).unwrap();
        std::fs::rename(&staging, &entry).unwrap();
    }
    entry
}

/// The OpenID Provider in development mode on a free loopback port, with a public client.
pub struct AuthServer {
    child: std::process::Child,
    pub issuer: String,
    pub port: u16,
    /// Where the provider sends the browser back; `sign_in` stops there.
    redirect_uri: String,
}

/// A failed assertion must not leave Node running beside the suite.
impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AuthServer {
    /// Starts op.mjs with a public client `public_client` (refresh tokens, PKCE, no secret) that
    /// may redirect to `redirect_uri`, issuing access tokens valid for `access_ttl_secs`.
    /// Ready once it prints its issuer (it does when it listens).
    pub async fn start(redirect_uri: &str, public_client: &str, access_ttl_secs: u64) -> Self {
        Self::start_with(redirect_uri, public_client, access_ttl_secs, &[]).await
    }

    /// As [`Self::start`], with more of op.mjs's options (`--exchange-trust`, ...).
    pub async fn start_with(
        redirect_uri: &str,
        public_client: &str,
        access_ttl_secs: u64,
        extra: &[&str],
    ) -> Self {
        let entry = op_entry();
        let mut said = Vec::new();
        // A port found free can be taken before Node binds it: then op.mjs exits, and it is
        // tried again on another.
        for _ in 0..5 {
            let port = free_port();
            let stderr = tempfile::NamedTempFile::new().unwrap();
            let mut child = std::process::Command::new("node")
                .arg(&entry)
                .args(["--port", &port.to_string()])
                .args(["--redirect-uri", redirect_uri])
                .args(["--public-client", public_client])
                .args(["--access-ttl", &access_ttl_secs.to_string()])
                .args(extra)
                .stdout(std::process::Stdio::piped())
                .stderr(stderr.reopen().unwrap())
                .spawn()
                .unwrap();
            let issuer = issuer_line(child.stdout.take().unwrap());
            // Up to 60 s: Node starts slowly on a loaded machine.
            match tokio::time::timeout(Duration::from_secs(60), issuer).await {
                Ok(Ok(issuer)) => {
                    assert_eq!(issuer, format!("http://127.0.0.1:{port}"));
                    return Self {
                        child,
                        issuer,
                        port,
                        redirect_uri: redirect_uri.to_owned(),
                    };
                }
                Ok(Err(_)) => {
                    let status = child.wait().unwrap();
                    let stderr = std::fs::read_to_string(stderr.path()).unwrap_or_default();
                    said.push(format!("exited ({status}) on port {port}: {stderr}"));
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let stderr = std::fs::read_to_string(stderr.path()).unwrap_or_default();
                    panic!("op.mjs said nothing within 60 s on port {port}: {stderr}");
                }
            }
        }
        panic!("the authorization server did not start: {said:#?}");
    }

    /// Signs `login` in at the provider from `authorize_url`, as a browser would: through its
    /// login page (any password is right for a known account) and its consent page. Returns
    /// the redirect back to the redirect URI, with its `code` and `state`, without following it.
    pub async fn sign_in(&self, authorize_url: &str, login: &str) -> String {
        // Each hop is looked at: the provider's redirects are followed here, and the last one,
        // to the redirect URI, is not.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let provider =
            |url: &Url| url.host_str() == Some("127.0.0.1") && url.port() == Some(self.port);
        let mut jar = CookieJar::default();
        let mut url = Url::parse(authorize_url).unwrap();
        let mut form: Option<Vec<(String, String)>> = None;
        let mut seen = Vec::new();
        for _ in 0..20 {
            let request = match form.take() {
                Some(fields) => http.post(url.clone()).form(&fields),
                None => http.get(url.clone()),
            };
            let r = request.header("cookie", jar.header()).send().await.unwrap();
            jar.take(r.headers());
            let status = r.status();
            if status.is_redirection() {
                let location = r.headers()["location"].to_str().unwrap();
                let next = url.join(location).unwrap();
                if next.as_str().starts_with(&self.redirect_uri) {
                    return next.into();
                }
                assert!(
                    provider(&next),
                    "the provider sent the browser elsewhere: {next}"
                );
                url = next;
                continue;
            }
            let page = r.text().await.unwrap();
            assert_eq!(
                status, 200,
                "the provider answered {status} at {url}: {page}"
            );
            let (action, mut fields) =
                parse_form(&page).unwrap_or_else(|| panic!("no form at {url}: {page}"));
            // The dev pages say which step they are in their hidden `prompt`. The same step
            // twice means the provider refused what was sent (e.g. an unknown login).
            let prompt = fields
                .iter()
                .find(|(name, _)| name == "prompt")
                .map(|(_, value)| value.clone())
                .unwrap_or_default();
            assert!(!seen.contains(&prompt), "the {prompt:?} page again: {page}");
            seen.push(prompt);
            for (name, value) in &mut fields {
                match name.as_str() {
                    "login" => *value = login.to_owned(),
                    "password" => *value = "any password works here".to_owned(),
                    _ => {}
                }
            }
            url = url.join(&action).unwrap();
            form = Some(fields);
        }
        panic!(
            "the provider never sent the browser back to {}",
            self.redirect_uri
        );
    }

    /// Revokes `token` (an access or refresh token) at the revocation endpoint, as the public
    /// client `client_id`. Revoking a refresh token also ends its grant's access tokens.
    pub async fn revoke(&self, token: &str, client_id: &str) {
        // op.mjs keeps oidc-provider's default route.
        let r = reqwest::Client::new()
            .post(format!("{}/token/revocation", self.issuer))
            .form(&[("token", token), ("client_id", client_id)])
            .send()
            .await
            .unwrap();
        let status = r.status();
        assert_eq!(status, 200, "revocation: {}", r.text().await.unwrap());
    }
}

/// Resolves with the issuer op.mjs prints once it listens, or fails if it exits first. The
/// rest of its stdout is drained, as it prints notices there as it serves.
fn issuer_line(stdout: std::process::ChildStdout) -> tokio::sync::oneshot::Receiver<String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let issuer = serde_json::from_str::<Value>(&line)
                .ok()
                .and_then(|v| v["issuer"].as_str().map(str::to_owned));
            if let (Some(issuer), Some(tx)) = (issuer, tx.take()) {
                let _ = tx.send(issuer);
            }
        }
    });
    rx
}

/// A browser's cookies for the provider (one site). reqwest here has no cookie store, and the
/// provider's are few and short-lived: name -> value, sent on every request, whatever their
/// path (the interaction cookies are scoped to /interaction/<uid> and /auth/<uid>, and a newer
/// one of the same name replaces the older).
#[derive(Default)]
struct CookieJar(BTreeMap<String, String>);

impl CookieJar {
    fn take(&mut self, headers: &HeaderMap) {
        for cookie in headers.get_all("set-cookie") {
            let cookie = cookie.to_str().unwrap();
            let (pair, attributes) = cookie.split_once(';').unwrap_or((cookie, ""));
            let Some((name, value)) = pair.split_once('=') else {
                continue;
            };
            // The provider clears a cookie with an empty value or an expiry in 1970.
            let cleared = value.trim().is_empty() || attributes.contains("1970");
            if cleared {
                self.0.remove(name.trim());
            } else {
                self.0
                    .insert(name.trim().to_owned(), value.trim().to_owned());
            }
        }
    }

    fn header(&self) -> String {
        self.0
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The first form on a page: its action and its inputs' names and values, in order. The dev
/// pages are simple, generated HTML: double-quoted attributes, one form per page.
fn parse_form(page: &str) -> Option<(String, Vec<(String, String)>)> {
    let start = page.find("<form")?;
    let form = &page[start..start + page[start..].find("</form>")?];
    let action = attribute(&form[..form.find('>')?], "action")?;
    let fields = form
        .split("<input")
        .skip(1)
        .filter_map(|rest| {
            let tag = &rest[..rest.find('>')?];
            Some((
                attribute(tag, "name")?,
                attribute(tag, "value").unwrap_or_default(),
            ))
        })
        .collect();
    Some((action, fields))
}

/// The value of attribute `name` in the text of one tag, unescaped.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let pattern = format!(" {name}=\"");
    let start = tag.find(&pattern)? + pattern.len();
    let value = &tag[start..start + tag[start..].find('"')?];
    Some(
        value
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

const CLIENT: &str = "toolgate-upstream";
const REDIRECT: &str = "http://127.0.0.1:9/upstream-oauth/callback";
/// Access token lifetime: short enough to watch one expire, long enough that a loaded machine
/// uses each before it does.
const TTL: u64 = 10;

/// A form POST to the token endpoint: its status and JSON body.
async fn token_request(auth: &AuthServer, form: &[(&str, &str)]) -> (StatusCode, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/token", auth.issuer))
        .form(form)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

/// An MCP request to the echo upstream with `token`: the status, headers and body (a JSON-RPC
/// response as a server-sent event, or the refusal).
async fn mcp(echo: &Echo, token: &str, body: &Value) -> (StatusCode, HeaderMap, String) {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/mcp", echo.port))
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .json(body)
        .send()
        .await
        .unwrap();
    let (status, headers) = (r.status(), r.headers().clone());
    (status, headers, r.text().await.unwrap())
}

#[tokio::test]
async fn the_test_authorization_server_issues_refreshes_and_revokes() {
    let auth = AuthServer::start(REDIRECT, CLIENT, TTL).await;
    let userinfo = format!("{}/me", auth.issuer);
    let echo = Echo::start_with(&[("USERINFO_URL", &userinfo), ("AS_ISSUER", &auth.issuer)]).await;
    let resource = format!("http://127.0.0.1:{}/mcp", echo.port);

    // The resource server names its authorization server (RFC 9728).
    let metadata: Value = reqwest::get(format!(
        "http://127.0.0.1:{}/.well-known/oauth-protected-resource/mcp",
        echo.port
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(metadata["resource"], resource.as_str());
    assert_eq!(metadata["authorization_servers"][0], auth.issuer.as_str());

    // Authorization code with PKCE (S256) and an RFC 8707 resource, as toolgate will ask.
    let verifier = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let authorize = Url::parse_with_params(
        &format!("{}/auth", auth.issuer),
        [
            ("response_type", "code"),
            ("client_id", CLIENT),
            ("redirect_uri", REDIRECT),
            ("scope", "openid"),
            ("state", "state-1"),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("resource", &resource),
        ],
    )
    .unwrap();
    let back = Url::parse(&auth.sign_in(authorize.as_str(), "alice").await).unwrap();
    let query: BTreeMap<_, _> = back.query_pairs().into_owned().collect();
    assert_eq!(
        query.get("state").map(String::as_str),
        Some("state-1"),
        "{back}"
    );
    let code = query
        .get("code")
        .unwrap_or_else(|| panic!("no code: {back}"));

    let (status, tokens) = token_request(
        &auth,
        &[
            ("grant_type", "authorization_code"),
            ("client_id", CLIENT),
            ("code", code),
            ("code_verifier", &verifier),
            ("redirect_uri", REDIRECT),
            ("resource", &resource),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let first = tokens["access_token"].as_str().unwrap().to_owned();
    let refresh = tokens["refresh_token"].as_str().unwrap().to_owned();
    assert!(tokens["expires_in"].as_u64().unwrap() <= TTL, "{tokens}");

    // The upstream takes the access token as alice's, and refuses a made-up one, pointing
    // at its metadata.
    let whoami = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "whoami", "arguments": {}}});
    let (status, _, text) = mcp(&echo, &first, &whoami).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains(r#""text":"person:alice""#), "{text}");
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "self-test", "version": "1"}}});
    let (status, headers, text) = mcp(&echo, "not-a-token", &initialize).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    let challenge = headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains(&format!(
            r#"resource_metadata="http://127.0.0.1:{}/.well-known/oauth-protected-resource/mcp""#,
            echo.port
        )),
        "{challenge}"
    );

    // A refresh gives a new access token, and (a public client's) a new refresh token.
    let (status, refreshed) = token_request(
        &auth,
        &[
            ("grant_type", "refresh_token"),
            ("client_id", CLIENT),
            ("refresh_token", &refresh),
            ("resource", &resource),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{refreshed}");
    let second = refreshed["access_token"].as_str().unwrap().to_owned();
    let rotated = refreshed["refresh_token"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    let (status, _, text) = mcp(&echo, &second, &whoami).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains(r#""text":"person:alice""#), "{text}");

    // The first access token expires on its own after the short TTL.
    until(
        Duration::from_secs(TTL + 20),
        "the first access token expired",
        || async { mcp(&echo, &first, &whoami).await.0 == StatusCode::UNAUTHORIZED },
    )
    .await;

    // Revoked, the refresh token is refused.
    auth.revoke(&rotated, CLIENT).await;
    let (status, refused) = token_request(
        &auth,
        &[
            ("grant_type", "refresh_token"),
            ("client_id", CLIENT),
            ("refresh_token", &rotated),
            ("resource", &resource),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["error"], "invalid_grant");
}
