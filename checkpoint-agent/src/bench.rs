//! `spotplane-agent bench upload`: how long from a termination notice to a durable checkpoint,
//! and how the agent's upload compares with a plain copy of the same bytes to the same target.
//!
//! For each size: write a checkpoint of that size (several shard files of pseudo-random
//! bytes, so nothing compresses) into a scratch directory; copy it plainly to the target
//! (`file://`: `std::fs::copy` file by file, then `fsync` of each file and of the folder, the
//! point where the copy is as durable as the agent's checkpoint; object stores: one multipart
//! upload per file, same part size and parallelism, no checksums, no manifest); then do what
//! the agent does on a notice — signal a workload whose checkpoint this is, wait for its
//! marker, hash and upload every file, write the manifest — and time it. The ratio is the
//! plain copy's time over the agent's (1.0: as fast as a plain copy). For a local folder the
//! copy's time before its `fsync`s (the bytes only in the page cache) is reported too, with
//! its own ratio. The process's resident memory is sampled every
//! 20 ms: before any checkpoint is made (idle) and its peak during the uploads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use nix::sys::signal::Signal;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, WriteMultipart};
use spotplane_core::{CheckpointId, JobId};

use crate::checkpoint::{CheckpointMeta, CheckpointStore, UploadConfig, open_store};
use crate::workload::{Launch, Workload};

#[derive(Debug, Args)]
pub struct UploadBenchArgs {
    /// Where checkpoints go: `file:///dir`, `s3://bucket/prefix`, `gs://…`, `az://…`.
    #[arg(long)]
    pub target: String,
    /// Checkpoint sizes, e.g. `1GiB,10GiB`.
    #[arg(long, value_delimiter = ',', default_value = "1GiB", value_parser = parse_size)]
    pub size: Vec<u64>,
    /// Files per checkpoint (shards of equal size).
    #[arg(long, default_value_t = 8)]
    pub files: u64,
    /// Where the checkpoints are written before upload (default: a temporary directory).
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    /// An object_store option, `key=value` (repeatable).
    #[arg(long = "store-option", value_parser = parse_kv)]
    pub store_options: Vec<(String, String)>,
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    pub part_size: u64,
    #[arg(long, default_value_t = 4)]
    pub part_concurrency: usize,
    #[arg(long, default_value_t = 4)]
    pub file_concurrency: usize,
    /// Memory for file data in flight, over all files.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub upload_memory: u64,
    /// Runs per size (the figures are the median).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Print one JSON object per size instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

/// `1GiB`, `512MiB`, `10gb`, `4096` (bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        _ => return Err(format!("bad size unit in {s:?}; use KiB, MiB or GiB")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} too large"))
}

