//! Builds the configured providers, each wrapped in the decorators every cloud call goes through.

use std::path::{Path, PathBuf};
use std::sync::Arc;
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
use std::time::Duration;

use spotplane_core::Cloud;

use crate::CloudProvider;
use crate::catalog::{self, CatalogError, CatalogRow};
use crate::clock::SharedClock;
use crate::config::ProviderConfig;
use crate::decorators::{Metered, Observer};
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
use crate::decorators::{RateLimited, Retrying};
pub use crate::sim::SimMarket;
use crate::sim::{SimCloud, SimTraces, traces::TraceError};

/// Real cloud APIs: attempts per call, first and longest backoff, the time budget of a call's
/// retries, calls per second and burst.
/// EC2's request-rate limits are per account and API action (mutating actions get ~5/s refill);
/// these keep one control plane well inside them.
/// The SDKs' own retries are off, so these attempts are all the requests one call makes.
/// No retry starts later than `RETRY_BUDGET` after the call did (a throttle asking for longer
/// ends the call at once): a cycle acting inside a notice window hears the error in time to do
/// something else.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub const RETRY_ATTEMPTS: u32 = 4;
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
const RETRY_BASE: Duration = Duration::from_millis(200);
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
const RETRY_MAX: Duration = Duration::from_secs(10);
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub const RETRY_BUDGET: Duration = Duration::from_secs(20);
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
const CALLS_PER_SECOND: f64 = 5.0;
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
const BURST: u32 = 10;

/// What building providers needs besides their configuration.
#[derive(Clone)]
pub struct BuildContext {
    pub clock: SharedClock,
    /// The market the simulated clouds replay: the recorded traces of a folder
    /// (`../shared/data` in a checkout), or the one shipped in the binary.
    pub sim_market: SimMarket,
    /// A folder of catalog CSVs replacing the ones built into the binary.
    pub catalog_dir: Option<PathBuf>,
    /// Reports every call (metrics); `None` reports nothing.
    pub observer: Option<Observer>,
    /// A folder keeping the simulated clouds' state (`<flavour>.json` each), so that they
    /// outlive the process and every process given it shares them; `None`: in memory.
    pub sim_state_dir: Option<PathBuf>,
}

/// The configured providers, in configuration order.
pub struct Providers {
    pub all: Vec<Arc<dyn CloudProvider>>,
    /// The simulated ones by themselves: their nodes' metadata endpoints are served from them.
    pub sims: Vec<Arc<SimCloud>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let clouds: Vec<Cloud> = self.all.iter().map(|p| p.cloud()).collect();
        f.debug_struct("Providers")
            .field("clouds", &clouds)
            .finish()
    }
}

