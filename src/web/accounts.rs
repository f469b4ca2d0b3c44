//! The account pages: list, create, disable, enable, delete, change role, reset a password
//! (one-time link), and see or end an account's sessions. Every change goes through
//! [`crate::service::accounts`], the same functions as `/api/v1/users`.

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::WebState;
use super::error::WebError;
use super::session::{self, random_token, same_token, set_cookie};
use super::view::{ConfirmPage, Ctx, Flash, Nav, PageCtx, render, render_status, when};
use crate::service::accounts as users;

/// Double-submit token of the reset form, which has no session.
const RESET_COOKIE: &str = "toolgate_reset";

pub struct AccountRow {
    pub username: String,
    pub role: &'static str,
    pub disabled: bool,
    pub kind: String,
    pub created: String,
    pub last_sign_in: String,
    pub sessions: i64,
}

fn row(a: &crate::db::accounts::Account) -> AccountRow {
    AccountRow {
        username: a.username.clone(),
        role: session::Role::parse(&a.role).map_or("?", session::Role::as_str),
        disabled: a.disabled,
        kind: match &a.oidc_issuer {
            Some(issuer) => format!("SSO ({issuer})"),
            None => "local".to_owned(),
        },
        created: when(&a.created_at),
        last_sign_in: a.last_sign_in_at.as_ref().map(when).unwrap_or_default(),
        sessions: a.sessions,
    }
}

#[derive(Template)]
#[template(path = "admin/accounts/index.html")]
struct IndexPage {
    page: PageCtx,
    rows: Vec<AccountRow>,
    error: Option<String>,
    new_username: String,
}

pub async fn index(State(state): State<WebState>, ctx: Ctx) -> Result<Response, WebError> {
    let rows = users::list(&state).await?.iter().map(row).collect();
    render(&IndexPage {
        page: ctx.page(Nav::Accounts, "Accounts"),
        rows,
        error: None,
        new_username: String::new(),
    })
}

#[derive(Deserialize)]
pub struct NewAccount {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    role: String,
}

