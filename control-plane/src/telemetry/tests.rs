//! Unit tests of the span export; the spans themselves are tested in `lab/spans.rs`, on the
//! simulated world.

use super::*;

#[test]
fn the_traces_url_is_the_endpoints_v1_traces() {
    assert_eq!(traces_url("http://otel:4318"), "http://otel:4318/v1/traces");
    assert_eq!(
        traces_url("http://otel:4318/"),
        "http://otel:4318/v1/traces"
    );
    assert_eq!(
        traces_url("https://x.example/v1/traces"),
        "https://x.example/v1/traces"
    );
}

/// Spans reach a collector over OTLP/HTTP: a local one (the request's body is protobuf, in
/// which names and string attributes are plain bytes) receives the span and its job id.
#[cfg(feature = "otlp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_to_an_otlp_collector() {
    use tracing_subscriber::layer::SubscriberExt;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let collector = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/traces"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&collector)
        .await;
    let (layer, provider) =
        otlp_layer::<tracing_subscriber::Registry>(&collector.uri(), "spotplane-test")
            .expect("exporter");
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!(
            "agent_command",
            command = "start",
            job_id = "0192d4e0-0000-7000-8000-00000000abcd",
            attempt = 2
        );
        let _in = span.enter();
    });
    // The batch goes out on the exporter's own thread; flushing waits for it.
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .expect("joined")
        .expect("flushed");
    let got = collector.received_requests().await.expect("recorded");
    let body: Vec<u8> = got.iter().flat_map(|r| r.body.clone()).collect();
    let has = |s: &str| body.windows(s.len()).any(|w| w == s.as_bytes());
    assert!(!got.is_empty(), "the collector was called");
    assert_eq!(
        got[0]
            .headers
            .get("content-type")
            .map(|v| v.to_str().unwrap_or("")),
        Some("application/x-protobuf")
    );
    for s in [
        "agent_command",
        "job_id",
        "0192d4e0-0000-7000-8000-00000000abcd",
        "spotplane-test",
    ] {
        assert!(has(s), "{s} in what the collector received");
    }
}
