use std::sync::atomic::{AtomicUsize, Ordering};

use futures::stream::BoxStream;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use sha2::{Digest, Sha256};

use super::*;
use crate::workload::MARKER;

/// Writes a checkpoint directory: two small files, one large enough for multipart, and the
/// marker (which must not be uploaded).
fn workload_dir(root: &FsPath, large_mib: usize, seed: u8) -> PathBuf {
    let dir = root.join(format!("ckpt-{seed}"));
    std::fs::create_dir_all(dir.join("model/shards")).expect("mkdir");
    std::fs::write(dir.join("state.json"), format!("{{\"step\": {seed}}}")).expect("write");
    std::fs::write(dir.join("model/config.txt"), b"layers=2\n").expect("write");
    let big: Vec<u8> = (0..large_mib << 20)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    std::fs::write(dir.join("model/shards/weights.bin"), big).expect("write");
    std::fs::write(dir.join(MARKER), b"").expect("marker");
    dir
}

fn meta(replica: u32) -> CheckpointMeta {
    CheckpointMeta {
        job_id: JobId::from_uuid(uuid::Uuid::now_v7()),
        replica,
        attempt: 1,
        checkpoint_id: CheckpointId::from_uuid(uuid::Uuid::now_v7()),
        created_at: Utc::now(),
    }
}

fn small_parts() -> UploadConfig {
    UploadConfig {
        multipart_threshold: 5 << 20,
        part_size: 5 << 20,
        part_concurrency: 3,
        file_concurrency: 2,
        file_attempts: 3,
        memory_budget: 16 << 20,
    }
}

fn same_tree(a: &FsPath, b: &FsPath) {
    for rel in ["state.json", "model/config.txt", "model/shards/weights.bin"] {
        let x = std::fs::read(a.join(rel)).expect("original");
        let y = std::fs::read(b.join(rel)).expect("restored");
        assert!(x == y, "{rel} differs after restore");
    }
    assert!(
        !b.join(MARKER).exists(),
        "the marker is not part of a checkpoint"
    );
}

#[tokio::test]
async fn a_directory_round_trips_through_the_local_store_with_checksums() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = workload_dir(tmp.path(), 17, 1);
    let url = format!("file://{}/bucket/jobs/j1", tmp.path().display());
    let store = CheckpointStore::open(&url, &[]).expect("open");
    let m = meta(0);
    let up = store
        .upload(&dir, m, small_parts(), None)
        .await
        .expect("upload");
    let paths: Vec<&str> = up.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        ["model/config.txt", "model/shards/weights.bin", "state.json"]
    );
    assert_eq!(up.manifest.total_bytes, (17 << 20) + 9 + 11);
    let big = std::fs::read(dir.join("model/shards/weights.bin")).expect("read");
    assert_eq!(
        up.manifest.files[1].sha256,
        hex::encode(Sha256::digest(&big))
    );
    assert_eq!(
        up.manifest_uri,
        format!("{url}/replica-0/{}/manifest.json", m.checkpoint_id)
    );
    assert!(
        tmp.path()
            .join(format!(
                "bucket/jobs/j1/replica-0/{}/manifest.json",
                m.checkpoint_id
            ))
            .exists()
    );
    // Written through temporary names, synced and renamed: none of them is left behind.
    let mut left = vec![tmp.path().join("bucket")];
    while let Some(d) = left.pop() {
        for e in std::fs::read_dir(&d).expect("list") {
            let p = e.expect("entry").path();
            assert!(
                !p.to_string_lossy().contains("spotplane-partial"),
                "{} left in the store",
                p.display()
            );
            if p.is_dir() {
                left.push(p);
            }
        }
    }

    assert_eq!(store.checkpoints(0).await.expect("list"), [m.checkpoint_id]);
    let dest = tmp.path().join("restored");
    let got = store
        .restore_latest(0, &dest, 4)
        .await
        .expect("restore")
        .expect("a checkpoint");
    assert_eq!(got, up.manifest);
    same_tree(&dir, &dest);
    let again = store
        .restore_uri(&up.manifest_uri, &tmp.path().join("by-uri"), 2)
        .await
        .expect("restore by uri");
    assert_eq!(again.checkpoint_id, m.checkpoint_id);
    assert_eq!(store.restore_latest(1, &dest, 4).await.expect("none"), None);
}

