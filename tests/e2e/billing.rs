//! Billing end to end: FOCUS exports from AWS, Azure and GCP import with totals equal to the
//! file's; a fleet whose usage and bill are known by construction is split to the cent by the
//! allocation API, on SQLite and PostgreSQL.

use crate::support;

use gpuledger_server::store;
use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};
use rust_decimal::Decimal;
use serde_json::Value;
use support::*;

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

/// The exact totals of a CSV column, computed independently of the importer.
fn column_total(csv_path: &Path, column: &str) -> Decimal {
    let mut reader = csv::Reader::from_path(csv_path).unwrap();
    let idx = reader
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == column)
        .unwrap();
    reader
        .records()
        .map(|r| {
            let v = r.unwrap()[idx].trim().to_owned();
            if v.is_empty() {
                Decimal::ZERO
            } else {
                Decimal::from_str(&v).unwrap()
            }
        })
        .sum()
}

/// A provider-realistic FOCUS 1.2 export made by focus-data-toolkit; returns the CSV's path.
fn generate_focus(dir: &Path, provider: &str, rows: u32, seed: u64) -> std::path::PathBuf {
    let out = dir.join(provider);
    let gen = std::process::Command::new(python_tool("focus-toolkit"))
        .args(["generate", "--provider", provider, "--focus-version", "1.2"])
        .args(["--rows", &rows.to_string(), "--seed", &seed.to_string()])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        gen.status.success(),
        "{}",
        String::from_utf8_lossy(&gen.stderr)
    );
    std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "csv"))
        .unwrap()
}

