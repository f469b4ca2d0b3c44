//! The accept loop: what a client may hold before it has proved anything.
//!
//! `axum::serve` gives hyper no timer, so hyper's header read timeout never runs: a client
//! could send a request's headers a byte a minute, or open a connection and send nothing, and
//! keep the socket forever. This loop serves the same router with hyper's HTTP/1 server and a
//! timer, and bounds three things:
//!
//! - the headers of each request must arrive within `--header-read-timeout-secs`, which is also
//!   how long an idle keep-alive connection is kept (hyper starts the timer whenever it waits
//!   for a request's first byte);
//! - a request's body must arrive within `--request-body-timeout-secs` of its headers, or the
//!   request is answered 408 and its connection closed ([`body_deadline`]);
//! - one source (an IPv6 /64 counting as one) holds at most `--max-connections-per-source`
//!   connections; more are closed as they are accepted, so one stranger cannot take every
//!   file descriptor. Trusted proxies are exempt, and their idle connections are kept at least
//!   90 s (nginx keeps idle upstream connections 60 s, and must not find them closed under it).
//!
//! Graceful shutdown works as with `axum::serve`: when `stop` fires, no connection is
//! accepted, idle ones close, and the future ends when the last request has been answered.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// What the loop enforces, from `--header-read-timeout-secs` and its siblings.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// `None`: no limit.
    pub header_read: Option<Duration>,
    pub body: Option<Duration>,
    /// 0: no limit.
    pub per_source: usize,
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

/// The least a trusted proxy's idle connection is kept.
const PROXY_IDLE: Duration = Duration::from_secs(90);

impl Bounds {
    pub fn from_settings(s: &crate::state::Settings) -> Self {
        let secs = |n: u64| (n > 0).then(|| Duration::from_secs(n));
        Self {
            header_read: secs(s.perimeter.header_read_timeout_secs),
            body: secs(s.perimeter.request_body_timeout_secs),
            per_source: s.perimeter.max_connections_per_source,
            trusted_proxies: s.trusted_proxies.clone(),
        }
    }

    fn is_proxy(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted_proxies.iter().any(|n| n.contains(&ip))
    }
}

/// Open connections per source.
#[derive(Default)]
struct Sources(Mutex<HashMap<IpAddr, usize>>);

/// One counted connection; uncounted when dropped.
struct Held {
    sources: Arc<Sources>,
    key: IpAddr,
}

impl Sources {
    fn admit(self: &Arc<Self>, key: IpAddr, cap: usize) -> Option<Held> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(key).or_insert(0);
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(Held {
            sources: self.clone(),
            key,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut map = self.sources.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// Serves `router` on `listener` until `stop` fires and every connection has finished.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let router = match bounds.body {
        Some(limit) => router.layer(axum::middleware::from_fn_with_state(limit, body_deadline)),
        None => router,
    };
    let sources = Arc::new(Sources::default());
    // Every connection task holds a receiver; when all are dropped, every connection is done.
    let (closed_tx, closed_rx) = tokio::sync::watch::channel(());
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
        };
        let proxy = bounds.is_proxy(peer.ip());
        let held = if proxy || bounds.per_source == 0 {
            None
        } else {
            let key = crate::limits::source_key(peer.ip().to_canonical());
            match sources.admit(key, bounds.per_source) {
                Some(h) => Some(h),
                None => {
                    tracing::debug!(peer = %peer, "connection refused: too many open from this source");
                    drop(stream);
                    continue;
                }
            }
        };
        let header_read = match (bounds.header_read, proxy) {
            (Some(d), true) => Some(d.max(PROXY_IDLE)),
            (d, _) => d,
        };
        let service = router
            .clone()
            .map_request(move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req.map(Body::new)
            });
        let stop = stop.clone();
        let closed_rx = closed_rx.clone();
        tokio::spawn(async move {
            let _held = held;
            let _closed_rx = closed_rx;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new());
            builder.header_read_timeout(header_read);
            let conn =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => log_end(peer, r),
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    log_end(peer, conn.await);
                }
            }
        });
    }
    drop(listener);
    drop(closed_rx);
    closed_tx.closed().await;
    Ok(())
}

fn log_end(peer: SocketAddr, r: Result<(), hyper::Error>) {
    if let Err(e) = r {
        if e.is_timeout() {
            tracing::debug!(peer = %peer, "connection closed: the request's headers did not arrive in time");
        } else {
            tracing::trace!(peer = %peer, error = %e, "connection ended with an error");
        }
    }
}

/// An accept that failed: a connection reset before it was accepted is nothing; anything else
/// (out of file descriptors) is logged and waited out, as `axum::serve` does.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// The request body could not be read by its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyTimedOut;

/// A request body that fails once its deadline has passed.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.expired.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Gives a request's body `limit` from now to arrive; a request whose body did not is answered
/// 408 and its connection closed, whatever its handler made of the failed read.
pub async fn body_deadline(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    use http_body::Body as _;
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let expired = Arc::new(AtomicBool::new(false));
    let req = req.map(|inner| {
        Body::new(DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            expired: expired.clone(),
        })
    });
    let response = next.run(req).await;
    if !expired.load(Ordering::Relaxed) {
        return response;
    }
    tracing::debug!("request refused: its body did not arrive in time");
    let mut r = (
        StatusCode::REQUEST_TIMEOUT,
        axum::Json(serde_json::json!({
            "error": "request_timeout",
            "error_description": format!("the request body did not arrive within {} s", limit.as_secs()),
        })),
    )
        .into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}
