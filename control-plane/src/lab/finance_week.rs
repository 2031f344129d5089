//! A replayed week on the simulated clouds, kept in the ledger and checked against the clouds'
//! own bills (`spotplane bench finance`, and the test that checks the same).
//!
//! Three teams submit GPU jobs — whole GPUs, 1g MIG slices of H100/A100-80GB GPUs, and shares
//! of a GPU — at a steady random rate. The driver plays the parts not in this build's loops:
//! it buys a node from the simulated clouds when a job does not fit (mostly spot, one in five
//! on-demand), places the job (first fit), starts it, finishes it when its work is done, gives
//! idle nodes back, and when a cloud posts a notice it preempts the node's jobs (every third
//! one misses the window and is lost, the others checkpoint) and ends the node when the cloud
//! takes it. Everything goes through the store's named operations, so the ledger sees exactly
//! what it would in production; the ledger loop runs every simulated hour with the providers'
//! price histories.
//!
//! At the end, every node is given back, the ledger closes, and [`WeekReport`] compares: the
//! ledger's total with the sum of the simulated clouds' bills (exact, in micro-dollars); the
//! teams' usage plus idle with the total; and the FOCUS file's `ListCost - EffectiveCost`
//! with the summary's saving.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use chrono::{DateTime, Duration, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use spotplane_core::job::JobSpec;
use spotplane_core::{
    GpuModel, JobId, JobState, Market, Micros, MigClass, MigInstance, MigLayout, NodeId, NodeState,
    TeamName,
};
use spotplane_providers::registry::Providers;
use spotplane_providers::sim::SimCloud;
use spotplane_providers::{CloudProvider, Offer, ProvisionRequest};

use crate::clock::ManualClock;
use crate::config::FinanceSettings;
use crate::finance::export::{FocusAccount, decimal, parse_csv, to_csv, to_focus_csv};
use crate::finance::ledger::LineKind;
use crate::finance::summary::{GroupBy, summarize};
use crate::reconcile::ledger::LedgerLoop;
use crate::scheduler::{Assigned, Placement};
use crate::store::{NewGpu, NewJob, NewNode, NewTeam, Store, new_uuid};

/// What to replay.
#[derive(Debug, Clone)]
pub struct WeekSpec {
    pub start: DateTime<Utc>,
    pub span: Duration,
    /// Nodes alive at most at once.
    pub max_nodes: usize,
    /// Jobs submitted per simulated hour, on average.
    pub jobs_per_hour: f64,
    pub seed: u64,
}

impl Default for WeekSpec {
    fn default() -> Self {
        WeekSpec {
            start: DateTime::parse_from_rfc3339("2026-07-01T00:00:00Z")
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or_default(),
            span: Duration::days(7),
            max_nodes: 24,
            jobs_per_hour: 4.0,
            seed: 7,
        }
    }
}

/// What happened and whether the books balance.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WeekReport {
    pub simulated_hours: f64,
    pub nodes: usize,
    pub spot_nodes: usize,
    pub jobs: usize,
    pub jobs_succeeded: usize,
    pub preempted_nodes: usize,
    pub checkpointed_runs: usize,
    pub lost_runs: usize,
    pub ledger_lines: usize,
    pub price_points: usize,
    /// The ledger's charges (usage and idle), and the sum of the clouds' bills.
    pub ledger_total: Micros,
    pub cloud_bills_total: Micros,
    pub ledger_on_demand: Micros,
    pub cloud_bills_on_demand: Micros,
    pub saving: Micros,
    pub idle: Micros,
    pub lost_work: Micros,
    pub by_team: BTreeMap<String, Micros>,
    /// `Σ ListCost - Σ EffectiveCost` read back from the FOCUS file.
    pub focus_saving: Micros,
    pub focus_rows: usize,
    /// Every check passed: ledger = bills (cost and on-demand), teams + idle = total, FOCUS
    /// saving = summary saving, every node's lines = its bill.
    pub balanced: bool,
    pub nodes_off: usize,
    pub wall_seconds: f64,
}

#[derive(Debug, Clone)]
enum Want {
    Gpus(u32),
    Mig1g,
    Milli(u32),
}

#[derive(Debug, Clone)]
enum GpuUse {
    Free,
    Whole(JobId),
    Mig([Option<JobId>; 7]),
    Shared(Vec<(JobId, u32)>),
}

