//! Checkpoints in object storage: upload a directory, find the latest, restore it.
//!
//! Layout under a job's checkpoint prefix (`s3://bucket/jobs/<job>`, `gs://…`, `az://…`,
//! `file:///…`):
//!
//! ```text
//! <prefix>/replica-<r>/<checkpoint id>/files/<relative path>   the workload's files
//! <prefix>/replica-<r>/<checkpoint id>/manifest.json           written last
//! ```
//!
//! A checkpoint exists when its manifest does: the manifest is put only after every file is
//! uploaded, so a crash, an error or a deadline in the middle leaves files nobody will read
//! and the previous checkpoint as the latest. Checkpoint ids are UUIDv7, so the latest is the
//! greatest id with a manifest. Each file's SHA-256 is computed while it is read for upload
//! and checked again on restore.
//!
//! A local folder (a disk or a network mount) is made as durable as an object store's
//! acknowledged put (object_store's local store syncs nothing unless asked, and is asked): each
//! file is synced before it is renamed into place, the folders naming the files before the
//! manifest is written, and the manifest (synced, renamed, its folder synced) before the upload
//! returns. A crash of the node at any point leaves the checkpoint whole or absent.
//!
//! Large files go in multipart uploads whose parts are uploaded concurrently; several files go
//! at once.
//!
//! # Retries inside a notice window
//!
//! A checkpoint taken for a notice has 30 to 120 seconds, less the agent's margin, and must end
//! inside them, durable or reported failed. Three bounds, one per level, none unbounded:
//!
//! 1. **A request**: object_store's client retries a failed request (5xx, 429, resets, a
//!    request that made no progress) a few times within seconds ([`store_retry`]), and gives
//!    up on a request that makes no progress for [`READ_TIMEOUT`] ([`store_client`]). Its own
//!    default (10 retries within 3 minutes, 30 s a request) would spend a whole window on one
//!    part.
//! 2. **A file**: a file whose request still failed is started over, up to
//!    [`UploadConfig::file_attempts`] times in all, but no pause before it ends past the
//!    deadline: then the upload fails with the file's error at once.
//! 3. **The checkpoint**: the whole upload, every store call in it, runs under the deadline
//!    (`tokio::time::timeout_at`); when it passes, every request still in flight is dropped
//!    and the upload fails with [`CheckpointError::Deadline`]. The manifest is never written.
//!
//! object_store's settings are fixed when a store is built, and a store serves a job for its
//! whole life (restores, log archives, periodic checkpoints and the one for a notice), so the
//! window is enforced by the deadline around the calls, not by building a store per deadline
//! with its retry time set from what is left: that would need a new HTTP client, with new
//! connections and credentials, at the moment there is least time for them, and still could
//! not stop a request stalled mid-flight.
//!
//! # Where it is
//!
//! - `upload.rs`: a directory up as a checkpoint (small files in one put, large ones
//!   in concurrent parts, a local folder by the kernel's copy), the manifest last;
//! - `restore.rs`: the checkpoints of a replica, their manifests, and a verified
//!   download of the latest whole one (or of one named).
//!
//! This file holds the errors, the upload settings, opening a store from its URL, the layout's
//! paths, and the archive of the replicas' log files.

mod restore;
mod upload;

use std::path::{Component, Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use spotplane_core::agent::CheckpointManifest;
use spotplane_core::{CheckpointId, JobId};
use tokio::io::AsyncWriteExt;
use url::Url;

pub const MANIFEST: &str = "manifest.json";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("the upload could not finish before the deadline ({uploaded} of {total} bytes)")]
    Deadline { uploaded: u64, total: u64 },
    #[error("{path}: checksum mismatch (manifest {expected}, content {actual})")]
    Checksum {
        path: String,
        expected: String,
        actual: String,
    },
    #[error("{path}: size mismatch (manifest {expected}, content {actual})")]
    Size {
        path: String,
        expected: u64,
        actual: u64,
    },
    #[error("manifest {location}: {reason}")]
    Manifest { location: String, reason: String },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let what = what.into();
    move |source| CheckpointError::Io { what, source }
}

/// A blocking task that panicked or was cancelled, as the I/O error of what it was doing.
fn joined(what: &'static str) -> impl Fn(tokio::task::JoinError) -> CheckpointError {
    move |e| CheckpointError::Io {
        what: what.into(),
        source: std::io::Error::other(e),
    }
}

/// How uploads are cut and how many requests run at once.
#[derive(Debug, Clone, Copy)]
pub struct UploadConfig {
    /// Files larger than this go in multipart uploads.
    pub multipart_threshold: u64,
    /// Size of each part (the object stores allow 5 MiB to 5 GiB).
    pub part_size: usize,
    /// Parts of one file in flight at once.
    pub part_concurrency: usize,
    /// Files uploaded at once.
    pub file_concurrency: usize,
    /// Attempts at a file's upload in all, the first included: a file is started over after
    /// its requests' own retries gave up, unless the pause before would end past the deadline.
    pub file_attempts: u32,
    /// Bytes of file data held in memory at once, reading and uploading, over all files.
    pub memory_budget: usize,
}

