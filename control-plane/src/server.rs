//! Starting and stopping the control-plane server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use spotplane_providers::registry::{self, BuildContext, Providers};

use crate::reconcile::recovery::RecoveryLoop;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::clock::SharedClock;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::reconcile::capacity::CapacityLoop;
use crate::reconcile::ledger::LedgerLoop;
use crate::reconcile::runner::{self, Round};
use crate::reconcile::scheduling::SchedulerLoop;
use crate::reconcile::webhooks::WebhookLoop;
use crate::simfront;
use crate::store::{Bootstrap, Store};
use crate::webhooks::sender::Sender;

/// The shortest bootstrap admin token accepted: it is a password to the whole cluster.
pub const MIN_BOOTSTRAP_TOKEN_LEN: usize = 16;

/// What `serve` needs besides the configuration file.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// `SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN`: stored as an admin token if none exists yet.
    pub bootstrap_admin_token: Option<String>,
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    pub state: AppState,
    /// The configured clouds (simulated ones included).
    pub providers: Arc<Providers>,
    cancel: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Connects and migrates the database, stores the bootstrap token, binds and starts serving.
    pub async fn start(
        config: &Config,
        clock: SharedClock,
        opts: ServeOptions,
    ) -> anyhow::Result<Server> {
        let metrics = Metrics::new();
        // Before anything is written: a key that cannot be had (a corrupt key file) stops the
        // start, naming the file.
        let secrets_key = crate::secrets::SecretsKey::load(&config.secrets)
            .context("loading the secrets key (secrets.key_file / secrets.key)")?;
        let store = Store::connect(&config.database, metrics.clone()).await?;
        store
            .migrate()
            .await
            .context("applying database migrations")?;
        // Rows from before webhook signing secrets were sealed: sealed now, once.
        store
            .seal_clear_webhook_secrets(&secrets_key)
            .await
            .context("sealing webhook signing secrets stored in the clear")?;
        if let Some(secret) = &opts.bootstrap_admin_token {
            anyhow::ensure!(
                secret.len() >= MIN_BOOTSTRAP_TOKEN_LEN
                    && secret.chars().all(|c| c.is_ascii_graphic()),
                "SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN must be at least {MIN_BOOTSTRAP_TOKEN_LEN} visible ASCII characters"
            );
            match store.bootstrap_admin(secret, clock.now()).await? {
                Bootstrap::Created => tracing::info!("stored the bootstrap admin token"),
                Bootstrap::AlreadyPresent => {
                    tracing::debug!("bootstrap admin token already stored")
                }
                Bootstrap::Skipped => {
                    tracing::info!(
                        "admin tokens exist; SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN was not added"
                    )
                }
            }
        }
        let providers = Arc::new(
            registry::build(
                &config.providers,
                &BuildContext {
                    clock: clock.clone(),
                    sim_market: config.sim.market()?,
                    catalog_dir: config.catalog.dir.clone(),
                    observer: Some(metrics.provider_observer()),
                    sim_state_dir: config.sim.state_dir.clone(),
                },
            )
            .await
            .context("setting up the configured providers")?,
        );
        let sender =
            Arc::new(Sender::new(&config.webhooks).context("building the webhook HTTP client")?);
        let cancel = CancellationToken::new();
        let state = AppState::new(store.clone(), clock.clone(), metrics, &config.server)
            .with_finance(config.finance.clone())
            .with_webhooks(config.webhooks.clone(), sender.clone())
            .with_object_store(&config.object_store.url)
            .with_secrets(secrets_key.clone())
            .with_history(config.telemetry.history_samples)
            .with_shutdown(cancel.clone());
        let listener =
            tokio::net::TcpListener::bind(config.listen_addr().map_err(anyhow::Error::msg)?)
                .await
                .with_context(|| format!("binding {}", config.server.listen))?;
        let addr = listener.local_addr()?;
        let mut app = api::router(state.clone());
        if !providers.sims.is_empty() {
            app = app.merge(simfront::router(providers.sims.clone(), state.clone()));
        }
        let task = tokio::spawn(crate::listener::serve(
            listener,
            app,
            config.server.listener_limits(),
            cancel.clone(),
        ));
        for round in rounds(config, &store, &clock, &providers, sender, &secrets_key) {
            tracing::info!(lock = round.lock(), steps = ?round.names(), "loops of this replica (run while it leads)");
            tokio::spawn(runner::run(
                round,
                Arc::new(store.clone()),
                clock.clone(),
                cancel.clone(),
                Some(state.metrics().clone()),
            ));
        }
        if !config.telemetry.history_interval.is_zero() {
            tokio::spawn(sample_history(
                state.clone(),
                config.telemetry.history_interval,
                cancel.clone(),
            ));
        }
        state.set_ready(true);
        tracing::info!(%addr, "spotplane API listening");
        Ok(Server {
            addr,
            state,
            providers,
            cancel,
            task,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A token that stops the server when cancelled.
    pub fn cancellation(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Stops accepting, lets requests in flight finish (for up to 30 s), and returns.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.cancel.cancel();
        self.wait().await
    }

    /// Runs until the server stops (after its cancellation token is cancelled).
    pub async fn wait(self) -> anyhow::Result<()> {
        let drain = async {
            self.cancel.cancelled().await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        };
        tokio::select! {
            r = self.task => r.context("server task")?.context("serving HTTP"),
            () = drain => { tracing::warn!("requests still running 30 s after shutdown; exiting"); Ok(()) }
        }
    }
}

/// Takes a sample of the fleet for the live page's charts every `every`, until `cancel`.
async fn sample_history(state: AppState, every: Duration, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = state.sample_history().await {
            tracing::warn!(error = %e, "the live page's sample of the fleet could not be read");
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down");
}

/// The rounds of loops this replica runs while it leads each one's lock, from the config (each
/// part switched off there is left out; `Config::validate` refuses the combinations that
/// cannot work):
///
/// - `scheduling`: recovery → scheduling → capacity (capacity at its own interval), one lock
///   because each step works on what the one before wrote;
/// - `ledger` and `webhooks`, each under a lock of its own.
pub fn rounds(
    config: &Config,
    store: &Store,
    clock: &SharedClock,
    providers: &Arc<Providers>,
    sender: Arc<Sender>,
    secrets_key: &crate::secrets::SecretsKey,
) -> Vec<Round> {
    let mut scheduling = Round::new("scheduling", config.scheduler.interval);
    if config.recovery.enabled {
        scheduling = scheduling.step(RecoveryLoop::new(
            store.clone(),
            clock.clone(),
            Some(Arc::clone(providers)),
            config.recovery.settings(),
            config.object_store.url.clone(),
        ));
    }
    if config.scheduler.enabled {
        scheduling = scheduling.step(SchedulerLoop::new(
            store.clone(),
            clock.clone(),
            config.scheduler.clone(),
        ));
    }
    if config.capacity.enabled {
        scheduling = scheduling.step_every(
            CapacityLoop::new(
                store.clone(),
                Arc::clone(providers),
                clock.clone(),
                config.capacity.settings(),
            ),
            config.capacity.interval,
        );
    }
    let mut rounds = vec![scheduling];
    if config.finance.enabled {
        rounds.push(
            Round::new("ledger", config.finance.interval).step(LedgerLoop::new(
                store.clone(),
                clock.clone(),
                Some(providers),
                config.finance.clone(),
            )),
        );
    }
    if config.webhooks.enabled {
        rounds.push(
            Round::new("webhooks", config.webhooks.interval).step(WebhookLoop::new(
                store.clone(),
                clock.clone(),
                sender,
                config.webhooks.clone(),
                secrets_key.clone(),
            )),
        );
    }
    rounds.retain(|r| !r.is_empty());
    rounds
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use spotplane_providers::registry::Providers;

    use super::rounds;
    use crate::clock::{SharedClock, SystemClock};
    use crate::config::Config;
    use crate::metrics::Metrics;
    use crate::store::Store;
    use crate::webhooks::sender::Sender;

    #[tokio::test]
    async fn the_rounds_follow_the_config_part_by_part() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut base = Config::embedded_default().expect("default");
        base.database.url = format!("sqlite://{}", dir.path().join("s.sqlite").display());
        let store = Store::connect(&base.database, Metrics::new())
            .await
            .expect("store");
        let clock: SharedClock = Arc::new(SystemClock);
        let providers = Arc::new(Providers {
            all: vec![],
            sims: vec![],
        });
        let sender = Arc::new(Sender::new(&base.webhooks).expect("sender"));
        let key = crate::secrets::SecretsKey::generate();
        let names = |c: &Config| -> Vec<(&'static str, Vec<&'static str>)> {
            rounds(c, &store, &clock, &providers, Arc::clone(&sender), &key)
                .iter()
                .map(|r| (r.lock(), r.names()))
                .collect()
        };
        assert_eq!(
            names(&base),
            [
                ("scheduling", vec!["recovery", "scheduling", "capacity"]),
                ("ledger", vec!["ledger"]),
                ("webhooks", vec!["webhooks"]),
            ]
        );
        // The scheduler off leaves recovery running (capacity must be off too: validated).
        let mut c = base.clone();
        c.scheduler.enabled = false;
        c.capacity.enabled = false;
        c.finance.enabled = false;
        assert_eq!(
            names(&c),
            [
                ("scheduling", vec!["recovery"]),
                ("webhooks", vec!["webhooks"]),
            ]
        );
        // Nothing on: no round at all.
        c.recovery.enabled = false;
        c.webhooks.enabled = false;
        assert!(names(&c).is_empty());
    }
}
