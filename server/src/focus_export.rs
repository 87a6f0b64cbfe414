//! `GET /api/v1/allocation?format=focus`: the imported bill, as FOCUS, with every line of a GPU
//! host split by how its hours were attributed, for a finance tool to load.
//!
//! Each output row is one bill line's share of one host-hour's part (GPU, owner, kind): it
//! carries every column of the line it splits (billing account and period, provider,
//! publisher, invoice issuer, service, charge category, class and frequency, SKU, region, tags,
//! the `x_` columns as they came), its costs and quantities split the same way as its
//! effective cost, exactly (the rows of a line-hour add up to it to the last decimal), and the
//! FOCUS 1.3 `Allocated*` columns saying where it went and how. Lines that belong to no GPU
//! host (storage, network) and GPU-host hours not yet attributed come as they are, so the
//! export adds up to the bill over the range. Rate-card estimates are no bill: they are not in
//! it.
//!
//! The range is read a day at a time (that day's hourly rollups and bill lines) and written as
//! it goes, so memory does not grow with the range.

use std::collections::{BTreeMap, HashMap};

use rust_decimal::Decimal;
use serde_json::{Map, Value};

use gpuledger_core::allocation::GroupBy;

use crate::ledger;
use crate::store;
use crate::store::bills::BillLine;
use crate::store::{RollupGrain, Store, StoreError};
use gpuledger_core::attribution::hosts_by_instance_key;
use gpuledger_core::attribution::Attribution;
use gpuledger_core::attribution::Part;
use gpuledger_core::bill::spread_over_hours;
use gpuledger_core::money::{from_text, parse_amount, split_exact, to_text};
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::rfc3339;

mod parquet_sink;
use gpuledger_core::time::HOUR_MS;

/// FOCUS 1.2's columns, then the 1.3 columns that describe a split.
pub const COLUMNS: [&str; 62] = [
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingAccountType",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "CapacityReservationId",
    "CapacityReservationStatus",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceId",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingCurrency",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceDetails",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "Tags",
    "AllocatedMethodId",
    "AllocatedMethodDetails",
    "AllocatedResourceId",
    "AllocatedResourceName",
    "AllocatedTags",
];

/// Amounts split with the line: costs and the quantities they are priced on.
const SPLIT: [&str; 8] = [
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "PricingCurrencyEffectiveCost",
    "PricingQuantity",
    "ConsumedQuantity",
    "CommitmentDiscountQuantity",
];

/// gpuledger's columns after the FOCUS ones.
pub const EXTRA_COLUMNS: [&str; 3] = ["x_GpuledgerKind", "x_GpuledgerHost", "x_GpuHours"];

pub const METHOD_ID: &str = "gpuledger-gpu-share-v2";

/// How a host-hour is split, as FOCUS 1.3's AllocatedMethodDetails object: its `Elements` carry
/// each row's ratio of the line-hour (filled per row).
fn method_details(ratio: Decimal, gpu_hours: f64) -> String {
    serde_json::json!({
        "Elements": [{
            "AllocatedRatio": ratio.round_dp(12).normalize().to_string().parse::<f64>().unwrap_or(0.0),
            "UsageUnit": "GPU-Hours",
            "UsageQuantity": (gpu_hours * 1e6).round() / 1e6,
            "x_Method": "the host's cost equally over its GPUs (MIG instances by size), over time by reported windows, among processes by SM utilization (else memory); idle and held-idle time kept as such",
        }]
    })
    .to_string()
}

fn focus_pricing(category: &str) -> &'static str {
    match category {
        "on_demand" => "Standard",
        "spot" => "Dynamic",
        "committed" | gpuledger_core::bill::UNUSED_COMMITMENT_CATEGORY => "Committed",
        _ => "Other",
    }
}

/// The first day of the month after `ms`'s, for a missing BillingPeriodEnd.
fn next_month_ms(ms: i64) -> i64 {
    gpuledger_core::time::month_of(ms).1
}

/// One output row's cells, by column.
type Row = BTreeMap<&'static str, String>;

