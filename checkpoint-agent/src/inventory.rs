//! What the node has: CPUs, memory and GPUs as NVML reports them through `nvidia-smi`.
//!
//! A node without an NVIDIA driver (or without `nvidia-smi`) has no GPUs and keeps working.
//! Output is parsed defensively: a line that cannot be read is logged and skipped, never a
//! panic, since driver versions print slightly different tables.

use std::process::Command;

use spotplane_core::agent::{GpuInfo, MigDeviceInfo};

/// Query used for the GPU list: one CSV line per GPU, no header, no units.
pub const GPU_QUERY: &str = "index,uuid,name,memory.total,mig.mode.current";

/// The GPUs of this node, or none when there is no driver.
pub fn gpus() -> Vec<GpuInfo> {
    let Some(list) = run(
        "nvidia-smi",
        &["--query-gpu", GPU_QUERY, "--format=csv,noheader,nounits"],
    ) else {
        return Vec::new();
    };
    let mut gpus = parse_gpu_list(&list);
    if gpus.iter().any(|g| g.mig_enabled) {
        let devices = run("nvidia-smi", &["-L"])
            .map(|l| parse_mig_devices(&l))
            .unwrap_or_default();
        let placements = run("nvidia-smi", &["mig", "-lgi"])
            .map(|t| parse_gpu_instances(&t))
            .unwrap_or_default();
        attach_mig(&mut gpus, devices, &placements);
    }
    gpus
}

fn run(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        tracing::debug!(program, ?args, status = %out.status, "command failed");
        return None;
    }
    String::from_utf8(out.stdout).ok()
}

/// Parses `nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current
/// --format=csv,noheader,nounits`.
pub fn parse_gpu_list(csv: &str) -> Vec<GpuInfo> {
    let mut out = Vec::new();
    for line in csv.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let parsed = (|| {
            if f.len() < 5 {
                return None;
            }
            Some(GpuInfo {
                index: f[0].parse().ok()?,
                uuid: f[1].to_owned(),
                name: f[2].to_owned(),
                memory_mib: f[3].parse().ok()?,
                mig_enabled: f[4].eq_ignore_ascii_case("enabled"),
                mig_devices: Vec::new(),
            })
        })();
        match parsed {
            Some(g) => out.push(g),
            None => tracing::warn!(line, "unreadable nvidia-smi GPU line skipped"),
        }
    }
    out
}

/// A MIG device line of `nvidia-smi -L`, with the GPU it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedMigDevice {
    pub gpu: u32,
    pub profile: String,
    pub device: u32,
    pub uuid: String,
}

/// Parses `nvidia-smi -L`:
/// ```text
/// GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c1e…)
///   MIG 3g.40gb     Device  0: (UUID: MIG-2f0d…)
/// ```
pub fn parse_mig_devices(text: &str) -> Vec<ListedMigDevice> {
    let mut out = Vec::new();
    let mut gpu: Option<u32> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("GPU ") {
            gpu = rest.split(':').next().and_then(|n| n.trim().parse().ok());
        } else if let (Some(rest), Some(g)) = (t.strip_prefix("MIG "), gpu) {
            let profile = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            let device = rest
                .split("Device")
                .nth(1)
                .and_then(|d| d.split(':').next())
                .and_then(|d| d.trim().parse().ok());
            let uuid = rest
                .split("UUID:")
                .nth(1)
                .map(|u| u.trim().trim_end_matches(')').trim().to_owned());
            match (device, uuid) {
                (Some(device), Some(uuid)) if !profile.is_empty() => out.push(ListedMigDevice {
                    gpu: g,
                    profile,
                    device,
                    uuid,
                }),
                _ => tracing::warn!(line = t, "unreadable nvidia-smi MIG line skipped"),
            }
        }
    }
    out
}

/// A GPU instance row of `nvidia-smi mig -lgi`: GPU, profile name, and placement start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstance {
    pub gpu: u32,
    pub profile: String,
    pub instance_id: u32,
    pub start: u8,
    pub size: u8,
}

/// Parses the table of `nvidia-smi mig -lgi`:
/// ```text
/// |   0  MIG 3g.40gb          9        2          4:4     |
/// ```
pub fn parse_gpu_instances(text: &str) -> Vec<GpuInstance> {
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim().trim_matches('|').trim();
        let f: Vec<&str> = t.split_whitespace().collect();
        // GPU, "MIG", profile, profile id, instance id, start:size
        if f.len() < 6 || f[1] != "MIG" {
            continue;
        }
        let parsed = (|| {
            let (start, size) = f[5].split_once(':')?;
            Some(GpuInstance {
                gpu: f[0].parse().ok()?,
                profile: f[2].to_owned(),
                instance_id: f[4].parse().ok()?,
                start: start.parse().ok()?,
                size: size.parse().ok()?,
            })
        })();
        if let Some(gi) = parsed {
            out.push(gi);
        }
    }
    out
}

