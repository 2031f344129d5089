//! The API's HTTP/1 listener: a cap on open connections, a deadline for each request's head,
//! and problem+json for the requests hyper itself refuses.
//!
//! `axum::serve` has neither a header-read timeout nor a connection limit, so one client with
//! a thousand idle or slowly written connections (slowloris) could hold every file descriptor
//! the process has. Here:
//!
//! - at most `server.max_connections` connections are served at once; the next ones wait in
//!   the kernel's accept queue until one closes;
//! - a connection that has not sent a whole request head within `server.header_read_timeout`
//!   of starting to wait for one (idle keep-alive connections included) is closed;
//! - a request head larger than `server.max_header_bytes` is refused by hyper before any
//!   routing, with 431 (or 414 for a request target over 64 KiB, hyper's own limit). hyper
//!   writes those answers itself, with no body; [`ProblemOnParseError`] rewrites them into the
//!   API's problem+json, so every error the API gives has one shape (docs/api.md).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How the listener treats connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
}

/// Serves `app` on `listener` until `cancel`, then lets each open connection finish the request
/// it is on (hyper's graceful shutdown) and returns when all have closed.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ListenerLimits,
    cancel: CancellationToken,
) -> io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let connections = tokio_util::task::TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Some(limits.header_read_timeout))
        .max_buf_size(limits.max_header_bytes.max(8192));
    loop {
        // A free slot first, then a connection: at the cap, new connections wait in the
        // kernel's queue rather than taking a file descriptor each.
        let permit = tokio::select! {
            () = cancel.cancelled() => break,
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors or a connection reset before it was accepted: go on
                    // after a pause rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY");
        }
        let io = TokioIo::new(ProblemOnParseError::new(stream));
        let service = TowerToHyperService::new(app.clone());
        let conn = http.serve_connection(io, service);
        let cancel = cancel.clone();
        connections.spawn(async move {
            let _permit = permit;
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = cancel.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection closed with an error");
            }
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

/// What hyper writes when it refuses a request head itself: a status line and headers with
/// `content-length: 0`, then it closes the connection. The API's own responses to these codes
/// always have a problem+json body, so a head like this comes from hyper.
const REFUSALS: [(&[u8], u16, &str, &str); 3] = [
    (
        b"HTTP/1.1 431 ",
        431,
        "Request Header Fields Too Large",
        "the request's head (request line and headers) is larger than this server accepts",
    ),
    (
        b"HTTP/1.1 414 ",
        414,
        "URI Too Long",
        "the request target is longer than this server accepts (64 KiB at most)",
    ),
    (
        b"HTTP/1.1 400 ",
        400,
        "Bad Request",
        "the request is not well-formed HTTP/1.1",
    ),
];

/// A connection whose writes are passed through, except hyper's own bodiless refusals, which
/// are replaced by the same status with a problem+json body.
pub struct ProblemOnParseError<S> {
    inner: S,
    /// A replacement response still to be written, and how much of it has been.
    pending: Option<(Vec<u8>, usize)>,
}

impl<S> ProblemOnParseError<S> {
    pub fn new(inner: S) -> Self {
        ProblemOnParseError {
            inner,
            pending: None,
        }
    }
}

/// The problem+json response that replaces hyper's refusal in `head`, if it is one.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let (_, status, title, detail) = REFUSALS.iter().find(|(p, ..)| head.starts_with(p))?;
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    let headers = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
    if !headers.contains("\r\ncontent-length: 0") {
        return None;
    }
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
    })
    .to_string();
    Some(
        format!(
            "HTTP/1.1 {status} {title}\r\ncontent-type: application/problem+json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncWrite + Unpin> ProblemOnParseError<S> {
    /// Writes what is left of a replacement; ready once it is all written.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, done)) = &mut self.pending {
            if *done >= bytes.len() {
                self.pending = None;
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*done..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *done += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ProblemOnParseError<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ProblemOnParseError<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Poll::Ready(Err(e)) = this.poll_pending(cx) {
            return Poll::Ready(Err(e));
        }
        if this.pending.is_some() {
            return Poll::Pending;
        }
        if let Some(bytes) = replacement(buf) {
            // hyper's refusal is the last thing on the connection: what it wrote counts as
            // written, and the replacement goes out in its place.
            this.pending = Some((bytes, 0));
            return match this.poll_pending(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Ready(Ok(buf.len())),
            };
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // One buffer at a time, so a refusal is always seen whole at the start of a write.
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        self.poll_write(cx, first)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    const LIMITS: ListenerLimits = ListenerLimits {
        max_connections: 4,
        header_read_timeout: Duration::from_secs(10),
        max_header_bytes: 16 * 1024,
    };

    async fn start(limits: ListenerLimits) -> (std::net::SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let cancel = CancellationToken::new();
        tokio::spawn(serve(listener, app, limits, cancel.clone()));
        (addr, cancel)
    }

    /// Everything the server sends until it closes the connection.
    async fn read_all(c: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// One request; the server may answer and close before it has read it all.
    async fn get(addr: std::net::SocketAddr, target: &str, extra: &str) -> String {
        let c = TcpStream::connect(addr).await.expect("connect");
        let (mut rx, mut tx) = c.into_split();
        let request =
            format!("GET {target} HTTP/1.1\r\nhost: x\r\n{extra}connection: close\r\n\r\n");
        let writer = tokio::spawn(async move {
            let _ = tx.write_all(request.as_bytes()).await;
            tx
        });
        let mut out = Vec::new();
        let _ = rx.read_to_end(&mut out).await;
        let _ = writer.await;
        String::from_utf8_lossy(&out).into_owned()
    }

    // Issue 29 E: 800 idle and 200 slowloris connections stayed open past 45 s, and file
    // descriptors ran out.
    #[tokio::test(start_paused = true)]
    async fn slow_clients_are_cut_off_and_connections_are_capped() {
        let (addr, cancel) = start(LIMITS).await;
        // As many slow clients as the cap, each with half a request head.
        let mut slow = Vec::new();
        for _ in 0..LIMITS.max_connections {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
                .await
                .expect("write");
            slow.push(c);
        }
        // One more client: not served while the slow ones hold every slot.
        let mut next = TcpStream::connect(addr)
            .await
            .expect("the kernel queues it");
        next.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_secs(5), next.read(&mut byte)).await;
        assert!(early.is_err(), "served past the cap: {early:?}");
        // Past the header timeout each slow client is closed without an answer...
        for c in &mut slow {
            let got = tokio::time::timeout(Duration::from_secs(30), read_all(c))
                .await
                .expect("closed by the server");
            assert!(!got.starts_with("HTTP/1.1 200"), "{got}");
        }
        // ...and the waiting one is served.
        let rest = tokio::time::timeout(Duration::from_secs(30), read_all(&mut next))
            .await
            .expect("answered");
        assert!(rest.starts_with("HTTP/1.1 200"), "{rest}");
        cancel.cancel();
    }

    #[tokio::test]
    async fn heads_too_large_get_problem_json() {
        let (addr, cancel) = start(ListenerLimits {
            max_header_bytes: 128 * 1024,
            ..LIMITS
        })
        .await;
        let problem = |answer: &str, status: u16| {
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status} ")),
                "{status}: {answer:.200}"
            );
            assert!(
                answer.contains("content-type: application/problem+json"),
                "{answer:.300}"
            );
            let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
            let v: serde_json::Value = serde_json::from_str(body).expect("a problem body");
            assert_eq!(v["status"], status);
        };
        // A 100 KB query string: past hyper's 64 KiB request-target limit.
        let long = format!("/?q={}", "a".repeat(100 * 1024));
        problem(&get(addr, &long, "").await, 414);
        // A 1 MB one: past the head limit.
        let longer = format!("/?q={}", "a".repeat(1024 * 1024));
        problem(&get(addr, &longer, "").await, 431);
        let header = format!("x-big: {}\r\n", "b".repeat(200 * 1024));
        problem(&get(addr, "/", &header).await, 431);
        // Not HTTP at all.
        let mut c = TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"\x16\x03\x01 hello\r\n\r\n")
            .await
            .expect("write");
        problem(&read_all(&mut c).await, 400);
        // And an ordinary request still works.
        assert!(get(addr, "/", "").await.starts_with("HTTP/1.1 200"));
        cancel.cancel();
    }

    #[test]
    fn only_hypers_bodiless_refusals_are_replaced() {
        let hyper_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Wed, 02 Dec 2026 12:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(replacement(hyper_431).expect("replaced")).expect("utf-8");
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(
            out.contains("content-type: application/problem+json"),
            "{out}"
        );
        let body = out.split("\r\n\r\n").nth(1).expect("body");
        let v: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(v["status"], 431);
        let length: usize = out
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("length");
        assert_eq!(length, body.len());

        let hyper_414 = b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\n";
        assert!(replacement(hyper_414).is_some());
        // The API's own 400 has a body; anything else passes through.
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 87\r\n\r\n";
        assert!(replacement(ours).is_none());
        assert!(replacement(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(replacement(b"{\"HTTP/1.1 431 \"}").is_none());
    }
}
