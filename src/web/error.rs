//! The UI's error type: client errors say what is wrong, server errors are opaque and logged
//! once. Every error becomes a page showing the request id (see `error_pages`).

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use crate::service::ServiceError;

/// Why a page could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("not found")]
    NotFound,
    /// A named thing that does not exist (`agent \`x\``): the name is the caller's own input.
    #[error("{0} not found")]
    Missing(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Conflict(String),
    /// Too many attempts; the handler sets `Retry-After`.
    #[error("{0}")]
    TooMany(String),
    /// A service we depend on (the OpenID Provider) did not answer.
    #[error("{0}")]
    Upstream(String),
    #[error("database unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// The text an error page shows, attached to the bare error response for `error_pages`.
#[derive(Debug, Clone)]
pub struct ErrorMessage(pub String);

impl From<ServiceError> for WebError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::NotFound(what) => WebError::Missing(what),
            ServiceError::Invalid(m) => WebError::BadRequest(m),
            ServiceError::Conflict(m) => WebError::Conflict(m),
            ServiceError::Database(e) => WebError::Unavailable(e),
            ServiceError::Other(e) => WebError::Internal(e),
        }
    }
}

impl From<sqlx::Error> for WebError {
    fn from(e: sqlx::Error) -> Self {
        WebError::Unavailable(e)
    }
}

impl From<askama::Error> for WebError {
    fn from(e: askama::Error) -> Self {
        WebError::Internal(anyhow::Error::new(e))
    }
}

impl WebError {
    pub fn status(&self) -> StatusCode {
        match self {
            WebError::NotFound | WebError::Missing(_) => StatusCode::NOT_FOUND,
            WebError::Forbidden(_) => StatusCode::FORBIDDEN,
            WebError::BadRequest(_) => StatusCode::BAD_REQUEST,
            WebError::Conflict(_) => StatusCode::CONFLICT,
            WebError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            WebError::Upstream(_) => StatusCode::BAD_GATEWAY,
            WebError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            WebError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = match &self {
            WebError::NotFound => default_message(status).to_owned(),
            WebError::Missing(what) => format!("{what} does not exist."),
            WebError::Forbidden(m)
            | WebError::BadRequest(m)
            | WebError::Conflict(m)
            | WebError::TooMany(m)
            | WebError::Upstream(m) => m.clone(),
            WebError::Unavailable(e) => {
                tracing::error!(error = %e, "admin UI: database error");
                default_message(status).to_owned()
            }
            WebError::Internal(e) => {
                tracing::error!(error = ?e, "admin UI: internal error");
                default_message(status).to_owned()
            }
        };
        let mut response = status.into_response();
        response.extensions_mut().insert(ErrorMessage(message));
        response
    }
}

/// What an error page says when nothing more specific may be said.
pub fn default_message(status: StatusCode) -> &'static str {
    match status {
        StatusCode::NOT_FOUND => "There is no such page.",
        StatusCode::FORBIDDEN => "Your role does not allow this.",
        StatusCode::METHOD_NOT_ALLOWED => "This page does not accept that kind of request.",
        StatusCode::TOO_MANY_REQUESTS => "Too many requests; wait a moment and try again.",
        StatusCode::SERVICE_UNAVAILABLE => {
            "The database is unavailable right now; try again shortly."
        }
        s if s.is_client_error() => "The request could not be understood.",
        _ => "Something went wrong on our side. It has been logged.",
    }
}

#[derive(Template)]
#[template(path = "admin/error.html")]
struct ErrorPage<'a> {
    status: u16,
    reason: &'a str,
    message: &'a str,
    request_id: &'a str,
}

/// The error page for `status`.
pub fn render_page(status: StatusCode, message: &str, request_id: &str) -> Response {
    let page = ErrorPage {
        status: status.as_u16(),
        reason: status.canonical_reason().unwrap_or("Error"),
        message,
        request_id,
    };
    let html = page.render().unwrap_or_else(|_| {
        // The template is static; should it ever fail, still say nothing but the id.
        format!(
            "<!doctype html><title>Error</title><p>Error. Request id: {}</p>",
            request_id
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect::<String>()
        )
    });
    (status, Html(html)).into_response()
}
