//! Finding and restoring checkpoints: the ids of a replica's checkpoints that have a manifest,
//! newest first; a manifest; and a download that checks every file's size and SHA-256, tries
//! an older checkpoint when a newer one is damaged, and renames each file into place only once
//! it is verified.

use std::path::Path as FsPath;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path;
use sha2::{Digest, Sha256};
use spotplane_core::CheckpointId;
use spotplane_core::agent::{CheckpointManifest, ManifestFile};
use tokio::io::AsyncWriteExt;

use super::{CheckpointError, CheckpointStore, MANIFEST, io, safe_relative, under};

/// Attempts at a file's download in all.
const FILE_ATTEMPTS: u32 = 3;

/// Whether a download that failed so may succeed if started over: the store or the disk
/// failed, not the checkpoint (a file missing or not matching its manifest).
fn may_pass(e: &CheckpointError) -> bool {
    match e {
        CheckpointError::Store(object_store::Error::NotFound { .. }) => false,
        CheckpointError::Store(_) | CheckpointError::Io { .. } => true,
        _ => false,
    }
}

impl CheckpointStore {
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
                async move { self.restore_file_again(&f, &location, dest).await }
            })
            .buffer_unordered(concurrency.max(1))
            .try_collect::<()>()
            .await
    }

    /// A file, started over when its download fails after object_store's own retries (a
    /// connection lost late in a long download, which object_store no longer resumes: see
    /// [`super::store_retry`]), up to [`FILE_ATTEMPTS`] attempts in all. A file whose content
    /// does not verify is not downloaded again: the checkpoint is damaged.
    async fn restore_file_again(
        &self,
        f: &ManifestFile,
        location: &Path,
        dest: &FsPath,
    ) -> Result<(), CheckpointError> {
        let mut attempt = 1;
        loop {
            match self.restore_file(f, location, dest).await {
                Err(e) if attempt < FILE_ATTEMPTS && may_pass(&e) => {
                    tracing::warn!(file = %f.path, attempt, error = %e, "file download failed; starting it over");
                    tokio::time::sleep(Duration::from_millis(200).saturating_mul(1 << attempt))
                        .await;
                    attempt += 1;
                }
                other => return other,
            }
        }
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
