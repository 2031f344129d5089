//! Checkpoints through the clouds' object stores, against their emulators: moto (S3),
//! gcp-storage-emulator (GCS) and Azurite (Azure Blob), as `scripts/test` starts them.
//!
//! Each test needs its emulator's URL in the environment (`SPOTPLANE_TEST_MOTO_URL`,
//! `SPOTPLANE_TEST_GCS_URL`, `SPOTPLANE_TEST_AZURITE_URL`); without it the test says so and
//! passes, unless `SPOTPLANE_TEST_REQUIRE_EMULATORS` is set, when it fails.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use spotplane_agent::checkpoint::{CheckpointMeta, CheckpointStore, UploadConfig};
use spotplane_core::{CheckpointId, JobId};

fn emulator(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v.trim_end_matches('/').to_owned()),
        _ if std::env::var_os("SPOTPLANE_TEST_REQUIRE_EMULATORS").is_some() => {
            panic!(
                "{var} is not set and SPOTPLANE_TEST_REQUIRE_EMULATORS is: start the emulator (scripts/test does)"
            )
        }
        _ => {
            eprintln!("skipped: {var} is not set (scripts/test starts the emulator and sets it)");
            None
        }
    }
}

/// A checkpoint directory: a small file and a 13 MiB one (three 5 MiB parts).
fn checkpoint_dir(root: &Path) -> PathBuf {
    let dir = root.join("ckpt");
    std::fs::create_dir_all(dir.join("model")).expect("mkdir");
    std::fs::write(dir.join("state.json"), br#"{"step": 1234}"#).expect("write");
    let big: Vec<u8> = (0..13usize << 20)
        .map(|i| (i * 7 + i / 4099) as u8)
        .collect();
    std::fs::write(dir.join("model/weights.bin"), big).expect("write");
    dir
}

fn meta() -> CheckpointMeta {
    CheckpointMeta {
        job_id: JobId(uuid::Uuid::now_v7()),
        replica: 0,
        attempt: 1,
        checkpoint_id: CheckpointId(uuid::Uuid::now_v7()),
        created_at: chrono::Utc::now(),
    }
}

fn cfg() -> UploadConfig {
    UploadConfig {
        multipart_threshold: 5 << 20,
        part_size: 5 << 20,
        part_concurrency: 3,
        file_concurrency: 2,
        file_attempts: 3,
        memory_budget: 16 << 20,
    }
}

/// Uploads, lists, restores and compares, through `store`.
async fn round_trip(store: &CheckpointStore, tmp: &Path) {
    let dir = checkpoint_dir(tmp);
    let m = meta();
    let up = store.upload(&dir, m, cfg(), None).await.expect("upload");
    assert_eq!(up.manifest.files.len(), 2);
    assert!(
        store
            .checkpoints(0)
            .await
            .expect("list")
            .contains(&m.checkpoint_id)
    );
    let dest = tmp.join("restored");
    let got = store
        .restore_latest(0, &dest, 2)
        .await
        .expect("restore")
        .expect("found");
    assert_eq!(got.checkpoint_id, m.checkpoint_id);
    for rel in ["state.json", "model/weights.bin"] {
        assert!(
            std::fs::read(dir.join(rel)).expect("a") == std::fs::read(dest.join(rel)).expect("b"),
            "{rel} differs"
        );
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

async fn create_s3_bucket(endpoint: &str, bucket: &str) {
    let s = reqwest::Client::new()
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await
        .expect("moto reachable")
        .status();
    assert!(s.is_success(), "creating bucket {bucket}: {s}");
}

fn s3_options(endpoint: &str) -> Vec<(String, String)> {
    let mut o = vec![
        ("aws_endpoint".to_owned(), endpoint.to_owned()),
        ("aws_allow_http".to_owned(), "true".to_owned()),
        ("aws_region".to_owned(), "us-east-1".to_owned()),
    ];
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        o.push(("aws_access_key_id".into(), "testing".into()));
        o.push(("aws_secret_access_key".into(), "testing".into()));
    }
    o
}

#[tokio::test]
async fn checkpoints_round_trip_through_s3_on_moto() {
    let Some(moto) = emulator("SPOTPLANE_TEST_MOTO_URL") else {
        return;
    };
    let bucket = unique("ckpt");
    create_s3_bucket(&moto, &bucket).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let store =
        CheckpointStore::open(&format!("s3://{bucket}/jobs/j1"), &s3_options(&moto)).expect("open");
    round_trip(&store, tmp.path()).await;
}

/// Forwards to `upstream`, answering every `every`-th request itself with a server error.
#[derive(Clone)]
struct FaultProxy {
    upstream: String,
    /// Every `every`-th request fails (0: none).
    every: usize,
    /// Add the `ETag` and `Last-Modified` headers object_store requires when the upstream
    /// leaves them out (gcp-storage-emulator's XML routes do).
    add_etag: bool,
    seen: Arc<AtomicUsize>,
    injected: Arc<AtomicUsize>,
    http: reqwest::Client,
}

async fn forward(State(p): State<FaultProxy>, req: Request) -> Response {
    let n = p.seen.fetch_add(1, Ordering::SeqCst) + 1;
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, 64 << 20).await {
        Ok(b) => b,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    if p.every > 0 && n % p.every == 0 {
        p.injected.fetch_add(1, Ordering::SeqCst);
        let (status, code) = if n % (2 * p.every) == 0 {
            (StatusCode::SERVICE_UNAVAILABLE, "SlowDown")
        } else {
            (StatusCode::INTERNAL_SERVER_ERROR, "InternalError")
        };
        return (
            status,
            format!("<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>injected</Message></Error>"),
        )
            .into_response();
    }
    let url = format!(
        "{}{}",
        p.upstream,
        parts.uri.path_and_query().map_or("/", |pq| pq.as_str())
    );
    let mut r = p.http.request(parts.method, url).body(body);
    for (k, v) in &parts.headers {
        if k != "host" && k != "content-length" {
            r = r.header(k, v);
        }
    }
    match r.send().await {
        Ok(resp) => {
            let status = resp.status();
            let headers = resp.headers().clone();
            let bytes = resp.bytes().await.unwrap_or_default();
            let etag = format!("\"{}\"", hex::encode(&Sha256::digest(&bytes)[..8]));
            let mut out = Response::new(Body::from(bytes));
            *out.status_mut() = status;
            for (k, v) in &headers {
                if k != "content-length" && k != "transfer-encoding" {
                    out.headers_mut().insert(k, v.clone());
                }
            }
            if p.add_etag && status.is_success() {
                let h = out.headers_mut();
                if !h.contains_key("etag")
                    && let Ok(v) = etag.parse()
                {
                    h.insert("etag", v);
                }
                if !h.contains_key("last-modified")
                    && let Ok(v) = "Mon, 30 Nov 2026 10:00:00 GMT".parse()
                {
                    h.insert("last-modified", v);
                }
            }
            out
        }
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

async fn start_proxy(proxy: FaultProxy) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = Router::new().fallback(forward).with_state(proxy);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn server_errors_in_the_middle_of_an_s3_upload_are_retried_without_damage() {
    let Some(moto) = emulator("SPOTPLANE_TEST_MOTO_URL") else {
        return;
    };
    let bucket = unique("flaky");
    create_s3_bucket(&moto, &bucket).await;
    let proxy = FaultProxy {
        upstream: moto.clone(),
        every: 3,
        add_etag: false,
        seen: Arc::default(),
        injected: Arc::default(),
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client"),
    };
    let addr = start_proxy(proxy.clone()).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let store =
        CheckpointStore::open(&format!("s3://{bucket}/jobs/j2"), &s3_options(&addr)).expect("open");
    round_trip(&store, tmp.path()).await;
    let injected = proxy.injected.load(Ordering::SeqCst);
    assert!(injected >= 2, "faults were injected: {injected}");
    // Straight from moto, without the proxy: whole and verified.
    let direct =
        CheckpointStore::open(&format!("s3://{bucket}/jobs/j2"), &s3_options(&moto)).expect("open");
    round_trip_restore_only(&direct, tmp.path()).await;
}

async fn round_trip_restore_only(store: &CheckpointStore, tmp: &Path) {
    let dest = tmp.join("restored-direct");
    let m = store
        .restore_latest(0, &dest, 2)
        .await
        .expect("restore")
        .expect("found");
    let weights = std::fs::read(dest.join("model/weights.bin")).expect("weights");
    let f = m
        .files
        .iter()
        .find(|f| f.path == "model/weights.bin")
        .expect("listed");
    assert_eq!(hex::encode(Sha256::digest(&weights)), f.sha256);
}

/// gcp-storage-emulator implements GCS's JSON API and, of the XML API that object_store's GCS
/// client speaks, only single-request uploads and downloads — without the `ETag` header
/// object_store requires — and no XML multipart uploads or listing. So against it a checkpoint
/// of small files goes up in single requests and comes back by its manifest URI (no listing),
/// through a proxy that adds the missing headers; multipart and "latest" are covered on S3
/// and Azure.
#[tokio::test]
async fn small_checkpoints_round_trip_through_gcs_on_its_emulator() {
    let Some(gcs) = emulator("SPOTPLANE_TEST_GCS_URL") else {
        return;
    };
    // The emulator's routes take bucket names of [-.\w] unencoded; object_store encodes "-".
    let bucket = format!("ckpt{}", uuid::Uuid::now_v7().simple());
    let s = reqwest::Client::new()
        .post(format!("{gcs}/storage/v1/b?project=spotplane-test"))
        .json(&serde_json::json!({"name": bucket}))
        .send()
        .await
        .expect("emulator reachable")
        .status();
    assert!(s.is_success(), "creating bucket: {s}");
    // object_store's way to an emulator: a service account key without OAuth.
    let proxy = start_proxy(FaultProxy {
        upstream: gcs.clone(),
        every: 0,
        add_etag: true,
        seen: Arc::default(),
        injected: Arc::default(),
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client"),
    })
    .await;
    let key = serde_json::json!({"gcs_base_url": proxy, "disable_oauth": true,
        "client_email": "", "private_key": "", "private_key_id": ""});
    let options = vec![
        ("google_service_account_key".to_owned(), key.to_string()),
        ("allow_http".to_owned(), "true".to_owned()),
    ];
    let store = CheckpointStore::open(&format!("gs://{bucket}/jobs/j3"), &options).expect("open");
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("ckpt");
    std::fs::create_dir_all(dir.join("model")).expect("mkdir");
    std::fs::write(dir.join("state.json"), br#"{"step": 77}"#).expect("write");
    let weights: Vec<u8> = (0..3usize << 20).map(|i| (i * 13) as u8).collect();
    std::fs::write(dir.join("model/weights.bin"), &weights).expect("write");
    let up = store
        .upload(&dir, meta(), UploadConfig::default(), None)
        .await
        .expect("upload");
    assert!(
        up.manifest_uri
            .starts_with(&format!("gs://{bucket}/jobs/j3/replica-0/"))
    );
    let dest = tmp.path().join("restored");
    let m = store
        .restore_uri(&up.manifest_uri, &dest, 2)
        .await
        .expect("restore");
    assert_eq!(m, up.manifest);
    assert!(std::fs::read(dest.join("model/weights.bin")).expect("restored") == weights);
}

/// Azurite's well-known development account.
const AZURITE_ACCOUNT: &str = "devstoreaccount1";
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

fn hmac_sha256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new()
        .chain_update(&ipad)
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(&opad)
        .chain_update(inner)
        .finalize()
        .to_vec()
}

/// Creates a container with a SharedKey-signed request (object_store does not create them).
async fn create_container(blob_url: &str, container: &str) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let date = chrono::Utc::now()
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    let version = "2021-08-06";
    let to_sign = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{container}\nrestype:container"
    );
    let key = b64.decode(AZURITE_KEY).expect("key");
    let sig = b64.encode(hmac_sha256(&key, to_sign.as_bytes()));
    let s = reqwest::Client::new()
        .put(format!("{blob_url}/{container}?restype=container"))
        .header("x-ms-date", date)
        .header("x-ms-version", version)
        .header("content-length", "0")
        .header(
            "authorization",
            format!("SharedKey {AZURITE_ACCOUNT}:{sig}"),
        )
        .send()
        .await
        .expect("azurite reachable");
    let status = s.status();
    assert!(
        status.is_success(),
        "creating container: {status} {}",
        s.text().await.unwrap_or_default()
    );
}

#[tokio::test]
async fn checkpoints_round_trip_through_azure_blob_on_azurite() {
    // The blob endpoint including the account, e.g. http://127.0.0.1:10000/devstoreaccount1.
    let Some(azurite) = emulator("SPOTPLANE_TEST_AZURITE_URL") else {
        return;
    };
    let container = unique("ckpt");
    create_container(&azurite, &container).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let options = vec![
        (
            "azure_storage_account_name".to_owned(),
            AZURITE_ACCOUNT.to_owned(),
        ),
        (
            "azure_storage_account_key".to_owned(),
            AZURITE_KEY.to_owned(),
        ),
        ("azure_storage_endpoint".to_owned(), azurite.clone()),
        ("allow_http".to_owned(), "true".to_owned()),
    ];
    let store =
        CheckpointStore::open(&format!("az://{container}/jobs/j4"), &options).expect("open");
    round_trip(&store, tmp.path()).await;
}
