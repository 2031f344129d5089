use super::*;
use base64::Engine;
use proptest::prelude::*;
use tokio::io::AsyncWriteExt;

fn key(n: u32) -> LogKey {
    (JobId::new_at(1, 1), n, 1)
}

fn decoded(c: &LogChunk) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(&c.data)
        .expect("base64")
}

#[test]
fn lines_are_handed_on_whole_and_a_line_that_never_ends_is_cut() {
    let t = Instant::now();
    let long = vec![b'x'; LINE_MAX + 10];
    // (pushes, what is handed on after them, what waits)
    type Case<'a> = (Vec<&'a [u8]>, Vec<u8>, usize);
    let cases: Vec<Case> = vec![
        (vec![b"one\ntwo\n"], b"one\ntwo\n".to_vec(), 0),
        (vec![b"one\ntw"], b"one\n".to_vec(), 2),
        (vec![b"par", b"tial\n"], b"partial\n".to_vec(), 0),
        // A progress bar redrawn with \r goes through at each redraw.
        (vec![b"\r 10%", b"\r 20%"], b"\r 10%\r".to_vec(), 4),
        (vec![b"no newline"], Vec::new(), 10),
        (vec![&long], vec![b'x'; LINE_MAX], 10),
    ];
    for (pushes, out, waiting) in cases {
        let mut b = LineBuffer::default();
        let mut got = Vec::new();
        for p in &pushes {
            b.push(p, t, &mut got);
        }
        assert_eq!(got, out, "{pushes:?}");
        assert_eq!(b.buf.len(), waiting, "{pushes:?}");
        assert_eq!(b.due().is_some(), waiting > 0, "{pushes:?}");
        let mut rest = Vec::new();
        b.flush(&mut rest);
        assert_eq!(rest.len(), waiting);
        assert_eq!(b.due(), None);
    }
}

#[test]
fn an_incomplete_line_is_due_a_second_after_it_began() {
    let t = Instant::now();
    let mut b = LineBuffer::default();
    let mut out = Vec::new();
    b.push(b"Password: ", t, &mut out);
    b.push(b"still ", t + Duration::from_millis(600), &mut out);
    assert_eq!(b.due(), Some(t + PARTIAL_FLUSH));
    b.push(b"done\nnext", t + Duration::from_millis(900), &mut out);
    assert_eq!(out, b"Password: still done\n");
    assert_eq!(
        b.due(),
        Some(t + Duration::from_millis(900) + PARTIAL_FLUSH)
    );
}

