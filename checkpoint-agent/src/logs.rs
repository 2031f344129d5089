//! A replica's output: read from its stdout and stderr pipes, written to rotated files in its
//! attempt folder, shipped to the control plane and archived in object storage.
//!
//! ```text
//!  stdout ─┐  LineBuffer (per stream)   RotatingLog             output.log, output.log.1 …
//!          ├─ whole lines ──────────────┬──────────────────────▶ <prefix>/logs/replica-<r>/
//!  stderr ─┘                            │  (rotated files and    attempt-<a>/<n>.log
//!                                       │   the last one)
//!                                       └─ Pending ─ Shipper ─▶ POST /v1/agent/logs (~500 ms)
//! ```
//!
//! - **Interleaving.** The two streams are merged, as `kubectl logs` merges them, untagged, line
//!   by line: each stream keeps its incomplete line in a fixed buffer of [`LINE_MAX`] bytes and
//!   hands on only whole lines (ending in `\n` or `\r`, so progress bars that redraw with `\r`
//!   go through), so a stderr line never lands in the middle of a stdout line. A line longer
//!   than the buffer is cut into [`LINE_MAX`] pieces; an incomplete line that has waited
//!   [`PARTIAL_FLUSH`] (a prompt) is handed on as it is.
//! - **Files.** `output.log` is the newest file; it is rotated when the next write would take
//!   it over the size limit, to `output.log.1`, the older ones moving up, at most `keep` kept.
//!   Every file, once rotated out and at the end of the attempt, is uploaded under the job's
//!   checkpoint prefix as `logs/replica-<r>/attempt-<a>/<n>.log` (`n` from 0, in order), so the
//!   output outlives the node.
//! - **Shipping.** Chunks `{job, replica, attempt, offset, data}` (the offset is the chunk's
//!   position in the attempt's output, so a retried batch is stored once) wait in one bounded
//!   [`Pending`] queue per agent, sent every [`LogSettings::ship_interval`] while there is new
//!   output, at once when an attempt ends. While the control plane is unreachable the queue
//!   keeps the newest [`LogSettings::pending_max`] bytes and drops the oldest; the gap in the
//!   offsets reads as a marker line saying how many bytes were dropped.
//!
//! Memory is bounded: two read buffers and two line buffers per replica, the pending queue per
//! agent, one upload buffer per replica while an upload runs.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use spotplane_core::JobId;
use spotplane_core::agent::{LogBatch, LogChunk, MAX_LOG_CHUNK_BYTES};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::CheckpointStore;
use crate::client::{ClientError, ControlPlane};

/// The longest line kept whole; a longer one is cut into pieces of this size.
pub const LINE_MAX: usize = 16 * 1024;
/// An incomplete line is handed on after waiting this long for the rest of it.
pub const PARTIAL_FLUSH: Duration = Duration::from_secs(1);
/// After the workload's process exits, how long its pipes are still read (children of it may
/// hold them open).
pub const EXIT_GRACE: Duration = Duration::from_secs(2);
/// Bytes of output in one request to the control plane (under its default 256 KiB body limit
/// once base64-encoded).
pub const MAX_BATCH_BYTES: usize = 128 * 1024;
/// Size of each read from a pipe.
const READ_BUF: usize = 8 * 1024;
/// Memory an upload to object storage buffers before it goes multipart.
const UPLOAD_BUFFER: usize = 8 << 20;

/// How output is kept and shipped (the agent's `--log-*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    /// `output.log` is rotated before it grows past this.
    pub max_file_bytes: u64,
    /// Rotated files kept beside it (`output.log.1` …).
    pub keep: usize,
    /// Bytes waiting for the control plane at most, over all replicas of the node.
    pub pending_max: usize,
    /// How often new output is sent to the control plane.
    pub ship_interval: Duration,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            max_file_bytes: 16 << 20,
            keep: 2,
            pending_max: 8 << 20,
            ship_interval: Duration::from_millis(500),
        }
    }
}

