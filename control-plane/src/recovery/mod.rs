//! Recovery: the pure core that runs a job's replicas through their agents and brings the job
//! back when a cloud takes a node (DESIGN.md "Recovery", "Lifecycles").
//!
//! `plan(now, snapshot, settings) -> Vec<Action>` reads what the store knows — jobs holding
//! capacity with their allocations as the agents last reported them, the nodes under them (a
//! notice and its deadline, when the agent was last heard), the durable checkpoints, the
//! replicas each agent says it runs and the commands not yet answered — and says what to do
//! next. No I/O, no clock; the loop in `reconcile::recovery` writes each action as one
//! transaction, and anything that changed meanwhile is simply seen again next round.
//!
//! The rules, per job:
//! - `admitted`: queue a `start` for every replica (restoring its resume point), then `starting`;
//!   a start that could not be queued yet (the gang's rendezvous needs the address of a node
//!   whose agent has not registered) is queued again in a later round.
//! - `starting`: `running` once every replica runs; back to the queue (no work lost) if a node
//!   goes before it does.
//! - `running`: `succeeded` once every replica exited 0; a replica that exits otherwise is a
//!   failure — requeued after a back-off (`2^(n-1) ×` the base, capped) until the job's retry
//!   limit, then `failed` with the reason; a periodic checkpoint of every replica when its
//!   interval has passed.
//! - a node of the job gets a notice (or is drained): the job goes `draining`; replicas on that
//!   node checkpoint (the agent does so on its own when it saw the notice, else it is sent a
//!   `drain`), replicas of the gang on other nodes are sent a `checkpoint` with the same deadline.
//! - `draining`: once every replica has a durable checkpoint taken since the drain began,
//!   `checkpointed` and back to the queue with those checkpoints as `resume_from`, ahead of its
//!   priority peers. If the deadline passes (or a node dies) first, `lost`: the gang falls back
//!   to its last checkpoint round that every replica completed, and the GPU-seconds since then
//!   are recorded on the job.
//! - a node that dies without notice (the cloud says it is gone, or its agent stopped
//!   heartbeating) takes its jobs to `lost` the same way; a silent node is retired.
//! - a replica an agent still runs but that no live job wants (cancelled, requeued, finished) is
//!   stopped, once.
//!
//! Multi-node gangs restart whole, every replica from the same checkpoint round — unless the
//! job is `elastic`: then, while some replicas survive, only the replicas on the nodes going
//! away leave (each with a checkpoint made in the notice window, else from its own latest
//! checkpoint with the GPU-seconds since recorded as lost); the others run on, the scheduler
//! places the missing replicas again as a new attempt of those replicas, and they start here.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use spotplane_core::agent::ReplicaPhase;
use spotplane_core::rendezvous::PortRange;
use spotplane_core::{CheckpointId, JobId, JobState, NodeId, NodeState};

#[cfg(test)]
mod tests;

/// How a drain caused by a termination notice begins its reason (the store reads it back to
/// tell a cloud's interruption from spotplane's own drains).
pub const CLOUD_DRAIN_REASON: &str = "a node of the job is being taken";

/// Whether a job's drain reason says a cloud's notice caused it.
pub fn is_cloud_drain(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| r.starts_with(CLOUD_DRAIN_REASON))
}

/// The durable checkpoint a replica resumes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResumePoint {
    pub checkpoint_id: CheckpointId,
    /// The manifest's location in the object store.
    pub uri: String,
    pub completed_at: DateTime<Utc>,
}

