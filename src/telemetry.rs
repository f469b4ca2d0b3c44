//! Logging, and traces over OTLP.
//!
//! Logs are human-readable by default, JSON with `--log-format json`. Traces are exported only
//! when an OTLP endpoint is configured through the standard variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; the SDK reads the
//! rest: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_BSP_*`, `OTEL_TRACES_SAMPLER`…). Without them nothing here costs more than logging did.
//!
//! This is the one module that names OpenTelemetry types: the rest of the gateway records on
//! `tracing` spans and passes [`TraceContext`], a pair of strings, to what it calls.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogFormat;

/// Whether spans are exported; read on the request path, so a plain flag.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The exporter, kept to be flushed when the process ends.
#[must_use = "shut telemetry down at exit, or the last spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans still batched and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            EXPORTING.store(false, Ordering::Relaxed);
            if let Err(e) = provider.shutdown() {
                tracing::warn!(error = %e, "flushing traces at exit failed");
            }
        }
    }
}

/// Whether spans are exported (an OTLP endpoint is configured).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

/// Whether the environment asks for traces: an endpoint, and not switched off.
fn wants_traces() -> bool {
    let endpoint =
        env_set("OTEL_EXPORTER_OTLP_ENDPOINT") || env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    endpoint && !disabled
}

pub fn init(format: LogFormat) -> Telemetry {
    let filter = EnvFilter::try_from_env("TOOLGATE_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=error,rmcp=warn"));
    if !wants_traces() {
        logs_only(format, filter);
        return Telemetry { provider: None };
    }
    let provider = match provider() {
        Ok(p) => p,
        Err(e) => {
            logs_only(format, filter);
            tracing::error!(error = %e, "cannot set up the OTLP trace exporter; traces are off");
            return Telemetry { provider: None };
        }
    };
    let fmt = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    // Only the gateway's own spans (one per request) are exported, whatever the log filter
    // says: the SDKs' and drivers' internals would multiply the spans without telling an
    // operator more about a call.
    let own = tracing_subscriber::filter::Targets::new()
        .with_target(env!("CARGO_CRATE_NAME"), tracing::Level::INFO);
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("toolgate"))
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_filter(own);
    if tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .try_init()
        .is_ok()
    {
        EXPORTING.store(true, Ordering::Relaxed);
    }
    warn_unsupported_protocol();
    Telemetry {
        provider: Some(provider),
    }
}

/// Exactly the logging there was before traces: one global filter, no span bookkeeping.
fn logs_only(format: LogFormat, filter: EnvFilter) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

fn provider() -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    use opentelemetry::KeyValue;
    use opentelemetry_sdk::Resource;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    // The SDK's detectors read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; without either,
    // the service is named for what it is rather than `unknown_service`.
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    let mut resource = Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_attribute(KeyValue::new(
            "service.instance.id",
            crate::audit::instance_name(),
        ));
    if !named {
        resource = resource.with_service_name("toolgate");
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// Only OTLP over HTTP/protobuf is built in; the SDK would fall back to it silently.
fn warn_unsupported_protocol() {
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Ok(p) = std::env::var(name)
            && !p.is_empty()
            && !p.eq_ignore_ascii_case("http/protobuf")
        {
            tracing::warn!(
                variable = name,
                value = %p,
                "toolgate exports traces as OTLP over HTTP (http/protobuf) only; point the endpoint at an OTLP/HTTP receiver (usually port 4318)"
            );
        }
    }
}

/// The W3C trace context (`traceparent`, `tracestate`) a call passes on to what it calls:
/// an upstream MCP server as HTTP headers, a script as `TRACEPARENT` and `TRACESTATE`.
/// Empty when traces are off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl Injector for TraceContext {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = Some(value),
            "tracestate" if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Makes `span` continue the caller's trace when the request carries a valid W3C
/// `traceparent` (with its `tracestate`); anything malformed is ignored and a new trace begins.
pub fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    if !EXPORTING.load(Ordering::Relaxed) || !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// The trace context to pass on from `span`.
pub fn context_of(span: &tracing::Span) -> TraceContext {
    let mut carrier = TraceContext::default();
    if EXPORTING.load(Ordering::Relaxed) {
        let cx = span.context();
        if cx.span().span_context().is_valid() {
            TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        }
    }
    carrier
}

/// The trace id of `span` (32 hex digits), to find the trace from an audit row.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    if !EXPORTING.load(Ordering::Relaxed) {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}
