//! FOCUS cost-and-usage exports (1.0 to 1.3, as AWS Data Exports, Azure and GCP write them), as
//! CSV, gzip-compressed CSV or Parquet.
//!
//! The whole file is parsed before anything is stored, and the first problem is reported with
//! its line and column, so a malformed file is refused whole.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use rust_decimal::Decimal;

use super::{normalize_resource_id, pricing_category, CostLine};
use crate::money::parse_amount;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FocusError {
    #[error("line {line}, column {column}: {message}")]
    Field {
        line: u64,
        column: String,
        message: String,
    },
    #[error("line {line}: {message}")]
    Line { line: u64, message: String },
    #[error("the file has no {0} column: is it a FOCUS cost-and-usage export?")]
    MissingColumn(String),
    #[error("the file holds no rows")]
    Empty,
    #[error("reading the file: {0}")]
    Io(String),
}

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

/// Opens a FOCUS file's bytes: gzip when it starts with the gzip magic number.
pub fn decompress(bytes: Vec<u8>) -> Result<Vec<u8>, FocusError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| FocusError::Io(format!("not a valid gzip file: {e}")))?;
        Ok(out)
    } else {
        Ok(bytes)
    }
}

/// Parses ISO 8601 UTC timestamps as FOCUS writes them, with or without `T`, `Z` or seconds.
pub fn parse_time_ms(text: &str) -> Option<i64> {
    let t = text.trim();
    if let Ok(dt) = chrono::DateTime::parse_from_rfc3339(t) {
        return Some(dt.timestamp_millis());
    }
    let t = t.trim_end_matches('Z');
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

/// The first day of the month `ms` falls in, UTC.
pub fn month_start_ms(ms: i64) -> i64 {
    use chrono::Datelike;
    chrono::DateTime::from_timestamp_millis(ms)
        .and_then(|d| d.date_naive().with_day(1))
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(ms, |d| d.and_utc().timestamp_millis())
}

struct Columns {
    index: HashMap<String, usize>,
}

type Record = Vec<String>;

impl Columns {
    fn get<'r>(&self, record: &'r Record, name: &str) -> &'r str {
        self.index
            .get(name)
            .and_then(|i| record.get(*i))
            .map(|s| s.trim())
            .unwrap_or("")
    }
    fn opt(&self, record: &Record, name: &str) -> Option<String> {
        Some(self.get(record, name))
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    }
}

fn field_err(line: u64, column: &str, message: impl Into<String>) -> FocusError {
    FocusError::Field {
        line,
        column: column.to_owned(),
        message: message.into(),
    }
}

/// A JSON object column (`Tags`, `SkuPriceDetails`); empty means `{}`.
fn json_object(
    line: u64,
    column: &str,
    text: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, FocusError> {
    if text.is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(field_err(line, column, "must be a JSON object")),
        Err(e) => Err(field_err(line, column, format!("not valid JSON: {e}"))),
    }
}

/// Parses a whole FOCUS file, CSV or Parquet. Line numbers count the header as line 1, as an
/// editor shows them (for Parquet: the row number + 1, as the same data would be as CSV).
pub fn parse(bytes: &[u8]) -> Result<Vec<CostLine>, FocusError> {
    if bytes.starts_with(b"PAR1") {
        return super::parquet::parse(bytes);
    }
    let mut reader = csv::ReaderBuilder::new().flexible(false).from_reader(bytes);
    let headers: Vec<String> = reader
        .headers()
        .map_err(|e| FocusError::Line {
            line: 1,
            message: format!("unreadable header: {e}"),
        })?
        .iter()
        .map(str::to_owned)
        .collect();
    let rows = reader.into_records().enumerate().map(|(i, r)| {
        r.map(|r| r.iter().map(str::to_owned).collect())
            .map_err(|e| FocusError::Line {
                line: i as u64 + 2,
                message: format!("not valid CSV: {e}"),
            })
    });
    parse_records(headers, rows)
}

