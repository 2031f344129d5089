//! `spotplane-example-train`: a stand-in for a training job that keeps the workload contract
//! (docs/agent.md).
//!
//! It counts steps. Its "weights" are a blob derived from the step number, so a resumed run
//! can tell that what it restored is exactly what was saved. On `SIGUSR1` (or the signal in
//! `SPOTPLANE_CHECKPOINT_SIGNAL`) it writes `state.json` and `weights.bin` into
//! `SPOTPLANE_CHECKPOINT_DIR`, then the marker `SPOTPLANE_CHECKPOINT_MARKER`; it does not touch
//! the directory again until the agent removes the marker. With `SPOTPLANE_RESUME_DIR` set it
//! starts from the step saved there. `SIGTERM` ends it with status 143; started by an agent
//! (`SPOTPLANE_JOB_ID` set), it ends with status 137 if the agent dies without stopping it.
//!
//! Settings (environment): `TRAIN_STEPS` (default 1,000,000), `TRAIN_STEP_MS` (default 100),
//! `TRAIN_WEIGHTS_BYTES` (default 1 MiB). It prints one line per event on stdout:
//! `resumed step=N`, `checkpoint step=N`, `done step=N`.
//!
//! `TRAIN_PRINT_SHA256_OF=<VAR>` makes it print `secret sha256=<hex>` at start, the SHA-256 of
//! the variable's value (`secret unset` without one): how the tests see a team secret reach
//! the replica's environment without the value being printed.
//!
//! A replica of a gang (`WORLD_SIZE` > 1) forms its group before it trains, as
//! `torch.distributed` does with `MASTER_ADDR`/`MASTER_PORT`: rank 0 listens on
//! `MASTER_ADDR:MASTER_PORT` (any address, if that one is not the node's), every other rank
//! connects (retrying until `TRAIN_RENDEZVOUS_TIMEOUT_MS`, default 120 s) and sends
//! `hello rank=R`; once all `WORLD_SIZE - 1` have, rank 0 answers each `ready world=N`. Rank 0
//! prints `peer joined rank=R from=ADDR` for each, and every rank prints
//! `rendezvous rank=R world=N node_rank=K master=ADDR:PORT peers=A,B,…`. Rank 0 keeps
//! listening while it trains: a replica placed again (an elastic gang) is answered at once
//! (`peer rejoined rank=R from=ADDR`). A gang that does not form in time ends the replica with
//! status 2, as a `torch.distributed` timeout would.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

#[derive(Debug, Serialize, Deserialize)]
struct State {
    step: u64,
    weights_bytes: u64,
    weights_sha256: String,
}

/// The weights after `step` steps: deterministic, so a resume can be checked.
fn weights(step: u64, len: usize) -> Vec<u8> {
    let mut x = step.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn env_u64(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|e| format!("{name}={v:?}: {e}")),
        Err(_) => Ok(default),
    }
}

fn resume(dir: &Path) -> Result<u64, String> {
    let state: State = serde_json::from_slice(
        &std::fs::read(dir.join("state.json")).map_err(|e| format!("reading state.json: {e}"))?,
    )
    .map_err(|e| format!("state.json: {e}"))?;
    let w =
        std::fs::read(dir.join("weights.bin")).map_err(|e| format!("reading weights.bin: {e}"))?;
    let expected = weights(state.step, w.len());
    if w != expected || hex::encode(Sha256::digest(&w)) != state.weights_sha256 {
        return Err(format!("weights.bin does not match step {}", state.step));
    }
    Ok(state.step)
}

fn save(dir: &Path, marker: &Path, step: u64, len: usize) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let w = weights(step, len);
    let state = State {
        step,
        weights_bytes: w.len() as u64,
        weights_sha256: hex::encode(Sha256::digest(&w)),
    };
    std::fs::write(dir.join("weights.bin"), &w).map_err(|e| format!("weights.bin: {e}"))?;
    let json = serde_json::to_vec_pretty(&state).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("state.json"), json).map_err(|e| format!("state.json: {e}"))?;
    std::fs::write(marker, step.to_string()).map_err(|e| format!("marker: {e}"))?;
    Ok(())
}

/// This replica's gang, from the rendezvous environment the agent sets.
#[derive(Debug, Clone)]
struct Gang {
    rank: u32,
    world: u32,
    node_rank: String,
    master_addr: String,
    master_port: u16,
    peers: String,
}

impl Gang {
    /// `None` for a replica on its own (no `WORLD_SIZE`, or 1).
    fn from_env() -> Result<Option<Gang>, String> {
        let world = match std::env::var("WORLD_SIZE") {
            Ok(v) => v
                .parse::<u32>()
                .map_err(|e| format!("WORLD_SIZE={v:?}: {e}"))?,
            Err(_) => return Ok(None),
        };
        if world <= 1 {
            return Ok(None);
        }
        let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
        let rank: u32 = var("RANK")?.parse().map_err(|e| format!("RANK: {e}"))?;
        if rank >= world {
            return Err(format!("RANK={rank} is not below WORLD_SIZE={world}"));
        }
        let port = var("MASTER_PORT")?;
        Ok(Some(Gang {
            rank,
            world,
            node_rank: std::env::var("SPOTPLANE_NODE_RANK").unwrap_or_else(|_| "?".into()),
            master_addr: var("MASTER_ADDR")?,
            master_port: port
                .parse()
                .map_err(|e| format!("MASTER_PORT={port:?}: {e}"))?,
            peers: std::env::var("SPOTPLANE_PEER_ADDRS").unwrap_or_default(),
        }))
    }

