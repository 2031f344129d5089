//! The ledger as files: plain CSV, and the FinOps FOCUS column set.
//!
//! Both carry the charge lines (usage and idle); lost-work memo lines are not charges and stay
//! out (the summary reports them). Money is written as decimal dollars with six places, exactly
//! the micro-dollars of the ledger, so sums in a spreadsheet match the ledger to the cent.
//!
//! # FOCUS
//!
//! Every column FOCUS 1.0–1.2 makes mandatory ([`FOCUS_MANDATORY`]), and the conditional ones
//! that apply to compute: `PricingCategory` is `Dynamic` for spot and `Standard` for on-demand;
//! `ListCost` and `ListUnitPrice` are at the on-demand rate of the same capacity, and
//! `BilledCost`, `EffectiveCost` and `ContractedCost` at the price paid (no commitment discounts
//! apply), so `ListCost - EffectiveCost` is the saving against on-demand. One row per ledger
//! line: `ChargePeriodStart`/`End` are the line's interval, `ResourceId` the node,
//! `SkuId` the instance type, `Tags` a JSON object with the team and job. spotplane's own
//! columns start with `x_`.

use chrono::{DateTime, Datelike, SecondsFormat, TimeZone, Utc};
use serde_json::json;
use spotplane_core::{Cloud, Market, Micros};

use super::LedgerEntry;
use super::ledger::LineKind;

/// Columns mandatory in FOCUS 1.0 to 1.2 (REFERENCE.md).
pub const FOCUS_MANDATORY: [&str; 21] = [
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
];

/// The FOCUS data type of each column written, for readers and the conformance test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FocusType {
    Decimal,
    DateTime,
    String,
    /// A JSON object (`Tags`).
    Json,
}

/// Every column of the FOCUS file, in order, with its type.
pub const FOCUS_COLUMNS: [(&str, FocusType); 44] = [
    ("BilledCost", FocusType::Decimal),
    ("BillingAccountId", FocusType::String),
    ("BillingAccountName", FocusType::String),
    ("BillingCurrency", FocusType::String),
    ("BillingPeriodEnd", FocusType::DateTime),
    ("BillingPeriodStart", FocusType::DateTime),
    ("ChargeCategory", FocusType::String),
    ("ChargeClass", FocusType::String),
    ("ChargeDescription", FocusType::String),
    ("ChargeFrequency", FocusType::String),
    ("ChargePeriodEnd", FocusType::DateTime),
    ("ChargePeriodStart", FocusType::DateTime),
    ("ContractedCost", FocusType::Decimal),
    ("ContractedUnitPrice", FocusType::Decimal),
    ("EffectiveCost", FocusType::Decimal),
    ("InvoiceIssuerName", FocusType::String),
    ("ListCost", FocusType::Decimal),
    ("ListUnitPrice", FocusType::Decimal),
    ("PricingCategory", FocusType::String),
    ("PricingQuantity", FocusType::Decimal),
    ("PricingUnit", FocusType::String),
    ("ProviderName", FocusType::String),
    ("PublisherName", FocusType::String),
    ("RegionId", FocusType::String),
    ("RegionName", FocusType::String),
    ("AvailabilityZone", FocusType::String),
    ("ResourceId", FocusType::String),
    ("ResourceName", FocusType::String),
    ("ResourceType", FocusType::String),
    ("ServiceCategory", FocusType::String),
    ("ServiceName", FocusType::String),
    ("SkuId", FocusType::String),
    ("ConsumedQuantity", FocusType::Decimal),
    ("ConsumedUnit", FocusType::String),
    ("Tags", FocusType::Json),
    ("x_Cloud", FocusType::String),
    ("x_Market", FocusType::String),
    ("x_LineKind", FocusType::String),
    ("x_Team", FocusType::String),
    ("x_JobId", FocusType::String),
    ("x_Attempt", FocusType::String),
    ("x_GpuShareMilli", FocusType::Decimal),
    ("x_ProviderInstanceId", FocusType::String),
    ("x_Saving", FocusType::Decimal),
];

