use chrono::TimeZone;
use proptest::prelude::*;
use uuid::Uuid;

use super::*;

fn t(s: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0)
        .single()
        .expect("time")
        + Duration::seconds(s)
}

fn node(n: u128) -> NodeId {
    NodeId(Uuid::from_u128(n))
}

fn job_id(n: u128) -> JobId {
    JobId(Uuid::from_u128(1000 + n))
}

fn ready(n: u128) -> NodeView {
    NodeView {
        id: node(n),
        state: NodeState::Ready,
        notice_deadline: None,
        agent_saw_notice: false,
        notice_seen_at: None,
        agent_last_seen: None,
        draining_since: None,
    }
}

fn alloc(replica: u32, n: u128, phase: Option<ReplicaPhase>) -> AllocView {
    AllocView {
        replica,
        attempt: 1,
        node: node(n),
        gpu_milli: 1000,
        devices: vec!["0".into()],
        started_at: Some(t(0)),
        phase,
        exit_code: None,
        start_error: None,
    }
}

fn point(id: u128, at: i64) -> ResumePoint {
    ResumePoint {
        checkpoint_id: CheckpointId::from_uuid(Uuid::from_u128(id)),
        uri: format!("file:///c/{id}/manifest.json"),
        completed_at: t(at),
    }
}

fn ckpt(replica: u32, id: u128, at: i64) -> CheckpointView {
    CheckpointView {
        replica,
        attempt: 1,
        started_at: t(at - 5),
        point: point(id, at),
    }
}

fn job(state: JobState, allocs: Vec<AllocView>) -> JobView {
    JobView {
        id: job_id(1),
        state,
        attempt: 1,
        replicas: allocs.len() as u32,
        elastic: false,
        retry_limit: 2,
        failures: 0,
        checkpoint_interval: None,
        running_since: Some(t(0)),
        drain_started_at: None,
        checkpoint_requested_at: None,
        resume_from: BTreeMap::new(),
        allocs,
        durable: Vec::new(),
    }
}

fn snap(jobs: Vec<JobView>, nodes: Vec<NodeView>) -> Snapshot {
    Snapshot {
        jobs,
        nodes,
        reported: Vec::new(),
        pending: Vec::new(),
    }
}

fn requeue(a: &[Action]) -> Option<(Requeue, &BTreeMap<u32, ResumePoint>, i64)> {
    a.iter().find_map(|a| match a {
        Action::Requeue {
            how,
            resume_from,
            lost_gpu_seconds,
            ..
        } => Some((*how, resume_from, *lost_gpu_seconds)),
        _ => None,
    })
}