    fn formed(&self) {
        println!(
            "rendezvous rank={} world={} node_rank={} master={} peers={}",
            self.rank,
            self.world,
            self.node_rank,
            self.master(),
            self.peers
        );
    }

    fn master(&self) -> String {
        match self.master_addr.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.master_port),
            _ => format!("{}:{}", self.master_addr, self.master_port),
        }
    }

    /// Forms the group: rank 0 listens until every other rank said hello (and goes on
    /// listening for replicas placed again), the others connect to it.
    async fn form(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        if self.rank == 0 {
            let listener = self.listen().await?;
            let (formed_tx, formed_rx) = oneshot::channel();
            tokio::spawn(lead(listener, self.world, formed_tx));
            match tokio::time::timeout_at(deadline, formed_rx).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err("the rendezvous listener stopped".into()),
                Err(_) => {
                    return Err(format!(
                        "rendezvous: not every rank of {} connected to {} within {timeout:?}",
                        self.world,
                        self.master()
                    ));
                }
            }
        } else {
            self.join(deadline).await.map_err(|e| {
                format!(
                    "rendezvous: rank {} could not join {} within {timeout:?}: {e}",
                    self.rank,
                    self.master()
                )
            })?;
        }
        self.formed();
        Ok(())
    }

    /// Rank 0's listener: on `MASTER_ADDR` when it is this node's address, else on every
    /// address (behind NAT, or a hostname), at `MASTER_PORT`.
    async fn listen(&self) -> Result<TcpListener, String> {
        let any = |ip: &IpAddr| -> IpAddr {
            match ip {
                IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
                IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
            }
        };
        let ip = self
            .master_addr
            .parse::<IpAddr>()
            .unwrap_or(Ipv4Addr::UNSPECIFIED.into());
        let bound = match TcpListener::bind((ip, self.master_port)).await {
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
                TcpListener::bind((any(&ip), self.master_port)).await
            }
            other => other,
        };
        bound.map_err(|e| format!("rendezvous: cannot listen on {}: {e}", self.master()))
    }

    /// Connects to rank 0 and waits for its `ready`, trying again until `deadline` while it
    /// is not listening yet (or went away before answering).
    async fn join(&self, deadline: Instant) -> Result<(), String> {
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            match self.hello(deadline).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(last)
    }

    async fn hello(&self, deadline: Instant) -> Result<(), String> {
        let connect = TcpStream::connect((self.master_addr.as_str(), self.master_port));
        let stream = tokio::time::timeout_at(deadline, connect)
            .await
            .map_err(|_| "timed out connecting".to_owned())?
            .map_err(|e| e.to_string())?;
        let (read, mut write) = stream.into_split();
        write
            .write_all(format!("hello rank={}\n", self.rank).as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        let mut read = BufReader::new(read);
        tokio::time::timeout_at(deadline, read.read_line(&mut line))
            .await
            .map_err(|_| "connected, but rank 0 did not answer".to_owned())?
            .map_err(|e| e.to_string())?;
        match line.trim().strip_prefix("ready world=") {
            Some(n) if n == self.world.to_string() => Ok(()),
            Some(n) => Err(format!(
                "rank 0 has a world of {n}, this replica one of {}",
                self.world
            )),
            None if line.is_empty() => Err("rank 0 closed the connection".into()),
            None => Err(format!("rank 0 answered {:?}", line.trim())),
        }
    }
}

/// A `hello` that arrived: the rank, where from, and the connection to answer on.
type Hello = (u32, SocketAddr, tokio::net::tcp::OwnedWriteHalf);

/// Rank 0's side: reads each connection's `hello rank=R`; when every rank from 1 to
/// `world - 1` has said it, answers them all `ready` and reports the group formed; after that,
/// answers a newcomer (a replica placed again) at once. Runs as long as the process does.
async fn lead(listener: TcpListener, world: u32, formed: oneshot::Sender<()>) {
    let (tx, mut rx) = mpsc::channel::<Hello>(64);
    tokio::spawn(async move {
        loop {
            let Ok((stream, from)) = listener.accept().await else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let (read, write) = stream.into_split();
                let mut line = String::new();
                let mut read = BufReader::new(read);
                if !matches!(
                    tokio::time::timeout(Duration::from_secs(10), read.read_line(&mut line)).await,
                    Ok(Ok(_))
                ) {
                    return;
                }
                let rank = line
                    .trim()
                    .strip_prefix("hello rank=")
                    .and_then(|r| r.parse::<u32>().ok());
                match rank {
                    Some(r) if (1..world).contains(&r) => {
                        let _ = tx.send((r, from, write)).await;
                    }
                    _ => println!("rendezvous: ignored {:?} from {from}", line.trim()),
                }
            });
        }
    });
    let mut waiting: BTreeMap<u32, tokio::net::tcp::OwnedWriteHalf> = BTreeMap::new();
    let mut formed = Some(formed);
    let ready = format!("ready world={world}\n");
    while let Some((rank, from, mut write)) = rx.recv().await {
        if formed.is_none() {
            println!("peer rejoined rank={rank} from={from}");
            let _ = write.write_all(ready.as_bytes()).await;
            continue;
        }
        println!("peer joined rank={rank} from={from}");
        // A rank that tried again replaces its earlier connection.
        waiting.insert(rank, write);
        if waiting.len() + 1 == world as usize {
            for w in waiting.values_mut() {
                let _ = w.write_all(ready.as_bytes()).await;
            }
            waiting.clear();
            if let Some(f) = formed.take() {
                let _ = f.send(());
            }
        }
    }
}

