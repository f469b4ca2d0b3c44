//! The admin UI: server-rendered askama pages under `/admin`, our own CSS and JS under
//! `/static/`.
//!
//! Pages translate requests into calls of [`crate::service`] (the same functions behind the
//! `/api/v1` JSON API) and render what those return; they decide nothing themselves.
//! Sessions, CSRF and roles are checked once, in [`session::require_session`], for every
//! route behind it.

pub mod accounts;
mod activity;
mod agents;
mod approvals;
mod arguments;
mod audit;
mod auth;
mod authorizations;
mod chart;
mod connections;
mod consent;
mod dashboard;
mod error;
mod grants;
mod hosts;
mod limits;
mod pins;
pub mod session;
pub mod sso;
mod tools;
mod view;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use std::ops::Deref;
use std::sync::Arc;

use crate::config::ServeArgs;
use crate::state::AppState;
pub use error::WebError;
pub use session::Role;

/// Scripts only from our own origin, no inline script or style, no framing, forms only to us.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The admin UI's own settings, resolved from `serve`'s flags and handed in at mount time.
#[derive(Clone)]
pub struct Config {
    /// Session lifetimes and the sign-in methods.
    pub accounts: session::AccountSettings,
    /// Sign-in with an OpenID Provider, when configured.
    pub sso: Option<Arc<sso::Sso>>,
}

impl Config {
    /// `public_base`: the issuer, the base of the SSO redirect URL.
    pub fn from_args(args: &ServeArgs, public_base: &str) -> anyhow::Result<Self> {
        Ok(Self {
            accounts: session::AccountSettings::from_args(args),
            sso: sso::SsoSettings::from_args(&args.oidc, public_base)?
                .map(|s| Arc::new(sso::Sso::new(s))),
        })
    }
}

/// What the UI's handlers read: the live state, and the UI's own settings beside it.
#[derive(Clone)]
pub struct WebState {
    app: AppState,
    pub accounts: session::AccountSettings,
    pub sso: Option<Arc<sso::Sso>>,
}

impl Deref for WebState {
    type Target = AppState;
    fn deref(&self) -> &AppState {
        &self.app
    }
}

/// Changes made from the UI are live: this instance's snapshot follows before the page answers.
impl<'a> From<&'a WebState> for crate::service::Plane<'a> {
    fn from(state: &'a WebState) -> Self {
        crate::service::Plane::Live(&state.app)
    }
}