/// One replica attempt.
pub type LogKey = (JobId, u32, u32);

/// Where one attempt's output goes.
#[derive(Debug, Clone)]
pub struct LogSink {
    /// The newest file, `…/output.log`.
    pub path: PathBuf,
    pub max_file_bytes: u64,
    pub keep: usize,
    /// The agent's queue to the control plane, and whose output this is.
    pub ship: Option<(Shipper, LogKey)>,
    /// The job's checkpoint store, to archive the files in.
    pub archive: Option<CheckpointStore>,
}

impl LogSink {
    /// Output to files only (no shipping, no archive).
    pub fn file(path: PathBuf) -> Self {
        let d = LogSettings::default();
        LogSink {
            path,
            max_file_bytes: d.max_file_bytes,
            keep: d.keep,
            ship: None,
            archive: None,
        }
    }
}

/// The incomplete line of one stream.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
    /// When the incomplete line began waiting.
    since: Option<Instant>,
}

impl LineBuffer {
    /// Takes bytes read from the stream and appends to `out` what is ready to be written:
    /// whole lines, and pieces of [`LINE_MAX`] bytes of a line that does not end.
    pub fn push(&mut self, mut data: &[u8], now: Instant, out: &mut Vec<u8>) {
        let before = out.len();
        while !data.is_empty() {
            let room = LINE_MAX - self.buf.len();
            let (take, rest) = data.split_at(room.min(data.len()));
            data = rest;
            self.buf.extend_from_slice(take);
            if let Some(i) = self.buf.iter().rposition(|b| *b == b'\n' || *b == b'\r') {
                out.extend(self.buf.drain(..=i));
            }
            if self.buf.len() == LINE_MAX {
                out.append(&mut self.buf);
            }
        }
        // What waits now began waiting now, unless it is the same line as before.
        self.since = match (self.buf.is_empty(), self.since) {
            (true, _) => None,
            (false, Some(t)) if out.len() == before => Some(t),
            (false, _) => Some(now),
        };
    }

    /// When the incomplete line is due to be handed on as it is.
    pub fn due(&self) -> Option<Instant> {
        self.since.map(|t| t + PARTIAL_FLUSH)
    }

    /// Hands on the incomplete line as it is.
    pub fn flush(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.buf);
        self.since = None;
    }
}

/// `output.log` and its rotated predecessors.
#[derive(Debug)]
pub struct RotatingLog {
    path: PathBuf,
    max: u64,
    keep: usize,
    file: File,
    /// Bytes in the current file.
    size: u64,
    /// The number of the current file among the attempt's files (0 first).
    seq: u64,
    /// Bytes written over all files: the offset of the next byte.
    offset: u64,
}

/// A file that is complete, open for reading (it stays readable whatever is renamed or
/// removed after), and its number.
#[derive(Debug)]
pub struct Finished {
    pub seq: u64,
    pub file: File,
}

fn create_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

