//! FOCUS cost-and-usage exports, versions 1.0 to 1.3, from any provider (AWS Data Exports, Azure
//! Cost Management, Google Cloud, OCI), as CSV, gzip-compressed CSV or Parquet.
//!
//! Reading is driven by the header: columns are found by name, the version is told from the
//! columns each version added, and every column the importer does not model (provider `x_`
//! columns, other providers' own columns, FOCUS columns such as `ChargeFrequency`) is kept with
//! the line as it came. Rows are read one at a time ([`FocusRows`]): CSV streams, Parquet is read
//! a row group at a time, so memory does not grow with the file.
//!
//! Real exports bend the spec, and these are read as their producers mean them (the FOCUS
//! project's own sample carries all of them): bare `NULL` for an empty value, timestamps without
//! `T` or zone (UTC), `Tags` as a JSON object, a list of key/value pairs, or Azure's object
//! without braces, `ChargeFrequency` in either case.
//!
//! The first problem stops the import and is reported with its line and column; the caller
//! stores nothing of such a file.

use std::collections::{BTreeMap, HashMap};

use csv::StringRecord;
use rust_decimal::Decimal;

use super::{normalize_resource_id, pricing_category, CostLine};
use gpuledger_core::money::parse_amount;
use gpuledger_core::time::month_start_ms;

use gpuledger_core::bill::FocusError;

/// Columns without which a row means nothing. Provider is checked separately: FOCUS 1.3 renamed
/// `ProviderName` to `ServiceProviderName`.
const REQUIRED: [&str; 6] = [
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "BilledCost",
    "EffectiveCost",
    "BillingCurrency",
    "ChargeCategory",
];

/// Columns only FOCUS datasets other than cost and usage carry, with the dataset's name: a
/// contract-commitment file (FOCUS 1.3) imported by mistake is refused by name.
const OTHER_DATASETS: [(&str, &str); 2] = [
    ("ContractCommitmentId", "Contract Commitment"),
    ("ContractCommitmentCost", "Contract Commitment"),
];

/// The columns [`CostLine`] models; every other column is kept in `extra_json`.
const MODELED: [&str; 23] = [
    "ProviderName",
    "ServiceProviderName",
    "Provider",
    "Region",
    "BillingAccountId",
    "BillingPeriodStart",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "ResourceId",
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "BillingCurrency",
    "PricingCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountStatus",
    "ServiceName",
    "SkuId",
    "RegionId",
    "Tags",
    // Kept, but parsed as JSON rather than as text.
    "SkuPriceDetails",
    // Kept normalised rather than as written.
    "ChargeFrequency",
];

/// FOCUS versions, told apart by the columns each one added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FocusVersion {
    V1_0,
    V1_1,
    V1_2,
    V1_3,
}

impl FocusVersion {
    /// The newest version whose added columns the header carries. A 1.0 header may be 1.0 or
    /// any later file without its optional additions; the rules are the same for those.
    fn of(cols: &Columns) -> Self {
        let any = |names: &[&str]| names.iter().any(|n| cols.index.contains_key(*n));
        if any(&[
            "ServiceProviderName",
            "HostProviderName",
            "AllocatedMethodId",
            "AllocatedResourceId",
            "ContractApplied",
        ]) {
            FocusVersion::V1_3
        } else if any(&[
            "InvoiceId",
            "PricingCurrency",
            "BillingAccountType",
            "SubAccountType",
            "PricingCurrencyEffectiveCost",
        ]) {
            FocusVersion::V1_2
        } else if any(&[
            "SkuMeter",
            "SkuPriceDetails",
            "ServiceSubcategory",
            "CapacityReservationId",
            "CommitmentDiscountQuantity",
        ]) {
            FocusVersion::V1_1
        } else {
            FocusVersion::V1_0
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FocusVersion::V1_0 => "1.0",
            FocusVersion::V1_1 => "1.1",
            FocusVersion::V1_2 => "1.2",
            FocusVersion::V1_3 => "1.3",
        }
    }
}