/// `/admin/...` and `/static/...`.
pub fn router<S>(app: AppState, config: Config) -> Router<S> {
    let state = WebState {
        app,
        accounts: config.accounts,
        sso: config.sso,
    };
    let protected = Router::new()
        .route("/", get(dashboard::show))
        .route("/agents", get(agents::index).post(agents::create))
        .route("/agents/{name}", get(agents::show))
        .route(
            "/agents/{name}/delete",
            get(agents::confirm_delete).post(agents::delete),
        )
        .route(
            "/agents/{name}/clients",
            axum::routing::post(agents::create_client),
        )
        .route(
            "/agents/{name}/limits",
            get(limits::edit).post(limits::save),
        )
        .route(
            "/agents/{name}/arguments",
            get(arguments::edit).post(arguments::submit),
        )
        .route(
            "/agents/{name}/approval",
            axum::routing::post(agents::set_approval),
        )
        .route(
            "/agents/{name}/approval/remove",
            axum::routing::post(agents::remove_approval),
        )
        .route(
            "/clients/{client_id}/revoke",
            get(agents::confirm_revoke_client).post(agents::revoke_client),
        )
        .route("/grants", get(grants::index).post(grants::submit))
        .route("/grants/new", get(grants::new))
        .route("/grants/preview", get(grants::preview_json))
        .route(
            "/grants/remove",
            get(grants::confirm_remove).post(grants::remove),
        )
        .route("/tools", get(tools::index))
        .route("/tools/{name}", get(tools::show))
        .route("/tools/pending", get(pins::index))
        .route("/tools/pending/approve", axum::routing::post(pins::approve))
        .route("/tools/pending/reject", axum::routing::post(pins::reject))
        .route("/approvals", get(approvals::index))
        .route(
            "/approvals/{id}/decide",
            axum::routing::post(approvals::decide),
        )
        .route("/limits", get(limits::index))
        .route("/audit", get(audit::index))
        .route("/audit/export", get(audit::export))
        .route("/audit/{id}", get(audit::show))
        .route("/accounts", get(accounts::index).post(accounts::create))
        .route("/accounts/{username}", get(accounts::show))
        .route(
            "/accounts/{username}/{action}",
            get(accounts::confirm).post(accounts::act),
        )
        .route("/logout", axum::routing::post(auth::logout))
        .route("/consent", get(consent::show).post(consent::submit))
        .route(
            "/agents/{name}/users",
            axum::routing::post(authorizations::add_user),
        )
        .route(
            "/agents/{name}/users/remove",
            axum::routing::post(authorizations::remove_user),
        )
        .route("/hosts", get(hosts::index))
        .route(
            "/hosts/{client_id}/approve",
            axum::routing::post(hosts::approve),
        )
        .route(
            "/hosts/{client_id}/delete",
            axum::routing::post(hosts::delete),
        )
        .route("/authorizations", get(authorizations::index))
        .route("/connections", get(connections::index))
        .route(
            "/connections/{group}/{name}",
            axum::routing::post(connections::set),
        )
        .route(
            "/connections/{group}/{name}/delete",
            axum::routing::post(connections::delete),
        )
        .route(
            "/connections/{group}/{name}/connect",
            axum::routing::post(connections::connect),
        )
        .route(
            "/authorizations/{id}/revoke",
            axum::routing::post(authorizations::revoke),
        )
        .route_layer(from_fn_with_state(state.clone(), session::require_session));
    let admin = Router::new()
        .route("/login", get(auth::login_form).post(auth::login_submit))
        .route("/sso/start", get(sso::start))
        .route("/sso/callback", get(sso::callback))
        // Outside the session: the way back from an authorization server carries no session
        // cookie; the handler checks the flow's own cookie instead.
        .route("/connections/callback", get(connections::callback))
        .route(
            "/reset",
            get(accounts::reset_form).post(accounts::reset_submit),
        )
        .merge(protected)
        .fallback(not_found);
    Router::new()
        .route("/admin/", get(|| async { Redirect::permanent("/admin") }))
        .nest("/admin", admin)
        .route("/static/admin.css", get(stylesheet))
        .route("/static/admin.js", get(script))
        .route("/static/favicon.svg", get(favicon))
        .layer(from_fn_with_state(state.clone(), error_pages))
        .layer(from_fn(security_headers))
        .with_state(state)
}

async fn not_found() -> WebError {
    WebError::NotFound
}

/// Turns every error response of the UI into a page that shows the request id and nothing
/// else about the failure (the details went to the log, once, where the error was made).
async fn error_pages(State(_state): State<WebState>, req: Request, next: Next) -> Response {
    let request_id = req
        .headers()
        .get(crate::http::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let response = next.run(req).await;
    let status = response.status();
    let is_html = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"));
    let message = match response.extensions().get::<error::ErrorMessage>() {
        Some(m) => m.0.clone(),
        // Error responses the router or an extractor made itself (404, 405, a bad form).
        None if (status.is_client_error() || status.is_server_error()) && !is_html => {
            error::default_message(status).to_owned()
        }
        None => return response,
    };
    let mut page = error::render_page(status, &message, &request_id);
    // Keep headers the handler set on purpose (Retry-After on 429).
    if let Some(retry) = response.headers().get(header::RETRY_AFTER) {
        page.headers_mut()
            .insert(header::RETRY_AFTER, retry.clone());
    }
    page
}

/// Headers on every UI response: the CSP, no sniffing, no referrer leaks, no caching of pages
/// that show secrets and audit data.
async fn security_headers(req: Request, next: Next) -> Response {
    let is_static = req.uri().path().starts_with("/static/");
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    // A page that must widen it (the consent form, which redirects to the host) sets its own.
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !is_static && !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

async fn stylesheet() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../../static/admin.css"),
    )
}

async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../../static/admin.js"),
    )
}

async fn favicon() -> Response {
    asset("image/svg+xml", include_str!("../../static/favicon.svg"))
}
