//! Replicas' output: agents send it (`POST /v1/agent/logs`), teams read and follow it
//! (`GET /v1/jobs/{id}/logs`).
//!
//! A read streams from the store page by page ([`PAGE`] chunks at a time, at most two pages
//! queued for the connection), never the whole log in memory. A follower waits for new chunks
//! on the job's [`LogHub`] entry, woken as soon as this process stores a chunk of the job, and
//! polls the store every [`LogSettings::poll`] besides, so it also sees chunks another
//! control-plane replica stored. It ends once the attempt has ended and all of its output is
//! sent: the agent's last chunk (`eof`) is stored, or the attempt's allocation was released
//! [`LogSettings::linger`] ago (its node is gone and will send nothing more), or the job ended
//! without the attempt ever being placed.
//!
//! The answer is `text/plain` (the output's bytes as the workload wrote them) unless the request
//! accepts `text/event-stream`: then each chunk is an SSE `log` event whose `id` is the offset
//! after it (a client reconnects with `Last-Event-ID` to go on from there), an `end` event
//! closes the stream, and a comment is sent every [`LogSettings::keep_alive`] while nothing
//! happens. A gap in the offsets (output the agent had to drop) reads as a marker line.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router, routing::post};
use base64::Engine;
use serde::{Deserialize, Serialize};
use spotplane_core::agent::{LogBatch, MAX_LOG_CHUNK_BYTES, MAX_LOG_CHUNKS};
use spotplane_core::{FieldErrors, JobId};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use url::form_urlencoded;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::extract::{Auth, JsonBody};
use super::problem::{ApiError, Problem};
use crate::model::Role;
use crate::store::{LogAttemptStatus, LogRetention, LogRow, NewLogChunk, Store, StoreError};

/// Chunks read from the store at once.
pub const PAGE: u64 = 32;
/// `tail` at most.
pub const MAX_TAIL: u64 = 100_000;

/// How reads and followers behave.
#[derive(Debug, Clone, Copy)]
pub struct LogSettings {
    pub retention: LogRetention,
    /// Followers of one job at once; one more is answered 429.
    pub max_followers_per_job: usize,
    /// How often a follower looks at the store when nothing woke it.
    pub poll: Duration,
    /// How often an idle SSE stream gets a comment.
    pub keep_alive: Duration,
    /// How long after its allocation is released an attempt's output may still arrive.
    pub linger: Duration,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            retention: LogRetention::default(),
            max_followers_per_job: 16,
            poll: Duration::from_secs(1),
            keep_alive: Duration::from_secs(15),
            linger: Duration::from_secs(5),
        }
    }
}

/// Wake-ups of a job's followers, in this process.
#[derive(Debug, Default)]
pub struct LogHub {
    jobs: Mutex<HashMap<JobId, Arc<Notify>>>,
}

/// One follower of a job: holds its place among the job's followers until dropped.
#[derive(Debug)]
pub struct Follower {
    notify: Arc<Notify>,
}

impl LogHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, Arc<Notify>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place among `job`'s followers, if fewer than `max` follow it.
    pub fn follow(&self, job: JobId, max: usize) -> Option<Follower> {
        let mut jobs = self.lock();
        jobs.retain(|_, n| Arc::strong_count(n) > 1);
        let notify = jobs.entry(job).or_default();
        (Arc::strong_count(notify) - 1 < max).then(|| Follower {
            notify: Arc::clone(notify),
        })
    }

    /// How many follow `job` now.
    pub fn followers(&self, job: JobId) -> usize {
        self.lock()
            .get(&job)
            .map_or(0, |n| Arc::strong_count(n) - 1)
    }

    /// New output of `job` is stored.
    pub fn wake(&self, job: JobId) {
        if let Some(n) = self.lock().get(&job) {
            n.notify_waiters();
        }
    }
}

/// The agent's route, under `/v1`.
pub fn routes() -> Router<AppState> {
    Router::new().route("/agent/logs", post(post_logs))
}

/// The answer to a batch: how many chunks it carried.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogBatchStored {
    pub chunks: usize,
}

