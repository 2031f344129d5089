//! The arguments of the lab's commands: `spotplane demo`, `spotplane replay` and
//! `spotplane bench …`. `main.rs` puts them in the command tree beside the production commands
//! (`crate::cli`); [`super::commands`] runs them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::cli::ClientArgs;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Folder for the demo's database, objects and admin token.
    #[arg(long, default_value = "data/demo")]
    pub data_dir: PathBuf,
    /// Run a fixed stretch of simulated time (e.g. 24) as fast as the machine allows, print a
    /// summary and exit, instead of serving the live demo.
    #[arg(long)]
    pub hours: Option<f64>,
    /// With --hours, print the summary as one JSON object.
    #[arg(long, requires = "hours")]
    pub json: bool,
    /// Simulated seconds per real second for the live demo (3600: an hour a second). The
    /// machine may not keep up; the page shows the simulated time.
    #[arg(long, default_value_t = 3600.0)]
    pub speed: f64,
    /// The job stream: a Philly/Gavel trace (default: the 0e4a51 cluster, from sim.data_dir
    /// with the recorded market, its first 400 jobs shipped with spotplane otherwise).
    #[arg(long)]
    pub workload: Option<PathBuf>,
    /// Simulated time per step of the world (agents, recovery, scheduling, capacity).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub step: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A Gavel trace file (../shared/data/gpu-trace/philly-gavel/*.trace).
    #[arg(long)]
    pub workload: PathBuf,
    /// Simulated days of arrivals to replay.
    #[arg(long, default_value_t = 2.0)]
    pub days: f64,
    /// `on-demand-only`, `cheapest-spot-failover`, `spotplane`, or `all`.
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// Virtual time per step.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub step: std::time::Duration,
    /// Where virtual time starts (the traces' prices are dated).
    #[arg(long, default_value = "2026-07-01T00:00:00Z")]
    pub start: chrono::DateTime<chrono::Utc>,
    /// Jobs at most.
    #[arg(long, default_value_t = 400)]
    pub max_jobs: usize,
    /// GPU seconds one trace step takes (Gavel's traces count work in steps).
    #[arg(long, default_value_t = 0.1)]
    pub seconds_per_step: f64,
    /// Run spotplane's policy without consolidation (to measure what it saves).
    #[arg(long)]
    pub no_consolidation: bool,
    /// Give `cheapest-spot-failover` spotplane's node agents, which checkpoint on a termination
    /// notice (SkyPilot's managed jobs have none), to compare the buying policies alone.
    #[arg(long)]
    pub baseline_hears_notices: bool,
    /// One JSON object per policy and line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Submit jobs as fast as the server takes them; report throughput and latency.
    Submit {
        /// An admin token: the bench creates its own team and team token with it.
        #[command(flatten)]
        client: ClientArgs,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// How long to measure, after the warm-up.
        #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Keep a spot fleet on the configured simulated clouds for a span of replayed traces;
    /// report what happened and the wall time it took.
    Sim(SimBenchArgs),
    /// Replay the openb packing experiment of FGD (USENIX ATC '23): print the GPU allocation
    /// ratio at each percentage (0..130) of arrived GPU demand.
    Pack(PackArgs),
    /// One deadline-bound job on one spot pool of a Can't Be Late trace (Wu et al., NSDI '24):
    /// print each policy's cost, finish time and whether the deadline held.
    Deadline(DeadlineArgs),
    /// Replay a week of jobs on the simulated clouds into a fresh ledger, check it against the
    /// clouds' bills, and write the week's files (ledger CSV, FOCUS, summaries, bills).
    Finance(FinanceBenchArgs),
    /// Fill a scratch store with a large queue, then time the leader's scheduling cycles and
    /// capacity rounds on the simulated clouds, store call by store call.
    Cycle(CycleBenchArgs),
}

