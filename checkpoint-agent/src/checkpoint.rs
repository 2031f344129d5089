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
//! at once. The object store's client retries failed requests (5xx, resets) with backoff; a
//! file whose upload still fails is started over, a few times, before the checkpoint fails.

use std::path::{Component, Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use spotplane_core::agent::{CheckpointManifest, ManifestFile};
use spotplane_core::{CheckpointId, JobId};
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use url::Url;

use crate::workload::MARKER;

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
    /// Times a file's upload is started over after its requests' own retries gave up.
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
    macro_rules! configure {
        ($builder:expr) => {{
            let mut b = $builder;
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
        "s3" | "s3a" => configure!(AmazonS3Builder::from_env().with_url(url)),
        "gs" => configure!(GoogleCloudStorageBuilder::from_env().with_url(url)),
        "az" | "azure" | "abfs" | "abfss" => {
            configure!(MicrosoftAzureBuilder::from_env().with_url(url))
        }
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

    /// Uploads `dir` as checkpoint `meta`, the manifest last, before `deadline` if given.
    /// Missing the deadline leaves no manifest: the checkpoint does not exist.
    pub async fn upload(
        &self,
        dir: &FsPath,
        meta: CheckpointMeta,
        cfg: UploadConfig,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Uploaded, CheckpointError> {
        let started = Instant::now();
        let files = list_files(dir).await?;
        let total: u64 = files.iter().map(|f| f.size).sum();
        let prefix = self.checkpoint_prefix(meta.replica, meta.checkpoint_id);
        let uploaded = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let budget = Arc::new(Semaphore::new(budget_permits(cfg) as usize));
        let pool = BufferPool::default();
        let work = async {
            let mut done: Vec<ManifestFile> = futures::stream::iter(files.iter().cloned())
                .map(|f| {
                    let location = under(&prefix, &["files", &f.rel]);
                    let counter = uploaded.clone();
                    let budget = budget.clone();
                    let pool = pool.clone();
                    async move {
                        self.upload_file(f, location, cfg, counter, budget, pool)
                            .await
                    }
                })
                .buffer_unordered(cfg.file_concurrency.max(1))
                .try_collect()
                .await?;
            done.sort_by(|a, b| a.path.cmp(&b.path));
            let manifest = CheckpointManifest {
                job_id: meta.job_id,
                replica: meta.replica,
                checkpoint_id: meta.checkpoint_id,
                attempt: meta.attempt,
                created_at: meta.created_at,
                total_bytes: done.iter().map(|f| f.size).sum(),
                files: done,
            };
            let body =
                serde_json::to_vec_pretty(&manifest).map_err(|e| CheckpointError::Manifest {
                    location: prefix.to_string(),
                    reason: e.to_string(),
                })?;
            let location = prefix.clone().join(MANIFEST);
            // A local folder is durable only once the files and the folders that name them are
            // on disk, before the manifest (which the store, opened with fsync, syncs itself).
            if let Some(local) = &self.local {
                sync_folders(local, &prefix, &manifest.files).await?;
            }
            self.store.put(&location, PutPayload::from(body)).await?;
            Ok::<_, CheckpointError>((manifest, location))
        };
        let (manifest, location) = match deadline {
            Some(d) => tokio::time::timeout_at(d, work).await.map_err(|_| {
                CheckpointError::Deadline {
                    uploaded: uploaded.load(std::sync::atomic::Ordering::Relaxed),
                    total,
                }
            })??,
            None => work.await?,
        };
        Ok(Uploaded {
            manifest_uri: self.uri(&location),
            manifest,
            elapsed: started.elapsed(),
        })
    }

    async fn upload_file(
        &self,
        f: LocalFile,
        location: Path,
        cfg: UploadConfig,
        counter: Arc<std::sync::atomic::AtomicU64>,
        budget: Arc<Semaphore>,
        pool: BufferPool,
    ) -> Result<ManifestFile, CheckpointError> {
        let mut attempt = 1;
        loop {
            let result = if let Some(local) = &self.local {
                put_local(local, &f, &location).await
            } else if f.size <= cfg.multipart_threshold {
                let parts = u32::try_from(f.size.div_ceil(cfg.part_size.max(1) as u64).max(1))
                    .unwrap_or(u32::MAX)
                    .min(budget_permits(cfg));
                let _memory = budget.acquire_many(parts).await.map_err(closed)?;
                self.put_small(&f, &location).await
            } else {
                self.put_multipart(&f, &location, cfg, &budget, &pool).await
            };
            match result {
                Ok(sha256) => {
                    counter.fetch_add(f.size, std::sync::atomic::Ordering::Relaxed);
                    return Ok(ManifestFile {
                        path: f.rel,
                        size: f.size,
                        sha256,
                    });
                }
                Err(e @ (CheckpointError::Store(_) | CheckpointError::Io { .. }))
                    if attempt < cfg.file_attempts =>
                {
                    tracing::warn!(file = %f.rel, attempt, error = %e, "file upload failed; starting it over");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn put_small(&self, f: &LocalFile, location: &Path) -> Result<String, CheckpointError> {
        let data = tokio::fs::read(&f.abs)
            .await
            .map_err(io(format!("reading {}", f.abs.display())))?;
        if data.len() as u64 != f.size {
            return Err(CheckpointError::Size {
                path: f.rel.clone(),
                expected: f.size,
                actual: data.len() as u64,
            });
        }
        let data = Bytes::from(data);
        let hashed = data.clone();
        let sha = tokio::task::spawn_blocking(move || hex::encode(Sha256::digest(&hashed)))
            .await
            .map_err(joined("hashing"))?;
        self.store.put(location, PutPayload::from(data)).await?;
        Ok(sha)
    }

    /// Reads and hashes the file part by part on blocking threads while earlier parts go up.
    /// Every part buffer holds a permit of `budget` from the moment it is read until its
    /// upload is over, which bounds the memory of all concurrent uploads together.
    async fn put_multipart(
        &self,
        f: &LocalFile,
        location: &Path,
        cfg: UploadConfig,
        budget: &Arc<Semaphore>,
        pool: &BufferPool,
    ) -> Result<String, CheckpointError> {
        let part = cfg.part_size.max(5 << 20);
        let mut upload = self.store.put_multipart(location).await?;
        let per_file = Arc::new(Semaphore::new(cfg.part_concurrency.max(1)));
        let mut parts: JoinSet<Result<(), object_store::Error>> = JoinSet::new();
        let abs = f.abs.clone();
        let mut state = Some((None::<std::fs::File>, Sha256::new()));
        let mut total = 0u64;
        let result: Result<String, CheckpointError> = async {
            loop {
                // Surface a failed part early.
                while let Some(done) = parts.try_join_next() {
                    done.map_err(joined("uploading a part"))??;
                }
                let slot = per_file.clone().acquire_owned().await.map_err(closed)?;
                let memory = budget.clone().acquire_owned().await.map_err(closed)?;
                let (file, hasher) = state.take().ok_or_else(|| closed(()))?;
                let path = abs.clone();
                let buf = pool.take(part);
                let (file, hasher, buf) =
                    tokio::task::spawn_blocking(move || read_part(file, hasher, &path, buf))
                        .await
                        .map_err(joined("reading"))??;
                let last = buf.len() < part;
                total += buf.len() as u64;
                if !buf.is_empty() {
                    let lent = Bytes::from_owner(Lent {
                        buf,
                        pool: pool.clone(),
                    });
                    let put = upload.put_part(PutPayload::from(lent));
                    parts.spawn(async move {
                        let r = put.await;
                        drop((slot, memory));
                        r
                    });
                }
                if last {
                    while let Some(done) = parts.join_next().await {
                        done.map_err(joined("uploading a part"))??;
                    }
                    if total != f.size {
                        return Err(CheckpointError::Size {
                            path: f.rel.clone(),
                            expected: f.size,
                            actual: total,
                        });
                    }
                    return Ok(hex::encode(hasher.finalize()));
                }
                state = Some((Some(file), hasher));
            }
        }
        .await;
        match result {
            Ok(sha) => {
                upload.complete().await?;
                Ok(sha)
            }
            Err(e) => {
                parts.abort_all();
                if let Err(abort) = upload.abort().await {
                    tracing::debug!(error = %abort, "aborting the multipart upload failed");
                }
                Err(e)
            }
        }
    }

    /// The ids of checkpoints of a replica that have a manifest, newest first.
    pub async fn checkpoints(&self, replica: u32) -> Result<Vec<CheckpointId>, CheckpointError> {
        let prefix = self.replica_prefix(replica);
        let listing = self.store.list_with_delimiter(Some(&prefix)).await?;
        let mut ids: Vec<CheckpointId> = listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().and_then(|n| n.parse().ok()))
            .collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::new();
        for id in ids {
            match self
                .store
                .head(&self.checkpoint_prefix(replica, id).join(MANIFEST))
                .await
            {
                Ok(_) => out.push(id),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// Reads a checkpoint's manifest.
    pub async fn manifest(
        &self,
        replica: u32,
        id: CheckpointId,
    ) -> Result<CheckpointManifest, CheckpointError> {
        let location = self.checkpoint_prefix(replica, id).join(MANIFEST);
        let body = self.store.get(&location).await?.bytes().await?;
        let m: CheckpointManifest =
            serde_json::from_slice(&body).map_err(|e| CheckpointError::Manifest {
                location: location.to_string(),
                reason: e.to_string(),
            })?;
        if m.replica != replica || m.checkpoint_id != id {
            return Err(CheckpointError::Manifest {
                location: location.to_string(),
                reason: "it names another checkpoint".into(),
            });
        }
        Ok(m)
    }

    /// Downloads a checkpoint into `dest` (emptied first), checking every file's size and
    /// SHA-256. Files are written next to their place and renamed when verified.
    pub async fn restore(
        &self,
        manifest: &CheckpointManifest,
        dest: &FsPath,
        concurrency: usize,
    ) -> Result<(), CheckpointError> {
        if tokio::fs::try_exists(dest).await.unwrap_or(false) {
            tokio::fs::remove_dir_all(dest)
                .await
                .map_err(io(format!("emptying {}", dest.display())))?;
        }
        tokio::fs::create_dir_all(dest)
            .await
            .map_err(io(format!("creating {}", dest.display())))?;
        let prefix = self.checkpoint_prefix(manifest.replica, manifest.checkpoint_id);
        futures::stream::iter(manifest.files.clone())
            .map(|f| {
                let location = under(&prefix, &["files", &f.path]);
                async move { self.restore_file(&f, &location, dest).await }
            })
            .buffer_unordered(concurrency.max(1))
            .try_collect::<()>()
            .await
    }

    async fn restore_file(
        &self,
        f: &ManifestFile,
        location: &Path,
        dest: &FsPath,
    ) -> Result<(), CheckpointError> {
        let rel = safe_relative(&f.path).ok_or_else(|| CheckpointError::Manifest {
            location: location.to_string(),
            reason: format!("unsafe path {:?}", f.path),
        })?;
        let target = dest.join(rel);
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        let tmp = target.with_extension("spotplane-partial");
        let mut out = tokio::fs::File::create(&tmp)
            .await
            .map_err(io(format!("creating {}", tmp.display())))?;
        let mut stream = self.store.get(location).await?.into_stream();
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            size += chunk.len() as u64;
            hasher.update(&chunk);
            out.write_all(&chunk)
                .await
                .map_err(io(format!("writing {}", tmp.display())))?;
        }
        out.flush()
            .await
            .map_err(io(format!("writing {}", tmp.display())))?;
        drop(out);
        let actual = hex::encode(hasher.finalize());
        if size != f.size {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(CheckpointError::Size {
                path: f.path.clone(),
                expected: f.size,
                actual: size,
            });
        }
        if actual != f.sha256 {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(CheckpointError::Checksum {
                path: f.path.clone(),
                expected: f.sha256.clone(),
                actual,
            });
        }
        tokio::fs::rename(&tmp, &target)
            .await
            .map_err(io(format!("renaming to {}", target.display())))
    }

    /// Restores the newest checkpoint that restores whole and verified; an older one is tried
    /// when a newer one is damaged. `None` when the replica has no checkpoint.
    pub async fn restore_latest(
        &self,
        replica: u32,
        dest: &FsPath,
        concurrency: usize,
    ) -> Result<Option<CheckpointManifest>, CheckpointError> {
        let mut last_err = None;
        for id in self.checkpoints(replica).await? {
            let attempt = async {
                let m = self.manifest(replica, id).await?;
                self.restore(&m, dest, concurrency).await?;
                Ok::<_, CheckpointError>(m)
            };
            match attempt.await {
                Ok(m) => return Ok(Some(m)),
                Err(e) => {
                    tracing::error!(checkpoint = %id, error = %e, "checkpoint damaged; trying an older one");
                    last_err = Some(e);
                }
            }
        }
        match last_err {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Restores the checkpoint whose manifest is at `manifest_uri` (a URI of this store).
    pub async fn restore_uri(
        &self,
        manifest_uri: &str,
        dest: &FsPath,
        concurrency: usize,
    ) -> Result<CheckpointManifest, CheckpointError> {
        let bad = |reason: &str| CheckpointError::Manifest {
            location: manifest_uri.to_owned(),
            reason: reason.to_owned(),
        };
        let rest = manifest_uri
            .strip_prefix(&self.uri(&self.root))
            .ok_or_else(|| bad("not under the job's checkpoint prefix"))?;
        let mut parts = rest.trim_start_matches('/').split('/');
        let replica = parts
            .next()
            .and_then(|r| r.strip_prefix("replica-"))
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| bad("no replica in the path"))?;
        let id = parts
            .next()
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| bad("no checkpoint id in the path"))?;
        let m = self.manifest(replica, id).await?;
        self.restore(&m, dest, concurrency).await?;
        Ok(m)
    }
}

/// A file into the local store: the kernel copies it to a temporary name beside its place
/// (`copy_file_range`: no byte passes through this process) and writes it to disk (`fsync`)
/// while a second thread reads and hashes it; then it is renamed into place. The workload
/// leaves its checkpoint alone while the marker exists, so both read the same bytes (and a
/// restore checks them again). The rename is made durable by [`sync_folders`] before the
/// manifest is written.
async fn put_local(
    store: &LocalFileSystem,
    f: &LocalFile,
    location: &Path,
) -> Result<String, CheckpointError> {
    let target = store.path_to_filesystem(location)?;
    let tmp = target.with_file_name(format!(
        ".{}.spotplane-partial",
        target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("file")
    ));
    if let Some(dir) = target.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(io(format!("creating {}", dir.display())))?;
    }
    let (src, dst) = (f.abs.clone(), tmp.clone());
    let copy = tokio::task::spawn_blocking(move || {
        let n = std::fs::copy(&src, &dst)?;
        std::fs::File::open(&dst)?.sync_all()?;
        Ok::<_, std::io::Error>(n)
    });
    let src = f.abs.clone();
    let hash = tokio::task::spawn_blocking(move || -> std::io::Result<(String, u64)> {
        use std::io::Read;
        let mut file = std::fs::File::open(&src)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            total += n as u64;
        }
        Ok((hex::encode(hasher.finalize()), total))
    });
    let copied = copy.await.map_err(joined("copying"))?;
    let hashed = hash.await.map_err(joined("copying"))?;
    let result = match (copied, hashed) {
        (Ok(n), Ok((sha, read))) if n == f.size && read == f.size => Ok(sha),
        (Ok(n), Ok((_, read))) => Err(CheckpointError::Size {
            path: f.rel.clone(),
            expected: f.size,
            actual: if n == f.size { read } else { n },
        }),
        (Err(e), _) => Err(io(format!(
            "copying {} to {}",
            f.abs.display(),
            tmp.display()
        ))(e)),
        (_, Err(e)) => Err(io(format!("reading {}", f.abs.display()))(e)),
    };
    match result {
        Ok(sha) => {
            tokio::fs::rename(&tmp, &target)
                .await
                .map_err(io(format!("renaming to {}", target.display())))?;
            Ok(sha)
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            Err(e)
        }
    }
}

/// Makes the names of a checkpoint's files durable: every folder from the files' own up to the
/// checkpoint's parent (the replica's folder, which gained the checkpoint's) is synced.
async fn sync_folders(
    store: &LocalFileSystem,
    prefix: &Path,
    files: &[ManifestFile],
) -> Result<(), CheckpointError> {
    let top = store.path_to_filesystem(prefix)?;
    let mut dirs = std::collections::BTreeSet::new();
    for f in files {
        let target = store.path_to_filesystem(&under(prefix, &["files", &f.path]))?;
        let mut dir = target.parent();
        while let Some(d) = dir {
            if !dirs.insert(d.to_owned()) || d == top {
                break;
            }
            dir = d.parent();
        }
    }
    dirs.insert(top.clone());
    if let Some(parent) = top.parent() {
        dirs.insert(parent.to_owned());
    }
    tokio::task::spawn_blocking(move || {
        for d in &dirs {
            sync_dir(d).map_err(io(format!("syncing {}", d.display())))?;
        }
        Ok(())
    })
    .await
    .map_err(joined("syncing"))?
}

/// `fsync` of a folder, which makes the names in it durable.
fn sync_dir(dir: &FsPath) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Part buffers of one upload, reused: at most one buffer per permit of the memory budget is
/// ever allocated (all before any is freed, so the allocator maps them and gives them back at
/// the end instead of keeping freed 8 MiB blocks in its arenas).
#[derive(Debug, Clone, Default)]
struct BufferPool(Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

impl BufferPool {
    fn take(&self, len: usize) -> Vec<u8> {
        let mut b = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_default();
        b.clear();
        b.resize(len, 0);
        b
    }
}

/// A pooled buffer lent to a `Bytes`; back to the pool when the upload is done with it.
struct Lent {
    buf: Vec<u8>,
    pool: BufferPool,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.pool
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(buf);
    }
}

fn closed<T>(_: T) -> CheckpointError {
    CheckpointError::Io {
        what: "uploading".into(),
        source: std::io::Error::other("the upload's limits were closed"),
    }
}

/// Reads the next part (up to `part` bytes; fewer only at the end) and hashes it.
fn read_part(
    file: Option<std::fs::File>,
    mut hasher: Sha256,
    path: &FsPath,
    mut buf: Vec<u8>,
) -> Result<(std::fs::File, Sha256, Vec<u8>), CheckpointError> {
    use std::io::Read;
    let part = buf.len();
    let mut file = match file {
        Some(f) => f,
        None => std::fs::File::open(path).map_err(io(format!("opening {}", path.display())))?,
    };
    let mut filled = 0;
    while filled < part {
        let n = file
            .read(&mut buf[filled..])
            .map_err(io(format!("reading {}", path.display())))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    hasher.update(&buf);
    Ok((file, hasher, buf))
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

/// A file of the checkpoint directory.
#[derive(Debug, Clone)]
struct LocalFile {
    /// Relative path with `/` separators.
    rel: String,
    abs: PathBuf,
    size: u64,
}

/// The regular files under `dir`, recursively, without the marker. Symbolic links are skipped:
/// a checkpoint holds the workload's own files only.
async fn list_files(dir: &FsPath) -> Result<Vec<LocalFile>, CheckpointError> {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            let entries = std::fs::read_dir(&d).map_err(io(format!("listing {}", d.display())))?;
            for entry in entries {
                let entry = entry.map_err(io(format!("listing {}", d.display())))?;
                let ft = entry
                    .file_type()
                    .map_err(io(format!("reading {}", entry.path().display())))?;
                let path = entry.path();
                if ft.is_dir() {
                    stack.push(path);
                } else if ft.is_file() {
                    let rel = path
                        .strip_prefix(&dir)
                        .ok()
                        .and_then(|r| {
                            r.components()
                                .map(|c| match c {
                                    Component::Normal(s) => s.to_str().map(str::to_owned),
                                    _ => None,
                                })
                                .collect::<Option<Vec<_>>>()
                        })
                        .map(|v| v.join("/"));
                    let Some(rel) = rel else {
                        tracing::warn!(path = %path.display(), "file name is not UTF-8; left out of the checkpoint");
                        continue;
                    };
                    if rel == MARKER {
                        continue;
                    }
                    let size = entry
                        .metadata()
                        .map_err(io(format!("reading {}", path.display())))?
                        .len();
                    out.push(LocalFile { rel, abs: path, size });
                } else {
                    tracing::warn!(path = %path.display(), "not a regular file; left out of the checkpoint");
                }
            }
        }
        out.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(out)
    })
    .await
    .map_err(joined("listing the checkpoint"))?
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
