//! Starting a replica: the team secrets it refers to, its image, the checkpoint it resumes
//! from, its workload (in a container or not) and the actor that owns it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use spotplane_core::agent::{AgentSecrets, CheckpointManifest, RegistryCredential, ReplicaPhase};
use tokio::sync::mpsc;

use super::replica::Actor;
use super::{Ctx, Event, Replica, StartSpec};
use crate::checkpoint::CheckpointStore;
use crate::client::fetch_secrets;
use crate::container::{self, ContainerLaunch};
use crate::isolation::{self, RunAs};
use crate::logs::LogSink;
use crate::workload::{Launch, Workload};

/// The replica's environment from the job's `env` and its secrets' values. Validation at
/// submit keeps the two apart and secrets off spotplane's own names; a command that breaks
/// either is refused here, naming the variable (never a value). spotplane's own variables are
/// set over these by the workload ([`Workload::start`]).
fn replica_env(
    mut env: BTreeMap<String, String>,
    secrets: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    for (name, value) in secrets {
        if name.starts_with("SPOTPLANE_") {
            return Err(format!(
                "secrets.{name}: names starting with SPOTPLANE_ are set by spotplane"
            ));
        }
        if env.contains_key(&name) {
            return Err(format!(
                "secrets.{name}: also set in the job's env; set it in one place"
            ));
        }
        env.insert(name, value);
    }
    Ok(env)
}

/// Restores the replica's checkpoint (the one named, else the latest durable one), starts
/// the workload and its actor. Returns a message for the command's result.
pub(super) async fn start_replica(ctx: &Ctx, s: StartSpec) -> Result<String, String> {
    let run_as = ctx.acquire_user(s.job_id).map_err(|e| e.to_string())?;
    let job_id = s.job_id;
    let started = start_as(ctx, s, run_as).await;
    if started.is_err() {
        ctx.release_user(job_id).await;
    }
    started
}

