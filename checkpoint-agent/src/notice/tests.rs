//! Notice timelines on tokio's paused clock, against stub metadata services (axum routers
//! answered in-process), and the real HTTP path against wiremock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use chrono::{DateTime, Utc};
use spotplane_core::agent::NoticeSource as Source;
use tokio::sync::watch as watch_channel;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::aws::AwsImds;
use super::azure::AzureScheduledEvents;
use super::gcp::GcpMetadata;
use super::*;

/// A metadata service answered by a router in this process; `down` makes it unreachable.
#[derive(Clone)]
struct RouterHttp {
    router: Router,
    down: Arc<AtomicBool>,
}

impl RouterHttp {
    fn new(router: Router) -> Self {
        RouterHttp {
            router,
            down: Arc::new(AtomicBool::new(false)),
        }
    }
}

#[async_trait]
impl MetadataHttp for RouterHttp {
    async fn send(&self, _base: &str, req: MetaRequest) -> Result<MetaResponse, TransportError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(TransportError("connection refused".into()));
        }
        let mut b = Request::builder()
            .method(req.method)
            .uri(format!("/{}", req.path));
        for (k, v) in req.headers {
            b = b.header(k, v);
        }
        let request = b
            .body(Body::from(req.body.unwrap_or_default()))
            .map_err(|e| TransportError(e.to_string()))?;
        let resp = self
            .router
            .clone()
            .oneshot(request)
            .await
            .map_err(|e| TransportError(e.to_string()))?;
        let status = resp.status().as_u16();
        let etag = resp
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .map_err(|e| TransportError(e.to_string()))?;
        Ok(MetaResponse {
            status,
            body: body.to_vec(),
            etag,
        })
    }
}

/// What the stub services answer, changed by the tests as (paused) time goes by.
#[derive(Default)]
struct Stub {
    /// The body of the notice path; `None`: nothing pending (404 / FALSE / no events).
    answer: Mutex<Option<String>>,
    rebalance: Mutex<Option<String>>,
    tokens_issued: AtomicUsize,
    reads: AtomicUsize,
    acks: Mutex<Vec<String>>,
}

