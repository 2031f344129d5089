//! GPU telemetry through NVML, named after DCGM fields.
//!
//! Per GPU: utilisation (`DCGM_FI_DEV_GPU_UTIL`, `DCGM_FI_DEV_MEM_COPY_UTIL`), framebuffer
//! memory (`DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_TOTAL`), temperature (`DCGM_FI_DEV_GPU_TEMP`),
//! power (`DCGM_FI_DEV_POWER_USAGE`) and ECC errors (`DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`,
//! `…_DBE_VOL_TOTAL`, `…_DBE_AGG_TOTAL`). Per MIG device: its memory (NVML reports no
//! utilisation per MIG device; DCGM's profiling fields would be needed for that).
//!
//! A node without an NVIDIA driver (or without `libnvidia-ml.so`) has no telemetry: the
//! agent says so once and keeps working, sending heartbeats without GPU data. NVML is tried
//! again now and then, so a driver that finishes loading after the agent starts is picked up.

use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use spotplane_core::agent::GpuTelemetry;

/// Something that can read the node's GPUs.
pub trait TelemetrySource: Send {
    /// One reading per GPU and per MIG device; empty when there is nothing to read.
    fn sample(&mut self) -> Vec<GpuTelemetry>;
}

/// How often to try NVML again after it could not be loaded.
const RETRY_INIT: Duration = Duration::from_secs(300);

/// NVML, if the node has a driver.
pub struct NvmlTelemetry {
    nvml: Option<Nvml>,
    /// Why NVML is not available, reported once.
    unavailable: Option<String>,
    next_try: Instant,
}

impl std::fmt::Debug for NvmlTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlTelemetry")
            .field("available", &self.nvml.is_some())
            .field("unavailable", &self.unavailable)
            .finish()
    }
}

impl NvmlTelemetry {
    /// Loads NVML; on a node without a driver says so once (a warning) and returns a source
    /// that reports nothing.
    pub fn new() -> Self {
        let mut t = NvmlTelemetry {
            nvml: None,
            unavailable: None,
            next_try: Instant::now(),
        };
        t.try_init();
        t
    }

    /// Whether NVML loaded.
    pub fn available(&self) -> bool {
        self.nvml.is_some()
    }

    /// Why it did not, if it did not.
    pub fn unavailable_reason(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    fn try_init(&mut self) {
        self.next_try = Instant::now() + RETRY_INIT;
        match Nvml::init() {
            Ok(n) => {
                if self.unavailable.take().is_some() {
                    tracing::info!("NVML loaded; GPU telemetry on");
                }
                self.nvml = Some(n);
            }
            Err(e) => {
                let why = describe(&e);
                if self.unavailable.is_none() {
                    tracing::warn!(reason = %why, "no NVIDIA driver: no GPU telemetry; the agent keeps working without it");
                }
                self.unavailable = Some(why);
            }
        }
    }
}

impl Default for NvmlTelemetry {
    fn default() -> Self {
        Self::new()
    }
}

fn describe(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(_) => format!("libnvidia-ml.so cannot be loaded ({e})"),
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".into(),
        NvmlError::LibraryNotFound => "libnvidia-ml.so was not found".into(),
        other => other.to_string(),
    }
}

/// A reading NVML does not support is left out; other failures are logged at debug level.
fn opt<T>(what: &str, r: Result<T, NvmlError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            tracing::debug!(what, error = %e, "NVML reading failed");
            None
        }
    }
}

const MIB: u64 = 1 << 20;

