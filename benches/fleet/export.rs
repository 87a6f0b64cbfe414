//! The FOCUS export of a month: rollups as the roll-up job leaves them for billed hosts, and the
//! bill's hourly line for each host.

use super::*;

pub(super) async fn export(backend: &str, gpus: i64) -> Result<()> {
    let db = fresh_db(backend).await?;
    let seeding = Instant::now();
    seed_rollups(&db, gpus, (MONTH_START_MS, MONTH_HOURS)).await?;
    execute(&db, "UPDATE rollup_hours SET estimated = 0", &[]).await?;
    execute(
        &db,
        "UPDATE hosts SET instance_key = 'i-bench-' || id, instance_id = 'i-bench-' || id",
        &[],
    )
    .await?;
    execute(
        &db,
        "INSERT INTO billing_imports (id, source, name, content_sha256, imported_ms, row_count)
         VALUES (1, 'focus', 'bench.csv', 'bench', 0, 0)",
        &[],
    )
    .await?;
    // One hourly line per host: its 8 GPUs' hour, with the columns an AWS export carries.
    let lines = format!(
        "WITH RECURSIVE {s}, {h}
         INSERT INTO cost_lines (import_id, line_no, provider, billing_account_id,
             billing_period_start_ms, charge_period_start_ms, charge_period_end_ms,
             charge_category, resource_id, resource_key, billed_cost, effective_cost, list_cost,
             currency, pricing_category, service_name, sku_id, region, instance_type, tags_json,
             extra_json)
         SELECT 1, s.i * $2 + h.i + 2, 'AWS', '111122223333', $3, $3 + h.i * $4,
             $3 + (h.i + 1) * $4, 'Usage', 'arn:aws:ec2:us-east-1:111122223333:instance/i-bench-' || (s.i + 1),
             'i-bench-' || (s.i + 1), '98.32', '98.32', '98.32', 'USD', 'on_demand',
             'Amazon Elastic Compute Cloud', 'SKU', 'us-east-1', 'p5.48xlarge', '{{\"team\":\"ml\"}}',
             '{{\"BillingAccountName\":\"payer\",\"ChargeDescription\":\"$98.32 per On Demand Linux p5.48xlarge Instance Hour\",\"ChargeFrequency\":\"Usage-Based\",\"ContractedCost\":\"98.32\",\"InvoiceIssuerName\":\"AWS\",\"PricingQuantity\":\"1\",\"PricingUnit\":\"Hours\",\"PublisherName\":\"AWS\",\"ServiceCategory\":\"Compute\",\"SkuPriceId\":\"SKU.JRTCKXETXF\",\"SubAccountId\":\"444455556666\",\"x_UsageType\":\"USE1-BoxUsage:p5.48xlarge\"}}'
         FROM s CROSS JOIN h",
        s = series("s", 1),
        h = series("h", 2),
    );
    execute(
        &db,
        &lines,
        &[(gpus + 7) / 8, MONTH_HOURS, MONTH_START_MS, HOUR_MS],
    )
    .await?;
    execute(&db, "ANALYZE", &[]).await?;
    let bill_lines = count(&db, "SELECT COUNT(*) FROM cost_lines").await?;
    println!(
        "export: a month of {gpus} GPUs, {bill_lines} hourly bill lines (seeded in {:.0} s)",
        seeding.elapsed().as_secs_f64()
    );
    for format in ["focus", "focus-parquet"] {
        // A server of its own for each format, so idle is idle.
        let server = start_server(&db.url, free_port()).await;
        let viewer = signed_in(&server, "viewer").await;
        let pid = server.proc.pid();
        let url = format!(
            "{}/api/v1/allocation?from={MONTH}-01&to=2026-11-01&format={format}",
            server.url
        );
        // A day first, so what is loaded once (code, pools, caches) counts as idle.
        let warm = url.replace("to=2026-11-01", "to=2026-10-02");
        viewer.get(&warm).send().await?.bytes().await?;
        let idle = proc_status_kib(pid, "VmRSS:") as f64 / 1024.0;
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (peak, done) = (peak.clone(), done.clone());
            tokio::spawn(async move {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    peak.fetch_max(
                        proc_status_kib(pid, "VmRSS:"),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        let started = Instant::now();
        let mut resp = viewer.get(&url).send().await?;
        if !resp.status().is_success() {
            bail!("{url}: {}", resp.status());
        }
        let mut bytes = 0usize;
        while let Some(chunk) = resp.chunk().await? {
            bytes += chunk.len();
        }
        let wall = started.elapsed().as_secs_f64();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.await?;
        let peak = peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0;
        println!(
            "  format={format:<14} {:>7.1} MiB in {wall:.1} s; server RSS idle {idle:.0} MiB, peak while exporting {peak:.0} MiB (+{:.0} MiB)",
            bytes as f64 / (1 << 20) as f64,
            peak - idle
        );
    }
    Ok(())
}
