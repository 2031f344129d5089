//! The price catalog: per cloud, what can be bought where and at what price.
//!
//! One CSV per cloud in `config/catalog/`, with SkyPilot's catalog columns so people who know
//! that catalog read ours at once: `InstanceType, vCPUs, MemoryGiB, AcceleratorName,
//! AcceleratorCount, Region, AvailabilityZone, Price, SpotPrice`, plus the capacity signals
//! some clouds publish, `PlacementScore` and `InterruptionBucket`. Prices are US dollars per
//! hour as decimal strings and are read exactly into micro-dollars.
//!
//! The catalog is the simulated clouds' price list and the real providers' fallback when a live
//! price cannot be read. `aws.csv` and `gcp.csv` are generated from the recorded market data in
//! `../shared/data` by [`build_aws`] and [`build_gcp`] (`spotplane catalog build`); `azure.csv`
//! is kept by hand (docs/catalog.md says from where).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use spotplane_core::{Cloud, GpuModel, Micros};

/// One row: an instance type in one zone.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogRow {
    pub instance_type: Arc<str>,
    pub vcpus: u32,
    pub memory_gib: f64,
    pub gpu_model: Option<GpuModel>,
    pub gpu_count: u32,
    pub region: Arc<str>,
    pub zone: Arc<str>,
    /// On-demand price per hour.
    pub price: Micros,
    /// Spot price per hour, when the type is sold on spot there.
    pub spot_price: Option<Micros>,
    pub placement_score: Option<f64>,
    pub interruption_bucket: Option<Arc<str>>,
}

/// A catalog file that cannot be read; names the file and line.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Parse {
        path: String,
        line: usize,
        message: String,
    },
}

impl CatalogError {
    /// A parse error at `line` (1-based, csv's line numbers) of `origin`.
    fn parse(origin: &str, line: u64, message: String) -> CatalogError {
        CatalogError::Parse {
            path: origin.to_owned(),
            line: line as usize,
            message,
        }
    }
}

pub const HEADER: &str = "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,Region,AvailabilityZone,Price,SpotPrice,PlacementScore,InterruptionBucket";

/// Reads a catalog CSV.
pub fn load(path: &Path) -> Result<Vec<CatalogRow>, CatalogError> {
    let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses catalog CSV text; `origin` names it in errors. Fields may be quoted (a user's file
/// written by a spreadsheet, a GPU description with commas): read with the `csv` crate.
pub fn parse(text: &str, origin: &str) -> Result<Vec<CatalogRow>, CatalogError> {
    let err = |line: u64, message: String| CatalogError::parse(origin, line, message);
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| err(1, e.to_string()))?
        .iter()
        .collect::<Vec<_>>()
        .join(",");
    if header.is_empty() {
        return Err(err(1, "empty file".into()));
    }
    if header != HEADER {
        return Err(err(
            1,
            format!("expected the header {HEADER:?}, found {header:?}"),
        ));
    }
    let mut rows = Vec::new();
    for record in reader.records() {
        let f = record.map_err(|e| {
            let line = e.position().map(|p| p.line()).unwrap_or(0);
            err(line, e.to_string())
        })?;
        let n = f.position().map(|p| p.line()).unwrap_or(0);
        if f.iter().all(str::is_empty) {
            continue;
        }
        if f.len() != 11 {
            return Err(err(n, format!("expected 11 columns, found {}", f.len())));
        }
        let num = |v: &str, what: &str| {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| err(n, format!("{what} {v:?} is not a number")))
        };
        let usd =
            |v: &str, what: &str| Micros::parse_usd(v).map_err(|e| err(n, format!("{what}: {e}")));
        rows.push(CatalogRow {
            instance_type: f[0].into(),
            vcpus: f[1]
                .parse()
                .map_err(|_| err(n, format!("vCPUs {:?} is not a count", &f[1])))?,
            memory_gib: num(&f[2], "MemoryGiB")?,
            gpu_model: if f[3].is_empty() {
                None
            } else {
                Some(
                    f[3].parse()
                        .map_err(|e: spotplane_core::gpu::UnknownGpuModel| err(n, e.to_string()))?,
                )
            },
            gpu_count: if f[4].is_empty() {
                0
            } else {
                f[4].parse()
                    .map_err(|_| err(n, format!("AcceleratorCount {:?}", &f[4])))?
            },
            region: f[5].into(),
            zone: f[6].into(),
            price: usd(&f[7], "Price")?,
            spot_price: if f[8].is_empty() {
                None
            } else {
                Some(usd(&f[8], "SpotPrice")?)
            },
            placement_score: if f[9].is_empty() {
                None
            } else {
                Some(num(&f[9], "PlacementScore")?)
            },
            interruption_bucket: (!f[10].is_empty()).then(|| f[10].into()),
        });
    }
    Ok(rows)
}