async fn start_as(ctx: &Ctx, s: StartSpec, run_as: Option<RunAs>) -> Result<String, String> {
    // (1) The team secrets the job refers to, through the node's own channel: their values go
    // into the replica's environment and the pull, and nowhere else (no log, no file, no
    // message).
    let AgentSecrets {
        env: secret_env,
        registry,
    } = if s.secrets {
        fetch_secrets(&ctx.cp, s.job_id).await?
    } else {
        AgentSecrets {
            env: BTreeMap::new(),
            registry: None,
        }
    };
    let env = replica_env(s.env, secret_env)?;
    // (2) The image, pulled with the `image_pull_secret` login (below), before the restore.
    let pull_login: Option<RegistryCredential> = registry;
    let base = ctx
        .job_dir(s.job_id)
        .join(format!("replica-{}", s.replica))
        .join(format!("attempt-{}", s.attempt));
    // The agent's folders down to the attempt: searchable, never writable by the workload.
    isolation::create_dirs(&base, 0o711).map_err(|e| e.to_string())?;
    // An image runs in a container or not at all: never on the host instead.
    let engine = match (&s.image, &ctx.engine) {
        (None, _) => None,
        (Some(image), Err(why)) => {
            return Err(format!(
                "the job's image {image} cannot run: this node has no container engine ({why})"
            ));
        }
        (Some(image), Ok(engine)) => {
            container::ensure_image(engine, image, pull_login.as_ref(), &ctx.cfg.work_dir).await?;
            Some(engine.clone())
        }
    };
    let store = CheckpointStore::open(&s.checkpoint_uri, &ctx.cfg.store_options)
        .map_err(|e| e.to_string())?;
    let resume = base.join("resume");
    let concurrency = ctx.cfg.upload.file_concurrency;
    let restored: Option<CheckpointManifest> = match &s.resume_from {
        Some(uri) => Some(
            store
                .restore_uri(uri, &resume, concurrency)
                .await
                .map_err(|e| format!("restoring {uri}: {e}"))?,
        ),
        None => store
            .restore_latest(s.replica, &resume, concurrency)
            .await
            .map_err(|e| format!("restoring the latest checkpoint: {e}"))?,
    };
    if restored.is_some() {
        let r = resume.clone();
        tokio::task::spawn_blocking(move || match run_as {
            Some(user) => isolation::hand_over(&r, user),
            None => isolation::set_mode(&r, 0o700),
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    }
    let log = LogSink {
        path: base.join("output.log"),
        max_file_bytes: ctx.cfg.logs.max_file_bytes,
        keep: ctx.cfg.logs.keep,
        ship: Some((ctx.logs.clone(), (s.job_id, s.replica, s.attempt))),
        archive: Some(store.clone()),
    };
    // spotplane's own rendezvous names over the job's env and secrets (validation keeps the job
    // from setting them).
    let mut env = env;
    if let Some(r) = &s.rendezvous {
        env.extend(
            crate::gang::env(r)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v)),
        );
    }
    let mut launch = Launch {
        job_id: s.job_id,
        replica: s.replica,
        attempt: s.attempt,
        node_id: Some(ctx.node_id),
        command: s.command,
        env,
        devices: s.devices,
        checkpoint_dir: base.join("checkpoint"),
        resume_dir: restored.as_ref().map(|_| resume.clone()),
        home_dir: Some(base.join("home")),
        tmp_dir: Some(base.join("tmp")),
        signal: ctx.signal,
        log: Some(log),
        run_as,
        working_dir: s.working_dir.map(PathBuf::from),
        container: None,
    };
    if let (Some(engine), Some(image)) = (engine, &s.image) {
        let devices = container::devices_for(&engine, &launch.devices).await?;
        let c = ContainerLaunch {
            engine,
            image: container::normalize_image(image),
            name: container::container_name(s.job_id, s.replica, s.attempt),
            node_id: ctx.node_id,
            devices,
            limits: s.limits,
            host_network: s.gang,
            env_file: base.join("container.env"),
        };
        container::create(&launch, &c).await?;
        launch.container = Some(c);
    }
    let workload = Workload::start(&launch).map_err(|e| e.to_string())?;
    let pid = workload.pid();
    let what = match workload.container() {
        Some(name) => format!("container {name}"),
        None => format!("pid {pid}"),
    };
    let key = (s.job_id, s.replica);
    let (tx, rx) = mpsc::channel(16);
    let actor = Actor {
        ctx: ctx.clone(),
        key,
        attempt: s.attempt,
        store,
        last_durable: None,
    };
    let owner = ctx.clone();
    tokio::spawn(async move {
        actor.run(workload, rx).await;
        owner.release_user(key.0).await;
    });
    ctx.event(Event::Started {
        key,
        replica: Replica {
            attempt: s.attempt,
            tx,
            phase: ReplicaPhase::Running,
            exit_code: None,
            exit_reported: 0,
        },
    });
    tracing::info!(job = %s.job_id, replica = s.replica, attempt = s.attempt, pid, container = launch.container.as_ref().map(|c| c.name.as_str()), resumed = restored.is_some(), "replica started");
    Ok(match restored {
        Some(m) => format!(
            "started {what}, resumed from checkpoint {}",
            m.checkpoint_id
        ),
        None => format!("started {what}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn secrets_join_the_jobs_env_and_may_not_shadow_it_or_spotplanes_own() {
        let env = map(&[("TRAIN_STEPS", "10")]);
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let cases: [(Vars, Result<Vars, &str>); 4] = [
            (&[], Ok(&[("TRAIN_STEPS", "10")])),
            (
                &[("HF_TOKEN", "v1")],
                Ok(&[("HF_TOKEN", "v1"), ("TRAIN_STEPS", "10")]),
            ),
            (&[("TRAIN_STEPS", "v2")], Err("secrets.TRAIN_STEPS")),
            (
                &[("SPOTPLANE_JOB_ID", "v3")],
                Err("secrets.SPOTPLANE_JOB_ID"),
            ),
        ];
        for (secrets, want) in cases {
            let got = replica_env(env.clone(), map(secrets));
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, map(want)),
                (Err(got), Err(field)) => {
                    assert!(got.starts_with(field), "{got}");
                    assert!(!got.contains("v2") && !got.contains("v3"), "{got}");
                }
                (got, want) => panic!("{secrets:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