/// Who the FOCUS file says the bill is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FocusAccount {
    pub id: String,
    pub name: String,
}

/// Micro-dollars as decimal dollars with six places (`-1.500000`).
pub fn decimal(m: Micros) -> String {
    let sign = if m.0 < 0 { "-" } else { "" };
    let abs = m.0.unsigned_abs();
    format!("{sign}{}.{:06}", abs / 1_000_000, abs % 1_000_000)
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// One CSV field, quoted when it must be (RFC 4180).
fn field(out: &mut String, v: &str) {
    if v.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&v.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(v);
    }
}

fn row(out: &mut String, fields: &[String]) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        field(out, f);
    }
    out.push_str("\r\n");
}

fn charges(entries: &[LedgerEntry]) -> impl Iterator<Item = &LedgerEntry> {
    entries.iter().filter(|e| e.kind != LineKind::LostWork)
}

/// Columns of the plain CSV export.
pub const CSV_COLUMNS: [&str; 22] = [
    "entry_id",
    "period_start",
    "period_end",
    "kind",
    "node_id",
    "node_name",
    "provider_instance_id",
    "cloud",
    "region",
    "zone",
    "instance_type",
    "market",
    "team",
    "job_id",
    "attempt",
    "millis",
    "gpu_milli",
    "price_per_hour_usd",
    "on_demand_price_per_hour_usd",
    "cost_usd",
    "on_demand_cost_usd",
    "saving_usd",
];

/// The ledger's charge lines as CSV, one line per ledger line.
pub fn to_csv(entries: &[LedgerEntry]) -> String {
    let mut out = String::new();
    row(
        &mut out,
        &CSV_COLUMNS
            .iter()
            .map(|c| (*c).to_owned())
            .collect::<Vec<_>>(),
    );
    for e in charges(entries) {
        row(
            &mut out,
            &[
                e.id.to_string(),
                time(e.start),
                time(e.end),
                e.kind.as_str().to_owned(),
                e.node_id.to_string(),
                e.node_name.clone(),
                e.provider_instance_id.clone().unwrap_or_default(),
                e.cloud.to_string(),
                e.region.clone(),
                e.zone.clone(),
                e.instance_type.clone(),
                e.market.to_string(),
                e.team.as_ref().map(|t| t.to_string()).unwrap_or_default(),
                e.job_id.map(|j| j.to_string()).unwrap_or_default(),
                e.attempt.map(|a| a.to_string()).unwrap_or_default(),
                e.millis.to_string(),
                e.gpu_milli.to_string(),
                decimal(e.price),
                decimal(e.on_demand_price),
                decimal(e.cost),
                decimal(e.list_cost),
                decimal(e.list_cost - e.cost),
            ],
        );
    }
    out
}

/// The provider's names as FOCUS writes them: provider (and publisher and invoice issuer),
/// and the compute service.
fn provider_names(c: Cloud) -> (&'static str, &'static str) {
    match c {
        Cloud::Aws => ("AWS", "Amazon Elastic Compute Cloud"),
        Cloud::Gcp => ("Google Cloud", "Compute Engine"),
        Cloud::Azure => ("Microsoft", "Virtual Machines"),
    }
}

/// The calendar month (UTC) a moment falls in, as FOCUS billing periods are.
fn billing_period(t: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let start = Utc
        .with_ymd_and_hms(t.year(), t.month(), 1, 0, 0, 0)
        .single()
        .unwrap_or(t);
    let (y, m) = if t.month() == 12 {
        (t.year() + 1, 1)
    } else {
        (t.year(), t.month() + 1)
    };
    let end = Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0).single().unwrap_or(t);
    (start, end)
}

/// `num / den` as a decimal with nine places, rounded half up (`den > 0`).
fn quotient(num: i64, den: i64) -> String {
    let scaled = (i128::from(num) * 1_000_000_000 * 2 + i128::from(den)) / (2 * i128::from(den));
    let sign = if scaled < 0 { "-" } else { "" };
    let abs = scaled.unsigned_abs();
    format!("{sign}{}.{:09}", abs / 1_000_000_000, abs % 1_000_000_000)
}

