//! `sim`: simulated clouds that behave like clouds, on a clock and a seed.
//!
//! Each [`SimCloud`] carries the flavour of one real cloud — its instance types, regions, zones
//! and prices from the catalog, its notice window (AWS 120 s, GCP and Azure 30 s) and its way
//! of telling about interruptions (AWS through an event stream, the others only through the
//! node's metadata endpoint). It replays a market ([`market`]): the recorded traces
//! ([`traces`]) or the one shipped in the binary — when spot capacity exists and when instances
//! are taken, how spot prices move, and GCP's price history. On top,
//! boot delays, capacity limits per pool, and API errors and throttling at configurable rates.
//! Everything is derived from the clock and the seed, so a run is reproducible and a week of
//! traces replays as fast as the clock is moved.
//!
//! State is advanced lazily: every call first brings the simulation up to `clock.now()`, so
//! there is no background task and nothing to shut down.
//!
//! A simulated cloud lives in the process that made it, and goes with it, unless it is given a
//! state file ([`SimCloud::shared`]): then, like a real cloud, it outlives the control plane.
//! Every call takes an exclusive lock on the file, reads what other processes changed, and
//! writes back what it changed, so a control plane restarted after a crash finds its
//! instances still running (and billed), and several replicas on one machine share one cloud.

pub mod market;
pub mod replay;
pub mod traces;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration as StdDuration;

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use spotplane_core::{Cloud, Market, Micros, NodeId, PriceMillis};

use crate::catalog::CatalogRow;
use crate::clock::SharedClock;
use crate::{
    CloudProvider, Instance, InstanceState, InterruptionEvent, InterruptionKind, Offer, PoolRef,
    PriceChange, ProviderError, ProvisionRequest,
};
pub use market::SimMarket;
pub use traces::{SimTraces, Trace};

/// How a simulated cloud behaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Which cloud it imitates.
    pub flavour: Cloud,
    /// Regions offered; all of the catalog's when empty.
    #[serde(default)]
    pub regions: Vec<String>,
    /// Instance types sold; all of the catalog's when empty.
    #[serde(default)]
    pub instance_types: Vec<String>,
    /// Seed of everything random (trace offsets, boot delays, errors).
    #[serde(default)]
    pub seed: u64,
    /// Shortest and longest boot, in seconds.
    #[serde(default = "default_boot")]
    pub boot_seconds: (u32, u32),
    /// Instances at most per (zone, instance type, market).
    #[serde(default = "default_capacity")]
    pub pool_capacity: u32,
    /// Share of API calls that fail with a transient error.
    #[serde(default)]
    pub error_rate: f64,
    /// Share of API calls that are throttled.
    #[serde(default)]
    pub throttle_rate: f64,
}

fn default_boot() -> (u32, u32) {
    (60, 180)
}

fn default_capacity() -> u32 {
    16
}

impl SimConfig {
    pub fn new(flavour: Cloud, seed: u64) -> Self {
        SimConfig {
            flavour,
            regions: Vec::new(),
            instance_types: Vec::new(),
            seed,
            boot_seconds: default_boot(),
            pool_capacity: default_capacity(),
            error_rate: 0.0,
            throttle_rate: 0.0,
        }
    }
}

/// A simulated instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimInstance {
    pub id: String,
    pub node_id: Option<NodeId>,
    pub zone: Arc<str>,
    pub instance_type: Arc<str>,
    pub market: Market,
    pub tags: BTreeMap<String, String>,
    pub launched_at: DateTime<Utc>,
    pub ready_at: DateTime<Utc>,
    /// When the cloud announced it takes the instance back, and when it will.
    pub notice: Option<(DateTime<Utc>, DateTime<Utc>)>,
    pub terminated_at: Option<DateTime<Utc>>,
    /// When its pool's spot capacity next goes away (spot instances), worked out at launch
    /// from the pool's trace.
    loss_at: Option<DateTime<Utc>>,
    /// Its end after a notice was reported in the event stream.
    reported_gone: bool,
}

impl SimInstance {
    pub fn state(&self, now: DateTime<Utc>) -> InstanceState {
        match (self.terminated_at, self.notice) {
            (Some(t), _) if t <= now => InstanceState::Terminated,
            (_, Some(_)) => InstanceState::Stopping,
            _ if now < self.ready_at => InstanceState::Pending,
            _ => InstanceState::Running,
        }
    }
}

/// What a simulated node's metadata endpoint says now (the agent reads it; shapes in
/// REFERENCE.md are produced by the HTTP front in the control plane).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SimNotice {
    pub flavour: Cloud,
    /// When the notice was posted and when the instance goes.
    pub posted_at: DateTime<Utc>,
    pub deadline: DateTime<Utc>,
    /// A stable id for the event (Azure `EventId`).
    pub event_id: String,
}

