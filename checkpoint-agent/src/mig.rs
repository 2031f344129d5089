//! Applying a MIG layout to one GPU.
//!
//! [`apply`] compares the GPU's instances with the layout wanted: instances in both stay,
//! the others are destroyed, the missing ones created at their placement. It refuses, changing
//! nothing, when an instance to destroy is in use — by a process the driver reports, or by a
//! replica this agent runs on it — because changing a layout needs the instances being
//! destroyed to be idle (REFERENCE.md "MIG geometry"). Whatever happens it reports the layout
//! the GPU has afterwards, so the control plane plans on what is.
//!
//! The driver is reached through [`MigControl`]; [`NvidiaSmi`] drives `nvidia-smi mig`.

use std::process::Command;

use spotplane_core::mig::profile_name;
use spotplane_core::{GpuModel, MigInstance, MigLayout, MigProfile};

use crate::inventory::parse_gpu_instances;

/// One GPU instance as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceState {
    pub instance: MigInstance,
    /// The driver's GPU instance id (what destroying takes).
    pub gpu_instance_id: u32,
    /// Whether a process runs on it.
    pub busy: bool,
}

/// A GPU's MIG state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMigState {
    pub model: GpuModel,
    pub instances: Vec<InstanceState>,
}

impl GpuMigState {
    pub fn layout(&self) -> Result<MigLayout, MigError> {
        MigLayout::new(self.instances.iter().map(|i| i.instance).collect())
            .map_err(|e| MigError::Driver(format!("the driver reports an impossible layout: {e}")))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    #[error("GPU instances in use, not destroyed: {0:?}")]
    Busy(Vec<MigInstance>),
    #[error("{0}")]
    Driver(String),
    #[error("the {0} GPU has no MIG profiles")]
    NotMigCapable(GpuModel),
}

/// The driver calls a re-layout needs.
pub trait MigControl: Send + Sync {
    fn read(&self, gpu: u32) -> Result<GpuMigState, MigError>;
    /// Destroys a GPU instance and its compute instances.
    fn destroy(&self, gpu: u32, gpu_instance_id: u32) -> Result<(), MigError>;
    /// Creates a GPU instance of `profile` at memory slice `start`, with its default compute
    /// instance.
    fn create(&self, gpu: u32, profile: &str, start: u8) -> Result<(), MigError>;
}

/// The outcome of [`apply`]: the layout the GPU has now, and the error if it is not the one
/// asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub layout: Option<MigLayout>,
    pub error: Option<MigError>,
}

/// Makes GPU `gpu`'s layout `desired`. `in_use` are instances this agent's replicas use.
pub fn apply(
    ctl: &dyn MigControl,
    gpu: u32,
    desired: &MigLayout,
    in_use: &[MigInstance],
) -> Applied {
    let result = (|| {
        let state = ctl.read(gpu)?;
        let names = |i: &MigInstance| {
            profile_name(state.model, i.class).ok_or(MigError::NotMigCapable(state.model))
        };
        let destroy: Vec<&InstanceState> = state
            .instances
            .iter()
            .filter(|s| !desired.instances().contains(&s.instance))
            .collect();
        let busy: Vec<MigInstance> = destroy
            .iter()
            .filter(|s| s.busy || in_use.contains(&s.instance))
            .map(|s| s.instance)
            .collect();
        if !busy.is_empty() {
            return Err(MigError::Busy(busy));
        }
        let have: Vec<MigInstance> = state.instances.iter().map(|s| s.instance).collect();
        let create: Vec<MigInstance> = desired
            .instances()
            .iter()
            .filter(|i| !have.contains(i))
            .copied()
            .collect();
        for s in destroy {
            tracing::info!(gpu, instance = %s.instance, "destroying MIG instance");
            ctl.destroy(gpu, s.gpu_instance_id)?;
        }
        for i in create {
            let name = names(&i)?;
            tracing::info!(gpu, instance = %i, profile = name, "creating MIG instance");
            ctl.create(gpu, name, i.start)?;
        }
        Ok(())
    })();
    let layout = ctl.read(gpu).and_then(|s| s.layout());
    match (result, layout) {
        (Ok(()), Ok(l)) if &l == desired => Applied {
            layout: Some(l),
            error: None,
        },
        (Ok(()), Ok(l)) => Applied {
            error: Some(MigError::Driver(format!(
                "the GPU has {l} after the re-layout, not {desired}"
            ))),
            layout: Some(l),
        },
        (Err(e), l) => Applied {
            layout: l.ok(),
            error: Some(e),
        },
        (Ok(()), Err(e)) => Applied {
            layout: None,
            error: Some(e),
        },
    }
}

