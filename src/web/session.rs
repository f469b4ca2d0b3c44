//! Sessions as the UI sees them: cookies, roles and CSRF.
//!
//! A session is 256 random bits in an `HttpOnly`, `SameSite=Strict` cookie (`Secure` when the
//! public URL is https); Postgres keeps only its sha256, with the session's CSRF token. Every
//! request to a protected page passes [`require_session`], which also checks the CSRF token of
//! every state-changing request and refuses changes to anyone but an `admin`.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::WebState;
use super::error::WebError;
use super::view::Flash;

pub const SESSION_COOKIE: &str = "toolgate_session";
/// Double-submit token of the sign-in form, which has no session yet.
pub const LOGIN_COOKIE: &str = "toolgate_login";
pub const FLASH_COOKIE: &str = "toolgate_flash";
/// Routes any signed-in user may post to.
const EVERY_ROLE_POSTS: [&str; 7] = [
    "/admin/logout",
    "/admin/consent",
    "/admin/authorizations/{id}/revoke",
    // A person's own credentials (the handlers act on the signed-in person's only).
    "/admin/connections/{group}/{name}",
    "/admin/connections/{group}/{name}/delete",
    "/admin/connections/{group}/{name}/connect",
    // An approver may hold any role: the service checks that they are one of the request's.
    "/admin/approvals/{id}/decide",
];
/// Admin pages a `member` may see: signing out, letting a host act for them (consent), the
/// approvals inbox (an approver may be a member), their own host authorizations, and their
/// own credentials ("My connections").
const MEMBER_PAGES: [&str; 10] = [
    "/admin/logout",
    "/admin/consent",
    "/admin/authorizations",
    "/admin/authorizations/{id}/revoke",
    "/admin/connections",
    "/admin/connections/{group}/{name}",
    "/admin/connections/{group}/{name}/delete",
    "/admin/connections/{group}/{name}/connect",
    "/admin/approvals",
    "/admin/approvals/{id}/decide",
];
/// Largest form body a protected page accepts.
const MAX_FORM_BYTES: usize = 256 * 1024;

/// Session lifetimes and the sign-in methods, from `serve`'s flags.
#[derive(Debug, Clone)]
pub struct AccountSettings {
    /// A session unused this long has ended.
    pub session_idle: Duration,
    /// A session ends this long after sign-in, however active.
    pub session_max: Duration,
    /// Whether local accounts may sign in with their password.
    pub password_sign_in: bool,
}

impl AccountSettings {
    pub fn from_args(args: &crate::config::ServeArgs) -> Self {
        // At least a minute idle and an hour in all, at most a day idle and 30 days in all.
        let session_max = Duration::from_secs(args.session_max_hours.clamp(1, 720) * 3600);
        let session_idle =
            Duration::from_secs(args.session_idle_minutes.clamp(1, 1440) * 60).min(session_max);
        Self {
            session_idle,
            session_max,
            password_sign_in: args.password_sign_in == crate::config::OnOff::On,
        }
    }
}

pub use crate::service::accounts::Role;

/// The signed-in user of a request, put in its extensions by [`require_session`].
#[derive(Debug, Clone)]
pub struct Admin {
    pub username: String,
    pub role: Role,
    pub csrf: String,
    pub session_hash: String,
}

impl Admin {
    /// The actor the audit log records for this user's changes.
    pub fn actor(&self) -> String {
        format!("admin:{}", self.username)
    }