/// Writes rows as catalog CSV, sorted for stable diffs.
pub fn to_csv(rows: &[CatalogRow]) -> String {
    let mut sorted: Vec<&CatalogRow> = rows.iter().collect();
    sorted.sort_by(|a, b| {
        (&a.instance_type, &a.region, &a.zone).cmp(&(&b.instance_type, &b.region, &b.zone))
    });
    // Quoted only where a field needs it, so plain rows read as before.
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut write = |fields: &[&str]| {
        // Writing to memory fails only on a bug in the writer; the row is then left out loudly.
        if let Err(e) = w.write_record(fields) {
            tracing::error!(error = %e, "a catalog row could not be written");
        }
    };
    write(&HEADER.split(',').collect::<Vec<_>>());
    for r in sorted {
        let count = if r.gpu_count > 0 {
            r.gpu_count.to_string()
        } else {
            String::new()
        };
        write(&[
            &r.instance_type,
            &r.vcpus.to_string(),
            &r.memory_gib.to_string(),
            r.gpu_model.map(|m| m.name()).unwrap_or(""),
            &count,
            &r.region,
            &r.zone,
            &dollars(r.price),
            &r.spot_price.map(dollars).unwrap_or_default(),
            &r.placement_score.map(|s| s.to_string()).unwrap_or_default(),
            r.interruption_bucket.as_deref().unwrap_or(""),
        ]);
    }
    w.into_inner()
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

fn dollars(m: Micros) -> String {
    m.to_string().trim_start_matches('$').to_owned()
}

/// The catalog built into the binary (the committed `config/catalog/` files).
pub fn embedded(cloud: Cloud) -> &'static str {
    match cloud {
        Cloud::Aws => include_str!("../../config/catalog/aws.csv"),
        Cloud::Gcp => include_str!("../../config/catalog/gcp.csv"),
        Cloud::Azure => include_str!("../../config/catalog/azure.csv"),
    }
}

/// The catalog file of a cloud.
pub fn file_name(cloud: Cloud) -> &'static str {
    match cloud {
        Cloud::Aws => "aws.csv",
        Cloud::Gcp => "gcp.csv",
        Cloud::Azure => "azure.csv",
    }
}

/// A SkyPilot catalog CSV (`catalogs/v8/{aws,gcp}/vms.csv`) read by column name: its columns
/// differ per cloud, and its GPU description (`GpuInfo`) is a quoted field with commas.
struct SkyPilot {
    origin: String,
    columns: Vec<String>,
    records: Vec<(u64, csv::StringRecord)>,
}

impl SkyPilot {
    fn read(text: &str, origin: &str) -> Result<SkyPilot, CatalogError> {
        let err = |line: u64, message: String| CatalogError::parse(origin, line, message);
        let mut reader = csv::ReaderBuilder::new()
            .flexible(true)
            .from_reader(text.as_bytes());
        let columns: Vec<String> = reader
            .headers()
            .map_err(|e| err(1, e.to_string()))?
            .iter()
            .map(str::to_owned)
            .collect();
        let mut records = Vec::new();
        for r in reader.records() {
            let r =
                r.map_err(|e| err(e.position().map(|p| p.line()).unwrap_or(0), e.to_string()))?;
            let line = r.position().map(|p| p.line()).unwrap_or(0);
            if r.len() != columns.len() {
                return Err(err(
                    line,
                    format!("expected {} columns, found {}", columns.len(), r.len()),
                ));
            }
            records.push((line, r));
        }
        Ok(SkyPilot {
            origin: origin.to_owned(),
            columns,
            records,
        })
    }

    /// The index of `name`, or an error naming the file.
    fn column(&self, name: &str) -> Result<usize, CatalogError> {
        self.columns.iter().position(|c| c == name).ok_or_else(|| {
            self.err(
                1,
                format!("no {name} column in {:?}", self.columns.join(",")),
            )
        })
    }

    /// The indexes of `names`, in their order.
    fn columns<const N: usize>(&self, names: [&str; N]) -> Result<[usize; N], CatalogError> {
        let mut out = [0; N];
        for (slot, name) in out.iter_mut().zip(names) {
            *slot = self.column(name)?;
        }
        Ok(out)
    }

    /// A price field: empty is none.
    fn usd(&self, line: u64, v: &str, what: &str) -> Result<Option<Micros>, CatalogError> {
        if v.trim().is_empty() {
            return Ok(None);
        }
        Micros::parse_usd(v.trim())
            .map(Some)
            .map_err(|e| self.err(line, format!("{what}: {e}")))
    }

