use std::str::FromStr;

use super::*;
use crate::billing::focus_csv::csv_rows;
use crate::billing::focus_file::{open_bytes, open_path, parse};

const HEADER: &str = "ProviderName,BillingAccountId,BillingPeriodStart,ChargePeriodStart,ChargePeriodEnd,ChargeCategory,BilledCost,EffectiveCost,ListCost,BillingCurrency,PricingCategory,CommitmentDiscountStatus,ServiceName,SkuId,SkuPriceDetails,ResourceId,RegionId,Tags,x_Operation";

fn csv(rows: &[&str]) -> Vec<u8> {
    with_header(HEADER, rows)
}

fn with_header(header: &str, rows: &[&str]) -> Vec<u8> {
    let mut s = String::from(header);
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
    assert_eq!(
        parse(&csv(&[GOOD, short])).unwrap_err(),
        FocusError::Line {
            line: 3,
            message: "has 2 fields where the header has 19".into()
        }
    );
    // FOCUS requires a cost on every row: NULL is not read as zero.
    let null_cost = GOOD.replace(",32.7726,32.7726,32.7726,", ",NULL,32.7726,32.7726,");
    assert!(matches!(
        parse(&csv(&[&null_cost])).unwrap_err(),
        FocusError::Field { line: 2, ref column, .. } if column == "BilledCost"
    ));
}

/// A file holding fewer (or more) rows than its manifest says is refused at its end, so half a
/// bill is never stored as if whole.
#[test]
fn a_file_short_of_its_manifests_row_count_is_refused() {
    let two = csv(&[GOOD, GOOD]);
    let read = |expected: Option<u64>| -> Result<Vec<CostLine>, FocusError> {
        open_bytes(two.clone())
            .unwrap()
            .expecting_rows(expected)
            .collect()
    };
    assert_eq!(read(Some(2)).unwrap().len(), 2);
    assert_eq!(read(None).unwrap().len(), 2);
    let short = read(Some(3)).unwrap_err();
    assert_eq!(
        short,
        FocusError::RowCount {
            expected: 3,
            found: 2
        }
    );
    assert!(short.to_string().contains("cut short"), "{short}");
    assert!(read(Some(1)).is_err());
}

#[test]
fn refuses_what_is_not_focus() {
    assert_eq!(
        parse(b"a,b\n1,2").unwrap_err(),
        FocusError::MissingColumn("ChargePeriodStart".into())
    );
    assert_eq!(parse(HEADER.as_bytes()).unwrap_err(), FocusError::Empty);
    let commitments =
        "ContractCommitmentId,ContractId,ContractCommitmentCost,BillingCurrency\nc-1,k-1,100,USD";
    let err = parse(commitments.as_bytes()).unwrap_err();
    assert_eq!(err, FocusError::OtherDataset("Contract Commitment".into()));
    assert!(err.to_string().contains("not a cost-and-usage export"));
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

/// Found by the fuzzer: 5 KB of Parquet whose page header claims gigabytes made the parquet
/// crate allocate them (the fuzzer stopped at 2 GB). Page sizes are now checked against the
/// footer before anything is read; the seeds, real Parquet exports, still read whole.
#[test]
fn a_parquet_page_the_crate_would_size_in_gigabytes_is_refused_before_it_is_read() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/");
    let bytes = std::fs::read(format!("{dir}regressions/focus/parquet-page-size-oom")).unwrap();
    assert!(bytes.len() < 8 << 10);
    let err = parse(&bytes).unwrap_err();
    // Its first page's size is an overlong varint: no sane header.
    assert_eq!(
        err.to_string(),
        "reading the file: not a readable Parquet file: row group 0, column 0: a page header is unreadable"
    );
    let seed = std::fs::read(format!("{dir}seeds/focus/aws-azure.parquet")).unwrap();
    assert!(!parse(&seed).unwrap().is_empty());
}

#[test]
fn gzip_is_detected_in_memory_and_on_disk() {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&csv(&[GOOD, GOOD])).unwrap();
    let gz = enc.finish().unwrap();
    assert_eq!(parse(&gz).unwrap().len(), 2);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("part-00001.csv.gz");
    std::fs::write(&path, &gz).unwrap();
    let lines: Vec<_> = open_path(&path).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(lines.len(), 2);
    // A truncated gzip file is an error, not a short bill.
    std::fs::write(&path, &gz[..gz.len() - 12]).unwrap();
    let read: Result<Vec<_>, _> = open_path(&path).unwrap().collect();
    assert!(matches!(read, Err(FocusError::Io(_))), "{read:?}");
}