fn decode_batch(batch: &LogBatch) -> Result<Vec<NewLogChunk>, FieldErrors> {
    let mut errs = FieldErrors::new();
    if batch.chunks.len() > MAX_LOG_CHUNKS {
        errs.push_over(
            "chunks",
            &spotplane_core::limits::LOG_CHUNKS,
            format_args!("has {} chunks", batch.chunks.len()),
        );
        return Err(errs);
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::with_capacity(batch.chunks.len());
    for (i, c) in batch.chunks.iter().enumerate() {
        let data = match b64.decode(&c.data) {
            Ok(d) => d,
            Err(_) => {
                errs.push(format!("chunks[{i}].data"), "must be base64");
                continue;
            }
        };
        if data.len() > MAX_LOG_CHUNK_BYTES {
            errs.push_over(
                format!("chunks[{i}].data"),
                &spotplane_core::limits::LOG_CHUNK_BYTES,
                format_args!("has {} bytes", data.len()),
            );
        }
        if c.eof && !data.is_empty() {
            errs.push(
                format!("chunks[{i}].data"),
                "the last chunk (eof) carries no data",
            );
        }
        if c.offset.saturating_add(data.len() as u64) > i64::MAX as u64 {
            errs.push(format!("chunks[{i}].offset"), "too large");
        }
        if i32::try_from(c.replica).is_err() {
            errs.push(format!("chunks[{i}].replica"), "too large");
        }
        if c.attempt == 0 || i32::try_from(c.attempt).is_err() {
            errs.push(format!("chunks[{i}].attempt"), "must be an attempt, from 1");
        }
        out.push(NewLogChunk {
            job_id: c.job_id,
            replica: c.replica,
            attempt: c.attempt,
            offset: c.offset,
            data,
            eof: c.eof,
        });
    }
    errs.into_result().map(|()| out)
}

#[utoipa::path(post, path = "/v1/agent/logs", tag = "agent", request_body = LogBatch,
    description = "Replicas' output, in order. Each chunk is stored once at its offset: a batch sent again changes nothing. Only the node that runs (or ran) the attempt may send its output.",
    responses((status = 200, body = LogBatchStored),
        (status = 404, body = Problem, description = "An attempt of the batch is not this node's"),
        (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn post_logs(
    State(state): State<AppState>,
    auth: Auth,
    body: JsonBody,
) -> Result<Json<LogBatchStored>, ApiError> {
    let p = auth.require(&[Role::Agent])?;
    let own = p
        .node_id
        .ok_or_else(|| ApiError::Forbidden("this agent token is bound to no node".into()))?;
    let batch: LogBatch = body.parse()?;
    let chunks = decode_batch(&batch).map_err(ApiError::Validation)?;
    let jobs = state
        .store()
        .record_logs(own, &chunks, state.log_settings().retention, state.now())
        .await?;
    for job in jobs {
        state.log_hub().wake(job);
    }
    Ok(Json(LogBatchStored {
        chunks: chunks.len(),
    }))
}

/// What a read asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogQuery {
    /// The replica, from 0 (default 0).
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295_i64)]
    pub replica: Option<u32>,
    /// The attempt, from 1 (default: the replica's latest).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 4294967295_i64)]
    pub attempt: Option<u32>,
    /// Stream until the attempt has ended and all of its output is sent (default false).
    pub follow: Option<bool>,
    /// Start with the last this many lines (0 to 100000; default: all that is kept).
    #[param(minimum = 0, maximum = 100000)]
    pub tail: Option<u64>,
}

fn bad(field: &str, detail: impl Into<String>) -> ApiError {
    ApiError::BadRequest {
        detail: detail.into(),
        field: Some(field.to_owned()),
        limit: None,
    }
}

/// Reads the query string, naming the parameter that is wrong.
pub fn parse_query(query: &str) -> Result<LogQuery, ApiError> {
    let mut q = LogQuery::default();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let number = |what: &str| {
            value
                .parse::<u64>()
                .map_err(|_| bad(&name, format!("must be {what}")))
        };
        let dup = || bad(&name, "given more than once");
        match name.as_ref() {
            "replica" => {
                let n = number("a replica number, from 0")?;
                let n = u32::try_from(n).map_err(|_| bad("replica", "too large"))?;
                if q.replica.replace(n).is_some() {
                    return Err(dup());
                }
            }
            "attempt" => {
                let n = number("an attempt number, from 1")?;
                let n = u32::try_from(n)
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("attempt", "must be an attempt number, from 1"))?;
                if q.attempt.replace(n).is_some() {
                    return Err(dup());
                }
            }
            "follow" => {
                let f = match value.as_ref() {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    _ => return Err(bad("follow", "must be true or false")),
                };
                if q.follow.replace(f).is_some() {
                    return Err(dup());
                }
            }
            "tail" => {
                let n = number(&format!("a number of lines, 0 to {MAX_TAIL}"))?;
                if n > MAX_TAIL {
                    return Err(bad("tail", format!("at most {MAX_TAIL} lines")));
                }
                if q.tail.replace(n).is_some() {
                    return Err(dup());
                }
            }
            other => {
                return Err(bad(
                    other,
                    format!(
                        "unknown parameter {other:?}; this endpoint takes replica, attempt, follow and tail"
                    ),
                ));
            }
        }
    }
    Ok(q)
}

