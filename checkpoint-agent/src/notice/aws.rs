//! AWS: the EC2 instance metadata service, IMDSv2 only.
//!
//! A session token comes from `PUT /latest/api/token` with
//! `X-aws-ec2-metadata-token-ttl-seconds`, and goes with every read as
//! `X-aws-ec2-metadata-token`. `spot/instance-action` answers
//! `{"action": "terminate", "time": "…Z"}` two minutes ahead (404 while nothing is pending);
//! `events/recommendations/rebalance` answers `{"noticeTime": "…"}`, an early warning without
//! a deadline. An instance action wins over a rebalance recommendation.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde::Deserialize;
use spotplane_core::agent::{NoticeAction, NoticeSource as Source, TerminationNotice};

use super::{MetaRequest, MetadataHttp, NoticeError, NoticeSource};

pub const TOKEN_PATH: &str = "latest/api/token";
pub const INSTANCE_ACTION_PATH: &str = "latest/meta-data/spot/instance-action";
pub const REBALANCE_PATH: &str = "latest/meta-data/events/recommendations/rebalance";
/// Session tokens live six hours (the maximum); a new one is fetched well before.
const TOKEN_TTL_SECS: i64 = 21_600;

#[derive(Debug, Deserialize)]
struct InstanceAction {
    action: String,
    time: DateTime<Utc>,
}

/// Read to check the answer's shape; the agent stamps its own time on what it sees.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rebalance {
    #[allow(dead_code)]
    notice_time: DateTime<Utc>,
}

pub struct AwsImds {
    http: Arc<dyn MetadataHttp>,
    base: String,
    token: Mutex<Option<(String, DateTime<Utc>)>>,
}

impl AwsImds {
    pub fn new(http: Arc<dyn MetadataHttp>, base: &str) -> Self {
        AwsImds {
            http,
            base: base.to_owned(),
            token: Mutex::new(None),
        }
    }

    async fn token(&self, now: DateTime<Utc>) -> Result<String, NoticeError> {
        {
            let t = self.token.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((tok, expires)) = t.as_ref()
                && *expires > now + chrono::Duration::seconds(60)
            {
                return Ok(tok.clone());
            }
        }
        let req = MetaRequest {
            method: Method::PUT,
            path: TOKEN_PATH.into(),
            headers: vec![(
                "X-aws-ec2-metadata-token-ttl-seconds",
                TOKEN_TTL_SECS.to_string(),
            )],
            body: None,
        };
        let resp = self.http.send(&self.base, req).await?;
        if resp.status != 200 {
            return Err(NoticeError::Status {
                status: resp.status,
                path: TOKEN_PATH.into(),
            });
        }
        let tok = resp.text().trim().to_owned();
        if tok.is_empty() || tok.len() > 1024 || tok.contains(char::is_whitespace) {
            return Err(NoticeError::Malformed {
                path: TOKEN_PATH.into(),
                reason: "not a session token".into(),
            });
        }
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((tok.clone(), now + chrono::Duration::seconds(TOKEN_TTL_SECS)));
        Ok(tok)
    }

    /// GETs `path` with a session token; `None` on 404. A 401 (token expired, or the service
    /// restarted) gets one fresh token and one more try.
    async fn read(&self, path: &str, now: DateTime<Utc>) -> Result<Option<Vec<u8>>, NoticeError> {
        for attempt in 0..2 {
            let tok = self.token(now).await?;
            let resp = self
                .http
                .send(
                    &self.base,
                    MetaRequest::get(path).header("X-aws-ec2-metadata-token", tok),
                )
                .await?;
            match resp.status {
                200 => return Ok(Some(resp.body)),
                404 => return Ok(None),
                401 if attempt == 0 => {
                    *self.token.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                status => {
                    return Err(NoticeError::Status {
                        status,
                        path: path.into(),
                    });
                }
            }
        }
        Err(NoticeError::Status {
            status: 401,
            path: path.into(),
        })
    }
}

#[async_trait]
impl NoticeSource for AwsImds {
    async fn poll(&self, now: DateTime<Utc>) -> Result<Option<TerminationNotice>, NoticeError> {
        if let Some(body) = self.read(INSTANCE_ACTION_PATH, now).await? {
            let a: InstanceAction =
                serde_json::from_slice(&body).map_err(|e| NoticeError::Malformed {
                    path: INSTANCE_ACTION_PATH.into(),
                    reason: e.to_string(),
                })?;
            let Some(action) = NoticeAction::from_aws_instance_action(&a.action) else {
                return Err(NoticeError::Malformed {
                    path: INSTANCE_ACTION_PATH.into(),
                    reason: format!("unknown action {:?}", a.action),
                });
            };
            return Ok(Some(TerminationNotice {
                source: Source::AwsInstanceAction,
                action,
                deadline: Some(a.time),
                observed_at: now,
                event_id: None,
            }));
        }
        if let Some(body) = self.read(REBALANCE_PATH, now).await? {
            let _: Rebalance =
                serde_json::from_slice(&body).map_err(|e| NoticeError::Malformed {
                    path: REBALANCE_PATH.into(),
                    reason: e.to_string(),
                })?;
            return Ok(Some(TerminationNotice {
                source: Source::AwsRebalance,
                action: NoticeAction::Rebalance,
                deadline: None,
                observed_at: now,
                event_id: None,
            }));
        }
        Ok(None)
    }

    async fn instance_id(&self) -> Option<String> {
        let body = self
            .read("latest/meta-data/instance-id", Utc::now())
            .await
            .ok()??;
        let id = String::from_utf8(body).ok()?.trim().to_owned();
        (!id.is_empty()).then_some(id)
    }

    fn name(&self) -> &'static str {
        "aws-imds"
    }
}
