//! The control plane, as the agent sees it: the calls of the agent protocol.

use std::sync::RwLock;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use spotplane_core::JobId;
use spotplane_core::agent::{
    AgentSecrets, CheckpointReport, CommandResult, Heartbeat, HeartbeatResponse, LogBatch,
    RegisterRequest, RegisterResponse,
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
        let req = self.http.post(format!("{}{path}", self.base)).json(body);
        let bytes = self.send(req).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Sends a request with the token; the body of a 2xx answer, or the error its status
    /// and problem document say.
    async fn send(&self, req: reqwest::RequestBuilder) -> Result<bytes::Bytes, ClientError> {
        let token = self.token.read().unwrap_or_else(|p| p.into_inner()).clone();
        let resp = req
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        if (200..300).contains(&status) {
            return Ok(bytes);
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

    /// The values of the secrets a job refers to (`GET /v1/agent/jobs/{job_id}/secrets`),
    /// answered while this node holds one of the job's replicas. An answer that does not read
    /// is said without serde's words, which could quote a value.
    pub async fn job_secrets(&self, job_id: JobId) -> Result<AgentSecrets, ClientError> {
        let req = self
            .http
            .get(format!("{}/v1/agent/jobs/{job_id}/secrets", self.base));
        let bytes = self.send(req).await?;
        serde_json::from_slice(&bytes).map_err(|_| {
            ClientError::Decode("the job's secrets are not an AgentSecrets document".into())
        })
    }
}

/// Tries to fetch a job's secrets this many times when the control plane is unreachable or
/// answers 5xx (a deleted secret, a node that holds none of the job, are final).
const SECRETS_ATTEMPTS: u32 = 3;

/// Step 1 of a start (docs/agent.md): the values of the secrets the job refers to, or why the
/// replica cannot start. The reason names secrets and statuses, never a value.
pub async fn fetch_secrets(cp: &ControlPlane, job_id: JobId) -> Result<AgentSecrets, String> {
    fetch_secrets_waiting(cp, job_id, Duration::from_millis(500)).await
}

/// [`fetch_secrets`], waiting `wait` before the first retry and twice as long before each next.
async fn fetch_secrets_waiting(
    cp: &ControlPlane,
    job_id: JobId,
    mut wait: Duration,
) -> Result<AgentSecrets, String> {
    let mut attempt = 1;
    loop {
        match cp.job_secrets(job_id).await {
            Ok(s) => return Ok(s),
            Err(e) if attempt < SECRETS_ATTEMPTS && retry_fetch(&e) => {
                tracing::warn!(job = %job_id, attempt, error = %e, "fetching the job's secrets failed; retrying");
                tokio::time::sleep(wait).await;
                wait *= 2;
                attempt += 1;
            }
            Err(e) => return Err(format!("fetching the job's secrets: {e}")),
        }
    }
}

/// Whether a failed fetch may succeed when sent again: not a conflict (a secret gone), which
/// [`ClientError::is_transient`] counts in for other calls.
fn retry_fetch(e: &ClientError) -> bool {
    match e {
        ClientError::Unreachable(_) => true,
        ClientError::Transient { status, .. } => *status == 429 || *status >= 500,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    const JOB: &str = "0192d4e0-0000-7000-8000-000000000001";

    async fn client(server: &MockServer) -> ControlPlane {
        ControlPlane::new(&server.uri(), "spt_node".into(), Duration::from_secs(5)).expect("client")
    }

    fn job() -> JobId {
        JOB.parse().expect("job id")
    }

    #[tokio::test]
    async fn a_jobs_secrets_are_fetched_with_the_node_credential() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path(format!("/v1/agent/jobs/{JOB}/secrets")))
            .and(header("authorization", "Bearer spt_node"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "env": {"HF_TOKEN": "hf_value"},
                "registry": {"username": "u", "password": "p:w"}
            })))
            .expect(1)
            .mount(&server)
            .await;
        let s = fetch_secrets(&client(&server).await, job())
            .await
            .expect("fetched");
        assert_eq!(s.env.get("HF_TOKEN").map(String::as_str), Some("hf_value"));
        assert_eq!(s.registry.map(|r| r.password), Some("p:w".to_owned()));
    }

    #[tokio::test]
    async fn a_refused_fetch_fails_at_once_with_the_control_planes_reason() {
        for (status, detail) in [
            (
                409,
                "team a no longer has the secrets this job refers to: secrets.HF_TOKEN (hf-token)",
            ),
            (404, "no job on this node"),
        ] {
            let server = MockServer::start().await;
            Mock::given(method("GET"))
                .respond_with(ResponseTemplate::new(status).set_body_json(
                    serde_json::json!({"type": "x", "title": "x", "status": status, "detail": detail}),
                ))
                .expect(1)
                .mount(&server)
                .await;
            let err = fetch_secrets(&client(&server).await, job())
                .await
                .expect_err("refused");
            assert!(
                err.starts_with("fetching the job's secrets") && err.contains(detail),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn a_server_error_is_retried_and_an_unreadable_answer_quotes_nothing() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(503))
            .up_to_n_times(2)
            .expect(2)
            .mount(&server)
            .await;
        // A value where a map belongs: serde would quote it.
        Mock::given(method("GET"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(serde_json::json!({"env": "the-value-itself"})),
            )
            .expect(1)
            .mount(&server)
            .await;
        let err = fetch_secrets_waiting(&client(&server).await, job(), Duration::ZERO)
            .await
            .expect_err("unreadable");
        assert!(err.contains("not an AgentSecrets document"), "{err}");
        assert!(!err.contains("the-value-itself"), "{err}");
    }

    #[test]
    fn only_unreachable_and_server_errors_are_worth_another_fetch() {
        let cases = [
            (ClientError::Unreachable("refused".into()), true),
            (
                ClientError::Transient {
                    status: 503,
                    detail: String::new(),
                },
                true,
            ),
            (
                ClientError::Transient {
                    status: 429,
                    detail: String::new(),
                },
                true,
            ),
            (
                ClientError::Transient {
                    status: 409,
                    detail: String::new(),
                },
                false,
            ),
            (
                ClientError::Rejected {
                    status: 404,
                    detail: String::new(),
                },
                false,
            ),
            (ClientError::Unauthorized(String::new()), false),
            (ClientError::Decode(String::new()), false),
        ];
        for (e, retry) in cases {
            assert_eq!(retry_fetch(&e), retry, "{e}");
        }
    }
}