struct LiveNode {
    id: NodeId,
    sim: usize,
    provider_id: String,
    gpus: Vec<GpuUse>,
    empty_since: DateTime<Utc>,
    noticed: bool,
}

struct SimJob {
    id: JobId,
    want: Want,
    remaining: Duration,
    node: Option<NodeId>,
}

fn spec_of(name: &str, want: &Want) -> anyhow::Result<JobSpec> {
    let shape = match want {
        Want::Gpus(n) => serde_json::json!({"gpus": n}),
        Want::Mig1g => serde_json::json!({"mig": "1g.10gb", "models": ["H100-80GB", "A100-80GB"]}),
        Want::Milli(m) => serde_json::json!({"gpu_milli": m}),
    };
    Ok(serde_json::from_value(serde_json::json!({
        "name": name, "shape": shape, "command": ["python", "train.py"],
        "checkpoint": {"uri": "file:///tmp/ckpt", "interval_s": 600},
    }))?)
}

fn is_mig_model(m: Option<GpuModel>) -> bool {
    matches!(m, Some(GpuModel::H100_80GB | GpuModel::A100_80GB))
}

/// Places a job on a node's GPUs, first fit.
fn fit(n: &mut LiveNode, mig_node: bool, job: JobId, want: &Want) -> Option<Assigned> {
    match want {
        Want::Gpus(k) if !mig_node => {
            let free: Vec<u32> = n
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, g)| matches!(g, GpuUse::Free))
                .map(|(i, _)| i as u32)
                .take(*k as usize)
                .collect();
            if free.len() < *k as usize {
                return None;
            }
            for i in &free {
                n.gpus[*i as usize] = GpuUse::Whole(job);
            }
            Some(Assigned::Whole(free))
        }
        Want::Mig1g if mig_node => {
            for (i, g) in n.gpus.iter_mut().enumerate() {
                if let GpuUse::Mig(slots) = g
                    && let Some(s) = slots.iter().position(Option::is_none)
                {
                    slots[s] = Some(job);
                    return Some(Assigned::Mig {
                        gpu: i as u32,
                        instance: MigInstance::new(MigClass::G1, s as u8),
                    });
                }
            }
            None
        }
        Want::Milli(m) if !mig_node => {
            for (i, g) in n.gpus.iter_mut().enumerate() {
                match g {
                    GpuUse::Shared(v) if v.iter().map(|x| x.1).sum::<u32>() + m <= 1000 => {
                        v.push((job, *m));
                        return Some(Assigned::Share {
                            gpu: i as u32,
                            milli: *m,
                        });
                    }
                    GpuUse::Free => {
                        *g = GpuUse::Shared(vec![(job, *m)]);
                        return Some(Assigned::Share {
                            gpu: i as u32,
                            milli: *m,
                        });
                    }
                    _ => {}
                }
            }
            None
        }
        _ => None,
    }
}

fn release(n: &mut LiveNode, job: JobId, mig_node: bool) {
    for g in &mut n.gpus {
        match g {
            GpuUse::Whole(j) if *j == job => *g = GpuUse::Free,
            GpuUse::Mig(slots) => {
                for s in slots.iter_mut() {
                    if *s == Some(job) {
                        *s = None;
                    }
                }
            }
            GpuUse::Shared(v) => {
                v.retain(|x| x.0 != job);
                if v.is_empty() && !mig_node {
                    *g = GpuUse::Free;
                }
            }
            _ => {}
        }
    }
}

fn is_empty(n: &LiveNode) -> bool {
    n.gpus.iter().all(|g| match g {
        GpuUse::Free => true,
        GpuUse::Whole(_) => false,
        GpuUse::Mig(s) => s.iter().all(Option::is_none),
        GpuUse::Shared(v) => v.is_empty(),
    })
}

struct Driver<'a> {
    store: &'a Store,
    sims: &'a [Arc<SimCloud>],
    clock: &'a ManualClock,
    rng: StdRng,
    nodes: Vec<LiveNode>,
    mig_nodes: std::collections::HashSet<NodeId>,
    jobs: Vec<SimJob>,
    teams: Vec<(String, TeamName)>,
    report: WeekReport,
    buys: u64,
    max_nodes: usize,
}