/// Tunables of the recovery loop.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// A registered agent silent this long has lost its node.
    pub heartbeat_timeout: Duration,
    /// How long after a notice's deadline the reports may still come in.
    pub deadline_grace: Duration,
    /// Back-off after the first failure; doubled each time, up to `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Failures (other than preemptions) a job may have before it ends `failed`.
    pub default_retry_limit: u32,
    /// Time a stopped replica gets between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// Checkpoints of one round finish within this of each other (a round is asked for at once).
    pub round_spread: Duration,
    /// The window a job preempted by the scheduler (no cloud deadline) has to checkpoint.
    pub preempt_window: Duration,
    /// How much earlier than the control plane heard of a notice the agent may have begun
    /// its checkpoint for it (it sees the notice first; clocks differ a little).
    pub notice_skew: Duration,
    /// The ports a gang's rank 0 listens on for its rendezvous (`MASTER_PORT`).
    pub rendezvous_ports: PortRange,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            heartbeat_timeout: Duration::seconds(60),
            deadline_grace: Duration::seconds(15),
            backoff_base: Duration::seconds(30),
            backoff_max: Duration::minutes(30),
            default_retry_limit: 3,
            stop_grace: Duration::seconds(20),
            round_spread: Duration::seconds(60),
            preempt_window: Duration::minutes(5),
            notice_skew: Duration::seconds(5),
            rendezvous_ports: PortRange::default(),
        }
    }
}

/// A node under a job, as far as recovery cares.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub id: NodeId,
    pub state: NodeState,
    /// When the cloud takes it, for a draining node.
    pub notice_deadline: Option<DateTime<Utc>>,
    /// Whether the node's own agent saw the notice (and so checkpoints by itself).
    pub agent_saw_notice: bool,
    /// When the agent saw it (its clock): its checkpoints for it began then.
    pub notice_seen_at: Option<DateTime<Utc>>,
    /// When its agent was last heard; `None` if no agent ever registered.
    pub agent_last_seen: Option<DateTime<Utc>>,
    /// When it began draining, for a draining node.
    pub draining_since: Option<DateTime<Utc>>,
}

/// One replica's place and what its agent last said of it.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocView {
    pub replica: u32,
    pub attempt: u32,
    pub node: NodeId,
    /// GPU-milli this replica holds (1000 per whole GPU; a MIG slice counts its compute share).
    pub gpu_milli: u32,
    pub devices: Vec<String>,
    /// When its start was queued; `None` if not yet.
    pub started_at: Option<DateTime<Utc>>,
    pub phase: Option<ReplicaPhase>,
    pub exit_code: Option<i32>,
    /// Why its start failed (the agent's reason), when it did.
    pub start_error: Option<String>,
}

/// A durable checkpoint of one replica.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointView {
    pub replica: u32,
    pub attempt: u32,
    /// When the agent began it (its clock).
    pub started_at: DateTime<Utc>,
    pub point: ResumePoint,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    pub id: JobId,
    pub state: JobState,
    pub attempt: u32,
    pub replicas: u32,
    /// Survivors run on when some replicas are lost (`JobSpec::elastic`).
    pub elastic: bool,
    pub retry_limit: u32,
    pub failures: u32,
    pub checkpoint_interval: Option<Duration>,
    pub running_since: Option<DateTime<Utc>>,
    pub drain_started_at: Option<DateTime<Utc>>,
    pub checkpoint_requested_at: Option<DateTime<Utc>>,
    pub resume_from: BTreeMap<u32, ResumePoint>,
    pub allocs: Vec<AllocView>,
    /// Durable checkpoints, any order.
    pub durable: Vec<CheckpointView>,
}

/// A replica an agent reports running.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportedReplica {
    pub node: NodeId,
    pub job: JobId,
    pub replica: u32,
    pub attempt: u32,
    pub phase: ReplicaPhase,
}

/// A command sent to a node and not answered yet.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingCommand {
    pub node: NodeId,
    pub kind: PendingKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PendingKind {
    Checkpoint {
        job: JobId,
        replica: u32,
    },
    Stop {
        job: JobId,
        replica: u32,
        attempt: Option<u32>,
    },
    Drain,
    Other,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub jobs: Vec<JobView>,
    /// Every node the jobs use, plus every live node with an agent.
    pub nodes: Vec<NodeView>,
    pub reported: Vec<ReportedReplica>,
    pub pending: Vec<PendingCommand>,
}

/// A replica of an elastic job leaving with its node.
#[derive(Debug, Clone, PartialEq)]
pub struct Dropped {
    pub replica: u32,
    pub attempt: u32,
    /// Where it resumes when placed again; `None`: from the start.
    pub resume_from: Option<ResumePoint>,
}