/// The columns a line brings, whatever its share: what it was imported with.
fn line_cells(line: &BillLine) -> Row {
    let mut row = Row::new();
    let extra: Map<String, Value> = serde_json::from_str(&line.extra_json).unwrap_or_default();
    for col in COLUMNS {
        if let Some(Value::String(v)) = extra.get(col) {
            row.insert(col, v.clone());
        }
    }
    let mut set = |col: &'static str, v: Option<String>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            row.insert(col, v);
        }
    };
    set("ProviderName", Some(line.provider.clone()));
    set("BillingAccountId", Some(line.billing_account_id.clone()));
    set(
        "BillingPeriodStart",
        Some(rfc3339(line.billing_period_start_ms)),
    );
    set("ChargeCategory", Some(line.charge_category.clone()));
    set("ResourceId", line.resource_id.clone());
    set("BillingCurrency", Some(line.currency.clone()));
    set(
        "PricingCategory",
        Some(focus_pricing(&line.pricing_category).to_owned()),
    );
    set("CommitmentDiscountId", line.commitment_discount_id.clone());
    set(
        "CommitmentDiscountStatus",
        line.commitment_discount_status.clone(),
    );
    set("ServiceName", line.service_name.clone());
    set("SkuId", line.sku_id.clone());
    set("RegionId", line.region.clone());
    if line.tags_json != "{}" {
        set("Tags", Some(line.tags_json.clone()));
    }
    // Dates as FOCUS writes them, whatever the import read.
    for col in ["BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd"] {
        if let Some(ms) = row
            .get(col)
            .and_then(|t| crate::billing::focus::parse_time_ms(t))
        {
            row.insert(col, rfc3339(ms));
        }
    }
    row.entry("BillingPeriodEnd")
        .or_insert_with(|| rfc3339(next_month_ms(line.billing_period_start_ms)));
    // Publisher and invoice issuer are the provider unless the bill says otherwise.
    for col in ["PublisherName", "InvoiceIssuerName"] {
        row.entry(col).or_insert_with(|| line.provider.clone());
    }
    row
}

/// A line's amounts (costs, quantities) as exact decimals, by column.
fn line_amounts(line: &BillLine, cells: &Row) -> Vec<(&'static str, Decimal)> {
    SPLIT
        .iter()
        .filter_map(|col| {
            let v = match *col {
                "BilledCost" => Some(from_text(&line.billed_cost)),
                "EffectiveCost" => Some(from_text(&line.effective_cost)),
                "ListCost" => Some(from_text(&line.list_cost)),
                other => cells.get(other).and_then(|t| parse_amount(t)),
            };
            v.map(|v| (*col, v))
        })
        .collect()
}

/// The hour's charge period: the hour, within the line's own period.
fn hour_period(line: &BillLine, hour: i64) -> (i64, i64) {
    let start = hour.max(line.charge_period_start_ms);
    let end = (hour + HOUR_MS).min(line.charge_period_end_ms).max(start);
    (start, end)
}

/// Where the export's bytes go, a day at a time; a closed receiver (the client left) stops it.
pub type Chunks = tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>;

/// The two shapes of the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    /// Typed columns: decimals as DECIMAL(38,18), dates as UTC timestamps, ids as strings (a
    /// numeric account id stays text, which CSV cannot say).
    Parquet,
}

/// Which split rows an export keeps: those matching the allocation API's filters, of the
/// teams the reader sees.
pub struct Selection<'a> {
    pub filters: &'a [(GroupBy, String)],
    pub scope: &'a Scope,
    pub schema: &'a OwnerSchema,
}