#[test]
fn time_formats() {
    for text in [
        "2026-05-01T00:00:00Z",
        "2026-05-01 00:00:00",
        "2026-05-01T02:00:00+02:00",
        "2026-05-01 00:00:00+00:00",
        "2026-05-01T00:00:00.000Z",
        "2026-05-01 00:00:00 UTC",
        "2026-05-01T00:00",
        "2026-05-01",
    ] {
        assert_eq!(parse_time_ms(text), Some(1_777_593_600_000), "{text}");
    }
    assert_eq!(parse_time_ms("05/01/2026"), None);
    assert_eq!(
        month_start_ms(1_777_593_600_000 + 86_400_000 * 12),
        1_777_593_600_000
    );
}

#[test]
fn tags_in_the_forms_providers_write() {
    let want = r#"{"env":"prod","team":"ml"}"#;
    for text in [
        r#"{"team": "ml", "env": "prod"}"#,
        r#"[{"key": "team", "value": "ml"}, {"key": "env", "value": "prod"}]"#,
        r#"[{"Key": "team", "Value": "ml"}, {"Key": "env", "Value": "prod"}]"#,
        r#""team": "ml","env": "prod""#,
    ] {
        let tags = tags_object(2, text).unwrap();
        assert_eq!(serde_json::Value::Object(tags).to_string(), want, "{text}");
    }
    assert!(tags_object(2, "").unwrap().is_empty());
    assert!(tags_object(2, "team=ml").is_err());
    assert!(tags_object(2, "[1, 2]").is_err());
    assert!(tags_object(2, "\"just text\"").is_err());
    // A NUL written as JSON's escape would reach the ledger's owner values, which PostgreSQL
    // cannot store: refused with its line, whether in a value or in a key.
    for text in [
        r#"{"team": "ml\u0000x"}"#,
        r#"{"te\u0000am": "ml"}"#,
        r#"[{"key": "team", "value": "\u0000"}]"#,
    ] {
        let e = tags_object(7, text).unwrap_err().to_string();
        assert!(
            e.contains("line 7") && e.contains("Tags") && e.contains("NUL"),
            "{text}: {e}"
        );
    }
}

#[test]
fn azure_vm_sizes_are_read_from_the_description() {
    for (description, size) in [
        (
            "Virtual Machines NCadsA100v4 Series - NC24ads A100 v4 - US East",
            Some("Standard_NC24ads_A100_v4"),
        ),
        (
            "Virtual Machines Dv2/DSv2 Series - D11 v2/DS11 v2 - US East 2",
            Some("Standard_D11_v2"),
        ),
        (
            "Virtual Machines NC Series - NC6 Spot - US West 2",
            Some("Standard_NC6"),
        ),
        ("Premium SSD Managed Disks - P6 LRS - US East 2", None),
        ("Virtual Machines", None),
    ] {
        assert_eq!(
            azure_vm_size_in(description).as_deref(),
            size,
            "{description}"
        );
    }
}

#[test]
fn instance_types_from_descriptions() {
    assert_eq!(
        instance_type_in("$1.624 per On Demand Linux g5.4xlarge Instance Hour").as_deref(),
        Some("g5.4xlarge")
    );
    assert_eq!(
        instance_type_in("USD 0.0 per p5.48xlarge Dedicated Usage").as_deref(),
        Some("p5.48xlarge")
    );
    assert_eq!(
        instance_type_in("$0.40 per million Amazon SQS standard requests"),
        None
    );
    assert_eq!(instance_type_in("$0.008 per GB-month of 1.5 storage"), None);
}

/// The exact sum of one column of a CSV file, read independently of the importer.
fn column_sum(text: &str, column: &str) -> Decimal {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let idx = reader
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == column)
        .unwrap();
    reader
        .records()
        .map(|r| r.unwrap()[idx].to_owned())
        .filter(|v| v != "NULL" && !v.is_empty())
        .map(|v| Decimal::from_str(&v).unwrap())
        .sum()
}

pub(crate) fn shared_sample_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/focus-samples/focus10_sample_aws_azure_oci.csv")
}