/// Parses ISO 8601 UTC timestamps as FOCUS writes them, with or without `T`, `Z` or seconds.
pub fn parse_time_ms(text: &str) -> Option<i64> {
    let t = text.trim();
    if let Ok(dt) = chrono::DateTime::parse_from_rfc3339(t) {
        return Some(dt.timestamp_millis());
    }
    // `2024-09-01 00:00:00+00:00`: RFC 3339 with a space.
    if let Ok(dt) = chrono::DateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S%.f%:z") {
        return Some(dt.timestamp_millis());
    }
    let t = t.trim_end_matches('Z').trim_end_matches(" UTC");
    for fmt in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(dt) = chrono::NaiveDateTime::parse_from_str(t, fmt) {
            return Some(dt.and_utc().timestamp_millis());
        }
    }
    chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|dt| dt.and_utc().timestamp_millis())
}

struct Columns {
    names: Vec<String>,
    index: HashMap<String, usize>,
    /// Positions and names of the columns kept in `extra_json`.
    extra: Vec<(usize, String)>,
    provider: &'static str,
}

impl Columns {
    fn new(headers: Vec<String>) -> Result<Self, FocusError> {
        let names: Vec<String> = headers
            .into_iter()
            .map(|h| h.trim().trim_start_matches('\u{feff}').to_owned())
            .collect();
        // A column named twice leaves which one holds the values to chance: refuse it.
        let mut first_of: HashMap<&str, usize> = HashMap::new();
        for (i, name) in names.iter().enumerate().filter(|(_, n)| !n.is_empty()) {
            if let Some(first) = first_of.insert(name, i) {
                return Err(field_err(
                    1,
                    name,
                    format!(
                        "is named twice in the header (columns {} and {}); which one holds the \
                         values cannot be told",
                        first + 1,
                        i + 1
                    ),
                ));
            }
        }
        let index: HashMap<String, usize> = names
            .iter()
            .enumerate()
            .map(|(i, h)| (h.clone(), i))
            .collect();
        if let Some((_, dataset)) = OTHER_DATASETS
            .iter()
            .find(|(col, _)| index.contains_key(*col))
        {
            if !index.contains_key("ChargePeriodStart") {
                return Err(FocusError::OtherDataset((*dataset).to_owned()));
            }
        }
        for name in REQUIRED {
            if !index.contains_key(name) {
                return Err(FocusError::MissingColumn(name.to_owned()));
            }
        }
        // `Provider` is the 1.0-preview name some exports (OCI's) still use.
        let provider = ["ProviderName", "ServiceProviderName", "Provider"]
            .into_iter()
            .find(|c| index.contains_key(*c))
            .ok_or_else(|| FocusError::MissingColumn("ProviderName".into()))?;
        let extra = names
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.is_empty() && !MODELED.contains(&n.as_str()))
            .map(|(i, n)| (i, n.clone()))
            .collect();
        Ok(Columns {
            names,
            index,
            extra,
            provider,
        })
    }

    /// A cell's text; a bare `NULL` (how several providers write an empty value) is empty.
    fn get<'r>(&self, record: &'r StringRecord, name: &str) -> &'r str {
        self.index
            .get(name)
            .and_then(|i| record.get(*i))
            .map(cell)
            .unwrap_or("")
    }

    fn opt(&self, record: &StringRecord, name: &str) -> Option<String> {
        Some(self.get(record, name))
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    }
}

fn cell(text: &str) -> &str {
    let t = text.trim();
    if t == "NULL" {
        ""
    } else {
        t
    }
}

fn field_err(line: u64, column: &str, message: impl Into<String>) -> FocusError {
    FocusError::Field {
        line,
        column: column.to_owned(),
        message: message.into(),
    }
}

type JsonObject = serde_json::Map<String, serde_json::Value>;

/// A JSON object column such as `SkuPriceDetails`; empty means `{}`.
fn json_object(line: u64, column: &str, text: &str) -> Result<JsonObject, FocusError> {
    if text.is_empty() {
        return Ok(JsonObject::new());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(field_err(line, column, "must be a JSON object")),
        Err(e) => Err(field_err(line, column, format!("not valid JSON: {e}"))),
    }
}