#[tokio::test]
async fn a_damaged_checkpoint_fails_verification_and_the_previous_one_is_restored() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store =
        CheckpointStore::with_store(Arc::new(InMemory::new()), Path::from("jobs/j"), "memory://");
    let older = workload_dir(tmp.path(), 6, 1);
    let first = store
        .upload(&older, meta(0), small_parts(), None)
        .await
        .expect("first");
    let newer = workload_dir(tmp.path(), 6, 2);
    let second = store
        .upload(&newer, meta(0), small_parts(), None)
        .await
        .expect("second");
    // Bit rot in the newest checkpoint's weights.
    let loc = Path::from(format!(
        "jobs/j/replica-0/{}/files/model/shards/weights.bin",
        second.manifest.checkpoint_id
    ));
    let mut data = store
        .object_store()
        .get(&loc)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes")
        .to_vec();
    data[12345] ^= 0xff;
    store
        .object_store()
        .put(&loc, PutPayload::from(data))
        .await
        .expect("put");

    let dest = tmp.path().join("restored");
    let err = store
        .restore(&second.manifest, &dest, 2)
        .await
        .expect_err("the damaged one does not verify");
    assert!(
        matches!(err, CheckpointError::Checksum { ref path, .. } if path == "model/shards/weights.bin"),
        "{err}"
    );
    assert!(
        !dest.join("model/shards/weights.bin").exists(),
        "nothing unverified is left in place"
    );
    let got = store
        .restore_latest(0, &dest, 2)
        .await
        .expect("restore")
        .expect("some checkpoint");
    assert_eq!(got.checkpoint_id, first.manifest.checkpoint_id);
    same_tree(&older, &dest);
}

#[tokio::test]
async fn an_upload_that_misses_its_deadline_leaves_no_checkpoint_and_the_previous_stays_latest() {
    let tmp = tempfile::tempdir().expect("tmp");
    let inner = Arc::new(InMemory::new());
    let fast = CheckpointStore::with_store(inner.clone(), Path::from("j"), "memory://");
    let durable = fast
        .upload(
            &workload_dir(tmp.path(), 1, 1),
            meta(0),
            small_parts(),
            None,
        )
        .await
        .expect("durable");
    // The same bucket, now slow: every write takes 300 ms.
    let slow_store = ThrottledStore::new(
        InMemoryShared(inner.clone()),
        ThrottleConfig {
            wait_put_per_call: Duration::from_millis(300),
            ..ThrottleConfig::default()
        },
    );
    let slow = CheckpointStore::with_store(Arc::new(slow_store), Path::from("j"), "memory://");
    let deadline = tokio::time::Instant::now() + Duration::from_millis(400);
    let m = meta(0);
    let err = slow
        .upload(
            &workload_dir(tmp.path(), 1, 2),
            m,
            small_parts(),
            Some(deadline),
        )
        .await
        .expect_err("too slow");
    assert!(
        matches!(err, CheckpointError::Deadline { total, .. } if total > 0),
        "{err}"
    );
    assert_eq!(
        fast.checkpoints(0).await.expect("list"),
        [durable.manifest.checkpoint_id],
        "the late one has no manifest"
    );
}

/// An InMemory shared between stores (ThrottledStore wants to own its inner store).
#[derive(Debug)]
struct InMemoryShared(Arc<InMemory>);

impl std::fmt::Display for InMemoryShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shared({})", self.0)
    }
}

#[async_trait::async_trait]
impl ObjectStore for InMemoryShared {
    async fn put_opts(
        &self,
        l: &Path,
        p: PutPayload,
        o: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.0.put_opts(l, p, o).await
    }
    async fn put_multipart_opts(
        &self,
        l: &Path,
        o: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.0.put_multipart_opts(l, o).await
    }
    async fn get_opts(&self, l: &Path, o: GetOptions) -> object_store::Result<GetResult> {
        self.0.get_opts(l, o).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.0.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.0.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.0.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, f: &Path, t: &Path, o: CopyOptions) -> object_store::Result<()> {
        self.0.copy_opts(f, t, o).await
    }
}

/// What a [`Flaky`] store does to a write.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Fails it, like a network error after the client's own retries gave up.
    Fail,
    /// Never answers it: a future that never completes, like a connection that was accepted
    /// and then went silent.
    Stall,
}