fn numbered(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

impl RotatingLog {
    /// Creates `path` (empty, mode 0600, the agent's) for a new attempt.
    pub fn create(path: &Path, max: u64, keep: usize) -> std::io::Result<RotatingLog> {
        Ok(RotatingLog {
            path: path.to_owned(),
            max: max.max(1),
            keep,
            file: create_private(path)?,
            size: 0,
            seq: 0,
            offset: 0,
        })
    }

    /// The offset of the next byte written.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Appends `data`, rotating first when it would take the file over the limit; returns the
    /// file rotated out, if any.
    pub fn write(&mut self, data: &[u8]) -> std::io::Result<Option<Finished>> {
        let len = data.len() as u64;
        let rotated = if self.size > 0 && self.size + len > self.max {
            Some(self.rotate()?)
        } else {
            None
        };
        // Small appends to the page cache: blocking for microseconds, not worth a thread.
        self.file.write_all(data)?;
        self.size += len;
        self.offset += len;
        Ok(rotated)
    }

    fn rotate(&mut self) -> std::io::Result<Finished> {
        self.file.flush()?;
        // Opened before any rename: the handle reads this file whatever happens to its name.
        let done = File::open(&self.path)?;
        if self.keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            for n in (1..self.keep).rev() {
                match std::fs::rename(numbered(&self.path, n), numbered(&self.path, n + 1)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            std::fs::rename(&self.path, numbered(&self.path, 1))?;
        }
        self.file = create_private(&self.path)?;
        self.size = 0;
        let seq = self.seq;
        self.seq += 1;
        Ok(Finished { seq, file: done })
    }

    /// The current (last) file, complete, open for reading.
    pub fn finish(mut self) -> std::io::Result<Finished> {
        self.file.flush()?;
        Ok(Finished {
            seq: self.seq,
            file: File::open(&self.path)?,
        })
    }
}

/// A chunk waiting for the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Waiting {
    seq: u64,
    key: LogKey,
    offset: u64,
    data: Vec<u8>,
}

/// Output waiting to be sent, oldest first, at most `max` bytes: when more comes, the oldest
/// chunks go. The chunks in the queue are numbered consecutively (they leave from the front
/// only), so a chunk is found by its number.
#[derive(Debug)]
pub struct Pending {
    chunks: VecDeque<Waiting>,
    bytes: usize,
    max: usize,
    next_seq: u64,
    /// The number of the last chunk of the batch in flight: chunks up to it must not grow.
    in_flight: Option<u64>,
    /// The newest chunk of each attempt, by number.
    last_of: HashMap<LogKey, u64>,
    /// Attempts whose output is over, with its length, sent after all their chunks.
    ends: Vec<(LogKey, u64)>,
    /// Bytes dropped since the agent started.
    dropped: u64,
}

impl Pending {
    pub fn new(max: usize) -> Pending {
        Pending {
            chunks: VecDeque::new(),
            bytes: 0,
            max: max.max(MAX_LOG_CHUNK_BYTES),
            next_seq: 0,
            in_flight: None,
            last_of: HashMap::new(),
            ends: Vec::new(),
            dropped: 0,
        }
    }

    /// Bytes of output waiting.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes dropped because the queue was full, since the agent started.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn index(&self, seq: u64) -> Option<usize> {
        let front = self.chunks.front()?.seq;
        let i = usize::try_from(seq.checked_sub(front)?).ok()?;
        (i < self.chunks.len()).then_some(i)
    }

    /// Queues `data`, written at `offset` of `key`'s output. Returns the bytes dropped to make
    /// room (0 mostly).
    pub fn push(&mut self, key: LogKey, offset: u64, mut data: &[u8]) -> u64 {
        let mut at = offset;
        // Grow the attempt's newest chunk when this continues it and it has not been sent.
        if let Some(i) = self.last_of.get(&key).and_then(|s| self.index(*s))
            && self.in_flight.is_none_or(|f| self.chunks[i].seq > f)
        {
            let c = &mut self.chunks[i];
            if c.offset + c.data.len() as u64 == offset {
                let n = (MAX_LOG_CHUNK_BYTES - c.data.len()).min(data.len());
                c.data.extend_from_slice(&data[..n]);
                self.bytes += n;
                data = &data[n..];
                at += n as u64;
            }
        }
        for piece in data.chunks(MAX_LOG_CHUNK_BYTES) {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.chunks.push_back(Waiting {
                seq,
                key,
                offset: at,
                data: piece.to_vec(),
            });
            self.last_of.insert(key, seq);
            self.bytes += piece.len();
            at += piece.len() as u64;
        }
        let mut dropped = 0u64;
        while self.bytes > self.max {
            let Some(c) = self.chunks.pop_front() else {
                break;
            };
            self.bytes -= c.data.len();
            dropped += c.data.len() as u64;
        }
        self.forget_gone();
        self.dropped += dropped;
        dropped
    }

    fn forget_gone(&mut self) {
        let front = self.chunks.front().map_or(self.next_seq, |c| c.seq);
        self.last_of.retain(|_, s| *s >= front);
    }

    /// `key`'s output is over at `length` bytes.
    pub fn end(&mut self, key: LogKey, length: u64) {
        self.ends.push((key, length));
    }

    /// The next batch to send, oldest output first, at most `max_bytes` of it (and the ends of
    /// attempts, once all of the queue fits in it); `None` when nothing waits. The batch stays
    /// queued until [`Pending::sent`].
    pub fn batch(&mut self, max_bytes: usize) -> Option<(Option<u64>, LogBatch)> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut chunks = Vec::new();
        let mut size = 0usize;
        let mut last = None;
        for c in &self.chunks {
            if !chunks.is_empty() && size + c.data.len() > max_bytes {
                break;
            }
            if chunks.len() >= spotplane_core::agent::MAX_LOG_CHUNKS {
                break;
            }
            size += c.data.len();
            last = Some(c.seq);
            chunks.push(LogChunk {
                job_id: c.key.0,
                replica: c.key.1,
                attempt: c.key.2,
                offset: c.offset,
                data: b64.encode(&c.data),
                eof: false,
            });
        }
        let everything = chunks.len() == self.chunks.len();
        if everything {
            for (key, length) in &self.ends {
                chunks.push(LogChunk {
                    job_id: key.0,
                    replica: key.1,
                    attempt: key.2,
                    offset: *length,
                    data: String::new(),
                    eof: true,
                });
            }
        }
        if chunks.is_empty() {
            return None;
        }
        self.in_flight = last;
        Some((last, LogBatch { chunks }))
    }

    /// The batch whose last chunk was `last` (and, when it carried them, the ends) is stored.
    pub fn sent(&mut self, last: Option<u64>, carried_ends: usize) {
        if let Some(last) = last {
            while self.chunks.front().is_some_and(|c| c.seq <= last) {
                if let Some(c) = self.chunks.pop_front() {
                    self.bytes -= c.data.len();
                }
            }
        }
        self.ends.drain(..carried_ends.min(self.ends.len()));
        self.in_flight = None;
        self.forget_gone();
    }

    /// The batch in flight was not stored: it goes again, as it was.
    pub fn not_sent(&mut self) {
        self.in_flight = None;
    }
}