/// `nvidia-smi mig`.
#[derive(Debug, Clone, Default)]
pub struct NvidiaSmi;

fn smi(args: &[&str]) -> Result<String, MigError> {
    let out = Command::new("nvidia-smi")
        .args(args)
        .output()
        .map_err(|e| MigError::Driver(format!("nvidia-smi: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(MigError::Driver(format!(
            "nvidia-smi {}: {} {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(text)
}

/// The model of an NVML product name (`NVIDIA H100 80GB HBM3`), for the MIG-capable ones.
pub fn model_of(name: &str) -> Option<GpuModel> {
    let n = name.to_ascii_uppercase();
    if n.contains("H100") {
        Some(GpuModel::H100_80GB)
    } else if n.contains("H200") {
        Some(GpuModel::H200_141GB)
    } else if n.contains("B200") {
        Some(GpuModel::B200_180GB)
    } else if n.contains("A100") {
        Some(if n.contains("80GB") {
            GpuModel::A100_80GB
        } else {
            GpuModel::A100_40GB
        })
    } else {
        None
    }
}

/// Rows of the "Processes" table of plain `nvidia-smi` on MIG devices: (GPU, GI id).
pub fn parse_mig_processes(text: &str) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.contains("Processes:") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let f: Vec<&str> = line.trim().trim_matches('|').split_whitespace().collect();
        // GPU, GI, CI, PID, type, name, memory
        if f.len() >= 5
            && let (Ok(gpu), Ok(gi), Ok(_pid)) = (
                f[0].parse::<u32>(),
                f[1].parse::<u32>(),
                f[3].parse::<u32>(),
            )
        {
            out.push((gpu, gi));
        }
    }
    out
}

impl MigControl for NvidiaSmi {
    fn read(&self, gpu: u32) -> Result<GpuMigState, MigError> {
        let g = gpu.to_string();
        let name = smi(&["--query-gpu=name", "--format=csv,noheader", "-i", &g])?;
        let model = model_of(name.trim())
            .ok_or_else(|| MigError::Driver(format!("unknown MIG GPU {:?}", name.trim())))?;
        let busy = parse_mig_processes(&smi(&["-i", &g])?);
        let text = match smi(&["mig", "-lgi", "-i", &g]) {
            Ok(t) => t,
            // No GPU instances at all is reported as an error by some drivers.
            Err(MigError::Driver(m)) if m.contains("No GPU instances found") => String::new(),
            Err(e) => return Err(e),
        };
        let mut instances = Vec::new();
        for gi in parse_gpu_instances(&text) {
            let class = gi
                .profile
                .parse::<MigProfile>()
                .ok()
                .and_then(|p| p.class_on(model))
                .ok_or_else(|| MigError::Driver(format!("unknown profile {}", gi.profile)))?;
            instances.push(InstanceState {
                instance: MigInstance::new(class, gi.start),
                gpu_instance_id: gi.instance_id,
                busy: busy.contains(&(gpu, gi.instance_id)),
            });
        }
        Ok(GpuMigState { model, instances })
    }

    fn destroy(&self, gpu: u32, gpu_instance_id: u32) -> Result<(), MigError> {
        let (g, gi) = (gpu.to_string(), gpu_instance_id.to_string());
        smi(&["mig", "-dci", "-i", &g, "-gi", &gi])?;
        smi(&["mig", "-dgi", "-i", &g, "-gi", &gi]).map(|_| ())
    }

    fn create(&self, gpu: u32, profile: &str, start: u8) -> Result<(), MigError> {
        smi(&[
            "mig",
            "-i",
            &gpu.to_string(),
            "-cgi",
            &format!("{profile}:{start}"),
            "-C",
        ])
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use spotplane_core::MigClass;

    use super::*;

    /// A GPU in memory: instances with ids, a set of busy ids, a log of calls.
    struct FakeGpu {
        model: GpuModel,
        instances: Mutex<Vec<(u32, MigInstance)>>,
        busy: Vec<u32>,
        next_id: Mutex<u32>,
        calls: Mutex<Vec<String>>,
        fail_create: bool,
    }

    impl FakeGpu {
        fn new(layout: &[MigInstance], busy: &[usize]) -> Self {
            FakeGpu {
                model: GpuModel::H100_80GB,
                instances: Mutex::new(
                    layout
                        .iter()
                        .enumerate()
                        .map(|(i, x)| (i as u32 + 1, *x))
                        .collect(),
                ),
                busy: busy.iter().map(|i| *i as u32 + 1).collect(),
                next_id: Mutex::new(100),
                calls: Mutex::new(Vec::new()),
                fail_create: false,
            }
        }
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }
    }

    impl MigControl for FakeGpu {
        fn read(&self, _gpu: u32) -> Result<GpuMigState, MigError> {
            let inst = self.instances.lock().unwrap_or_else(|p| p.into_inner());
            Ok(GpuMigState {
                model: self.model,
                instances: inst
                    .iter()
                    .map(|(id, i)| InstanceState {
                        instance: *i,
                        gpu_instance_id: *id,
                        busy: self.busy.contains(id),
                    })
                    .collect(),
            })
        }
        fn destroy(&self, _gpu: u32, id: u32) -> Result<(), MigError> {
            self.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("destroy {id}"));
            self.instances
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(i, _)| *i != id);
            Ok(())
        }
        fn create(&self, _gpu: u32, profile: &str, start: u8) -> Result<(), MigError> {
            self.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("create {profile}@{start}"));
            if self.fail_create {
                return Err(MigError::Driver("Insufficient Resources".into()));
            }
            let class = profile
                .parse::<MigProfile>()
                .ok()
                .and_then(|p| p.class_on(self.model))
                .ok_or_else(|| MigError::Driver("bad profile".into()))?;
            let mut id = self.next_id.lock().unwrap_or_else(|p| p.into_inner());
            *id += 1;
            self.instances
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((*id, MigInstance::new(class, start)));
            Ok(())
        }
    }

    fn i(class: MigClass, start: u8) -> MigInstance {
        MigInstance::new(class, start)
    }

    fn layout(v: &[MigInstance]) -> MigLayout {
        MigLayout::new(v.to_vec()).expect("valid")
    }

    #[test]
    fn instances_in_both_layouts_stay_and_the_rest_is_replaced() {
        let gpu = FakeGpu::new(&[i(MigClass::G4, 0), i(MigClass::G3, 4)], &[1]);
        let want = layout(&[i(MigClass::G2, 0), i(MigClass::G2, 2), i(MigClass::G3, 4)]);
        let got = apply(&gpu, 0, &want, &[]);
        assert_eq!(got.error, None);
        assert_eq!(got.layout, Some(want));
        assert_eq!(
            gpu.calls(),
            ["destroy 1", "create 2g.20gb@0", "create 2g.20gb@2"],
            "the busy 3g at 4 is kept, not recreated"
        );
    }

    #[test]
    fn an_instance_in_use_is_never_destroyed_and_nothing_changes() {
        let start = [i(MigClass::G3, 0), i(MigClass::G3, 4)];
        let want = layout(&[i(MigClass::G7, 0)]);
        // Busy by a process the driver reports ...
        let gpu = FakeGpu::new(&start, &[1]);
        let got = apply(&gpu, 0, &want, &[]);
        assert_eq!(got.error, Some(MigError::Busy(vec![i(MigClass::G3, 4)])));
        assert_eq!(got.layout, Some(layout(&start)));
        assert!(gpu.calls().is_empty());
        // ... or by a replica of this agent.
        let gpu = FakeGpu::new(&start, &[]);
        let got = apply(&gpu, 0, &want, &[i(MigClass::G3, 0)]);
        assert_eq!(got.error, Some(MigError::Busy(vec![i(MigClass::G3, 0)])));
        assert!(gpu.calls().is_empty());
    }

    #[test]
    fn a_failed_creation_reports_the_layout_left_behind() {
        let mut gpu = FakeGpu::new(&[i(MigClass::G7, 0)], &[]);
        gpu.fail_create = true;
        let got = apply(&gpu, 0, &layout(&[i(MigClass::G1, 0)]), &[]);
        assert!(matches!(got.error, Some(MigError::Driver(_))));
        assert_eq!(got.layout, Some(MigLayout::empty()));
    }

    #[test]
    fn nvml_names_map_to_models_and_the_process_table_to_instances() {
        assert_eq!(model_of("NVIDIA H100 80GB HBM3"), Some(GpuModel::H100_80GB));
        assert_eq!(model_of("NVIDIA A100-SXM4-40GB"), Some(GpuModel::A100_40GB));
        assert_eq!(model_of("NVIDIA A100-SXM4-80GB"), Some(GpuModel::A100_80GB));
        assert_eq!(model_of("Tesla T4"), None);
        let table = "+-----------------------------------------------------------------------------+\n\
                     | Processes:                                                                  |\n\
                     |  GPU   GI   CI        PID   Type   Process name                  GPU Memory |\n\
                     |        ID   ID                                                   Usage      |\n\
                     |=============================================================================|\n\
                     |    0    2    0      12345      C   python                           3000MiB |\n\
                     |    0    9    0      12399      C   python                            300MiB |\n\
                     +-----------------------------------------------------------------------------+\n";
        assert_eq!(parse_mig_processes(table), [(0, 2), (0, 9)]);
    }
}
