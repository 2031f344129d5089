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

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::signal::unix::{SignalKind, signal};

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
    let mut tick = tokio::time::interval(Duration::from_millis(step_ms.max(1)));
    // Started by an agent, it ends when the agent does: an agent killed outright (its machine
    // gone, in the tests) cannot stop it, and an orphan would train on unsupervised.
    let supervised = std::env::var_os("SPOTPLANE_JOB_ID").is_some();
    let parent = std::os::unix::process::parent_id();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if step >= steps {
                    println!("done step={step}");
                    return Ok(0);
                }
                if supervised && std::os::unix::process::parent_id() != parent {
                    println!("orphaned step={step}: the agent is gone");
                    return Ok(137);
                }
                step += 1;
            }
            _ = ask.recv() => {
                if marker.exists() {
                    // The previous checkpoint is still being uploaded; the directory is not ours.
                    println!("checkpoint skipped step={step} (upload in progress)");
                    continue;
                }
                save(&ckpt_dir, &marker, step, len)?;
                println!("checkpoint step={step}");
            }
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
