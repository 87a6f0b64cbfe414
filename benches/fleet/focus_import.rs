//! FOCUS import: a large AWS-style FOCUS 1.2 export, as CSV, CSV.gz and Parquet.

use super::*;

pub(super) const FOCUS_BENCH_HEADER: &str = "AvailabilityZone,BilledCost,BillingAccountId,BillingAccountName,BillingAccountType,BillingCurrency,BillingPeriodEnd,BillingPeriodStart,CapacityReservationId,CapacityReservationStatus,ChargeCategory,ChargeClass,ChargeDescription,ChargeFrequency,ChargePeriodEnd,ChargePeriodStart,CommitmentDiscountCategory,CommitmentDiscountId,CommitmentDiscountName,CommitmentDiscountQuantity,CommitmentDiscountStatus,CommitmentDiscountType,CommitmentDiscountUnit,ConsumedQuantity,ConsumedUnit,ContractedCost,ContractedUnitPrice,EffectiveCost,InvoiceId,InvoiceIssuerName,ListCost,ListUnitPrice,PricingCategory,PricingCurrency,PricingCurrencyContractedUnitPrice,PricingCurrencyEffectiveCost,PricingCurrencyListUnitPrice,PricingQuantity,PricingUnit,ProviderName,PublisherName,RegionId,RegionName,ResourceId,ResourceName,ResourceType,ServiceCategory,ServiceName,ServiceSubcategory,SkuId,SkuMeter,SkuPriceDetails,SkuPriceId,SubAccountId,SubAccountName,SubAccountType,Tags,x_Discounts,x_Operation,x_ServiceCode,x_UsageType";

/// Writes `rows` hourly lines for 2,000 instances from October 2026 on, about a kilobyte each
/// as AWS writes them; returns the exact billed total.
pub(super) fn write_focus_csv(path: &std::path::Path, rows: u64) -> Result<rust_decimal::Decimal> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{FOCUS_BENCH_HEADER}")?;
    let mut total = rust_decimal::Decimal::ZERO;
    let iso = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default()
    };
    for row in 0..rows {
        let instance = row % 2_000;
        let hour = MONTH_START_MS + (row / 2_000) as i64 % MONTH_HOURS * HOUR_MS;
        let cost = rust_decimal::Decimal::new(32_772_600_000 + (row % 997) as i64 * 1_000_003, 9);
        total += cost;
        writeln!(
            out,
            "us-east-1a,{cost},111122223333,acme-payer,Billing Account,USD,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,,,Usage,,\"$32.7726 per On Demand Linux p4d.24xlarge Instance Hour\",Usage-Based,{},{},,,,,,,,1,Hrs,{cost},32.7726,{cost},INV-2026-10,\"Amazon Web Services, Inc.\",{cost},32.7726,Standard,USD,32.7726,{cost},32.7726,1,Hours,AWS,\"Amazon Web Services, Inc.\",us-east-1,US East (N. Virginia),arn:aws:ec2:us-east-1:111122223333:instance/i-{instance:017x},train-{instance},Instance,Compute,Amazon Elastic Compute Cloud,Virtual Machines,SKU{instance:05},Instance Usage,\"{{\"\"InstanceType\"\":\"\"p4d.24xlarge\"\",\"\"OperatingSystem\"\":\"\"Linux\"\"}}\",SKU{instance:05}.JRTCKXETXF.6YS6EN2CT7,222233334444,ml-training,Linked Account,\"{{\"\"user:team\"\":\"\"team-{}\"\",\"\"user:project\"\":\"\"llm\"\"}}\",,RunInstances,AmazonEC2,USE1-BoxUsage:p4d.24xlarge",
            iso(hour + HOUR_MS),
            iso(hour),
            instance % 12,
        )?;
    }
    out.flush()?;
    Ok(total)
}