/// `Tags` in the forms providers write: the JSON object FOCUS names (`{"team":"ml"}`), a list
/// of key/value pairs (`[{"key":"team","value":"ml"}]`, as BigQuery exports repeated records),
/// or Azure's object without braces (`"team": "ml","env": "prod"`). Empty means no tags.
pub fn tags_object(line: u64, text: &str) -> Result<JsonObject, FocusError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(JsonObject::new());
    }
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) if text.starts_with('"') => serde_json::from_str(&format!("{{{text}}}"))
            .map_err(|_| field_err(line, "Tags", format!("not valid JSON: {e}")))?,
        Err(e) => return Err(field_err(line, "Tags", format!("not valid JSON: {e}"))),
    };
    let tags = tags_of_value(line, value)?;
    // A tag is an owner label (`team` from the bill): one written `\u0000` in the JSON would
    // reach the ledger's owner values, which PostgreSQL's text cannot hold.
    let nul = |t: &str| t.contains('\0');
    if let Some((key, _)) = tags
        .iter()
        .find(|(k, v)| nul(k) || v.as_str().is_some_and(nul))
    {
        return Err(field_err(
            line,
            "Tags",
            format!("the tag {key:?} holds a NUL character"),
        ));
    }
    Ok(tags)
}

fn tags_of_value(line: u64, value: serde_json::Value) -> Result<JsonObject, FocusError> {
    match value {
        serde_json::Value::Object(m) => Ok(m),
        serde_json::Value::Array(items) => {
            let mut out = JsonObject::new();
            for item in items {
                let pair = item.as_object().and_then(|o| {
                    let key = ["key", "Key", "name", "Name"]
                        .iter()
                        .find_map(|k| o.get(*k))?
                        .as_str()?;
                    let value = ["value", "Value"]
                        .iter()
                        .find_map(|k| o.get(*k))
                        .cloned()
                        .unwrap_or(serde_json::Value::Null);
                    Some((key.to_owned(), value))
                });
                let Some((key, value)) = pair else {
                    return Err(field_err(
                        line,
                        "Tags",
                        "a list of tags must hold {\"key\": …, \"value\": …} objects",
                    ));
                };
                out.insert(key, value);
            }
            Ok(out)
        }
        _ => Err(field_err(line, "Tags", "must be a JSON object of tags")),
    }
}

/// Google's BigQuery view writes values in lower case (`usage`): the spec's spelling is kept, so
/// `Usage` lines are found whoever wrote them.
fn charge_category(text: &str) -> String {
    ["Usage", "Purchase", "Tax", "Credit", "Adjustment"]
        .into_iter()
        .find(|c| c.eq_ignore_ascii_case(text))
        .map_or_else(|| text.to_owned(), str::to_owned)
}

/// `Usage-based` and `Usage-Based` both occur in real exports: the spec's spelling is kept.
fn charge_frequency(text: &str) -> String {
    match text.to_ascii_lowercase().as_str() {
        "usage-based" => "Usage-Based".into(),
        "one-time" => "One-Time".into(),
        "recurring" => "Recurring".into(),
        _ => text.to_owned(),
    }
}

/// An EC2-style instance type named in a charge description ("$1.624 per On Demand Linux
/// g5.4xlarge Instance Hour"), for exports with no instance-type column.
fn instance_type_in(description: &str) -> Option<String> {
    description
        .split_whitespace()
        .find(|word| {
            let Some((family, size)) = word.split_once('.') else {
                return false;
            };
            !family.is_empty()
                && family
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && family
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase())
                && (size.ends_with("large")
                    || size.starts_with("metal")
                    || ["nano", "micro", "small", "medium"].contains(&size))
        })
        .map(str::to_owned)
}