#[test]
fn an_admitted_job_is_started_on_every_replica_with_its_resume_point() {
    let mut j = job(
        JobState::Admitted,
        vec![alloc(0, 1, None), alloc(1, 2, None)],
    );
    for a in &mut j.allocs {
        a.started_at = None;
    }
    j.resume_from.insert(1, point(7, 0));
    let out = plan(
        t(10),
        &snap(vec![j], vec![ready(1), ready(2)]),
        &Settings::default(),
    );
    let starts: Vec<(u32, Option<ResumePoint>)> = out
        .iter()
        .filter_map(|a| match a {
            Action::Start {
                replica,
                resume_from,
                ..
            } => Some((*replica, resume_from.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(starts, vec![(0, None), (1, Some(point(7, 0)))]);
    assert!(out.contains(&Action::Transition {
        job: job_id(1),
        from: JobState::Admitted,
        to: JobState::Starting,
        reason: None
    }));
}

#[test]
fn the_job_lifecycle_follows_what_the_agents_report() {
    let s = Settings::default();
    let nodes = vec![ready(1), ready(2)];
    // (state, phases/exit codes of the two replicas, the transition or outcome expected)
    let running = Some(ReplicaPhase::Running);
    let exited = Some(ReplicaPhase::Exited);
    type Reported = (Option<ReplicaPhase>, Option<i32>);
    let table: Vec<(JobState, [Reported; 2], &str)> = vec![
        (
            JobState::Starting,
            [(running, None), (None, None)],
            "nothing",
        ),
        (
            JobState::Starting,
            [(running, None), (running, None)],
            "running",
        ),
        (
            JobState::Running,
            [(exited, Some(0)), (running, None)],
            "nothing",
        ),
        (
            JobState::Running,
            [(exited, Some(0)), (exited, Some(0))],
            "succeeded",
        ),
        (
            JobState::Starting,
            [(exited, Some(0)), (exited, Some(0))],
            "succeeded",
        ),
        (
            JobState::Running,
            [(exited, Some(3)), (running, None)],
            "retry",
        ),
        (
            JobState::Running,
            [(exited, None), (running, None)],
            "retry",
        ),
    ];
    for (state, replicas, expect) in table {
        let allocs = replicas
            .iter()
            .enumerate()
            .map(|(i, (p, c))| {
                let mut a = alloc(i as u32, i as u128 + 1, *p);
                a.exit_code = *c;
                a
            })
            .collect();
        let out = plan(t(10), &snap(vec![job(state, allocs)], nodes.clone()), &s);
        let got = if out.iter().any(|a| {
            matches!(
                a,
                Action::Transition {
                    to: JobState::Succeeded,
                    ..
                }
            )
        }) {
            "succeeded"
        } else if out.iter().any(|a| {
            matches!(
                a,
                Action::Transition {
                    to: JobState::Running,
                    ..
                }
            )
        }) {
            "running"
        } else if requeue(&out).is_some_and(|r| r.0 == Requeue::Failure) {
            "retry"
        } else if out.is_empty() {
            "nothing"
        } else {
            "other"
        };
        assert_eq!(got, expect, "{state} {replicas:?}: {out:?}");
    }
}

#[test]
fn a_replica_that_could_not_start_fails_the_run_with_the_agents_reason() {
    let s = Settings::default();
    let mut a = alloc(0, 1, Some(ReplicaPhase::Exited));
    a.start_error = Some("pulling localhost:1/nope:1: connection refused".into());
    let mut j = job(JobState::Starting, vec![a]);
    j.failures = 3;
    let out = plan(t(100), &snap(vec![j], vec![ready(1)]), &s);
    match out.as_slice() {
        [Action::Fail { reason, .. }] => {
            assert!(
                reason.contains("replica 0 could not start: pulling localhost:1/nope:1"),
                "{reason}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn failures_back_off_exponentially_then_fail_the_job_with_the_reason() {
    let s = Settings::default();
    let mut a = alloc(0, 1, Some(ReplicaPhase::Exited));
    a.exit_code = Some(2);
    let mut waits = Vec::new();
    for failures in 0..3 {
        let mut j = job(JobState::Running, vec![a.clone()]);
        j.failures = failures;
        let out = plan(t(100), &snap(vec![j], vec![ready(1)]), &s);
        match out.as_slice() {
            [
                Action::Requeue {
                    not_before: Some(nb),
                    how: Requeue::Failure,
                    ..
                },
            ] => waits.push((*nb - t(100)).num_seconds()),
            [Action::Fail { reason, .. }] => {
                assert!(reason.contains("exited with status 2"), "{reason}");
                assert!(reason.contains("3 failures"), "{reason}");
                waits.push(-1);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(waits, vec![30, 60, -1]);
}

#[test]
fn a_notice_drains_the_job_and_checkpoints_the_gang_elsewhere() {
    let mut n1 = ready(1);
    n1.state = NodeState::Draining;
    n1.notice_deadline = Some(t(120));
    n1.agent_saw_notice = true;
    let j = job(
        JobState::Running,
        vec![
            alloc(0, 1, Some(ReplicaPhase::Running)),
            alloc(1, 2, Some(ReplicaPhase::Running)),
        ],
    );
    let out = plan(
        t(10),
        &snap(vec![j.clone()], vec![n1.clone(), ready(2)]),
        &Settings::default(),
    );
    assert!(matches!(
        out[0],
        Action::Transition {
            to: JobState::Draining,
            ..
        }
    ));
    // The noticed node's agent checkpoints by itself; the other replica is asked to.
    assert_eq!(
        out[1..],
        [Action::Checkpoint {
            job: job_id(1),
            node: node(2),
            replica: 1,
            deadline: Some(t(120))
        }]
    );
    // Told by the cloud's stream instead: the node gets a drain, once.
    n1.agent_saw_notice = false;
    let out = plan(
        t(10),
        &snap(vec![j], vec![n1, ready(2)]),
        &Settings::default(),
    );
    assert!(out.contains(&Action::Drain {
        node: node(1),
        deadline: Some(t(120))
    }));
}

#[test]
fn a_draining_job_requeues_from_fresh_checkpoints_or_falls_back_and_counts_lost_work() {
    let s = Settings::default();
    let mut n1 = ready(1);
    n1.state = NodeState::Draining;
    n1.notice_deadline = Some(t(1000 + 120));
    n1.agent_saw_notice = true;
    let mut j = job(
        JobState::Draining,
        vec![
            alloc(0, 1, Some(ReplicaPhase::Checkpointing)),
            alloc(1, 2, Some(ReplicaPhase::Checkpointing)),
        ],
    );
    j.drain_started_at = Some(t(1000));
    j.checkpoint_requested_at = Some(t(1000));
    // A periodic round at 600, then replica 0's drain checkpoint at 1030.
    j.durable = vec![ckpt(0, 1, 600), ckpt(1, 2, 601), ckpt(0, 3, 1030)];
    let nodes = vec![n1, ready(2)];

    // Before the deadline, with replica 1 still uploading: wait.
    let out = plan(t(1100), &snap(vec![j.clone()], nodes.clone()), &s);
    assert_eq!(out, vec![], "waits for the other replica");

    // Replica 1 lands: requeued from the drain round, nothing lost.
    let mut done = j.clone();
    done.durable.push(ckpt(1, 4, 1040));
    let out = plan(t(1100), &snap(vec![done], nodes.clone()), &s);
    let (how, from, lost) = requeue(&out).expect("requeued");
    assert_eq!(how, Requeue::Checkpointed);
    assert_eq!(from.get(&0), Some(&point(3, 1030)));
    assert_eq!(from.get(&1), Some(&point(4, 1040)));
    assert_eq!(lost, 0);

    // The deadline passes first: the whole gang falls back to the periodic round at 600-601
    // (not replica 0's newer checkpoint: a gang restarts from one round), and the 2 GPUs'
    // work since then is lost.
    let out = plan(t(1140), &snap(vec![j], nodes), &s);
    let (how, from, lost) = requeue(&out).expect("requeued");
    assert_eq!(how, Requeue::Lost);
    assert_eq!(from.get(&0), Some(&point(1, 600)));
    assert_eq!(from.get(&1), Some(&point(2, 601)));
    assert_eq!(lost, 2 * (1140 - 601));
}

#[test]
fn a_node_lost_without_notice_requeues_its_jobs_with_the_work_since_the_checkpoint() {
    let s = Settings::default();
    let mut gone = ready(1);
    gone.state = NodeState::Terminated;
    let mut j = job(
        JobState::Running,
        vec![alloc(0, 1, Some(ReplicaPhase::Running))],
    );
    j.durable = vec![ckpt(0, 1, 300)];
    let out = plan(t(500), &snap(vec![j.clone()], vec![gone]), &s);
    let (how, from, lost) = requeue(&out).expect("requeued");
    assert_eq!((how, lost), (Requeue::Lost, 200));
    assert_eq!(from.get(&0), Some(&point(1, 300)));

    // A silent agent: the node is retired and the job requeued the same way.
    let mut silent = ready(1);
    silent.agent_last_seen = Some(t(400));
    let out = plan(t(500), &snap(vec![j.clone()], vec![silent.clone()]), &s);
    assert!(matches!(out[0], Action::NodeLost { .. }));
    assert_eq!(
        requeue(&out).map(|r| (r.0, r.2)),
        Some((Requeue::Lost, 200))
    );
    // Heard from recently: nothing happens.
    silent.agent_last_seen = Some(t(480));
    assert_eq!(plan(t(500), &snap(vec![j], vec![silent]), &s), vec![]);
}

#[test]
fn a_node_taken_after_its_notice_keeps_the_checkpoints_of_the_window() {
    let s = Settings::default();
    // The agent saw the notice at 1000 and checkpointed; the node is gone by the next round.
    let mut gone = ready(1);
    gone.state = NodeState::Terminated;
    gone.notice_seen_at = Some(t(1000));
    let mut j = job(
        JobState::Running,
        vec![
            alloc(0, 1, Some(ReplicaPhase::Running)),
            alloc(1, 2, Some(ReplicaPhase::Running)),
        ],
    );
    j.durable = vec![ckpt(0, 1, 600), ckpt(1, 2, 601), ckpt(0, 3, 1021)];
    let out = plan(
        t(1030),
        &snap(vec![j.clone()], vec![gone.clone(), ready(2)]),
        &s,
    );
    assert!(
        matches!(
            out[0],
            Action::Transition {
                to: JobState::Draining,
                ..
            }
        ),
        "{out:?}"
    );
    assert!(
        matches!(out[1..], [Action::Checkpoint { replica: 1, .. }]),
        "the other replica is asked, the gone node is not: {out:?}"
    );
    // Draining: the gone node's replica has its window checkpoint, the other is still
    // uploading: wait; once it lands, requeued with nothing lost.
    j.state = JobState::Draining;
    j.drain_started_at = Some(t(1030));
    j.checkpoint_requested_at = Some(t(1030));
    assert_eq!(
        plan(
            t(1040),
            &snap(vec![j.clone()], vec![gone.clone(), ready(2)]),
            &s
        ),
        vec![]
    );
    j.durable.push(ckpt(1, 4, 1055));
    let out = plan(
        t(1060),
        &snap(vec![j.clone()], vec![gone.clone(), ready(2)]),
        &s,
    );
    assert_eq!(
        requeue(&out).map(|r| (r.0, r.2)),
        Some((Requeue::Checkpointed, 0)),
        "{out:?}"
    );
    // Without a checkpoint of the window from the gone node's replica: lost at once.
    j.durable
        .retain(|c| c.point.checkpoint_id != CheckpointId::from_uuid(Uuid::from_u128(3)));
    let out = plan(t(1060), &snap(vec![j], vec![gone, ready(2)]), &s);
    assert_eq!(requeue(&out).map(|r| r.0), Some(Requeue::Lost), "{out:?}");
}

#[test]
fn a_job_that_had_not_started_goes_back_without_lost_work() {
    let mut gone = ready(1);
    gone.state = NodeState::Terminated;
    let mut j = job(JobState::Starting, vec![alloc(0, 1, None)]);
    j.running_since = None;
    let out = plan(t(50), &snap(vec![j], vec![gone]), &Settings::default());
    assert_eq!(
        requeue(&out).map(|r| (r.0, r.2)),
        Some((Requeue::NotStarted, 0))
    );
}

#[test]
fn periodic_checkpoints_come_every_interval_and_never_overlap() {
    let s = Settings::default();
    let mut j = job(
        JobState::Running,
        vec![alloc(0, 1, Some(ReplicaPhase::Running))],
    );
    j.checkpoint_interval = Some(Duration::seconds(600));
    let nodes = vec![ready(1)];
    assert_eq!(
        plan(t(599), &snap(vec![j.clone()], nodes.clone()), &s),
        vec![]
    );
    let out = plan(t(600), &snap(vec![j.clone()], nodes.clone()), &s);
    assert!(matches!(
        out.as_slice(),
        [Action::Checkpoint { replica: 0, .. }]
    ));
    // Asked already: not again until the next interval.
    j.checkpoint_requested_at = Some(t(600));
    assert_eq!(
        plan(t(900), &snap(vec![j.clone()], nodes.clone()), &s),
        vec![]
    );
    // One in flight is not doubled.
    let mut busy = j.clone();
    busy.checkpoint_requested_at = Some(t(0));
    busy.allocs[0].phase = Some(ReplicaPhase::Checkpointing);
    assert_eq!(plan(t(1300), &snap(vec![busy], nodes), &s), vec![]);
}

#[test]
fn a_replica_no_live_job_wants_is_stopped_once() {
    let mut s = snap(vec![], vec![ready(1)]);
    s.reported.push(ReportedReplica {
        node: node(1),
        job: job_id(9),
        replica: 0,
        attempt: 1,
        phase: ReplicaPhase::Running,
    });
    let out = plan(t(0), &s, &Settings::default());
    assert_eq!(
        out,
        vec![Action::Stop {
            job: job_id(9),
            node: node(1),
            replica: 0,
            attempt: 1,
        }]
    );
    s.pending.push(PendingCommand {
        node: node(1),
        kind: PendingKind::Stop {
            job: job_id(9),
            replica: 0,
            attempt: Some(1),
        },
    });
    assert_eq!(plan(t(0), &s, &Settings::default()), vec![]);
}

#[test]
fn duplicate_and_late_notices_change_nothing_once_the_job_moved_on() {
    // A node already draining whose job has requeued (no allocation there any more): no action.
    let mut n1 = ready(1);
    n1.state = NodeState::Draining;
    n1.notice_deadline = Some(t(100));
    n1.agent_saw_notice = true;
    assert_eq!(
        plan(t(50), &snap(vec![], vec![n1]), &Settings::default()),
        vec![]
    );
}

proptest! {
    /// Whatever the snapshot, a job is requeued, failed or succeeded at most once per round,
    /// lost work is never negative, and a gang's resume point covers every replica or none.
    #[test]
    fn plans_are_consistent(
        states in prop::collection::vec(0u8..4, 1..6),
        node_states in prop::collection::vec(0u8..4, 3),
        phases in prop::collection::vec((0u8..5, prop::option::of(-1i32..3)), 6),
        ckpts in prop::collection::vec((0u32..3, 0i64..2000), 0..8),
        now in 0i64..3000,
        seen in 0i64..3000,
    ) {
        let nodes: Vec<NodeView> = node_states.iter().enumerate().map(|(i, s)| NodeView {
            id: node(i as u128),
            state: [NodeState::Ready, NodeState::Draining, NodeState::Terminated, NodeState::Booting][*s as usize],
            notice_deadline: (*s == 1).then(|| t(1000)),
            agent_saw_notice: i % 2 == 0,
            notice_seen_at: None,
            agent_last_seen: Some(t(seen)),
            draining_since: (*s == 1).then(|| t(800)),
        }).collect();
        let jobs: Vec<JobView> = states.iter().enumerate().map(|(k, s)| {
            let replicas = (k % 3 + 1) as u32;
            let allocs = (0..replicas).map(|r| {
                let (p, c) = phases[(k + r as usize) % phases.len()];
                let mut a = alloc(r, ((k + r as usize) % 3) as u128, [None, Some(ReplicaPhase::Starting), Some(ReplicaPhase::Running), Some(ReplicaPhase::Checkpointing), Some(ReplicaPhase::Exited)][p as usize]);
                a.exit_code = c;
                a
            }).collect();
            let mut j = job([JobState::Admitted, JobState::Starting, JobState::Running, JobState::Draining][*s as usize], allocs);
            j.id = job_id(k as u128);
            j.replicas = replicas;
            j.elastic = k % 2 == 1;
            j.drain_started_at = Some(t(900));
            j.checkpoint_interval = Some(Duration::seconds(300));
            j.durable = ckpts.iter().enumerate().map(|(i, (r, at))| ckpt(*r, i as u128, *at)).collect();
            j
        }).collect();
        let out = plan(t(now), &snap(jobs.clone(), nodes), &Settings::default());
        let mut ended: HashMap<JobId, usize> = HashMap::new();
        for a in &out {
            match a {
                Action::Requeue { job, resume_from, lost_gpu_seconds, .. } => {
                    *ended.entry(*job).or_default() += 1;
                    prop_assert!(*lost_gpu_seconds >= 0);
                    let j = jobs.iter().find(|j| j.id == *job).expect("job");
                    prop_assert!(j.elastic || resume_from.is_empty()
                        || resume_from.len() == j.replicas as usize || resume_from == &j.resume_from);
                }
                Action::DropReplicas { job, replicas, lost_gpu_seconds, .. } => {
                    *ended.entry(*job).or_default() += 1;
                    prop_assert!(*lost_gpu_seconds >= 0);
                    let j = jobs.iter().find(|j| j.id == *job).expect("job");
                    // Only an elastic job, only some of its replicas, each one it holds.
                    prop_assert!(j.elastic && !replicas.is_empty() && replicas.len() < j.allocs.len());
                    for d in replicas {
                        prop_assert!(j.allocs.iter().any(|a| a.replica == d.replica && a.attempt == d.attempt));
                    }
                }
                Action::Fail { job, .. } | Action::Transition { job, to: JobState::Succeeded, .. } => {
                    *ended.entry(*job).or_default() += 1;
                }
                _ => {}
            }
        }
        prop_assert!(ended.values().all(|n| *n == 1), "{out:?}");
    }
}

fn elastic_gang(nodes: &[u128]) -> JobView {
    let mut j = job(
        JobState::Running,
        nodes
            .iter()
            .enumerate()
            .map(|(r, n)| alloc(r as u32, *n, Some(ReplicaPhase::Running)))
            .collect(),
    );
    j.elastic = true;
    j
}

fn dropped(replica: u32, resume_from: Option<ResumePoint>) -> Dropped {
    Dropped {
        replica,
        attempt: 1,
        resume_from,
    }
}

fn drops(a: &[Action]) -> Vec<(Vec<Dropped>, i64)> {
    a.iter()
        .filter_map(|a| match a {
            Action::DropReplicas {
                replicas,
                lost_gpu_seconds,
                ..
            } => Some((replicas.clone(), *lost_gpu_seconds)),
            _ => None,
        })
        .collect()
}

#[test]
fn an_elastic_gang_keeps_its_survivors_when_a_node_is_lost_without_notice() {
    let mut j = elastic_gang(&[1, 2, 3]);
    j.durable = vec![ckpt(2, 1, 100), ckpt(0, 2, 150), ckpt(2, 3, 40)];
    let mut gone = ready(3);
    gone.state = NodeState::Terminated;
    let out = plan(
        t(400),
        &snap(vec![j], vec![ready(1), ready(2), gone]),
        &Settings::default(),
    );
    // Replica 2 alone leaves, back to its own latest checkpoint; 300 s of one GPU lost.
    assert_eq!(
        drops(&out),
        vec![(vec![dropped(2, Some(point(1, 100)))], 300)]
    );
    assert!(requeue(&out).is_none(), "{out:?}");
    assert!(
        !out.iter().any(|a| matches!(
            a,
            Action::Transition { .. } | Action::Checkpoint { .. } | Action::Stop { .. }
        )),
        "the survivors are left alone: {out:?}"
    );
}

#[test]
fn an_elastic_replica_on_a_noticed_node_leaves_with_its_window_checkpoint() {
    let s = Settings::default();
    let mut noticed = ready(3);
    noticed.state = NodeState::Draining;
    noticed.notice_deadline = Some(t(320));
    noticed.agent_saw_notice = true;
    noticed.notice_seen_at = Some(t(200));
    noticed.draining_since = Some(t(201));
    let mut j = elastic_gang(&[1, 2, 3]);
    j.durable = vec![ckpt(2, 1, 100)];
    let nodes = vec![ready(1), ready(2), noticed.clone()];
    // The agent checkpoints by itself: nothing to do while it uploads, and no gang round.
    assert_eq!(
        plan(t(210), &snap(vec![j.clone()], nodes.clone()), &s),
        vec![]
    );
    // Its checkpoint of the window is durable: it leaves with it, nothing lost.
    j.durable.push(CheckpointView {
        replica: 2,
        attempt: 1,
        started_at: t(200),
        point: point(9, 230),
    });
    let out = plan(t(231), &snap(vec![j.clone()], nodes), &s);
    assert_eq!(
        drops(&out),
        vec![(vec![dropped(2, Some(point(9, 230)))], 0)]
    );
    // A notice from the cloud's stream (the agent did not see it): the node is told to drain,
    // once; past the deadline without a checkpoint the replica falls back and work is lost.
    let mut streamed = noticed;
    streamed.agent_saw_notice = false;
    streamed.notice_seen_at = None;
    j.durable.truncate(1);
    let nodes = vec![ready(1), ready(2), streamed];
    let out = plan(t(210), &snap(vec![j.clone()], nodes.clone()), &s);
    assert_eq!(
        out,
        vec![Action::Drain {
            node: node(3),
            deadline: Some(t(320))
        }]
    );
    let out = plan(t(400), &snap(vec![j], nodes), &s);
    assert_eq!(
        drops(&out),
        vec![(vec![dropped(2, Some(point(1, 100)))], 300)]
    );
}

#[test]
fn an_elastic_gang_that_loses_every_node_restarts_each_replica_from_its_own_checkpoint() {
    let mut j = elastic_gang(&[1, 2]);
    j.durable = vec![ckpt(0, 1, 100), ckpt(1, 2, 200)];
    let mut a = ready(1);
    a.state = NodeState::Terminated;
    let mut b = ready(2);
    b.state = NodeState::Terminated;
    let out = plan(t(400), &snap(vec![j], vec![a, b]), &Settings::default());
    let (how, resume, lost) = requeue(&out).expect("requeued whole");
    assert_eq!(how, Requeue::Lost);
    assert_eq!(
        resume,
        &BTreeMap::from([(0, point(1, 100)), (1, point(2, 200))])
    );
    // Each replica loses what it ran since its own checkpoint: 300 + 200.
    assert_eq!(lost, 500);
    assert!(drops(&out).is_empty());
}

#[test]
fn a_replica_placed_again_is_started_and_the_job_finishes_only_with_every_replica() {
    let mut j = elastic_gang(&[1, 2, 3]);
    for a in &mut j.allocs {
        a.phase = Some(ReplicaPhase::Exited);
        a.exit_code = Some(0);
    }
    // Replica 2 left; the survivors finished first: not done yet.
    let placed_again = j.allocs.pop().expect("three");
    let out = plan(
        t(500),
        &snap(vec![j.clone()], vec![ready(1), ready(2), ready(4)]),
        &Settings::default(),
    );
    assert_eq!(out, vec![], "two of three replicas are not the job");
    // Placed again on node 4 as attempt 2: started with its resume point.
    j.resume_from.insert(2, point(1, 100));
    j.allocs.push(AllocView {
        attempt: 2,
        node: node(4),
        started_at: None,
        phase: None,
        exit_code: None,
        ..placed_again
    });
    let out = plan(
        t(510),
        &snap(vec![j.clone()], vec![ready(1), ready(2), ready(4)]),
        &Settings::default(),
    );
    assert_eq!(
        out,
        vec![Action::Start {
            job: job_id(1),
            node: node(4),
            replica: 2,
            attempt: 2,
            devices: vec!["0".into()],
            resume_from: Some(point(1, 100)),
        }]
    );
    // Once it exits 0 too, the job has succeeded.
    let last = j.allocs.last_mut().expect("three");
    last.started_at = Some(t(510));
    last.phase = Some(ReplicaPhase::Exited);
    last.exit_code = Some(0);
    let out = plan(
        t(900),
        &snap(vec![j], vec![ready(1), ready(2), ready(4)]),
        &Settings::default(),
    );
    assert!(out.contains(&Action::Transition {
        job: job_id(1),
        from: JobState::Running,
        to: JobState::Succeeded,
        reason: None
    }));
}