/// `spotplane bench cycle`.
#[derive(Debug, Args)]
pub struct CycleBenchArgs {
    /// Folder for the scratch SQLite database (replaced).
    #[arg(long, default_value = "data/bench-cycle")]
    pub out: PathBuf,
    /// A PostgreSQL URL to measure instead of SQLite (its tables must be empty or spotplane's).
    #[arg(long)]
    pub database: Option<String>,
    /// Jobs queued (each like `bench submit`'s: two replicas of a 3g.40gb MIG slice).
    #[arg(long, default_value_t = 11_000)]
    pub queued: usize,
    /// Scheduling cycles (and capacity rounds) to run.
    #[arg(long, default_value_t = 5)]
    pub cycles: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `spotplane bench finance`.
#[derive(Debug, Args)]
pub struct FinanceBenchArgs {
    /// Folder for the week's database and files (its database is replaced).
    #[arg(long, default_value = "data/finance-week")]
    pub out: PathBuf,
    /// Where in simulated time to start (RFC 3339).
    #[arg(long, default_value = "2026-07-01T00:00:00Z")]
    pub start: chrono::DateTime<chrono::Utc>,
    /// Simulated span.
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub span: Duration,
    /// Nodes alive at most at once.
    #[arg(long, default_value_t = 24)]
    pub max_nodes: usize,
    /// Jobs submitted per simulated hour, on average.
    #[arg(long, default_value_t = 4.0)]
    pub jobs_per_hour: f64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `spotplane bench sim`.
#[derive(Debug, Args)]
pub struct SimBenchArgs {
    /// Simulated span.
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub span: Duration,
    /// Where in simulated time to start (RFC 3339).
    #[arg(long, default_value = "2026-07-01T00:00:00Z")]
    pub start: chrono::DateTime<chrono::Utc>,
    /// How often nodes are looked at.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub step: Duration,
    /// How often offers are polled.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub price_refresh: Duration,
    /// Spot nodes kept running.
    #[arg(long, default_value_t = 64)]
    pub fleet: usize,
    /// Nodes are spread over this many of the cheapest offers.
    #[arg(long, default_value_t = 8)]
    pub spread: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `spotplane bench pack`: see `shared/data/openb-protocol.md` and docs/benchmarks.md.
#[derive(Debug, Args)]
pub struct PackArgs {
    /// The node list (`openb_node_list_gpu_node.csv`).
    #[arg(long)]
    pub nodes: PathBuf,
    /// The pod list (`openb_pod_list_<workload>.csv`).
    #[arg(long)]
    pub pods: PathBuf,
    /// random, best-fit, fgd, spotplane, or all (every policy on the same arrivals);
    /// repeat or separate with commas for several.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub policy: Vec<String>,
    /// Tune seed(s): 42, 42..51 (inclusive) or 42,45.
    #[arg(long, default_value = "42")]
    pub seed: crate::lab::openb::SeedList,
    /// GPU demand submitted, as a multiple of the cluster's GPU capacity.
    #[arg(long, default_value_t = 1.3)]
    pub inflate: f64,
    /// One JSON object per line per (policy, seed).
    #[arg(long)]
    pub json: bool,
}

/// `spotplane bench deadline`: the model is in `crate::lab::deadline` and docs/benchmarks.md.
#[derive(Debug, Args)]
pub struct DeadlineArgs {
    /// A Can't Be Late trace (`shared/data/spot/cant-be-late/.../*.json`); the job starts at
    /// its first tick. Repeat for a job that may move between pools (zones, regions, clouds):
    /// the traces are ticked on one clock and must have the same tick length.
    #[arg(long, required = true)]
    pub trace: Vec<PathBuf>,
    /// Hours of compute the job needs (rounded up to whole ticks).
    #[arg(long)]
    pub work_hours: f64,
    /// Hours from the first tick by which the work must be done (rounded down to whole ticks).
    #[arg(long)]
    pub deadline_hours: f64,
    /// Hours without progress after every start on a new instance, billed at that instance's
    /// price (rounded up to whole ticks).
    #[arg(long)]
    pub restart_hours: f64,
    /// With several traces: hours of moving the checkpoint to another pool, paid (besides the
    /// restart) by a spot start away from the checkpoint, billed like the restart.
    #[arg(long)]
    pub migrate_hours: Option<f64>,
    /// Spot USD per hour, or `trace` for the file's own per-tick prices.
    #[arg(long, required_unless_present = "spot_price_per_trace")]
    pub spot_price: Option<crate::lab::deadline::SpotPrice>,
    /// With several traces: one spot price per trace, in their order (USD per hour or
    /// `trace`), separated by commas.
    #[arg(long, value_delimiter = ',', conflicts_with = "spot_price")]
    pub spot_price_per_trace: Option<Vec<crate::lab::deadline::SpotPrice>>,
    /// On-demand USD per hour.
    #[arg(long)]
    pub ondemand_price: f64,
    /// on-demand, greedy, uniform-progress, spotplane, optimal, or all (every policy on the
    /// same trace); with several traces on-demand, uniform-progress (on the first pool),
    /// uniform-progress-rr, spotplane, optimal or all. Repeat or separate with commas.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub policy: Vec<String>,
    /// One JSON object per line per policy.
    #[arg(long)]
    pub json: bool,
}