/// The ledger's charge lines as a FOCUS file (CSV with a header row).
pub fn to_focus_csv(entries: &[LedgerEntry], account: &FocusAccount) -> String {
    let mut out = String::new();
    row(
        &mut out,
        &FOCUS_COLUMNS
            .iter()
            .map(|(c, _)| (*c).to_owned())
            .collect::<Vec<_>>(),
    );
    for e in charges(entries) {
        let (provider, service) = provider_names(e.cloud);
        let (period_start, period_end) = billing_period(e.start);
        // Quantity in hours of the whole instance: the share held for the line's time, so
        // that ListUnitPrice × PricingQuantity is the ListCost.
        let quantity = if e.on_demand_price.0 > 0 {
            quotient(e.list_cost.0, e.on_demand_price.0)
        } else {
            quotient(e.millis * i64::from(e.gpu_milli), 3_600_000 * 1000)
        };
        let category = match e.market {
            Market::Spot => "Dynamic",
            Market::OnDemand => "Standard",
        };
        let who = match (&e.team, e.job_id) {
            (Some(t), Some(j)) => format!("job {j} of team {t}"),
            _ => "idle capacity".to_owned(),
        };
        let description = format!("{} {} in {}: {}", e.instance_type, e.market, e.zone, who);
        let mut tags = serde_json::Map::new();
        if let Some(t) = &e.team {
            tags.insert("spotplane-team".into(), json!(t));
        }
        if let Some(j) = e.job_id {
            tags.insert("spotplane-job".into(), json!(j));
        }
        if e.kind == LineKind::Idle {
            tags.insert("spotplane-idle".into(), json!("true"));
        }
        row(
            &mut out,
            &[
                decimal(e.cost),
                account.id.clone(),
                account.name.clone(),
                "USD".into(),
                time(period_end),
                time(period_start),
                "Usage".into(),
                String::new(),
                description,
                "Usage-Based".into(),
                time(e.end),
                time(e.start),
                decimal(e.cost),
                decimal(e.price),
                decimal(e.cost),
                provider.into(),
                decimal(e.list_cost),
                decimal(e.on_demand_price),
                category.into(),
                quantity.clone(),
                "Hours".into(),
                provider.into(),
                provider.into(),
                e.region.clone(),
                e.region.clone(),
                e.zone.clone(),
                e.node_id.to_string(),
                e.node_name.clone(),
                "Virtual Machine".into(),
                "Compute".into(),
                service.into(),
                e.instance_type.clone(),
                quantity,
                "Hours".into(),
                serde_json::Value::Object(tags).to_string(),
                e.cloud.to_string(),
                e.market.to_string(),
                e.kind.as_str().into(),
                e.team.as_ref().map(|t| t.to_string()).unwrap_or_default(),
                e.job_id.map(|j| j.to_string()).unwrap_or_default(),
                e.attempt.map(|a| a.to_string()).unwrap_or_default(),
                e.gpu_milli.to_string(),
                e.provider_instance_id.clone().unwrap_or_default(),
                decimal(e.list_cost - e.cost),
            ],
        );
    }
    out
}