/// A push: runs of `a` of the given lengths, each ended by nothing, `\n` or `\r`.
fn push_of(runs: &[(u16, u8)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (len, end) in runs {
        out.resize(out.len() + usize::from(*len), b'a');
        match end {
            1 => out.push(b'\n'),
            2 => out.push(b'\r'),
            _ => {}
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn line_buffers_lose_and_reorder_nothing_and_hand_on_only_lines_or_cuts(
        pushes in proptest::collection::vec(
            proptest::collection::vec((0u16..20_000, 0u8..3), 0..4),
            0..6,
        )
    ) {
        let pushes: Vec<Vec<u8>> = pushes.iter().map(|p| push_of(p)).collect();
        let t = Instant::now();
        let mut b = LineBuffer::default();
        let mut all = Vec::new();
        for p in &pushes {
            let mut out = Vec::new();
            b.push(p, t, &mut out);
            // What is handed on ends a line, or is a whole cut piece.
            if let Some(last) = out.last() {
                prop_assert!(matches!(last, b'\n' | b'\r') || out.len() >= LINE_MAX);
            }
            prop_assert!(b.buf.len() < LINE_MAX);
            all.extend(out);
        }
        b.flush(&mut all);
        prop_assert_eq!(all, pushes.concat());
    }
}

#[test]
fn the_log_rotates_at_its_size_keeping_the_newest_files_numbered_in_order() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("output.log");
    let mut log = RotatingLog::create(&path, 10, 2).expect("create");
    let mut finished = Vec::new();
    for line in [
        "aaaa\n", "bbbb\n", "cccc\n", "dddd\n", "eeee\n", "ffff\n", "gg\n",
    ] {
        if let Some(f) = log.write(line.as_bytes()).expect("write") {
            finished.push(f);
        }
    }
    assert_eq!(log.offset(), 33);
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|_| "<none>".into());
    assert_eq!(read(&path), "gg\n");
    assert_eq!(read(&numbered(&path, 1)), "eeee\nffff\n");
    assert_eq!(read(&numbered(&path, 2)), "cccc\ndddd\n");
    assert_eq!(read(&numbered(&path, 3)), "<none>", "only two kept");
    // Every file rotated out is readable whatever was renamed or removed since.
    let contents: Vec<(u64, String)> = finished
        .into_iter()
        .chain(std::iter::once(log.finish().expect("finish")))
        .map(|mut f| {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut f.file, &mut s).expect("read");
            (f.seq, s)
        })
        .collect();
    assert_eq!(
        contents,
        [
            (0, "aaaa\nbbbb\n".to_owned()),
            (1, "cccc\ndddd\n".to_owned()),
            (2, "eeee\nffff\n".to_owned()),
            (3, "gg\n".to_owned()),
        ]
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn with_nothing_kept_a_rotated_file_is_still_handed_on() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("output.log");
    let mut log = RotatingLog::create(&path, 4, 0).expect("create");
    assert!(log.write(b"abc\n").expect("write").is_none());
    let mut f = log.write(b"def\n").expect("write").expect("rotated");
    let mut s = String::new();
    std::io::Read::read_to_string(&mut f.file, &mut s).expect("read");
    assert_eq!((f.seq, s.as_str()), (0, "abc\n"));
    assert!(!numbered(&path, 1).exists());
    assert_eq!(std::fs::read_to_string(&path).expect("read"), "def\n");
}

#[test]
fn output_of_one_attempt_grows_one_chunk_until_it_is_sent() {
    let mut p = Pending::new(1 << 20);
    p.push(key(0), 0, b"a\n");
    p.push(key(0), 2, b"b\n");
    p.push(key(1), 0, b"x\n");
    p.push(key(0), 4, b"c\n");
    let (last, batch) = p.batch(MAX_BATCH_BYTES).expect("batch");
    let got: Vec<(u32, u64, Vec<u8>)> = batch
        .chunks
        .iter()
        .map(|c| (c.replica, c.offset, decoded(c)))
        .collect();
    assert_eq!(
        got,
        [(0, 0, b"a\nb\nc\n".to_vec()), (1, 0, b"x\n".to_vec())]
    );
    // While it is in flight, new output is a chunk of its own: a retried batch is the same.
    p.push(key(0), 6, b"d\n");
    p.not_sent();
    let (_, again) = p.batch(MAX_BATCH_BYTES).expect("batch");
    assert_eq!(again.chunks[..2], batch.chunks[..]);
    assert_eq!(again.chunks[2].offset, 6);
    p.sent(last, 0);
    assert_eq!(p.bytes(), 2, "the chunk pushed after the batch still waits");
}

#[test]
fn a_full_queue_drops_the_oldest_output_and_counts_it() {
    let max = MAX_LOG_CHUNK_BYTES;
    let mut p = Pending::new(max);
    let line = vec![b'l'; 1000];
    let mut offset = 0u64;
    let mut dropped = 0u64;
    for r in 0..200u32 {
        // Alternating replicas: nothing coalesces, so whole chunks go.
        dropped += p.push(key(r % 2), offset, &line);
        offset += line.len() as u64;
    }
    assert!(p.bytes() <= max, "{}", p.bytes());
    assert_eq!(dropped, 200 * 1000 - p.bytes() as u64);
    assert_eq!(p.dropped(), dropped);
    // The newest output is what is left, at its own offsets: the gap says what went.
    let (_, batch) = p.batch(usize::MAX).expect("batch");
    let last = batch.chunks.last().expect("chunk");
    assert_eq!(last.offset, 199 * 1000);
    let first = &batch.chunks[0];
    assert_eq!(first.offset, dropped);
}

#[test]
fn the_end_of_an_attempt_goes_only_after_all_of_its_output() {
    let mut p = Pending::new(1 << 20);
    let big = vec![b'z'; MAX_BATCH_BYTES];
    p.push(key(0), 0, &big);
    p.push(key(0), big.len() as u64, b"tail\n");
    p.end(key(0), big.len() as u64 + 5);
    let (last, first) = p.batch(MAX_BATCH_BYTES).expect("batch");
    assert!(first.chunks.iter().all(|c| !c.eof), "not everything fit");
    p.sent(last, 0);
    let (last, second) = p.batch(MAX_BATCH_BYTES).expect("batch");
    let eof = second.chunks.last().expect("chunk");
    assert!(eof.eof && eof.data.is_empty());
    assert_eq!(eof.offset, big.len() as u64 + 5);
    p.sent(last, 1);
    assert!(p.batch(MAX_BATCH_BYTES).is_none());
}

/// A control plane that stores batches, or is unreachable.
#[derive(Default)]
struct Recorder {
    batches: Mutex<Vec<LogBatch>>,
    down: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl LogPost for Recorder {
    async fn post_logs(&self, batch: &LogBatch) -> Result<(), ClientError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ClientError::Unreachable("down".into()));
        }
        self.batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(batch.clone());
        Ok(())
    }
}

impl Recorder {
    fn bytes(&self) -> Vec<u8> {
        self.batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flat_map(|b| b.chunks.iter().flat_map(decoded))
            .collect()
    }

