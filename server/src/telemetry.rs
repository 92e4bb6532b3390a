//! Logs and traces. Logs are human-readable lines or JSON objects, filtered
//! by `SESSIONSTORE_LOG` (or `RUST_LOG`), default `info`. With an OTLP
//! endpoint, the same spans (one `rpc` span per call, with its method and
//! session id) are exported over OTLP/gRPC in batches.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::{LogFormat, TelemetryConfig};

/// Flushes and stops trace export when dropped. Keep it for the life of
/// the process, inside the tokio runtime.
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.traces.take()
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "could not flush the last traces");
        }
    }
}

/// Installs the global subscriber for logs and, when configured, OTLP
/// trace export. Call once, inside the tokio runtime (the OTLP exporter
/// runs on it).
pub fn init(config: &TelemetryConfig) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_env("SESSIONSTORE_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (text, json) = match config.log_format {
        // Colour only for a person at a terminal: redirected logs and
        // `NO_COLOR` get plain text.
        LogFormat::Text => (
            Some(tracing_subscriber::fmt::layer().with_ansi(
                std::io::IsTerminal::is_terminal(&std::io::stdout())
                    && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty()),
            )),
            None,
        ),
        LogFormat::Json => (
            None,
            Some(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false),
            ),
        ),
    };
    let traces = match &config.otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|e| anyhow::anyhow!("cannot export traces to {endpoint}: {e}"))?;
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name("sessionstore")
                .build();
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            )
        }
        None => None,
    };
    let otel = traces.as_ref().map(|provider| {
        tracing_opentelemetry::layer().with_tracer(provider.tracer("sessionstore"))
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(otel)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))?;
    if let Some(endpoint) = &config.otlp_endpoint {
        tracing::info!(%endpoint, "exporting traces over OTLP");
    }
    Ok(Telemetry { traces })
}