/// Resident memory of this process, bytes.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Samples RSS in the background while alive; keeps the peak.
struct RssSampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start() -> Self {
        let peak = Arc::new(AtomicU64::new(rss_bytes()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss_bytes(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        RssSampler {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// Writes `size` bytes as `files` shards of pseudo-random data.
fn write_checkpoint(dir: &Path, size: u64, files: u64) -> anyhow::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let per = size / files.max(1);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; 8 << 20];
    for i in 0..files.max(1) {
        let len = if i + 1 == files.max(1) {
            size - per * i
        } else {
            per
        };
        let mut f = std::io::BufWriter::new(std::fs::File::create(
            dir.join(format!("shard-{i:03}.bin")),
        )?);
        let mut left = len;
        while left > 0 {
            for chunk in buf.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes());
            }
            let n = usize::try_from(left.min(buf.len() as u64))?;
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        f.flush()?;
    }
    Ok(())
}

/// The plain copy of every file of `dir` to `target`: the time until the bytes are in the
/// target's page cache (local folder only) and until they are durable.
async fn plain_copy(
    dir: &Path,
    target: &str,
    options: &[(String, String)],
    part: usize,
    concurrency: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && !p.ends_with(crate::workload::MARKER))
        .collect();
    files.sort();
    let started = Instant::now();
    if let Some(local) = target.strip_prefix("file://") {
        let out = Path::new(local).join("plain-copy");
        std::fs::create_dir_all(&out)?;
        let mut copies = Vec::with_capacity(files.len());
        for f in &files {
            let name = f.file_name().context("file name")?;
            std::fs::copy(f, out.join(name))?;
            copies.push(out.join(name));
        }
        let cached = started.elapsed();
        for c in &copies {
            std::fs::File::open(c)?.sync_all()?;
        }
        std::fs::File::open(&out)?.sync_all()?;
        return Ok((cached, started.elapsed()));
    }
    let (store, root, _) = open_store(target, options)?;
    for f in &files {
        use tokio::io::AsyncReadExt;
        let name = f
            .file_name()
            .and_then(|n| n.to_str())
            .context("file name")?;
        let location = ObjPath::from(format!("{root}/plain-copy/{name}"));
        let mut w =
            WriteMultipart::new_with_chunk_size(store.put_multipart(&location).await?, part);
        let mut file = tokio::fs::File::open(f).await?;
        loop {
            let mut buf = vec![0u8; part];
            let mut filled = 0;
            while filled < part {
                let n = file.read(&mut buf[filled..]).await?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            if filled == 0 {
                break;
            }
            buf.truncate(filled);
            w.wait_for_capacity(concurrency).await?;
            w.put(Bytes::from(buf));
        }
        w.finish().await?;
    }
    let done = started.elapsed();
    Ok((done, done))
}

/// Writes back dirty pages (`sync`), so that one phase's writes are not paid by the next.
fn flush_dirty_pages() {
    if let Err(e) = std::process::Command::new("sync").status() {
        tracing::debug!(error = %e, "sync failed");
    }
}

/// Empties a local target between runs, so the disk does not fill up.
fn clear_target(target: &str) {
    if let Some(local) = target.strip_prefix("file://") {
        let _ = std::fs::remove_dir_all(local);
    }
}

#[derive(Debug, serde::Serialize)]
struct Row {
    target: String,
    bytes: u64,
    files: u64,
    plain_copy_s: f64,
    /// Local folder: the plain copy until its bytes were in the page cache, not yet durable.
    plain_copy_cached_s: f64,
    notice_to_durable_s: f64,
    upload_s: f64,
    agent_mib_s: f64,
    plain_mib_s: f64,
    ratio: f64,
    /// `plain_copy_cached_s` over the agent's time.
    ratio_cached: f64,
    rss_idle_mib: f64,
    rss_peak_mib: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub async fn upload(args: UploadBenchArgs) -> anyhow::Result<()> {
    let idle = rss_bytes();
    let tmp;
    let scratch = match &args.scratch {
        Some(s) => s.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_owned()
        }
    };
    let cfg = UploadConfig {
        part_size: usize::try_from(args.part_size)?,
        multipart_threshold: args.part_size,
        part_concurrency: args.part_concurrency,
        file_concurrency: args.file_concurrency,
        memory_budget: usize::try_from(args.upload_memory)?,
        ..UploadConfig::default()
    };
    let store = CheckpointStore::open(
        &format!("{}/agent", args.target.trim_end_matches('/')),
        &args.store_options,
    )?;
    if !args.json {
        println!(
            "{:<28} {:>9} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6} {:>8} {:>9} {:>9}",
            "target",
            "size",
            "files",
            "cached s",
            "plain s",
            "durable s",
            "plain MiB/s",
            "agent MiB/s",
            "ratio",
            "(cached)",
            "idle MiB",
            "peak MiB"
        );
    }
    for size in &args.size {
        let dir = scratch.join(format!("ckpt-{size}"));
        write_checkpoint(&dir, *size, args.files).context("writing the checkpoint")?;
        // A workload whose checkpoint is already on disk: it only answers the signal.
        let launch = Launch {
            job_id: JobId::from_uuid(uuid::Uuid::now_v7()),
            replica: 0,
            attempt: 0,
            node_id: None,
            command: vec![
                "bash".into(),
                "-c".into(),
                "trap 'touch \"$SPOTPLANE_CHECKPOINT_MARKER\"' USR1; while true; do sleep 0.01; done".into(),
            ],
            env: Default::default(),
            devices: Vec::new(),
            checkpoint_dir: dir.clone(),
            resume_dir: None,
            home_dir: None,
            tmp_dir: None,
            signal: Signal::SIGUSR1,
            log: None,
            // The benchmark measures the upload path, not isolation (which adds two walks of
            // the folder's entries, no copy).
            run_as: None,
            working_dir: None,
            container: None,
        };
        let mut w = Workload::start(&launch)?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (mut plain, mut cached, mut durable, mut uploads) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut peak = 0u64;
        for run in 0..args.runs.max(1) {
            // Each phase starts with no dirty pages left by the other (otherwise the second
            // pays for the first one's writeback), and they take turns going first.
            let plain_phase = async {
                flush_dirty_pages();
                plain_copy(
                    &dir,
                    &args.target,
                    &args.store_options,
                    cfg.part_size,
                    cfg.part_concurrency,
                )
                .await
                .map(|(c, d)| (c.as_secs_f64(), d.as_secs_f64()))
            };
            let agent_phase = async {
                flush_dirty_pages();
                let sampler = RssSampler::start();
                let notice = Instant::now();
                w.checkpoint(Duration::from_secs(30)).await?;
                let up = store
                    .upload(
                        &dir,
                        CheckpointMeta {
                            job_id: launch.job_id,
                            replica: 0,
                            attempt: 0,
                            checkpoint_id: CheckpointId::from_uuid(uuid::Uuid::now_v7()),
                            created_at: chrono::Utc::now(),
                        },
                        cfg,
                        None,
                    )
                    .await?;
                let d = notice.elapsed().as_secs_f64();
                let p = sampler.finish();
                w.release_checkpoint()?;
                anyhow::Ok((d, up.elapsed.as_secs_f64(), p))
            };
            let (p, (d, u, rss)) = if run % 2 == 0 {
                let p = plain_phase.await?;
                (p, agent_phase.await?)
            } else {
                let a = agent_phase.await?;
                (plain_phase.await?, a)
            };
            cached.push(p.0);
            plain.push(p.1);
            peak = peak.max(rss);
            durable.push(d);
            uploads.push(u);
            clear_target(&args.target);
        }
        w.stop(Duration::from_secs(2)).await;
        let (p, c, d) = (median(plain), median(cached), median(durable));
        let mib = *size as f64 / f64::from(1u32 << 20);
        let row = Row {
            target: args.target.clone(),
            bytes: *size,
            files: args.files,
            plain_copy_s: p,
            plain_copy_cached_s: c,
            notice_to_durable_s: d,
            upload_s: median(uploads),
            agent_mib_s: mib / d,
            plain_mib_s: mib / p,
            ratio: p / d,
            ratio_cached: c / d,
            rss_idle_mib: idle as f64 / f64::from(1u32 << 20),
            rss_peak_mib: peak as f64 / f64::from(1u32 << 20),
        };
        if args.json {
            println!("{}", serde_json::to_string(&row)?);
        } else {
            println!(
                "{:<28} {:>9} {:>6} {:>10.2} {:>10.2} {:>10.2} {:>10.0} {:>10.0} {:>6.2} {:>8.2} {:>9.1} {:>9.1}",
                row.target.chars().take(28).collect::<String>(),
                format!("{:.1}GiB", *size as f64 / f64::from(1u32 << 30)),
                row.files,
                row.plain_copy_cached_s,
                row.plain_copy_s,
                row.notice_to_durable_s,
                row.plain_mib_s,
                row.agent_mib_s,
                row.ratio,
                row.ratio_cached,
                row.rss_idle_mib,
                row.rss_peak_mib
            );
        }
        std::fs::remove_dir_all(&dir).ok();
        if let Some(local) = args.target.strip_prefix("file://") {
            std::fs::remove_dir_all(Path::new(local)).ok();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("1PB").is_err());
    }
}
