//! Uploading a checkpoint: every file of the directory (but the marker) under `files/`, then
//! the manifest. Small files go in one put; large ones in multipart uploads whose parts are
//! read, hashed and uploaded concurrently within the memory budget; into a local folder the
//! kernel copies each file while another thread hashes it, and the folders are synced before
//! the manifest is written.

use std::path::{Component, Path as FsPath, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use spotplane_core::agent::{CheckpointManifest, ManifestFile};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::{
    CheckpointError, CheckpointMeta, CheckpointStore, MANIFEST, UploadConfig, Uploaded,
    budget_permits, io, joined, under,
};
use crate::workload::MARKER;

/// The longest pause before a file is started over.
const MAX_FILE_PAUSE: Duration = Duration::from_secs(5);

/// What the files of one upload share.
struct Shared {
    cfg: UploadConfig,
    deadline: Option<tokio::time::Instant>,
    /// Bytes of the files uploaded whole so far.
    uploaded: AtomicU64,
    /// Part buffers in memory at once, over all files (see [`budget_permits`]).
    memory: Arc<Semaphore>,
    pool: BufferPool,
}

impl CheckpointStore {
    /// Uploads `dir` as checkpoint `meta`, the manifest last, before `deadline` if given.
    /// Missing the deadline leaves no manifest: the checkpoint does not exist.
    ///
    /// With a deadline this returns by it, whatever the store does: every store call runs
    /// under it, and a file is not started over when the pause before would end past it (the
    /// file's error is returned then). See the module's "Retries inside a notice window".
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
        let shared = Shared {
            cfg,
            deadline,
            uploaded: AtomicU64::new(0),
            memory: Arc::new(Semaphore::new(budget_permits(cfg) as usize)),
            pool: BufferPool::default(),
        };
        let work = async {
            let mut done: Vec<ManifestFile> = futures::stream::iter(files.iter().cloned())
                .map(|f| {
                    let location = under(&prefix, &["files", &f.rel]);
                    self.upload_file(f, location, &shared)
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
                    uploaded: shared.uploaded.load(Ordering::Relaxed),
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

    /// One file, started over after a failure up to `cfg.file_attempts` attempts in all, with a
    /// pause of 400 ms, then twice as long each time up to [`MAX_FILE_PAUSE`], that never ends
    /// past the deadline: a file that cannot be tried again in time fails with its last error.
    async fn upload_file(
        &self,
        f: LocalFile,
        location: Path,
        shared: &Shared,
    ) -> Result<ManifestFile, CheckpointError> {
        let Shared {
            cfg,
            deadline,
            ref memory,
            ref pool,
            ..
        } = *shared;
        let mut attempt = 1;
        loop {
            let result = if let Some(local) = &self.local {
                put_local(local, &f, &location).await
            } else if f.size <= cfg.multipart_threshold {
                let parts = u32::try_from(f.size.div_ceil(cfg.part_size.max(1) as u64).max(1))
                    .unwrap_or(u32::MAX)
                    .min(budget_permits(cfg));
                let _memory = memory.acquire_many(parts).await.map_err(closed)?;
                self.put_small(&f, &location).await
            } else {
                self.put_multipart(&f, &location, cfg, memory, pool).await
            };
            match result {
                Ok(sha256) => {
                    shared.uploaded.fetch_add(f.size, Ordering::Relaxed);
                    return Ok(ManifestFile {
                        path: f.rel,
                        size: f.size,
                        sha256,
                    });
                }
                Err(e @ (CheckpointError::Store(_) | CheckpointError::Io { .. }))
                    if attempt < cfg.file_attempts =>
                {
                    let pause = Duration::from_millis(200)
                        .saturating_mul(1 << attempt.min(16))
                        .min(MAX_FILE_PAUSE);
                    if deadline.is_some_and(|d| tokio::time::Instant::now() + pause >= d) {
                        tracing::warn!(file = %f.rel, attempt, error = %e, "file upload failed; no time left to start it over");
                        return Err(e);
                    }
                    tracing::warn!(file = %f.rel, attempt, error = %e, "file upload failed; starting it over");
                    tokio::time::sleep(pause).await;
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