/// The floor an importer cannot beat: the csv crate reading every record of the file.
pub(super) fn read_csv_rows(path: &std::path::Path) -> Result<u64> {
    let mut reader = csv::Reader::from_path(path)?;
    let mut record = csv::StringRecord::new();
    let mut rows = 0;
    while reader.read_record(&mut record)? {
        rows += 1;
    }
    Ok(rows)
}

pub(super) async fn import(backend: &str, o: &Options) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let csv_path = dir.path().join("focus-2026-10.csv");
    let billed = write_focus_csv(&csv_path, o.import_rows)?;
    let gz_path = dir.path().join("focus-2026-10.csv.gz");
    {
        let mut enc = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz_path)?,
            flate2::Compression::default(),
        );
        std::io::copy(&mut std::fs::File::open(&csv_path)?, &mut enc)?;
        enc.finish()?;
    }
    // Parquet as AWS Data Exports write it, by pyarrow (the venv scripts/setup makes).
    let parquet_path = dir.path().join("focus-2026-10.parquet");
    let converted = Command::new(support::python_tool("python"))
        .args([
            "-c",
            "import sys, pyarrow.csv as c, pyarrow.parquet as p\n\
             t = c.read_csv(sys.argv[1], convert_options=c.ConvertOptions(strings_can_be_null=True))\n\
             p.write_table(t, sys.argv[2], row_group_size=100_000, compression='snappy')",
        ])
        .arg(&csv_path)
        .arg(&parquet_path)
        .output()?;
    if !converted.status.success() {
        bail!(
            "writing the Parquet copy: {}",
            String::from_utf8_lossy(&converted.stderr)
        );
    }
    let mib = |p: &std::path::Path| {
        std::fs::metadata(p).map_or(0.0, |m| m.len() as f64 / (1 << 20) as f64)
    };
    println!(
        "import: a FOCUS 1.2 export of {} rows ({:.0} MiB as CSV, {:.0} MiB gzip, {:.0} MiB Parquet)",
        o.import_rows,
        mib(&csv_path),
        mib(&gz_path),
        mib(&parquet_path)
    );
    let started = Instant::now();
    let read = read_csv_rows(&csv_path)?;
    let floor = read as f64 / started.elapsed().as_secs_f64();
    println!("  csv crate reading the CSV alone:   {floor:>8.0} rows/s");
    for path in [&csv_path, &gz_path, &parquet_path] {
        let db = fresh_db(backend).await?;
        let file = path.to_string_lossy();
        let (usage, wall) = timed_server_run(&db, &["billing", "import-focus", &file]).await?;
        if !usage.success {
            bail!("importing {} failed", path.display());
        }
        // The import's total is per currency and billing period; the export bills one currency.
        let stored: Vec<(String, String)> = {
            let sql = "SELECT currency, billed_total FROM billing_file_periods";
            if db.backend == "postgres" {
                let mut conn = sqlx::PgConnection::connect(&db.url).await?;
                sqlx::query_as(sql).fetch_all(&mut conn).await?
            } else {
                let mut conn = sqlx::SqliteConnection::connect(&db.url).await?;
                sqlx::query_as(sql).fetch_all(&mut conn).await?
            }
        };
        let mut total = rust_decimal::Decimal::ZERO;
        for (currency, amount) in &stored {
            if currency != "USD" {
                bail!(
                    "{}: a total in {currency}, the export bills USD",
                    path.display()
                );
            }
            total += amount.parse::<rust_decimal::Decimal>()?;
        }
        if total != billed {
            bail!("{}: billed total {total} is not {billed}", path.display());
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let rate = o.import_rows as f64 / wall;
        println!(
            "  import-focus {:<24} {rate:>8.0} rows/s ({wall:.1} s wall, {:.1} s CPU), peak RSS {:.0} MiB, ratio to the csv read {:.2}",
            name.unwrap_or_default(),
            usage.cpu_s,
            usage.max_rss_mib,
            rate / floor
        );
    }
    Ok(())
}
