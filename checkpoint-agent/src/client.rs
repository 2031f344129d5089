//! The control plane, as the agent sees it: the calls of the agent protocol.

use std::sync::RwLock;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use spotplane_core::agent::{
    CheckpointReport, CommandResult, Heartbeat, HeartbeatResponse, LogBatch, RegisterRequest,
    RegisterResponse,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Not reached, or no answer in time: try again later.
    #[error("control plane unreachable: {0}")]
    Unreachable(String),
    /// 401: the token is unknown, spent, revoked or expired.
    #[error("control plane refused the token (401): {0}")]
    Unauthorized(String),
    /// 5xx and 409: may go away.
    #[error("control plane answered {status}: {detail}")]
    Transient { status: u16, detail: String },
    /// Other 4xx: this request will not succeed as it is.
    #[error("control plane rejected the request ({status}): {detail}")]
    Rejected { status: u16, detail: String },
    #[error("unreadable answer from the control plane: {0}")]
    Decode(String),
}

impl ClientError {
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable(_) | ClientError::Transient { .. }
        )
    }
}

#[derive(Debug)]
pub struct ControlPlane {
    http: reqwest::Client,
    base: String,
    token: RwLock<String>,
}

impl ControlPlane {
    pub fn new(base: &str, token: String, timeout: Duration) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("spotplane-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        Ok(ControlPlane {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token: RwLock::new(token),
        })
    }

    /// Uses `token` from now on (the node credential after the exchange).
    pub fn set_token(&self, token: String) {
        *self.token.write().unwrap_or_else(|p| p.into_inner()) = token;
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let token = self.token.read().unwrap_or_else(|p| p.into_inner()).clone();
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        if (200..300).contains(&status) {
            return serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()));
        }
        // A problem document says what went wrong; keep it short in logs.
        let detail = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["detail"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(200).collect());
        Err(match status {
            401 => ClientError::Unauthorized(detail),
            409 | 429 | 500..=599 => ClientError::Transient { status, detail },
            _ => ClientError::Rejected { status, detail },
        })
    }

    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, ClientError> {
        self.post("/v1/agent/register", req).await
    }

    pub async fn heartbeat(&self, hb: &Heartbeat) -> Result<HeartbeatResponse, ClientError> {
        self.post("/v1/agent/heartbeat", hb).await
    }

    pub async fn command_result(&self, r: &CommandResult) -> Result<(), ClientError> {
        self.post::<_, serde_json::Value>(&format!("/v1/agent/commands/{}/result", r.command_id), r)
            .await
            .map(|_| ())
    }

    pub async fn checkpoint(&self, r: &CheckpointReport) -> Result<(), ClientError> {
        self.post::<_, serde_json::Value>("/v1/agent/checkpoints", r)
            .await
            .map(|_| ())
    }

    /// Replicas' output ([`crate::logs`]).
    pub async fn logs(&self, batch: &LogBatch) -> Result<(), ClientError> {
        self.post::<_, serde_json::Value>("/v1/agent/logs", batch)
            .await
            .map(|_| ())
    }
}