    fn err(&self, line: u64, message: String) -> CatalogError {
        CatalogError::parse(&self.origin, line, message)
    }
}

/// SkyPilot writes counts as floats (`8.0`).
fn whole(v: &str) -> Option<u32> {
    let x: f64 = v.trim().parse().ok()?;
    (x >= 0.0 && x.fract() == 0.0 && x <= f64::from(u32::MAX)).then_some(x as u32)
}

/// The GPU model of a SkyPilot accelerator name, with the memory its `GpuInfo` states where
/// the name alone is ambiguous (`A100` with 81920 MiB is the 80 GB card).
fn skypilot_model(name: &str, gpu_info: &str) -> Option<GpuModel> {
    let name = match name.trim() {
        "" => return None,
        // GCP's A3 Mega GPU: an H100 80GB with more network, priced as its own SKU.
        "H100-MEGA" => "H100",
        n => n,
    };
    let mib = gpu_info.split("'SizeInMiB':").nth(1).and_then(|rest| {
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse::<u32>().ok()
    });
    if let Some(mib) = mib
        && let Ok(m) = format!("{name}-{}GB", (mib + 512) / 1024).parse()
    {
        return Some(m);
    }
    name.parse().ok()
}

/// The SpotLake interruption-frequency bucket code as its range (data README).
fn interruption_bucket(code: &str) -> Option<Arc<str>> {
    Some(
        match code {
            "3.0" => "<5%",
            "2.5" => "5-10%",
            "2.0" => "10-15%",
            "1.5" => "15-20%",
            "1.0" => ">20%",
            _ => return None,
        }
        .into(),
    )
}

/// The AWS spot placement score and interruption bucket SpotLake recorded per (instance type,
/// AZ id) (`spot/spotlake-aws-2022-07-12/price_data.csv`:
/// `SpotPrice,Savings,SPS,AZ,Region,InstanceType,IF,time`).
fn spotlake_signals(price_data_csv: &str) -> Signals {
    let mut out = BTreeMap::new();
    for line in price_data_csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() >= 8 {
            out.insert(
                (f[5].to_owned(), f[3].to_owned()),
                (f[2].parse().ok(), interruption_bucket(f[6])),
            );
        }
    }
    out
}

/// Builds the AWS catalog from SkyPilot's AWS catalog (`catalogs/v7/aws/vms.csv`: the
/// on-demand and spot price, vCPUs, memory and GPUs of each instance type per AZ id), every
/// row whose accelerator is a GPU model spotplane knows. Rows without an on-demand price are
/// left out (there is no saving to measure without one; the Price List prices them live), and
/// a type listed twice in one zone is one row, the first price of each kind kept. SpotLake's
/// placement score and interruption bucket of 2022 are added where SpotLake recorded the type
/// in that zone (`spotlake`), since neither SkyPilot nor EC2 publishes them in bulk.
/// `sources` are `(text, origin)` of SkyPilot files, read in order (the first listing of a type
/// in a zone wins).
pub fn build_aws(
    sources: &[(&str, &str)],
    spotlake: Option<&str>,
) -> Result<Vec<CatalogRow>, CatalogError> {
    let signals = spotlake.map(spotlake_signals).unwrap_or_default();
    let mut rows: BTreeMap<(String, String), CatalogRow> = BTreeMap::new();
    for (text, origin) in sources {
        add_aws(&mut rows, &SkyPilot::read(text, origin)?, &signals)?;
    }
    Ok(rows.into_values().collect())
}

type Signals = BTreeMap<(String, String), (Option<f64>, Option<Arc<str>>)>;

fn add_aws(
    rows: &mut BTreeMap<(String, String), CatalogRow>,
    sky: &SkyPilot,
    signals: &Signals,
) -> Result<(), CatalogError> {
    let [ty, acc, count, vcpus, mem, info, price, spot, region, zone] = sky.columns([
        "InstanceType",
        "AcceleratorName",
        "AcceleratorCount",
        "vCPUs",
        "MemoryGiB",
        "GpuInfo",
        "Price",
        "SpotPrice",
        "Region",
        "AvailabilityZone",
    ])?;
    for (line, r) in &sky.records {
        let Some(model) = skypilot_model(&r[acc], &r[info]) else {
            continue;
        };
        let gpus = whole(&r[count]).filter(|n| *n > 0);
        let Some(gpus) = gpus else { continue };
        let (on_demand, spot_price) = (
            sky.usd(*line, &r[price], "Price")?,
            sky.usd(*line, &r[spot], "SpotPrice")?,
        );
        let key = (r[ty].to_owned(), r[zone].to_owned());
        if let Some(have) = rows.get_mut(&key) {
            have.spot_price = have.spot_price.or(spot_price);
            continue;
        }
        let Some(on_demand) = on_demand else { continue };
        let (score, bucket) = signals.get(&key).cloned().unwrap_or((None, None));
        rows.insert(
            key,
            CatalogRow {
                instance_type: r[ty].into(),
                vcpus: whole(&r[vcpus])
                    .ok_or_else(|| sky.err(*line, format!("vCPUs {:?}", &r[vcpus])))?,
                memory_gib: r[mem]
                    .parse()
                    .map_err(|_| sky.err(*line, format!("MemoryGiB {:?}", &r[mem])))?,
                gpu_model: Some(model),
                gpu_count: gpus,
                region: r[region].into(),
                zone: r[zone].into(),
                price: on_demand,
                spot_price,
                placement_score: score,
                interruption_bucket: bucket,
            },
        );
    }
    Ok(())
}

