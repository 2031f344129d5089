//! The `spotplane` command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// spotplane: GPU work on the cheapest capacity across AWS, GCP and Azure, without losing work
/// when a cloud takes a node back.
#[derive(Debug, Parser)]
#[command(name = "spotplane", version, about, long_about = None)]
pub struct Cli {
    /// Configuration file layered over the embedded default (config/spotplane.toml).
    #[arg(long, short = 'c', global = true, env = "SPOTPLANE_CONFIG")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the control plane: API, and the reconcilers once they are configured.
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Run everything on this machine: SQLite, a local-folder object store, simulated clouds.
    Demo(DemoArgs),
    /// Check the configuration and print it with every override applied.
    Config,
    /// Submit and follow jobs (a client of a running server).
    #[command(subcommand)]
    Job(JobCommand),
    /// Load generators whose figures go into docs/benchmarks.md.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Print what the configured providers offer now, cheapest first.
    Offers(OffersArgs),
    /// Replay a Philly/Gavel workload on the simulated clouds in virtual time, per buying policy.
    Replay(ReplayArgs),
    /// Maintain the price catalogs in config/catalog/.
    #[command(subcommand)]
    Catalog(CatalogCommand),
    /// Export the cost ledger for a time range: CSV lines, or FinOps FOCUS (a client of a
    /// running server; finance and admin tokens export everything, team tokens their own).
    Export(ExportArgs),
    /// Exit 0 when the server's /healthz answers 200 (the container image's HEALTHCHECK: the
    /// image needs no curl).
    Healthcheck(HealthcheckArgs),
}

/// `spotplane healthcheck`.
#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// The liveness URL to ask.
    #[arg(
        long,
        env = "SPOTPLANE_HEALTHCHECK_URL",
        default_value = "http://127.0.0.1:8080/healthz"
    )]
    pub url: String,
    /// Give up after this long.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `spotplane export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// `csv` (the ledger's lines) or `focus` (FinOps FOCUS columns).
    #[arg(long, default_value = "csv", value_parser = ["csv", "focus"])]
    pub format: String,
    /// Start of the range (inclusive), RFC 3339; default: the first of this month.
    #[arg(long)]
    pub from: Option<chrono::DateTime<chrono::Utc>>,
    /// End of the range (exclusive), RFC 3339; default: now.
    #[arg(long)]
    pub to: Option<chrono::DateTime<chrono::Utc>>,
    /// Write here instead of standard output.
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct OffersArgs {
    /// Only this GPU model (e.g. H100-80GB, A100-40GB, L4).
    #[arg(long)]
    pub gpu: Option<String>,
    /// Only spot or only on-demand.
    #[arg(long, value_parser = ["spot", "on-demand"])]
    pub market: Option<String>,
    /// Only offers with at least this many GPUs per node.
    #[arg(long, default_value_t = 1)]
    pub min_gpus: u32,
    /// Sort by the price of one GPU-hour instead of the node-hour.
    #[arg(long)]
    pub per_gpu: bool,
    /// Rows to print (0: all).
    #[arg(long, default_value_t = 40)]
    pub limit: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
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
pub enum CatalogCommand {
    /// Regenerate aws.csv and gcp.csv from the recorded market data (azure.csv is kept by hand).
    Build {
        /// The shared data folder.
        #[arg(long, default_value = "../shared/data")]
        data: PathBuf,
        /// Where the catalogs go.
        #[arg(long, default_value = "config/catalog")]
        out: PathBuf,
    },
}

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

/// Where the server is and who is calling.
#[derive(Debug, Args, Clone)]
pub struct ClientArgs {
    /// Base URL of the spotplane API.
    #[arg(long, env = "SPOTPLANE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token.
    #[arg(long, env = "SPOTPLANE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Submit a job described in a JSON or YAML file ("-" reads standard input); examples in
    /// examples/jobs. A `deadline_in` (e.g. "48h") is counted from when the control plane
    /// receives the job; submitting the same file again returns the first job.
    Submit {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Makes the submission safe to retry; by default derived from the file's content.
        #[arg(long)]
        idempotency_key: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List jobs, newest first.
    List {
        /// Comma-separated states, e.g. queued,running.
        #[arg(long)]
        state: Option<String>,
        /// Only this team's jobs (admin tokens).
        #[arg(long)]
        team: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one job.
    Show {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel a job.
    Cancel {
        id: String,
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show a job's history.
    Events {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a replica's output (stdout and stderr) as the control plane keeps it; with
    /// `--follow`, as it comes, until the attempt ends.
    Logs {
        id: String,
        /// Stream new output until the attempt has ended.
        #[arg(short = 'f', long)]
        follow: bool,
        /// The replica, from 0.
        #[arg(long, default_value_t = 0)]
        replica: u32,
        /// The attempt, from 1 (default: the replica's latest).
        #[arg(long)]
        attempt: Option<u32>,
        /// Start with the last this many lines.
        #[arg(long)]
        tail: Option<u64>,
        #[command(flatten)]
        client: ClientArgs,
    },
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
    pub seed: crate::scheduler::openb::SeedList,
    /// GPU demand submitted, as a multiple of the cluster's GPU capacity.
    #[arg(long, default_value_t = 1.3)]
    pub inflate: f64,
    /// One JSON object per line per (policy, seed).
    #[arg(long)]
    pub json: bool,
}

/// `spotplane bench deadline`: the model is in `crate::deadline` and docs/benchmarks.md.
#[derive(Debug, Args)]
pub struct DeadlineArgs {
    /// A Can't Be Late trace (`shared/data/spot/cant-be-late/.../*.json`); the job starts at
    /// its first tick.
    #[arg(long)]
    pub trace: PathBuf,
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
    /// Spot USD per hour, or `trace` for the file's own per-tick prices.
    #[arg(long)]
    pub spot_price: crate::deadline::SpotPrice,
    /// On-demand USD per hour.
    #[arg(long)]
    pub ondemand_price: f64,
    /// on-demand, greedy, uniform-progress, spotplane, optimal, or all (every policy on the
    /// same trace); repeat or separate with commas for several.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub policy: Vec<String>,
    /// One JSON object per line per policy.
    #[arg(long)]
    pub json: bool,
}