/// On the checkpoint signal: writes the checkpoint of `step`, unless the last one is still
/// being uploaded.
fn on_checkpoint(dir: &Path, marker: &Path, step: u64, len: usize) -> Result<(), String> {
    if marker.exists() {
        // The previous checkpoint is still being uploaded; the directory is not ours.
        println!("checkpoint skipped step={step} (upload in progress)");
        return Ok(());
    }
    save(dir, marker, step, len)?;
    println!("checkpoint step={step}");
    Ok(())
}

async fn run() -> Result<u8, String> {
    let steps = env_u64("TRAIN_STEPS", 1_000_000)?;
    let step_ms = env_u64("TRAIN_STEP_MS", 100)?;
    let len =
        usize::try_from(env_u64("TRAIN_WEIGHTS_BYTES", 1 << 20)?).map_err(|e| e.to_string())?;
    if let Ok(var) = std::env::var("TRAIN_PRINT_SHA256_OF") {
        match std::env::var_os(&var) {
            Some(v) => println!(
                "secret sha256={}",
                hex::encode(Sha256::digest(v.as_encoded_bytes()))
            ),
            None => println!("secret unset"),
        }
    }
    let ckpt_dir = PathBuf::from(
        std::env::var("SPOTPLANE_CHECKPOINT_DIR")
            .map_err(|_| "SPOTPLANE_CHECKPOINT_DIR is not set".to_owned())?,
    );
    let marker = std::env::var("SPOTPLANE_CHECKPOINT_MARKER")
        .map(PathBuf::from)
        .unwrap_or_else(|_| ckpt_dir.join(".spotplane-checkpoint-complete"));
    let signal_name =
        std::env::var("SPOTPLANE_CHECKPOINT_SIGNAL").unwrap_or_else(|_| "SIGUSR1".into());
    let kind = match signal_name.as_str() {
        "SIGUSR1" => SignalKind::user_defined1(),
        "SIGUSR2" => SignalKind::user_defined2(),
        "SIGINT" => SignalKind::interrupt(),
        other => return Err(format!("unsupported checkpoint signal {other}")),
    };
    let mut ask = signal(kind).map_err(|e| e.to_string())?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;

    let mut step = match std::env::var("SPOTPLANE_RESUME_DIR") {
        Ok(dir) => {
            let s = resume(Path::new(&dir))?;
            println!("resumed step={s}");
            s
        }
        Err(_) => 0,
    };
    // Started by an agent, it ends when the agent does: an agent killed outright (its machine
    // gone, in the tests) cannot stop it, and an orphan would train on unsupervised.
    let supervised = std::env::var_os("SPOTPLANE_JOB_ID").is_some();
    let parent = std::os::unix::process::parent_id();
    let orphaned = || supervised && std::os::unix::process::parent_id() != parent;
    if let Some(gang) = Gang::from_env()? {
        let timeout = Duration::from_millis(env_u64("TRAIN_RENDEZVOUS_TIMEOUT_MS", 120_000)?);
        let form = gang.form(timeout);
        tokio::pin!(form);
        let mut watch = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                formed = &mut form => {
                    formed?;
                    break;
                }
                _ = ask.recv() => on_checkpoint(&ckpt_dir, &marker, step, len)?,
                _ = term.recv() => {
                    println!("terminated step={step} (before the gang formed)");
                    return Ok(143);
                }
                _ = watch.tick() => {
                    if orphaned() {
                        println!("orphaned step={step}: the agent is gone");
                        return Ok(137);
                    }
                }
            }
        }
    }
    let mut tick = tokio::time::interval(Duration::from_millis(step_ms.max(1)));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if step >= steps {
                    println!("done step={step}");
                    return Ok(0);
                }
                if orphaned() {
                    println!("orphaned step={step}: the agent is gone");
                    return Ok(137);
                }
                step += 1;
            }
            _ = ask.recv() => on_checkpoint(&ckpt_dir, &marker, step, len)?,
            _ = term.recv() => {
                println!("terminated step={step}");
                return Ok(143);
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("spotplane-example-train: {e}");
            ExitCode::from(2)
        }
    }
}