/// A store whose writes go wrong: the first `fail_first` part uploads and puts (counted
/// together) get `fault`; the rest go through. The first `fail_downloads` reads of a
/// checkpoint's files fail.
#[derive(Debug)]
struct Flaky {
    inner: Arc<InMemory>,
    fail_first: usize,
    fault: Fault,
    calls: Arc<AtomicUsize>,
    fail_downloads: usize,
    downloads: Arc<AtomicUsize>,
}

impl Flaky {
    /// The fault for the next write, if it gets one.
    fn next_fault(calls: &AtomicUsize, fail_first: usize, fault: Fault) -> Option<Fault> {
        (calls.fetch_add(1, Ordering::SeqCst) < fail_first).then_some(fault)
    }
}

async fn faulty<T>(fault: Fault) -> object_store::Result<T> {
    match fault {
        Fault::Fail => Err(injected()),
        Fault::Stall => std::future::pending().await,
    }
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("flaky")
    }
}

fn injected() -> object_store::Error {
    object_store::Error::Generic {
        store: "flaky",
        source: "HTTP 500 Internal Server Error (injected)".into(),
    }
}

#[derive(Debug)]
struct FlakyUpload {
    inner: Box<dyn MultipartUpload>,
    fail_first: usize,
    fault: Fault,
    calls: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl MultipartUpload for FlakyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        if let Some(fault) = Flaky::next_fault(&self.calls, self.fail_first, self.fault) {
            return Box::pin(faulty(fault));
        }
        self.inner.put_part(data)
    }
    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.inner.complete().await
    }
    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[async_trait::async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        l: &Path,
        p: PutPayload,
        o: PutOptions,
    ) -> object_store::Result<PutResult> {
        if let Some(fault) = Flaky::next_fault(&self.calls, self.fail_first, self.fault) {
            return faulty(fault).await;
        }
        self.inner.put_opts(l, p, o).await
    }
    async fn put_multipart_opts(
        &self,
        l: &Path,
        o: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Ok(Box::new(FlakyUpload {
            inner: self.inner.put_multipart_opts(l, o).await?,
            fail_first: self.fail_first,
            fault: self.fault,
            calls: self.calls.clone(),
        }))
    }
    async fn get_opts(&self, l: &Path, o: GetOptions) -> object_store::Result<GetResult> {
        if l.as_ref().contains("/files/")
            && self.downloads.fetch_add(1, Ordering::SeqCst) < self.fail_downloads
        {
            return Err(injected());
        }
        self.inner.get_opts(l, o).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, f: &Path, t: &Path, o: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(f, t, o).await
    }
}

#[tokio::test]
async fn failed_writes_are_retried_and_the_checkpoint_is_whole() {
    let tmp = tempfile::tempdir().expect("tmp");
    let calls = Arc::new(AtomicUsize::new(0));
    let store = CheckpointStore::with_store(
        Arc::new(Flaky {
            inner: Arc::new(InMemory::new()),
            fail_first: 2,
            fault: Fault::Fail,
            calls: calls.clone(),
            fail_downloads: 0,
            downloads: Arc::default(),
        }),
        Path::from("j"),
        "memory://",
    );
    let dir = workload_dir(tmp.path(), 11, 3);
    let cfg = UploadConfig {
        file_concurrency: 1,
        ..small_parts()
    };
    let up = store
        .upload(&dir, meta(0), cfg, None)
        .await
        .expect("retried");
    assert!(calls.load(Ordering::SeqCst) > 2);
    let dest = tmp.path().join("restored");
    store
        .restore(&up.manifest, &dest, 2)
        .await
        .expect("verified");
    same_tree(&dir, &dest);

    // Failing more often than the attempts allow fails the checkpoint: no manifest.
    let store = CheckpointStore::with_store(
        Arc::new(Flaky {
            inner: Arc::new(InMemory::new()),
            fail_first: 1000,
            fault: Fault::Fail,
            calls: Arc::new(AtomicUsize::new(0)),
            fail_downloads: 0,
            downloads: Arc::default(),
        }),
        Path::from("j"),
        "memory://",
    );
    assert!(store.upload(&dir, meta(0), cfg, None).await.is_err());
    assert!(store.checkpoints(0).await.expect("list").is_empty());
}

