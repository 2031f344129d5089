//! The credential used in production: azure_identity 1.x's credentials, chosen the way the
//! Azure SDKs' default credential chooses (azure_identity 1.0 has no `DefaultAzureCredential`).
//!
//! 1. `AZURE_TENANT_ID`, `AZURE_CLIENT_ID` and `AZURE_CLIENT_SECRET` set: a service principal
//!    ([`ClientSecretCredential`]; `AZURE_AUTHORITY_HOST` selects a sovereign cloud's login).
//! 2. `AZURE_FEDERATED_TOKEN_FILE` set (AKS workload identity): [`WorkloadIdentityCredential`].
//! 3. Otherwise a chain of [`ManagedIdentityCredential`] (user-assigned when `AZURE_CLIENT_ID`
//!    names one) then [`DeveloperToolsCredential`] (`az`, then `azd`). The first source that
//!    returns a token is used from then on. Until managed identity has worked once, its attempt
//!    is cut short after [`PROBE_TIMEOUT`], so a laptop without IMDS reaches `az` quickly.
//!    `AZURE_TOKEN_CREDENTIALS=prod` keeps only managed identity, `=dev` only the tools.
//!
//! Tests do not come here: they hand [`super::AzureProvider::with_credential`] a fake.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::{AccessToken, Secret, TokenCredential, TokenRequestOptions};
use azure_core::error::{Error, ErrorKind};
use azure_identity::{
    ClientSecretCredential, DeveloperToolsCredential, ManagedIdentityCredential,
    ManagedIdentityCredentialOptions, UserAssignedId, WorkloadIdentityCredential,
};

/// How long managed identity may take before the chain moves on, until it has worked once.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The credential for `from_config`, from the environment as described in the module docs.
pub fn from_environment() -> Result<Arc<dyn TokenCredential>, String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if let (Some(tenant), Some(client), Some(secret)) = (
        var("AZURE_TENANT_ID"),
        var("AZURE_CLIENT_ID"),
        var("AZURE_CLIENT_SECRET"),
    ) {
        return ClientSecretCredential::new(&tenant, client, Secret::new(secret), None)
            .map(|c| c as Arc<dyn TokenCredential>)
            .map_err(|e| format!("ClientSecretCredential: {e}"));
    }
    if var("AZURE_FEDERATED_TOKEN_FILE").is_some() {
        return WorkloadIdentityCredential::new(None)
            .map(|c| c as Arc<dyn TokenCredential>)
            .map_err(|e| format!("WorkloadIdentityCredential: {e}"));
    }
    let mode = var("AZURE_TOKEN_CREDENTIALS").map(|m| m.to_ascii_lowercase());
    let mut sources: Vec<Source> = Vec::new();
    if mode.as_deref() != Some("dev") {
        let options = ManagedIdentityCredentialOptions {
            user_assigned_id: var("AZURE_CLIENT_ID").map(UserAssignedId::ClientId),
            ..Default::default()
        };
        match ManagedIdentityCredential::new(Some(options)) {
            Ok(c) => sources.push(Source {
                name: "ManagedIdentityCredential",
                credential: c,
                probe: true,
            }),
            Err(e) => tracing::debug!(error = %e, "managed identity is not available here"),
        }
    }
    if mode.as_deref() != Some("prod") {
        let c = DeveloperToolsCredential::new(None)
            .map_err(|e| format!("DeveloperToolsCredential: {e}"))?;
        sources.push(Source {
            name: "DeveloperToolsCredential",
            credential: c,
            probe: false,
        });
    }
    if sources.is_empty() {
        return Err(
            "no Azure credential: set AZURE_CLIENT_SECRET, AZURE_FEDERATED_TOKEN_FILE, run on a managed identity, or log in with `az login`".into(),
        );
    }
    Ok(Arc::new(Chain {
        sources,
        chosen: AtomicUsize::new(usize::MAX),
    }))
}

struct Source {
    name: &'static str,
    credential: Arc<dyn TokenCredential>,
    /// Bounded by [`PROBE_TIMEOUT`] until chosen.
    probe: bool,
}

/// Tries its sources in order until one returns a token, then sticks to that one.
struct Chain {
    sources: Vec<Source>,
    chosen: AtomicUsize,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.sources.iter().map(|s| s.name).collect();
        f.debug_struct("Chain").field("sources", &names).finish()
    }
}

#[async_trait]
impl TokenCredential for Chain {
    async fn get_token(
        &self,
        scopes: &[&str],
        options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        if let Some(s) = self.sources.get(self.chosen.load(Ordering::Acquire)) {
            return s.credential.get_token(scopes, options).await;
        }
        let mut failures = Vec::new();
        for (i, s) in self.sources.iter().enumerate() {
            let attempt = s.credential.get_token(scopes, options.clone());
            let result = if s.probe {
                match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
                    Ok(r) => r,
                    Err(_) => {
                        failures.push(format!("{}: no answer within {PROBE_TIMEOUT:?}", s.name));
                        continue;
                    }
                }
            } else {
                attempt.await
            };
            match result {
                Ok(token) => {
                    self.chosen.store(i, Ordering::Release);
                    tracing::info!(credential = s.name, "using this Azure credential");
                    return Ok(token);
                }
                Err(e) => failures.push(format!("{}: {e}", s.name)),
            }
        }
        Err(Error::with_message(
            ErrorKind::Credential,
            format!("no Azure credential worked: {}", failures.join("; ")),
        ))
    }
}