impl Providers {
    /// The simulated cloud of a flavour, if one is configured.
    pub fn sim(&self, flavour: Cloud) -> Option<&Arc<SimCloud>> {
        self.sims.iter().find(|s| s.cloud() == flavour)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("the simulated clouds' traces: {0}")]
    Traces(#[from] TraceError),
    #[error(transparent)]
    SimState(#[from] crate::sim::StateFileError),
    #[error(
        "providers[{index}]: this binary was built without the `{kind}` feature; rebuild with `--features {kind}`"
    )]
    NotBuilt { index: usize, kind: &'static str },
    #[error("providers[{index}] ({kind}): {message}")]
    Setup {
        index: usize,
        kind: &'static str,
        message: String,
    },
}

/// The catalog of a cloud: from `dir` when given, else the one built into the binary.
pub fn catalog_of(cloud: Cloud, dir: Option<&Path>) -> Result<Vec<CatalogRow>, CatalogError> {
    match dir {
        Some(d) => catalog::load(&d.join(catalog::file_name(cloud))),
        None => catalog::parse(catalog::embedded(cloud), catalog::file_name(cloud)),
    }
}

/// Builds every configured provider. Simulated clouds share one load of the traces.
pub async fn build(
    configs: &[ProviderConfig],
    ctx: &BuildContext,
) -> Result<Providers, BuildError> {
    let mut all: Vec<Arc<dyn CloudProvider>> = Vec::with_capacity(configs.len());
    let mut sims = Vec::new();
    let mut traces: Option<Arc<SimTraces>> = None;
    for (index, cfg) in configs.iter().enumerate() {
        let cat = catalog_of(cfg.cloud(), ctx.catalog_dir.as_deref())?;
        match cfg {
            ProviderConfig::Sim(sim_cfg) => {
                let t = match &traces {
                    Some(t) => Arc::clone(t),
                    None => {
                        let t = Arc::new(SimTraces::for_market(&ctx.sim_market)?);
                        tracing::info!(market = %ctx.sim_market.describe(), "the simulated clouds replay this market");
                        traces = Some(Arc::clone(&t));
                        t
                    }
                };
                let mut sim = SimCloud::new(sim_cfg.clone(), cat, t, ctx.clock.clone());
                if let Some(dir) = &ctx.sim_state_dir {
                    std::fs::create_dir_all(dir).map_err(|e| crate::sim::StateFileError::Io {
                        path: dir.clone(),
                        source: e,
                    })?;
                    sim = sim.shared(&dir.join(format!("{}.json", sim_cfg.flavour)))?;
                }
                let sim = Arc::new(sim);
                sims.push(Arc::clone(&sim));
                // The simulation injects its own errors; they reach the planner undecorated,
                // as a real cloud's would after the retries ran out.
                all.push(metered(ArcProvider(sim), ctx));
            }
            other => all.push(real(index, other, cat, ctx).await?),
        }
    }
    Ok(Providers { all, sims })
}

/// Every provider is metered: its calls are traced (`provider_call` spans) and, with an
/// observer, measured.
fn metered<P: CloudProvider + 'static>(p: P, ctx: &BuildContext) -> Arc<dyn CloudProvider> {
    let observe: Observer = match &ctx.observer {
        Some(o) => Arc::clone(o),
        None => Arc::new(|_, _, _, _| {}),
    };
    Arc::new(Metered::new(p, observe))
}

#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
fn decorated<P: CloudProvider + 'static>(p: P, ctx: &BuildContext) -> Arc<dyn CloudProvider> {
    metered(
        Retrying::new(
            RateLimited::new(p, CALLS_PER_SECOND, BURST),
            RETRY_ATTEMPTS,
            RETRY_BASE,
            RETRY_MAX,
            RETRY_BUDGET,
        ),
        ctx,
    )
}

#[cfg_attr(
    not(any(feature = "aws", feature = "gcp", feature = "azure")),
    allow(unused_variables)
)]
async fn real(
    index: usize,
    cfg: &ProviderConfig,
    catalog: Vec<CatalogRow>,
    ctx: &BuildContext,
) -> Result<Arc<dyn CloudProvider>, BuildError> {
    match cfg {
        #[cfg(feature = "aws")]
        ProviderConfig::Aws(c) => {
            let p = crate::aws::AwsProvider::from_config(c, catalog)
                .await
                .map_err(|e| setup(index, "aws", e))?
                .with_clock(Arc::clone(&ctx.clock));
            Ok(decorated(p, ctx))
        }
        #[cfg(feature = "gcp")]
        ProviderConfig::Gcp(c) => {
            let p = crate::gcp::GcpProvider::from_config(c, catalog)
                .await
                .map_err(|e| setup(index, "gcp", e))?;
            Ok(decorated(p, ctx))
        }
        #[cfg(feature = "azure")]
        ProviderConfig::Azure(c) => {
            let p = crate::azure::AzureProvider::from_config(c, catalog)
                .await
                .map_err(|e| setup(index, "azure", e))?;
            Ok(decorated(p, ctx))
        }
        other => Err(BuildError::NotBuilt {
            index,
            kind: other.kind(),
        }),
    }
}