/// Part buffers the memory budget allows at once (at least one).
fn budget_permits(cfg: UploadConfig) -> u32 {
    u32::try_from((cfg.memory_budget / cfg.part_size.max(1)).max(1)).unwrap_or(u32::MAX)
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig {
            multipart_threshold: 8 << 20,
            part_size: 8 << 20,
            part_concurrency: 4,
            file_concurrency: 4,
            file_attempts: 3,
            memory_budget: 64 << 20,
        }
    }
}

/// Who a checkpoint belongs to.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointMeta {
    pub job_id: JobId,
    pub replica: u32,
    pub attempt: u32,
    pub checkpoint_id: CheckpointId,
    pub created_at: DateTime<Utc>,
}

/// A durable checkpoint.
#[derive(Debug, Clone)]
pub struct Uploaded {
    pub manifest: CheckpointManifest,
    /// The manifest's URI, e.g. `s3://bucket/jobs/…/manifest.json`.
    pub manifest_uri: String,
    pub elapsed: Duration,
}

/// One job's checkpoints in an object store.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    /// The same store when it is a local folder: files are then copied by the kernel while
    /// another thread hashes them, instead of going through object_store's buffered writes.
    local: Option<Arc<LocalFileSystem>>,
    /// The prefix inside the store (the URL's path).
    root: Path,
    /// The URL of the store's root, without the prefix, to write URIs.
    base: String,
}

/// How object_store retries one request of the agent's: 3 more times at most, none starting
/// 10 s after the first, 100 ms apart then doubling up to 1 s. A request that still fails is
/// the file's to start over (see the module's "Retries inside a notice window").
///
/// The 10 s also counts from a download's first request, for the range requests that resume
/// its body: a restore that loses its connection later starts the file over instead.
pub fn store_retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
        },
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
    }
}

/// A request with no progress for this long fails (and is retried): an upload that has no
/// answer this long after it started, a download with no byte for this long.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP client of the agent's object stores: connecting takes at most 5 s, and
/// [`READ_TIMEOUT`] bounds a request that makes no progress. There is no limit on a whole
/// request (object_store's default is 30 s): a multi-gigabyte file restores in one download
/// that keeps making progress; a part upload (8 MiB by default) must be answered within
/// [`READ_TIMEOUT`]. `--store-option read_timeout=30s` (or `timeout`, `connect_timeout`)
/// overrides these, for a slow link or large parts.
pub fn store_client() -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_read_timeout(READ_TIMEOUT)
        .with_timeout_disabled()
}

/// Opens an object store for a URL. `options` are object_store configuration keys
/// (`aws_endpoint`, `aws_allow_http`, `google_base_url`, `azure_storage_use_emulator`, …);
/// credentials come from the environment as each cloud's SDKs read them.
pub fn open_store(
    url: &str,
    options: &[(String, String)],
) -> Result<(Arc<dyn ObjectStore>, Path, String), CheckpointError> {
    open_any(url, options).map(|(s, p, b, _)| (s, p, b))
}

type Opened = (
    Arc<dyn ObjectStore>,
    Path,
    String,
    Option<Arc<LocalFileSystem>>,
);

fn open_any(url: &str, options: &[(String, String)]) -> Result<Opened, CheckpointError> {
    let bad = |reason: String| CheckpointError::BadUrl {
        url: url.to_owned(),
        reason,
    };
    let parsed = Url::parse(url).map_err(|e| bad(e.to_string()))?;
    let prefix = Path::from_url_path(parsed.path()).map_err(|e| bad(e.to_string()))?;
    let base = format!(
        "{}://{}",
        parsed.scheme(),
        parsed.host_str().unwrap_or_default()
    );
    // The agent's bounds replace object_store's defaults (and the client settings `from_env`
    // read, which are put back on top, so `AWS_ALLOW_HTTP` and the like still work); the
    // options given win over both.
    macro_rules! configure {
        ($builder:expr, $key:ident, $env:literal) => {{
            let mut b = $builder
                .with_retry(store_retry())
                .with_client_options(store_client());
            for (k, v) in std::env::vars_os() {
                if let (Some(k), Some(v)) = (k.to_str(), v.to_str())
                    && k.starts_with($env)
                    && let Ok(key @ $key::Client(_)) = k.to_ascii_lowercase().parse::<$key>()
                {
                    b = b.with_config(key, v);
                }
            }
            for (k, v) in options {
                let key = k
                    .to_ascii_lowercase()
                    .parse()
                    .map_err(|e: object_store::Error| bad(format!("option {k}: {e}")))?;
                b = b.with_config(key, v.clone());
            }
            Arc::new(b.build()?) as Arc<dyn ObjectStore>
        }};
    }
    let store: Arc<dyn ObjectStore> = match parsed.scheme() {
        "file" => {
            let dir = parsed
                .to_file_path()
                .map_err(|()| bad("not a local path".into()))?;
            std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
            let store = Arc::new(
                LocalFileSystem::new_with_prefix(&dir)?
                    .with_automatic_cleanup(true)
                    .with_fsync(true),
            );
            return Ok((
                store.clone(),
                Path::default(),
                format!("file://{}", dir.display()),
                Some(store),
            ));
        }
        "memory" => Arc::new(InMemory::new()),
        "s3" | "s3a" => configure!(
            AmazonS3Builder::from_env().with_url(url),
            AmazonS3ConfigKey,
            "AWS_"
        ),
        "gs" => configure!(
            GoogleCloudStorageBuilder::from_env().with_url(url),
            GoogleConfigKey,
            "GOOGLE_"
        ),
        "az" | "azure" | "abfs" | "abfss" => configure!(
            MicrosoftAzureBuilder::from_env().with_url(url),
            AzureConfigKey,
            "AZURE_"
        ),
        other => {
            return Err(bad(format!(
                "unsupported scheme {other:?}; expected s3, gs, az or file"
            )));
        }
    };
    Ok((store, prefix, base, None))
}