pub async fn create(
    State(state): State<WebState>,
    ctx: Ctx,
    Form(form): Form<NewAccount>,
) -> Result<Response, WebError> {
    match users::create(
        &state.db,
        &ctx.admin.actor(),
        &form.username,
        &form.password,
        &form.role,
    )
    .await
    {
        Ok(()) => Ok(session::redirect_with(
            &state,
            &format!("/admin/accounts/{}", urlencode(&form.username)),
            Flash::ok(format!("Account `{}` created.", form.username)),
        )),
        Err(e) => {
            let e = WebError::from(e);
            let status = e.status();
            if !status.is_client_error() {
                return Err(e);
            }
            let rows = users::list(&state).await?.iter().map(row).collect();
            render_status(
                status,
                &IndexPage {
                    page: ctx.page(Nav::Accounts, "Accounts"),
                    rows,
                    error: Some(e.to_string()),
                    new_username: form.username.chars().take(64).collect(),
                },
            )
        }
    }
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

pub struct SessionRow {
    pub id: String,
    pub created: String,
    pub last_seen: String,
    pub expires: String,
    pub remote_addr: String,
    pub user_agent: String,
    pub current: bool,
}

#[derive(Template)]
#[template(path = "admin/accounts/show.html")]
struct ShowPage {
    page: PageCtx,
    account: AccountRow,
    local: bool,
    sessions: Vec<SessionRow>,
    roles: [&'static str; 4],
}

pub async fn show(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(username): Path<String>,
) -> Result<Response, WebError> {
    let account = users::get(&state, &username).await?;
    let current = crate::db::sessions::session_id(&state.db, &ctx.admin.session_hash).await?;
    let sessions = users::sessions(&state, &username)
        .await?
        .into_iter()
        .map(|s| SessionRow {
            id: s.id.to_string(),
            created: when(&s.created_at),
            last_seen: when(&s.last_seen_at),
            expires: when(&s.expires_at),
            remote_addr: s.remote_addr.unwrap_or_default(),
            user_agent: s.user_agent.unwrap_or_default().chars().take(120).collect(),
            current: Some(s.id) == current,
        })
        .collect();
    render(&ShowPage {
        page: ctx.page(Nav::Accounts, format!("Account {username}")),
        local: account.oidc_issuer.is_none(),
        account: row(&account),
        sessions,
        roles: ["admin", "auditor", "viewer", "member"],
    })
}

/// What each action says before it is done.
fn question(action: &str, username: &str) -> Option<(String, Vec<String>, &'static str)> {
    Some(match action {
        "disable" => (
            format!("Disable account `{username}`?"),
            vec![
                "It cannot sign in, with a password or through the provider.".into(),
                "Its sessions end now.".into(),
            ],
            "Disable account",
        ),
        "delete" => (
            format!("Delete account `{username}`?"),
            vec![
                "Its sessions end now; a federated account is provisioned again at its next sign-in if the provider still maps it to a role.".into(),
                "The audit log keeps its history.".into(),
            ],
            "Delete account",
        ),
        "end-sessions" => (
            format!("End every session of `{username}`?"),
            vec!["Each browser signed in as it must sign in again.".into()],
            "End sessions",
        ),
        _ => return None,
    })
}

pub async fn confirm(
    State(state): State<WebState>,
    ctx: Ctx,
    Path((username, action)): Path<(String, String)>,
) -> Result<Response, WebError> {
    ctx.admin.require_edit()?;
    users::get(&state, &username).await?;
    let (question, consequences, button) =
        question(&action, &username).ok_or(WebError::NotFound)?;
    render(&ConfirmPage {
        page: ctx.page(Nav::Accounts, format!("Account {username}")),
        question,
        consequences,
        action: format!("/admin/accounts/{}/{action}", urlencode(&username)),
        fields: Vec::new(),
        button: button.into(),
        cancel: format!("/admin/accounts/{}", urlencode(&username)),
    })
}

#[derive(Deserialize, Default)]
pub struct ActionForm {
    #[serde(default)]
    role: String,
    #[serde(default)]
    session: String,
}

#[derive(Template)]
#[template(path = "admin/accounts/reset_link.html")]
struct ResetLinkPage {
    page: PageCtx,
    username: String,
    link: String,
    expires: String,
}

/// Every change of an account: `disable`, `enable`, `delete`, `role`, `reset`,
/// `end-sessions` (one session with `session=<id>`, else all).
pub async fn act(
    State(state): State<WebState>,
    ctx: Ctx,
    Path((username, action)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Response, WebError> {
    let actor = ctx.admin.actor();
    let back = format!("/admin/accounts/{}", urlencode(&username));
    let flash = match action.as_str() {
        "disable" => {
            users::set_disabled(&state, &actor, &username, true).await?;
            format!("Account `{username}` disabled; its sessions ended.")
        }
        "enable" => {
            users::set_disabled(&state, &actor, &username, false).await?;
            format!("Account `{username}` enabled.")
        }
        "delete" => {
            users::delete(&state, &actor, &username).await?;
            return Ok(session::redirect_with(
                &state,
                "/admin/accounts",
                Flash::ok(format!("Account `{username}` deleted.")),
            ));
        }
        "role" => {
            users::set_role(&state, &actor, &username, &form.role).await?;
            format!("`{username}` now has the role `{}`.", form.role)
        }
        "end-sessions" => {
            let one = if form.session.is_empty() {
                None
            } else {
                Some(
                    form.session
                        .parse::<uuid::Uuid>()
                        .map_err(|_| WebError::BadRequest("Not a session id.".into()))?,
                )
            };
            let n = users::end_sessions(&state, &actor, &username, one).await?;
            format!("{n} session(s) of `{username}` ended.")
        }
        "reset" => {
            let (token, expires) = users::reset_link(&state, &actor, &username).await?;
            // Shown once, on this response only: it is as good as the password.
            return render(&ResetLinkPage {
                page: ctx.page(Nav::Accounts, format!("Account {username}")),
                link: crate::service::accounts::reset_url(&state, &token),
                username,
                expires: when(&expires),
            });
        }
        _ => return Err(WebError::NotFound),
    };
    Ok(session::redirect_with(&state, &back, Flash::ok(flash)))
}

#[derive(Template)]
#[template(path = "admin/accounts/reset.html")]
struct ResetPage {
    token: String,
    username: String,
    csrf: String,
    error: Option<String>,
}

#[derive(Deserialize)]
pub struct ResetQuery {
    #[serde(default)]
    token: String,
}

/// Reset tokens are 43 URL-safe characters; anything else is not looked up.
fn plausible_token(token: &str) -> bool {
    token.len() == 43
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn gone() -> WebError {
    WebError::Forbidden(
        "This reset link has expired or was used already. Ask an administrator for a new one."
            .into(),
    )
}

pub async fn reset_form(
    State(state): State<WebState>,
    axum::extract::Query(ResetQuery { token }): axum::extract::Query<ResetQuery>,
) -> Result<Response, WebError> {
    if !plausible_token(&token) {
        return Err(gone());
    }
    let Some(username) =
        crate::db::password_resets::reset_target(&state.db, &session::sha256_hex(&token)).await?
    else {
        return Err(gone());
    };
    let csrf = random_token();
    let mut r = render(&ResetPage {
        token: token.clone(),
        username,
        csrf: csrf.clone(),
        error: None,
    })?;
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&state, RESET_COOKIE, &csrf, "/admin/reset", 1800),
    );
    Ok(r)
}

#[derive(Deserialize)]
pub struct ResetForm {
    #[serde(default)]
    password: String,
    #[serde(default)]
    confirm: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    token: String,
}

pub async fn reset_submit(
    State(state): State<WebState>,
    headers: HeaderMap,
    Form(form): Form<ResetForm>,
) -> Result<Response, WebError> {
    let token = form.token.clone();
    if !same_token(
        &form.csrf,
        session::cookie(&headers, RESET_COOKIE).unwrap_or(""),
    ) {
        return Err(WebError::Forbidden(
            "This form has expired or did not come from this site. Reload the page and try again."
                .into(),
        ));
    }
    if !plausible_token(&token) {
        return Err(gone());
    }
    let retry = |error: String, username: String| {
        render_status(
            StatusCode::BAD_REQUEST,
            &ResetPage {
                token: token.clone(),
                username,
                csrf: form.csrf.clone(),
                error: Some(error),
            },
        )
    };
    let Some(username) =
        crate::db::password_resets::reset_target(&state.db, &session::sha256_hex(&token)).await?
    else {
        return Err(gone());
    };
    if form.password != form.confirm {
        return retry("The two passwords differ.".into(), username);
    }
    match users::use_reset_link(&state, &token, &form.password).await {
        Ok(_) => {
            let mut r = Redirect::to("/admin/login?password_set=1").into_response();
            r.headers_mut().append(
                header::SET_COOKIE,
                set_cookie(&state, RESET_COOKIE, "", "/admin/reset", 0),
            );
            Ok(r)
        }
        Err(crate::service::ServiceError::Invalid(m)) => retry(m, username),
        Err(crate::service::ServiceError::NotFound(_)) => Err(gone()),
        Err(e) => Err(e.into()),
    }
}