#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
fn setup(index: usize, kind: &'static str, e: crate::ProviderError) -> BuildError {
    BuildError::Setup {
        index,
        kind,
        message: e.to_string(),
    }
}

/// Lets an `Arc` of a provider be decorated while the registry keeps its own handle.
struct ArcProvider<P>(Arc<P>);

#[async_trait::async_trait]
impl<P: CloudProvider> CloudProvider for ArcProvider<P> {
    fn cloud(&self) -> Cloud {
        self.0.cloud()
    }
    async fn list_offers(&self) -> Result<Vec<crate::Offer>, crate::ProviderError> {
        self.0.list_offers().await
    }
    async fn provision(
        &self,
        req: &crate::ProvisionRequest,
    ) -> Result<crate::Instance, crate::ProviderError> {
        self.0.provision(req).await
    }
    async fn terminate(&self, provider_id: &str) -> Result<(), crate::ProviderError> {
        self.0.terminate(provider_id).await
    }
    async fn list_instances(
        &self,
        tags: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<crate::Instance>, crate::ProviderError> {
        self.0.list_instances(tags).await
    }
    async fn drain_interruptions(
        &self,
    ) -> Result<Vec<crate::InterruptionEvent>, crate::ProviderError> {
        self.0.drain_interruptions().await
    }
    async fn price_history(
        &self,
        pool: &crate::PoolRef<'_>,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<Vec<crate::PriceChange>>, crate::ProviderError> {
        self.0.price_history(pool, from, to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::sim::SimConfig;

    fn ctx() -> BuildContext {
        BuildContext {
            clock: Arc::new(ManualClock::new(
                "2026-11-30T00:00:00Z".parse().expect("time"),
            )),
            sim_market: SimMarket::Recorded(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"),
            ),
            catalog_dir: None,
            observer: None,
            sim_state_dir: None,
        }
    }

    #[tokio::test]
    async fn the_three_simulated_clouds_offer_gpus_from_the_embedded_catalogs() {
        let cfgs: Vec<ProviderConfig> = Cloud::ALL
            .iter()
            .map(|c| ProviderConfig::Sim(SimConfig::new(*c, 1)))
            .collect();
        let providers = build(&cfgs, &ctx()).await.expect("builds");
        assert_eq!(providers.all.len(), 3);
        assert_eq!(providers.sims.len(), 3);
        for p in &providers.all {
            let offers = p.list_offers().await.expect("offers");
            assert!(!offers.is_empty(), "{}", p.cloud());
            assert!(
                offers
                    .iter()
                    .all(|o| o.cloud == p.cloud() && o.gpu_count > 0)
            );
        }
    }

    #[tokio::test]
    async fn the_shipped_market_needs_no_data_folder() {
        let mut c = ctx();
        c.sim_market = SimMarket::Shipped;
        let cfgs: Vec<ProviderConfig> = Cloud::ALL
            .iter()
            .map(|c| ProviderConfig::Sim(SimConfig::new(*c, 1)))
            .collect();
        let providers = build(&cfgs, &c)
            .await
            .expect("builds without ../shared/data");
        for p in &providers.all {
            let offers = p.list_offers().await.expect("offers");
            assert!(
                offers
                    .iter()
                    .any(|o| o.market == spotplane_core::Market::Spot),
                "{} sells spot",
                p.cloud()
            );
        }
    }

    #[tokio::test]
    async fn a_missing_trace_folder_is_named() {
        let mut c = ctx();
        c.sim_market = SimMarket::Recorded(PathBuf::from("/nonexistent/shared/data"));
        let err = build(&[ProviderConfig::Sim(SimConfig::new(Cloud::Aws, 1))], &c)
            .await
            .expect_err("no traces");
        assert!(
            err.to_string().contains("/nonexistent/shared/data"),
            "{err}"
        );
    }
}