async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    let resp = client.get(url).send().await.unwrap();
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
    resp.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn focus_exports_from_three_clouds_import_with_exact_totals() {
    let dir = tempfile::tempdir().unwrap();
    let db = test_support::sqlite();
    let mut files = Vec::new();
    for (i, provider) in ["aws", "azure", "gcp"].iter().enumerate() {
        files.push(generate_focus(dir.path(), provider, 300, 11 + i as u64));
    }
    // One of them gzip-compressed, as AWS Data Exports deliver it.
    let gz = dir.path().join("aws.csv.gz");
    {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz).unwrap(),
            flate2::Compression::default(),
        );
        enc.write_all(&std::fs::read(&files[0]).unwrap()).unwrap();
        enc.finish().unwrap();
    }
    let args: Vec<&str> = ["billing", "import-focus"]
        .into_iter()
        .chain([
            gz.to_str().unwrap(),
            files[1].to_str().unwrap(),
            files[2].to_str().unwrap(),
        ])
        .collect();
    let run = server_cmd(&db.url).args(&args).output().unwrap();
    assert!(run.status.success());
    let out = String::from_utf8_lossy(&run.stdout);
    assert_eq!(out.matches("imported 300 rows").count(), 3, "{out}");
    // Not a terminal: progress as plain lines on stderr, each file as it begins, then a summary.
    let said = String::from_utf8_lossy(&run.stderr);
    let f1 = files[1].file_name().unwrap().to_string_lossy();
    assert!(
        said.contains("billing import: aws.csv.gz (0 rows so far)"),
        "{said}"
    );
    assert!(
        said.contains(&format!("billing import: {f1} (300 rows so far)")),
        "{said}"
    );
    assert!(
        said.contains("billing import: 3 file(s) imported (900 rows), 0 unchanged ("),
        "{said}"
    );

    let server = start_server(&db.url, free_port()).await;
    let viewer = signed_in(&server, "viewer").await;
    let imports = get_json(&viewer, &format!("{}/api/v1/billing/imports", server.url)).await;
    let imports = imports.as_array().unwrap();
    assert_eq!(imports.len(), 3);
    for (import, file) in imports.iter().zip(&files) {
        // One currency a file here: one total, named by its currency.
        let totals = import["totals"].as_array().unwrap();
        assert_eq!(totals.len(), 1, "{import}");
        assert_eq!(totals[0]["currency"], "USD", "{import}");
        assert_eq!(totals[0]["rows"], 300, "{import}");
        assert_eq!(
            d(totals[0]["billed_total"].as_str().unwrap()),
            column_total(file, "BilledCost"),
            "{}",
            file.display()
        );
        assert_eq!(
            d(totals[0]["effective_total"].as_str().unwrap()),
            column_total(file, "EffectiveCost"),
            "{}",
            file.display()
        );
        assert_eq!(import["current_rows"], 300);
    }

    // The same file again changes nothing.
    let again = server_run(
        &db.url,
        &["billing", "import-focus", files[1].to_str().unwrap()],
    );
    assert!(again.contains("already imported"), "{again}");
    let imports = get_json(&viewer, &format!("{}/api/v1/billing/imports", server.url)).await;
    assert_eq!(imports.as_array().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_export_is_refused_whole_with_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let db = test_support::sqlite();
    let path = dir.path().join("bad.csv");
    std::fs::write(
        &path,
        format!(
            "{HEADER}\n{}\n{}\n",
            bill_row("i-0aaa", 0, "1.00"),
            bill_row("i-0aaa", 1, "1,00")
        ),
    )
    .unwrap();
    let out = server_cmd(&db.url)
        .args(["billing", "import-focus"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3, column BilledCost"), "{err}");
    assert!(err.contains("nothing of it was stored"), "{err}");
    let store = db.open().await;
    assert!(store::bills::billing_imports(store.db())
        .await
        .unwrap()
        .is_empty());
}

const HEADER: &str = "BillingAccountId,BillingPeriodStart,ChargePeriodStart,ChargePeriodEnd,ChargeCategory,BilledCost,EffectiveCost,ListCost,BillingCurrency,PricingCategory,ProviderName,ServiceName,ResourceId,RegionId,SkuPriceDetails,Tags";

fn hour_start() -> i64 {
    let now = gpuledger_server::clock::now_ms();
    now - now % 3_600_000 - 2 * 3_600_000
}

fn iso(ms: i64) -> String {
    gpuledger_core::time::rfc3339(ms)
}

fn bill_row(instance: &str, hour_offset: i64, cost: &str) -> String {
    let start = hour_start() + hour_offset * 3_600_000;
    let month = gpuledger_core::time::month_start_ms(start);
    format!(
        "1111,{},{},{},Usage,\"{cost}\",\"{cost}\",\"{cost}\",USD,Standard,AWS,AmazonEC2,arn:aws:ec2:us-east-1:1111:instance/{instance},us-east-1,\"{{\"\"InstanceType\"\":\"\"p4d.24xlarge\"\"}}\",{{}}",
        iso(month),
        iso(start),
        iso(start + 3_600_000)
    )
}

fn process(pid: u32, labels: &[(&str, &str)], mem_gib: u64, sm: f64) -> ProcessWindow {
    ProcessWindow {
        pid,
        name: Some("python3".into()),
        memory_used_max_bytes: Some(mem_gib << 30),
        sm_util_avg: Some(sm),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

/// Four 15-minute windows over one hour: GPU 0 runs two models (60% and 20% SM), GPU 1 holds a
/// notebook at 0% for the first half hour and nothing after.
fn known_reports() -> Vec<Report> {
    let h = hour_start();
    (0..4)
        .map(|q| {
            let start = h + q * 900_000;
            let gpu = |uuid: &str, util: f64, processes: Vec<ProcessWindow>| GpuWindow {
                uuid: uuid.into(),
                index: 0,
                name: "NVIDIA A100-SXM4-40GB".into(),
                memory_total_bytes: Some(40 << 30),
                memory_used_max_bytes: Some(20 << 30),
                util_avg: Some(util),
                util_max: Some(util),
                processes,
                ..Default::default()
            };
            let notebook = if q < 2 {
                vec![process(
                    3,
                    &[("team", "research"), ("experiment", "notebook")],
                    10,
                    0.0,
                )]
            } else {
                vec![]
            };
            Report {
                batch_id: format!("known-{q}"),
                agent_version: "test".into(),
                host: HostInfo {
                    hostname: "gpu-a".into(),
                    cluster: "train".into(),
                    provider: Some("aws".into()),
                    instance_id: Some("i-0aaa".into()),
                    instance_type: Some("p4d.24xlarge".into()),
                    region: Some("us-east-1".into()),
                    lifecycle: None,
                },
                windows: vec![Window {
                    serving: Vec::new(),
                    start_ms: start,
                    end_ms: start + 900_000,
                    samples: 900,
                    gpus: vec![
                        gpu(
                            "GPU-known-0",
                            80.0,
                            vec![
                                process(1, &[("model", "llama-70b"), ("team", "search")], 15, 60.0),
                                process(2, &[("model", "mistral-7b"), ("team", "chat")], 5, 20.0),
                            ],
                        ),
                        gpu("GPU-known-1", 0.0, notebook),
                    ],
                }],
            }
        })
        .collect()
}

fn rows_by_key(body: &Value) -> BTreeMap<String, Value> {
    body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["key"].as_str().unwrap().to_owned(), r.clone()))
        .collect()
}

async fn split_to_the_cent(db: TestDb) {
    let label = db.backend;
    let dir = tempfile::tempdir().unwrap();
    let token = create_token(&db.url, "agent", "train");
    let server = start_server(&db.url, free_port()).await;
    let viewer = signed_in(&server, "viewer").await;
    let client = viewer.clone();
    for r in known_reports() {
        let resp = client
            .post(format!("{}/api/v1/reports", server.url))
            .bearer_auth(&token)
            .json(&r)
            .send()
            .await
            .unwrap();
        assert!(
            resp.status().is_success(),
            "{label}: {}",
            resp.text().await.unwrap()
        );
    }
    // The hour's bill for the instance, plus an S3 line that is no GPU host.
    let bill = dir.path().join("bill.csv");
    let s3 = bill_row("i-0aaa", 0, "5.00")
        .replace(
            "arn:aws:ec2:us-east-1:1111:instance/i-0aaa",
            "arn:aws:s3:::datasets",
        )
        .replace("AmazonEC2", "AmazonS3")
        // A bucket has no instance type.
        .replace(
            r#""InstanceType"":""p4d.24xlarge""#,
            r#""bucket"":""datasets""#,
        );
    // And a GPU instance no agent reports.
    std::fs::write(
        &bill,
        format!(
            "{HEADER}\n{}\n{s3}\n{}\n",
            bill_row("i-0aaa", 0, "32.7726"),
            bill_row("i-0ccc", 0, "30.00")
        ),
    )
    .unwrap();
    server_run(
        &db.url,
        &["billing", "import-focus", bill.to_str().unwrap()],
    );
    // What the server does every minute, now: pages and the API read the rollups.
    server_run(&db.url, &["rollup"]);

    let h = hour_start();
    let q = format!("from={}&to={}", iso(h), iso(h + 3_600_000));
    let by_model = get_json(
        &viewer,
        &format!("{}/api/v1/allocation?{q}&by=model&step=hour", server.url),
    )
    .await;
    let rows = rows_by_key(&by_model);
    // GPU 0 carries half the bill, split 3:1 by SM utilization; GPU 1's half is half held idle
    // by the notebook and half idle.
    assert_eq!(
        d(rows["llama-70b"]["cost"].as_str().unwrap()),
        d("12.289725"),
        "{label}: {by_model}"
    );
    assert_eq!(
        d(rows["mistral-7b"]["cost"].as_str().unwrap()),
        d("4.096575"),
        "{label}"
    );
    assert_eq!(
        d(rows["(unlabeled)"]["held_idle_cost"].as_str().unwrap()),
        d("8.19315"),
        "{label}"
    );
    assert_eq!(
        d(rows["(idle)"]["idle_cost"].as_str().unwrap()),
        d("8.19315"),
        "{label}"
    );
    // The GPU instance no agent reports is in the ledger on a host known from the bill:
    // unmonitored, nobody's by model.
    assert_eq!(
        d(rows["(unmonitored)"]["unmonitored_cost"].as_str().unwrap()),
        d("30"),
        "{label}: {by_model}"
    );
    let sum: Decimal = rows.values().map(|r| d(r["cost"].as_str().unwrap())).sum();
    assert_eq!(
        sum,
        d("62.7726"),
        "{label}: the parts sum to the GPU lines of the bill exactly"
    );
    assert!((rows["llama-70b"]["gpu_hours"].as_f64().unwrap() - 0.75).abs() < 1e-9);
    assert_eq!(rows["llama-70b"]["avg_util"].as_f64(), Some(80.0));
    assert_eq!(rows["llama-70b"]["estimated"], false);
    let totals = &by_model["totals"][0];
    assert_eq!(d(totals["cost"].as_str().unwrap()), d("62.7726"));
    assert_eq!(
        d(totals["unattributed_cost"].as_str().unwrap()),
        d("5"),
        "{label}: the S3 line counts, unattributed"
    );

    // The month's reconciliation: every dollar of the bill, where the ledger puts it.
    let month = chrono::DateTime::from_timestamp_millis(h)
        .unwrap()
        .format("%Y-%m")
        .to_string();
    let rec = get_json(
        &viewer,
        &format!("{}/api/v1/billing/reconciliation?month={month}", server.url),
    )
    .await;
    let usd = &rec["currencies"][0];
    assert_eq!(usd["currency"], "USD", "{label}: {rec}");
    let dec = |v: &Value| d(v.as_str().unwrap());
    assert_eq!(dec(&usd["bill"]), d("67.7726"), "{label}: {rec}");
    assert_eq!(dec(&usd["bill_on_known_hosts"]), d("62.7726"), "{label}");
    assert_eq!(dec(&usd["attributed"]["used"]), d("16.3863"), "{label}");
    assert_eq!(
        dec(&usd["attributed"]["held_idle"]),
        d("8.19315"),
        "{label}"
    );
    assert_eq!(dec(&usd["attributed"]["idle"]), d("8.19315"), "{label}");
    assert_eq!(dec(&usd["attributed"]["unmonitored"]), d("30"), "{label}");
    assert_eq!(
        dec(&usd["estimated"]["used"]),
        d("0"),
        "{label}: all of it billed"
    );
    let no_agent = usd["gpu_without_agent"].as_array().unwrap();
    assert_eq!(no_agent.len(), 1, "{label}: {rec}");
    assert_eq!(no_agent[0]["resource"], "i-0ccc", "{label}");
    assert_eq!(no_agent[0]["instance_type"], "p4d.24xlarge", "{label}");
    assert_eq!(dec(&no_agent[0]["cost"]), d("30"), "{label}");
    assert_eq!(no_agent[0]["in_ledger"], true, "{label}");
    let not_gpu = usd["not_gpu"].as_array().unwrap();
    assert_eq!(not_gpu.len(), 1, "{label}: {rec}");
    assert_eq!(dec(&not_gpu[0]["cost"]), d("5"), "{label}");
    assert_eq!(dec(&usd["ledger_unattributed"]), d("5"), "{label}");
    assert_eq!(dec(&usd["difference"]), d("0"), "{label}: to the cent");
    let page = client
        .get(format!("{}/billing/{month}", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("✓ to the cent"), "{label}: {page}");
    assert!(
        page.contains("$67.77") && page.contains("i-0ccc"),
        "{label}"
    );
    let bad = client
        .get(format!(
            "{}/api/v1/billing/reconciliation?month=2026-13",
            server.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST, "{label}");
    let body: Value = bad.json().await.unwrap();
    assert_eq!(body["field"], "month", "{label}: {body}");

    let by_team = rows_by_key(
        &get_json(
            &viewer,
            &format!("{}/api/v1/allocation?{q}&by=team&step=day", server.url),
        )
        .await,
    );
    assert_eq!(
        d(by_team["research"]["held_idle_cost"].as_str().unwrap()),
        d("8.19315"),
        "{label}"
    );
    assert_eq!(
        d(by_team["search"]["cost"].as_str().unwrap()),
        d("12.289725")
    );
    let by_pricing = rows_by_key(
        &get_json(
            &viewer,
            &format!("{}/api/v1/allocation?{q}&by=pricing_category", server.url),
        )
        .await,
    );
    assert_eq!(
        d(by_pricing["on_demand"]["cost"].as_str().unwrap()),
        d("62.7726")
    );

    let csv_text = client
        .get(format!(
            "{}/api/v1/allocation?{q}&by=model&format=csv",
            server.url
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        csv_text.starts_with("period_start,key,currency,cost"),
        "{csv_text}"
    );
    assert!(csv_text.contains("llama-70b,USD,12.289725"), "{csv_text}");

    let focus = client
        .get(format!("{}/api/v1/allocation?{q}&format=focus", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut reader = csv::Reader::from_reader(focus.as_bytes());
    let headers = reader.headers().unwrap().clone();
    for col in [
        "AllocatedMethodId",
        "AllocatedResourceId",
        "AllocatedTags",
        "EffectiveCost",
        "ChargePeriodStart",
    ] {
        assert!(headers.iter().any(|h| h == col), "{col}");
    }
    let cost_idx = headers.iter().position(|h| h == "EffectiveCost").unwrap();
    let method_idx = headers
        .iter()
        .position(|h| h == "AllocatedMethodId")
        .unwrap();
    let (mut focus_sum, mut split_sum) = (Decimal::ZERO, Decimal::ZERO);
    for r in reader.records() {
        let r = r.unwrap();
        focus_sum += d(&r[cost_idx]);
        if !r[method_idx].is_empty() {
            split_sum += d(&r[cost_idx]);
        }
    }
    assert_eq!(
        focus_sum,
        d("67.7726"),
        "{label}: the FOCUS export sums to the bill, the S3 line included"
    );
    assert_eq!(
        split_sum,
        d("62.7726"),
        "{label}: the GPU hosts' lines are the ones split, the one no agent reports included"
    );

    // Filtered to one team, the export carries that team's rows only, each line-hour split over
    // everybody's parts as unfiltered: its rows add up to the team's allocation, to the digit,
    // never to the whole host's hour.
    let by_team_all = rows_by_key(
        &get_json(
            &viewer,
            &format!("{}/api/v1/allocation?{q}&by=team", server.url),
        )
        .await,
    );
    for (team, row) in &by_team_all {
        let focus = client
            .get(format!("{}/api/v1/allocation?{q}&format=focus", server.url))
            .query(&[("team", team)])
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let mut reader = csv::Reader::from_reader(focus.as_bytes());
        let sum: Decimal = reader.records().map(|r| d(&r.unwrap()[cost_idx])).sum();
        assert_eq!(
            sum,
            d(row["cost"].as_str().unwrap()),
            "{label}: team {team}'s FOCUS rows"
        );
    }

    // A read-only token scoped to one team gets that team's figures and nothing else: its
    // allocation is the team's row to the digit, its FOCUS export the team's rows alone, and
    // any team filter it asks for beyond its own is empty.
    let mut scoped_teams = 0;
    for (i, (team, row)) in by_team_all.iter().enumerate() {
        if team.starts_with('(') {
            continue; // idle and unmonitored belong to no team here
        }
        scoped_teams += 1;
        let secret = server_run(
            &db.url,
            &["read-token", "create", &format!("bi-{i}"), "--teams", team],
        )
        .trim()
        .to_owned();
        // No session cookie: the token alone says who is asking.
        let bare = reqwest::Client::new();
        let scoped = |url: String| bare.get(url).bearer_auth(&secret).send();
        let body: Value = scoped(format!("{}/api/v1/allocation?{q}&by=team", server.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let seen = rows_by_key(&body);
        assert_eq!(
            seen.keys().collect::<Vec<_>>(),
            vec![team],
            "{label}: a token of team {team} sees its team only"
        );
        assert_eq!(seen[team]["cost"], row["cost"], "{label}: {team}");
        let focus = scoped(format!("{}/api/v1/allocation?{q}&format=focus", server.url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let mut reader = csv::Reader::from_reader(focus.as_bytes());
        let columns = reader.headers().unwrap().clone();
        let at = |name: &str| columns.iter().position(|h| h == name).unwrap();
        let (details_idx, tags_idx) = (at("AllocatedMethodDetails"), at("Tags"));
        let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        // On a GPU shared with another team (search and chat share one), a row keeps neither
        // the line's tags nor its ratio to the whole line: both would tell of the other team.
        let shared = records.iter().filter(|r| r[details_idx].is_empty()).count();
        assert!(
            records
                .iter()
                .all(|r| !r[details_idx].is_empty() || r[tags_idx].is_empty()),
            "{label}: {team}"
        );
        if matches!(team.as_str(), "search" | "chat") {
            assert!(shared > 0, "{label}: {team} shares its GPU");
        }
        let sum: Decimal = records.iter().map(|r| d(&r[cost_idx])).sum();
        assert_eq!(
            sum,
            d(row["cost"].as_str().unwrap()),
            "{label}: team {team}'s scoped FOCUS export"
        );
        let others = scoped(format!(
            "{}/api/v1/allocation?{q}&by=team&team=%28idle%29",
            server.url
        ))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
        assert!(others.contains("\"rows\":[]"), "{label}: {others}");
        let fleet = scoped(format!("{}/api/v1/billing/reconciliation", server.url))
            .await
            .unwrap();
        assert_eq!(
            fleet.status(),
            403,
            "{label}: the whole bill is every team's"
        );
    }
    assert!(scoped_teams >= 2, "{label}: {by_team_all:?}");

    // A bad parameter is named.
    let resp = client
        .get(format!(
            "{}/api/v1/allocation?{q}&by=model&step=fortnight",
            server.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["field"], "step");
}

#[tokio::test(flavor = "multi_thread")]
async fn known_fleet_splits_to_the_cent_sqlite() {
    split_to_the_cent(test_support::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn known_fleet_splits_to_the_cent_postgres() {
    split_to_the_cent(test_support::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hosts_without_a_bill_get_rate_card_estimates() {
    let db = test_support::sqlite();
    let token = create_token(&db.url, "agent", "train");
    let server = start_server(&db.url, free_port()).await;
    let viewer = signed_in(&server, "viewer").await;
    let client = viewer.clone();
    for r in known_reports() {
        client
            .post(format!("{}/api/v1/reports", server.url))
            .bearer_auth(&token)
            .json(&r)
            .send()
            .await
            .unwrap();
    }
    server_run(&db.url, &["rollup"]);
    let h = hour_start();
    let body = get_json(
        &viewer,
        &format!(
            "{}/api/v1/allocation?from={}&to={}&by=host",
            server.url,
            iso(h),
            iso(h + 3_600_000)
        ),
    )
    .await;
    let rows = rows_by_key(&body);
    assert_eq!(
        d(rows["gpu-a"]["cost"].as_str().unwrap()),
        d("32.7726"),
        "p4d.24xlarge on-demand for the full hour"
    );
    assert_eq!(rows["gpu-a"]["estimated"], true);
}

/// A FOCUS export written as Parquet (Snappy, doubles, UTC timestamps, Tags as a map) imports
/// with totals equal to the Parquet's own values.
#[tokio::test(flavor = "multi_thread")]
async fn a_parquet_export_imports_with_exact_totals() {
    let dir = tempfile::tempdir().unwrap();
    let csv = generate_focus(dir.path(), "aws", 250, 5);
    let parquet = dir.path().join("focus.parquet");
    let conv = std::process::Command::new(python_tool("python"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/tools/focus_to_parquet.py"
        ))
        .arg(&csv)
        .arg(&parquet)
        .output()
        .unwrap();
    assert!(
        conv.status.success(),
        "{}",
        String::from_utf8_lossy(&conv.stderr)
    );
    let expected: Value = serde_json::from_slice(&conv.stdout).unwrap();
    let types = &expected["types"];
    assert!(
        types["ChargePeriodStart"]
            .as_str()
            .unwrap()
            .starts_with("timestamp["),
        "{expected}"
    );
    assert!(
        types["Tags"]
            .as_str()
            .unwrap()
            .starts_with("map<string, string"),
        "{expected}"
    );
    assert_eq!(types["BilledCost"], "double", "{expected}");

    let db = test_support::sqlite();
    let printed = server_run(
        &db.url,
        &["billing", "import-focus", parquet.to_str().unwrap()],
    );
    assert!(printed.contains("imported 250 rows"), "{printed}");
    let store = db.open().await;
    let imports = store::bills::billing_imports(store.db()).await.unwrap();
    let [(_, totals)]: [_; 1] = imports[0]
        .totals
        .clone()
        .into_iter()
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    assert_eq!(totals.billed, d(expected["billed"].as_str().unwrap()));
    assert_eq!(totals.effective, d(expected["effective"].as_str().unwrap()));
    // The same rows as the CSV: dates and tags survive the format.
    let from_csv =
        gpuledger_server::billing::focus_file::parse(&std::fs::read(&csv).unwrap()).unwrap();
    let from_parquet =
        gpuledger_server::billing::focus_file::parse(&std::fs::read(&parquet).unwrap()).unwrap();
    assert_eq!(from_csv.len(), from_parquet.len());
    for (a, b) in from_csv.iter().zip(&from_parquet) {
        assert_eq!(
            (a.charge_period_start_ms, a.charge_period_end_ms),
            (b.charge_period_start_ms, b.charge_period_end_ms)
        );
        assert_eq!(a.resource_key, b.resource_key);
        assert_eq!(a.pricing_category, b.pricing_category);
        let (ta, tb): (Value, Value) = (
            serde_json::from_str(&a.tags_json).unwrap(),
            serde_json::from_str(&b.tags_json).unwrap(),
        );
        assert_eq!(
            ta.as_object().map(|o| o.len()),
            tb.as_object().map(|o| o.len()),
            "tags: {ta} vs {tb}"
        );
    }
}

/// A period delivered as an AWS Data Exports run: two gzip parts and a manifest, laid out as
/// `aws s3 sync` leaves them. The run imports whole; a later run with one file replaces both
/// parts; plain files add parts or replace their namesake; a run with a broken part changes
/// nothing.
#[tokio::test(flavor = "multi_thread")]
async fn an_export_run_with_a_manifest_replaces_its_period_as_a_whole() {
    use std::io::Write;
    let root = tempfile::tempdir().unwrap();
    let db = test_support::sqlite();
    let write_run = |run: &str, parts: &[&[String]]| {
        let export = root.path().join(run).join("gpu-focus");
        let data = export.join("data/BILLING_PERIOD=2026-05");
        let meta = export.join("metadata/BILLING_PERIOD=2026-05");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&meta).unwrap();
        let mut uris = Vec::new();
        for (i, rows) in parts.iter().enumerate() {
            let name = format!("gpu-focus-{:05}.csv.gz", i + 1);
            let mut enc = flate2::write::GzEncoder::new(
                std::fs::File::create(data.join(&name)).unwrap(),
                flate2::Compression::fast(),
            );
            writeln!(enc, "{HEADER}").unwrap();
            for r in rows.iter() {
                writeln!(enc, "{r}").unwrap();
            }
            enc.finish().unwrap();
            uris.push(format!(
                "\"s3://billing-bucket/exports/gpu-focus/data/BILLING_PERIOD=2026-05/{name}\""
            ));
        }
        let manifest = meta.join("gpu-focus-Manifest.json");
        std::fs::write(
            &manifest,
            format!(
                "{{\"executionId\":\"{run}\",\"dataFiles\":[{}],\"columns\":[]}}",
                uris.join(",")
            ),
        )
        .unwrap();
        manifest
    };
    let run1 = write_run(
        "run-1",
        &[
            &[bill_row("i-0aaa", 0, "10"), bill_row("i-0aaa", 1, "20")],
            &[bill_row("i-0bbb", 0, "5")],
        ],
    );
    let out = server_run(
        &db.url,
        &[
            "billing",
            "import-focus",
            "--manifest",
            run1.to_str().unwrap(),
        ],
    );
    assert_eq!(out.matches("imported").count(), 2, "{out}");
    let store = db.open().await;
    let in_force = |store: std::sync::Arc<dyn gpuledger_server::store::Store>| async move {
        let mut costs: Vec<String> = store::bills::cost_lines(store.db(), 0, i64::MAX / 2)
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.effective_cost.to_string())
            .collect();
        costs.sort();
        costs
    };
    assert_eq!(in_force(store.clone()).await, ["10", "20", "5"]);

    // A run with a broken second part: refused, naming the part, and nothing changes.
    let broken = write_run(
        "run-2",
        &[
            &[bill_row("i-0aaa", 0, "11")],
            &[bill_row("i-0bbb", 0, "x")],
        ],
    );
    let out = server_cmd(&db.url)
        .args(["billing", "import-focus", "--manifest"])
        .arg(&broken)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gpu-focus-00002.csv.gz: line 2, column BilledCost"),
        "{err}"
    );
    assert!(
        err.contains("none of the files given together was imported"),
        "{err}"
    );
    assert_eq!(in_force(store.clone()).await, ["10", "20", "5"]);

    // The corrected run, now one file: it replaces both parts of May.
    let run3 = write_run("run-3", &[&[bill_row("i-0aaa", 0, "31")]]);
    let out = server_run(
        &db.url,
        &[
            "billing",
            "import-focus",
            "--manifest",
            run3.to_str().unwrap(),
        ],
    );
    assert!(out.contains("replaced 3 older rows"), "{out}");
    assert_eq!(in_force(store.clone()).await, ["31"]);
    let periods = store::bills::billing_file_periods(store.db())
        .await
        .unwrap();
    let live: Vec<_> = periods.iter().filter(|p| p.replaced_ms.is_none()).collect();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].delivery.as_deref(), Some("run-3"));

    // Plain files: a new name adds a part; the same name again replaces that part only.
    let dir = root.path().join("plain");
    std::fs::create_dir_all(&dir).unwrap();
    let extra = dir.join("credits.csv");
    std::fs::write(
        &extra,
        format!("{HEADER}\n{}\n", bill_row("i-0ccc", 0, "-2")),
    )
    .unwrap();
    server_run(
        &db.url,
        &["billing", "import-focus", extra.to_str().unwrap()],
    );
    assert_eq!(in_force(store.clone()).await, ["-2", "31"]);
    std::fs::write(
        &extra,
        format!("{HEADER}\n{}\n", bill_row("i-0ccc", 0, "-3")),
    )
    .unwrap();
    let out = server_run(
        &db.url,
        &["billing", "import-focus", extra.to_str().unwrap()],
    );
    assert!(out.contains("replaced 1 older rows"), "{out}");
    assert_eq!(in_force(store.clone()).await, ["-3", "31"]);
}

/// The demo fleet's previous month (a month of rollups and a full FOCUS 1.2 bill), exported as
/// FOCUS CSV and Parquet by the real server: the FinOps Foundation's validator passes both
/// (scripts/focus-validate), every bill line's rows add up to it exactly, and the export's
/// totals are the bill's over the month. On SQLite and PostgreSQL.
async fn focus_export_passes_the_validator(db: TestDb) {
    let store = db.open().await;
    let card = gpuledger_core::ratecard::RateCard::default_card();
    let now = gpuledger_server::clock::now_ms();
    gpuledger_server::demo::seed(store.as_ref(), &card, &Default::default(), now)
        .await
        .unwrap();
    let this_month = gpuledger_core::time::month_start_ms(now);
    let last_month = gpuledger_core::time::month_start_ms(this_month - 1);
    let server = start_server(&db.url, free_port()).await;
    let viewer = signed_in(&server, "viewer").await;
    let dir = tempfile::tempdir().unwrap();
    let (from, to) = (iso(last_month), iso(this_month));
    let mut files = Vec::new();
    for (format, name) in [("focus", "month.csv"), ("focus-parquet", "month.parquet")] {
        let url = format!(
            "{}/api/v1/allocation?from={from}&to={to}&format={format}",
            server.url
        );
        let resp = viewer.get(&url).send().await.unwrap();
        assert!(resp.status().is_success(), "{url}: {}", resp.status());
        let path = dir.path().join(name);
        std::fs::write(&path, resp.bytes().await.unwrap()).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = std::process::Command::new(root.join("scripts/focus-validate"))
            .arg(&path)
            .arg(root.join("../shared/focus-samples/allocated_method_details.schema.json"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {name}: {text}{}",
            db.backend,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("0 errored"), "{}: {text}", db.backend);
        assert!(
            text.contains("split rows checked"),
            "{}: {text}",
            db.backend
        );
        files.push(path);
    }

    // The Parquet holds exactly the CSV's rows, read back by the importer: every amount, time,
    // id and tag. GPU-hours are a double there (`1` where the CSV writes `1.000000`).
    let read = |p: &Path| {
        let mut lines =
            gpuledger_server::billing::focus_file::parse(&std::fs::read(p).unwrap()).unwrap();
        for l in &mut lines {
            let mut extra: serde_json::Map<String, Value> =
                serde_json::from_str(&l.extra_json).unwrap();
            if let Some(Value::String(h)) = extra.get_mut("x_GpuHours") {
                *h = format!("{:.6}", h.parse::<f64>().unwrap());
            }
            l.extra_json = Value::Object(extra).to_string();
        }
        lines
    };
    let (from_csv, from_parquet) = (read(&files[0]), read(&files[1]));
    assert!(from_csv.len() > 1000, "{}: {}", db.backend, from_csv.len());
    assert_eq!(from_csv.len(), from_parquet.len(), "{}", db.backend);
    if let Some((i, (a, b))) = from_csv
        .iter()
        .zip(&from_parquet)
        .enumerate()
        .find(|(_, (a, b))| a != b)
    {
        panic!("{}: row {i}: CSV {a:?}\nParquet {b:?}", db.backend);
    }

    // The CSV adds up to the bill over the month, and a split line's rows to the line.
    let mut reader = csv::Reader::from_path(&files[0]).unwrap();
    let headers = reader.headers().unwrap().clone();
    let col = |n: &str| headers.iter().position(|h| h == n).unwrap();
    let (billed, effective, method) = (
        col("BilledCost"),
        col("EffectiveCost"),
        col("AllocatedMethodId"),
    );
    let (resource, start) = (col("ResourceId"), col("ChargePeriodStart"));
    let mut totals = (Decimal::ZERO, Decimal::ZERO);
    let mut split_rows = 0;
    let mut by_line_hour: BTreeMap<(String, String), Decimal> = BTreeMap::new();
    for r in reader.records() {
        let r = r.unwrap();
        totals.0 += d(&r[billed]);
        totals.1 += d(&r[effective]);
        if !r[method].is_empty() {
            split_rows += 1;
            *by_line_hour
                .entry((r[resource].to_owned(), r[start].to_owned()))
                .or_default() += d(&r[effective]);
        }
    }
    let lines = store::bills::bill_lines(store.db(), last_month, this_month)
        .await
        .unwrap();
    let bill_effective: Decimal = lines
        .iter()
        .map(|l| {
            let e = d(&l.effective_cost);
            let (s, end) = (l.charge_period_start_ms, l.charge_period_end_ms);
            // Only the part of the month (the demo's lines are inside it).
            assert!(s >= last_month && end <= this_month, "{}", db.backend);
            e
        })
        .sum();
    let bill_billed: Decimal = lines.iter().map(|l| d(&l.billed_cost)).sum();
    assert_eq!(totals, (bill_billed, bill_effective), "{}", db.backend);
    assert!(
        split_rows > lines.len(),
        "{}: GPU lines are split",
        db.backend
    );
    // Every hourly GPU line is split into rows that add up to it exactly, the dev box's that no
    // agent reports included (all of it unmonitored, on its host known from the bill).
    let mut forgotten = 0;
    for l in lines.iter().filter(|l| {
        l.charge_period_end_ms - l.charge_period_start_ms == 3_600_000
            && l.service_name.as_deref() == Some("Amazon Elastic Compute Cloud")
    }) {
        let key = (
            l.resource_id.clone().unwrap_or_default(),
            iso(l.charge_period_start_ms),
        );
        let sum = by_line_hour
            .get(&key)
            .unwrap_or_else(|| panic!("{}: {key:?} is not split", db.backend));
        assert_eq!(*sum, d(&l.effective_cost), "{}: {key:?}", db.backend);
        if key.0.ends_with(gpuledger_server::demo::FORGOTTEN_INSTANCE) {
            forgotten += 1;
        }
    }
    assert!(forgotten >= 28 * 24, "{}: {forgotten}", db.backend);
}

#[tokio::test(flavor = "multi_thread")]
async fn focus_export_passes_the_validator_sqlite() {
    focus_export_passes_the_validator(test_support::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn focus_export_passes_the_validator_postgres() {
    focus_export_passes_the_validator(test_support::postgres().await).await;
}

/// `rollup --from/--to` into a closed month is refused without `--reopen` and changes nothing;
/// with a reason it restates the month and prints the figures before and after (the real
/// binary, on SQLite).
#[tokio::test(flavor = "multi_thread")]
async fn rollup_into_a_closed_month_needs_reopen() {
    let db = test_support::sqlite();
    let store = db.open().await;
    let now = gpuledger_server::clock::now_ms();
    let this = gpuledger_core::time::month_start_ms(now);
    // Two months back is closed whatever today's date.
    let old =
        gpuledger_core::time::month_start_ms(gpuledger_core::time::month_start_ms(this - 1) - 1);
    store::tokens::create_token(
        store.db(),
        &gpuledger_server::store::tokens::NewToken::for_cluster("t", "h", "train"),
        now,
    )
    .await
    .unwrap();
    let token = store::tokens::active_token(store.db(), "h", now)
        .await
        .unwrap()
        .unwrap()
        .id;
    let report = Report {
        batch_id: "old-1".into(),
        agent_version: "test".into(),
        host: HostInfo {
            hostname: "gpu-1".into(),
            cluster: "train".into(),
            instance_type: Some("p4d.24xlarge".into()),
            ..Default::default()
        },
        windows: vec![Window {
            serving: Vec::new(),
            start_ms: old + 3_600_000,
            end_ms: old + 7_200_000,
            samples: 3600,
            gpus: vec![GpuWindow {
                uuid: "GPU-1".into(),
                name: "NVIDIA A100-SXM4-40GB".into(),
                util_avg: Some(90.0),
                util_max: Some(95.0),
                processes: vec![ProcessWindow {
                    pid: 1,
                    sm_util_avg: Some(90.0),
                    labels: BTreeMap::from([("team".to_owned(), "search".to_owned())]),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }],
    };
    store
        .ingest(&report, token, Default::default(), now)
        .await
        .unwrap();
    let day = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .format("%Y-%m-%d")
            .to_string()
    };
    let next = gpuledger_core::time::next_month_start(old);
    let rollup = |extra: &[&str]| {
        let mut args = vec!["rollup", "--from", &day(old), "--to", &day(next)]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        server_cmd(&db.url).args(&args).output().unwrap()
    };
    let refused = rollup(&[]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("closed") && why.contains("--reopen"), "{why}");
    assert!(store::closing::restatements(store.db(), old)
        .await
        .unwrap()
        .is_empty());

    let restated = rollup(&["--reopen", "rate card corrected"]);
    let out = String::from_utf8_lossy(&restated.stdout);
    assert!(
        restated.status.success(),
        "{}",
        String::from_utf8_lossy(&restated.stderr)
    );
    assert!(out.contains("restated") && out.contains("search"), "{out}");
    // Progress on stderr: the hours of the range attributed again, then a summary.
    let said = String::from_utf8_lossy(&restated.stderr);
    assert!(said.contains("rollup: attributed "), "{said}");
    let rows = store::closing::restatements(store.db(), old).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].reason, "rate card corrected");
}

/// The FOCUS project's public sample (September 2024, long closed), imported into a fresh
/// database with the real binary: `rollup` attributes the month for the first time (no
/// `--reopen`: the ledger never held it) and records that on the month; its reconciliation holds
/// the whole bill to the cent. The GPU instances no agent reports (g5.4xlarge, g3.4xlarge) are
/// in the ledger on hosts known from the bill, as unmonitored cost of the business unit their
/// real tags name.
#[tokio::test(flavor = "multi_thread")]
async fn the_focus_projects_sample_is_attributed_and_reconciles() {
    let db = test_support::sqlite();
    let sample = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/focus-samples/focus10_sample_aws_azure_oci.csv");
    server_run(
        &db.url,
        &["billing", "import-focus", sample.to_str().unwrap()],
    );
    // The sample's resource tags name a business unit: an owner dimension reads it.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuledger.toml");
    std::fs::write(
        &config,
        "[owners]\nbusiness_unit = { from = [\"tag:business_unit\"] }\n",
    )
    .unwrap();
    let rolled = server_run(&db.url, &["rollup", "--config", config.to_str().unwrap()]);
    assert!(
        rolled.contains("restated 2024-09: before {}"),
        "first attribution recorded: {rolled}"
    );
    let server = start_server_with(&db.url, free_port(), Some(&config)).await;
    let viewer = signed_in(&server, "viewer").await;
    let rec = get_json(
        &viewer,
        &format!("{}/api/v1/billing/reconciliation?month=2024-09", server.url),
    )
    .await;
    let usd = &rec["currencies"][0];
    let dec = |v: &Value| d(v.as_str().unwrap());
    // An independent decimal sum of the file's EffectiveCost (bare NULL is no value).
    let mut reader = csv::Reader::from_path(&sample).unwrap();
    let idx = reader
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == "EffectiveCost")
        .unwrap();
    let effective: Decimal = reader
        .records()
        .map(|r| r.unwrap()[idx].to_owned())
        .filter(|v| v != "NULL" && !v.is_empty())
        .map(|v| d(&v))
        .sum();
    assert_eq!(usd["currency"], "USD", "{rec}");
    assert_eq!(dec(&usd["bill"]), effective, "{rec}");
    assert_eq!(dec(&usd["difference"]), d("0"), "to the cent: {rec}");
    let listed = |list: &str| -> Decimal {
        usd[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| dec(&r["cost"]))
            .sum()
    };
    // What the ledger leaves aside is what is not a GPU host; the GPU instances without agent
    // are all of its attributed cost, as unmonitored.
    assert_eq!(dec(&usd["ledger_unattributed"]), listed("not_gpu"), "{rec}");
    assert_eq!(
        dec(&usd["attributed"]["unmonitored"]),
        listed("gpu_without_agent"),
        "{rec}"
    );
    assert_eq!(dec(&usd["attributed"]["used"]), d("0"), "{rec}");
    assert!(listed("gpu_without_agent") > d("0"), "{rec}");
    assert!(
        usd["gpu_without_agent"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["in_ledger"] == true),
        "{rec}"
    );
    // The sample's GPU hosts: g5.4xlarge (A10G) and g3.4xlarge (M60), whatever the rate card
    // lists; the m4, c5 and Azure D11 hosts are not GPU hosts.
    let types = |list: &str| -> Vec<String> {
        usd[list]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["instance_type"].as_str().map(str::to_owned))
            .collect()
    };
    let gpu = types("gpu_without_agent");
    assert!(gpu.iter().any(|t| t == "g5.4xlarge"), "{rec}");
    assert!(gpu.iter().any(|t| t == "g3.4xlarge"), "{rec}");
    assert_eq!(gpu.len(), 8, "{rec}");
    // Each g5.4xlarge names the business unit its tags give, for whoever installs the agent.
    for r in usd["gpu_without_agent"].as_array().unwrap() {
        if r["instance_type"] == "g5.4xlarge" {
            assert_eq!(
                r["owners"]["business_unit"],
                serde_json::json!(["PeoriaData"]),
                "{r}"
            );
        }
    }
    assert!(
        types("not_gpu")
            .iter()
            .all(|t| ["m4.10xlarge", "c5.4xlarge", "Standard_D11_v2"].contains(&t.as_str())),
        "{rec}"
    );
    assert_eq!(
        rec["hours_waiting_for_rollup"], 0,
        "nothing left to roll up: {rec}"
    );
    // By business unit, PeoriaData holds its tagged GPU instances' cost, all unmonitored.
    let peoria: Decimal = usd["gpu_without_agent"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["owners"]["business_unit"] == serde_json::json!(["PeoriaData"]))
        .map(|r| dec(&r["cost"]))
        .sum();
    assert!(peoria > d("0"), "{rec}");
    let by_unit = get_json(
        &viewer,
        &format!(
            "{}/api/v1/allocation?from=2024-09&to=2024-10&by=business_unit&step=month",
            server.url
        ),
    )
    .await;
    let row = by_unit["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "PeoriaData")
        .unwrap_or_else(|| panic!("no PeoriaData row: {by_unit}"));
    assert_eq!(dec(&row["cost"]), peoria, "{by_unit}");
    assert_eq!(dec(&row["unmonitored_cost"]), peoria, "{by_unit}");
}

/// An Azure Cost Management export run: parts and `manifest.json` in the run's folder, as
/// azcopy leaves them, each blob with its `dataRowCount`. A part holding fewer rows than the
/// manifest says (cut short in transfer) refuses the whole run, naming the part, and stores
/// nothing; the whole run imports as one delivery.
#[tokio::test(flavor = "multi_thread")]
async fn an_azure_run_short_of_its_manifests_rows_is_refused_whole() {
    let root = tempfile::tempdir().unwrap();
    let db = test_support::sqlite();
    let run = root
        .path()
        .join("costexports/focus/gpu-focus/20260501-20260531/6f1c2a4e-run");
    std::fs::create_dir_all(&run).unwrap();
    let parts = [
        vec![bill_row("i-0aaa", 0, "10"), bill_row("i-0aaa", 1, "20")],
        vec![bill_row("i-0bbb", 0, "5"), bill_row("i-0bbb", 1, "6")],
    ];
    for (i, rows) in parts.iter().enumerate() {
        std::fs::write(
            run.join(format!("part_0_000{}.csv", i + 1)),
            format!("{HEADER}\n{}\n", rows.join("\n")),
        )
        .unwrap();
    }
    let manifest = |second_rows: u64| {
        let path = run.join("manifest.json");
        let blob = |i: usize, rows: u64| {
            format!(
                "{{\"blobName\":\"focus/gpu-focus/20260501-20260531/6f1c2a4e-run/part_0_000{i}.csv\",\
                 \"byteCount\":100,\"dataRowCount\":{rows}}}"
            )
        };
        std::fs::write(
            &path,
            format!(
                "{{\"manifestVersion\":\"2024-04-01\",\"byteCount\":200,\"blobCount\":2,\
                 \"dataRowCount\":{},\"runInfo\":{{\"executionType\":\"Scheduled\",\
                 \"runId\":\"6f1c2a4e-run\",\"startDate\":\"2026-05-01T00:00:00\",\
                 \"endDate\":\"2026-05-31T00:00:00\"}},\"blobs\":[{},{}]}}",
                2 + second_rows,
                blob(1, 2),
                blob(2, second_rows)
            ),
        )
        .unwrap();
        path
    };
    let short = manifest(3);
    let out = server_cmd(&db.url)
        .args(["billing", "import-focus", "--manifest"])
        .arg(&short)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "part_0_0002.csv: the export's manifest says this file holds 3 rows, but it has 2"
        ),
        "{err}"
    );
    assert!(
        err.contains("none of the files given together was imported"),
        "{err}"
    );
    let store = db.open().await;
    assert!(store::bills::cost_lines(store.db(), 0, i64::MAX / 2)
        .await
        .unwrap()
        .is_empty());

    let whole = manifest(2);
    let out = server_run(
        &db.url,
        &[
            "billing",
            "import-focus",
            "--manifest",
            whole.to_str().unwrap(),
        ],
    );
    assert_eq!(out.matches("imported 2 rows").count(), 2, "{out}");
    assert_eq!(
        store::bills::cost_lines(store.db(), 0, i64::MAX / 2)
            .await
            .unwrap()
            .len(),
        4
    );
    let periods = store::bills::billing_file_periods(store.db())
        .await
        .unwrap();
    assert!(periods
        .iter()
        .all(|p| p.delivery.as_deref() == Some("6f1c2a4e-run")));
}
