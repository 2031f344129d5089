//! The arguments of the production commands: `serve`'s neighbours — `job`, `offers`,
//! `catalog`, `export`, `healthcheck` — and the client flags they share.
//!
//! The command tree itself (`Cli`, `Command`) is in `main.rs`, the composition root, which puts
//! these beside the arguments of the lab's commands (`demo`, `replay`, `bench`), so that
//! nothing here depends on the lab.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

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

/// `spotplane secrets`.
#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Seal every team secret and webhook signing secret under the current key
    /// (`secrets.key` / `secrets.key_file`), opening them with it or `secrets.previous_keys`.
    /// Run it after a rotation, once every replica has the new configuration; then remove the
    /// previous keys. Writes nothing if any row cannot be opened, and names each such row.
    Reseal,
}

#[derive(Debug, Subcommand)]
pub enum CatalogCommand {
    /// Regenerate aws.csv and gcp.csv from SkyPilot's catalog CSVs and the recorded market
    /// data (azure.csv is kept by hand). docs/catalog.md says which column comes from where.
    Build {
        /// The shared data folder (SpotLake's AWS signals, the GCP price history).
        #[arg(long, default_value = "../shared/data")]
        data: PathBuf,
        /// A folder with SkyPilot's `aws.csv` and `gcp.csv` (`catalogs/v7/{aws,gcp}/vms.csv`,
        /// whole or filtered).
        #[arg(long, default_value = "data/catalog/skypilot")]
        skypilot: PathBuf,
        /// Where the catalogs go.
        #[arg(long, default_value = "config/catalog")]
        out: PathBuf,
    },
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
