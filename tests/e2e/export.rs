//! Scheduled exports to object storage through the real AWS SDK against moto's S3: the running
//! server writes each settled day of the demo's ledger (and its closed month) as FOCUS CSV and
//! Parquet with a manifest, once; the CSV is byte for byte what the allocation API exports for
//! that day. A store that is down, or a bucket that refuses writes, loses nothing: the failure
//! is recorded, shown on the billing page and in `/metrics` (by any replica), and the export
//! lands when tried again.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};
use support::*;

/// Credentials moto takes, and nothing of this machine's AWS setup.
const AWS_ENV: [(&str, &str); 6] = [
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_REGION", "us-east-1"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
    ("AWS_CONFIG_FILE", "/dev/null"),
    ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
];

fn config(dir: &Path, name: &str, endpoint: &str, bucket: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "[export]\nbucket = \"{bucket}\"\nprefix = \"finance/gpu\"\n\
             formats = [\"csv\", \"parquet\"]\nregion = \"us-east-1\"\n\
             endpoint_url = \"{endpoint}\"\nforce_path_style = true\ncatch_up_days = 2\n\
             settle = \"0s\"\ncheck_every = \"1s\"\n"
        ),
    )
    .unwrap();
    path
}

async fn seeded_demo() -> TestDb {
    let db = test_support::sqlite();
    let store = db.open().await;
    gpuledger_server::demo::seed(
        store.as_ref(),
        &gpuledger_core::ratecard::RateCard::default_card(),
        &Default::default(),
        gpuledger_server::clock::now_ms(),
    )
    .await
    .unwrap();
    db
}