impl Driver<'_> {
    fn now(&self) -> DateTime<Utc> {
        crate::clock::Clock::now(self.clock)
    }

    async fn submit(&mut self) -> anyhow::Result<()> {
        let now = self.now();
        let k = self.rng.random_range(0..10u32);
        let want = match k {
            0..=3 => Want::Gpus([1, 1, 2, 4, 8][self.rng.random_range(0..5usize)]),
            4..=6 => Want::Mig1g,
            _ => Want::Milli([250, 500][self.rng.random_range(0..2usize)]),
        };
        let (team_id, team) = self.teams[self.rng.random_range(0..self.teams.len())].clone();
        let id = JobId(new_uuid(now));
        let name = format!("job-{}", self.report.jobs);
        let spec = spec_of(&name, &want)?;
        self.store
            .submit_job(
                NewJob {
                    id,
                    team_id,
                    team,
                    spec,
                    idempotency: None,
                },
                now,
            )
            .await?;
        let hours = self.rng.random_range(1..=8i64);
        self.jobs.push(SimJob {
            id,
            want,
            remaining: Duration::hours(hours),
            node: None,
        });
        self.report.jobs += 1;
        Ok(())
    }

    /// The cheapest offer able to run `want`, on `market`.
    async fn offers_for(&self, want: &Want, market: Market) -> Vec<(usize, Offer)> {
        let mut out = Vec::new();
        for (i, sim) in self.sims.iter().enumerate() {
            let Ok(list) = sim.list_offers().await else {
                continue;
            };
            for o in list {
                let ok = o.market == market
                    && match want {
                        Want::Gpus(k) => o.gpu_count >= *k && !is_mig_model(o.gpu_model),
                        Want::Mig1g => is_mig_model(o.gpu_model),
                        Want::Milli(_) => o.gpu_count >= 1 && !is_mig_model(o.gpu_model),
                    };
                if ok {
                    out.push((i, o));
                }
            }
        }
        out.sort_by_key(|(_, o)| o.price);
        out
    }

    async fn buy(&mut self, want: &Want) -> anyhow::Result<Option<usize>> {
        if self.nodes.len() >= self.max_nodes {
            return Ok(None);
        }
        self.buys += 1;
        let market = if self.buys.is_multiple_of(5) {
            Market::OnDemand
        } else {
            Market::Spot
        };
        let now = self.now();
        for (sim_idx, offer) in self.offers_for(want, market).await.into_iter().take(6) {
            let id = NodeId(new_uuid(now));
            let req = ProvisionRequest {
                node_id: id,
                offer: offer.clone(),
                client_token: id.to_string(),
                tags: BTreeMap::new(),
                user_data: None,
            };
            let Ok(inst) = self.sims[sim_idx].provision(&req).await else {
                continue;
            };
            let mig = matches!(want, Want::Mig1g);
            let model = offer.gpu_model.unwrap_or(GpuModel::T4);
            let layout = if mig {
                MigLayout::new((0..7).map(|s| MigInstance::new(MigClass::G1, s)).collect())
                    .unwrap_or_default()
            } else {
                MigLayout::empty()
            };
            let gpus = (0..offer.gpu_count)
                .map(|_| NewGpu {
                    model,
                    memory_mib: u64::from(model.memory_mib().unwrap_or(16_384)),
                    mig_enabled: mig,
                    mig_layout: layout.clone(),
                })
                .collect();
            self.store
                .create_node(
                    NewNode {
                        id,
                        name: format!("week-{}", self.report.nodes),
                        cloud: offer.cloud,
                        region: offer.region.to_string(),
                        zone: offer.zone.to_string(),
                        instance_type: offer.instance_type.to_string(),
                        market: offer.market,
                        offer_id: Some(offer.id()),
                        client_token: id.to_string(),
                        hourly_price: offer.price,
                        on_demand_price: offer.on_demand_price,
                        cpu_milli: u64::from(offer.vcpus) * 1000,
                        memory_mib: offer.memory_mib,
                        gpus,
                        labels: BTreeMap::new(),
                    },
                    now,
                )
                .await?;
            self.store
                .transition_node(id, NodeState::Booting, None, now)
                .await?;
            self.store
                .transition_node(id, NodeState::Ready, None, now)
                .await?;
            self.report.nodes += 1;
            if offer.market == Market::Spot {
                self.report.spot_nodes += 1;
            }
            if mig {
                self.mig_nodes.insert(id);
            }
            let used = if mig {
                GpuUse::Mig([None; 7])
            } else {
                GpuUse::Free
            };
            self.nodes.push(LiveNode {
                id,
                sim: sim_idx,
                provider_id: inst.provider_id,
                gpus: vec![used; offer.gpu_count as usize],
                empty_since: now,
                noticed: false,
            });
            return Ok(Some(self.nodes.len() - 1));
        }
        Ok(None)
    }

    async fn place_pending(&mut self) -> anyhow::Result<()> {
        let now = self.now();
        for j in 0..self.jobs.len() {
            if self.jobs[j].node.is_some() || self.jobs[j].remaining <= Duration::zero() {
                continue;
            }
            let (id, want) = (self.jobs[j].id, self.jobs[j].want.clone());
            let mut placed = None;
            for n in self.nodes.iter_mut().filter(|n| !n.noticed) {
                let mig = self.mig_nodes.contains(&n.id);
                if let Some(a) = fit(n, mig, id, &want) {
                    placed = Some((n.id, a));
                    break;
                }
            }
            if placed.is_none()
                && let Some(i) = self.buy(&want).await?
            {
                let n = &mut self.nodes[i];
                let mig = self.mig_nodes.contains(&n.id);
                placed = fit(n, mig, id, &want).map(|a| (n.id, a));
            }
            let Some((node, assigned)) = placed else {
                continue;
            };
            self.store
                .admit_job(
                    id,
                    &[Placement {
                        replica: 0,
                        node,
                        assigned,
                    }],
                    now,
                )
                .await?;
            for to in [JobState::Starting, JobState::Running] {
                self.store
                    .transition_job(id, None, None, to, None, now)
                    .await?;
            }
            self.jobs[j].node = Some(node);
        }
        Ok(())
    }

    /// Runs jobs for `dt`; finished ones succeed and free their place.
    async fn progress(&mut self, dt: Duration) -> anyhow::Result<()> {
        let now = self.now();
        for j in &mut self.jobs {
            let Some(node) = j.node else { continue };
            j.remaining -= dt;
            if j.remaining > Duration::zero() {
                continue;
            }
            self.store
                .transition_job(j.id, None, None, JobState::Succeeded, None, now)
                .await?;
            self.report.jobs_succeeded += 1;
            j.node = None;
            if let Some(n) = self.nodes.iter_mut().find(|n| n.id == node) {
                release(n, j.id, self.mig_nodes.contains(&node));
                if is_empty(n) {
                    n.empty_since = now;
                }
            }
        }
        Ok(())
    }

    /// Notices posted by the clouds: the node's jobs are preempted when the notice is posted,
    /// the node ends when the cloud takes it.
    async fn notices(&mut self) -> anyhow::Result<()> {
        let now = self.now();
        let mut gone = Vec::new();
        for (k, n) in self.nodes.iter_mut().enumerate() {
            let Some(inst) = self.sims[n.sim].instance_by_name(&n.provider_id) else {
                continue;
            };
            let Some((posted, deadline)) = inst.notice else {
                continue;
            };
            if !n.noticed {
                n.noticed = true;
                self.report.preempted_nodes += 1;
                self.store
                    .transition_node(
                        n.id,
                        NodeState::Draining,
                        Some("spot notice".into()),
                        posted,
                    )
                    .await?;
                for j in self.jobs.iter_mut().filter(|j| j.node == Some(n.id)) {
                    let lost = (self.report.checkpointed_runs + self.report.lost_runs) % 3 == 2;
                    let path: &[JobState] = if lost {
                        self.report.lost_runs += 1;
                        &[JobState::Lost, JobState::Queued]
                    } else {
                        self.report.checkpointed_runs += 1;
                        &[JobState::Draining, JobState::Checkpointed, JobState::Queued]
                    };
                    for to in path {
                        self.store
                            .transition_job(
                                j.id,
                                None,
                                None,
                                *to,
                                Some("spot notice".into()),
                                posted,
                            )
                            .await?;
                    }
                    j.node = None;
                }
            }
            if deadline <= now {
                gone.push((k, inst.terminated_at.unwrap_or(deadline)));
            }
        }
        for (k, at) in gone.into_iter().rev() {
            let n = self.nodes.remove(k);
            self.end_node(n.id, at).await?;
        }
        Ok(())
    }

    async fn end_node(&self, id: NodeId, at: DateTime<Utc>) -> anyhow::Result<()> {
        let node = self.store.get_node(id).await?;
        if node.state != NodeState::Draining {
            self.store
                .transition_node(id, NodeState::Draining, None, at)
                .await?;
        }
        self.store
            .transition_node(id, NodeState::Terminating, None, at)
            .await?;
        self.store
            .transition_node(id, NodeState::Terminated, None, at)
            .await?;
        Ok(())
    }

    /// Gives back nodes empty for `grace`.
    async fn release_idle(&mut self, grace: Duration) -> anyhow::Result<()> {
        let now = self.now();
        let mut k = 0;
        while k < self.nodes.len() {
            let n = &self.nodes[k];
            if !n.noticed && is_empty(n) && now - n.empty_since >= grace {
                let n = self.nodes.remove(k);
                self.sims[n.sim].terminate(&n.provider_id).await?;
                self.end_node(n.id, now).await?;
            } else {
                k += 1;
            }
        }
        Ok(())
    }
}