/// Turns a header and its rows (as text, whatever the file format) into cost lines.
pub fn parse_records(
    headers: Vec<String>,
    rows: impl Iterator<Item = Result<Record, FocusError>>,
) -> Result<Vec<CostLine>, FocusError> {
    let cols = Columns {
        index: headers
            .iter()
            .enumerate()
            .map(|(i, h)| (h.trim().trim_start_matches('\u{feff}').to_owned(), i))
            .collect(),
    };
    for name in REQUIRED {
        if !cols.index.contains_key(name) {
            return Err(FocusError::MissingColumn(name.to_owned()));
        }
    }
    let provider_col = ["ProviderName", "ServiceProviderName"]
        .into_iter()
        .find(|c| cols.index.contains_key(*c))
        .ok_or_else(|| FocusError::MissingColumn("ProviderName".into()))?;
    let x_columns: Vec<&str> = headers
        .iter()
        .map(String::as_str)
        .filter(|h| h.starts_with("x_"))
        .collect();
    let mut out = Vec::new();
    for (i, record) in rows.enumerate() {
        let line = i as u64 + 2;
        let record = record?;
        // No export writes NUL, and PostgreSQL cannot store it in text: name the cell (a fuzzer
        // found this; see fuzz/regressions/focus/).
        if let Some(col) = record.iter().position(|cell| cell.contains('\0')) {
            let name = headers.get(col).map_or("?", String::as_str);
            return Err(field_err(line, name, "contains a NUL character"));
        }
        out.push(parse_row(line, &record, &cols, provider_col, &x_columns)?);
    }
    if out.is_empty() {
        return Err(FocusError::Empty);
    }
    Ok(out)
}

fn amount(line: u64, cols: &Columns, r: &Record, name: &str) -> Result<Decimal, FocusError> {
    let text = cols.get(r, name);
    parse_amount(text)
        .ok_or_else(|| field_err(line, name, format!("not a decimal number: {text:?}")))
}

fn time(line: u64, cols: &Columns, r: &Record, name: &str) -> Result<i64, FocusError> {
    let text = cols.get(r, name);
    parse_time_ms(text)
        .ok_or_else(|| field_err(line, name, format!("not an ISO 8601 date-time: {text:?}")))
}

