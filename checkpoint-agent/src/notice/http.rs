//! The little HTTP the metadata services need, behind a trait.
//!
//! [`ReqwestMetadata`] is the real one. Tests answer with an axum router called in-process
//! (no sockets), which keeps them deterministic on tokio's paused clock.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;

/// One request to a metadata service, relative to its base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub method: Method,
    /// Path and query after the base URL, without a leading slash, e.g.
    /// `latest/meta-data/spot/instance-action`.
    pub path: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Vec<u8>>,
}

impl MetaRequest {
    pub fn get(path: impl Into<String>) -> Self {
        MetaRequest {
            method: Method::GET,
            path: path.into(),
            headers: Vec::new(),
            body: None,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

/// Its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaResponse {
    pub status: u16,
    pub body: Vec<u8>,
    /// The `ETag` header, which GCP's `wait_for_change` needs back as `last_etag`.
    pub etag: Option<String>,
}

impl MetaResponse {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The service could not be reached at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TransportError(pub String);

/// Sends a request to `base` + `path`.
#[async_trait]
pub trait MetadataHttp: Send + Sync {
    async fn send(&self, base: &str, req: MetaRequest) -> Result<MetaResponse, TransportError>;
}

/// Metadata over reqwest, with a short timeout: the services are link-local and answer in
/// milliseconds; a poll that hangs would only delay the next one.
#[derive(Debug, Clone)]
pub struct ReqwestMetadata {
    client: reqwest::Client,
}

impl ReqwestMetadata {
    pub fn new(timeout: Duration) -> Result<Self, TransportError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // Never through a proxy: the metadata service is link-local.
            .no_proxy()
            .build()
            .map_err(|e| TransportError(e.to_string()))?;
        Ok(ReqwestMetadata { client })
    }
}

/// `base` joined with `path`, with exactly one slash between.
pub fn join(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

#[async_trait]
impl MetadataHttp for ReqwestMetadata {
    async fn send(&self, base: &str, req: MetaRequest) -> Result<MetaResponse, TransportError> {
        let mut r = self.client.request(req.method, join(base, &req.path));
        for (k, v) in req.headers {
            r = r.header(k, v);
        }
        if let Some(b) = req.body {
            r = r.body(b);
        }
        let resp = r.send().await.map_err(|e| TransportError(e.to_string()))?;
        let status = resp.status().as_u16();
        let etag = resp
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Answers are small; more than 1 MiB is not a metadata service.
        let body = resp
            .bytes()
            .await
            .map_err(|e| TransportError(e.to_string()))?;
        if body.len() > 1 << 20 {
            return Err(TransportError(format!(
                "metadata answer of {} bytes",
                body.len()
            )));
        }
        Ok(MetaResponse {
            status,
            body: body.to_vec(),
            etag,
        })
    }
}
