//! AWS Cost Explorer sync through the real AWS SDK: `GetCostAndUsage` against a local moto
//! server with queued results, and `GetCostAndUsageWithResources` (which moto lacks) against a
//! local stub speaking the same JSON protocol, which also throttles once and pages.

use crate::support;

use gpuledger_server::store;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use chrono::{Duration as Days, NaiveDate, Utc};
use serde_json::{json, Value};
use support::*;

const TARGET_PREFIX: &str = "AWSInsightsIndexService.";

#[derive(Clone)]
struct Stub {
    moto: String,
    resource_requests: Arc<AtomicUsize>,
    hour: String,
    /// Answer as an account without hourly resource-level data does.
    no_hourly: bool,
}

fn metrics(amortized: &str, unblended: &str) -> Value {
    json!({
        "AmortizedCost": { "Amount": amortized, "Unit": "USD" },
        "UnblendedCost": { "Amount": unblended, "Unit": "USD" }
    })
}

/// Answers GetCostAndUsageWithResources itself (throttling the first call, then two pages);
/// passes everything else to moto.
async fn stub(State(s): State<Stub>, headers: HeaderMap, body: Bytes) -> Response {
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if target == format!("{TARGET_PREFIX}GetCostAndUsageWithResources") {
        let n = s.resource_requests.fetch_add(1, Ordering::SeqCst);
        let req: Value = serde_json::from_slice(&body).unwrap_or_default();
        if s.no_hourly && req["Granularity"] == "HOURLY" {
            return (
                StatusCode::BAD_REQUEST,
                [("content-type", "application/x-amz-json-1.1")],
                json!({"__type": "DataUnavailableException", "message": "Hourly granularity is not enabled for this account"}).to_string(),
            )
                .into_response();
        }
        assert_eq!(
            req["Granularity"],
            if s.no_hourly { "DAILY" } else { "HOURLY" }
        );
        // EC2 compute, less the commitments' fees (read on their own, counted twice otherwise).
        assert_eq!(req["Filter"]["And"][0]["Dimensions"]["Key"], "SERVICE");
        assert_eq!(
            req["Filter"]["And"][1]["Not"]["Dimensions"]["Key"],
            "RECORD_TYPE"
        );
        assert!(req["Filter"]["And"][1]["Not"]["Dimensions"]["Values"]
            .as_array()
            .is_some_and(|v| v.iter().any(|t| t == "RIFee")));
        assert_eq!(req["GroupBy"][0]["Key"], "RESOURCE_ID");
        if n == 0 {
            return (
                StatusCode::BAD_REQUEST,
                [("content-type", "application/x-amz-json-1.1")],
                json!({"__type": "LimitExceededException", "message": "Rate exceeded"}).to_string(),
            )
                .into_response();
        }
        let (start, end) = if s.no_hourly {
            (
                s.hour.clone(),
                (chrono::NaiveDate::parse_from_str(&s.hour, "%Y-%m-%d").unwrap() + Days::days(1))
                    .to_string(),
            )
        } else {
            (
                format!("{}T05:00:00Z", s.hour),
                format!("{}T06:00:00Z", s.hour),
            )
        };
        let page = if req.get("NextPageToken").is_none() {
            json!({
                "ResultsByTime": [{ "TimePeriod": {"Start": start, "End": end}, "Total": {}, "Estimated": false,
                    "Groups": [{ "Keys": ["i-0aaa", "Savings Plans"], "Metrics": metrics("20.0", "32.7726") }] }],
                "NextPageToken": "page-2"
            })
        } else {
            json!({
                "ResultsByTime": [{ "TimePeriod": {"Start": start, "End": end}, "Total": {}, "Estimated": true,
                    "Groups": [{ "Keys": ["i-0aaa", "Spot Instances"], "Metrics": metrics("1.5", "1.5") }] }]
            })
        };
        return (
            [("content-type", "application/x-amz-json-1.1")],
            page.to_string(),
        )
            .into_response();
    }
    let mut forward = reqwest::Client::new().post(&s.moto).body(body.to_vec());
    for (k, v) in headers.iter() {
        if k != "host" && k != "content-length" {
            forward = forward.header(k.as_str(), v.as_bytes());
        }
    }
    let resp = forward.send().await.unwrap();
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/x-amz-json-1.1")
        .to_owned();
    (
        status,
        [("content-type", ct)],
        resp.bytes().await.unwrap().to_vec(),
    )
        .into_response()
}

async fn start_stub(moto: &str, hour: &str) -> (String, Arc<AtomicUsize>) {
    start_stub_with(moto, hour, false).await
}

async fn start_stub_with(moto: &str, hour: &str, no_hourly: bool) -> (String, Arc<AtomicUsize>) {
    let counter = Arc::new(AtomicUsize::new(0));
    let state = Stub {
        moto: moto.to_owned(),
        resource_requests: counter.clone(),
        hour: hour.to_owned(),
        no_hourly,
    };
    let app = Router::new().fallback(stub).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), counter)
}