/// A GPU instance profile as the driver describes it (`nvidia-smi mig -lgip`, `-lgipp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileGeometry {
    pub gpu: u32,
    /// `1g.18gb`; media-extension variants keep their suffix (`1g.18gb+me`).
    pub name: String,
    pub id: u32,
    /// Usable memory in MiB (below the name's label).
    pub memory_mib: u64,
    pub sms: u32,
    /// Memory-slice indices an instance may start at, and how many slices it takes.
    pub starts: Vec<u8>,
    pub size: u8,
}

/// Parses `nvidia-smi mig -lgip` (profiles) and `nvidia-smi mig -lgipp` (their placements),
/// which the driver answers whether or not MIG is on:
/// ```text
/// |   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |
/// GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
/// GPU  0 Profile ID  5 Placement : {0}:4
/// ```
pub fn parse_profile_geometry(lgip: &str, lgipp: &str) -> Vec<ProfileGeometry> {
    let mut placements: Vec<(u32, u32, Vec<u8>, u8)> = Vec::new();
    for line in lgipp.lines() {
        let parsed = (|| {
            let (head, tail) = line.split_once(':')?;
            let f: Vec<&str> = head.split_whitespace().collect();
            // GPU, n, Profile, ID, id, Placement(s)
            if f.len() < 5 || f[0] != "GPU" || f[2] != "Profile" {
                return None;
            }
            let (set, size) = tail.trim().rsplit_once(':')?;
            let starts = set
                .trim_matches(|c| c == '{' || c == '}')
                .split(',')
                .map(|s| s.trim().parse().ok())
                .collect::<Option<Vec<u8>>>()?;
            Some((
                f[1].parse().ok()?,
                f[4].parse().ok()?,
                starts,
                size.trim().parse().ok()?,
            ))
        })();
        placements.extend(parsed);
    }
    let mut out = Vec::new();
    for line in lgip.lines() {
        let f: Vec<&str> = line.trim().trim_matches('|').split_whitespace().collect();
        // GPU, "MIG", name, id, free/total, memory GiB, P2P, SM, DEC, ENC
        if f.len() < 8 || f[1] != "MIG" {
            continue;
        }
        let parsed = (|| {
            let gpu: u32 = f[0].parse().ok()?;
            let id: u32 = f[3].parse().ok()?;
            let gib: f64 = f[5].parse().ok()?;
            let (_, _, starts, size) = placements
                .iter()
                .find(|(g, i, _, _)| *g == gpu && *i == id)?
                .clone();
            Some(ProfileGeometry {
                gpu,
                name: f[2].to_owned(),
                id,
                memory_mib: (gib * 1024.0).round() as u64,
                sms: f[7].parse().ok()?,
                starts,
                size,
            })
        })();
        out.extend(parsed);
    }
    out
}