impl<'a> Selection<'a> {
    /// Every row.
    pub fn everything(schema: &'a OwnerSchema) -> Selection<'a> {
        Selection {
            filters: &[],
            scope: &gpuledger_core::scope::EVERY_TEAM,
            schema,
        }
    }

    /// Everything: no filter, every team.
    fn is_everything(&self) -> bool {
        self.filters.is_empty() && self.scope.is_all()
    }

    fn keeps(&self, part: &Part, attribution: &Attribution) -> bool {
        self.scope.admits_part(part, self.schema)
            && self.filters.iter().all(|(by, value)| {
                gpuledger_core::allocation::key_of(part, *by, attribution) == *value
            })
    }
}

/// Writes the FOCUS rows of `[from_ms, to_ms)`, a day at a time, sending the bytes ready after
/// each day to `out` (which waits while the reader is behind). `selection` keeps only matching
/// split rows; unless it is everything, lines that belong to no GPU host are left out.
pub async fn write_export(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    selection: &Selection<'_>,
    format: Format,
    out: &Chunks,
) -> Result<(), ExportError> {
    let mut sink: Box<dyn Sink + Send> = match format {
        Format::Csv => Box::new(CsvSink::new()?),
        Format::Parquet => Box::new(parquet_sink::ParquetSink::new()?),
    };
    let hosts = store::telemetry::hosts(store.db()).await?;
    let by_key = hosts_by_instance_key(&hosts);
    let mut day = from_ms;
    while day < to_ms {
        let day_end = (day + gpuledger_core::time::DAY_MS).min(to_ms);
        // Every part, filtered or not: a line-hour is split over all of them, and a filter
        // keeps only its rows (split over its own parts alone, it would take the whole hour).
        let attribution = ledger::load(store, day, day_end, RollupGrain::Hour).await?;
        let lines = store::bills::bill_lines(store.db(), day, day_end).await?;
        let open = write_day(
            sink.as_mut(),
            out,
            &attribution,
            &lines,
            &by_key,
            (from_ms, to_ms, day, day_end),
            selection,
        )
        .await?;
        if !open {
            return Ok(());
        }
        let ready = sink.take()?;
        if !ready.is_empty() && out.send(Ok(ready)).await.is_err() {
            return Ok(());
        }
        day = day_end;
    }
    let _ = out.send(Ok(sink.finish()?)).await;
    Ok(())
}

/// Where rows go: each format buffers a little and hands over whole bytes.
trait Sink {
    fn row(&mut self, row: Row, extra: [String; 3]) -> Result<(), ExportError>;
    /// The bytes complete so far.
    fn take(&mut self) -> Result<Vec<u8>, ExportError>;
    /// How many bytes [`Sink::take`] would hand over now.
    fn pending(&mut self) -> Result<usize, ExportError>;
    /// The rest, the file's end included.
    fn finish(self: Box<Self>) -> Result<Vec<u8>, ExportError>;
}

struct CsvSink(crate::csv_out::SafeCsv<SharedBuf>, SharedBuf);

impl CsvSink {
    fn new() -> Result<Self, ExportError> {
        let buf = SharedBuf::default();
        let mut w = crate::csv_out::SafeCsv::new(buf.clone());
        w.write_record(COLUMNS.iter().chain(EXTRA_COLUMNS.iter()))?;
        Ok(CsvSink(w, buf))
    }
}

impl Sink for CsvSink {
    fn row(&mut self, row: Row, extra: [String; 3]) -> Result<(), ExportError> {
        let cells = COLUMNS
            .iter()
            .map(|c| row.get(c).map_or("", String::as_str).to_owned())
            .chain(extra);
        Ok(self.0.write_record(cells)?)
    }
    fn take(&mut self) -> Result<Vec<u8>, ExportError> {
        self.0.flush().map_err(csv::Error::from)?;
        Ok(self.1.take())
    }
    fn pending(&mut self) -> Result<usize, ExportError> {
        self.0.flush().map_err(csv::Error::from)?;
        Ok(self.1.len())
    }
    fn finish(mut self: Box<Self>) -> Result<Vec<u8>, ExportError> {
        self.take()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("writing Parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
}

/// The billed (not estimated) parts of `attribution` per instance, hour, pricing category and
/// currency. Billed parts are of hosts with an instance key: their lines were matched by it.
fn billed_parts(attribution: &Attribution) -> HourParts<'_> {
    let mut parts: HourParts = HashMap::new();
    for p in attribution.parts.iter().filter(|p| !p.estimated) {
        let Some(key) = attribution
            .hosts
            .get(&p.host_id)
            .and_then(|h| h.instance_key.as_deref())
        else {
            continue;
        };
        parts
            .entry((
                key,
                p.hour_ms,
                p.pricing_category.as_str(),
                p.currency.as_str(),
            ))
            .or_default()
            .push(p);
    }
    parts
}

/// The instance of a line on a known host.
fn instance_of<'l>(l: &'l BillLine, by_key: &HashMap<&str, i64>) -> Option<&'l str> {
    l.resource_key
        .as_deref()
        .filter(|k| by_key.contains_key(*k))
}

/// How many lines share each instance-hour, pricing category and currency of the day.
fn lines_sharing<'l>(
    lines: &'l [BillLine],
    by_key: &HashMap<&str, i64>,
    (day, day_end): (i64, i64),
) -> HashMap<(&'l str, i64, &'l str, &'l str), usize> {
    let mut sharing = HashMap::new();
    for l in lines {
        if let Some(host) = instance_of(l, by_key) {
            for (hour, _) in spread_over_hours(
                Decimal::ONE,
                l.charge_period_start_ms,
                l.charge_period_end_ms,
                day,
                day_end,
            ) {
                *sharing
                    .entry((host, hour, l.pricing_category.as_str(), l.currency.as_str()))
                    .or_default() += 1;
            }
        }
    }
    sharing
}