/// The GPUs of a GCP accelerator-optimized or G2 machine type, as SkyPilot names them (Google
/// Cloud documentation, "GPU machine types"): the count is the `-Ng` suffix, G2 sizes have a
/// fixed number of L4s.
fn gcp_machine_gpus(machine: &str) -> Option<(&'static str, u32)> {
    let suffix_count = || {
        machine
            .rsplit('-')
            .next()?
            .strip_suffix('g')?
            .parse::<u32>()
            .ok()
    };
    Some(match machine {
        m if m.starts_with("a2-highgpu-") || m.starts_with("a2-megagpu-") => {
            ("A100", suffix_count()?)
        }
        m if m.starts_with("a2-ultragpu-") => ("A100-80GB", suffix_count()?),
        m if m.starts_with("a3-highgpu-") || m == "a3-edgegpu-8g" => ("H100", suffix_count()?),
        "a3-megagpu-8g" => ("H100-MEGA", 8),
        "a3-ultragpu-8g" => ("H200", 8),
        "a4-highgpu-8g" => ("B200", 8),
        "g2-standard-4" | "g2-standard-8" | "g2-standard-12" | "g2-standard-16"
        | "g2-standard-32" => ("L4", 1),
        "g2-standard-24" => ("L4", 2),
        "g2-standard-48" => ("L4", 4),
        "g2-standard-96" => ("L4", 8),
        _ => return None,
    })
}

/// Builds GCP rows of `machines` from SkyPilot's GCP catalog (`catalogs/v7/gcp/vms.csv`), which
/// prices a GPU VM in two rows per zone: the machine type (vCPUs and memory) and its GPUs (a
/// row with no instance type, the accelerator and its count). A row here is their sum, on
/// demand and on spot; a zone missing either row is left out, and spot is left empty where
/// either part has no spot price.
///
/// SkyPilot's GCP GPU rows mix two price levels for some accelerators (H100 Mega ×8 at $35.39
/// in some regions and $82.75–107.58 in others, H200 ×8 at $36.60 or $74.49), the low ones
/// far under Google's list price for those VMs (A3 Ultra: $84.81 in us-central1). A GPU row
/// priced under half the highest on-demand price of the same accelerator and count in the file
/// is taken as such a mis-read and its zone left out (docs/catalog.md).
pub fn build_gcp_skypilot(
    skypilot_csv: &str,
    origin: &str,
    machines: &[&str],
) -> Result<Vec<CatalogRow>, CatalogError> {
    let sky = SkyPilot::read(skypilot_csv, origin)?;
    let [ty, vcpus, mem, acc, count, info, region, zone, price, spot] = sky.columns([
        "InstanceType",
        "vCPUs",
        "MemoryGiB",
        "AcceleratorName",
        "AcceleratorCount",
        "GpuInfo",
        "Region",
        "AvailabilityZone",
        "Price",
        "SpotPrice",
    ])?;
    let usd = |line: u64, v: &str, what: &str| sky.usd(line, v, what);
    // (zone, accelerator, count) -> (on-demand, spot, GPU info)
    type GpuRows = BTreeMap<(String, String, u32), (Option<Micros>, Option<Micros>, String)>;
    let mut gpus = GpuRows::new();
    for (line, r) in &sky.records {
        if r[ty].is_empty()
            && let Some(n) = whole(&r[count])
        {
            gpus.insert(
                (r[zone].to_owned(), r[acc].to_owned(), n),
                (
                    usd(*line, &r[price], "Price")?,
                    usd(*line, &r[spot], "SpotPrice")?,
                    r[info].to_owned(),
                ),
            );
        }
    }
    let mut highest: BTreeMap<(&str, u32), Micros> = BTreeMap::new();
    for ((_, name, n), (price, _, _)) in &gpus {
        let top = highest.entry((name.as_str(), *n)).or_insert(Micros(0));
        *top = (*top).max(price.unwrap_or(Micros(0)));
    }
    let misread = |name: &str, n: u32, price: Micros| {
        highest
            .get(&(name, n))
            .is_some_and(|top| price.0.saturating_mul(2) < top.0)
    };
    let mut rows = Vec::new();
    for (line, r) in &sky.records {
        let machine = &r[ty];
        if !machines.contains(&machine) {
            continue;
        }
        let Some((name, n)) = gcp_machine_gpus(machine) else {
            continue;
        };
        let Some((gpu_price, gpu_spot, gpu_info)) =
            gpus.get(&(r[zone].to_owned(), name.to_owned(), n))
        else {
            continue;
        };
        let (Some(host), Some(gpu)) = (usd(*line, &r[price], "Price")?, *gpu_price) else {
            continue;
        };
        if misread(name, n, gpu) {
            continue;
        }
        let host_spot = usd(*line, &r[spot], "SpotPrice")?;
        rows.push(CatalogRow {
            instance_type: machine.into(),
            vcpus: whole(&r[vcpus])
                .ok_or_else(|| sky.err(*line, format!("vCPUs {:?}", &r[vcpus])))?,
            memory_gib: r[mem]
                .parse()
                .map_err(|_| sky.err(*line, format!("MemoryGiB {:?}", &r[mem])))?,
            gpu_model: skypilot_model(name, gpu_info),
            gpu_count: n,
            region: r[region].into(),
            zone: r[zone].into(),
            price: Micros(host.0 + gpu.0),
            spot_price: host_spot.zip(*gpu_spot).map(|(h, g)| Micros(h.0 + g.0)),
            placement_score: None,
            interruption_bucket: None,
        });
    }
    Ok(rows)
}

