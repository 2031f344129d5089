//! Prometheus metrics, served at `/metrics`.
//!
//! One registry per process, passed to whoever records (the store, the HTTP layer); nothing
//! global, so tests can run several servers in one process. The fleet, queue and money gauges
//! are read from the store at each scrape ([`fleet`]).

pub mod fleet;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreOpLabels {
    pub op: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderCallLabels {
    pub cloud: &'static str,
    pub op: &'static str,
    /// `ok`, or the error's kind (`insufficient_capacity`, `throttled`, ...).
    pub outcome: &'static str,
}

fn latency_histogram() -> Histogram {
    // 100 µs to ~13 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// The process's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    pub store_ops: Family<StoreOpLabels, Histogram, fn() -> Histogram>,
    pub http_requests: Family<HttpLabels, Histogram, fn() -> Histogram>,
    pub provider_calls: Family<ProviderCallLabels, Histogram, fn() -> Histogram>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("spotplane");
        let store_ops = Family::<StoreOpLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "store_operation_seconds",
            "Latency of each named store operation, including retries",
            store_ops.clone(),
        );
        let http_requests =
            Family::<HttpLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            );
        registry.register(
            "http_request_seconds",
            "Latency of API requests by route and status",
            http_requests.clone(),
        );
        let provider_calls =
            Family::<ProviderCallLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            );
        registry.register(
            "provider_call_seconds",
            "Latency of cloud provider calls by cloud, operation and outcome (after retries)",
            provider_calls.clone(),
        );
        Metrics {
            registry: Arc::new(Mutex::new(registry)),
            store_ops,
            http_requests,
            provider_calls,
        }
    }

    /// An observer for the providers' metering decorator.
    pub fn provider_observer(&self) -> spotplane_providers::decorators::Observer {
        let calls = self.provider_calls.clone();
        Arc::new(move |cloud, op, error, took| {
            calls
                .get_or_create(&ProviderCallLabels {
                    cloud: cloud.as_str(),
                    op,
                    outcome: error.unwrap_or("ok"),
                })
                .observe(took.as_secs_f64());
        })
    }

    pub fn observe_store(&self, op: &'static str, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        self.store_ops
            .get_or_create(&StoreOpLabels { op, outcome })
            .observe(took.as_secs_f64());
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.render_with(None)
    }

    /// The exposition of the process's metrics followed by `more` (the scrape's fleet gauges).
    pub fn render_with(&self, more: Option<&Registry>) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        let registry = match self.registry.lock() {
            Ok(r) => r,
            Err(poisoned) => poisoned.into_inner(),
        };
        let encoded = encode_registry(&mut out, &registry)
            .and_then(|()| more.map_or(Ok(()), |m| encode_registry(&mut out, m)))
            .and_then(|()| encode_eof(&mut out));
        if encoded.is_err() {
            out.clear();
        }
        out
    }
}