struct State {
    rng: StdRng,
    instances: BTreeMap<String, SimInstance>,
    /// Instances forgotten an hour after they went, kept for their bills.
    gone: Vec<SimInstance>,
    by_token: HashMap<String, String>,
    events: Vec<InterruptionEvent>,
    next_id: u64,
    /// Azure Scheduled Events acknowledged early (StartRequests) by event id.
    acknowledged: Vec<String>,
    /// Gone instances are forgotten at most once a simulated minute.
    next_prune: DateTime<Utc>,
    /// Nothing happens on its own before this time; cleared by every change a call makes.
    quiet_until: Option<DateTime<Utc>>,
    /// A spot capacity crunch switched on from outside (tests, demos): no spot anywhere.
    spot_outage: bool,
    /// A calm market switched on from outside (tests): spot is always there and never taken
    /// back, whatever the traces say.
    calm: bool,
    /// With a state file: the generation of the file this state was last read from or
    /// written to.
    generation: u64,
}

/// What a state file holds: the part of [`State`] that is the cloud's, not one process's.
#[derive(Serialize, Deserialize)]
struct Durable {
    /// What it is a state of, so that a file is never read as another cloud's.
    flavour: Cloud,
    seed: u64,
    /// Where pool trace offsets are counted from: the first process's start.
    epoch: DateTime<Utc>,
    generation: u64,
    next_id: u64,
    instances: BTreeMap<String, SimInstance>,
    gone: Vec<SimInstance>,
    by_token: HashMap<String, String>,
    events: Vec<InterruptionEvent>,
    acknowledged: Vec<String>,
    spot_outage: bool,
    calm: bool,
}

/// Why a state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("simulated cloud state file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "simulated cloud state file {path} is not a simulated cloud's state ({reason}); move it away to start an empty cloud"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "simulated cloud state file {path} holds a {found} cloud of seed {found_seed}, not this {flavour} cloud of seed {seed}"
    )]
    Other {
        path: PathBuf,
        found: Cloud,
        found_seed: u64,
        flavour: Cloud,
        seed: u64,
    },
}

/// A state file and the lock file beside it.
#[derive(Debug)]
struct StateFile {
    path: PathBuf,
    lock: PathBuf,
}

impl StateFile {
    fn io(&self, source: std::io::Error) -> StateFileError {
        StateFileError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Takes the lock (blocking; every holder holds it for one call's bookkeeping only).
    fn lock(&self) -> Result<std::fs::File, StateFileError> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock)
            .map_err(|e| StateFileError::Io {
                path: self.lock.clone(),
                source: e,
            })?;
        f.lock().map_err(|e| StateFileError::Io {
            path: self.lock.clone(),
            source: e,
        })?;
        Ok(f)
    }

    /// The state in the file, if there is one (the lock held).
    fn read(&self) -> Result<Option<Durable>, StateFileError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io(e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StateFileError::Corrupt {
                path: self.path.clone(),
                reason: e.to_string(),
            })
    }

    /// Replaces the file (the lock held): a new file renamed over the old, so a reader (or a
    /// process killed half-way) never sees half a state.
    fn write(&self, d: &Durable) -> Result<(), StateFileError> {
        let bytes = serde_json::to_vec(d).map_err(|e| StateFileError::Corrupt {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".new");
        std::fs::write(&tmp, bytes).map_err(|e| self.io(e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| self.io(e))
    }
}

/// The state of one call: the process's own, brought up to the state file's (when there is
/// one) and written back to it when dropped.
struct StateGuard<'a> {
    st: MutexGuard<'a, State>,
    /// The state file's lock, held until the state is written back.
    file: Option<(&'a StateFile, std::fs::File)>,
    cloud: &'a SimCloud,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.st
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.st
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let Some((file, _lock)) = self.file.take() else {
            return;
        };
        self.st.generation += 1;
        let d = self.cloud.durable(&self.st);
        if let Err(e) = file.write(&d) {
            // The other processes sharing this cloud will not see this call's changes.
            tracing::error!(error = %e, "cannot write the simulated cloud's state");
        }
    }
}

/// Takes up a state file's cloud: another process changed it since this one last looked.
fn load(st: &mut State, d: Durable, seed: u64) {
    st.generation = d.generation;
    st.next_id = d.next_id;
    st.instances = d.instances;
    st.gone = d.gone;
    st.by_token = d.by_token;
    st.events = d.events;
    st.acknowledged = d.acknowledged;
    st.spot_outage = d.spot_outage;
    st.calm = d.calm;
    // What another process did may bring events sooner than this one's view said.
    st.quiet_until = None;
    // Random draws go on from a point of their own for each generation, the same in every
    // process that reads it.
    st.rng = StdRng::seed_from_u64(seed ^ d.generation.wrapping_mul(0x9e37_79b9_7f4a_7c15));
}

/// By zone, then instance type: the traces of the pool's interruption-frequency band.
type PoolBands = HashMap<Arc<str>, HashMap<Arc<str>, Arc<[usize]>>>;