/// Where batches go: the control plane (a fake in tests).
#[async_trait::async_trait]
pub trait LogPost: Send + Sync {
    async fn post_logs(&self, batch: &LogBatch) -> Result<(), ClientError>;
}

#[async_trait::async_trait]
impl LogPost for ControlPlane {
    async fn post_logs(&self, batch: &LogBatch) -> Result<(), ClientError> {
        self.logs(batch).await
    }
}

/// The agent's queue of output to the control plane; clones share it.
#[derive(Debug, Clone)]
pub struct Shipper {
    pending: Arc<Mutex<Pending>>,
    wake: Arc<Notify>,
}

impl Shipper {
    pub fn new(pending_max: usize) -> Shipper {
        Shipper {
            pending: Arc::new(Mutex::new(Pending::new(pending_max))),
            wake: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn push(&self, key: LogKey, offset: u64, data: &[u8]) {
        let dropped = self.lock().push(key, offset, data);
        if dropped > 0 {
            tracing::warn!(
                job = %key.0,
                replica = key.1,
                dropped,
                "log output dropped: the control plane has not taken it in time"
            );
        }
    }

    /// `key`'s output is over: sent at once.
    pub fn end(&self, key: LogKey, length: u64) {
        self.lock().end(key, length);
        self.wake.notify_one();
    }

    /// Bytes waiting (tests, metrics).
    pub fn waiting(&self) -> usize {
        self.lock().bytes()
    }

    /// Sends what waits every `interval` (at once when an attempt ends) until `cancel`, then
    /// once more for at most `last_try`.
    pub async fn run(
        self,
        to: Arc<dyn LogPost>,
        interval: Duration,
        last_try: Duration,
        cancel: CancellationToken,
    ) {
        let mut backoff = interval;
        loop {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.wake.notified() => {}
                () = cancel.cancelled() => break,
            }
            backoff = match self.drain(to.as_ref()).await {
                Ok(()) => interval,
                Err(e) => {
                    tracing::debug!(error = %e, "log batch not delivered; will retry");
                    (backoff * 2).clamp(interval, Duration::from_secs(10))
                }
            };
        }
        if tokio::time::timeout(last_try, self.drain(to.as_ref()))
            .await
            .is_err()
        {
            tracing::warn!(
                waiting = self.waiting(),
                "log output still waiting at shutdown"
            );
        }
    }

    /// Sends batches until nothing waits or one fails transiently.
    async fn drain(&self, to: &dyn LogPost) -> Result<(), ClientError> {
        loop {
            let next = self.lock().batch(MAX_BATCH_BYTES);
            let Some((last, batch)) = next else {
                return Ok(());
            };
            let ends = batch.chunks.iter().filter(|c| c.eof).count();
            match to.post_logs(&batch).await {
                Ok(()) => self.lock().sent(last, ends),
                Err(e) if e.is_transient() => {
                    self.lock().not_sent();
                    return Err(e);
                }
                Err(e) => {
                    // Refused as it is (a replica the control plane does not place here): it
                    // would be refused again, so it goes.
                    tracing::error!(error = %e, chunks = batch.chunks.len(), "log batch refused; dropped");
                    self.lock().sent(last, ends);
                }
            }
        }
    }
}

/// The capture of one attempt's output, running in a task of its own.
#[derive(Debug)]
pub struct Capture {
    /// Told when the workload's process has exited.
    exited: watch::Sender<bool>,
    /// True once the pipes are read to their end and the file is complete.
    drained: watch::Receiver<bool>,
}

impl Capture {
    /// The workload's process has exited: its pipes are read for at most [`EXIT_GRACE`] more.
    pub fn exited(&self) {
        self.exited.send_replace(true);
    }