/// How a run that did not finish goes back to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Every replica checkpointed in time: `checkpointed`, then `queued`.
    Checkpointed,
    /// Work since the resume point is gone: `lost`, then `queued`.
    Lost,
    /// It had not started yet: straight back to `queued`.
    NotStarted,
    /// A failure with retries left: `queued` after the back-off.
    Failure,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Queue a `start` of one replica (and mark its allocation started).
    Start {
        job: JobId,
        node: NodeId,
        replica: u32,
        attempt: u32,
        devices: Vec<String>,
        resume_from: Option<ResumePoint>,
    },
    /// Move a job along its lifecycle (`admitted -> starting`, `starting -> running`,
    /// `running|starting -> draining`, `running -> succeeded`).
    Transition {
        job: JobId,
        from: JobState,
        to: JobState,
        reason: Option<String>,
    },
    /// Ask one replica for a checkpoint (periodic or for a drain elsewhere in its gang).
    Checkpoint {
        job: JobId,
        node: NodeId,
        replica: u32,
        deadline: Option<DateTime<Utc>>,
    },
    /// Tell a node to checkpoint and stop everything (the notice came from the cloud's stream).
    Drain {
        node: NodeId,
        deadline: Option<DateTime<Utc>>,
    },
    /// Stop a replica (that attempt of it) nobody wants any more.
    Stop {
        job: JobId,
        node: NodeId,
        replica: u32,
        attempt: u32,
    },
    /// Put a run that did not finish back in the queue.
    Requeue {
        job: JobId,
        from: JobState,
        how: Requeue,
        resume_from: BTreeMap<u32, ResumePoint>,
        lost_gpu_seconds: i64,
        not_before: Option<DateTime<Utc>>,
        reason: String,
    },
    /// Release the allocations of some replicas of an elastic job whose nodes are going; the
    /// job keeps running on the others and the scheduler places these again.
    DropReplicas {
        job: JobId,
        replicas: Vec<Dropped>,
        lost_gpu_seconds: i64,
        reason: String,
    },
    /// End a job that failed too often.
    Fail {
        job: JobId,
        from: JobState,
        reason: String,
    },
    /// Retire a node whose agent went silent: the work on it is lost.
    NodeLost { node: NodeId, reason: String },
}

/// What every job's rules look at in one round.
struct Round<'a> {
    now: DateTime<Utc>,
    s: &'a Settings,
    nodes: HashMap<NodeId, &'a NodeView>,
    /// Nodes whose agent went silent this round.
    silent: HashSet<NodeId>,
    pending_checkpoint: HashSet<(JobId, u32)>,
    pending_drain: HashSet<NodeId>,
    /// Nodes sent a `drain` this round (one per node, whichever job asks first).
    drains_sent: RefCell<HashSet<NodeId>>,
}

impl Round<'_> {
    fn gone(&self, id: &NodeId) -> bool {
        self.silent.contains(id)
            || self
                .nodes
                .get(id)
                .is_none_or(|n| matches!(n.state, NodeState::Terminating | NodeState::Terminated))
    }

    fn draining(&self, id: &NodeId) -> bool {
        self.nodes
            .get(id)
            .is_some_and(|n| n.state == NodeState::Draining)
    }

    /// A drain command for a draining node whose agent did not see the notice, once.
    fn drain(&self, node: NodeId, deadline: Option<DateTime<Utc>>) -> Option<Action> {
        (!self.pending_drain.contains(&node) && self.drains_sent.borrow_mut().insert(node))
            .then_some(Action::Drain { node, deadline })
    }
}