/// How the answer is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Text,
    Sse,
}

fn framing(headers: &HeaderMap) -> Framing {
    let sse = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
        });
    if sse { Framing::Sse } else { Framing::Text }
}

#[utoipa::path(get, path = "/v1/jobs/{id}/logs", tag = "jobs",
    description = "A replica attempt's output (stdout and stderr, merged by line), as much as the control plane keeps (the last 8 MiB per attempt; the agent archives all of it under the job's checkpoint prefix, `logs/replica-<r>/attempt-<a>/<n>.log`). `text/plain` by default; `Accept: text/event-stream` for SSE (`log` events, `id` the offset after each, `Last-Event-ID` to resume, an `end` event, a comment every 15 s). With `follow=true` the answer streams until the attempt has ended and all of its output is sent.",
    params(("id" = String, Path, description = "Job id"), LogQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "SSE: go on after this offset")),
    responses(
        (status = 200, description = "The output", content((String = "text/plain"), (String = "text/event-stream"))),
        (status = 400, body = Problem, description = "A parameter is wrong; `field` names it"),
        (status = 404, body = Problem, description = "No such job (or another team's)"),
        (status = 429, body = Problem, description = "Too many followers of this job")),
    security(("bearer" = [])))]
pub async fn job_logs(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let job_id: JobId = id
        .parse()
        .map_err(|_| ApiError::NotFound(format!("no job {id}")))?;
    let team = match p.role {
        Role::Team => p.team.as_ref().map(|(id, _)| id.as_str()),
        _ => None,
    };
    // Another team's job is not found, before anything about the request is said.
    let job = state.store().get_job(job_id, team).await?;
    let q = parse_query(uri.query().unwrap_or_default())?;
    let replica = q.replica.unwrap_or(0);
    if replica >= job.spec.replicas {
        return Err(bad(
            "replica",
            format!(
                "the job has {} replica(s), numbered from 0",
                job.spec.replicas
            ),
        ));
    }
    let attempt = match q.attempt {
        Some(a) => a,
        None => state
            .store()
            .latest_log_attempt(job_id, replica)
            .await?
            .unwrap_or(1),
    };
    let framing = framing(&headers);
    let resume = match framing {
        Framing::Sse => headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| bad("Last-Event-ID", "must be an id of this stream's events"))
            })
            .transpose()?,
        Framing::Text => None,
    };
    let follow = q.follow.unwrap_or(false);
    let follower = if follow {
        let max = state.log_settings().max_followers_per_job;
        Some(
            state
                .log_hub()
                .follow(job_id, max)
                .ok_or_else(|| ApiError::TooManyRequests {
                    detail: format!("{max} clients follow this job's logs already"),
                    retry_after: Duration::from_secs(10),
                })?,
        )
    } else {
        None
    };
    let prefix = crate::store::checkpoint_prefix(&job.spec, job_id, state.object_store_url());
    let read = Read {
        store: state.store().clone(),
        key: (job_id, replica, attempt),
        start: match (resume, q.tail) {
            (Some(offset), _) => Start::At(offset),
            (None, Some(lines)) => Start::Tail(lines),
            (None, None) => Start::Beginning,
        },
        archive: format!(
            "{}/logs/replica-{replica}/attempt-{attempt}/",
            prefix.trim_end_matches('/')
        ),
        settings: *state.log_settings(),
        clock: state.clock(),
        shutdown: state.shutdown_token(),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(2);
    tokio::spawn(async move {
        let sink = Sink { tx, framing };
        if let Err(e) = read.run(&sink, follower).await {
            tracing::warn!(job = %read.key.0, error = %e, "reading a replica's log failed");
        }
    });
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    }));
    let content_type = match framing {
        Framing::Text => "text/plain; charset=utf-8",
        Framing::Sse => "text/event-stream",
    };
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies (nginx) otherwise hold a streamed answer back.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

/// Where a read begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    Beginning,
    Tail(u64),
    At(u64),
}

