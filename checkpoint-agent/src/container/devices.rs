//! A replica's GPUs as the engine is given them: the node's GPUs and MIG devices from
//! `nvidia-smi -L`, its CDI devices from `nvidia-ctk cdi list`, and the mapping between them.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::Command;

use super::engine::run_captured;
use super::{CONTROL_TIMEOUT, Engine, engine_error};
use crate::inventory::{ListedMigDevice, parse_mig_devices};

/// A GPU line of `nvidia-smi -L`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGpu {
    pub index: u32,
    pub uuid: String,
}

/// What `nvidia-smi -L` lists: the GPUs, and their MIG devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmiList {
    pub gpus: Vec<ListedGpu>,
    pub migs: Vec<ListedMigDevice>,
}

/// Parses `nvidia-smi -L`:
/// ```text
/// GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c1e…)
///   MIG 3g.40gb     Device  0: (UUID: MIG-2f0d…)
/// ```
/// A line that cannot be read is skipped.
pub fn parse_smi_list(text: &str) -> SmiList {
    let gpus = text
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("GPU ")?;
            let (index, rest) = rest.split_once(':')?;
            let uuid = rest
                .rsplit_once("(UUID:")?
                .1
                .trim()
                .trim_end_matches(')')
                .trim();
            Some(ListedGpu {
                index: index.trim().parse().ok()?,
                uuid: uuid.to_owned(),
            })
            .filter(|g| g.uuid.starts_with("GPU-"))
        })
        .collect();
    SmiList {
        gpus,
        migs: parse_mig_devices(text),
    }
}

/// Parses `nvidia-ctk cdi list`: one fully qualified device name a line
/// (`nvidia.com/gpu=0`, `nvidia.com/gpu=GPU-…`, `nvidia.com/gpu=all`); the log lines it
/// prints (`INFO[0000] Found 5 CDI devices`) and anything else are skipped.
pub fn parse_cdi_list(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| {
            let Some((kind, name)) = l.split_once('=') else {
                return false;
            };
            let Some((vendor, class)) = kind.split_once('/') else {
                return false;
            };
            !vendor.is_empty()
                && !class.is_empty()
                && !name.is_empty()
                && vendor.contains('.')
                && !l.contains(char::is_whitespace)
                && !l.contains('[')
        })
        .map(str::to_owned)
        .collect()
}

/// The CDI devices of the spec directories, as `nvidia-ctk cdi list` names them; none when
/// no directory holds a spec. A spec without `nvidia-ctk` to read it is an error.
pub async fn cdi_names(dirs: &[PathBuf]) -> Result<Vec<String>, String> {
    let has_spec = dirs.iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let p = e.path();
                matches!(
                    p.extension().and_then(|x| x.to_str()),
                    Some("yaml" | "yml" | "json")
                )
            })
        })
    });
    if !has_spec {
        return Ok(Vec::new());
    }
    let mut c = Command::new("nvidia-ctk");
    c.args(["cdi", "list"])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for d in dirs {
        c.arg("--spec-dir").arg(d);
    }
    let out = run_captured(c, CONTROL_TIMEOUT, "nvidia-ctk").await?;
    if !out.status.success() {
        return Err(format!("nvidia-ctk cdi list: {}", engine_error(&out, None)));
    }
    Ok(parse_cdi_list(&String::from_utf8_lossy(&out.stdout)))
}

/// How a container gets its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelection {
    /// `--device <name>` for each (none: no GPU), and `NVIDIA_VISIBLE_DEVICES=void`.
    Cdi(Vec<String>),
    /// `NVIDIA_VISIBLE_DEVICES=<value>`, for the NVIDIA runtime: UUIDs, or `void`.
    Visible(String),
}

