//! Sign-in and sign-out.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::WebState;
use super::error::WebError;
use super::session::{
    self, Admin, LOGIN_COOKIE, SESSION_COOKIE, client_ip, random_token, same_token, set_cookie,
    sha256_hex,
};
use super::view::render_status;
use crate::audit::{AuditEvent, EventKind, Outcome, RequestOrigin};
use crate::auth::secrets;
use crate::db;

#[derive(Template)]
#[template(path = "admin/login.html")]
struct LoginPage {
    csrf: String,
    username: String,
    next: String,
    error: Option<String>,
    notice: Option<String>,
    /// "Sign in with <provider>", when SSO is configured.
    provider: Option<String>,
    /// Whether the password form is shown (`--password-sign-in on`).
    password: bool,
}

#[derive(Deserialize, Default)]
pub struct LoginQuery {
    next: Option<String>,
    signed_out: Option<String>,
    password_set: Option<String>,
}

/// Only our own admin pages are valid targets after sign-in (no open redirect).
pub(super) fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if (n == "/admin" || n.starts_with("/admin/") || n.starts_with("/admin?"))
                && !n.contains('\\')
                && !n.starts_with("/admin/login") =>
        {
            n.to_owned()
        }
        _ => "/admin".to_owned(),
    }
}

fn login_page(
    state: &WebState,
    status: StatusCode,
    csrf: String,
    page: LoginPage,
) -> Result<Response, WebError> {
    let mut r = render_status(status, &page)?;
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(state, LOGIN_COOKIE, &csrf, "/admin/login", 3600),
    );
    Ok(r)
}

pub async fn login_form(
    State(state): State<WebState>,
    headers: HeaderMap,
    Query(q): Query<LoginQuery>,
) -> Result<Response, WebError> {
    if let Some(token) = session::cookie(&headers, SESSION_COOKIE)
        && db::sessions::session(&state.db, &sha256_hex(token), state.accounts.session_idle)
            .await?
            .is_some()
    {
        return Ok(Redirect::to(&safe_next(q.next.as_deref())).into_response());
    }
    // Reuse the token of an open sign-in form, so that two tabs do not invalidate each other.
    let csrf = session::cookie(&headers, LOGIN_COOKIE)
        .filter(|c| c.len() == 43)
        .map(str::to_owned)
        .unwrap_or_else(random_token);
    let page = LoginPage {
        csrf: csrf.clone(),
        username: String::new(),
        next: safe_next(q.next.as_deref()),
        error: None,
        notice: match (&q.signed_out, &q.password_set) {
            (_, Some(_)) => Some("Your password is set. Sign in with it.".to_owned()),
            (Some(_), None) => Some("You have signed out.".to_owned()),
            (None, None) => None,
        },
        provider: super::sso::login_options(&state).provider,
        password: state.accounts.password_sign_in,
    };
    login_page(&state, StatusCode::OK, csrf, page)
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf: String,
    next: Option<String>,
}

fn login_event(outcome: Outcome, username: &str, origin: Option<&RequestOrigin>) -> AuditEvent {
    let mut e = AuditEvent::new(EventKind::AdminLogin, outcome).from_origin(origin);
    e.admin_user = Some(format!(
        "admin:{}",
        username.chars().take(64).collect::<String>()
    ));
    e.resource = Some("admin-ui".into());
    e
}