/// Joins MIG devices to their GPUs. Placements come from `mig -lgi`, matched by GPU and
/// profile in listing order (both commands list instances in the same order).
pub fn attach_mig(gpus: &mut [GpuInfo], devices: Vec<ListedMigDevice>, placements: &[GpuInstance]) {
    for g in gpus.iter_mut() {
        let mut used = vec![false; placements.len()];
        for d in devices.iter().filter(|d| d.gpu == g.index) {
            let slot = placements
                .iter()
                .enumerate()
                .find(|(i, p)| !used[*i] && p.gpu == d.gpu && p.profile == d.profile);
            let start = match slot {
                Some((i, p)) => {
                    used[i] = true;
                    p.start
                }
                None => {
                    tracing::warn!(gpu = g.index, profile = %d.profile, "no placement found for MIG device; skipped");
                    continue;
                }
            };
            let memory_mib = d
                .profile
                .split_once('.')
                .and_then(|(_, m)| m.trim_end_matches("gb").parse::<u64>().ok())
                .map_or(0, |gb| gb * 1024);
            g.mig_devices.push(MigDeviceInfo {
                uuid: d.uuid.clone(),
                profile: d.profile.clone(),
                start,
                memory_mib,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUERY: &str = "0, GPU-5c1e2a1b-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, Enabled\n\
                         1, GPU-6d2f3b2c-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, Disabled\n\
                         garbage line\n";

    const LIST: &str = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c1e2a1b-0000-0000-0000-000000000000)\n  \
                        MIG 3g.40gb     Device  0: (UUID: MIG-aaaa)\n  \
                        MIG 2g.20gb     Device  1: (UUID: MIG-bbbb)\n  \
                        MIG 1g.10gb     Device  2: (UUID: MIG-cccc)\n\
                        GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-6d2f3b2c-0000-0000-0000-000000000000)\n";

    const LGI: &str = "+-------------------------------------------------------+\n\
                       | GPU instances:                                        |\n\
                       | GPU   Name             Profile  Instance   Placement  |\n\
                       |                          ID       ID       Start:Size |\n\
                       |=======================================================|\n\
                       |   0  MIG 3g.40gb          9        2          4:4     |\n\
                       +-------------------------------------------------------+\n\
                       |   0  MIG 2g.20gb         14        3          0:2     |\n\
                       +-------------------------------------------------------+\n\
                       |   0  MIG 1g.10gb         19        9          2:1     |\n\
                       +-------------------------------------------------------+\n";

    #[test]
    fn gpu_lines_are_parsed_and_garbage_skipped() {
        let gpus = parse_gpu_list(QUERY);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(gpus[0].memory_mib, 81_559);
        assert!(gpus[0].mig_enabled);
        assert!(!gpus[1].mig_enabled);
        assert!(parse_gpu_list("").is_empty(), "no driver, no GPUs");
    }

    #[test]
    fn mig_devices_get_their_placement_from_the_instance_table() {
        let mut gpus = parse_gpu_list(QUERY);
        attach_mig(
            &mut gpus,
            parse_mig_devices(LIST),
            &parse_gpu_instances(LGI),
        );
        let starts: Vec<_> = gpus[0]
            .mig_devices
            .iter()
            .map(|d| (d.profile.as_str(), d.start))
            .collect();
        assert_eq!(starts, [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2)]);
        assert_eq!(gpus[0].mig_devices[0].uuid, "MIG-aaaa");
        assert!(gpus[1].mig_devices.is_empty());
    }

    /// What a real H200's driver says of its MIG profiles (captured by scripts/gpu-check on a
    /// lent GPU machine) is what spotplane schedules on: names, start slots, sizes, SMs and
    /// usable memory.
    #[test]
    fn the_h200_driver_agrees_with_the_geometry_spotplane_schedules_on() {
        use spotplane_core::mig::{profile_name, sm_count, usable_memory_mib};
        use spotplane_core::{GpuModel, MigClass};
        let text = include_str!("../tests/fixtures/h200-driver-580.txt");
        let section = |cmd: &str| {
            text.split("### ")
                .find(|s| s.starts_with(cmd))
                .map(|s| s[cmd.len()..].to_owned())
                .unwrap_or_default()
        };
        let geometry = parse_profile_geometry(
            &section("nvidia-smi mig -lgip\n"),
            &section("nvidia-smi mig -lgipp\n"),
        );
        assert_eq!(
            geometry.len(),
            7,
            "six classes and 1g.18gb+me: {geometry:?}"
        );
        let model = GpuModel::H200_141GB;
        for class in MigClass::ALL {
            let name = profile_name(model, class).expect("H200 has MIG");
            let g = geometry
                .iter()
                .find(|g| g.name == name)
                .unwrap_or_else(|| panic!("{name} in {geometry:?}"));
            assert_eq!(g.starts, class.allowed_starts(), "{name}");
            assert_eq!(g.size, class.memory_slices(), "{name}");
            assert_eq!(Some(g.sms), sm_count(model, class).map(u32::from), "{name}");
            assert_eq!(
                Some(g.memory_mib),
                usable_memory_mib(model, class).map(u64::from),
                "{name}"
            );
        }
        assert!(parse_profile_geometry("garbage", "GPU x Profile").is_empty());
    }

    #[test]
    fn the_reported_layout_is_valid_mig_geometry() {
        use spotplane_core::{GpuModel, MigInstance, MigLayout, MigProfile};
        let mut gpus = parse_gpu_list(QUERY);
        attach_mig(
            &mut gpus,
            parse_mig_devices(LIST),
            &parse_gpu_instances(LGI),
        );
        let instances: Vec<MigInstance> = gpus[0]
            .mig_devices
            .iter()
            .map(|d| {
                let p: MigProfile = d.profile.parse().expect("profile");
                MigInstance::new(p.class_on(GpuModel::H100_80GB).expect("class"), d.start)
            })
            .collect();
        assert!(MigLayout::new(instances).is_ok());
    }
}