/// A notice window, and the agent's default margin before its end.
const WINDOW: Duration = Duration::from_secs(30);
const MARGIN: Duration = Duration::from_secs(3);

/// A checkpoint store over a [`Flaky`] bucket, and one that reads the same bucket as it is.
fn flaky_store(fail_first: usize, fault: Fault) -> (CheckpointStore, CheckpointStore) {
    let inner = Arc::new(InMemory::new());
    let flaky = Flaky {
        inner: inner.clone(),
        fail_first,
        fault,
        calls: Arc::default(),
        fail_downloads: 0,
        downloads: Arc::default(),
    };
    (
        CheckpointStore::with_store(Arc::new(flaky), Path::from("j"), "memory://"),
        CheckpointStore::with_store(inner, Path::from("j"), "memory://"),
    )
}

/// Uploads `dir` in a window that opens now, with the agent's margin; the outcome and how
/// long it took.
async fn in_window(
    store: &CheckpointStore,
    dir: &FsPath,
    m: CheckpointMeta,
    cfg: UploadConfig,
    window: Duration,
) -> (Result<Uploaded, CheckpointError>, Duration) {
    let opened = tokio::time::Instant::now();
    let up = store
        .upload(dir, m, cfg, Some(opened + window - MARGIN))
        .await;
    (up, opened.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_store_that_never_answers_ends_the_checkpoint_before_the_window_closes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = workload_dir(tmp.path(), 6, 4);
    let (store, bucket) = flaky_store(usize::MAX, Fault::Stall);
    let (up, took) = in_window(&store, &dir, meta(0), small_parts(), WINDOW).await;
    assert!(
        matches!(up, Err(CheckpointError::Deadline { .. })),
        "{up:?}"
    );
    assert!(took < WINDOW, "reported {took:?} into a {WINDOW:?} window");
    assert!(bucket.checkpoints(0).await.expect("list").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_store_that_fails_then_recovers_gives_a_durable_checkpoint_inside_the_window() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = workload_dir(tmp.path(), 6, 5);
    let (store, bucket) = flaky_store(3, Fault::Fail);
    let m = meta(0);
    let (up, took) = in_window(&store, &dir, m, small_parts(), WINDOW).await;
    let up = up.expect("durable after the failures");
    assert!(took < WINDOW, "{took:?}");
    assert_eq!(
        bucket.checkpoints(0).await.expect("list"),
        [m.checkpoint_id]
    );
    let dest = tmp.path().join("restored");
    bucket
        .restore(&up.manifest, &dest, 2)
        .await
        .expect("verified");
    same_tree(&dir, &dest);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_keeps_failing_reports_its_error_before_the_window_closes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = small_dir(tmp.path());
    let (store, bucket) = flaky_store(usize::MAX, Fault::Fail);
    // More attempts than the window holds: the pauses between them (0.4 s, doubling up to
    // 5 s) would run past the deadline, so the file stops being started over before it.
    let cfg = UploadConfig {
        file_attempts: 100,
        ..small_parts()
    };
    let (up, took) = in_window(&store, &dir, meta(0), cfg, WINDOW).await;
    assert!(
        matches!(up, Err(CheckpointError::Store(_))),
        "the store's own error, not a missed deadline: {up:?}"
    );
    assert!(
        took >= Duration::from_secs(20) && took < WINDOW - MARGIN,
        "it kept trying while there was time, and stopped in time: {took:?}"
    );
    assert!(bucket.checkpoints(0).await.expect("list").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_download_that_fails_is_started_over_rather_than_an_older_checkpoint_restored() {
    let tmp = tempfile::tempdir().expect("tmp");
    let inner = Arc::new(InMemory::new());
    let plain = CheckpointStore::with_store(inner.clone(), Path::from("j"), "memory://");
    plain
        .upload(&small_dir(tmp.path()), meta(0), small_parts(), None)
        .await
        .expect("older");
    let newer = workload_dir(tmp.path(), 1, 8);
    let latest = plain
        .upload(&newer, meta(0), small_parts(), None)
        .await
        .expect("newer");
    let flaky = CheckpointStore::with_store(
        Arc::new(Flaky {
            inner,
            fail_first: 0,
            fault: Fault::Fail,
            calls: Arc::default(),
            fail_downloads: 2,
            downloads: Arc::default(),
        }),
        Path::from("j"),
        "memory://",
    );
    let dest = tmp.path().join("restored");
    let got = flaky
        .restore_latest(0, &dest, 1)
        .await
        .expect("restored")
        .expect("a checkpoint");
    assert_eq!(got.checkpoint_id, latest.manifest.checkpoint_id);
    same_tree(&newer, &dest);
}

/// A stand-in for S3 over real HTTP.
struct StubS3 {
    url: String,
    /// PUTs received, answered or not.
    puts: Arc<AtomicUsize>,
    /// The paths of the PUTs answered 200.
    written: Arc<std::sync::Mutex<Vec<String>>>,
}

/// Reads every PUT; the first `first` get `fault` (503 Service Unavailable, or no answer ever),
/// the rest 200 with an ETag.
async fn stub_s3(first: usize, fault: Fault) -> StubS3 {
    let puts = Arc::new(AtomicUsize::new(0));
    let written: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let (seen, done) = (puts.clone(), written.clone());
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (seen, done) = (seen.clone(), done.clone());
        async move {
            use axum::http::{StatusCode, header::ETAG};
            let put = req.method() == axum::http::Method::PUT;
            let path = req.uri().path().to_owned();
            let _ = axum::body::to_bytes(req.into_body(), usize::MAX).await;
            if put && seen.fetch_add(1, Ordering::SeqCst) < first {
                match fault {
                    Fault::Fail => return (StatusCode::SERVICE_UNAVAILABLE, [(ETAG, "\"0\"")]),
                    Fault::Stall => std::future::pending::<()>().await,
                }
            }
            done.lock().unwrap_or_else(|p| p.into_inner()).push(path);
            (StatusCode::OK, [(ETAG, "\"0\"")])
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    StubS3 {
        url: format!("http://{addr}"),
        puts,
        written,
    }
}

fn stub_s3_options(endpoint: &str) -> Vec<(String, String)> {
    [
        ("aws_endpoint", endpoint),
        ("aws_allow_http", "true"),
        ("aws_region", "us-east-1"),
        ("aws_access_key_id", "testing"),
        ("aws_secret_access_key", "testing"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .to_vec()
}

/// Two small files: one put each, no multipart (the stand-in speaks no multipart).
fn small_dir(root: &FsPath) -> PathBuf {
    let dir = root.join("small");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("state.json"), b"{\"step\": 7}").expect("write");
    std::fs::write(dir.join("weights.bin"), vec![7u8; 64 << 10]).expect("write");
    dir
}

// Real time, kept short: the HTTP client's connections and timers cannot run on a paused
// clock (it would jump past the connect timeout while a local connection is being made).
#[tokio::test]
async fn an_http_store_that_accepts_and_never_answers_ends_the_checkpoint_by_its_deadline() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = stub_s3(usize::MAX, Fault::Stall).await;
    let store =
        CheckpointStore::open("s3://bucket/jobs/j", &stub_s3_options(&s3.url)).expect("open");
    let window = MARGIN + Duration::from_secs(2);
    let started = std::time::Instant::now();
    let (up, _) = in_window(
        &store,
        &small_dir(tmp.path()),
        meta(0),
        small_parts(),
        window,
    )
    .await;
    assert!(
        matches!(up, Err(CheckpointError::Deadline { .. })),
        "{up:?}"
    );
    let took = started.elapsed();
    assert!(took < window, "reported {took:?} into a {window:?} window");
    assert!(
        s3.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty(),
        "nothing was written, the manifest least of all"
    );
}

#[tokio::test]
async fn an_http_request_that_stalls_is_given_up_and_retried_inside_the_window() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = stub_s3(1, Fault::Stall).await;
    let mut options = stub_s3_options(&s3.url);
    options.push(("read_timeout".into(), "300ms".into()));
    let store = CheckpointStore::open("s3://bucket/jobs/j", &options).expect("open");
    let window = MARGIN + Duration::from_secs(3);
    let started = std::time::Instant::now();
    let m = meta(0);
    let (up, _) = in_window(&store, &small_dir(tmp.path()), m, small_parts(), window).await;
    let up = up.expect("durable: the stalled put was given up and made again");
    assert!(started.elapsed() < window, "{:?}", started.elapsed());
    assert_eq!(up.manifest.files.len(), 2);
    let written = s3.written.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(
        written.last().map(String::as_str),
        Some(format!("/bucket/jobs/j/replica-0/{}/manifest.json", m.checkpoint_id).as_str()),
        "the manifest last: {written:?}"
    );
}

#[tokio::test]
async fn object_stores_retry_a_failing_request_briefly_and_leave_the_rest_to_the_agent() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("one");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("state.json"), b"{}").expect("write");
    let s3 = stub_s3(usize::MAX, Fault::Fail).await;
    let store =
        CheckpointStore::open("s3://bucket/jobs/j", &stub_s3_options(&s3.url)).expect("open");
    let cfg = UploadConfig {
        file_attempts: 1,
        ..small_parts()
    };
    let started = std::time::Instant::now();
    let up = store.upload(&dir, meta(0), cfg, None).await;
    assert!(matches!(up, Err(CheckpointError::Store(_))), "{up:?}");
    // object_store's default would be 11 requests over up to 3 minutes.
    assert_eq!(
        s3.puts.load(Ordering::SeqCst),
        1 + store_retry().max_retries,
        "the request and its retries"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn manifest_paths_cannot_leave_the_restore_directory() {
    assert!(safe_relative("a/b.bin").is_some());
    for bad in ["", "/etc/passwd", "../x", "a/../../x", "./a"] {
        assert!(safe_relative(bad).is_none(), "{bad}");
    }
}

#[test]
fn unknown_schemes_and_options_are_refused() {
    assert!(matches!(
        CheckpointStore::open("ftp://x/y", &[]),
        Err(CheckpointError::BadUrl { .. })
    ));
    assert!(matches!(
        CheckpointStore::open("s3://bucket/p", &[("aws_no_such_thing".into(), "1".into())]),
        Err(CheckpointError::BadUrl { .. })
    ));
}

/// A store whose part uploads take a while and count how many are in flight at once.
#[derive(Debug)]
struct Slow {
    inner: Arc<InMemory>,
    in_flight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl std::fmt::Display for Slow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("slow")
    }
}

#[derive(Debug)]
struct SlowUpload {
    inner: Box<dyn MultipartUpload>,
    in_flight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl MultipartUpload for SlowUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let put = self.inner.put_part(data);
        let (now, most) = (self.in_flight.clone(), self.most.clone());
        Box::pin(async move {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(30)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            put.await
        })
    }
    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.inner.complete().await
    }
    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[async_trait::async_trait]
impl ObjectStore for Slow {
    async fn put_opts(
        &self,
        l: &Path,
        p: PutPayload,
        o: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(l, p, o).await
    }
    async fn put_multipart_opts(
        &self,
        l: &Path,
        o: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Ok(Box::new(SlowUpload {
            inner: self.inner.put_multipart_opts(l, o).await?,
            in_flight: self.in_flight.clone(),
            most: self.most.clone(),
        }))
    }
    async fn get_opts(&self, l: &Path, o: GetOptions) -> object_store::Result<GetResult> {
        self.inner.get_opts(l, o).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, f: &Path, t: &Path, o: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(f, t, o).await
    }
}

#[tokio::test]
async fn parts_in_flight_over_all_files_stay_within_the_memory_budget() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("many");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for i in 0..4 {
        std::fs::write(dir.join(format!("shard-{i}.bin")), vec![i as u8; 16 << 20]).expect("write");
    }
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let store = CheckpointStore::with_store(
        Arc::new(Slow {
            inner: Arc::new(InMemory::new()),
            in_flight,
            most: most.clone(),
        }),
        Path::from("j"),
        "memory://",
    );
    let cfg = UploadConfig {
        multipart_threshold: 5 << 20,
        part_size: 5 << 20,
        part_concurrency: 4,
        file_concurrency: 4,
        file_attempts: 1,
        memory_budget: 15 << 20,
    };
    let up = store
        .upload(&dir, meta(0), cfg, None)
        .await
        .expect("upload");
    assert_eq!(up.manifest.total_bytes, 64 << 20);
    let most = most.load(Ordering::SeqCst);
    assert!(
        (2..=3).contains(&most),
        "4 files × 4 parts allowed, but 15 MiB of 5 MiB parts: {most} in flight at most"
    );
    let dest = tmp.path().join("back");
    store
        .restore(&up.manifest, &dest, 4)
        .await
        .expect("verified");
}
