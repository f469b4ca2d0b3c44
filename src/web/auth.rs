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
    self, Admin, LOGIN_COOKIE, SESSION_COOKIE, random_token, same_token, set_cookie,
};
use super::view::render_status;
use crate::audit::RequestOrigin;
use crate::auth::signin::{self, PasswordSignIn, SignInFailed};
use crate::limits::Refusal;

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
        && crate::auth::session::find(&state, token, state.accounts.session_idle)
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

impl From<SignInFailed> for WebError {
    fn from(e: SignInFailed) -> Self {
        match e {
            SignInFailed::Database(e) => WebError::Unavailable(e),
            SignInFailed::Internal(e) => WebError::Internal(e),
        }
    }
}

/// The seconds a sign-in refused by its limits is to wait before it is tried again.
pub(super) fn sign_in_wait(refusal: Refusal) -> Result<u64, WebError> {
    match refusal {
        Refusal::Exhausted(wait) => Ok(wait.as_secs().max(1)),
        // The attempt could not be counted, so it is not let through: as when the database
        // that counts it is down.
        Refusal::StoreUnavailable(_) => Err(WebError::Unavailable(sqlx::Error::Protocol(
            "sign-in attempts could not be counted".into(),
        ))),
    }
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
    let signed_in = signin::with_password(
        &state,
        origin.as_ref(),
        &form.username,
        form.password.clone(),
        state.accounts.password_sign_in,
        state.accounts.session_max,
    )
    .await?;
    let session = match signed_in {
        PasswordSignIn::SignedIn { session } => session,
        PasswordSignIn::TurnedOff => {
            return retry(
                "Password sign-in is turned off here. Use the sign-in button of your provider.",
                StatusCode::FORBIDDEN,
            );
        }
        PasswordSignIn::Limited(refusal) => {
            let secs = sign_in_wait(refusal)?;
            let mut r = retry(
                &format!("Too many sign-in attempts. Wait {secs} seconds and try again."),
                StatusCode::TOO_MANY_REQUESTS,
            )?;
            r.headers_mut()
                .insert(header::RETRY_AFTER, axum::http::HeaderValue::from(secs));
            return Ok(r);
        }
        PasswordSignIn::Wrong => {
            return retry("Wrong username or password.", StatusCode::UNAUTHORIZED);
        }
        PasswordSignIn::Disabled => {
            return retry(
                "This account is disabled. Ask an administrator.",
                StatusCode::FORBIDDEN,
            );
        }
    };
    let cookie = session_cookie(&state, &session);
    let mut r = Redirect::to(&next).into_response();
    r.headers_mut().append(header::SET_COOKIE, cookie);
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&state, LOGIN_COOKIE, "", "/admin/login", 0),
    );
    Ok(r)
}

/// The `Set-Cookie` value that hands the session `token` to the browser.
pub(super) fn session_cookie(state: &WebState, token: &str) -> axum::http::HeaderValue {
    set_cookie(
        state,
        SESSION_COOKIE,
        token,
        "/admin",
        i64::try_from(state.accounts.session_max.as_secs()).unwrap_or(43_200),
    )
}

pub async fn logout(
    State(state): State<WebState>,
    admin: Admin,
    origin: Option<Extension<RequestOrigin>>,
) -> Result<Response, WebError> {
    let origin = origin.map(|Extension(o)| o);
    signin::sign_out(&state, origin.as_ref(), admin.actor(), &admin.session_hash).await?;
    let mut r = Redirect::to("/admin/login?signed_out=1").into_response();
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&state, SESSION_COOKIE, "", "/admin", 0),
    );
    Ok(r)
}
