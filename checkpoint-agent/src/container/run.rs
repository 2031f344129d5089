//! A created container as its workload drives it: started attached, signalled through the
//! engine, removed once it has exited; and the containers an earlier agent left behind.

use std::ffi::OsString;
use std::process::Stdio;
use std::sync::Arc;

use spotplane_core::NodeId;
use tokio::process::Command;

use super::{CONTROL_TIMEOUT, ContainerLaunch, Engine, NAME_PREFIX, NODE_LABEL, engine_error};

/// A created container, as its [`crate::workload::Workload`] drives it.
#[derive(Debug)]
pub struct ContainerRun {
    engine: Arc<Engine>,
    name: String,
    removed: bool,
}

impl ContainerRun {
    pub fn new(c: &ContainerLaunch) -> ContainerRun {
        ContainerRun {
            engine: c.engine.clone(),
            name: c.name.clone(),
            removed: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `<engine> start --attach <name>`: the replica's child process. Its stdout and stderr
    /// are the workload's, its exit code the workload's.
    pub fn attach_command(&self) -> Command {
        let mut c = Command::new(&self.engine.program);
        c.args(["start", "--attach", self.name.as_str()]);
        c
    }

    /// Sends `signal` to the workload (its PID 1 in the container).
    pub async fn signal(&self, signal: nix::sys::signal::Signal) -> Result<(), String> {
        let out = self
            .engine
            .run(
                ["kill", "--signal", signal.as_str(), self.name.as_str()],
                CONTROL_TIMEOUT,
            )
            .await?;
        if out.status.success() {
            Ok(())
        } else {
            Err(engine_error(&out, None))
        }
    }

    /// Removes the container (killing it if it still runs), in the background, once.
    pub fn remove(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        let mut c = std::process::Command::new(&self.engine.program);
        c.args(["rm", "--force", self.name.as_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let name = self.name.clone();
        // Off the runtime's threads: this also runs from Drop.
        std::thread::spawn(move || match c.output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                tracing::warn!(container = %name, error = %engine_error(&out, None), "cannot remove the container");
            }
            Err(e) => tracing::warn!(container = %name, error = %e, "cannot remove the container"),
        });
    }
}

impl Drop for ContainerRun {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Removes the containers an earlier agent of this node left (after a crash or a kill), so
/// none runs on unsupervised. Returns how many it removed.
pub async fn remove_leftovers(engine: &Engine, node: NodeId) -> usize {
    let filter = format!("label={NODE_LABEL}={node}");
    let listed = engine
        .run(
            [
                "ps",
                "--all",
                "--filter",
                filter.as_str(),
                "--format",
                "{{.Names}}",
            ],
            CONTROL_TIMEOUT,
        )
        .await;
    let names: Vec<String> = match listed {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|n| n.starts_with(NAME_PREFIX))
            .map(str::to_owned)
            .collect(),
        Ok(out) => {
            tracing::warn!(error = %engine_error(&out, None), "cannot list leftover containers");
            return 0;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot list leftover containers");
            return 0;
        }
    };
    if names.is_empty() {
        return 0;
    }
    let mut args: Vec<OsString> = vec!["rm".into(), "--force".into()];
    args.extend(names.iter().map(OsString::from));
    match engine.run(args, CONTROL_TIMEOUT).await {
        Ok(out) if out.status.success() => {
            tracing::warn!(containers = ?names, "removed containers an earlier agent of this node left");
            names.len()
        }
        Ok(out) => {
            tracing::error!(containers = ?names, error = %engine_error(&out, None), "cannot remove leftover containers");
            0
        }
        Err(e) => {
            tracing::error!(containers = ?names, error = %e, "cannot remove leftover containers");
            0
        }
    }
}