fn sync_cmd(db_url: &str, endpoint: &str, from: NaiveDate, to: NaiveDate) -> std::process::Output {
    server_cmd(db_url)
        .args([
            "billing",
            "sync-aws",
            "--from",
            &from.to_string(),
            "--to",
            &to.to_string(),
        ])
        .args([
            "--aws-endpoint-url",
            endpoint,
            "--aws-tag-key",
            "gpuledger-instance",
        ])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        // Never look for credentials on an instance metadata service.
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .output()
        .unwrap()
}

async fn cost_explorer_sync(db: TestDb) {
    let label = db.backend;
    let (_moto, moto) = start_moto().await;
    let today = Utc::now().date_naive();
    let (from, to) = (today - Days::days(20), today - Days::days(10));
    let grouped_day = today - Days::days(18);
    let resource_day = today - Days::days(12);
    // GetCostAndUsage (older days, by instance type and the host tag): queued before the request.
    let queued = json!({ "results": [{
        "ResultsByTime": [{
            "TimePeriod": { "Start": grouped_day.to_string(), "End": (grouped_day + Days::days(1)).to_string() },
            "Total": {}, "Estimated": false,
            "Groups": [
                { "Keys": ["p4d.24xlarge", "gpuledger-instance$i-0bbb"], "Metrics": metrics("786.5424", "786.5424") },
                { "Keys": ["g5.xlarge", "gpuledger-instance$"], "Metrics": metrics("24.144", "24.144") }
            ]
        }]
    }]});
    let r = reqwest::Client::new()
        .post(format!("{moto}/moto-api/static/ce/cost-and-usage-results"))
        .json(&queued)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    // GetCostAndUsage by record type and service (the commitments' fees of the days per
    // resource), asked second: the compute Savings Plans' $25 recurring fee, of which the
    // amortized view leaves $5 unused; an RDS reservation's fee and a usage record the filter
    // would have left out are ignored.
    let fees = json!({ "results": [{
        "ResultsByTime": [{
            "TimePeriod": { "Start": resource_day.to_string(), "End": (resource_day + Days::days(1)).to_string() },
            "Total": {}, "Estimated": false,
            "Groups": [
                { "Keys": ["SavingsPlanRecurringFee", "Savings Plans for AWS Compute usage"], "Metrics": metrics("5.0", "25.0") },
                { "Keys": ["RIFee", "Amazon Relational Database Service"], "Metrics": metrics("3.0", "7.0") },
                { "Keys": ["Usage", "Amazon Elastic Compute Cloud - Compute"], "Metrics": metrics("99.0", "99.0") }
            ]
        }]
    }]});
    let r = reqwest::Client::new()
        .post(format!("{moto}/moto-api/static/ce/cost-and-usage-results"))
        .json(&fees)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let (endpoint, resource_requests) = start_stub(&moto, &resource_day.to_string()).await;

    let out = sync_cmd(&db.url, &endpoint, from, to);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{label}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("10 days fetched"), "{stdout}");
    // Progress on stderr (not a terminal): the range fetched, then a summary.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("sync-aws: {from} to {to} (0 of 10 days so far)")),
        "{said}"
    );
    assert!(said.contains("sync-aws: storing "), "{said}");
    assert!(
        said.contains("sync-aws: 10 days fetched, 0 final days skipped ("),
        "{said}"
    );
    assert_eq!(
        resource_requests.load(Ordering::SeqCst),
        3,
        "throttled once, then two pages"
    );

    let store = db.open().await;
    let lines = store::bills::cost_lines(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    assert_eq!(lines.len(), 6, "{label}: {lines:?}");
    let for_key = |k: Option<&str>| {
        lines
            .iter()
            .filter(|l| l.resource_key.as_deref() == k)
            .collect::<Vec<_>>()
    };
    let aaa = for_key(Some("i-0aaa"));
    assert_eq!(aaa.len(), 2, "{label}");
    assert_eq!(
        (
            aaa[0].effective_cost.to_string(),
            aaa[0].billed_cost.to_string(),
            aaa[0].pricing_category.as_str()
        ),
        ("20".to_owned(), "32.7726".to_owned(), "committed")
    );
    assert_eq!(aaa[1].pricing_category, "spot");
    assert_eq!(
        aaa[0].charge_period_end_ms - aaa[0].charge_period_start_ms,
        3_600_000,
        "hourly"
    );
    let bbb = for_key(Some("i-0bbb"));
    assert_eq!(
        (
            bbb[0].effective_cost.to_string(),
            bbb[0].instance_type.as_deref()
        ),
        ("786.5424".to_owned(), Some("p4d.24xlarge"))
    );
    assert_eq!(
        for_key(None).len(),
        1,
        "{label}: the untagged group counts, unattributed"
    );
    let imports = store::bills::billing_imports(store.db()).await.unwrap();
    assert_eq!(
        (imports.len(), imports[0].source.as_str()),
        (1, "aws-cost-explorer")
    );
    // The account's Savings Plans as one commitment: $20 used (the usage the resource lines
    // say Savings Plans covered), $5 unused, $25 invoiced: 80 % used.
    use gpuledger_server::billing::aws::SAVINGS_PLANS;
    let day_ms = |d: NaiveDate| d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp_millis();
    let found = gpuledger_server::commitments::for_range(
        store.as_ref(),
        &gpuledger_core::ratecard::RateCard::default_card(),
        &gpuledger_server::config::Config::default(),
        &[],
        (day_ms(from), day_ms(to)),
        day_ms(today),
    )
    .await
    .unwrap();
    assert_eq!(found.commitments.len(), 1, "{label}: {found:?}");
    let sp = &found.commitments[0];
    let d = |t: &str| t.parse::<rust_decimal::Decimal>().unwrap();
    assert_eq!(sp.id, SAVINGS_PLANS.id, "{label}");
    assert_eq!(sp.name.as_deref(), Some(SAVINGS_PLANS.name), "{label}");
    assert_eq!(
        sp.commitment_type.as_deref(),
        Some("Savings Plan"),
        "{label}"
    );
    assert_eq!(sp.used_on_gpus + sp.used_elsewhere, d("20"), "{label}");
    assert_eq!((sp.unused, sp.invoiced), (d("5"), d("25")), "{label}");
    assert_eq!(sp.utilization_percent, Some(d("80.0")), "{label}");
    assert_eq!(found.unused[0].amount, d("5"), "{label}");

    // Again: every day is final and synced, so nothing is asked (each request costs $0.01).
    let out = sync_cmd(&db.url, &endpoint, from, to);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("0 days fetched, 10 final days skipped"),
        "{stdout}"
    );
    assert_eq!(resource_requests.load(Ordering::SeqCst), 3);
    assert_eq!(
        store::bills::cost_lines(store.db(), 0, i64::MAX)
            .await
            .unwrap()
            .len(),
        6
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cost_explorer_sync_sqlite() {
    cost_explorer_sync(test_support::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cost_explorer_sync_postgres() {
    cost_explorer_sync(test_support::postgres().await).await;
}

/// The daily job inside `serve`: runs when due and this replica holds the lease, then not
/// again for a day.
#[tokio::test(flavor = "multi_thread")]
async fn the_daily_sync_runs_once_a_day() {
    let (_moto, moto) = start_moto().await;
    let today = Utc::now().date_naive();
    let (endpoint, resource_requests) =
        start_stub(&moto, &(today - Days::days(1)).to_string()).await;
    // Queue an empty answer for the grouped request (days before the 14-day window).
    let queued = json!({ "results": [{ "ResultsByTime": [] }] });
    reqwest::Client::new()
        .post(format!("{moto}/moto-api/static/ce/cost-and-usage-results"))
        .json(&queued)
        .send()
        .await
        .unwrap();
    let db = test_support::sqlite();
    let store = db.open().await;
    let ce = gpuledger_server::billing::aws::CostExplorer::new(
        gpuledger_server::billing::aws::client_for_endpoint(&endpoint, "testing", "testing"),
        gpuledger_server::billing::aws::SyncOptions {
            throttle_backoff: Duration::from_millis(50),
            ..Default::default()
        },
    );
    use gpuledger_server::jobs::aws_sync_if_due;
    let now = gpuledger_server::clock::now_ms();
    // Another replica holds the lease: this one skips.
    assert!(store::jobs::try_lease(
        store.db(),
        gpuledger_server::jobs::AWS_SYNC_JOB,
        "other",
        now,
        60_000
    )
    .await
    .unwrap());
    assert!(aws_sync_if_due(store.as_ref(), &ce, "me", now)
        .await
        .unwrap()
        .is_none());
    // Its lease has run out: this replica syncs (throttled once, retried by our backoff).
    let later = now + 61_000;
    let done = aws_sync_if_due(store.as_ref(), &ce, "me", later)
        .await
        .unwrap()
        .expect("it ran");
    assert!(done.fetched_days >= 14, "{done:?}");
    assert_eq!(done.import.map(|i| i.rows), Some(2));
    assert_eq!(resource_requests.load(Ordering::SeqCst), 3);
    // Not due again within the day.
    assert!(
        aws_sync_if_due(store.as_ref(), &ce, "me", later + 3_600_000)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(resource_requests.load(Ordering::SeqCst), 3);
}

/// An account without hourly resource-level data gets daily per-instance lines instead.
#[tokio::test(flavor = "multi_thread")]
async fn without_hourly_data_the_sync_falls_back_to_daily() {
    let (_moto, moto) = start_moto().await;
    let today = Utc::now().date_naive();
    let day = today - Days::days(5);
    let (endpoint, requests) = start_stub_with(&moto, &day.to_string(), true).await;
    let db = test_support::sqlite();
    let out = sync_cmd(
        &db.url,
        &endpoint,
        today - Days::days(6),
        today - Days::days(4),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Hourly refused, then daily in two pages.
    assert_eq!(requests.load(Ordering::SeqCst), 3);
    let store = db.open().await;
    let lines = store::bills::cost_lines(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    assert_eq!(lines.len(), 2);
    assert!(
        lines
            .iter()
            .all(|l| l.charge_period_end_ms - l.charge_period_start_ms == 86_400_000),
        "daily lines"
    );
}