impl TelemetrySource for NvmlTelemetry {
    fn sample(&mut self) -> Vec<GpuTelemetry> {
        if self.nvml.is_none() && Instant::now() >= self.next_try {
            self.try_init();
        }
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = opt("device count", nvml.device_count()).unwrap_or(0);
        let mut out = Vec::new();
        for i in 0..count {
            let Some(dev) = opt("device", nvml.device_by_index(i)) else {
                continue;
            };
            let mem = opt("memory", dev.memory_info());
            let util = opt("utilization", dev.utilization_rates());
            let ecc = |t, c| opt("ecc", dev.total_ecc_errors(t, c));
            out.push(GpuTelemetry {
                index: i,
                uuid: opt("uuid", dev.uuid()),
                mig_uuid: None,
                utilization_pct: util.as_ref().and_then(|u| u8::try_from(u.gpu).ok()),
                memory_utilization_pct: util.as_ref().and_then(|u| u8::try_from(u.memory).ok()),
                memory_used_mib: mem.as_ref().map(|m| m.used / MIB),
                memory_total_mib: mem.as_ref().map(|m| m.total / MIB),
                temperature_c: opt("temperature", dev.temperature(TemperatureSensor::Gpu))
                    .and_then(|t| i16::try_from(t).ok()),
                power_w: opt("power", dev.power_usage()).map(|mw| f64::from(mw) / 1000.0),
                ecc_sbe_volatile: ecc(MemoryError::Corrected, EccCounter::Volatile),
                ecc_dbe_volatile: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
                ecc_dbe_aggregate: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
                sm_clock_mhz: opt("sm clock", dev.clock_info(Clock::SM)),
                ..GpuTelemetry::default()
            });
            let mig_on = opt("mig mode", dev.mig_mode()).is_some_and(|m| m.current == 1);
            if !mig_on {
                continue;
            }
            let slots = opt("mig count", dev.mig_device_count()).unwrap_or(0);
            for m in 0..slots {
                // Unpopulated slots answer NotFound.
                let Ok(mig) = dev.mig_device_by_index(m) else {
                    continue;
                };
                let mem = opt("mig memory", mig.memory_info());
                out.push(GpuTelemetry {
                    index: i,
                    uuid: opt("uuid", dev.uuid()),
                    mig_uuid: opt("mig uuid", mig.uuid()),
                    // NVML names a MIG device "<GPU name> MIG 1g.10gb". Its GPU instance id
                    // and placement are not in nvml-wrapper's API: the control plane matches
                    // the device to a job by GPU and profile.
                    mig_profile: opt("mig name", mig.name()).and_then(|n| mig_profile_of(&n)),
                    memory_used_mib: mem.as_ref().map(|m| m.used / MIB),
                    memory_total_mib: mem.as_ref().map(|m| m.total / MIB),
                    ..GpuTelemetry::default()
                });
            }
        }
        out
    }
}

/// The MIG profile in an NVML MIG device name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb").
fn mig_profile_of(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty() && profile.contains('g') && profile.contains('.'))
        .then(|| profile.to_owned())
}

/// A fixed reading, for tests and the simulator.
#[derive(Debug, Clone, Default)]
pub struct FixedTelemetry(pub Vec<GpuTelemetry>);

impl TelemetrySource for FixedTelemetry {
    fn sample(&mut self) -> Vec<GpuTelemetry> {
        self.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This runs for real: on a machine without an NVIDIA driver (CI, this project's build
    /// machine) NVML cannot load, and the agent must carry on with no GPU data.
    #[test]
    fn without_a_driver_there_is_no_telemetry_and_no_failure() {
        let driver = std::path::Path::new("/proc/driver/nvidia/version").exists();
        let mut t = NvmlTelemetry::new();
        if driver {
            assert!(
                t.available(),
                "a driver is loaded, so NVML should be: {t:?}"
            );
            return;
        }
        assert!(!t.available());
        let why = t.unavailable_reason().expect("a reason").to_owned();
        assert!(!why.is_empty());
        for _ in 0..3 {
            assert!(t.sample().is_empty());
        }
        assert_eq!(t.unavailable_reason(), Some(why.as_str()));
    }

    #[test]
    fn the_mig_profile_is_read_from_the_device_name() {
        for (name, want) in [
            ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", Some("1g.10gb")),
            ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", Some("3g.20gb")),
            ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", Some("1g.10gb+me")),
            ("NVIDIA H100 80GB HBM3", None),
            ("NVIDIA H100 MIG ", None),
        ] {
            assert_eq!(mig_profile_of(name).as_deref(), want, "{name}");
        }
    }

    #[test]
    fn telemetry_goes_on_the_wire_under_dcgm_field_names() {
        let t = GpuTelemetry {
            index: 0,
            utilization_pct: Some(97),
            memory_used_mib: Some(70_000),
            power_w: Some(612.5),
            ecc_dbe_volatile: Some(0),
            ..GpuTelemetry::default()
        };
        let v = serde_json::to_value(&t).expect("json");
        assert_eq!(v["DCGM_FI_DEV_GPU_UTIL"], 97);
        assert_eq!(v["DCGM_FI_DEV_FB_USED"], 70_000);
        assert_eq!(v["DCGM_FI_DEV_POWER_USAGE"], 612.5);
        assert_eq!(v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"], 0);
        assert!(
            v.get("DCGM_FI_DEV_GPU_TEMP").is_none(),
            "absent readings are left out"
        );
        let names: Vec<&str> = t.dcgm_fields().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "DCGM_FI_DEV_GPU_UTIL",
                "DCGM_FI_DEV_FB_USED",
                "DCGM_FI_DEV_POWER_USAGE",
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
            ]
        );
    }
}
