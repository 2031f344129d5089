//! Logging and traces.
//!
//! Spans carry the ids an operator searches by: `request` (method, route, and the `job_id`,
//! `node_id` and `attempt` the handler finds), `admit` (the scheduling cycle placing a job:
//! `job_id`, `node_id`), `buy` (capacity buying a node: `node_id`, `job_id`, the offer),
//! `provider_call` (`cloud`, `op`, and the `node_id` of a provision), `agent_command` (a
//! command for a node's agent: `command`, `job_id`, `node_id`, `replica`, `attempt`),
//! `recovery` (a recovery action on a job or node), and `store` (each named store operation,
//! at debug level) under whichever of those asked. With `telemetry.otlp_endpoint` set (and the
//! `otlp` feature built in) they are exported to an OpenTelemetry collector as well.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogConfig, LogFormat, TelemetryConfig};

/// Keeps span export running; flushes what is buffered when dropped (at exit).
#[must_use = "dropping it stops the span export"]
pub struct Guard {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("spotplane: flushing spans to the OTLP collector failed: {e}");
        }
    }
}

/// Installs the global subscriber: logs to stderr at the configured level (`RUST_LOG`, when
/// set, wins), and spans to the OTLP collector `telemetry` names, if any.
pub fn init(cfg: &LogConfig) {
    let _ = init_with(cfg, &TelemetryConfig::default());
}

/// [`init`] with span export as `telemetry` says. An endpoint set in a build without the
/// `otlp` feature is an error, not silence.
pub fn init_with(cfg: &LogConfig, telemetry: &TelemetryConfig) -> anyhow::Result<Guard> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cfg.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match cfg.format {
        LogFormat::Json => fmt.json().boxed(),
        LogFormat::Text => fmt.boxed(),
    };
    #[cfg(feature = "otlp")]
    let (otel, provider) = match &telemetry.otlp_endpoint {
        Some(endpoint) => {
            let (layer, provider) = otlp_layer(endpoint, &telemetry.service_name)?;
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    #[cfg(not(feature = "otlp"))]
    let otel: Option<tracing_subscriber::layer::Identity> = match &telemetry.otlp_endpoint {
        Some(_) => anyhow::bail!(
            "telemetry.otlp_endpoint is set, but this spotplane was built without the `otlp` \
             feature (cargo build --features otlp)"
        ),
        None => None,
    };
    // A second init (tests starting several servers) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    Ok(Guard {
        #[cfg(feature = "otlp")]
        provider,
    })
}

/// The OTLP endpoint's traces URL: `<endpoint>/v1/traces`, unless it already names a path.
pub fn traces_url(endpoint: &str) -> String {
    let e = endpoint.trim_end_matches('/');
    if e.ends_with("/v1/traces") {
        e.to_owned()
    } else {
        format!("{e}/v1/traces")
    }
}

/// A layer sending spans to `endpoint` over OTLP/HTTP (protobuf), batched, and the provider
/// that flushes them.
#[cfg(feature = "otlp")]
pub fn otlp_layer<S>(
    endpoint: &str,
    service_name: &str,
) -> anyhow::Result<(
    Box<dyn Layer<S> + Send + Sync>,
    opentelemetry_sdk::trace::SdkTracerProvider,
)>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    use anyhow::Context;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};

    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(traces_url(endpoint))
        .with_timeout(std::time::Duration::from_secs(10))
        .with_headers(std::collections::HashMap::new())
        .build()
        .with_context(|| format!("setting up OTLP export to {endpoint}"))?;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .build();
    let tracer = provider.tracer("spotplane");
    Ok((
        tracing_opentelemetry::layer().with_tracer(tracer).boxed(),
        provider,
    ))
}

#[cfg(test)]
mod tests;