/// Replays the week on `store` (fresh) with the simulated clouds of `providers`, whose clock is
/// `clock`; writes the week's files to `out` when given.
pub async fn run_week(
    store: &Store,
    providers: &Providers,
    clock: &ManualClock,
    spec: &WeekSpec,
    out: Option<&Path>,
) -> anyhow::Result<WeekReport> {
    let started = std::time::Instant::now();
    clock.set(spec.start);
    let end = spec.start + spec.span;
    let mut teams = Vec::new();
    for name in ["vision", "nlp", "speech"] {
        let t = store
            .create_team(
                NewTeam {
                    name: name.parse().map_err(anyhow::Error::msg)?,
                    weight: 1.0,
                    cohort: None,
                    quotas: BTreeMap::new(),
                },
                spec.start,
            )
            .await?;
        teams.push((t.id, t.name));
    }
    let settings = FinanceSettings {
        settle: std::time::Duration::from_secs(600),
        ..FinanceSettings::default()
    };
    let ledger = LedgerLoop::new(
        store.clone(),
        Arc::new(clock.clone()),
        Some(providers),
        settings.clone(),
    );
    let mut d = Driver {
        store,
        sims: &providers.sims,
        clock,
        rng: StdRng::seed_from_u64(spec.seed),
        nodes: Vec::new(),
        mig_nodes: Default::default(),
        jobs: Vec::new(),
        teams,
        report: WeekReport::default(),
        buys: 0,
        max_nodes: spec.max_nodes,
    };
    let step = Duration::seconds(60);
    let per_step = spec.jobs_per_hour / 60.0;
    let mut next_ledger = spec.start + Duration::hours(1);
    while d.now() < end {
        d.notices().await?;
        d.progress(step).await?;
        if d.rng.random_bool(per_step.clamp(0.0, 1.0)) {
            d.submit().await?;
        }
        d.place_pending().await?;
        d.release_idle(Duration::minutes(20)).await?;
        if d.now() >= next_ledger {
            let r = ledger.run_once().await?;
            d.report.price_points += r.price_points;
            next_ledger += Duration::hours(1);
        }
        clock.advance(step);
    }
    // The end: every job still running is cancelled, every node given back.
    let now = d.now();
    for j in d.jobs.iter().filter(|j| j.node.is_some()) {
        store
            .transition_job(
                j.id,
                None,
                None,
                JobState::Cancelled,
                Some("the week ended".into()),
                now,
            )
            .await?;
    }
    for n in std::mem::take(&mut d.nodes) {
        let taken = d.sims[n.sim]
            .instance_by_name(&n.provider_id)
            .and_then(|i| i.terminated_at)
            .filter(|t| *t <= now);
        match taken {
            Some(at) => d.end_node(n.id, at).await?,
            None => {
                d.sims[n.sim].terminate(&n.provider_id).await?;
                d.end_node(n.id, now).await?;
            }
        }
    }
    clock.advance(Duration::hours(1));
    for _ in 0..2 {
        let r = ledger.run_once().await?;
        d.report.price_points += r.price_points;
    }
    let mut report = d.report;
    report.simulated_hours = spec.span.num_seconds() as f64 / 3600.0;
    check(store, providers, spec, end, &settings, out, &mut report).await?;
    report.wall_seconds = started.elapsed().as_secs_f64();
    if let Some(dir) = out {
        std::fs::write(
            dir.join("report.json"),
            serde_json::to_string_pretty(&report)?,
        )
        .context("writing report.json")?;
    }
    Ok(report)
}