/// One simulated cloud.
pub struct SimCloud {
    cfg: SimConfig,
    clock: SharedClock,
    catalog: Vec<CatalogRow>,
    traces: Arc<SimTraces>,
    /// Per catalog row, what its prices follow.
    row_prices: Vec<RowPrices>,
    /// Where pool trace offsets are counted from.
    epoch: DateTime<Utc>,
    /// With a banded market (the shipped one): by zone, then instance type, the traces of the
    /// pool's interruption-frequency band. Empty otherwise.
    pool_bands: PoolBands,
    state: Mutex<State>,
    /// Where the state lives beyond this process, if anywhere.
    file: Option<StateFile>,
}

impl std::fmt::Debug for SimCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCloud")
            .field("flavour", &self.cfg.flavour)
            .field("seed", &self.cfg.seed)
            .finish_non_exhaustive()
    }
}

/// What a catalog row's prices follow, worked out once.
struct RowPrices {
    /// GCP: the row's price history.
    history: Option<Arc<[traces::PricePoint]>>,
    /// Elsewhere: the availability trace whose recorded prices move the spot price, and the
    /// row's tick offset into it.
    movement: Option<(usize, u64)>,
}

/// FNV-1a, for stable per-pool choices that do not depend on call order.
fn stable_hash(parts: &[&str], seed: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

impl SimCloud {
    /// A simulated cloud selling `catalog` (rows of its flavour) and replaying `traces`. The
    /// clock's current time is the epoch trace offsets count from.
    pub fn new(
        cfg: SimConfig,
        catalog: Vec<CatalogRow>,
        traces: Arc<SimTraces>,
        clock: SharedClock,
    ) -> Self {
        let catalog: Vec<CatalogRow> = catalog
            .into_iter()
            .filter(|r| cfg.regions.is_empty() || cfg.regions.iter().any(|g| **g == *r.region))
            .filter(|r| {
                cfg.instance_types.is_empty()
                    || cfg.instance_types.iter().any(|t| **t == *r.instance_type)
            })
            .collect();
        let epoch = clock.now();
        let rng = StdRng::seed_from_u64(cfg.seed ^ cfg.flavour as u64);
        let priced: Vec<usize> = traces
            .availability
            .iter()
            .enumerate()
            .filter(|(_, t)| t.prices.is_some())
            .map(|(i, _)| i)
            .collect();
        let mut histories: HashMap<(&str, &str), Arc<[traces::PricePoint]>> = HashMap::new();
        let row_prices = catalog
            .iter()
            .map(|row| {
                if cfg.flavour == Cloud::Gcp {
                    let key = (&*row.instance_type, &*row.region);
                    let history = match histories.get(&key) {
                        Some(h) => Some(Arc::clone(h)),
                        None => traces
                            .gcp_prices
                            .get(&(row.instance_type.to_string(), row.region.to_string()))
                            .map(|s| {
                                let h: Arc<[traces::PricePoint]> = s.as_slice().into();
                                histories.insert(key, Arc::clone(&h));
                                h
                            }),
                    };
                    return RowPrices {
                        history,
                        movement: None,
                    };
                }
                let movement = (!priced.is_empty()).then(|| {
                    let h = stable_hash(&[&row.zone, &row.instance_type, "price"], cfg.seed);
                    let idx = priced[(h % priced.len() as u64) as usize];
                    (
                        idx,
                        (h >> 20) % traces.availability[idx].len().max(1) as u64,
                    )
                });
                RowPrices {
                    history: None,
                    movement,
                }
            })
            .collect();
        let mut pool_bands: PoolBands = HashMap::new();
        if !traces.bands.is_empty() {
            for row in &catalog {
                let band = row
                    .interruption_bucket
                    .as_deref()
                    .filter(|b| traces.bands.contains_key(*b))
                    .or(traces.default_band.as_deref());
                if let Some(of_band) = band.and_then(|b| traces.bands.get(b)) {
                    pool_bands
                        .entry(Arc::clone(&row.zone))
                        .or_default()
                        .insert(Arc::clone(&row.instance_type), of_band.as_slice().into());
                }
            }
        }
        SimCloud {
            cfg,
            row_prices,
            pool_bands,
            clock,
            catalog,
            traces,
            epoch,
            state: Mutex::new(State {
                rng,
                instances: BTreeMap::new(),
                gone: Vec::new(),
                by_token: HashMap::new(),
                events: Vec::new(),
                next_id: 1,
                acknowledged: Vec::new(),
                next_prune: epoch,
                quiet_until: None,
                spot_outage: false,
                calm: false,
                generation: 0,
            }),
            file: None,
        }
    }

    /// Keeps this cloud's state in the file at `path` (and a lock file beside it), so that it
    /// outlives the process and is shared by every process given the same file: an existing
    /// file's cloud is taken up as it is (its instances, bills, and the epoch its traces
    /// count from); a missing one is created.
    pub fn shared(mut self, path: &Path) -> Result<Self, StateFileError> {
        let file = StateFile {
            path: path.to_owned(),
            lock: {
                let mut l = path.to_owned().into_os_string();
                l.push(".lock");
                PathBuf::from(l)
            },
        };
        let _lock = file.lock()?;
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        match file.read()? {
            Some(d) => {
                if d.flavour != self.cfg.flavour || d.seed != self.cfg.seed {
                    return Err(StateFileError::Other {
                        path: file.path.clone(),
                        found: d.flavour,
                        found_seed: d.seed,
                        flavour: self.cfg.flavour,
                        seed: self.cfg.seed,
                    });
                }
                self.epoch = d.epoch;
                st.next_prune = d.epoch;
                load(st, d, self.cfg.seed ^ self.cfg.flavour as u64);
            }
            None => {
                let d = Durable {
                    flavour: self.cfg.flavour,
                    seed: self.cfg.seed,
                    epoch: self.epoch,
                    generation: st.generation,
                    next_id: st.next_id,
                    instances: BTreeMap::new(),
                    gone: Vec::new(),
                    by_token: HashMap::new(),
                    events: Vec::new(),
                    acknowledged: Vec::new(),
                    spot_outage: false,
                    calm: false,
                };
                file.write(&d)?;
            }
        }
        self.file = Some(file);
        Ok(self)
    }

    /// The cloud's part of `st`, for its state file.
    fn durable(&self, st: &State) -> Durable {
        Durable {
            flavour: self.cfg.flavour,
            seed: self.cfg.seed,
            epoch: self.epoch,
            generation: st.generation,
            next_id: st.next_id,
            instances: st.instances.clone(),
            gone: st.gone.clone(),
            by_token: st.by_token.clone(),
            events: st.events.clone(),
            acknowledged: st.acknowledged.clone(),
            spot_outage: st.spot_outage,
            calm: st.calm,
        }
    }

    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    fn lock(&self) -> StateGuard<'_> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let file = self.file.as_ref().and_then(|f| {
            let taken = f.lock().and_then(|lock| {
                if let Some(d) = f.read()?
                    && d.generation != st.generation
                {
                    load(&mut st, d, self.cfg.seed ^ self.cfg.flavour as u64);
                }
                Ok(lock)
            });
            match taken {
                Ok(lock) => Some((f, lock)),
                Err(e) => {
                    // Carry on with this process's own view; the next call tries again.
                    tracing::error!(error = %e, "cannot read the simulated cloud's state");
                    None
                }
            }
        });
        StateGuard {
            st,
            file,
            cloud: self,
        }
    }

    fn notice_window(&self) -> Duration {
        Duration::seconds(i64::from(self.cfg.flavour.notice_window_secs()))
    }

    /// The trace and tick offset a spot pool follows.
    fn pool(&self, zone: &str, itype: &str) -> Option<(usize, u64)> {
        let n = self.traces.availability.len();
        if n == 0 {
            return None;
        }
        let h = stable_hash(&[self.cfg.flavour.as_str(), zone, itype], self.cfg.seed);
        let idx = match self.pool_bands.get(zone).and_then(|m| m.get(itype)) {
            Some(of_band) if !of_band.is_empty() => of_band[(h % of_band.len() as u64) as usize],
            _ => (h % n as u64) as usize,
        };
        let len = self.traces.availability[idx].len().max(1) as u64;
        Some((idx, (h >> 20) % len))
    }

    /// The tick of the pool's trace at `t`.
    fn tick(&self, pool: (usize, u64), t: DateTime<Utc>) -> u64 {
        let trace = &self.traces.availability[pool.0];
        let secs = (t - self.epoch).num_seconds().max(0) as u64;
        pool.1 + secs / u64::from(trace.gap_s)
    }

    fn tick_time(&self, pool: (usize, u64), tick: u64) -> DateTime<Utc> {
        let trace = &self.traces.availability[pool.0];
        let secs = tick.saturating_sub(pool.1) * u64::from(trace.gap_s);
        self.epoch + Duration::seconds(secs as i64)
    }

    /// Whether spot capacity exists in a pool at `t`.
    pub fn spot_available(&self, zone: &str, itype: &str, t: DateTime<Utc>) -> bool {
        match self.pool(zone, itype) {
            Some(p) => self.traces.availability[p.0].available(self.tick(p, t)),
            None => true,
        }
    }

    /// The spot price of catalog row `i` at `t`.
    fn spot_price(&self, i: usize, t: DateTime<Utc>) -> Option<Micros> {
        let row = &self.catalog[i];
        let prices = &self.row_prices[i];
        let base = match &prices.history {
            Some(h) => traces::price_on(h, t.date_naive())
                .and_then(|p| p.spot)
                .or(row.spot_price),
            None => row.spot_price,
        }?;
        // Elsewhere, movement around the level: the price path of a trace that records prices.
        let Some(pool) = prices.movement else {
            return Some(base);
        };
        let rel = self.traces.availability[pool.0].relative_price(self.tick(pool, t));
        let moved = Micros((base.0 as f64 * rel).round() as i64);
        // Spot never costs more than on-demand.
        Some(moved.min(row.price))
    }

    fn on_demand_price(&self, i: usize, t: DateTime<Utc>) -> Micros {
        self.row_prices[i]
            .history
            .as_deref()
            .and_then(|h| traces::price_on(h, t.date_naive()))
            .map_or(self.catalog[i].price, |p| p.on_demand)
    }

    /// Brings every instance up to `now`: spot instances whose pool loses capacity get their
    /// notice, and are gone when it runs out.
    fn advance(&self, st: &mut State, now: DateTime<Utc>) {
        if st.quiet_until.is_some_and(|q| now < q) {
            return;
        }
        let window = self.notice_window();
        let flavour = self.cfg.flavour;
        let mut events = Vec::new();
        for inst in st.instances.values_mut() {
            if inst.reported_gone {
                continue;
            }
            if inst.notice.is_none()
                && inst.terminated_at.is_none()
                && let Some(at) = inst.loss_at
                && at <= now
            {
                let deadline = at + window;
                inst.notice = Some((at, deadline));
                inst.terminated_at = Some(deadline);
                if flavour == Cloud::Aws {
                    events.push(InterruptionEvent {
                        provider_id: inst.id.clone(),
                        kind: InterruptionKind::Preemption,
                        deadline: Some(deadline),
                        observed_at: at,
                    });
                }
            }
            // An instance the cloud took is reported gone once, when it goes.
            if let (Some(_), Some(gone)) = (inst.notice, inst.terminated_at)
                && gone <= now
            {
                inst.reported_gone = true;
                if flavour == Cloud::Aws {
                    events.push(InterruptionEvent {
                        provider_id: inst.id.clone(),
                        kind: InterruptionKind::Stopped,
                        deadline: None,
                        observed_at: gone,
                    });
                }
            }
        }
        st.events.extend(events);
        // Like the clouds, an instance stays visible for an hour after it is gone, then is
        // forgotten with its client token.
        // Until the next notice, loss or forgetting, nothing changes unless a call changes it.
        let next_event = st
            .instances
            .values()
            .filter(|i| !i.reported_gone)
            .filter_map(|i| match (i.notice, i.terminated_at) {
                (None, None) => i.loss_at,
                (Some(_), Some(gone)) => Some(gone),
                _ => None,
            })
            .min();
        if now < st.next_prune {
            st.quiet_until = Some(next_event.map_or(st.next_prune, |e| e.min(st.next_prune)));
            return;
        }
        st.next_prune = now + Duration::minutes(1);
        st.quiet_until = Some(next_event.map_or(st.next_prune, |e| e.min(st.next_prune)));
        let horizon = now - Duration::hours(1);
        let before = st.instances.len();
        let forgotten: Vec<String> = st
            .instances
            .values()
            .filter(|i| i.terminated_at.is_some_and(|t| t <= horizon))
            .map(|i| i.id.clone())
            .collect();
        for id in forgotten {
            if let Some(inst) = st.instances.remove(&id) {
                st.gone.push(inst);
            }
        }
        if st.instances.len() != before {
            let State {
                instances,
                by_token,
                ..
            } = st;
            by_token.retain(|_, id| instances.contains_key(id));
        }
    }

    /// Fails a call at the configured error and throttle rates.
    fn inject(&self, st: &mut State) -> Result<(), ProviderError> {
        if self.cfg.throttle_rate > 0.0
            && st.rng.random_bool(self.cfg.throttle_rate.clamp(0.0, 1.0))
        {
            return Err(ProviderError::Throttled {
                retry_after: StdDuration::from_secs(st.rng.random_range(1..=5)),
            });
        }
        if self.cfg.error_rate > 0.0 && st.rng.random_bool(self.cfg.error_rate.clamp(0.0, 1.0)) {
            return Err(ProviderError::Transient("simulated internal error".into()));
        }
        Ok(())
    }

    fn instance_id(&self, st: &mut State, req: &ProvisionRequest) -> String {
        let n = st.next_id;
        st.next_id += 1;
        let salt: u32 = st.rng.random();
        match self.cfg.flavour {
            Cloud::Aws => format!("i-0{:08x}{:08x}", n as u32, salt),
            Cloud::Gcp => format!("spotplane-{}", short(req.node_id)),
            Cloud::Azure => format!(
                "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/spotplane/providers/Microsoft.Compute/virtualMachines/spotplane-{}",
                short(req.node_id)
            ),
        }
    }

    fn to_instance(&self, i: &SimInstance, now: DateTime<Utc>) -> Instance {
        Instance {
            provider_id: i.id.clone(),
            node_id: i.node_id,
            zone: i.zone.to_string(),
            instance_type: i.instance_type.to_string(),
            market: i.market,
            state: i.state(now),
            launched_at: Some(i.launched_at),
            ended_at: i.terminated_at.filter(|t| *t <= now),
            tags: i.tags.clone(),
        }
    }

    /// The notice a node's metadata endpoint shows now, if any.
    pub fn notice(&self, provider_id: &str) -> Option<SimNotice> {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        let inst = st.instances.get(provider_id)?;
        let (posted_at, deadline) = inst.notice?;
        Some(SimNotice {
            flavour: self.cfg.flavour,
            posted_at,
            deadline,
            event_id: format!("sim-{:016x}", stable_hash(&[&inst.id], self.cfg.seed)),
        })
    }

    /// Azure: the agent acknowledges an event early (StartRequests): the instance goes now.
    pub fn acknowledge(&self, event_id: &str) {
        let now = self.clock.now();
        let mut st = self.lock();
        st.acknowledged.push(event_id.to_owned());
        let seed = self.cfg.seed;
        if let Some(inst) = st.instances.values_mut().find(|i| {
            i.notice.is_some() && format!("sim-{:016x}", stable_hash(&[&i.id], seed)) == event_id
        }) {
            inst.terminated_at = Some(now);
        }
        st.quiet_until = None;
    }

    /// Takes an instance back now, with the flavour's notice (tests and demos).
    pub fn preempt_now(&self, provider_id: &str) -> bool {
        let now = self.clock.now();
        let window = self.notice_window();
        let mut st = self.lock();
        let flavour = self.cfg.flavour;
        let Some(inst) = st.instances.get_mut(provider_id) else {
            return false;
        };
        if inst.notice.is_some() || inst.terminated_at.is_some() {
            return false;
        }
        inst.notice = Some((now, now + window));
        inst.terminated_at = Some(now + window);
        let id = inst.id.clone();
        st.quiet_until = None;
        if flavour == Cloud::Aws {
            st.events.push(InterruptionEvent {
                provider_id: id,
                kind: InterruptionKind::Preemption,
                deadline: Some(now + window),
                observed_at: now,
            });
        }
        true
    }

    /// Takes an instance back now without any notice, as a cloud sometimes does (tests and
    /// demos). Returns whether it was running.
    pub fn terminate_without_notice(&self, provider_id: &str) -> bool {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        let Some(inst) = st.instances.get_mut(provider_id) else {
            return false;
        };
        if inst.terminated_at.is_some_and(|t| t <= now) {
            return false;
        }
        inst.terminated_at = Some(now);
        inst.notice = None;
        st.quiet_until = None;
        true
    }

    /// Switches a cloud-wide spot capacity crunch on or off (tests and demos): while on, every
    /// spot request fails with insufficient capacity.
    pub fn set_spot_outage(&self, on: bool) {
        let mut st = self.lock();
        st.spot_outage = on;
        st.quiet_until = None;
    }

    /// Switches a calm market on or off (tests that are about something else than
    /// preemptions): while on, spot capacity is always there and no instance bought is taken
    /// back; the instances running when it is switched on keep no notice to come.
    pub fn set_calm(&self, on: bool) {
        let mut st = self.lock();
        st.calm = on;
        if on {
            for inst in st.instances.values_mut() {
                if inst.notice.is_none() {
                    inst.loss_at = None;
                }
            }
        }
        st.quiet_until = None;
    }

    /// The instance whose id is, or ends with, `/name` (Azure ids are resource paths; the
    /// metadata front addresses instances by their last segment).
    pub fn instance_by_name(&self, name: &str) -> Option<SimInstance> {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        st.instances
            .values()
            .find(|i| i.id == name || i.id.rsplit('/').next() == Some(name))
            .cloned()
    }

    /// The clock the simulation runs on.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Shows every instance the cloud knows to `f`, without copying them.
    pub fn for_each_instance(&self, mut f: impl FnMut(&SimInstance)) {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        st.instances.values().for_each(&mut f);
    }

    /// The catalog row selling `instance_type` in `zone`.
    fn row_of(&self, zone: &str, instance_type: &str) -> Option<usize> {
        self.catalog
            .iter()
            .position(|r| *r.zone == *zone && *r.instance_type == *instance_type)
    }

    /// What an instance of row `i` on `market` costs per hour at `t`, and the on-demand price.
    fn price_at(&self, i: usize, market: Market, t: DateTime<Utc>) -> Option<(Micros, Micros)> {
        let on_demand = self.on_demand_price(i, t);
        match market {
            Market::OnDemand => Some((on_demand, on_demand)),
            Market::Spot => self.spot_price(i, t).map(|p| (p, on_demand)),
        }
    }

    /// The price of row `i` on `market` in force at `from`, then every change before `to`.
    /// Prices move only at the ticks of the trace that moves them and, where a price history
    /// applies (GCP), at UTC midnights: those are the only moments looked at.
    fn price_path(
        &self,
        i: usize,
        market: Market,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Option<Vec<PriceChange>> {
        let (price, on_demand_price) = self.price_at(i, market, from)?;
        let mut out = vec![PriceChange {
            at: from,
            price,
            on_demand_price,
        }];
        let mut moments: Vec<DateTime<Utc>> = Vec::new();
        if self.row_prices[i].history.is_some() {
            let mut day = from.date_naive();
            loop {
                day = match day.succ_opt() {
                    Some(d) => d,
                    None => break,
                };
                let at = day.and_time(chrono::NaiveTime::MIN).and_utc();
                if at >= to {
                    break;
                }
                moments.push(at);
            }
        }
        if market == Market::Spot
            && let Some(pool) = self.row_prices[i].movement
        {
            let gap = i64::from(self.traces.availability[pool.0].gap_s.max(1));
            let secs = (from - self.epoch).num_seconds().max(0);
            let mut n = secs / gap + 1;
            loop {
                let at = self.epoch + Duration::seconds(n * gap);
                if at >= to {
                    break;
                }
                if at > from {
                    moments.push(at);
                }
                n += 1;
            }
        }
        moments.sort_unstable();
        moments.dedup();
        for at in moments {
            let Some((price, on_demand_price)) = self.price_at(i, market, at) else {
                continue;
            };
            let last = out[out.len() - 1];
            if (price, on_demand_price) != (last.price, last.on_demand_price) {
                out.push(PriceChange {
                    at,
                    price,
                    on_demand_price,
                });
            }
        }
        Some(out)
    }

    /// What the cloud charges for every instance it ever ran, from its launch to its end (or
    /// now): the price in force over each moment, summed exactly and rounded to the
    /// micro-dollar once per instance, as the bill of a real cloud would be.
    pub fn bills(&self) -> Vec<InstanceBill> {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        let all: Vec<SimInstance> = st
            .gone
            .iter()
            .chain(st.instances.values())
            .cloned()
            .collect();
        drop(st);
        all.iter()
            .filter_map(|inst| self.bill_of(inst, now))
            .collect()
    }

    fn bill_of(&self, inst: &SimInstance, now: DateTime<Utc>) -> Option<InstanceBill> {
        let i = self.row_of(&inst.zone, &inst.instance_type)?;
        let from = inst.launched_at;
        let to = inst.terminated_at.map_or(now, |t| t.min(now)).max(from);
        let path = self.price_path(i, inst.market, from, to)?;
        let (mut cost, mut list) = (PriceMillis::default(), PriceMillis::default());
        for (k, p) in path.iter().enumerate() {
            let end = path.get(k + 1).map_or(to, |n| n.at);
            let ms = (end - p.at).num_milliseconds();
            cost.add(p.price, ms);
            list.add(p.on_demand_price, ms);
        }
        Some(InstanceBill {
            provider_id: inst.id.clone(),
            node_id: inst.node_id,
            zone: inst.zone.to_string(),
            instance_type: inst.instance_type.to_string(),
            market: inst.market,
            from,
            to,
            ended: inst.terminated_at.is_some_and(|t| t <= now),
            cost: Micros::from_price_millis(cost),
            on_demand_cost: Micros::from_price_millis(list),
        })
    }

    /// Every instance the cloud knows, for inspection.
    pub fn instances(&self) -> Vec<SimInstance> {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        st.instances.values().cloned().collect()
    }
}