    fn count(&self) -> usize {
        self.batches.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[tokio::test(start_paused = true)]
async fn output_is_shipped_within_an_interval_and_kept_while_the_control_plane_is_down() {
    let shipper = Shipper::new(1 << 20);
    let cp = Arc::new(Recorder::default());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(shipper.clone().run(
        cp.clone(),
        Duration::from_millis(500),
        Duration::from_secs(1),
        cancel.clone(),
    ));
    shipper.push(key(0), 0, b"step=1\n");
    tokio::time::sleep(Duration::from_millis(510)).await;
    assert_eq!(cp.bytes(), b"step=1\n");
    // Nothing new: nothing sent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(cp.count(), 1);
    cp.down.store(true, std::sync::atomic::Ordering::SeqCst);
    shipper.push(key(0), 7, b"step=2\n");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(shipper.waiting(), 7, "kept while unreachable");
    cp.down.store(false, std::sync::atomic::Ordering::SeqCst);
    // Backed off at most 10 s between tries.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(cp.bytes(), b"step=1\nstep=2\n");
    // The end of an attempt goes at once, without waiting for the interval.
    shipper.end(key(0), 14);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let batches = cp.batches.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let last = batches.last().expect("batch");
    assert!(last.chunks.iter().any(|c| c.eof && c.offset == 14));
    cancel.cancel();
    task.await.expect("shipper");
}

#[tokio::test(start_paused = true)]
async fn a_capture_merges_both_streams_by_line_and_ends_after_the_exit_grace() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("output.log");
    let shipper = Shipper::new(1 << 20);
    let sink = LogSink {
        path: path.clone(),
        max_file_bytes: 1 << 20,
        keep: 1,
        ship: Some((shipper.clone(), key(0))),
        archive: None,
    };
    let (mut out_w, out_r) = tokio::io::duplex(64);
    let (mut err_w, err_r) = tokio::io::duplex(64);
    let log = RotatingLog::create(&path, sink.max_file_bytes, sink.keep).expect("log");
    let mut c = capture(log, out_r, err_r, sink);
    out_w.write_all(b"out one, ").await.expect("write");
    tokio::time::sleep(Duration::from_millis(10)).await;
    err_w.write_all(b"err one\n").await.expect("write");
    tokio::time::sleep(Duration::from_millis(10)).await;
    out_w.write_all(b"still out one\n").await.expect("write");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        std::fs::read_to_string(&path).expect("read"),
        "err one\nout one, still out one\n"
    );
    // A prompt without a newline shows after a second.
    err_w.write_all(b"Continue? ").await.expect("write");
    tokio::time::sleep(PARTIAL_FLUSH + Duration::from_millis(10)).await;
    assert!(
        std::fs::read_to_string(&path)
            .expect("read")
            .ends_with("Continue? ")
    );
    // The process exits; a child of it keeps the pipes open: reading stops after the grace.
    c.exited();
    tokio::time::sleep(EXIT_GRACE + Duration::from_millis(10)).await;
    tokio::time::timeout(Duration::from_millis(1), c.drained())
        .await
        .expect("drained after the grace");
    let mut p = shipper.lock();
    let (_, batch) = p.batch(usize::MAX).expect("batch");
    let shipped: Vec<u8> = batch.chunks.iter().flat_map(decoded).collect();
    assert_eq!(shipped, b"err one\nout one, still out one\nContinue? ");
    let eof = batch.chunks.last().expect("eof");
    assert!(eof.eof);
    assert_eq!(eof.offset, shipped.len() as u64);
    drop((out_w, err_w));
}

#[tokio::test]
async fn finished_files_are_archived_under_the_jobs_prefix() {
    let objects = tempfile::tempdir().expect("tmp");
    let store = CheckpointStore::open(&format!("file://{}/jobs/j1", objects.path().display()), &[])
        .expect("store");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("output.log");
    let shipper = Shipper::new(1 << 20);
    let sink = LogSink {
        path: path.clone(),
        max_file_bytes: 64 * 1024,
        keep: 1,
        ship: Some((shipper, (JobId::new_at(1, 1), 2, 3))),
        archive: Some(store),
    };
    let (mut out_w, out_r) = tokio::io::duplex(1024);
    let (err_w, err_r) = tokio::io::duplex(64);
    let log = RotatingLog::create(&path, sink.max_file_bytes, sink.keep).expect("log");
    let mut c = capture(log, out_r, err_r, sink);
    let line = format!("{}\n", "w".repeat(999));
    for _ in 0..100 {
        out_w.write_all(line.as_bytes()).await.expect("write");
    }
    drop((out_w, err_w));
    c.drained().await;
    let base = objects.path().join("jobs/j1/logs/replica-2/attempt-3");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let sizes = loop {
        let sizes: Vec<u64> = (0..2)
            .map(|n| {
                std::fs::metadata(base.join(format!("{n}.log")))
                    .map(|m| m.len())
                    .unwrap_or(0)
            })
            .collect();
        if sizes.iter().sum::<u64>() == 100_000 || std::time::Instant::now() > deadline {
            break sizes;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // 64 KiB a file: 65 lines in the first, the 35 others in the last.
    assert_eq!(sizes, [65_000, 35_000]);
}