/// Reads a CSV file written by this module back into rows of fields (RFC 4180 quoting).
/// For tests and the week's self-check; not a general CSV reader.
pub fn parse_csv(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut f = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    let mut line = 1;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    f.push('"');
                }
                '"' => quoted = false,
                other => f.push(other),
            }
            continue;
        }
        match c {
            '"' if f.is_empty() => quoted = true,
            '"' => return Err(format!("line {line}: a quote inside an unquoted field")),
            ',' => row.push(std::mem::take(&mut f)),
            '\r' => {}
            '\n' => {
                row.push(std::mem::take(&mut f));
                rows.push(std::mem::take(&mut row));
                line += 1;
            }
            other => f.push(other),
        }
    }
    if quoted {
        return Err("an unterminated quoted field".into());
    }
    if !f.is_empty() || !row.is_empty() {
        row.push(f);
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spotplane_core::{JobId, NodeId};

    fn entry(kind: LineKind, market: Market, cost: &str, list: &str) -> LedgerEntry {
        let t0 = Utc
            .with_ymd_and_hms(2026, 12, 31, 23, 0, 0)
            .single()
            .expect("time");
        LedgerEntry {
            id: 1,
            kind,
            node_id: NodeId(uuid::Uuid::from_u128(1)),
            node_name: "node, \"one\"".into(),
            provider_instance_id: Some("i-0abc".into()),
            cloud: Cloud::Aws,
            region: "us-east-1".into(),
            zone: "use1-az1".into(),
            instance_type: "p4d.24xlarge".into(),
            market,
            job_id: (kind == LineKind::Usage).then(|| JobId(uuid::Uuid::from_u128(2))),
            team: (kind == LineKind::Usage).then(|| "ml".parse().expect("team")),
            attempt: (kind == LineKind::Usage).then_some(1),
            start: t0,
            end: t0 + chrono::Duration::minutes(30),
            millis: 1_800_000,
            gpu_milli: 4000,
            price: Micros::parse_usd("10").expect("p"),
            on_demand_price: Micros::parse_usd("32").expect("p"),
            cost: Micros::parse_usd(cost).expect("p"),
            list_cost: Micros::parse_usd(list).expect("p"),
        }
    }

    #[test]
    fn decimals_are_exact_micro_dollars() {
        assert_eq!(decimal(Micros(1_500_000)), "1.500000");
        assert_eq!(decimal(Micros(-7)), "-0.000007");
        assert_eq!(quotient(8_000_000, 32_000_000), "0.250000000");
        assert_eq!(quotient(1, 3), "0.333333333");
    }

    #[test]
    fn csv_quotes_what_needs_quoting_and_reads_back() {
        let text = to_csv(&[
            entry(LineKind::Usage, Market::Spot, "2.5", "8"),
            entry(LineKind::LostWork, Market::Spot, "1", "2"),
        ]);
        let rows = parse_csv(&text).expect("parses");
        assert_eq!(
            rows.len(),
            2,
            "header and one charge; lost work is no charge"
        );
        assert_eq!(rows[0].len(), CSV_COLUMNS.len());
        assert_eq!(rows[1][5], "node, \"one\"");
        assert_eq!(rows[1][21], "5.500000");
    }

    #[test]
    fn focus_rows_price_spot_as_dynamic_at_the_on_demand_list_rate() {
        let account = FocusAccount {
            id: "acct".into(),
            name: "Acme".into(),
        };
        let text = to_focus_csv(
            &[
                entry(LineKind::Usage, Market::Spot, "2.5", "8"),
                entry(LineKind::Idle, Market::OnDemand, "8", "8"),
            ],
            &account,
        );
        let rows = parse_csv(&text).expect("parses");
        let col = |name: &str| {
            rows[0]
                .iter()
                .position(|c| c == name)
                .unwrap_or_else(|| panic!("no column {name}"))
        };
        for m in FOCUS_MANDATORY {
            col(m);
        }
        assert_eq!(rows[1][col("PricingCategory")], "Dynamic");
        assert_eq!(rows[2][col("PricingCategory")], "Standard");
        assert_eq!(rows[1][col("ListCost")], "8.000000");
        assert_eq!(rows[1][col("EffectiveCost")], "2.500000");
        assert_eq!(rows[1][col("PricingQuantity")], "0.250000000");
        assert_eq!(rows[1][col("BillingPeriodStart")], "2026-12-01T00:00:00Z");
        assert_eq!(rows[1][col("BillingPeriodEnd")], "2027-01-01T00:00:00Z");
        let tags: serde_json::Value =
            serde_json::from_str(&rows[1][col("Tags")]).expect("tags are JSON");
        assert_eq!(tags["spotplane-team"], "ml");
        assert!(rows[0].iter().filter(|c| c.starts_with("x_")).count() >= 5);
    }
}