/// What a simulated cloud charges for one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceBill {
    pub provider_id: String,
    pub node_id: Option<NodeId>,
    pub zone: String,
    pub instance_type: String,
    pub market: Market,
    /// Billed from launch to termination (or now).
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Whether it has ended (`to` is its end), or still runs (`to` is now).
    pub ended: bool,
    pub cost: Micros,
    /// The same time at the on-demand price.
    pub on_demand_cost: Micros,
}

/// The node id as a name part: GCE names and Azure VM names allow lowercase letters, digits
/// and dashes, and are at most 63 and 64 characters long.
fn short(id: NodeId) -> String {
    id.0.simple().to_string()
}

#[async_trait]
impl CloudProvider for SimCloud {
    fn cloud(&self) -> Cloud {
        self.cfg.flavour
    }

    async fn list_offers(&self) -> Result<Vec<Offer>, ProviderError> {
        let now = self.clock.now();
        {
            let mut st = self.lock();
            self.inject(&mut st)?;
        }
        let mut out = Vec::with_capacity(self.catalog.len() * 2);
        for (i, row) in self.catalog.iter().enumerate() {
            let Some(model) = row.gpu_model else { continue };
            let on_demand = self.on_demand_price(i, now);
            let base = Offer {
                cloud: self.cfg.flavour,
                region: row.region.clone(),
                zone: row.zone.clone(),
                instance_type: row.instance_type.clone(),
                market: Market::OnDemand,
                gpu_model: Some(model),
                gpu_count: row.gpu_count,
                vcpus: row.vcpus,
                memory_mib: (row.memory_gib * 1024.0) as u64,
                price: on_demand,
                on_demand_price: on_demand,
                placement_score: row.placement_score,
                interruption_bucket: row.interruption_bucket.clone(),
                price_source: crate::PriceSource::Live,
                on_demand_source: crate::PriceSource::Live,
            };
            if let Some(spot) = self.spot_price(i, now) {
                out.push(Offer {
                    market: Market::Spot,
                    price: spot,
                    ..base.clone()
                });
            }
            out.push(base);
        }
        Ok(out)
    }