async fn check(
    store: &Store,
    providers: &Providers,
    spec: &WeekSpec,
    end: DateTime<Utc>,
    settings: &FinanceSettings,
    out: Option<&Path>,
    report: &mut WeekReport,
) -> anyhow::Result<()> {
    let from = spec.start - Duration::days(1);
    let to = end + Duration::days(1);
    let entries = store.ledger_entries(from, to, None).await?;
    report.ledger_lines = entries.len();
    let summary = summarize(&entries, from, to, GroupBy::Team);
    report.ledger_total = summary.total.cost_micros;
    report.ledger_on_demand = summary.total.on_demand_cost_micros;
    report.saving = summary.total.saving_micros;
    report.idle = summary.total.idle_micros;
    report.lost_work = summary.total.lost_work_micros;
    for r in &summary.rows {
        if r.key != crate::finance::summary::IDLE_KEY {
            report.by_team.insert(r.key.clone(), r.figures.cost_micros);
        }
    }
    // The clouds' bills, per node.
    let mut bills: HashMap<NodeId, (Micros, Micros)> = HashMap::new();
    for sim in &providers.sims {
        for b in sim.bills() {
            if let Some(n) = b.node_id {
                let e = bills.entry(n).or_default();
                e.0 += b.cost;
                e.1 += b.on_demand_cost;
            }
        }
    }
    report.cloud_bills_total = bills.values().map(|b| b.0).sum();
    report.cloud_bills_on_demand = bills.values().map(|b| b.1).sum();
    let mut per_node: HashMap<NodeId, Micros> = HashMap::new();
    for e in entries.iter().filter(|e| e.kind != LineKind::LostWork) {
        *per_node.entry(e.node_id).or_default() += e.cost;
    }
    report.nodes_off = bills
        .iter()
        .filter(|(n, b)| per_node.get(n).copied().unwrap_or_default() != b.0)
        .count();
    // FOCUS, read back from its text.
    let account = FocusAccount {
        id: settings.billing_account_id.clone(),
        name: settings.billing_account_name.clone(),
    };
    let focus = to_focus_csv(&entries, &account);
    let rows = parse_csv(&focus).map_err(anyhow::Error::msg)?;
    let header = rows.first().context("an empty FOCUS file")?;
    let col = |name: &str| header.iter().position(|c| c == name);
    let (Some(list), Some(effective)) = (col("ListCost"), col("EffectiveCost")) else {
        anyhow::bail!("the FOCUS file lacks ListCost or EffectiveCost");
    };
    let mut focus_saving = Micros::ZERO;
    for r in &rows[1..] {
        let l = Micros::parse_usd(&r[list]).map_err(|e| anyhow::anyhow!("{e}"))?;
        let e = Micros::parse_usd(&r[effective]).map_err(|e| anyhow::anyhow!("{e}"))?;
        focus_saving += l - e;
    }
    report.focus_saving = focus_saving;
    report.focus_rows = rows.len() - 1;
    let teams_plus_idle: Micros = report.by_team.values().copied().sum::<Micros>() + report.idle;
    report.balanced = report.ledger_total == report.cloud_bills_total
        && report.ledger_on_demand == report.cloud_bills_on_demand
        && teams_plus_idle == report.ledger_total
        && report.focus_saving == report.saving
        && report.nodes_off == 0;
    if let Some(dir) = out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).with_context(|| format!("writing {name}"))
        };
        write("ledger.csv", &to_csv(&entries))?;
        write("focus.csv", &focus)?;
        for by in GroupBy::ALL {
            let s = summarize(&entries, from, to, by);
            write(
                &format!("summary-by-{by}.json"),
                &serde_json::to_string_pretty(&s)?,
            )?;
        }
        let mut bills_csv =
            String::from("node_id,cloud_bill_usd,ledger_usd,cloud_on_demand_usd\r\n");
        let mut sorted: Vec<_> = bills.iter().collect();
        sorted.sort_by_key(|(n, _)| **n);
        for (n, b) in sorted {
            bills_csv.push_str(&format!(
                "{n},{},{},{}\r\n",
                decimal(b.0),
                decimal(per_node.get(n).copied().unwrap_or_default()),
                decimal(b.1)
            ));
        }
        write("bills.csv", &bills_csv)?;
    }
    Ok(())
}
