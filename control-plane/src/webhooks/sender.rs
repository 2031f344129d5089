//! One webhook attempt over HTTP.
//!
//! reqwest with rustls; a total timeout and a connect timeout; no redirects (a redirect could
//! lead anywhere); no proxy from the environment; names resolved by [`GuardedResolver`] and IP
//! literals checked here, so a target refused at subscription time stays refused. Of the
//! answer, the status and `Retry-After` are kept and at most [`MAX_RESPONSE_BYTES`] of the body
//! is read: an endpoint answering without end costs no more memory than that.

use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER, USER_AGENT};
use url::Host;

use super::retry::Outcome;
use super::target::{self, GuardedResolver};
use crate::config::WebhookSettings;

/// The most of a response's body an attempt reads; the rest is never read, so an endpoint
/// answering without end costs this much memory and no more.
pub const MAX_RESPONSE_BYTES: usize = 4096;

/// The most of a failed answer's body the delivery log keeps (in `last_error`).
pub const MAX_ERROR_EXCERPT_CHARS: usize = 256;

/// How long reading that much of the body may take, within the attempt's own timeout.
const BODY_READ_LIMIT: Duration = Duration::from_secs(1);

/// What one attempt sends.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub url: &'a str,
    pub id: &'a str,
    pub timestamp: i64,
    pub signature: &'a str,
    pub body: &'a [u8],
}

#[derive(Debug, Clone)]
pub struct Sender {
    http: reqwest::Client,
    allow_private: bool,
}

impl Sender {
    pub fn new(settings: &WebhookSettings) -> Result<Sender, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(GuardedResolver {
                allow_private: settings.allow_private,
            })
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Sender {
            http,
            allow_private: settings.allow_private,
        })
    }

    pub fn allow_private(&self) -> bool {
        self.allow_private
    }

    /// Sends one attempt; never fails, the outcome says what happened.
    pub async fn send(&self, m: &Message<'_>) -> Outcome {
        let started = tokio::time::Instant::now();
        let fail = |status: Option<u16>, error: String, retry_after: Option<Duration>| Outcome {
            status,
            error: Some(error),
            latency: started.elapsed(),
            retry_after,
        };
        let url = match target::parse(m.url) {
            Ok(u) => u,
            Err(e) => return fail(None, format!("bad target: {e}"), None),
        };
        if !self.allow_private {
            let literal = match url.host() {
                Some(Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
                Some(Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
                _ => None,
            };
            if let Some((ip, why)) = target::first_refused(literal) {
                return fail(None, format!("refused target {ip}: {why}"), None);
            }
        }
        let req = self
            .http
            .post(url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(USER_AGENT, HeaderValue::from_static("spotplane-webhooks/1"))
            .header("webhook-id", m.id)
            .header("webhook-timestamp", m.timestamp.to_string())
            .header("webhook-signature", m.signature)
            .body(m.body.to_vec());
        match req.send().await {
            Ok(resp) => {
                let status = resp.status();
                let retry_after = resp
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                // Only a little of the body is read, however much the endpoint sends.
                let excerpt =
                    read_capped(resp, tokio::time::Instant::now() + BODY_READ_LIMIT).await;
                if status.is_success() {
                    Outcome {
                        status: Some(status.as_u16()),
                        error: None,
                        latency: started.elapsed(),
                        retry_after: None,
                    }
                } else {
                    let error = match excerpt_text(&excerpt) {
                        Some(text) => format!("HTTP {status}: {text}"),
                        None => format!("HTTP {status}"),
                    };
                    fail(Some(status.as_u16()), error, retry_after)
                }
            }
            Err(e) => {
                let what = if e.is_timeout() {
                    "timed out".to_owned()
                } else if e.is_connect() {
                    format!("cannot connect: {}", root_cause(&e))
                } else {
                    format!("request failed: {}", root_cause(&e))
                };
                fail(None, what, None)
            }
        }
    }
}

/// Reads at most [`MAX_RESPONSE_BYTES`] of a response's body, chunk by chunk, and drops the
/// rest unread (the connection is closed rather than drained); a body that fails, or is still
/// coming at `deadline`, keeps what was read.
async fn read_capped(mut resp: reqwest::Response, deadline: tokio::time::Instant) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < MAX_RESPONSE_BYTES {
        match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                let room = MAX_RESPONSE_BYTES - out.len();
                out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(Ok(None) | Err(_)) | Err(_) => break,
        }
    }
    out
}

/// What of a failed answer's body goes into the delivery log: at most
/// [`MAX_ERROR_EXCERPT_CHARS`] characters, one line, control characters replaced.
fn excerpt_text(body: &[u8]) -> Option<String> {
    let text: String = String::from_utf8_lossy(body)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_ERROR_EXCERPT_CHARS)
        .collect();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (!text.is_empty()).then_some(text)
}

/// The innermost error's text (reqwest's own message repeats the URL).
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
