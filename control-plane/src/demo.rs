//! `spotplane demo`: the whole system on one machine, from the embedded default.
//!
//! SQLite and a local-folder object store under `--data-dir`, an admin token written next to
//! them (or taken from `SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN`), and the API on `--listen`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::cli::DemoArgs;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::server::{ServeOptions, Server, shutdown_signal};
use crate::store::generate_secret;

/// The admin token for the demo: the given one, the one kept from an earlier run, or a new one
/// (kept in `<data_dir>/admin-token`, readable by its owner only).
fn admin_token(data_dir: &Path, given: Option<String>) -> anyhow::Result<(String, PathBuf)> {
    let path = data_dir.join("admin-token");
    if let Some(t) = given {
        return Ok((t, path));
    }
    if let Ok(existing) = std::fs::read_to_string(&path) {
        let t = existing.trim().to_owned();
        if !t.is_empty() {
            return Ok((t, path));
        }
    }
    let t = generate_secret();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode_owner_only()
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{t}")?;
    Ok((t, path))
}

trait OwnerOnly {
    fn mode_owner_only(&mut self) -> &mut Self;
}

impl OwnerOnly for std::fs::OpenOptions {
    #[cfg(unix)]
    fn mode_owner_only(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
    #[cfg(not(unix))]
    fn mode_owner_only(&mut self) -> &mut Self {
        self
    }
}

pub async fn run(
    mut config: Config,
    args: DemoArgs,
    bootstrap: Option<String>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    config.server.listen = args.listen.clone();
    config.database.url = format!("sqlite://{}", data_dir.join("spotplane.sqlite").display());
    config.database.schema = None;
    config.object_store.url = format!("file://{}", data_dir.join("objects").display());
    std::fs::create_dir_all(data_dir.join("objects"))?;
    if let Err(errs) = config.validate().into_result() {
        anyhow::bail!("invalid demo configuration: {errs}");
    }
    let (token, token_path) = admin_token(&data_dir, bootstrap)?;
    let server = Server::start(
        &config,
        std::sync::Arc::new(SystemClock),
        ServeOptions {
            bootstrap_admin_token: Some(token.clone()),
        },
    )
    .await?;
    let url = server.url();
    println!("spotplane demo is running");
    println!("  API          {url}   (OpenAPI: {url}/v1/openapi.json)");
    println!("  admin token  {token}");
    println!("               (kept in {})", token_path.display());
    println!(
        "  database     {}",
        data_dir.join("spotplane.sqlite").display()
    );
    println!("  objects      {}", data_dir.join("objects").display());
    println!();
    println!("  try:  curl -s -H \"Authorization: Bearer {token}\" {url}/v1/teams");
    println!("  stop: Ctrl-C");
    std::io::stdout().flush().ok();
    let cancel = server.cancellation();
    tokio::spawn(async move {
        shutdown_signal().await;
        cancel.cancel();
    });
    server.wait().await
}