/// GCP accelerator names of the price history as models.
fn gcp_model(name: &str) -> Option<GpuModel> {
    Some(match name {
        "a100" => GpuModel::A100_40GB,
        "a100-80gb" => GpuModel::A100_80GB,
        "h100-80gb" => GpuModel::H100_80GB,
        // a3-megagpu-8g: its rows stop in 2024-08 at about $10/h on demand for eight H100s,
        // prices without the GPUs; left out rather than offered at a tenth of their cost.
        "l4" => GpuModel::L4,
        "rtx6000" => GpuModel::RtxPro6000,
        _ => return None,
    })
}

/// Builds the GCP catalog from the price history (`spot/gcp-gpu-prices/gcp_gpu_vm_price_changes.csv`)
/// as of `as_of` (the latest change of each machine type and region on or before that date) and
/// the zones that offer each machine type (`availability/machinetypezone.csv`, `;`-separated).
/// Whole-GPU machine types only (GCP's fractional G4 shapes are left out).
pub fn build_gcp(
    history_csv: &str,
    zones_csv: &str,
    as_of: &str,
    origin: &str,
) -> Result<Vec<CatalogRow>, CatalogError> {
    // (machine type, region) -> latest row at or before as_of.
    let mut latest: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for line in history_csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 10 || f[0] > as_of {
            continue;
        }
        let key = (f[2].to_owned(), f[7].to_owned());
        let newer = latest.get(&key).is_none_or(|prev| prev[0].as_str() <= f[0]);
        if newer {
            latest.insert(key, f.iter().map(|s| (*s).to_owned()).collect());
        }
    }
    let mut zones: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in zones_csv.lines().skip(1) {
        let f: Vec<&str> = line.split(';').collect();
        if f.len() >= 6 {
            let list = zones.entry(f[0].to_owned()).or_default();
            if !list.iter().any(|z| z == f[5]) {
                list.push(f[5].to_owned());
            }
        }
    }
    // The zone list predates A3: its H100 machine types get the zones Google's "GPU regions and
    // zones" page lists for nvidia-h100-80gb (a conservative subset, kept by hand).
    for machine in [
        "a3-highgpu-1g",
        "a3-highgpu-2g",
        "a3-highgpu-4g",
        "a3-highgpu-8g",
    ] {
        zones
            .entry(machine.to_owned())
            .or_insert_with(|| A3_ZONES.iter().map(|z| (*z).to_owned()).collect());
    }
    let mut rows = Vec::new();
    for ((machine, region), f) in latest {
        let Some(model) = gcp_model(&f[3]) else {
            continue;
        };
        let Ok(count) = f[4].parse::<u32>() else {
            continue;
        };
        let err = |m: String| CatalogError::Parse {
            path: origin.to_owned(),
            line: 0,
            message: format!("{machine} in {region}: {m}"),
        };
        let price = Micros::from_usd_f64(round6(&f[8])).map_err(|e| err(e.to_string()))?;
        let spot = if f[9].is_empty() {
            None
        } else {
            Some(Micros::from_usd_f64(round6(&f[9])).map_err(|e| err(e.to_string()))?)
        };
        let machine_zones: Vec<String> = zones
            .get(&machine)
            .map(|z| {
                z.iter()
                    .filter(|z| z.starts_with(&format!("{region}-")))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for zone in machine_zones {
            rows.push(CatalogRow {
                instance_type: machine.as_str().into(),
                vcpus: f[5].parse().unwrap_or(0),
                memory_gib: f[6].parse().unwrap_or(0.0),
                gpu_model: Some(model),
                gpu_count: count,
                region: region.as_str().into(),
                zone: zone.into(),
                price,
                spot_price: spot,
                placement_score: None,
                interruption_bucket: None,
            });
        }
    }
    Ok(rows)
}

/// Zones offering H100 80GB (A3) VMs, from Google's GPU regions and zones documentation.
const A3_ZONES: [&str; 5] = [
    "us-central1-a",
    "us-central1-c",
    "us-east4-a",
    "us-east5-a",
    "europe-west4-b",
];

/// Prices in the history carry up to 9 decimals; the catalog keeps micro-dollars.
fn round6(v: &str) -> f64 {
    v.parse::<f64>()
        .map(|x| (x * 1e6).round() / 1e6)
        .unwrap_or(f64::NAN)
}

/// The date of the GCP prices in the committed catalog: the last snapshot of the history.
pub const GCP_AS_OF: &str = "2026-07-30";

/// Where the generators read from, relative to the shared data folder.
pub const AWS_SIGNALS_SOURCE: &str = "spot/spotlake-aws-2022-07-12/price_data.csv";
pub const GCP_HISTORY_SOURCE: &str = "spot/gcp-gpu-prices/gcp_gpu_vm_price_changes.csv";
pub const GCP_ZONES_SOURCE: &str = "spot/gcp-gpu-prices/availability/machinetypezone.csv";

/// The SkyPilot catalog extracts kept in the repository (`data/catalog/skypilot/`, with their
/// commits in `SOURCE.md` there), relative to the repository root.
pub const SKYPILOT_DIR: &str = "data/catalog/skypilot";

/// The GCP machine types taken from SkyPilot's catalog rather than the price history: the
/// history has no A3 Ultra, and its A3 Mega rows stop in 2024-08 without the GPUs' price.
pub const GCP_FROM_SKYPILOT: [&str; 3] = ["a3-megagpu-8g", "a3-ultragpu-8g", "a4-highgpu-8g"];

fn read_file(path: &Path) -> Result<(String, String), CatalogError> {
    std::fs::read_to_string(path)
        .map(|t| (t, path.display().to_string()))
        .map_err(|source| CatalogError::Io {
            path: path.display().to_string(),
            source,
        })
}

/// Builds the generated catalogs (AWS and GCP): AWS from SkyPilot's extract in `skypilot_dir`
/// with SpotLake's signals from `data_dir`; GCP from the price history in `data_dir` with the
/// [`GCP_FROM_SKYPILOT`] machine types from SkyPilot's extract.
pub fn build_from_data(
    data_dir: &Path,
    skypilot_dir: &Path,
) -> Result<Vec<(Cloud, Vec<CatalogRow>)>, CatalogError> {
    let sky_aws = [read_file(&skypilot_dir.join("aws.csv"))?];
    let (sky_gcp, sky_gcp_origin) = read_file(&skypilot_dir.join("gcp.csv"))?;
    let (signals, _) = read_file(&data_dir.join(AWS_SIGNALS_SOURCE))?;
    let (hist, hist_origin) = read_file(&data_dir.join(GCP_HISTORY_SOURCE))?;
    let (zones, _) = read_file(&data_dir.join(GCP_ZONES_SOURCE))?;
    let mut gcp = build_gcp(&hist, &zones, GCP_AS_OF, &hist_origin)?;
    gcp.retain(|r| !GCP_FROM_SKYPILOT.contains(&&*r.instance_type));
    gcp.extend(build_gcp_skypilot(
        &sky_gcp,
        &sky_gcp_origin,
        &GCP_FROM_SKYPILOT,
    )?);
    Ok(vec![
        (
            Cloud::Aws,
            build_aws(
                &sky_aws
                    .iter()
                    .map(|(t, o)| (t.as_str(), o.as_str()))
                    .collect::<Vec<_>>(),
                Some(&signals),
            )?,
        ),
        (Cloud::Gcp, gcp),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogs_round_trip_through_csv() {
        let rows = vec![CatalogRow {
            instance_type: "p3.2xlarge".into(),
            vcpus: 8,
            memory_gib: 61.0,
            gpu_model: Some(GpuModel::V100_16GB),
            gpu_count: 1,
            region: "us-east-1".into(),
            zone: "use1-az1".into(),
            price: Micros::parse_usd("3.06").expect("p"),
            spot_price: Some(Micros::parse_usd("0.918").expect("p")),
            placement_score: Some(1.0),
            interruption_bucket: Some(">20%".into()),
        }];
        let text = to_csv(&rows);
        assert_eq!(parse(&text, "t").expect("parses"), rows);
    }

    #[test]
    fn bad_rows_are_rejected_with_file_and_line() {
        let text = format!("{HEADER}\np3.2xlarge,8,61,V100,1,us-east-1,z,abc,,,\n");
        let e = parse(&text, "aws.csv").expect_err("bad price");
        assert!(e.to_string().starts_with("aws.csv:2:"), "{e}");
        assert!(parse("wrong header\n", "x.csv").is_err());
    }

    #[test]
    fn a_quoted_field_with_commas_is_one_field() {
        let text = format!(
            "{HEADER}\n\"p5.48xlarge\",192,2048,H100-80GB,8,us-east-1,use1-az1,55.04,,,\"10-15%, rising\"\n"
        );
        let rows = parse(&text, "user.csv").expect("quoted fields parse");
        assert_eq!(
            rows[0].interruption_bucket.as_deref(),
            Some("10-15%, rising")
        );
        assert_eq!(parse(&to_csv(&rows), "again").expect("round trip"), rows);
        let short = format!("{HEADER}\np5.48xlarge,192\n");
        let e = parse(&short, "user.csv").expect_err("short row");
        assert_eq!(e.to_string(), "user.csv:2: expected 11 columns, found 2");
    }

    const SKY_AWS: &str = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone\n\
        p5.48xlarge,H100,8.0,192.0,2048.0,\"{'Gpus': [{'Name': 'H100', 'Manufacturer': 'NVIDIA', 'Count': 8, 'MemoryInfo': {'SizeInMiB': 81920}}], 'TotalGpuMemoryInMiB': 655360}\",55.04,22.1,us-east-1,use1-az1\n\
        p4de.24xlarge,A100-80GB,8.0,96.0,1152.0,\"{'Gpus': [{'Name': 'A100-80GB', 'MemoryInfo': {'SizeInMiB': 81920}}]}\",40.96575,,us-east-1,use1-az4\n\
        p4de.24xlarge,A100-80GB,8.0,96.0,1152.0,\"{'Gpus': [{'Name': 'A100', 'MemoryInfo': {'SizeInMiB': 81920}}]}\",40.96575,7.8074,us-east-1,use1-az4\n\
        p5e.48xlarge,H200,8.0,192.0,2048.0,\"{'Gpus': [{'Name': 'H200', 'MemoryInfo': {'SizeInMiB': 144384}}]}\",,14.925,ap-southeast-3,apse3-az1\n\
        g6e.xlarge,L40S,1.0,4.0,32.0,\"{'Gpus': [{'Name': 'L40S', 'MemoryInfo': {'SizeInMiB': 45776}}]}\",1.861,0.5,us-east-1,use1-az1\n\
        m7i.large,,,2.0,8.0,,0.1008,0.04,us-east-1,use1-az1\n\
        inf2.xlarge,Inferentia2,1.0,4.0,16.0,,0.7582,0.2,us-east-1,use1-az1\n";

    #[test]
    fn skypilot_aws_rows_become_gpu_catalog_rows() {
        let spotlake = "SpotPrice,Savings,SPS,AZ,Region,InstanceType,IF,time\n\
                        9.0,70,3,use1-az1,us-east-1,p5.48xlarge,2.5,2022-07-12\n";
        let rows = build_aws(&[(SKY_AWS, "sky.csv")], Some(spotlake)).expect("builds");
        let names: Vec<(&str, &str)> = rows.iter().map(|r| (&*r.instance_type, &*r.zone)).collect();
        // CPU and Inferentia rows left out; p5e has no on-demand price; p4de's two listings
        // in one zone are one row.
        assert_eq!(
            names,
            [
                ("g6e.xlarge", "use1-az1"),
                ("p4de.24xlarge", "use1-az4"),
                ("p5.48xlarge", "use1-az1")
            ]
        );
        let p5 = &rows[2];
        assert_eq!(
            (p5.gpu_model, p5.gpu_count, p5.vcpus, p5.memory_gib),
            (Some(GpuModel::H100_80GB), 8, 192, 2048.0)
        );
        assert_eq!(
            (p5.price, p5.spot_price),
            (Micros(55_040_000), Some(Micros(22_100_000)))
        );
        assert_eq!(
            (p5.placement_score, p5.interruption_bucket.as_deref()),
            (Some(3.0), Some("5-10%")),
            "SpotLake's signals where it recorded the pool"
        );
        let p4de = &rows[1];
        assert_eq!(p4de.gpu_model, Some(GpuModel::A100_80GB), "by its memory");
        assert_eq!(
            p4de.spot_price,
            Some(Micros(7_807_400)),
            "the spot price of the other listing"
        );
        assert_eq!(rows[0].gpu_model, Some(GpuModel::L40S));
        assert_eq!(rows[0].interruption_bucket, None);
    }

    #[test]
    fn skypilot_gcp_rows_are_the_machine_and_its_gpus_together() {
        let sky = "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice\n\
            a3-ultragpu-8g,224.0,2952.0,,,,us-central1,us-central1-b,20.5,5.1\n\
            ,,,H200,8,{'Gpus': [{'MemoryInfo': {'SizeInMiB': 144384}}]},us-central1,us-central1-b,74.49,20.0\n\
            a3-ultragpu-8g,224.0,2952.0,,,,europe-west1,europe-west1-b,22.0,5.5\n\
            a3-megagpu-8g,208.0,1872.0,,,,us-east4,us-east4-a,11.0,2.0\n\
            a3-megagpu-8g,208.0,1872.0,,,,us-east5,us-east5-a,11.0,2.0\n\
            ,,,H100-MEGA,8,{'Gpus': [{'MemoryInfo': {'SizeInMiB': 81920}}]},us-east5,us-east5-a,35.39,10.0\n\
            ,,,H100-MEGA,8,{'Gpus': [{'MemoryInfo': {'SizeInMiB': 81920}}]},us-east4,us-east4-a,80.0,\n\
            g2-standard-4,4.0,16.0,,,,us-east4,us-east4-a,0.2,0.08\n";
        let rows = build_gcp_skypilot(sky, "sky.csv", &GCP_FROM_SKYPILOT).expect("builds");
        assert_eq!(
            rows.len(),
            2,
            "a zone without its GPU row is left out, and one whose GPUs are priced under half \
             the others; g2 not asked for"
        );
        let ultra = &rows[0];
        assert_eq!(
            (&*ultra.instance_type, ultra.gpu_model, ultra.gpu_count),
            ("a3-ultragpu-8g", Some(GpuModel::H200_141GB), 8)
        );
        assert_eq!(ultra.price, Micros(94_990_000));
        assert_eq!(ultra.spot_price, Some(Micros(25_100_000)));
        let mega = &rows[1];
        assert_eq!(mega.gpu_model, Some(GpuModel::H100_80GB));
        assert_eq!(mega.price, Micros(91_000_000));
        assert_eq!(mega.spot_price, None, "the GPUs have no spot price there");
    }

    #[test]
    fn gcp_rows_take_the_latest_price_and_every_zone_offering_the_type() {
        let hist = "snapshot_date,commit,machine_type,gpu_model,gpu_count,vcpus,ram_gb,region,hour_ondemand_usd,hour_spot_usd\n\
                    2023-01-01,c,g2-standard-4,l4,1,4,16,us-central1,0.8,\n\
                    2024-01-01,c,g2-standard-4,l4,1,4,16,us-central1,0.7,0.22\n\
                    2030-01-01,c,g2-standard-4,l4,1,4,16,us-central1,9.9,9.9\n";
        let zones = "NAME;CPUS;SHARED_CPU;MEMORY_GB;DEPRECATED;ZONE\n\
                     g2-standard-4;4;False;16;;us-central1-a\n\
                     g2-standard-4;4;False;16;;us-central1-b\n\
                     g2-standard-4;4;False;16;;europe-west4-a\n";
        let rows = build_gcp(hist, zones, "2026-07-30", "t").expect("builds");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].price, Micros(700_000));
        assert_eq!(rows[0].spot_price, Some(Micros(220_000)));
    }

    /// The committed catalogs are what the generator makes from the recorded data.
    #[test]
    fn the_committed_catalogs_match_the_shared_data() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let built = build_from_data(&root.join("../shared/data"), &root.join(SKYPILOT_DIR))
            .expect("shared data and the SkyPilot extracts");
        for (cloud, rows) in built {
            let path = root.join("config/catalog").join(file_name(cloud));
            let committed = std::fs::read_to_string(&path).expect("committed catalog");
            assert!(
                to_csv(&rows) == committed,
                "{} differs from the shared data: run `spotplane catalog build`",
                path.display()
            );
        }
        for cloud in Cloud::ALL {
            let rows = load(&root.join("config/catalog").join(file_name(cloud))).expect("loads");
            assert!(
                rows.iter()
                    .all(|r| r.gpu_model.is_some() && r.gpu_count > 0),
                "{cloud}"
            );
        }
    }
}