fn export(db: &TestDb, args: &[&str]) -> std::process::Output {
    server_cmd(&db.url)
        .envs(AWS_ENV)
        .arg("export")
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

async fn create_bucket(moto: &str, bucket: &str) {
    let r = reqwest::Client::new()
        .put(format!("{moto}/{bucket}"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

/// The bucket's keys.
async fn keys(moto: &str, bucket: &str) -> Vec<String> {
    let xml = reqwest::get(format!("{moto}/{bucket}?list-type=2&max-keys=1000"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    xml.split("<Key>")
        .skip(1)
        .filter_map(|s| s.split("</Key>").next())
        .map(str::to_owned)
        .collect()
}

/// An object, read as a data lake reads it: the AWS SDK, signed.
async fn object(moto: &str, bucket: &str, key: &str) -> Vec<u8> {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .endpoint_url(moto)
        .force_path_style(true)
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "testing", "testing", None, None, "static",
        ))
        .build();
    let got = aws_sdk_s3::Client::from_conf(conf)
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{key}: {}", aws_sdk_s3::error::DisplayErrorContext(e)));
    got.body.collect().await.unwrap().into_bytes().to_vec()
}

fn yesterday() -> (String, String, String) {
    let now = gpuledger_server::clock::now_ms();
    let start = gpuledger_core::time::day_floor(now) - gpuledger_core::time::DAY_MS;
    let date = chrono::DateTime::from_timestamp_millis(start)
        .unwrap()
        .date_naive();
    (
        date.format("%Y/%m/%d").to_string(),
        gpuledger_core::time::rfc3339(start),
        gpuledger_core::time::rfc3339(start + gpuledger_core::time::DAY_MS),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_days_focus_export_lands_in_the_bucket_on_schedule_once() {
    let (_moto, moto) = start_moto().await;
    create_bucket(&moto, "finance-lake").await;
    let db = seeded_demo().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "export.toml", &moto, "finance-lake");
    // The month before closes at once, whatever today's date: its export is due now (by
    // default a month closes 5 days after it ends, and the 1st to the 5th would have none).
    let env: Vec<(&str, &str)> = AWS_ENV
        .into_iter()
        .chain([("GPULEDGER_CLOSE_MONTHS_AFTER", "0s")])
        .collect();
    let server = start_server_env(&db.url, free_port(), Some(&cfg), &env).await;

    let (folder, from, to) = yesterday();
    let manifest_key = format!("finance/gpu/daily/{folder}/manifest.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !keys(&moto, "finance-lake").await.contains(&manifest_key) {
        assert!(
            Instant::now() < deadline,
            "no manifest: {:?}",
            keys(&moto, "finance-lake").await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let manifest: Value =
        serde_json::from_slice(&object(&moto, "finance-lake", &manifest_key).await).unwrap();
    assert_eq!(manifest["period"]["start"], from.as_str());
    assert_eq!(manifest["period"]["end"], to.as_str());
    let files = manifest["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{manifest}");
    // Each file as the manifest says: its size and SHA-256.
    for f in files {
        let bytes = object(&moto, "finance-lake", f["key"].as_str().unwrap()).await;
        assert_eq!(bytes.len() as u64, f["bytes"].as_u64().unwrap(), "{f}");
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            f["sha256"].as_str().unwrap()
        );
        if f["format"] == "parquet" {
            assert!(
                bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1"),
                "{f}"
            );
        }
    }
    // The CSV is the allocation API's FOCUS export of the same day, to the byte.
    let csv_key = format!("finance/gpu/daily/{folder}/allocation.csv");
    let csv = object(&moto, "finance-lake", &csv_key).await;
    let token = server_run(&db.url, &["read-token", "create", "lake-check"])
        .trim()
        .to_owned();
    let api = reqwest::Client::new()
        .get(format!("{}/api/v1/allocation", server.url))
        .query(&[
            ("from", from.as_str()),
            ("to", to.as_str()),
            ("format", "focus"),
        ])
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(csv.len() > 1000, "a day of the demo's fleet");
    assert!(
        csv == api.to_vec(),
        "the export is the API's FOCUS for the day"
    );

    // The closed month too.
    let month_manifests: Vec<String> = keys(&moto, "finance-lake")
        .await
        .into_iter()
        .filter(|k| k.starts_with("finance/gpu/monthly/") && k.ends_with("manifest.json"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut month_manifests = month_manifests;
    while month_manifests.is_empty() {
        assert!(Instant::now() < deadline, "no monthly export");
        tokio::time::sleep(Duration::from_millis(500)).await;
        month_manifests = keys(&moto, "finance-lake")
            .await
            .into_iter()
            .filter(|k| k.starts_with("finance/gpu/monthly/") && k.ends_with("manifest.json"))
            .collect();
    }

    // Once: a few runs later, nothing new, and a run by hand finds nothing due.
    let before = keys(&moto, "finance-lake").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(keys(&moto, "finance-lake").await, before);
    let out = export(&db, &["run", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("0 exported, 0 failed"),
        "{}",
        text(&out)
    );
    // Said on the billing page.
    let viewer = signed_in(&server, "viewer").await;
    let page = viewer
        .get(format!("{}/billing", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Scheduled exports"), "{page}");
    assert!(page.contains(&manifest_key), "{page}");
}

/// `/metrics` without a token: the exposition (checked by promtool), the number of failing
/// periods it says, and when it says the latest export was written (seconds).
async fn export_gauges(server: &Server) -> (f64, Option<f64>) {
    let text = reqwest::get(format!("{}/metrics", server.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_promtool_passes(&text);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .map(|v| v.trim().parse::<f64>().unwrap())
    };
    let failing = value("gpuledger_exports_failing")
        .unwrap_or_else(|| panic!("no gpuledger_exports_failing: {text}"));
    (
        failing,
        value("gpuledger_exports_last_success_timestamp_seconds"),
    )
}

/// The billing page's scheduled exports, as a viewer sees them.
async fn exports_on_billing_page(viewer: &reqwest::Client, server: &Server) -> String {
    let page = viewer
        .get(format!("{}/billing", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    page.split_once("<h2>Scheduled exports</h2>")
        .unwrap_or_else(|| panic!("no scheduled exports on the billing page: {page}"))
        .1
        .to_owned()
}

/// The failed periods `export status` lists.
fn failed_in_status(status: &str) -> usize {
    status.lines().filter(|l| l.contains("\tfailed\t")).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_down_or_refusing_loses_no_export() {
    let (_moto, moto) = start_moto().await;
    let db = seeded_demo().await;
    let dir = tempfile::tempdir().unwrap();
    // A replica with no [export] of its own: what it shows of the exports comes from the
    // database, as on every replica, not from having run them.
    let server = start_server_env(&db.url, free_port(), None, &AWS_ENV).await;
    let viewer = signed_in(&server, "viewer").await;
    assert_eq!(
        export_gauges(&server).await,
        (0.0, None),
        "nothing tried yet"
    );
    // Down: nothing listens there.
    let down = config(
        dir.path(),
        "down.toml",
        &format!("http://127.0.0.1:{}", free_port()),
        "late-lake",
    );
    let out = export(&db, &["run", "--config", down.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("failed day:"), "{}", text(&out));
    let status = text(&export(&db, &["status"]));
    assert!(status.contains("\tfailed\t1\t"), "{status}");
    // Visible while it fails: on /metrics, one per failed period, and on the billing page
    // with why.
    let failing = failed_in_status(&status);
    assert!(failing > 0, "{status}");
    assert_eq!(export_gauges(&server).await, (failing as f64, None));
    let shown = exports_on_billing_page(&viewer, &server).await;
    assert_eq!(
        shown.matches("<tr class=\"failed\">").count(),
        failing,
        "{shown}"
    );
    assert!(shown.contains("failed, next try"), "{shown}");
    assert!(
        shown.contains("object storage: dispatch failure"),
        "{shown}"
    );
    // Up, but the bucket is not there: S3 refuses the writes; still recorded, still failing.
    let up = config(dir.path(), "up.toml", &moto, "late-lake");
    let out = export(&db, &["run", "--config", up.to_str().unwrap()]);
    assert!(
        out.status.success() && text(&out).contains("0 exported, 0 failed"),
        "waiting out the backoff: {}",
        text(&out)
    );
    let out = export(&db, &["run", "--retry", "--config", up.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("NoSuchBucket"), "{}", text(&out));
    let status = text(&export(&db, &["status"]));
    assert!(status.contains("\tfailed\t2\t"), "{status}");
    assert_eq!(
        export_gauges(&server).await,
        (failed_in_status(&status) as f64, None)
    );
    let shown = exports_on_billing_page(&viewer, &server).await;
    assert!(shown.contains("NoSuchBucket"), "the latest error: {shown}");
    assert!(
        !shown.contains("dispatch failure"),
        "not the one before: {shown}"
    );
    // The bucket made: everything lands, once, with nothing half written before.
    create_bucket(&moto, "late-lake").await;
    assert!(keys(&moto, "late-lake").await.is_empty());
    let out = export(&db, &["run", "--retry", "--config", up.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let (folder, _, _) = yesterday();
    let keys = keys(&moto, "late-lake").await;
    assert!(
        keys.contains(&format!("finance/gpu/daily/{folder}/manifest.json")),
        "{keys:?}"
    );
    let status = text(&export(&db, &["status"]));
    assert!(status.contains("\tdone\t3\t"), "{status}");
    assert!(!status.contains("\tfailed\t"), "{status}");
    // Written: nothing failing any more, and when it was written.
    let (failing, last_success) = export_gauges(&server).await;
    assert_eq!(failing, 0.0);
    let last_success = last_success.expect("a last success once written");
    let now = gpuledger_server::clock::now_ms() as f64 / 1000.0;
    assert!(
        (now - 600.0..=now).contains(&last_success),
        "{last_success} vs {now}"
    );
    let shown = exports_on_billing_page(&viewer, &server).await;
    assert!(!shown.contains("class=\"failed\""), "{shown}");
    assert!(
        shown.contains(&format!("finance/gpu/daily/{folder}/manifest.json")),
        "{shown}"
    );
}
