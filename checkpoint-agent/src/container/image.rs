//! Images: references made whole as both engines read them, registry logins in short-lived
//! auth files, and pulls.

use std::path::Path;

use spotplane_core::agent::RegistryCredential;

use super::engine::run_captured;
use super::{CONTROL_TIMEOUT, Engine, EngineKind, engine_error, write_private};

/// An image reference as both engines read it alike: Docker Hub's short names made whole
/// (`ubuntu:22.04` → `docker.io/library/ubuntu:22.04`, `acme/train` →
/// `docker.io/acme/train`), so podman never asks which registry a short name means.
pub fn normalize_image(image: &str) -> String {
    let image = image.trim();
    match image.split_once('/') {
        None => format!("docker.io/library/{image}"),
        Some((first, _)) if is_registry(first) => image.to_owned(),
        Some(_) => format!("docker.io/{image}"),
    }
}

/// Checks that `image` is an image reference (`[registry/]name[:tag][@digest]`) and nothing an
/// engine could read as a flag: it starts with a letter or digit and holds only the
/// characters references use.
/// The control plane checks the same at submit ([`spotplane_core::job::check_image_reference`]);
/// the agent checks again, since a command may come from an older control plane.
pub fn check_reference(image: &str) -> Result<(), String> {
    spotplane_core::job::check_image_reference(image)
        .map_err(|m| format!("{image:?} is not an image reference: it {m}"))
}

fn is_registry(component: &str) -> bool {
    component.contains('.') || component.contains(':') || component == "localhost"
}

/// The registry host of a (normalized) reference: `ghcr.io`, `localhost:5000`, `docker.io`.
pub fn registry_host(image: &str) -> String {
    let n = normalize_image(image);
    n.split('/').next().unwrap_or_default().to_owned()
}

/// Whether a present image is pulled again: `:latest` or no tag (which means latest), and
/// no digest (`@sha256:…` never changes).
pub fn refreshes(image: &str) -> bool {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains('@') {
        return false;
    }
    match last.split_once(':') {
        Some((_, tag)) => tag == "latest",
        None => true,
    }
}

/// The auth file of one registry login, in the engines' common format
/// (`{"auths": {"<host>": {"auth": base64(user:password)}}}`). Docker keys Docker Hub as
/// `https://index.docker.io/v1/`.
pub fn auth_json(kind: EngineKind, host: &str, cred: &RegistryCredential) -> String {
    use base64::Engine as _;
    let key = match (kind, host) {
        (EngineKind::Docker, "docker.io") => "https://index.docker.io/v1/",
        _ => host,
    };
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", cred.username, cred.password));
    serde_json::json!({ "auths": { key: { "auth": auth } } }).to_string()
}

/// What [`ensure_image`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageReady {
    /// Present locally and pinned: not pulled.
    Present,
    Pulled,
    /// A `:latest` present locally could not be pulled again: the local one runs (podman's
    /// `--pull newer`). The reason is logged.
    KeptLocal(String),
}

/// Makes sure the image is on the node, pulling it with `credential` when there is one.
/// The login goes into an auth file of its own (0600, in a 0700 folder under `scratch`,
/// deleted before this returns): podman's `--authfile`, docker's `DOCKER_CONFIG`. An image
/// that is neither present nor pullable is `Err("pulling <image>: <the engine's reason>")`.
pub async fn ensure_image(
    engine: &Engine,
    image: &str,
    credential: Option<&RegistryCredential>,
    scratch: &Path,
) -> Result<ImageReady, String> {
    check_reference(image.trim()).map_err(|e| format!("pulling {image}: {e}"))?;
    let image = normalize_image(image);
    let present = engine
        .run(
            ["image", "inspect", "--format", "{{.Id}}", image.as_str()],
            CONTROL_TIMEOUT,
        )
        .await
        .map_err(|e| format!("pulling {image}: {e}"))?
        .status
        .success();
    if present && !refreshes(&image) {
        return Ok(ImageReady::Present);
    }
    let mut c = engine.command();
    c.arg("pull");
    // Dropped (the folder and its file deleted) when this function returns.
    let _auth = match credential {
        Some(cred) => {
            let dir = tempfile::Builder::new()
                .prefix(".pull-")
                .tempdir_in(scratch)
                .map_err(|e| format!("pulling {image}: cannot make its auth folder: {e}"))?;
            let file = match engine.kind {
                EngineKind::Podman => dir.path().join("auth.json"),
                EngineKind::Docker => dir.path().join("config.json"),
            };
            write_private(
                &file,
                auth_json(engine.kind, &registry_host(&image), cred).as_bytes(),
            )
            .map_err(|e| format!("pulling {image}: cannot write its auth file: {e}"))?;
            match engine.kind {
                EngineKind::Podman => {
                    c.arg("--authfile").arg(&file);
                }
                EngineKind::Docker => {
                    c.env("DOCKER_CONFIG", dir.path());
                }
            }
            Some(dir)
        }
        None => None,
    };
    c.arg(&image);
    let out = run_captured(c, engine.settings.pull_timeout, engine.kind.as_str()).await;
    let secret = credential.map(|c| c.password.as_str());
    let failed = match out {
        Ok(out) if out.status.success() => return Ok(ImageReady::Pulled),
        Ok(out) => engine_error(&out, secret),
        Err(e) => e,
    };
    if present {
        tracing::warn!(%image, reason = %failed, "pulling a newer image failed; the local one runs");
        return Ok(ImageReady::KeptLocal(failed));
    }
    Err(format!("pulling {image}: {failed}"))
}
