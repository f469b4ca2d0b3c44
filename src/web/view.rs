//! What every page shares: the page context of the layout, flash messages, rendering and
//! display formatting.

use askama::Template;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{Html, IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::WebError;
use super::session::{Admin, Role};

/// The sections of the navigation bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Dashboard,
    Agents,
    Grants,
    Tools,
    Limits,
    Audit,
    Accounts,
    Hosts,
    Approvals,
}

/// One link of the navigation bar.
pub struct NavLink {
    pub href: &'static str,
    pub label: &'static str,
    pub current: bool,
}

/// A one-time message shown on the page after a redirect.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Flash {
    /// `ok`, `warn` or `error`.
    pub kind: String,
    pub text: String,
}

impl Flash {
    pub fn ok(text: impl Into<String>) -> Self {
        Self {
            kind: "ok".into(),
            text: text.into(),
        }
    }

    pub fn warn(text: impl Into<String>) -> Self {
        Self {
            kind: "warn".into(),
            text: text.into(),
        }
    }

    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    /// The cookie is the user's own and only ever shown as escaped text, so a tampered one can
    /// at worst show its owner a silly message.
    pub fn decode(s: &str) -> Option<Self> {
        let bytes = URL_SAFE_NO_PAD.decode(s).ok()?;
        let mut f: Flash = serde_json::from_slice(&bytes).ok()?;
        if !matches!(f.kind.as_str(), "ok" | "warn" | "error") {
            f.kind = "ok".into();
        }
        f.text = f.text.chars().take(500).collect();
        Some(f)
    }
}

/// The layout's data: who is signed in, the CSRF token for forms, the flash, the request id.
pub struct PageCtx {
    pub title: String,
    pub user: String,
    pub role: Role,
    pub csrf: String,
    pub nav: Vec<NavLink>,
    pub flash: Option<Flash>,
    pub request_id: String,
}

/// Extracts what a page context needs; [`Ctx::page`] makes one per page.
pub struct Ctx {
    pub admin: Admin,
    flash: Option<Flash>,
    request_id: String,
}

impl<S: Send + Sync> FromRequestParts<S> for Ctx {
    type Rejection = WebError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, WebError> {
        let admin = Admin::from_request_parts(parts, state).await?;
        Ok(Self {
            admin,
            flash: parts.extensions.get::<Flash>().cloned(),
            request_id: parts
                .headers
                .get(crate::http::REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned(),
        })
    }
}

impl Ctx {
    pub fn page(&self, nav: Nav, title: impl Into<String>) -> PageCtx {
        let links = [
            (Nav::Dashboard, "/admin", "Dashboard"),
            (Nav::Agents, "/admin/agents", "Agents"),
            (Nav::Grants, "/admin/grants", "Grants"),
            (Nav::Tools, "/admin/tools", "Tool catalog"),
            (Nav::Limits, "/admin/limits", "Rate limits"),
            (Nav::Approvals, "/admin/approvals", "Approvals"),
            (Nav::Audit, "/admin/audit", "Audit log"),
            (Nav::Accounts, "/admin/accounts", "Accounts"),
            (Nav::Hosts, "/admin/hosts", "Host applications"),
        ];
        PageCtx {
            title: title.into(),
            user: self.admin.username.clone(),
            role: self.admin.role,
            csrf: self.admin.csrf.clone(),
            nav: links
                .into_iter()
                .map(|(n, href, label)| NavLink {
                    href,
                    label,
                    current: n == nav,
                })
                .collect(),
            flash: self.flash.clone(),
            request_id: self.request_id.clone(),
        }
    }

    pub fn role(&self) -> Role {
        self.admin.role
    }
}

/// Renders a page with 200.
pub fn render<T: Template>(t: &T) -> Result<Response, WebError> {
    render_status(StatusCode::OK, t)
}

pub fn render_status<T: Template>(status: StatusCode, t: &T) -> Result<Response, WebError> {
    Ok((status, Html(t.render()?)).into_response())
}

/// `2026-11-30 14:05:09 UTC`.
pub fn when(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// Pretty-prints JSON text; other text is returned as it is.
pub fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_owned())
}

/// The first line of a description, shortened for a table cell.
pub fn summary_line(text: Option<&str>) -> String {
    let line = text.unwrap_or("").lines().next().unwrap_or("").trim();
    if line.chars().count() > 140 {
        format!("{}…", line.chars().take(139).collect::<String>())
    } else {
        line.to_owned()
    }
}

/// Thousands separated by a thin space: `12 345`.
pub fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(c);
    }
    out
}

/// "Are you sure?" before a destructive change, as a page of its own (no JavaScript needed).
#[derive(Template)]
#[template(path = "admin/confirm.html")]
pub struct ConfirmPage {
    pub page: PageCtx,
    pub question: String,
    /// What will happen, one line each.
    pub consequences: Vec<String>,
    pub action: String,
    /// Hidden fields of the form, besides the CSRF token.
    pub fields: Vec<(String, String)>,
    pub button: String,
    pub cancel: String,
}

/// A run of text, shown as code when it was between backticks.
pub struct Segment<'a> {
    pub code: bool,
    pub text: &'a str,
}

/// Splits a message on backticks, so that templates can show `names` as code without ever
/// marking the text safe.
pub fn segments(s: &str) -> Vec<Segment<'_>> {
    s.split('`')
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .map(|(i, text)| Segment {
            code: i % 2 == 1,
            text,
        })
        .collect()
}