/// The Azure VM size a charge description names: Azure writes "Virtual Machines {series} -
/// {meter} - {region}" ("Virtual Machines NCadsA100v4 Series - NC24ads A100 v4 - US East"),
/// the meter being the size without its `Standard_` prefix, with spaces for underscores, and
/// sometimes alternatives ("D11 v2/DS11 v2") or a pricing suffix ("NC6 Spot").
fn azure_vm_size_in(description: &str) -> Option<String> {
    let rest = description.strip_prefix("Virtual Machines ")?;
    let mut parts = rest.split(" - ");
    let (_series, meter) = (parts.next()?, parts.next()?);
    let meter = meter.split('/').next()?.trim();
    let meter = ["Spot", "Low Priority"]
        .iter()
        .find_map(|s| meter.strip_suffix(s))
        .unwrap_or(meter)
        .trim();
    let valid = !meter.is_empty()
        && meter
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == ' ' || c == '_' || c == '-');
    valid.then(|| format!("Standard_{}", meter.replace(' ', "_")))
}

/// Records as text, whatever the file format.
pub(super) type Records = Box<dyn Iterator<Item = Result<StringRecord, FocusError>> + Send>;

/// A FOCUS file read one row at a time. Yields the first error and then ends; a file with a
/// header and no row yields [`FocusError::Empty`].
pub struct FocusRows {
    records: Records,
    cols: Columns,
    version: FocusVersion,
    line: u64,
    done: bool,
    /// The rows the export's manifest says the file holds (Azure's `dataRowCount`).
    expected_rows: Option<u64>,
}

impl FocusRows {
    /// A row reader over a header and its rows (as text, whatever the file format).
    pub(super) fn new(headers: Vec<String>, records: Records) -> Result<Self, FocusError> {
        let cols = Columns::new(headers)?;
        Ok(FocusRows {
            version: FocusVersion::of(&cols),
            records,
            cols,
            line: 1,
            done: false,
            expected_rows: None,
        })
    }

    pub fn version(&self) -> FocusVersion {
        self.version
    }

    /// The reader that, at the end of the file, refuses it unless it held `rows` rows: what the
    /// export's manifest says was written, so a file cut short in transfer is not half a bill.
    pub fn expecting_rows(self, rows: Option<u64>) -> Self {
        FocusRows {
            expected_rows: rows,
            ..self
        }
    }
}

impl Iterator for FocusRows {
    type Item = Result<CostLine, FocusError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let Some(record) = self.records.next() else {
            self.done = true;
            let found = self.line - 1;
            if found == 0 {
                return Some(Err(FocusError::Empty));
            }
            return self
                .expected_rows
                .filter(|expected| *expected != found)
                .map(|expected| Err(FocusError::RowCount { expected, found }));
        };
        self.line += 1;
        let parsed = record.and_then(|r| parse_row(self.line, &r, &self.cols));
        self.done = parsed.is_err();
        Some(parsed)
    }
}

/// The longest cell read, in bytes: tags (50 of them at most, 768 bytes each on Azure) and
/// price details fit many times over; a longer cell would be copied into every export row of
/// its allocation.
pub const MAX_CELL_BYTES: usize = 64 << 10;

fn amount(line: u64, cols: &Columns, r: &StringRecord, name: &str) -> Result<Decimal, FocusError> {
    let text = cols.get(r, name);
    parse_amount(text)
        .ok_or_else(|| field_err(line, name, format!("not a decimal number: {text:?}")))
}

/// A cost FOCUS requires on every row: empty or `NULL` is refused rather than read as zero.
fn required_amount(
    line: u64,
    cols: &Columns,
    r: &StringRecord,
    name: &str,
) -> Result<Decimal, FocusError> {
    if cols.get(r, name).is_empty() {
        return Err(field_err(
            line,
            name,
            "is empty: FOCUS requires a decimal here",
        ));
    }
    amount(line, cols, r, name)
}

fn time(line: u64, cols: &Columns, r: &StringRecord, name: &str) -> Result<i64, FocusError> {
    let text = cols.get(r, name);
    parse_time_ms(text)
        .ok_or_else(|| field_err(line, name, format!("not an ISO 8601 date-time: {text:?}")))
}