/// The FOCUS project's own sample: anonymized real AWS, Azure and OCI data, with every trait of
/// real exports (bare NULLs, zone-less timestamps, an extra `Id` column, mixed-case frequencies).
#[test]
fn the_focus_projects_real_sample_reads_whole() {
    let path = shared_sample_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (../shared beside the repo)", path.display()));
    let rows = open_path(&path).unwrap();
    assert_eq!(rows.version(), FocusVersion::V1_0);
    let lines: Vec<CostLine> = rows.collect::<Result<_, _>>().unwrap();
    assert_eq!(lines.len(), 1000);
    let billed: Decimal = lines.iter().map(|l| l.billed_cost).sum();
    let effective: Decimal = lines.iter().map(|l| l.effective_cost).sum();
    assert_eq!(billed, column_sum(&text, "BilledCost"));
    assert_eq!(effective, column_sum(&text, "EffectiveCost"));
    assert_eq!(billed, Decimal::from_str("20.52022672899").unwrap());

    let providers: std::collections::BTreeSet<&str> =
        lines.iter().map(|l| l.provider.as_str()).collect();
    assert_eq!(
        providers.into_iter().collect::<Vec<_>>(),
        ["AWS", "Microsoft", "Oracle"]
    );
    // Bare NULL is no value: no resource id, no tags, not the string "NULL".
    assert!(lines
        .iter()
        .all(|l| l.resource_id.as_deref() != Some("NULL") && l.tags_json != "\"NULL\""));
    // ... while a tag whose value holds the text NULL (an Azure row does) keeps it.
    assert!(lines
        .iter()
        .any(|l| l.tags_json.contains(r#""test":",NULL,NULL,""#)));
    assert_eq!(lines.iter().filter(|l| l.resource_id.is_none()).count(), 75);
    assert_eq!(lines.iter().filter(|l| l.tags_json == "{}").count(), 289);
    // The GPU rows: g5.4xlarge, told by the description since 1.0 has no instance-type column.
    let gpu: Vec<&CostLine> = lines
        .iter()
        .filter(|l| l.instance_type.as_deref() == Some("g5.4xlarge"))
        .collect();
    assert!(!gpu.is_empty());
    assert!(gpu.iter().all(|l| l.resource_key.is_some()));
    // Columns the importer does not model are kept, the frequency in the spec's spelling.
    let extra: serde_json::Value = serde_json::from_str(&lines[0].extra_json).unwrap();
    assert_eq!(extra["Id"], "11472");
    assert_eq!(extra["ChargeFrequency"], "Usage-Based");
    assert!(
        extra.get("ChargeClass").is_none(),
        "NULL cells are not kept"
    );
    assert!(lines.iter().all(|l| {
        let e: serde_json::Value = serde_json::from_str(&l.extra_json).unwrap();
        e["ChargeFrequency"] != "Usage-based"
    }));
    // Dates without a zone are UTC: September 2024.
    assert!(lines
        .iter()
        .filter(|l| l.provider == "AWS")
        .all(|l| l.billing_period_start_ms == 1_725_148_800_000));
}

/// Small exports in the shapes each provider and version documents (see docs/billing.md).
#[test]
fn each_providers_shape_and_version() {
    // Azure, FOCUS 1.0: x_ columns, tags as an object without braces, `T…Z` dates.
    let azure = with_header(
        "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,PricingCategory,ProviderName,ResourceId,ServiceName,Tags,x_SkuMeterSubcategory,x_ResourceGroupName",
        &[r#"3.06,/providers/Microsoft.Billing/billingAccounts/123,USD,2024-09-01T00:00:00Z,Usage,2024-09-02T00:00:00Z,2024-09-01T00:00:00Z,2.50,3.06,Standard,Microsoft,/subscriptions/s/resourceGroups/ml/providers/Microsoft.Compute/virtualMachines/gpu-vm-1,Virtual Machines,"""team"": ""ml"",""project"": ""llm""",NC24ads A100 v4,ml"#],
    );
    let rows = open_bytes(azure).unwrap();
    assert_eq!(rows.version(), FocusVersion::V1_0);
    let l = rows.collect::<Result<Vec<_>, _>>().unwrap().remove(0);
    assert_eq!(l.resource_key.as_deref(), Some("gpu-vm-1"));
    assert_eq!(l.instance_type.as_deref(), Some("NC24ads A100 v4"));
    assert_eq!(l.tags_json, r#"{"project":"llm","team":"ml"}"#);
    assert!(l.extra_json.contains(r#""x_ResourceGroupName":"ml""#));

    // Google Cloud, FOCUS 1.2: tags as a list of key/value records, zone-less timestamps.
    let gcp = with_header(
        "BilledCost,BillingAccountId,BillingAccountType,BillingCurrency,BillingPeriodStart,ChargeCategory,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,PricingCategory,ProviderName,ResourceId,ServiceName,Tags,InvoiceId",
        &[r#"11.20,0123-4567-89AB,Billing Account,USD,2024-09-01 00:00:00,Usage,2024-09-01 01:00:00,2024-09-01 00:00:00,11.20,11.20,Standard,Google Cloud,//compute.googleapis.com/projects/p/zones/us-central1-a/instances/a3-node-7,Compute Engine,"[{""key"":""team"",""value"":""vision""}]",INV-1"#],
    );
    let rows = open_bytes(gcp).unwrap();
    assert_eq!(rows.version(), FocusVersion::V1_2);
    let l = rows.collect::<Result<Vec<_>, _>>().unwrap().remove(0);
    assert_eq!(l.resource_key.as_deref(), Some("a3-node-7"));
    assert_eq!(l.tags_json, r#"{"team":"vision"}"#);
    assert!(l
        .extra_json
        .contains(r#""BillingAccountType":"Billing Account""#));

    // OCI: 1.0-preview names (Provider, Region), its own `oci_` columns kept like `x_` ones,
    // Azure-1.0-style dates without seconds, a lower-case charge category.
    let oci = with_header(
        "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,PricingCategory,Provider,Region,ResourceId,Tags,oci_ReferenceNumber",
        &["4.00,ocid1.tenancy.oc1..aaa,USD,2024-09-01T00:00Z,usage,2024-09-01T01:00Z,2024-09-01T00:00Z,4.00,4.00,,Oracle,us-ashburn-1,ocid1.instance.oc1.iad.bm-gpu,,ref-9"],
    );
    let l = parse(&oci).unwrap().remove(0);
    assert_eq!(l.provider, "Oracle");
    assert_eq!(l.region.as_deref(), Some("us-ashburn-1"));
    assert_eq!(l.charge_category, "Usage");
    assert_eq!(l.pricing_category, "other");
    assert!(l.extra_json.contains(r#""oci_ReferenceNumber":"ref-9""#));

    // FOCUS 1.3: the provider is ServiceProviderName.
    let v13 = with_header(
        "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,ServiceProviderName,HostProviderName,ResourceId",
        &["1.00,a,EUR,2025-01-01T00:00:00Z,Usage,2025-01-01T01:00:00Z,2025-01-01T00:00:00Z,1.00,1.00,Nebius,Nebius,vm-1"],
    );
    let rows = open_bytes(v13).unwrap();
    assert_eq!(rows.version(), FocusVersion::V1_3);
    let l = rows.collect::<Result<Vec<_>, _>>().unwrap().remove(0);
    assert_eq!(
        (l.provider.as_str(), l.currency.as_str()),
        ("Nebius", "EUR")
    );
    assert!(l.extra_json.contains(r#""HostProviderName":"Nebius""#));
}

/// A column named twice is refused with the columns it is at, in CSV and Parquet alike (both
/// read their header through `Columns`), rather than the later one silently winning.
#[test]
fn a_column_named_twice_is_refused() {
    let header = format!("{HEADER},BilledCost");
    let row = format!("{GOOD},0.01");
    let err = parse(&with_header(&header, &[&row])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 1, column BilledCost: is named twice in the header (columns 7 and 20); which one \
         holds the values cannot be told"
    );
    // Blank header cells (a trailing comma) are not names, and may repeat.
    let blanks = format!("{HEADER},,");
    assert!(parse(&with_header(&blanks, &[&format!("{GOOD},,")])).is_ok());
}

/// Charge periods a bill could hold are read; one longer than its billing period, or far
/// outside it, is refused with its line and column. The real sample's OCI row charged two hours
/// before its billing period is read (`the_focus_projects_real_sample_reads_whole`).
#[test]
fn a_charge_period_far_outside_or_longer_than_its_billing_period_is_refused() {
    let with = |start: &str, end: &str, category: &str| {
        GOOD.replace("2026-05-01T03:00:00Z", start)
            .replace("2026-05-01T04:00:00Z", end)
            .replace(",Usage,", &format!(",{category},"))
    };
    for (start, end, category, column, says) in [
        (
            "1950-01-01T00:00:00Z",
            "9999-12-31T00:00:00Z",
            "Usage",
            "ChargePeriodEnd",
            "longer than its billing period (31 days)",
        ),
        (
            "1950-01-01T00:00:00Z",
            "1950-01-01T01:00:00Z",
            "Usage",
            "ChargePeriodStart",
            "too far outside its billing period 2026-05-01 to 2026-06-01",
        ),
        (
            "9999-01-01T00:00:00Z",
            "9999-01-01T01:00:00Z",
            "Usage",
            "ChargePeriodStart",
            "too far outside",
        ),
        (
            "2026-05-01T00:00:00Z",
            "2026-07-01T00:00:00Z",
            "Usage",
            "ChargePeriodEnd",
            "61 days",
        ),
        (
            "2026-05-01T00:00:00Z",
            "2036-05-01T00:00:00Z",
            "Purchase",
            "ChargePeriodEnd",
            "any commitment's term",
        ),
    ] {
        let row = with(start, end, category);
        match parse(&csv(&[GOOD, &row])).unwrap_err() {
            FocusError::Field {
                line,
                column: c,
                message,
            } => {
                assert_eq!((line, c.as_str()), (3, column), "{start}..{end}: {message}");
                assert!(message.contains(says), "{start}..{end}: {message}");
            }
            other => panic!("{start}..{end}: {other}"),
        }
    }
    for (start, end, category) in [
        // A late row charged before its billing period, a correction of months before, a
        // whole month, and a three-year commitment bought up front.
        ("2026-04-30T22:00:00Z", "2026-04-30T23:00:00Z", "Usage"),
        ("2025-06-01T00:00:00Z", "2025-06-01T01:00:00Z", "Adjustment"),
        ("2026-05-01T00:00:00Z", "2026-06-01T00:00:00Z", "Usage"),
        ("2026-05-10T00:00:00Z", "2029-05-10T00:00:00Z", "Purchase"),
    ] {
        let row = with(start, end, category);
        assert!(parse(&csv(&[&row])).is_ok(), "{start}..{end} {category}");
    }
    let header = format!("{HEADER},BillingPeriodEnd");
    for (billing_end, says) in [
        ("2026-05-01T00:00:00Z", "is not after BillingPeriodStart"),
        ("2099-05-01T00:00:00Z", "no bill covers more than a year"),
    ] {
        let err = parse(&with_header(&header, &[&format!("{GOOD},{billing_end}")])).unwrap_err();
        assert!(
            err.to_string().contains("column BillingPeriodEnd") && err.to_string().contains(says),
            "{err}"
        );
    }
}

/// A row that never ends is refused at its line once it passes the record cap, however well
/// it compresses, without reading the rest into memory; a cell over the cell cap is refused
/// with its line and column.
#[test]
fn an_endless_row_or_an_oversized_cell_is_refused_with_its_place() {
    use std::io::Read;
    let head = format!("{HEADER}\n{GOOD}\n");
    // Never ends: only the cap stops it.
    let endless = std::io::Cursor::new(head.clone().into_bytes()).chain(std::io::repeat(b'a'));
    let err = csv_rows(Box::new(endless), false)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap_err();
    assert_eq!(
        err,
        FocusError::Line {
            line: 3,
            message: "is longer than 1 MiB: no bill's row is; is this a FOCUS export?".into()
        }
    );
    // 64 MiB of one line in a gzip of kilobytes.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, head.as_bytes()).unwrap();
    let block = vec![b'a'; 1 << 20];
    for _ in 0..64 {
        std::io::Write::write_all(&mut gz, &block).unwrap();
    }
    let gz = gz.finish().unwrap();
    assert!(gz.len() < 1 << 20, "{}", gz.len());
    let err = parse(&gz).unwrap_err();
    assert!(matches!(err, FocusError::Line { line: 3, .. }), "{err}");
    // A long row that ends within the cap reads.
    let wide_tags = format!(
        r#""{{""team"":""search"",""note"":""{}""}}""#,
        "x".repeat(60_000)
    );
    let wide = GOOD.replace(r#""{""team"":""search""}""#, &wide_tags);
    assert_eq!(parse(&csv(&[&wide])).unwrap().len(), 1);
    let huge_tags = format!(
        r#""{{""team"":""search"",""note"":""{}""}}""#,
        "x".repeat(70_000)
    );
    let huge = GOOD.replace(r#""{""team"":""search""}""#, &huge_tags);
    match parse(&csv(&[GOOD, &huge])).unwrap_err() {
        FocusError::Field {
            line,
            column,
            message,
        } => {
            assert_eq!((line, column.as_str()), (3, "Tags"));
            assert!(message.contains("at most 64 KiB"), "{message}");
        }
        other => panic!("{other}"),
    }
}