    async fn provision(&self, req: &ProvisionRequest) -> Result<Instance, ProviderError> {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        if let Some(existing) = st
            .by_token
            .get(&req.client_token)
            .and_then(|id| st.instances.get(id))
        {
            return Ok(self.to_instance(existing, now));
        }
        self.inject(&mut st)?;
        let o = &req.offer;
        if o.cloud != self.cfg.flavour {
            return Err(ProviderError::InvalidRequest(format!(
                "offer of {} sent to the {} simulation",
                o.cloud, self.cfg.flavour
            )));
        }
        let row = self
            .catalog
            .iter()
            .find(|r| r.zone == o.zone && r.instance_type == o.instance_type)
            .ok_or_else(|| {
                ProviderError::InvalidRequest(format!(
                    "{} is not sold in {}",
                    o.instance_type, o.zone
                ))
            })?;
        if o.market == Market::Spot && row.spot_price.is_none() {
            return Err(ProviderError::InvalidRequest(format!(
                "{} has no spot market in {}",
                o.instance_type, o.zone
            )));
        }
        let offer_id = o.id();
        let in_pool = st
            .instances
            .values()
            .filter(|i| {
                i.terminated_at.is_none_or(|t| t > now)
                    && i.zone == o.zone
                    && i.instance_type == o.instance_type
                    && i.market == o.market
            })
            .count() as u32;
        if in_pool >= self.cfg.pool_capacity {
            return Err(ProviderError::InsufficientCapacity {
                offer_id,
                message: "pool at capacity".into(),
            });
        }
        if o.market == Market::Spot
            && (st.spot_outage
                || (!st.calm && !self.spot_available(&o.zone, &o.instance_type, now)))
        {
            return Err(ProviderError::InsufficientCapacity {
                offer_id,
                message: "no spot capacity in this pool now".into(),
            });
        }
        let (lo, hi) = self.cfg.boot_seconds;
        let boot = st.rng.random_range(lo.min(hi)..=hi.max(lo));
        let id = self.instance_id(&mut st, req);
        if st.instances.contains_key(&id) {
            // GCE and Azure name instances after the node: a second buy for the same node
            // under another client token conflicts, as it would there.
            return Err(ProviderError::InvalidRequest(format!(
                "an instance named {id} already exists"
            )));
        }
        let loss_at = match (o.market, self.pool(&o.zone, &o.instance_type)) {
            _ if st.calm => None,
            (Market::Spot, Some(pool)) => self.traces.availability[pool.0]
                .next_unavailable(self.tick(pool, now) + 1)
                .map(|tick| self.tick_time(pool, tick)),
            _ => None,
        };
        let inst = SimInstance {
            id: id.clone(),
            node_id: Some(req.node_id),
            zone: o.zone.clone(),
            instance_type: o.instance_type.clone(),
            market: o.market,
            tags: req.tags.clone(),
            launched_at: now,
            ready_at: now + Duration::seconds(i64::from(boot)),
            notice: None,
            terminated_at: None,
            loss_at,
            reported_gone: false,
        };
        let out = self.to_instance(&inst, now);
        st.by_token.insert(req.client_token.clone(), id.clone());
        st.instances.insert(id, inst);
        st.quiet_until = None;
        Ok(out)
    }

    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        self.inject(&mut st)?;
        if let Some(inst) = st.instances.get_mut(provider_id)
            && inst.terminated_at.is_none_or(|t| t > now)
        {
            inst.terminated_at = Some(now);
            st.quiet_until = None;
        }
        Ok(())
    }

    async fn list_instances(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, ProviderError> {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        self.inject(&mut st)?;
        // Like the clouds, terminated instances stay visible for an hour.
        let horizon = now - Duration::hours(1);
        Ok(st
            .instances
            .values()
            .filter(|i| i.terminated_at.is_none_or(|t| t > horizon))
            .filter(|i| tags.iter().all(|(k, v)| i.tags.get(k) == Some(v)))
            .map(|i| self.to_instance(i, now))
            .collect())
    }

    async fn drain_interruptions(&self) -> Result<Vec<InterruptionEvent>, ProviderError> {
        let now = self.clock.now();
        let mut st = self.lock();
        self.advance(&mut st, now);
        self.inject(&mut st)?;
        Ok(std::mem::take(&mut st.events))
    }

    /// Exact: the simulated prices are functions of the clock, so the history is the path.
    async fn price_history(
        &self,
        pool: &PoolRef<'_>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Option<Vec<PriceChange>>, ProviderError> {
        {
            let mut st = self.lock();
            self.inject(&mut st)?;
        }
        let i = self.row_of(pool.zone, pool.instance_type).ok_or_else(|| {
            ProviderError::NotFound(format!(
                "{} is not sold in {}",
                pool.instance_type, pool.zone
            ))
        })?;
        self.price_path(i, pool.market, from, to.max(from))
            .map(Some)
            .ok_or_else(|| {
                ProviderError::NotFound(format!(
                    "{} has no {} market in {}",
                    pool.instance_type, pool.market, pool.zone
                ))
            })
    }
}

#[cfg(test)]
mod tests;