    pub fn require_edit(&self) -> Result<(), WebError> {
        if self.role.can_edit() {
            Ok(())
        } else {
            Err(WebError::Forbidden(format!(
                "The {} role can read but not change anything.",
                self.role.as_str()
            )))
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Admin {
    type Rejection = WebError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, WebError> {
        parts
            .extensions
            .get::<Admin>()
            .cloned()
            .ok_or_else(|| WebError::Forbidden("Sign in first.".into()))
    }
}

pub use crate::auth::secrets::{random_token, same_token, sha256_hex};

/// The value of cookie `name`, if the request carries it.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value; `max_age` 0 deletes the cookie.
pub fn set_cookie(
    state: &WebState,
    name: &str,
    value: &str,
    path: &str,
    max_age: i64,
) -> HeaderValue {
    let secure = if state.settings.issuer.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let v = format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}"
    );
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Signs requests in, checks CSRF on every state change, and keeps non-admins read-only.
pub async fn require_session(State(state): State<WebState>, req: Request, next: Next) -> Response {
    let found = match cookie(req.headers(), SESSION_COOKIE) {
        Some(token) => {
            match crate::auth::session::find(&state, token, state.accounts.session_idle).await {
                Ok(r) => r,
                Err(e) => return WebError::from(e).into_response(),
            }
        }
        None => None,
    };
    let safe = matches!(*req.method(), Method::GET | Method::HEAD);
    let Some((record, hash)) = found else {
        if safe {
            let next_url = req
                .extensions()
                .get::<axum::extract::OriginalUri>()
                .and_then(|u| u.0.path_and_query().map(|p| p.as_str().to_owned()))
                .unwrap_or_else(|| "/admin".to_owned());
            let target = url::form_urlencoded::Serializer::new(String::new())
                .append_pair("next", &next_url)
                .finish();
            return Redirect::to(&format!("/admin/login?{target}")).into_response();
        }
        return WebError::Forbidden("Your session has ended. Sign in again.".into())
            .into_response();
    };
    let Some(role) = Role::parse(&record.role) else {
        return WebError::Forbidden("This account has no valid role.".into()).into_response();
    };
    let admin = Admin {
        username: record.username,
        role,
        csrf: record.csrf_token,
        session_hash: hash,
    };
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    if !role.can_use_admin_pages() && !MEMBER_PAGES.contains(&path.as_str()) {
        return WebError::Forbidden(format!(
            "The {} role may not use the admin pages.",
            role.as_str()
        ))
        .into_response();
    }
    let mut req = req;
    if !safe {
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM_BYTES).await else {
            return WebError::BadRequest("The form is too large.".into()).into_response();
        };
        let presented = parts
            .headers
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| {
                url::form_urlencoded::parse(&bytes)
                    .find(|(k, _)| k == "csrf")
                    .map(|(_, v)| v.into_owned())
            })
            .unwrap_or_default();
        if !same_token(&presented, &admin.csrf) {
            return WebError::Forbidden(
                "This form has expired or did not come from this site. Reload the page and try again."
                    .into(),
            )
            .into_response();
        }
        // Changes every role may make to what is their own: signing out, letting a host act
        // for them, revoking what they let (each handler checks whose it is).
        if !EVERY_ROLE_POSTS.contains(&path.as_str())
            && let Err(e) = admin.require_edit()
        {
            return e.into_response();
        }
        req = Request::from_parts(parts, Body::from(bytes));
    }
    let flash = cookie(req.headers(), FLASH_COOKIE).and_then(Flash::decode);
    let had_flash = flash.is_some();
    req.extensions_mut().insert(admin);
    if let Some(f) = flash {
        req.extensions_mut().insert(f);
    }
    let mut response = next.run(req).await;
    if had_flash && !response.status().is_redirection() {
        response.headers_mut().append(
            header::SET_COOKIE,
            set_cookie(&state, FLASH_COOKIE, "", "/admin", 0),
        );
    }
    response
}

/// A redirect that shows `flash` on the next page (post/redirect/get).
/// A cookie that carries a flow's `state` to an outside server and back: `SameSite=Lax`, as
/// the way back is a cross-site navigation (a `Strict` cookie would not come with it), and
/// sent only to `path` (the callback).
pub fn flow_cookie(
    state: &WebState,
    name: &str,
    path: &str,
    value: &str,
    max_age: i64,
) -> HeaderValue {
    let secure = if state.settings.issuer.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

pub fn redirect_with(state: &WebState, to: &str, flash: Flash) -> Response {
    let mut r = Redirect::to(to).into_response();
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(state, FLASH_COOKIE, &flash.encode(), "/admin", 60),
    );
    r
}