/// The connection's side of a read.
struct Sink {
    tx: mpsc::Sender<Bytes>,
    framing: Framing,
}

/// The client went away.
struct Gone;

impl Sink {
    async fn send(&self, b: String) -> Result<(), Gone> {
        self.tx.send(Bytes::from(b)).await.map_err(|_| Gone)
    }
}

/// Turns chunks into the answer's bytes: gap markers, SSE framing, UTF-8 sequences cut between
/// chunks put back together.
#[derive(Debug, Default)]
pub struct Renderer {
    /// The offset of the next byte of output.
    next: u64,
    /// Whether the last byte sent ended a line.
    at_line_start: bool,
    /// SSE: the bytes of an incomplete UTF-8 sequence at the end of the last chunk.
    carry: Vec<u8>,
    sse: bool,
}

impl Renderer {
    pub fn new(from: u64, sse: bool) -> Renderer {
        Renderer {
            next: from,
            at_line_start: true,
            carry: Vec::new(),
            sse,
        }
    }

    pub fn next(&self) -> u64 {
        self.next
    }

    /// The answer's bytes for `row` (empty when it adds nothing).
    pub fn chunk(&mut self, row: &LogRow) -> Vec<u8> {
        if row.end() <= self.next || row.data.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if row.offset > self.next {
            out.extend(self.note(&format!(
                "{} bytes of output were dropped here (the node's agent could not send them in time)",
                row.offset - self.next
            )));
        }
        let skip = usize::try_from(self.next.saturating_sub(row.offset)).unwrap_or(usize::MAX);
        let data = &row.data[skip.min(row.data.len())..];
        self.next = row.end();
        if let Some(last) = data.last() {
            self.at_line_start = *last == b'\n';
        }
        if !self.sse {
            out.extend_from_slice(data);
            return out;
        }
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(data);
        // An incomplete sequence at the end waits for the next chunk; an invalid one is
        // replaced.
        let keep = match std::str::from_utf8(&bytes) {
            Err(e) if e.error_len().is_none() => bytes.len() - e.valid_up_to(),
            _ => 0,
        };
        self.carry = bytes.split_off(bytes.len() - keep);
        let text = String::from_utf8_lossy(&bytes);
        out.extend(sse_event("log", Some(self.next), &text).into_bytes());
        out
    }

    /// A line of spotplane's own, on a line of its own.
    pub fn note(&mut self, text: &str) -> Vec<u8> {
        let line = format!(
            "{}[spotplane: {text}]\n",
            if self.at_line_start { "" } else { "\n" }
        );
        self.at_line_start = true;
        if self.sse {
            sse_event("note", None, &line).into_bytes()
        } else {
            line.into_bytes()
        }
    }
}

/// One SSE event; `text`'s lines (split at `\n`, `\r\n` or `\r`, as SSE reads them) are its
/// `data` lines, which the client joins with `\n`.
pub fn sse_event(kind: &str, id: Option<u64>, text: &str) -> String {
    let mut s = format!("event: {kind}\n");
    if let Some(id) = id {
        s.push_str(&format!("id: {id}\n"));
    }
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    for line in text.split('\n') {
        s.push_str("data: ");
        s.push_str(line);
        s.push('\n');
    }
    s.push('\n');
    s
}

/// Where the last `lines` lines of what is kept begin (tail -n): found by walking back from the
/// newest chunk, page by page.
pub async fn tail_start(
    store: &Store,
    key: (JobId, u32, u32),
    lines: u64,
) -> Result<u64, StoreError> {
    let mut before = u64::MAX;
    let mut seen_last_byte = false;
    let mut newlines = 0u64;
    let mut earliest = None;
    loop {
        let rows = store.log_chunks_before(key, before, PAGE).await?;
        let Some(oldest) = rows.last().map(|r| r.offset) else {
            return Ok(earliest.unwrap_or(0));
        };
        for row in rows.iter().filter(|r| !r.data.is_empty()) {
            if lines == 0 {
                return Ok(row.end());
            }
            for (i, b) in row.data.iter().enumerate().rev() {
                // The newline that ends the last line does not begin another.
                if !seen_last_byte {
                    seen_last_byte = true;
                    if *b == b'\n' {
                        continue;
                    }
                }
                if *b == b'\n' {
                    newlines += 1;
                    if newlines == lines {
                        return Ok(row.offset + i as u64 + 1);
                    }
                }
            }
            earliest = Some(row.offset);
        }
        if rows.len() < PAGE as usize {
            return Ok(earliest.unwrap_or(oldest));
        }
        before = oldest;
    }
}