impl Stub {
    fn set(&self, v: Option<&str>) {
        *self.answer.lock().unwrap_or_else(|p| p.into_inner()) = v.map(str::to_owned);
    }
    fn answer(&self) -> Option<String> {
        self.answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

const IMDS_TOKEN: &str = "AQAEAtoken";

fn aws_router(stub: Arc<Stub>) -> Router {
    async fn token(State(s): State<Arc<Stub>>, h: HeaderMap) -> Response {
        if h.get("x-aws-ec2-metadata-token-ttl-seconds").is_none() {
            return StatusCode::BAD_REQUEST.into_response();
        }
        s.tokens_issued.fetch_add(1, Ordering::SeqCst);
        IMDS_TOKEN.into_response()
    }
    fn authorised(h: &HeaderMap) -> bool {
        h.get("x-aws-ec2-metadata-token")
            .is_some_and(|v| v == IMDS_TOKEN)
    }
    async fn action(State(s): State<Arc<Stub>>, h: HeaderMap) -> Response {
        if !authorised(&h) {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        s.reads.fetch_add(1, Ordering::SeqCst);
        match s.answer() {
            Some(b) => b.into_response(),
            None => (StatusCode::NOT_FOUND, "<html>404 - Not Found</html>").into_response(),
        }
    }
    async fn rebalance(State(s): State<Arc<Stub>>, h: HeaderMap) -> Response {
        if !authorised(&h) {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        match s
            .rebalance
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            Some(b) => b.into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        }
    }
    Router::new()
        .route("/latest/api/token", put(token))
        .route("/latest/meta-data/spot/instance-action", get(action))
        .route(
            "/latest/meta-data/events/recommendations/rebalance",
            get(rebalance),
        )
        .with_state(stub)
}

/// A clock that follows tokio's (paused) clock from a fixed wall time.
fn paused_clock() -> impl Fn() -> DateTime<Utc> + Send + Clone + 'static {
    let start = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap_or_default();
    let t0 = tokio::time::Instant::now();
    move || {
        start
            + chrono::Duration::from_std(t0.elapsed()).unwrap_or_else(|_| chrono::Duration::zero())
    }
}

fn start_watch(
    source: Arc<dyn NoticeSource>,
    interval: Duration,
) -> (watch_channel::Receiver<NoticeView>, CancellationToken) {
    let (tx, rx) = watch_channel::channel(NoticeView::default());
    let cancel = CancellationToken::new();
    tokio::spawn(watch(source, interval, paused_clock(), tx, cancel.clone()));
    (rx, cancel)
}

async fn after(secs: f64) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn aws_timeline_no_notice_then_notice_then_garbage_then_down_then_withdrawn() {
    let stub = Arc::new(Stub::default());
    let http = RouterHttp::new(aws_router(stub.clone()));
    let down = http.down.clone();
    let source: Arc<dyn NoticeSource> = Arc::new(AwsImds::new(Arc::new(http), "http://imds"));
    let (rx, cancel) = start_watch(source, Duration::from_secs(5));

    // t = 0, 5, 10: nothing pending.
    after(12.0).await;
    assert_eq!(rx.borrow().notice, None);
    assert_eq!(rx.borrow().failures, 0);
    assert_eq!(stub.reads.load(Ordering::SeqCst), 3, "polled every 5 s");
    assert_eq!(
        stub.tokens_issued.load(Ordering::SeqCst),
        1,
        "one session token"
    );

    // t = 15: the two-minute warning.
    stub.set(Some(
        r#"{"action": "terminate", "time": "2027-01-15T08:02:15Z"}"#,
    ));
    after(5.0).await;
    let n = rx
        .borrow()
        .notice
        .clone()
        .expect("notice seen at the next poll");
    assert_eq!(n.source, Source::AwsInstanceAction);
    assert_eq!(n.action.as_str(), "terminate");
    assert_eq!(
        n.deadline.map(|d| d.to_rfc3339()),
        Some("2027-01-15T08:02:15+00:00".into())
    );

    // t = 20: a garbled answer does not withdraw the notice.
    stub.set(Some("{\"action\": "));
    after(5.0).await;
    {
        let v = rx.borrow();
        assert_eq!(v.notice.as_ref(), Some(&n));
        assert_eq!(v.failures, 1);
        assert!(
            matches!(v.last_error, Some(NoticeError::Malformed { .. })),
            "{v:?}"
        );
    }

    // t = 25, 30: the service is gone; the notice stays.
    down.store(true, Ordering::SeqCst);
    after(10.0).await;
    {
        let v = rx.borrow();
        assert_eq!(v.notice.as_ref(), Some(&n));
        assert_eq!(v.failures, 3);
        assert!(matches!(v.last_error, Some(NoticeError::Unreachable(_))));
    }

    // t = 35: back, and the cloud withdrew it (a stop that did not happen).
    down.store(false, Ordering::SeqCst);
    stub.set(None);
    after(5.0).await;
    assert_eq!(rx.borrow().notice, None);
    assert_eq!(rx.borrow().failures, 0);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn aws_rebalance_is_a_warning_without_deadline_and_an_action_wins_over_it() {
    let stub = Arc::new(Stub::default());
    *stub.rebalance.lock().unwrap_or_else(|p| p.into_inner()) =
        Some(r#"{"noticeTime": "2027-01-15T08:00:00Z"}"#.into());
    let source = AwsImds::new(Arc::new(RouterHttp::new(aws_router(stub.clone()))), "x");
    let now = paused_clock()();
    let n = source.poll(now).await.expect("poll").expect("rebalance");
    assert_eq!(
        (n.source, n.action.as_str(), n.deadline),
        (Source::AwsRebalance, "rebalance", None)
    );
    stub.set(Some(
        r#"{"action": "stop", "time": "2027-01-15T08:02:00Z"}"#,
    ));
    let n = source.poll(now).await.expect("poll").expect("action");
    assert_eq!(
        (n.source, n.action.as_str()),
        (Source::AwsInstanceAction, "stop")
    );
    stub.set(Some(
        r#"{"action": "explode", "time": "2027-01-15T08:02:00Z"}"#,
    ));
    assert!(matches!(
        source.poll(now).await,
        Err(NoticeError::Malformed { .. })
    ));
}

fn gcp_router(stub: Arc<Stub>) -> Router {
    fn value(s: &Stub) -> &'static str {
        if s.answer().is_some() {
            "TRUE"
        } else {
            "FALSE"
        }
    }
    fn etag(v: &str) -> &'static str {
        if v == "TRUE" { "e1" } else { "e0" }
    }
    async fn preempted(
        State(s): State<Arc<Stub>>,
        h: HeaderMap,
        Query(q): Query<std::collections::HashMap<String, String>>,
    ) -> Response {
        if h.get("metadata-flavor").is_none_or(|v| v != "Google") {
            return (
                StatusCode::FORBIDDEN,
                "Missing Metadata-Flavor:Google header.",
            )
                .into_response();
        }
        s.reads.fetch_add(1, Ordering::SeqCst);
        if let Some(garbage) = s.answer().filter(|a| a != "TRUE") {
            return garbage.into_response();
        }
        let mut v = value(&s);
        if q.get("wait_for_change").is_some_and(|w| w == "true") {
            let last = q.get("last_etag").cloned().unwrap_or_default();
            let limit: u64 = q
                .get("timeout_sec")
                .and_then(|t| t.parse().ok())
                .unwrap_or(60);
            let started = tokio::time::Instant::now();
            while etag(v) == last && started.elapsed() < Duration::from_secs(limit) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                v = value(&s);
            }
        }
        ([("etag", etag(v))], v).into_response()
    }
    Router::new()
        .route("/computeMetadata/v1/instance/preempted", get(preempted))
        .with_state(stub)
}

#[tokio::test(start_paused = true)]
async fn gcp_held_requests_see_a_preemption_at_once_and_the_deadline_is_thirty_seconds_later() {
    let stub = Arc::new(Stub::default());
    let source: Arc<dyn NoticeSource> = Arc::new(
        GcpMetadata::new(Arc::new(RouterHttp::new(gcp_router(stub.clone()))), "x")
            .with_wait(Duration::from_secs(60)),
    );
    let clock = paused_clock();
    let (mut rx, cancel) = start_watch(source, Duration::from_secs(1));
    after(20.0).await;
    assert_eq!(rx.borrow_and_update().notice, None);
    stub.set(Some("TRUE"));
    let flipped = clock();
    rx.changed().await.expect("watcher alive");
    let n = rx.borrow().notice.clone().expect("preempted");
    let seen_after = (n.observed_at - flipped).num_milliseconds();
    assert!(
        (0..=200).contains(&seen_after),
        "a held request answers on the change, not at the next poll: {seen_after} ms"
    );
    assert_eq!(
        n.deadline,
        Some(n.observed_at + chrono::Duration::seconds(30))
    );
    // Later polls keep the first sighting's deadline.
    after(5.0).await;
    assert_eq!(rx.borrow().notice.as_ref(), Some(&n));
    assert!(
        stub.reads.load(Ordering::SeqCst) < 10,
        "held requests, not a busy loop"
    );
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn gcp_plain_polls_and_garbage_and_a_missing_flavour_header_is_an_error() {
    let stub = Arc::new(Stub::default());
    let source = GcpMetadata::new(Arc::new(RouterHttp::new(gcp_router(stub.clone()))), "x");
    let now = paused_clock()();
    assert_eq!(source.poll(now).await, Ok(None));
    stub.set(Some("TRUE"));
    assert!(source.poll(now).await.expect("poll").is_some());
    stub.set(Some("MAYBE"));
    assert!(matches!(
        source.poll(now).await,
        Err(NoticeError::Malformed { .. })
    ));
}

fn azure_router(stub: Arc<Stub>) -> Router {
    async fn events(State(s): State<Arc<Stub>>, h: HeaderMap) -> Response {
        if h.get("metadata").is_none_or(|v| v != "true") {
            return (
                StatusCode::BAD_REQUEST,
                "{\"error\": \"Required metadata header not specified\"}",
            )
                .into_response();
        }
        s.reads.fetch_add(1, Ordering::SeqCst);
        s.answer()
            .unwrap_or_else(|| r#"{"DocumentIncarnation": 0, "Events": []}"#.into())
            .into_response()
    }
    async fn ack(State(s): State<Arc<Stub>>, h: HeaderMap, body: String) -> Response {
        if h.get("metadata").is_none_or(|v| v != "true") {
            return StatusCode::BAD_REQUEST.into_response();
        }
        s.acks.lock().unwrap_or_else(|p| p.into_inner()).push(body);
        StatusCode::OK.into_response()
    }
    Router::new()
        .route("/metadata/scheduledevents", get(events).post(ack))
        .with_state(stub)
}

fn preempt_doc(vm: &str, not_before: &str) -> String {
    serde_json::json!({"DocumentIncarnation": 2, "Events": [
        {"EventId": "A123BC45-1234-5678-AB90-ABCDEF123456", "EventType": "Freeze", "ResourceType": "VirtualMachine",
         "Resources": [vm], "EventStatus": "Scheduled", "NotBefore": not_before, "Description": "",
         "EventSource": "Platform", "DurationInSeconds": 5},
        {"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Preempt", "ResourceType": "VirtualMachine",
         "Resources": [vm], "EventStatus": "Scheduled", "NotBefore": not_before,
         "Description": "The Spot virtual machine is being evicted.", "EventSource": "Platform", "DurationInSeconds": -1}]})
    .to_string()
}

#[tokio::test(start_paused = true)]
async fn azure_preempt_events_for_this_vm_are_notices_and_are_acknowledged_by_event_id() {
    let stub = Arc::new(Stub::default());
    let http = Arc::new(RouterHttp::new(azure_router(stub.clone())));
    let source = AzureScheduledEvents::new(http.clone(), "x", Some("vm-7".into()));
    let now = paused_clock()();
    assert_eq!(source.poll(now).await, Ok(None));

    stub.set(Some(&preempt_doc(
        "vm-other",
        "Mon, 19 Sep 2016 18:29:47 GMT",
    )));
    assert_eq!(source.poll(now).await, Ok(None), "another VM's eviction");

    stub.set(Some(&preempt_doc("vm-7", "Mon, 19 Sep 2016 18:29:47 GMT")));
    let n = source.poll(now).await.expect("poll").expect("preempt");
    assert_eq!(n.source, Source::AzureScheduledEvent);
    assert_eq!(
        n.deadline.map(|d| d.to_rfc3339()),
        Some("2016-09-19T18:29:47+00:00".into())
    );
    assert_eq!(
        n.event_id.as_deref(),
        Some("602d9444-d2cd-49c7-8624-8643e7171297")
    );
    source.acknowledge(&n).await.expect("ack");
    let acks = stub.acks.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let sent: serde_json::Value = serde_json::from_str(&acks[0]).expect("json");
    assert_eq!(
        sent,
        serde_json::json!({"StartRequests": [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297"}]})
    );

    stub.set(Some(&preempt_doc("vm-7", "")));
    let n = source.poll(now).await.expect("poll").expect("started");
    assert_eq!(n.deadline, Some(now), "a started eviction is due now");

    stub.set(Some(&preempt_doc("vm-7", "next tuesday")));
    assert!(matches!(
        source.poll(now).await,
        Err(NoticeError::Malformed { .. })
    ));
    stub.set(Some("<html>"));
    assert!(matches!(
        source.poll(now).await,
        Err(NoticeError::Malformed { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_watcher_stops_when_cancelled() {
    let stub = Arc::new(Stub::default());
    let source: Arc<dyn NoticeSource> = Arc::new(AwsImds::new(
        Arc::new(RouterHttp::new(aws_router(stub.clone()))),
        "x",
    ));
    let (tx, _rx) = watch_channel::channel(NoticeView::default());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(watch(
        source,
        Duration::from_secs(5),
        paused_clock(),
        tx,
        cancel.clone(),
    ));
    after(7.0).await;
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("stopped promptly")
        .expect("no panic");
    let reads = stub.reads.load(Ordering::SeqCst);
    after(60.0).await;
    assert_eq!(stub.reads.load(Ordering::SeqCst), reads);
}

/// The real transport against real HTTP servers (wiremock), on the real clock.
mod over_http {
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use super::*;

    fn http() -> Arc<dyn MetadataHttp> {
        Arc::new(ReqwestMetadata::new(Duration::from_secs(2)).expect("client"))
    }

    #[tokio::test]
    async fn imdsv2_token_then_reads_with_it_and_404_is_nothing_pending() {
        let server = MockServer::start().await;
        Mock::given(method("PUT"))
            .and(path("/latest/api/token"))
            .and(header("x-aws-ec2-metadata-token-ttl-seconds", "21600"))
            .respond_with(ResponseTemplate::new(200).set_body_string("tok-1"))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/latest/meta-data/spot/instance-action"))
            .and(header("x-aws-ec2-metadata-token", "tok-1"))
            .respond_with(ResponseTemplate::new(404))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/latest/meta-data/events/recommendations/rebalance"))
            .and(header("x-aws-ec2-metadata-token", "tok-1"))
            .respond_with(ResponseTemplate::new(404))
            .mount(&server)
            .await;
        let source = AwsImds::new(http(), &server.uri());
        let now = Utc::now();
        assert_eq!(source.poll(now).await, Ok(None));
        assert_eq!(source.poll(now).await, Ok(None));
        server.verify().await;
    }

    #[tokio::test]
    async fn an_instance_action_over_http_is_a_notice() {
        let server = MockServer::start().await;
        Mock::given(method("PUT"))
            .and(path("/latest/api/token"))
            .respond_with(ResponseTemplate::new(200).set_body_string("tok"))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/latest/meta-data/spot/instance-action"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_string(r#"{"action": "terminate", "time": "2026-09-18T08:22:00Z"}"#),
            )
            .mount(&server)
            .await;
        let n = AwsImds::new(http(), &server.uri())
            .poll(Utc::now())
            .await
            .expect("poll")
            .expect("notice");
        assert_eq!(
            n.deadline.map(|d| d.to_rfc3339()),
            Some("2026-09-18T08:22:00+00:00".into())
        );
    }

    #[tokio::test]
    async fn a_server_error_and_a_closed_port_are_errors_not_notices() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(503))
            .mount(&server)
            .await;
        let gcp = GcpMetadata::new(http(), &server.uri());
        assert!(matches!(
            gcp.poll(Utc::now()).await,
            Err(NoticeError::Status { status: 503, .. })
        ));
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let a = l.local_addr().expect("addr");
            drop(l);
            format!("http://{a}")
        };
        let azure = AzureScheduledEvents::new(http(), &closed, None);
        assert!(matches!(
            azure.poll(Utc::now()).await,
            Err(NoticeError::Unreachable(_))
        ));
    }
}