pub async fn login_submit(
    State(state): State<WebState>,
    headers: HeaderMap,
    origin: Option<Extension<RequestOrigin>>,
    Form(form): Form<LoginForm>,
) -> Result<Response, WebError> {
    let origin = origin.map(|Extension(o)| o);
    let next = safe_next(form.next.as_deref());
    let cookie_token = session::cookie(&headers, LOGIN_COOKIE).unwrap_or("");
    let retry = |error: &str, status: StatusCode| {
        let csrf = random_token();
        login_page(
            &state,
            status,
            csrf.clone(),
            LoginPage {
                csrf,
                username: form.username.chars().take(64).collect(),
                next: next.clone(),
                error: Some(error.to_owned()),
                notice: None,
                provider: super::sso::login_options(&state).provider,
                password: state.accounts.password_sign_in,
            },
        )
    };
    if !same_token(&form.csrf, cookie_token) {
        return retry(
            "The sign-in form had expired. Please try again.",
            StatusCode::FORBIDDEN,
        );
    }
    if !state.accounts.password_sign_in {
        state.audit.record_detached(login_event(
            Outcome::Denied,
            &form.username,
            origin.as_ref(),
        ));
        return retry(
            "Password sign-in is turned off here. Use the sign-in button of your provider.",
            StatusCode::FORBIDDEN,
        );
    }
    let ip = client_ip(origin.as_ref());
    if let Err(wait) = session::throttle_sign_in(&state.db, ip, &form.username).await? {
        let secs = wait.as_secs().max(1);
        let mut r = retry(
            &format!("Too many sign-in attempts. Wait {secs} seconds and try again."),
            StatusCode::TOO_MANY_REQUESTS,
        )?;
        r.headers_mut()
            .insert(header::RETRY_AFTER, axum::http::HeaderValue::from(secs));
        return Ok(r);
    }
    let user = match crate::names::Username::parse(&form.username) {
        Ok(username) => db::accounts::find_user(&state.db, &username).await?,
        Err(_) => None,
    };
    let stored = user.as_ref().and_then(|u| u.password_hash.clone());
    let password = form.password.clone();
    // argon2 is deliberately slow: keep it off the async workers. An unknown user is checked
    // against a dummy hash, so the timing does not tell which usernames exist.
    let ok = tokio::task::spawn_blocking(move || secrets::verify(&password, stored.as_deref()))
        .await
        .map_err(|e| WebError::Internal(e.into()))?;
    let Some(user) = user.filter(|_| ok) else {
        state.audit.record_detached(login_event(
            Outcome::Denied,
            &form.username,
            origin.as_ref(),
        ));
        return retry("Wrong username or password.", StatusCode::UNAUTHORIZED);
    };
    // Only after the password verified: a disabled account is not an oracle for guessers.
    if user.disabled {
        state.audit.record_detached(login_event(
            Outcome::Denied,
            &user.username,
            origin.as_ref(),
        ));
        return retry(
            "This account is disabled. Ask an administrator.",
            StatusCode::FORBIDDEN,
        );
    }
    let cookie = open_session(&state, user.id, origin.as_ref()).await?;
    let mut conn = state.db.acquire().await?;
    db::accounts::touch_sign_in(&mut conn, user.id).await?;
    state.audit.record_detached(login_event(
        Outcome::Success,
        &user.username,
        origin.as_ref(),
    ));
    let mut r = Redirect::to(&next).into_response();
    r.headers_mut().append(header::SET_COOKIE, cookie);
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&state, LOGIN_COOKIE, "", "/admin/login", 0),
    );
    Ok(r)
}

/// Starts a session for `user_id` (checked and signed in by the caller); the `Set-Cookie`
/// value that hands it to the browser.
pub(super) async fn open_session(
    state: &WebState,
    user_id: uuid::Uuid,
    origin: Option<&RequestOrigin>,
) -> Result<axum::http::HeaderValue, WebError> {
    let token = random_token();
    let lifetime = state.accounts.session_max;
    let expires = chrono::Utc::now()
        + chrono::Duration::from_std(lifetime).unwrap_or(chrono::Duration::hours(12));
    db::sessions::create_session(
        &state.db,
        &sha256_hex(&token),
        user_id,
        &random_token(),
        expires,
        origin.and_then(|o| o.remote_addr.as_deref()),
        origin.and_then(|o| o.user_agent.as_deref()),
    )
    .await?;
    Ok(set_cookie(
        state,
        SESSION_COOKIE,
        &token,
        "/admin",
        i64::try_from(lifetime.as_secs()).unwrap_or(43_200),
    ))
}

pub async fn logout(
    State(state): State<WebState>,
    admin: Admin,
    origin: Option<Extension<RequestOrigin>>,
) -> Result<Response, WebError> {
    db::sessions::delete_session(&state.db, &admin.session_hash).await?;
    let mut e = AuditEvent::new(EventKind::AdminLogout, Outcome::Success)
        .from_origin(origin.as_ref().map(|Extension(o)| o));
    e.admin_user = Some(admin.actor());
    e.resource = Some("admin-ui".into());
    state.audit.record_detached(e);
    let mut r = Redirect::to("/admin/login?signed_out=1").into_response();
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&state, SESSION_COOKIE, "", "/admin", 0),
    );
    Ok(r)
}
