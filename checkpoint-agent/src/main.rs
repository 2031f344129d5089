//! The `spotplane-agent` binary.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use spotplane_agent::agent::{AgentConfig, Deps};
use spotplane_agent::checkpoint::UploadConfig;
use spotplane_agent::container::{EngineSettings, RuntimeChoice};
use spotplane_agent::isolation::Isolation;
use spotplane_agent::notice::{CloudKind, ReqwestMetadata, source_for};
use spotplane_agent::telemetry::NvmlTelemetry;
use spotplane_core::agent::PROTOCOL_VERSION;
use tokio_util::sync::CancellationToken;

/// The spotplane node agent.
#[derive(Debug, Parser)]
#[command(name = "spotplane-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent: register, heartbeat, watch for termination notices, run and checkpoint
    /// the node's replicas.
    Run(RunArgs),
    /// Print the node's GPUs (and MIG devices) as the agent reports them, as JSON.
    Inventory,
    /// Print one telemetry sample of every GPU and MIG device, as JSON (empty without a driver).
    Telemetry,
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Print the agent and protocol versions.
    Version,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Notice-to-durable time and upload throughput against a plain copy of the same bytes.
    Upload(spotplane_agent::bench::UploadBenchArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The control plane's URL, e.g. https://spotplane.example.com.
    #[arg(long, env = "SPOTPLANE_CONTROL_PLANE")]
    control_plane: String,
    /// A file holding the node's one-time bootstrap token (spb_…). Once exchanged, the node
    /// credential kept in --work-dir is used instead.
    #[arg(long, env = "SPOTPLANE_BOOTSTRAP_TOKEN_FILE")]
    bootstrap_token_file: PathBuf,
    /// The cloud whose metadata service announces terminations.
    #[arg(long, value_enum, env = "SPOTPLANE_CLOUD")]
    cloud: CloudKind,
    /// The metadata service's base URL (default: the cloud's link-local address). The
    /// simulator serves `{control plane}/sim/metadata/{cloud}/{instance}`.
    #[arg(long, env = "SPOTPLANE_METADATA_URL")]
    metadata_url: Option<String>,
    /// Where the agent keeps its credential, the replicas' checkpoint directories and logs.
    #[arg(long, env = "SPOTPLANE_WORK_DIR")]
    work_dir: PathBuf,
    /// An object_store option for checkpoint URIs, `key=value` (repeatable), e.g.
    /// `aws_endpoint=http://127.0.0.1:5000`. Credentials come from the usual environment.
    #[arg(long = "store-option", value_parser = parse_kv)]
    store_options: Vec<(String, String)>,
    /// Size of multipart upload parts.
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    part_size: u64,
    /// Parts of one file uploaded at once.
    #[arg(long, default_value_t = 4)]
    part_concurrency: usize,
    /// Files uploaded at once.
    #[arg(long, default_value_t = 4)]
    file_concurrency: usize,
    /// Memory for file data being read and uploaded, over all files and parts.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    upload_memory: u64,
    /// The upload must end this long before a notice's deadline, to report it in time.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    deadline_margin: Duration,
    /// Grace period of replicas stopped by a drain (SIGTERM, then SIGKILL).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    drain_grace: Duration,
    /// Who replicas run as: `user`, a user of their own per job (needs root), or `none`,
    /// the agent's own user (which lets them read its credential: only for a node given to
    /// one team).
    #[arg(long, value_enum, default_value_t = Isolation::User, env = "SPOTPLANE_WORKLOAD_ISOLATION")]
    workload_isolation: Isolation,
    /// The first uid (and gid) of the range the jobs' users are taken from. No account may
    /// use the range.
    #[arg(long, default_value_t = spotplane_agent::isolation::DEFAULT_UID_BASE)]
    workload_uid_base: u32,
    /// How many uids the range holds (at most this many jobs at once on the node).
    #[arg(long, default_value_t = spotplane_agent::isolation::DEFAULT_UID_COUNT)]
    workload_uid_count: u32,
    #[command(flatten)]
    containers: ContainerArgs,
    /// A replica's `output.log` is rotated before it grows past this (`output.log.1` …); each
    /// file is archived under the job's checkpoint prefix once complete.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    log_max_bytes: u64,
    /// Rotated log files kept on the node beside `output.log`, per replica attempt.
    #[arg(long, default_value_t = 2)]
    log_keep: usize,
    /// Replicas' output waiting for the control plane at most (over all replicas); while it is
    /// unreachable, the oldest output beyond this is dropped (the files keep it).
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    log_pending_max: u64,
    /// How often new output is sent to the control plane.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    log_ship_interval: Duration,
    /// The private address gang peers reach this node at (`MASTER_ADDR`,
    /// `SPOTPLANE_PEER_ADDRS`), an IP address. By default the address this node reaches the
    /// control plane from.
    #[arg(long, env = "SPOTPLANE_ADVERTISE_ADDRESS", value_parser = spotplane_agent::gang::parse_advertise_address)]
    advertise_address: Option<std::net::IpAddr>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

/// How replicas of jobs with an image run (docs/agent.md, containers).
#[derive(Debug, Args)]
struct ContainerArgs {
    /// The engine that runs images: `auto` (podman if it answers, else docker), `podman`,
    /// `docker`, or `none` (no images on this node). Without one the node registers so, and
    /// a job with an image never runs here (not on the host instead either).
    #[arg(long, value_enum, default_value_t = RuntimeChoice::Auto, env = "SPOTPLANE_CONTAINER_RUNTIME")]
    container_runtime: RuntimeChoice,
    /// The OCI runtime of every container, a name or a path (e.g. `runc`, `crun`, `nvidia`);
    /// the engine's default when unset.
    #[arg(long, env = "SPOTPLANE_OCI_RUNTIME")]
    oci_runtime: Option<String>,
    /// A ulimit of every container, `name=soft[:hard]` (repeatable), e.g. `nofile=1024:1024`.
    #[arg(long = "container-ulimit", value_parser = spotplane_agent::container::parse_ulimit)]
    container_ulimits: Vec<String>,
    /// A flag added to every container's `create`, as it is (repeatable), e.g.
    /// `--container-arg=--security-opt=label=disable`.
    #[arg(long = "container-arg", allow_hyphen_values = true)]
    container_args: Vec<String>,
    /// A directory of CDI specs (repeatable); default `/etc/cdi` and `/var/run/cdi`.
    #[arg(long = "cdi-spec-dir")]
    cdi_spec_dirs: Vec<PathBuf>,
    /// Run a tiny init as each container's PID 1 (`--init`: podman needs catatonit).
    #[arg(long)]
    container_init: bool,
    /// How long pulling an image may take.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pull_timeout: Duration,
}

impl ContainerArgs {
    fn settings(self) -> EngineSettings {
        let defaults = EngineSettings::default();
        EngineSettings {
            runtime: self.container_runtime,
            oci_runtime: self.oci_runtime,
            ulimits: self.container_ulimits,
            extra_args: self.container_args,
            cdi_spec_dirs: if self.cdi_spec_dirs.is_empty() {
                defaults.cdi_spec_dirs
            } else {
                self.cdi_spec_dirs
            },
            init: self.container_init,
            pull_timeout: self.pull_timeout,
        }
    }
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

fn parse_size(s: &str) -> Result<u64, String> {
    spotplane_agent::bench::parse_size(s)
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let http = Arc::new(ReqwestMetadata::new(Duration::from_secs(5)).context("metadata client")?);
    let base = args
        .metadata_url
        .clone()
        .unwrap_or_else(|| args.cloud.default_metadata_url().to_owned());
    let notices = source_for(args.cloud, http, &base, None);
    let mut cfg = AgentConfig::new(
        &args.control_plane,
        &args.bootstrap_token_file,
        &args.work_dir,
    );
    cfg.store_options = args.store_options;
    cfg.upload = UploadConfig {
        part_size: usize::try_from(args.part_size).context("--part-size")?,
        multipart_threshold: args.part_size,
        part_concurrency: args.part_concurrency,
        file_concurrency: args.file_concurrency,
        memory_budget: usize::try_from(args.upload_memory).context("--upload-memory")?,
        ..UploadConfig::default()
    };
    cfg.deadline_margin = args.deadline_margin;
    cfg.drain_grace = args.drain_grace;
    cfg.isolation = args.workload_isolation;
    cfg.workload_uid_base = args.workload_uid_base;
    cfg.workload_uid_count = args.workload_uid_count;
    cfg.containers = args.containers.settings();
    anyhow::ensure!(
        args.log_max_bytes >= 64 * 1024,
        "--log-max-bytes must be at least 64KiB"
    );
    anyhow::ensure!(
        (Duration::from_millis(50)..=Duration::from_secs(60)).contains(&args.log_ship_interval),
        "--log-ship-interval must be between 50ms and 60s"
    );
    cfg.logs = spotplane_agent::logs::LogSettings {
        max_file_bytes: args.log_max_bytes,
        keep: args.log_keep,
        pending_max: usize::try_from(args.log_pending_max).context("--log-pending-max")?,
        ship_interval: args.log_ship_interval,
    };
    cfg.advertise_address = args.advertise_address;
    let deps = Deps {
        notices,
        telemetry: Box::new(NvmlTelemetry::new()),
        mig: Arc::new(spotplane_agent::mig::NvidiaSmi),
        clock: Arc::new(chrono::Utc::now),
    };
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutting down");
        stop.cancel();
    });
    spotplane_agent::agent::run(cfg, deps, cancel).await?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = matches!(&cli.command, Command::Run(a) if a.log_json);
    init_logs(json);
    let result: anyhow::Result<()> = match cli.command {
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("tokio runtime")
            .and_then(|rt| rt.block_on(run(args))),
        Command::Inventory => {
            let gpus = spotplane_agent::inventory::gpus();
            serde_json::to_string_pretty(&serde_json::json!({ "gpus": gpus }))
                .map(|s| println!("{s}"))
                .map_err(Into::into)
        }
        Command::Telemetry => {
            use spotplane_agent::telemetry::TelemetrySource;
            let sample = NvmlTelemetry::new().sample();
            serde_json::to_string_pretty(&sample)
                .map(|s| println!("{s}"))
                .map_err(Into::into)
        }
        Command::Bench(BenchCommand::Upload(args)) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("tokio runtime")
            .and_then(|rt| rt.block_on(spotplane_agent::bench::upload(args))),
        Command::Version => {
            println!(
                "spotplane-agent {} (protocol {PROTOCOL_VERSION})",
                env!("CARGO_PKG_VERSION")
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