/// A line of no GPU host, once: its part of the range `[from_ms, to_ms)`, whole, from `first`.
fn whole_line_row(
    line: &BillLine,
    (cells, amounts): (Row, &[(&'static str, Decimal)]),
    (first, from_ms, to_ms): (i64, i64, i64),
) -> Row {
    let whole: Vec<(&str, Decimal)> = amounts
        .iter()
        .map(|(col, v)| {
            let in_range = spread_over_hours(
                *v,
                line.charge_period_start_ms,
                line.charge_period_end_ms,
                from_ms,
                to_ms,
            );
            (*col, in_range.into_iter().map(|(_, v)| v).sum())
        })
        .collect();
    let mut row = cells;
    row.insert("ChargePeriodStart", rfc3339(first));
    row.insert(
        "ChargePeriodEnd",
        rfc3339(line.charge_period_end_ms.min(to_ms).max(first)),
    );
    for (col, v) in whole {
        row.insert(col, to_text(v));
    }
    row
}

/// The row of one part (`j`-th of its line-hour): the line-hour's amounts split to it, the
/// ratio of its effective cost to the line-hour's, who and what it was. A part on a host shared
/// with another team (`shared`, in a team-scoped export) keeps neither the line's tags nor the
/// ratio (both are the host's).
fn allocated_row(
    mut row: Row,
    (part, j): (&Part, usize),
    (split, effective): (&[(&'static str, Vec<Decimal>)], Decimal),
    shared: bool,
) -> Row {
    for (col, values) in split {
        row.insert(col, to_text(values.get(j).copied().unwrap_or_default()));
    }
    let ratio = if effective.is_zero() {
        Decimal::ZERO
    } else {
        split
            .iter()
            .find(|(c, _)| *c == "EffectiveCost")
            .and_then(|(_, v)| v.get(j))
            .map_or(Decimal::ZERO, |v| *v / effective)
    };
    let gpu = part.gpu_uuid.clone().unwrap_or_default();
    let mut tags = Map::new();
    for (k, v) in part.owner.iter() {
        tags.insert(k.into(), Value::String(v.into()));
    }
    tags.insert("gpuledger/kind".into(), part.kind.as_str().into());
    row.insert("AllocatedMethodId", METHOD_ID.to_owned());
    if shared {
        row.insert("Tags", String::new());
    } else {
        row.insert(
            "AllocatedMethodDetails",
            method_details(ratio, part.gpu_seconds / 3600.0),
        );
    }
    if !gpu.is_empty() {
        row.insert("AllocatedResourceId", gpu.clone());
        row.insert(
            "AllocatedResourceName",
            format!("{gpu} ({})", part.kind.as_str()),
        );
    }
    row.insert("AllocatedTags", Value::Object(tags).to_string());
    row
}

/// The parts of each (host, hour, pricing category, currency), billed only.
/// Parts per (instance key, hour, pricing category, currency): a bill line finds its hour's
/// parts by its instance, whichever host held the instance when the hour was attributed (an
/// hour rolled up before an agent took over a billed instance sits on the bill's host).
type HourParts<'a> = HashMap<(&'a str, i64, &'a str, &'a str), Vec<&'a Part>>;

/// Bytes handed to the client at a time: a day of a large fleet is tens of megabytes.
const CHUNK_BYTES: usize = 1 << 20;

/// Writes a day's rows; false when the client has gone.
async fn write_day(
    w: &mut (dyn Sink + Send),
    out: &Chunks,
    attribution: &Attribution,
    lines: &[BillLine],
    by_key: &HashMap<&str, i64>,
    (from_ms, to_ms, day, day_end): (i64, i64, i64, i64),
    selection: &Selection<'_>,
) -> Result<bool, ExportError> {
    let filtered = !selection.is_everything();
    // A team-scoped export: hosts shared with another team keep their rows of the team's parts,
    // but not the line's tags nor the ratio to the line's whole cost (both are the host's).
    let held_hosts = selection
        .scope
        .held_by(attribution, selection.schema, |p| p.host_id.to_string());
    let parts = billed_parts(attribution);
    // How many lines share each instance-hour and category: a lone line takes the parts' own
    // amounts, which then equal the rollups exactly.
    let sharing = lines_sharing(lines, by_key, (day, day_end));
    let name_of = |host: Option<i64>| {
        host.and_then(|id| attribution.hosts.get(&id))
            .map(|h| h.hostname.clone())
            .unwrap_or_default()
    };
    for line in lines {
        if w.pending()? >= CHUNK_BYTES && out.send(Ok(w.take()?)).await.is_err() {
            return Ok(false);
        }
        let cells = line_cells(line);
        let amounts = line_amounts(line, &cells);
        let spread: Vec<(&str, Vec<(i64, Decimal)>)> = amounts
            .iter()
            .map(|(col, v)| {
                (
                    *col,
                    spread_over_hours(
                        *v,
                        line.charge_period_start_ms,
                        line.charge_period_end_ms,
                        day,
                        day_end,
                    ),
                )
            })
            .collect();
        let hours: Vec<i64> = spread
            .iter()
            .find(|(c, _)| *c == "EffectiveCost")
            .map(|(_, h)| h.iter().map(|(h, _)| *h).collect())
            .unwrap_or_default();
        let host = instance_of(line, by_key);
        if host.is_none() {
            // Not a GPU host's line: once, in the day its part of the range starts.
            let first = line.charge_period_start_ms.max(from_ms);
            if filtered || first < day || first >= day_end {
                continue;
            }
            let row = whole_line_row(line, (cells, &amounts), (first, from_ms, to_ms));
            w.row(row, [String::new(), String::new(), String::new()])?;
            continue;
        }
        let host = host.unwrap_or_default();
        let host_name = name_of(by_key.get(host).copied());
        for (i, hour) in hours.iter().enumerate() {
            let at = |col: &str| {
                spread
                    .iter()
                    .find(|(c, _)| *c == col)
                    .and_then(|(_, h)| h.get(i))
                    .map_or(Decimal::ZERO, |(_, v)| *v)
            };
            let mut base = cells.clone();
            let (start, end) = hour_period(line, *hour);
            base.insert("ChargePeriodStart", rfc3339(start));
            base.insert("ChargePeriodEnd", rfc3339(end));
            let key = (
                host,
                *hour,
                line.pricing_category.as_str(),
                line.currency.as_str(),
            );
            let Some(hour_parts) = parts.get(&key).filter(|p| !p.is_empty()) else {
                // Not attributed (yet): the line-hour as it is.
                if filtered {
                    continue;
                }
                for (col, _) in &amounts {
                    base.insert(col, to_text(at(col)));
                }
                w.row(base, [String::new(), host_name.clone(), String::new()])?;
                continue;
            };
            let effective = at("EffectiveCost");
            let total: Decimal = hour_parts.iter().map(|p| p.cost).sum();
            let mut weights: Vec<f64> = hour_parts
                .iter()
                .map(|p| rust_decimal::prelude::ToPrimitive::to_f64(&p.cost).unwrap_or(0.0))
                .collect();
            if weights.iter().all(|w| *w <= 0.0) {
                weights = hour_parts.iter().map(|p| p.gpu_seconds.max(0.0)).collect();
            }
            let alone = sharing.get(&key).copied() == Some(1) && total == effective;
            let mut split: Vec<(&str, Vec<Decimal>)> = amounts
                .iter()
                .map(|(col, _)| (*col, split_exact(at(col), &weights)))
                .collect();
            if alone {
                if let Some((_, v)) = split.iter_mut().find(|(c, _)| *c == "EffectiveCost") {
                    *v = hour_parts.iter().map(|p| p.cost).collect();
                }
            }
            for (j, part) in hour_parts.iter().enumerate() {
                if !selection.keeps(part, attribution) {
                    continue;
                }
                let shared = held_hosts
                    .as_ref()
                    .is_some_and(|h| !h.contains(&part.host_id.to_string()));
                let row = allocated_row(base.clone(), (part, j), (&split, effective), shared);
                w.row(
                    row,
                    [
                        part.kind.as_str().to_owned(),
                        name_of(Some(part.host_id)),
                        format!("{:.6}", part.gpu_seconds / 3600.0),
                    ],
                )?;
            }
        }
    }
    Ok(true)
}

/// A `Write` whose bytes the sink takes out between row groups.
#[derive(Clone, Default)]
struct SharedBuf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("export buffer poisoned"))?
            .extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl SharedBuf {
    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .map(|mut b| std::mem::take(&mut *b))
            .unwrap_or_default()
    }
    fn len(&self) -> usize {
        self.0.lock().map_or(0, |b| b.len())
    }
}
