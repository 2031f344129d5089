//! A small typed client of the REST API, used by the CLI and the load generator.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::problem::Problem;

/// An API call that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a problem document.
    #[error("{status}: {}{}", problem.detail.as_deref().unwrap_or(&problem.title), problem.field.as_ref().map(|f| format!(" (field: {f})")).unwrap_or_default())]
    Api {
        status: StatusCode,
        problem: Box<Problem>,
    },
    #[error("cannot reach {url}: {source}")]
    Transport { url: String, source: reqwest::Error },
    #[error("unexpected answer from the server ({status}): {body}")]
    Unexpected { status: StatusCode, body: String },
}

#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    pub fn new(base_url: &str, token: Option<String>) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build()
            .map_err(|e| ClientError::Transport {
                url: base_url.to_owned(),
                source: e,
            })?;
        Ok(Client {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            token,
        })
    }

    pub fn with_token(&self, token: impl Into<String>) -> Client {
        Client {
            http: self.http.clone(),
            base: self.base.clone(),
            token: Some(token.into()),
        }
    }

    /// Sends a request and decodes a success body, or returns the problem.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, T), ClientError> {
        let url = format!("{}{}", self.base, path);
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| ClientError::Transport {
            url: url.clone(),
            source: e,
        })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Transport { url, source: e })?;
        if status.is_success() {
            let body = if bytes.is_empty() {
                b"null".as_slice()
            } else {
                &bytes
            };
            serde_json::from_slice(body)
                .map(|v| (status, v))
                .map_err(|_| ClientError::Unexpected {
                    status,
                    body: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
                })
        } else {
            match serde_json::from_slice::<Problem>(&bytes) {
                Ok(problem) => Err(ClientError::Api {
                    status,
                    problem: Box::new(problem),
                }),
                Err(_) => Err(ClientError::Unexpected {
                    status,
                    body: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
                }),
            }
        }
    }

    /// A GET whose success body is text (CSV exports).
    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let url = format!("{}{}", self.base, path);
        let mut req = self.http.get(&url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|e| ClientError::Transport {
            url: url.clone(),
            source: e,
        })?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| ClientError::Transport { url, source: e })?;
        if status.is_success() {
            return Ok(text);
        }
        match serde_json::from_str::<Problem>(&text) {
            Ok(problem) => Err(ClientError::Api {
                status,
                problem: Box::new(problem),
            }),
            Err(_) => Err(ClientError::Unexpected {
                status,
                body: text.chars().take(500).collect(),
            }),
        }
    }

    /// A GET whose success body is copied to `out` as it arrives, flushed after each piece
    /// (followed logs): no time limit on the whole answer, only on connecting.
    pub async fn stream(
        &self,
        path: &str,
        out: &mut (impl std::io::Write + ?Sized),
    ) -> Result<(), ClientError> {
        let url = format!("{}{}", self.base, path);
        let transport = |source| ClientError::Transport {
            url: url.clone(),
            source,
        };
        // The shared client's 60 s limit is for the whole answer; a follower's has none.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(transport)?;
        let mut req = http.get(&url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let mut resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp.bytes().await.map_err(transport)?;
            return Err(match serde_json::from_slice::<Problem>(&bytes) {
                Ok(problem) => ClientError::Api {
                    status,
                    problem: Box::new(problem),
                },
                Err(_) => ClientError::Unexpected {
                    status,
                    body: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
                },
            });
        }
        while let Some(piece) = resp.chunk().await.map_err(transport)? {
            // A closed pipe (`| head`) ends the copy; it is not the server's error.
            if out.write_all(&piece).and_then(|()| out.flush()).is_err() {
                break;
            }
        }
        Ok(())
    }

    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.call::<Value>(Method::GET, path, None::<&Value>, &[])
            .await
            .map(|(_, v)| v)
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.call::<Value>(Method::POST, path, Some(body), &[])
            .await
            .map(|(_, v)| v)
    }
}
