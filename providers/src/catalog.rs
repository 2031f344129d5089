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
use std::fmt::Write as _;
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

pub const HEADER: &str = "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,Region,AvailabilityZone,Price,SpotPrice,PlacementScore,InterruptionBucket";

/// Reads a catalog CSV.
pub fn load(path: &Path) -> Result<Vec<CatalogRow>, CatalogError> {
    let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses catalog CSV text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Vec<CatalogRow>, CatalogError> {
    let mut lines = text.lines().enumerate();
    let err = |line: usize, message: String| CatalogError::Parse {
        path: origin.to_owned(),
        line,
        message,
    };
    match lines.next() {
        Some((_, h)) if h.trim() == HEADER => {}
        Some((_, h)) => {
            return Err(err(
                1,
                format!("expected the header {HEADER:?}, found {h:?}"),
            ));
        }
        None => return Err(err(1, "empty file".into())),
    }
    let mut rows = Vec::new();
    for (i, line) in lines {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 11 {
            return Err(err(n, format!("expected 11 columns, found {}", f.len())));
        }
        let num = |v: &str, what: &str| {
            v.parse::<f64>()
                .map_err(|_| err(n, format!("{what} {v:?} is not a number")))
        };
        let usd =
            |v: &str, what: &str| Micros::parse_usd(v).map_err(|e| err(n, format!("{what}: {e}")));
        rows.push(CatalogRow {
            instance_type: f[0].into(),
            vcpus: f[1]
                .parse()
                .map_err(|_| err(n, format!("vCPUs {:?} is not a count", f[1])))?,
            memory_gib: num(f[2], "MemoryGiB")?,
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
                    .map_err(|_| err(n, format!("AcceleratorCount {:?}", f[4])))?
            },
            region: f[5].into(),
            zone: f[6].into(),
            price: usd(f[7], "Price")?,
            spot_price: if f[8].is_empty() {
                None
            } else {
                Some(usd(f[8], "SpotPrice")?)
            },
            placement_score: if f[9].is_empty() {
                None
            } else {
                Some(num(f[9], "PlacementScore")?)
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
    let mut out = String::from(HEADER);
    out.push('\n');
    for r in sorted {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{}",
            r.instance_type,
            r.vcpus,
            r.memory_gib,
            r.gpu_model.map(|m| m.name()).unwrap_or(""),
            if r.gpu_count > 0 {
                r.gpu_count.to_string()
            } else {
                String::new()
            },
            r.region,
            r.zone,
            dollars(r.price),
            r.spot_price.map(dollars).unwrap_or_default(),
            r.placement_score.map(|s| s.to_string()).unwrap_or_default(),
            r.interruption_bucket.as_deref().unwrap_or(""),
        );
    }
    out
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

/// Shapes of the AWS GPU instance types spotplane schedules on (AWS documentation, "Accelerated
/// computing instance types"): vCPUs, memory in GiB, GPU model and count.
const AWS_GPU_TYPES: &[(&str, u32, f64, GpuModel, u32)] = &[
    ("g4dn.xlarge", 4, 16.0, GpuModel::T4, 1),
    ("g4dn.2xlarge", 8, 32.0, GpuModel::T4, 1),
    ("g4dn.4xlarge", 16, 64.0, GpuModel::T4, 1),
    ("g4dn.8xlarge", 32, 128.0, GpuModel::T4, 1),
    ("g4dn.12xlarge", 48, 192.0, GpuModel::T4, 4),
    ("g4dn.16xlarge", 64, 256.0, GpuModel::T4, 1),
    ("g4dn.metal", 96, 384.0, GpuModel::T4, 8),
    ("g5.xlarge", 4, 16.0, GpuModel::A10G, 1),
    ("g5.2xlarge", 8, 32.0, GpuModel::A10G, 1),
    ("g5.4xlarge", 16, 64.0, GpuModel::A10G, 1),
    ("g5.8xlarge", 32, 128.0, GpuModel::A10G, 1),
    ("g5.12xlarge", 48, 192.0, GpuModel::A10G, 4),
    ("g5.16xlarge", 64, 256.0, GpuModel::A10G, 1),
    ("g5.24xlarge", 96, 384.0, GpuModel::A10G, 4),
    ("g5.48xlarge", 192, 768.0, GpuModel::A10G, 8),
    ("p3.2xlarge", 8, 61.0, GpuModel::V100_16GB, 1),
    ("p3.8xlarge", 32, 244.0, GpuModel::V100_16GB, 4),
    ("p3.16xlarge", 64, 488.0, GpuModel::V100_16GB, 8),
    ("p3dn.24xlarge", 96, 768.0, GpuModel::V100_32GB, 8),
    ("p4d.24xlarge", 96, 1152.0, GpuModel::A100_40GB, 8),
];

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

/// Builds the AWS catalog from SpotLake's snapshot (`spot/spotlake-aws-2022-07-12/price_data.csv`:
/// `SpotPrice,Savings,SPS,AZ,Region,InstanceType,IF,time`): the spot price per zone as recorded,
/// the on-demand price derived from the recorded saving (`spot / (1 − saving)`), the placement
/// score and the interruption bucket. Only the GPU types in [`AWS_GPU_TYPES`].
pub fn build_aws(price_data_csv: &str, origin: &str) -> Result<Vec<CatalogRow>, CatalogError> {
    let mut rows = Vec::new();
    for (i, line) in price_data_csv.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 8 {
            continue;
        }
        let Some(&(itype, vcpus, mem, model, count)) = AWS_GPU_TYPES.iter().find(|t| t.0 == f[5])
        else {
            continue;
        };
        let err = |m: String| CatalogError::Parse {
            path: origin.to_owned(),
            line: i + 1,
            message: m,
        };
        let spot = Micros::parse_usd(f[0]).map_err(|e| err(format!("SpotPrice: {e}")))?;
        let saving: f64 = f[1]
            .parse()
            .map_err(|_| err(format!("Savings {:?}", f[1])))?;
        if !(0.0..100.0).contains(&saving) {
            return Err(err(format!("Savings {saving} out of range")));
        }
        let on_demand = Micros((spot.0 as f64 / (1.0 - saving / 100.0)).round() as i64);
        rows.push(CatalogRow {
            instance_type: itype.into(),
            vcpus,
            memory_gib: mem,
            gpu_model: Some(model),
            gpu_count: count,
            region: f[4].into(),
            // Kept as recorded: availability-zone *ids* (`use1-az1`) name the same physical
            // zone in every account, unlike zone names, whose letters are shuffled per account.
            zone: f[3].into(),
            price: on_demand,
            spot_price: Some(spot),
            placement_score: f[2].parse().ok(),
            interruption_bucket: interruption_bucket(f[6]),
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
pub const AWS_SOURCE: &str = "spot/spotlake-aws-2022-07-12/price_data.csv";
pub const GCP_HISTORY_SOURCE: &str = "spot/gcp-gpu-prices/gcp_gpu_vm_price_changes.csv";
pub const GCP_ZONES_SOURCE: &str = "spot/gcp-gpu-prices/availability/machinetypezone.csv";

/// Builds the generated catalogs (AWS and GCP) from the shared data folder.
pub fn build_from_data(data_dir: &Path) -> Result<Vec<(Cloud, Vec<CatalogRow>)>, CatalogError> {
    let read = |rel: &str| {
        let path = data_dir.join(rel);
        std::fs::read_to_string(&path)
            .map(|t| (t, path.display().to_string()))
            .map_err(|source| CatalogError::Io {
                path: path.display().to_string(),
                source,
            })
    };
    let (aws, aws_origin) = read(AWS_SOURCE)?;
    let (hist, hist_origin) = read(GCP_HISTORY_SOURCE)?;
    let (zones, _) = read(GCP_ZONES_SOURCE)?;
    Ok(vec![
        (Cloud::Aws, build_aws(&aws, &aws_origin)?),
        (
            Cloud::Gcp,
            build_gcp(&hist, &zones, GCP_AS_OF, &hist_origin)?,
        ),
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
    fn spotlake_rows_become_gpu_catalog_rows_with_derived_on_demand_prices() {
        let data = "SpotPrice,Savings,SPS,AZ,Region,InstanceType,IF,time\n\
                    0.918,70,3,use1-az2,us-east-1,p3.2xlarge,1.0,2022-07-12\n\
                    1.0,50,1,use1-az2,us-east-1,r5.large,3.0,2022-07-12\n";
        let rows = build_aws(data, "t").expect("builds");
        assert_eq!(rows.len(), 1, "non-GPU types are left out");
        assert_eq!(rows[0].price, Micros(3_060_000));
        assert_eq!(&*rows[0].zone, "use1-az2", "zone ids are kept");
        assert_eq!(rows[0].interruption_bucket.as_deref(), Some(">20%"));
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
        for (cloud, rows) in build_from_data(&root.join("../shared/data")).expect("shared data") {
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