/// Maps a replica's devices (`Start.devices`: GPU indices, or a MIG device's UUID) to what
/// the engine is given. With `cdi` (the names `nvidia-ctk cdi list` prints), each device
/// becomes the CDI name of exactly that GPU or MIG device, by UUID where the spec has UUID
/// names, else by index (`0`, `gpu0`; `0:1`, `mig0:1` for MIG device 1 of GPU 0); one that
/// has no CDI name is an error (the spec is stale: regenerate it). Without CDI, each becomes
/// its UUID where `nvidia-smi -L` knows it, else stays as given (an index the NVIDIA runtime
/// reads too).
pub fn select_devices(
    devices: &[String],
    smi: &SmiList,
    cdi: Option<&[String]>,
) -> Result<DeviceSelection, String> {
    let mut names = Vec::new();
    for d in devices {
        let d = d.trim();
        // (uuid, index forms) of the device.
        let (uuid, indexed): (Option<String>, Vec<String>) = if d.starts_with("MIG-") {
            let forms = smi
                .migs
                .iter()
                .find(|m| m.uuid == d)
                .map(|m| {
                    vec![
                        format!("{}:{}", m.gpu, m.device),
                        format!("mig{}:{}", m.gpu, m.device),
                    ]
                })
                .unwrap_or_default();
            (Some(d.to_owned()), forms)
        } else if d.starts_with("GPU-") {
            let forms = smi
                .gpus
                .iter()
                .find(|g| g.uuid == d)
                .map(|g| vec![g.index.to_string(), format!("gpu{}", g.index)])
                .unwrap_or_default();
            (Some(d.to_owned()), forms)
        } else if let Ok(index) = d.parse::<u32>() {
            let uuid = smi
                .gpus
                .iter()
                .find(|g| g.index == index)
                .map(|g| g.uuid.clone());
            (uuid, vec![index.to_string(), format!("gpu{index}")])
        } else {
            return Err(format!(
                "device {d:?} is neither a GPU index nor a GPU or MIG UUID"
            ));
        };
        match cdi {
            Some(list) => {
                let found = uuid
                    .iter()
                    .chain(&indexed)
                    .map(|n| format!("nvidia.com/gpu={n}"))
                    .find(|n| list.contains(n));
                match found {
                    Some(n) => names.push(n),
                    None => {
                        return Err(format!(
                            "device {d} has no CDI name in the node's spec (nvidia-ctk cdi list lists {}); regenerate it with nvidia-ctk cdi generate",
                            if list.is_empty() {
                                "nothing".to_owned()
                            } else {
                                list.join(", ")
                            }
                        ));
                    }
                }
            }
            None => names.push(uuid.unwrap_or_else(|| d.to_owned())),
        }
    }
    // A device named twice (two shares of one GPU) is given once.
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    Ok(match cdi {
        Some(_) => DeviceSelection::Cdi(names),
        None if names.is_empty() => DeviceSelection::Visible("void".into()),
        None => DeviceSelection::Visible(names.join(",")),
    })
}

/// The devices of a replica about to start, read from the node now (a MIG re-layout makes
/// new devices).
pub async fn devices_for(engine: &Engine, devices: &[String]) -> Result<DeviceSelection, String> {
    if devices.is_empty() {
        return Ok(if engine.cdi {
            DeviceSelection::Cdi(Vec::new())
        } else {
            DeviceSelection::Visible("void".into())
        });
    }
    let mut c = Command::new("nvidia-smi");
    c.arg("-L").stdin(Stdio::null()).kill_on_drop(true);
    let smi = match run_captured(c, CONTROL_TIMEOUT, "nvidia-smi").await {
        Ok(out) if out.status.success() => parse_smi_list(&String::from_utf8_lossy(&out.stdout)),
        Ok(out) => {
            tracing::warn!(error = %engine_error(&out, None), "nvidia-smi -L failed; devices go by index");
            SmiList::default()
        }
        Err(e) => {
            tracing::warn!(error = %e, "devices go by index");
            SmiList::default()
        }
    };
    if engine.cdi {
        let names = cdi_names(&engine.settings.cdi_spec_dirs).await?;
        select_devices(devices, &smi, Some(&names))
    } else {
        select_devices(devices, &smi, None)
    }
}