pub fn plan(now: DateTime<Utc>, snap: &Snapshot, s: &Settings) -> Vec<Action> {
    let mut out = Vec::new();

    // Nodes whose agent went silent.
    let mut silent: HashSet<NodeId> = HashSet::new();
    for n in &snap.nodes {
        if matches!(n.state, NodeState::Ready | NodeState::Draining)
            && let Some(seen) = n.agent_last_seen
            && now - seen > s.heartbeat_timeout
        {
            silent.insert(n.id);
            out.push(Action::NodeLost {
                node: n.id,
                reason: format!(
                    "its agent has been silent since {}",
                    seen.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
            });
        }
    }
    let round = Round {
        now,
        s,
        nodes: snap.nodes.iter().map(|n| (n.id, n)).collect(),
        silent,
        pending_checkpoint: snap
            .pending
            .iter()
            .filter_map(|p| match p.kind {
                PendingKind::Checkpoint { job, replica } => Some((job, replica)),
                _ => None,
            })
            .collect(),
        pending_drain: snap
            .pending
            .iter()
            .filter(|p| p.kind == PendingKind::Drain)
            .map(|p| p.node)
            .collect(),
        drains_sent: RefCell::default(),
    };

    // Replicas the live jobs want, by (job, replica) -> (attempt, node).
    let mut wanted: HashMap<(JobId, u32), (u32, NodeId)> = HashMap::new();

    for j in &snap.jobs {
        if plan_job(&round, j, &mut out) {
            for a in &j.allocs {
                wanted.insert((j.id, a.replica), (a.attempt, a.node));
            }
        }
    }

    // Replicas no live job wants any more: stop them, once.
    let stopping: HashSet<(NodeId, JobId, u32, Option<u32>)> = snap
        .pending
        .iter()
        .filter_map(|p| match p.kind {
            PendingKind::Stop {
                job,
                replica,
                attempt,
            } => Some((p.node, job, replica, attempt)),
            _ => None,
        })
        .collect();
    for r in &snap.reported {
        if r.phase == ReplicaPhase::Exited || round.gone(&r.node) {
            continue;
        }
        let ok = wanted
            .get(&(r.job, r.replica))
            .is_some_and(|(attempt, node)| *attempt == r.attempt && *node == r.node);
        let pending = stopping.contains(&(r.node, r.job, r.replica, Some(r.attempt)))
            || stopping.contains(&(r.node, r.job, r.replica, None));
        if !ok && !pending {
            out.push(Action::Stop {
                job: r.job,
                node: r.node,
                replica: r.replica,
                attempt: r.attempt,
            });
        }
    }
    out
}

/// Plans one job; returns whether its current allocations stay wanted.
fn plan_job(r: &Round, j: &JobView, out: &mut Vec<Action>) -> bool {
    let (now, s, nodes) = (r.now, r.s, &r.nodes);
    let any_gone = j.allocs.iter().any(|a| r.gone(&a.node));
    let notice_deadline = j
        .allocs
        .iter()
        .filter(|a| r.draining(&a.node))
        .filter_map(|a| nodes.get(&a.node).and_then(|n| n.notice_deadline))
        .min();
    let any_draining = j.allocs.iter().any(|a| r.draining(&a.node));

    // An elastic job with survivors lets only the leaving replicas go.
    if j.elastic
        && j.state == JobState::Running
        && (any_gone || any_draining)
        && j.allocs
            .iter()
            .any(|a| !r.gone(&a.node) && !r.draining(&a.node))
    {
        plan_elastic_departures(r, j, out);
        return true;
    }

    match j.state {
        JobState::Admitted | JobState::Starting if any_gone || any_draining => {
            out.push(Action::Requeue {
                job: j.id,
                from: j.state,
                how: Requeue::NotStarted,
                resume_from: j.resume_from.clone(),
                lost_gpu_seconds: 0,
                not_before: None,
                reason: "requeued: its node is going before the job started".into(),
            });
            false
        }
        JobState::Admitted => {
            start_waiting(j, out);
            out.push(Action::Transition {
                job: j.id,
                from: JobState::Admitted,
                to: JobState::Starting,
                reason: None,
            });
            true
        }
        JobState::Starting | JobState::Running => {
            if any_gone {
                // Taken after a notice the agent saw: the checkpoints it made in the window
                // count; collect them as a drain would.
                let noticed = j.allocs.iter().any(|a| {
                    r.gone(&a.node)
                        && nodes
                            .get(&a.node)
                            .is_some_and(|n| n.notice_seen_at.is_some())
                });
                if noticed && j.state == JobState::Running {
                    out.push(Action::Transition {
                        job: j.id,
                        from: JobState::Running,
                        to: JobState::Draining,
                        reason: Some(
                            "a node of the job was taken after its notice; collecting the checkpoints"
                                .into(),
                        ),
                    });
                    drain_commands(r, j, out);
                    return true;
                }
                out.push(lost(now, j, s, "a node of the job was lost without notice"));
                return false;
            }
            if let Some(a) = j
                .allocs
                .iter()
                .find(|a| a.phase == Some(ReplicaPhase::Exited) && a.exit_code != Some(0))
            {
                let why = match (a.exit_code, &a.start_error) {
                    (_, Some(e)) => format!("replica {} could not start: {e}", a.replica),
                    (Some(c), None) => format!("replica {} exited with status {c}", a.replica),
                    (None, None) => format!("replica {} was killed", a.replica),
                };
                out.push(failure(now, j, s, &why));
                return false;
            }
            if j.allocs.len() == j.replicas as usize
                && j.allocs
                    .iter()
                    .all(|a| a.phase == Some(ReplicaPhase::Exited) && a.exit_code == Some(0))
            {
                if j.state == JobState::Starting {
                    out.push(Action::Transition {
                        job: j.id,
                        from: JobState::Starting,
                        to: JobState::Running,
                        reason: None,
                    });
                }
                out.push(Action::Transition {
                    job: j.id,
                    from: JobState::Running,
                    to: JobState::Succeeded,
                    reason: None,
                });
                return false;
            }
            if any_draining {
                out.push(Action::Transition {
                    job: j.id,
                    from: j.state,
                    to: JobState::Draining,
                    reason: Some(match notice_deadline {
                        Some(d) => format!(
                            "{CLOUD_DRAIN_REASON} at {}; checkpointing",
                            d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                        ),
                        None => "a node of the job is draining; checkpointing".into(),
                    }),
                });
                drain_commands(r, j, out);
                return true;
            }
            // Replicas of an elastic job placed again while the others run, and any replica
            // whose start had to wait (a gang whose peers' agents had not registered yet).
            start_waiting(j, out);
            if j.state == JobState::Starting
                && j.allocs.iter().all(|a| {
                    matches!(
                        a.phase,
                        Some(ReplicaPhase::Running | ReplicaPhase::Checkpointing)
                    )
                })
            {
                out.push(Action::Transition {
                    job: j.id,
                    from: JobState::Starting,
                    to: JobState::Running,
                    reason: (!j.resume_from.is_empty())
                        .then(|| "resumed from its checkpoint".to_owned()),
                });
                return true;
            }
            if j.state == JobState::Running
                && let Some(every) = j.checkpoint_interval
            {
                let last = [
                    j.checkpoint_requested_at,
                    j.running_since,
                    latest_round(j, s.round_spread).map(|(_, at)| at),
                ]
                .into_iter()
                .flatten()
                .max();
                let busy = j.allocs.iter().any(|a| {
                    a.phase == Some(ReplicaPhase::Checkpointing)
                        || r.pending_checkpoint.contains(&(j.id, a.replica))
                });
                if last.is_some_and(|t| now - t >= every) && !busy {
                    // (A replica placed again and not running yet joins the next round.)
                    for a in j
                        .allocs
                        .iter()
                        .filter(|a| a.phase == Some(ReplicaPhase::Running))
                    {
                        out.push(Action::Checkpoint {
                            job: j.id,
                            node: a.node,
                            replica: a.replica,
                            deadline: Some(now + every.min(Duration::minutes(10))),
                        });
                    }
                }
            }
            true
        }
        JobState::Draining => {
            let since = j.drain_started_at.unwrap_or(now);
            let seen = j
                .allocs
                .iter()
                .filter_map(|a| nodes.get(&a.node).and_then(|n| n.notice_seen_at))
                .min();
            let fresh_from = seen.map_or(since, |t| t.min(since)) - s.notice_skew;
            let asked = j.checkpoint_requested_at.is_some_and(|t| t >= since);
            // A checkpoint counts for the drain if it began after the drain did; the agent starts
            // one on a notice as it reports the notice, so a little clock skew is allowed.
            let fresh: BTreeMap<u32, &ResumePoint> = j
                .allocs
                .iter()
                .filter_map(|a| {
                    j.durable
                        .iter()
                        .filter(|c| {
                            c.replica == a.replica
                                && c.attempt == a.attempt
                                && c.started_at >= fresh_from
                        })
                        .max_by_key(|c| c.point.completed_at)
                        .map(|c| (a.replica, &c.point))
                })
                .collect();
            if !j.allocs.is_empty() && fresh.len() == j.allocs.len() {
                out.push(Action::Requeue {
                    job: j.id,
                    from: JobState::Draining,
                    how: Requeue::Checkpointed,
                    resume_from: fresh.into_iter().map(|(r, p)| (r, p.clone())).collect(),
                    lost_gpu_seconds: 0,
                    not_before: None,
                    reason: "requeued: checkpointed before its node was taken".into(),
                });
                return false;
            }
            let expired = match notice_deadline {
                Some(d) => now > d + s.deadline_grace,
                None => now > since + s.preempt_window + s.deadline_grace,
            };
            // A replica whose node is gone without its checkpoint will never make one; the
            // others (a gang's replicas elsewhere, still uploading) are waited for until the
            // deadline.
            let hopeless = j
                .allocs
                .iter()
                .any(|a| r.gone(&a.node) && !fresh.contains_key(&a.replica));
            if hopeless || expired {
                out.push(lost(
                    now,
                    j,
                    s,
                    "the checkpoint did not become durable before the node was taken",
                ));
                return false;
            }
            if !asked {
                drain_commands(r, j, out);
            }
            true
        }
        _ => true,
    }
}

/// A `start` for every replica of the job not started yet, with its resume point.
fn start_waiting(j: &JobView, out: &mut Vec<Action>) {
    for a in j.allocs.iter().filter(|a| a.started_at.is_none()) {
        out.push(Action::Start {
            job: j.id,
            node: a.node,
            replica: a.replica,
            attempt: a.attempt,
            devices: a.devices.clone(),
            resume_from: j.resume_from.get(&a.replica).cloned(),
        });
    }
}

/// The replicas of an elastic job on nodes that are going: each leaves once it has a checkpoint
/// begun after its node's notice, or when its node is gone (or the deadline passed) without
/// one, falling back to its own latest checkpoint; until then a node whose agent did not see
/// the notice is sent a `drain`. The other replicas are left alone.
fn plan_elastic_departures(r: &Round, j: &JobView, out: &mut Vec<Action>) {
    let (now, s, nodes) = (r.now, r.s, &r.nodes);
    let mut dropped = Vec::new();
    let mut lost_total = 0;
    let mut why = Vec::new();
    for a in &j.allocs {
        let node = nodes.get(&a.node);
        let is_gone = r.gone(&a.node);
        if !is_gone && node.is_none_or(|n| n.state != NodeState::Draining) {
            continue;
        }
        let since = node.and_then(|n| n.notice_seen_at.or(n.draining_since));
        let fresh = since.and_then(|t| {
            j.durable
                .iter()
                .filter(|c| {
                    c.replica == a.replica
                        && c.attempt == a.attempt
                        && c.started_at >= t - s.notice_skew
                })
                .max_by_key(|c| c.point.completed_at)
        });
        if let Some(c) = fresh {
            why.push(format!(
                "replica {} checkpointed before its node went",
                a.replica
            ));
            dropped.push(Dropped {
                replica: a.replica,
                attempt: a.attempt,
                resume_from: Some(c.point.clone()),
            });
            continue;
        }
        let deadline = node.and_then(|n| n.notice_deadline);
        if is_gone || deadline.is_some_and(|d| now > d + s.deadline_grace) {
            let back = replica_latest(j, a.replica);
            let lost = replica_lost_since(now, j, a, back.map(|p| p.completed_at));
            lost_total += lost;
            why.push(format!(
                "replica {} lost with its node, resuming from {} ({lost} GPU-seconds lost)",
                a.replica,
                match back {
                    Some(p) => format!(
                        "its checkpoint of {}",
                        p.completed_at
                            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                    None => "the start".into(),
                }
            ));
            dropped.push(Dropped {
                replica: a.replica,
                attempt: a.attempt,
                resume_from: back.cloned(),
            });
        } else if node.is_some_and(|n| !n.agent_saw_notice)
            && let Some(d) = r.drain(a.node, deadline)
        {
            out.push(d);
        }
    }
    if !dropped.is_empty() {
        out.push(Action::DropReplicas {
            job: j.id,
            replicas: dropped,
            lost_gpu_seconds: lost_total,
            reason: format!("{}; placing them again", why.join("; ")),
        });
    }
}

/// A replica's latest durable checkpoint of any attempt, else what it last resumed from.
fn replica_latest(j: &JobView, replica: u32) -> Option<&ResumePoint> {
    j.durable
        .iter()
        .filter(|c| c.replica == replica)
        .map(|c| &c.point)
        .max_by_key(|p| p.completed_at)
        .or_else(|| j.resume_from.get(&replica))
}

/// GPU-seconds one replica ran since `resume_at` (or since it started).
fn replica_lost_since(
    now: DateTime<Utc>,
    j: &JobView,
    a: &AllocView,
    resume_at: Option<DateTime<Utc>>,
) -> i64 {
    let Some(run) = [j.running_since, a.started_at].into_iter().flatten().max() else {
        return 0;
    };
    let from = resume_at.map_or(run, |r| r.max(run));
    (now - from).num_milliseconds().max(0) * i64::from(a.gpu_milli) / 1_000_000
}

/// The checkpoints a drain needs: replicas on a draining node checkpoint by themselves when
/// their agent saw the notice, else their node is sent a `drain`; every other replica (of the
/// gang elsewhere, or of a job the scheduler preempts) gets a `checkpoint` with the deadline.
fn drain_commands(r: &Round, j: &JobView, out: &mut Vec<Action>) {
    let (now, s, nodes) = (r.now, r.s, &r.nodes);
    let deadline = j
        .allocs
        .iter()
        .filter(|a| r.draining(&a.node))
        .filter_map(|a| nodes.get(&a.node).and_then(|n| n.notice_deadline))
        .min()
        .unwrap_or_else(|| j.drain_started_at.unwrap_or(now) + s.preempt_window);
    for a in &j.allocs {
        if r.gone(&a.node) {
            continue;
        }
        if r.draining(&a.node) {
            if nodes.get(&a.node).is_some_and(|n| !n.agent_saw_notice)
                && let Some(d) = r.drain(a.node, Some(deadline))
            {
                out.push(d);
            }
        } else if !r.pending_checkpoint.contains(&(j.id, a.replica)) {
            out.push(Action::Checkpoint {
                job: j.id,
                node: a.node,
                replica: a.replica,
                deadline: Some(deadline),
            });
        }
    }
}

/// The latest checkpoint round every replica completed: per replica its checkpoint of that
/// round, and when the round ended. A round is the set of checkpoints that
/// finished within `spread` of the earliest of the replicas' latest checkpoints.
fn latest_round(
    j: &JobView,
    spread: Duration,
) -> Option<(BTreeMap<u32, ResumePoint>, DateTime<Utc>)> {
    let mut per: BTreeMap<u32, Vec<&CheckpointView>> = BTreeMap::new();
    for c in &j.durable {
        per.entry(c.replica).or_default().push(c);
    }
    if (0..j.replicas).any(|r| !per.contains_key(&r)) {
        return None;
    }
    // The earliest of the replicas' latest checkpoints bounds the round.
    let bound = per
        .values()
        .filter_map(|v| v.iter().map(|c| c.point.completed_at).max())
        .min()?;
    let mut round = BTreeMap::new();
    let mut end = bound;
    for r in 0..j.replicas {
        let c = per
            .get(&r)?
            .iter()
            .filter(|c| c.point.completed_at <= bound + spread)
            .max_by_key(|c| c.point.completed_at)?;
        end = end.max(c.point.completed_at);
        round.insert(r, c.point.clone());
    }
    Some((round, end))
}

/// The gang's resume point after a run ended without a fresh checkpoint: the latest complete
/// round, else what it resumed from.
fn fallback(j: &JobView, s: &Settings) -> (BTreeMap<u32, ResumePoint>, Option<DateTime<Utc>>) {
    if j.elastic {
        // Each replica from its own latest checkpoint: the group re-forms as they join.
        let points: BTreeMap<u32, ResumePoint> = (0..j.replicas)
            .filter_map(|r| replica_latest(j, r).map(|p| (r, p.clone())))
            .collect();
        let at = points.values().map(|p| p.completed_at).min();
        return (points, at);
    }
    match latest_round(j, s.round_spread) {
        Some((round, at)) => (round, Some(at)),
        None => {
            let at = j.resume_from.values().map(|p| p.completed_at).max();
            (j.resume_from.clone(), at)
        }
    }
}

fn gpu_milli(j: &JobView) -> i64 {
    j.allocs.iter().map(|a| i64::from(a.gpu_milli)).sum()
}

/// GPU-seconds of this run lost by resuming from `points` (of `at`): for an elastic job
/// replica by replica, each from its own point.
fn run_lost(
    now: DateTime<Utc>,
    j: &JobView,
    points: &BTreeMap<u32, ResumePoint>,
    at: Option<DateTime<Utc>>,
) -> i64 {
    if !j.elastic {
        return lost_since(now, j, at);
    }
    j.allocs
        .iter()
        .map(|a| replica_lost_since(now, j, a, points.get(&a.replica).map(|p| p.completed_at)))
        .sum()
}

/// GPU-seconds of this run since `resume_at` (or since it began running).
fn lost_since(now: DateTime<Utc>, j: &JobView, resume_at: Option<DateTime<Utc>>) -> i64 {
    let Some(run) = j.running_since else {
        return 0;
    };
    let from = resume_at.map_or(run, |r| r.max(run));
    let secs = (now - from).num_milliseconds().max(0);
    secs * gpu_milli(j) / 1_000_000
}

fn lost(now: DateTime<Utc>, j: &JobView, s: &Settings, why: &str) -> Action {
    if j.state == JobState::Starting {
        return Action::Requeue {
            job: j.id,
            from: j.state,
            how: Requeue::NotStarted,
            resume_from: j.resume_from.clone(),
            lost_gpu_seconds: 0,
            not_before: None,
            reason: format!("requeued: {why} before the job started"),
        };
    }
    let (resume_from, at) = fallback(j, s);
    let lost = run_lost(now, j, &resume_from, at);
    Action::Requeue {
        job: j.id,
        from: j.state,
        how: Requeue::Lost,
        reason: format!(
            "requeued: {why}; resuming from {}, {lost} GPU-seconds lost",
            match at {
                Some(t) => format!(
                    "the checkpoint of {}",
                    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
                None => "the start".into(),
            }
        ),
        resume_from,
        lost_gpu_seconds: lost,
        not_before: None,
    }
}

fn failure(now: DateTime<Utc>, j: &JobView, s: &Settings, why: &str) -> Action {
    let failures = j.failures + 1;
    if failures > j.retry_limit {
        return Action::Fail {
            job: j.id,
            from: j.state,
            reason: format!(
                "{why}; {failures} failures, over the limit of {} retries",
                j.retry_limit
            ),
        };
    }
    let exp = u32::min(failures - 1, 16);
    let wait = (s.backoff_base * 2_i32.pow(exp)).min(s.backoff_max);
    let (resume_from, at) = fallback(j, s);
    Action::Requeue {
        job: j.id,
        from: j.state,
        how: Requeue::Failure,
        lost_gpu_seconds: run_lost(now, j, &resume_from, at),
        resume_from,
        not_before: Some(now + wait),
        reason: format!(
            "requeued: {why} (failure {failures} of {} allowed); retrying after {} s",
            j.retry_limit + 1,
            wait.num_seconds()
        ),
    }
}