    /// Waits until the output is all in `output.log`.
    pub async fn drained(&mut self) {
        // An error means the task is gone, which happens only after it is done.
        let _ = self.drained.wait_for(|d| *d).await;
    }
}

/// Starts reading `stdout` and `stderr` into `log` and the sink's queue and archive.
pub fn capture<O, E>(log: RotatingLog, stdout: O, stderr: E, sink: LogSink) -> Capture
where
    O: AsyncRead + Unpin + Send + 'static,
    E: AsyncRead + Unpin + Send + 'static,
{
    let (exited_tx, exited_rx) = watch::channel(false);
    let (drained_tx, drained_rx) = watch::channel(false);
    tokio::spawn(pump(log, stdout, stderr, sink, exited_rx, drained_tx));
    Capture {
        exited: exited_tx,
        drained: drained_rx,
    }
}

/// Uploads the attempt's finished files in order, one at a time.
fn archiver(store: CheckpointStore, key: LogKey) -> mpsc::Sender<Finished> {
    let (tx, mut rx) = mpsc::channel::<Finished>(4);
    tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            let file = tokio::fs::File::from_std(f.file);
            match store
                .put_log(key.1, key.2, f.seq, file, UPLOAD_BUFFER)
                .await
            {
                Ok(uri) => {
                    tracing::debug!(job = %key.0, replica = key.1, %uri, "log file archived")
                }
                Err(e) => {
                    tracing::warn!(job = %key.0, replica = key.1, file = f.seq, error = %e, "cannot archive a log file")
                }
            }
        }
    });
    tx
}

struct Writer {
    log: RotatingLog,
    sink: LogSink,
    archive: Option<mpsc::Sender<Finished>>,
    failed: bool,
}