const DAY_MS: i64 = 24 * 3600 * 1000;
/// The longest billing period read: providers bill by the month; a year leaves room for
/// contracts billed yearly.
const MAX_BILLING_PERIOD_MS: i64 = 366 * DAY_MS;
/// How far before its billing period a charge may lie: a late usage row (OCI's sample bill
/// charges September's last hours in October) or a correction of an earlier month.
const MAX_CHARGE_BEFORE_MS: i64 = 400 * DAY_MS;
/// The longest charge period of a purchase: a commitment's term, bought up front (five years
/// is longer than any provider sells).
const MAX_PURCHASE_TERM_MS: i64 = 5 * 366 * DAY_MS;

/// A charge period a bill could hold: no longer than its billing period (a purchase, no longer
/// than a commitment's term), and near it. A bill from 1950 to 9999 is a broken export, and
/// reading it would spread its cost over every hour between.
fn charge_period_fits(
    line: u64,
    (start, end): (i64, i64),
    (billing_start, billing_end): (i64, i64),
    charge_category: &str,
) -> Result<(), FocusError> {
    let day = |ms: i64| {
        let when = crate::format::utc_minute(ms);
        when.split(' ').next().unwrap_or_default().to_owned()
    };
    let billing = billing_end.saturating_sub(billing_start);
    if billing <= 0 {
        return Err(field_err(
            line,
            "BillingPeriodEnd",
            "is not after BillingPeriodStart",
        ));
    }
    if billing > MAX_BILLING_PERIOD_MS {
        return Err(field_err(
            line,
            "BillingPeriodEnd",
            format!(
                "makes a billing period of {} days ({} to {}); no bill covers more than a year",
                billing / DAY_MS,
                day(billing_start),
                day(billing_end)
            ),
        ));
    }
    let purchase = charge_category == "Purchase";
    let longest = if purchase {
        MAX_PURCHASE_TERM_MS
    } else {
        billing
    };
    if end.saturating_sub(start) > longest {
        return Err(field_err(
            line,
            "ChargePeriodEnd",
            format!(
                "makes a charge period of {} days ({} to {}), longer than {}",
                end.saturating_sub(start) / DAY_MS,
                day(start),
                day(end),
                if purchase {
                    "any commitment's term (five years)".to_owned()
                } else {
                    format!("its billing period ({} days)", billing / DAY_MS)
                }
            ),
        ));
    }
    let latest_end = billing_end.saturating_add(longest);
    if start < billing_start.saturating_sub(MAX_CHARGE_BEFORE_MS) || end > latest_end {
        return Err(field_err(
            line,
            "ChargePeriodStart",
            format!(
                "the charge period {} to {} lies too far outside its billing period {} to {}",
                day(start),
                day(end),
                day(billing_start),
                day(billing_end)
            ),
        ));
    }
    Ok(())
}