impl CheckpointStore {
    /// A job's checkpoints under `uri` (the job's checkpoint prefix).
    pub fn open(uri: &str, options: &[(String, String)]) -> Result<Self, CheckpointError> {
        let (store, root, base, local) = open_any(uri, options)?;
        Ok(CheckpointStore {
            store,
            local,
            root,
            base,
        })
    }

    /// Over an existing store (tests, benchmarks).
    pub fn with_store(store: Arc<dyn ObjectStore>, root: Path, base: &str) -> Self {
        CheckpointStore {
            store,
            local: None,
            root,
            base: base.to_owned(),
        }
    }

    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    fn child(&self, parts: &[&str]) -> Path {
        under(&self.root, parts)
    }

    fn replica_prefix(&self, replica: u32) -> Path {
        self.child(&[&format!("replica-{replica}")])
    }

    fn checkpoint_prefix(&self, replica: u32, id: CheckpointId) -> Path {
        self.child(&[&format!("replica-{replica}"), &id.to_string()])
    }

    /// The URI of an object of this store.
    pub fn uri(&self, p: &Path) -> String {
        format!("{}/{}", self.base.trim_end_matches('/'), p)
    }

    /// Where a checkpoint's manifest is (or would be).
    pub fn manifest_uri(&self, replica: u32, id: CheckpointId) -> String {
        self.uri(&self.checkpoint_prefix(replica, id).join(MANIFEST))
    }

    /// Where file `n` of a replica attempt's output is archived:
    /// `<prefix>/logs/replica-<r>/attempt-<a>/<n>.log` (beside the checkpoints, never taken
    /// for one: checkpoints are under `<prefix>/replica-<r>/`).
    pub fn log_path(&self, replica: u32, attempt: u32, n: u64) -> Path {
        self.child(&[
            "logs",
            &format!("replica-{replica}"),
            &format!("attempt-{attempt}"),
            &format!("{n}.log"),
        ])
    }

    /// Archives a finished log file as file `n` of the attempt, holding at most about
    /// `buffer` bytes of it in memory at once; returns its URI.
    pub async fn put_log(
        &self,
        replica: u32,
        attempt: u32,
        n: u64,
        mut file: tokio::fs::File,
        buffer: usize,
    ) -> Result<String, CheckpointError> {
        let location = self.log_path(replica, attempt, n);
        let mut up = object_store::buffered::BufWriter::with_capacity(
            self.store.clone(),
            location.clone(),
            buffer.max(5 << 20),
        )
        .with_max_concurrency(2);
        let copied = tokio::io::copy(&mut file, &mut up).await;
        match copied {
            Ok(_) => up
                .shutdown()
                .await
                .map_err(io(format!("uploading {location}")))?,
            Err(e) => {
                let _ = up.abort().await;
                return Err(CheckpointError::Io {
                    what: format!("uploading {location}"),
                    source: e,
                });
            }
        }
        Ok(self.uri(&location))
    }
}

/// `base` followed by the `/`-separated segments of `parts`.
fn under(base: &Path, parts: &[&str]) -> Path {
    let mut p = base.clone();
    for part in parts {
        for seg in part.split('/').filter(|s| !s.is_empty()) {
            p = p.join(seg);
        }
    }
    p
}

/// A manifest path as a relative filesystem path, if it stays inside its directory.
fn safe_relative(p: &str) -> Option<PathBuf> {
    let path = FsPath::new(p);
    if p.is_empty() || path.is_absolute() {
        return None;
    }
    path.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| path.to_owned())
}

#[cfg(test)]
mod tests;