impl Writer {
    fn write(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let offset = self.log.offset();
        match self.log.write(data) {
            Ok(Some(done)) => self.archive(done),
            Ok(None) => {}
            Err(e) => {
                if !self.failed {
                    tracing::error!(path = %self.sink.path.display(), error = %e, "cannot write the replica's log file");
                }
                self.failed = true;
            }
        }
        if let Some((ship, key)) = &self.sink.ship {
            ship.push(*key, offset, data);
        }
    }

    fn archive(&self, done: Finished) {
        if let Some(tx) = &self.archive
            && tx.try_send(done).is_err()
        {
            tracing::warn!(path = %self.sink.path.display(), "object storage is behind; a rotated log file is not archived");
        }
    }
}

async fn pump<O, E>(
    log: RotatingLog,
    mut stdout: O,
    mut stderr: E,
    sink: LogSink,
    mut exited: watch::Receiver<bool>,
    drained: watch::Sender<bool>,
) where
    O: AsyncRead + Unpin,
    E: AsyncRead + Unpin,
{
    let archive = match (&sink.archive, &sink.ship) {
        (Some(store), Some((_, key))) => Some(archiver(store.clone(), *key)),
        _ => None,
    };
    let mut w = Writer {
        log,
        sink,
        archive,
        failed: false,
    };
    let (mut out_buf, mut err_buf) = (vec![0u8; READ_BUF], vec![0u8; READ_BUF]);
    let (mut out_lines, mut err_lines) = (LineBuffer::default(), LineBuffer::default());
    let (mut out_open, mut err_open) = (true, true);
    let mut give_up: Option<Instant> = None;
    let mut ready = Vec::with_capacity(LINE_MAX + READ_BUF);
    let far = || Instant::now() + Duration::from_secs(3600);
    while out_open || err_open {
        let due = [out_lines.due(), err_lines.due()]
            .into_iter()
            .flatten()
            .min();
        tokio::select! {
            r = stdout.read(&mut out_buf), if out_open => match r {
                Ok(n) if n > 0 => out_lines.push(&out_buf[..n], Instant::now(), &mut ready),
                _ => {
                    out_open = false;
                    out_lines.flush(&mut ready);
                }
            },
            r = stderr.read(&mut err_buf), if err_open => match r {
                Ok(n) if n > 0 => err_lines.push(&err_buf[..n], Instant::now(), &mut ready),
                _ => {
                    err_open = false;
                    err_lines.flush(&mut ready);
                }
            },
            () = tokio::time::sleep_until(due.unwrap_or_else(far)), if due.is_some() => {
                let now = Instant::now();
                for lines in [&mut out_lines, &mut err_lines] {
                    if lines.due().is_some_and(|d| d <= now) {
                        lines.flush(&mut ready);
                    }
                }
            }
            _ = exited.wait_for(|e| *e), if give_up.is_none() => {
                give_up = Some(Instant::now() + EXIT_GRACE);
            }
            () = tokio::time::sleep_until(give_up.unwrap_or_else(far)), if give_up.is_some() => break,
        }
        w.write(&ready);
        ready.clear();
    }
    out_lines.flush(&mut ready);
    err_lines.flush(&mut ready);
    w.write(&ready);
    let Writer {
        log, sink, archive, ..
    } = w;
    let length = log.offset();
    let last = log.finish();
    if let Some((ship, key)) = &sink.ship {
        ship.end(*key, length);
    }
    drained.send_replace(true);
    match (last, archive) {
        (Ok(done), Some(tx)) => {
            if tx.send(done).await.is_err() {
                tracing::warn!(path = %sink.path.display(), "the log archiver is gone");
            }
        }
        (Err(e), _) => {
            tracing::warn!(path = %sink.path.display(), error = %e, "cannot reopen the log file")
        }
        (Ok(_), None) => {}
    }
}

#[cfg(test)]
mod tests;