fn parse_row(line: u64, r: &StringRecord, cols: &Columns) -> Result<CostLine, FocusError> {
    // No export writes NUL, and PostgreSQL cannot store it in text: name the cell (a fuzzer
    // found this; see fuzz/regressions/focus/).
    if let Some(col) = r.iter().position(|c| c.contains('\0')) {
        let name = cols.names.get(col).map_or("?", String::as_str);
        return Err(field_err(line, name, "contains a NUL character"));
    }
    if let Some((col, long)) = r.iter().enumerate().find(|(_, c)| c.len() > MAX_CELL_BYTES) {
        let name = cols.names.get(col).map_or("?", String::as_str);
        return Err(field_err(
            line,
            name,
            format!(
                "holds {} bytes; a cell holds at most {} KiB",
                long.len(),
                MAX_CELL_BYTES >> 10
            ),
        ));
    }
    let start = time(line, cols, r, "ChargePeriodStart")?;
    let end = time(line, cols, r, "ChargePeriodEnd")?;
    if end < start {
        return Err(field_err(
            line,
            "ChargePeriodEnd",
            "is before ChargePeriodStart",
        ));
    }
    let billed = required_amount(line, cols, r, "BilledCost")?;
    let effective = required_amount(line, cols, r, "EffectiveCost")?;
    let list = amount(line, cols, r, "ListCost")?;
    let currency = cols.get(r, "BillingCurrency");
    if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(field_err(
            line,
            "BillingCurrency",
            format!("not an ISO 4217 code: {currency:?}"),
        ));
    }
    let charge_category = charge_category(cols.get(r, "ChargeCategory"));
    if charge_category.is_empty() {
        return Err(field_err(line, "ChargeCategory", "must not be empty"));
    }
    let billing_period_start_ms = match cols.get(r, "BillingPeriodStart") {
        "" => month_start_ms(start),
        _ => time(line, cols, r, "BillingPeriodStart")?,
    };
    let billing_period_end_ms = match cols.get(r, "BillingPeriodEnd") {
        "" => gpuledger_core::time::next_month_start(billing_period_start_ms),
        _ => time(line, cols, r, "BillingPeriodEnd")?,
    };
    charge_period_fits(
        line,
        (start, end),
        (billing_period_start_ms, billing_period_end_ms),
        &charge_category,
    )?;
    let tags = tags_object(line, cols.get(r, "Tags"))?;
    let sku_details = json_object(line, "SkuPriceDetails", cols.get(r, "SkuPriceDetails"))?;
    let mut extra: BTreeMap<&str, String> = cols
        .extra
        .iter()
        .filter_map(|(i, name)| {
            let v = cell(r.get(*i)?);
            (!v.is_empty()).then(|| (name.as_str(), v.to_owned()))
        })
        .collect();
    if let Some(freq) = cols.opt(r, "ChargeFrequency") {
        extra.insert("ChargeFrequency", charge_frequency(&freq));
    }
    if !sku_details.is_empty() {
        extra.insert(
            "SkuPriceDetails",
            serde_json::Value::Object(sku_details.clone()).to_string(),
        );
    }
    // The instance type sits in SkuPriceDetails (AWS), a provider column, or the description.
    let instance_type = sku_details
        .get("InstanceType")
        .or_else(|| sku_details.get("x_InstanceType"))
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .or_else(|| {
            [
                "x_InstanceType",
                "x_ProductInstanceType",
                "x_SkuMeterSubcategory",
            ]
            .iter()
            .find_map(|c| cols.opt(r, c))
        })
        .or_else(|| instance_type_in(cols.get(r, "ChargeDescription")))
        .or_else(|| azure_vm_size_in(cols.get(r, "ChargeDescription")));
    let resource_id = cols.opt(r, "ResourceId");
    let commitment_status = cols.opt(r, "CommitmentDiscountStatus");
    Ok(CostLine {
        line_no: line,
        provider: cols.get(r, cols.provider).to_owned(),
        billing_account_id: cols.get(r, "BillingAccountId").to_owned(),
        billing_period_start_ms,
        charge_period_start_ms: start,
        charge_period_end_ms: end,
        charge_category,
        resource_key: resource_id.as_deref().map(normalize_resource_id),
        resource_id,
        billed_cost: billed,
        effective_cost: effective,
        list_cost: list,
        currency: currency.to_ascii_uppercase(),
        pricing_category: pricing_category(
            cols.get(r, "PricingCategory"),
            commitment_status.as_deref(),
        ),
        commitment_discount_id: cols.opt(r, "CommitmentDiscountId"),
        commitment_discount_status: commitment_status,
        service_name: cols.opt(r, "ServiceName"),
        sku_id: cols.opt(r, "SkuId"),
        region: cols.opt(r, "RegionId").or_else(|| cols.opt(r, "Region")),
        instance_type,
        tags_json: serde_json::Value::Object(tags).to_string(),
        extra_json: serde_json::to_string(&extra).unwrap_or_else(|_| "{}".into()),
    })
}

#[cfg(test)]
pub(crate) mod tests;