/// Whether an attempt's output is complete: nothing more will come.
pub fn attempt_over(
    s: &LogAttemptStatus,
    now: chrono::DateTime<chrono::Utc>,
    linger: Duration,
) -> bool {
    let linger = chrono::Duration::from_std(linger).unwrap_or(chrono::Duration::MAX);
    s.eof_at.is_some()
        || s.released_at.is_some_and(|r| now - r >= linger)
        || (!s.placed && s.job_state.is_terminal())
}

/// One read of an attempt's output.
struct Read {
    store: Store,
    key: (JobId, u32, u32),
    start: Start,
    archive: String,
    settings: LogSettings,
    clock: crate::clock::SharedClock,
    shutdown: CancellationToken,
}

impl Read {
    async fn run(&self, sink: &Sink, follower: Option<Follower>) -> Result<(), StoreError> {
        let sse = sink.framing == Framing::Sse;
        let from = match self.start {
            Start::Beginning => 0,
            Start::At(o) => o,
            Start::Tail(lines) => tail_start(&self.store, self.key, lines).await?,
        };
        let mut r = Renderer::new(from, sse);
        let mut first = true;
        let mut keep_alive = tokio::time::interval(self.settings.keep_alive);
        keep_alive.reset();
        loop {
            // Armed before reading, so a chunk stored while this reads still wakes it.
            let notified = follower.as_ref().map(|f| f.notify.notified());
            let mut notified = std::pin::pin!(notified);
            if let Some(n) = notified.as_mut().as_pin_mut() {
                n.enable();
            }
            let over = match &follower {
                None => true,
                Some(_) => attempt_over(
                    &self.store.log_attempt_status(self.key).await?,
                    self.clock.now(),
                    self.settings.linger,
                ),
            };
            let mut query_from = r.next();
            if first && self.start != Start::Beginning {
                // The chunk holding the start may begin before it.
                if let Some(row) = self
                    .store
                    .log_chunks_before(self.key, from + 1, 1)
                    .await?
                    .first()
                {
                    query_from = row.offset;
                }
            }
            loop {
                let rows = self.store.log_chunks(self.key, query_from, PAGE).await?;
                for row in &rows {
                    if first {
                        first = false;
                        if self.start == Start::Beginning && row.offset > 0 && !row.data.is_empty()
                        {
                            let note = r.note(&format!(
                                "the first {} bytes of this attempt's output are no longer kept here; all of it is archived under {}",
                                row.offset, self.archive
                            ));
                            if sink.tx.send(Bytes::from(note)).await.is_err() {
                                return Ok(());
                            }
                            r.next = row.offset;
                        }
                    }
                    let out = r.chunk(row);
                    if !out.is_empty() && sink.tx.send(Bytes::from(out)).await.is_err() {
                        return Ok(());
                    }
                }
                match rows.last() {
                    Some(last) if rows.len() as u64 == PAGE => query_from = last.offset + 1,
                    _ => break,
                }
            }
            if over {
                break;
            }
            tokio::select! {
                () = async { if let Some(n) = notified.as_mut().as_pin_mut() { n.await } } => {}
                () = tokio::time::sleep(self.settings.poll) => {}
                _ = keep_alive.tick() => {
                    if sse && sink.send(": keep-alive\n\n".into()).await.is_err() {
                        return Ok(());
                    }
                }
                () = sink.tx.closed() => return Ok(()),
                () = self.shutdown.cancelled() => break,
            }
        }
        if sse {
            let _ = sink.send(sse_event("end", Some(r.next()), "")).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(offset: u64, data: &[u8]) -> LogRow {
        LogRow {
            offset,
            data: data.to_vec(),
            eof: false,
        }
    }

    #[test]
    fn query_parameters_are_checked_one_by_one_naming_the_wrong_one() {
        let ok = |q: &str| parse_query(q).expect(q);
        assert_eq!(ok(""), LogQuery::default());
        assert_eq!(
            ok("replica=1&attempt=2&follow=true&tail=10"),
            LogQuery {
                replica: Some(1),
                attempt: Some(2),
                follow: Some(true),
                tail: Some(10)
            }
        );
        assert_eq!(ok("follow").follow, Some(true));
        for (q, field) in [
            ("replica=-1", "replica"),
            ("replica=x", "replica"),
            ("replica=99999999999", "replica"),
            ("attempt=0", "attempt"),
            ("follow=yes", "follow"),
            ("tail=100001", "tail"),
            ("tail=1&tail=2", "tail"),
            ("since=1h", "since"),
        ] {
            let p = parse_query(q).expect_err(q).to_problem();
            assert_eq!((p.status, p.field.as_deref()), (400, Some(field)), "{q}");
        }
    }

    #[test]
    fn a_gap_in_the_offsets_reads_as_a_marker_line_with_the_bytes_dropped() {
        let mut r = Renderer::new(0, false);
        let mut out = r.chunk(&row(0, b"step=1\nstep="));
        out.extend(r.chunk(&row(12, b"2\n")));
        // A chunk stored twice, or already sent, adds nothing.
        out.extend(r.chunk(&row(12, b"2\n")));
        out.extend(r.chunk(&row(100, b"step=9\n")));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "step=1\nstep=2\n[spotplane: 86 bytes of output were dropped here (the node's agent could not send them in time)]\nstep=9\n"
        );
        assert_eq!(r.next(), 107);
        // Mid-line, the marker starts a line of its own.
        let mut r = Renderer::new(0, false);
        let mut out = r.chunk(&row(0, b"half"));
        out.extend(r.chunk(&row(10, b"x\n")));
        assert!(String::from_utf8_lossy(&out).starts_with("half\n[spotplane: 6 bytes"));
    }

    #[test]
    fn a_read_from_the_middle_of_a_chunk_skips_what_comes_before() {
        let mut r = Renderer::new(4, false);
        assert_eq!(r.chunk(&row(0, b"abc\ndef\n")), b"def\n");
    }

    #[test]
    fn sse_events_carry_lines_and_put_cut_utf8_back_together() {
        assert_eq!(
            sse_event("log", Some(5), "a\nb\n"),
            "event: log\nid: 5\ndata: a\ndata: b\ndata: \n\n"
        );
        assert_eq!(
            sse_event("log", None, "\r 10%\r 20%"),
            "event: log\ndata: \ndata:  10%\ndata:  20%\n\n"
        );
        let snow = "é".as_bytes();
        let mut r = Renderer::new(0, true);
        let first = String::from_utf8(r.chunk(&row(0, &[b'a', snow[0]]))).expect("utf8");
        let second = String::from_utf8(r.chunk(&row(2, &[snow[1], b'\n']))).expect("utf8");
        assert_eq!(first, "event: log\nid: 2\ndata: a\n\n");
        assert_eq!(second, "event: log\nid: 4\ndata: é\ndata: \n\n");
    }

    #[test]
    fn an_attempt_is_over_at_its_last_chunk_or_a_while_after_its_node_let_go() {
        let now =
            chrono::DateTime::<chrono::Utc>::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        let linger = Duration::from_secs(5);
        let running = LogAttemptStatus {
            placed: true,
            released_at: None,
            eof_at: None,
            job_state: spotplane_core::JobState::Running,
        };
        let cases = [
            (running.clone(), false),
            (
                LogAttemptStatus {
                    eof_at: Some(10),
                    ..running.clone()
                },
                true,
            ),
            (
                LogAttemptStatus {
                    released_at: Some(now - chrono::Duration::seconds(2)),
                    ..running.clone()
                },
                false,
            ),
            (
                LogAttemptStatus {
                    released_at: Some(now - chrono::Duration::seconds(6)),
                    ..running.clone()
                },
                true,
            ),
            (
                LogAttemptStatus {
                    placed: false,
                    job_state: spotplane_core::JobState::Queued,
                    ..running.clone()
                },
                false,
            ),
            (
                LogAttemptStatus {
                    placed: false,
                    job_state: spotplane_core::JobState::Cancelled,
                    ..running.clone()
                },
                true,
            ),
        ];
        for (s, over) in cases {
            assert_eq!(attempt_over(&s, now, linger), over, "{s:?}");
        }
    }

    #[test]
    fn a_job_has_at_most_so_many_followers_and_a_place_frees_when_one_goes() {
        let hub = LogHub::default();
        let job = JobId::new_at(1, 1);
        let a = hub.follow(job, 2).expect("first");
        let _b = hub.follow(job, 2).expect("second");
        assert!(hub.follow(job, 2).is_none());
        assert_eq!(hub.followers(job), 2);
        drop(a);
        assert!(hub.follow(job, 2).is_some());
        assert_eq!(hub.followers(JobId::new_at(2, 2)), 0);
    }
}