fn parse_row(
    line: u64,
    r: &Record,
    cols: &Columns,
    provider_col: &str,
    x_columns: &[&str],
) -> Result<CostLine, FocusError> {
    let start = time(line, cols, r, "ChargePeriodStart")?;
    let end = time(line, cols, r, "ChargePeriodEnd")?;
    if end < start {
        return Err(field_err(
            line,
            "ChargePeriodEnd",
            "is before ChargePeriodStart",
        ));
    }
    let billed = amount(line, cols, r, "BilledCost")?;
    let effective = amount(line, cols, r, "EffectiveCost")?;
    let list = amount(line, cols, r, "ListCost")?;
    let currency = cols.get(r, "BillingCurrency");
    if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(field_err(
            line,
            "BillingCurrency",
            format!("not an ISO 4217 code: {currency:?}"),
        ));
    }
    let charge_category = cols.get(r, "ChargeCategory");
    if charge_category.is_empty() {
        return Err(field_err(line, "ChargeCategory", "must not be empty"));
    }
    let billing_period_start_ms = match cols.get(r, "BillingPeriodStart") {
        "" => month_start_ms(start),
        _ => time(line, cols, r, "BillingPeriodStart")?,
    };
    let tags = json_object(line, "Tags", cols.get(r, "Tags"))?;
    let sku_details = json_object(line, "SkuPriceDetails", cols.get(r, "SkuPriceDetails"))?;
    let mut extra: BTreeMap<String, String> = x_columns
        .iter()
        .map(|c| (c.to_string(), cols.get(r, c).to_owned()))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    if !sku_details.is_empty() {
        extra.insert(
            "SkuPriceDetails".into(),
            serde_json::Value::Object(sku_details.clone()).to_string(),
        );
    }
    // The instance type sits in SkuPriceDetails (AWS) or a provider column.
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
        });
    let resource_id = cols.opt(r, "ResourceId");
    let commitment_status = cols.opt(r, "CommitmentDiscountStatus");
    Ok(CostLine {
        line_no: line,
        provider: cols.get(r, provider_col).to_owned(),
        billing_account_id: cols.get(r, "BillingAccountId").to_owned(),
        billing_period_start_ms,
        charge_period_start_ms: start,
        charge_period_end_ms: end,
        charge_category: charge_category.to_owned(),
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
        region: cols.opt(r, "RegionId"),
        instance_type,
        tags_json: serde_json::Value::Object(tags).to_string(),
        extra_json: serde_json::to_string(&extra).unwrap_or_else(|_| "{}".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "ProviderName,BillingAccountId,BillingPeriodStart,ChargePeriodStart,ChargePeriodEnd,ChargeCategory,BilledCost,EffectiveCost,ListCost,BillingCurrency,PricingCategory,CommitmentDiscountStatus,ServiceName,SkuId,SkuPriceDetails,ResourceId,RegionId,Tags,x_Operation";

    fn csv(rows: &[&str]) -> Vec<u8> {
        let mut s = String::from(HEADER);
        for r in rows {
            s.push('\n');
            s.push_str(r);
        }
        s.into_bytes()
    }

    const GOOD: &str = r#"AWS,1111,2026-05-01T00:00:00Z,2026-05-01T03:00:00Z,2026-05-01T04:00:00Z,Usage,32.7726,32.7726,32.7726,USD,Standard,,AmazonEC2,SKU1,"{""InstanceType"":""p4d.24xlarge""}",arn:aws:ec2:us-east-1:1111:instance/i-0abc,us-east-1,"{""team"":""search""}",RunInstances"#;

    #[test]
    fn parses_a_row() {
        let lines = parse(&csv(&[GOOD])).unwrap();
        let l = &lines[0];
        assert_eq!(l.line_no, 2);
        assert_eq!(l.provider, "AWS");
        assert_eq!(l.resource_key.as_deref(), Some("i-0abc"));
        assert_eq!(l.instance_type.as_deref(), Some("p4d.24xlarge"));
        assert_eq!(l.pricing_category, "on_demand");
        assert_eq!(l.effective_cost, parse_amount("32.7726").unwrap());
        assert_eq!(l.charge_period_end_ms - l.charge_period_start_ms, 3_600_000);
        assert!(l.tags_json.contains("search"));
        assert!(l.extra_json.contains("x_Operation"));
    }

    #[test]
    fn names_the_line_and_column_at_fault() {
        let bad = GOOD.replace(",32.7726,32.7726,32.7726,", ",32.7726,abc,32.7726,");
        let err = parse(&csv(&[GOOD, &bad])).unwrap_err();
        assert_eq!(
            err,
            FocusError::Field {
                line: 3,
                column: "EffectiveCost".into(),
                message: "not a decimal number: \"abc\"".into()
            }
        );
        let bad_time = GOOD.replace("2026-05-01T04:00:00Z", "yesterday");
        assert!(
            matches!(parse(&csv(&[&bad_time])).unwrap_err(), FocusError::Field { line: 2, ref column, .. } if column == "ChargePeriodEnd")
        );
        let bad_tags = GOOD.replace(r#""{""team"":""search""}""#, "[1]");
        assert!(parse(&csv(&[&bad_tags]))
            .unwrap_err()
            .to_string()
            .contains("column Tags"));
        let short = "AWS,1111";
        assert!(matches!(
            parse(&csv(&[short])).unwrap_err(),
            FocusError::Line { line: 2, .. }
        ));
    }

    #[test]
    fn refuses_what_is_not_focus() {
        assert_eq!(
            parse(b"a,b\n1,2").unwrap_err(),
            FocusError::MissingColumn("ChargePeriodStart".into())
        );
        assert_eq!(parse(HEADER.as_bytes()).unwrap_err(), FocusError::Empty);
    }

    #[test]
    fn a_nul_in_a_cell_is_refused_with_its_line_and_column() {
        let bad = GOOD.replace("i-0abc", "i-0\0abc");
        match parse(&csv(&[GOOD, &bad])) {
            Err(FocusError::Field { line, column, .. }) => {
                assert_eq!((line, column.as_str()), (3, "ResourceId"));
            }
            other => panic!("{other:?}"),
        }
    }

    /// A corrupt Parquet file the fuzzer found made the parquet crate panic.
    #[test]
    fn a_corrupt_parquet_file_is_an_error_not_a_panic() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/regressions/focus/parquet-bit-util-panic"
        );
        let bytes = std::fs::read(path).unwrap();
        assert!(bytes.starts_with(b"PAR1"));
        assert!(matches!(parse(&bytes), Err(FocusError::Io(_))));
    }

    #[test]
    fn gzip_is_detected() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&csv(&[GOOD])).unwrap();
        let gz = enc.finish().unwrap();
        assert_eq!(parse(&decompress(gz).unwrap()).unwrap().len(), 1);
    }

    #[test]
    fn time_formats() {
        assert_eq!(
            parse_time_ms("2026-05-01T00:00:00Z"),
            Some(1_777_593_600_000)
        );
        assert_eq!(
            parse_time_ms("2026-05-01 00:00:00"),
            Some(1_777_593_600_000)
        );
        assert_eq!(
            parse_time_ms("2026-05-01T02:00:00+02:00"),
            Some(1_777_593_600_000)
        );
        assert_eq!(parse_time_ms("2026-05-01"), Some(1_777_593_600_000));
        assert_eq!(
            month_start_ms(1_777_593_600_000 + 86_400_000 * 12),
            1_777_593_600_000
        );
    }
}
