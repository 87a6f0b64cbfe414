//! Pages read from a real PostgreSQL streaming standby (`--read-database-url`): the one
//! `scripts/with-postgres` starts beside the throwaway primary with `pg_basebackup`. Its replay
//! is paused to make the lag deterministic. This is the only test that uses the standby, so the
//! pause affects no other.

use crate::support;

use std::time::{Duration, Instant};

use gpuledger_server::test_support;
use sqlx::Connection;
use support::*;

/// The test database's URL on the standby, once the standby has replayed its creation.
async fn on_standby(primary_url: &str) -> String {
    let standby = std::env::var("GPULEDGER_TEST_PG_STANDBY_URL").unwrap_or_else(|_| {
        panic!("GPULEDGER_TEST_PG_STANDBY_URL is not set: run the tests through scripts/test, which starts a streaming standby")
    });
    let name = primary_url.rsplit('/').next().unwrap();
    let base = standby.rsplit_once('/').unwrap().0;
    let url = format!("{base}/{name}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match sqlx::PgConnection::connect(&url).await {
            Ok(_) => return url,
            Err(e) if Instant::now() > deadline => panic!("the standby never had {name}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Pauses or resumes the standby's replay of the primary's log.
async fn replay(standby_url: &str, paused: bool) {
    let mut conn = sqlx::PgConnection::connect(standby_url).await.unwrap();
    let call = if paused {
        "SELECT pg_wal_replay_pause()"
    } else {
        "SELECT pg_wal_replay_resume()"
    };
    sqlx::query(call).execute(&mut conn).await.unwrap();
}

/// Resumes replay however the test ends, so the standby is left following the primary.
struct ResumeOnDrop(String);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        let url = self.0.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(replay(&url, false));
        })
        .join();
    }
}

struct Read {
    from: String,
    as_of: Option<String>,
    clusters: Vec<String>,
}

/// `GET /api/v1/allocation` by cluster over the hours around now, and where it was read.
async fn clusters(client: &reqwest::Client, server: &Server, bearer: Option<&str>) -> Read {
    let mut get = client.get(format!(
        "{}/api/v1/allocation?{}&by=cluster",
        server.url,
        around_now()
    ));
    if let Some(secret) = bearer {
        get = get.bearer_auth(secret);
    }
    let resp = get.send().await.unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (from, as_of) = (
        header("gpuledger-read-from").expect("where it was read"),
        header("gpuledger-figures-as-of"),
    );
    let body: serde_json::Value = resp.json().await.unwrap();
    let mut clusters: Vec<String> = body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect();
    clusters.sort();
    Read {
        from,
        as_of,
        clusters,
    }
}

/// Sets team-1's budget from `month` on through the budgets page's form, as a person does.
async fn set_budget(
    admin: &reqwest::Client,
    server: &Server,
    month: &str,
    amount: &str,
) -> reqwest::Response {
    let budgets = page_text(admin, &format!("{}/budgets", server.url)).await;
    admin
        .post(format!("{}/budgets", server.url))
        .form(&[
            ("csrf", csrf_of(&budgets).as_str()),
            ("dimension", "team"),
            ("key", "team-1"),
            ("amount", amount),
            ("currency", "USD"),
            ("from_month", month),
        ])
        .send()
        .await
        .unwrap()
}

/// Polls `check` every 200 ms until it holds, for at most `secs`.
async fn until<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(Instant::now() < deadline, "waited {secs} s for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn post_report(server: &Server, token: &str, prefix: &str) {
    let now = gpuledger_server::clock::now_ms();
    let report = eight_gpu_report(prefix, 1, 1, now - now % WINDOW_MS - WINDOW_MS);
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/reports", server.url))
        .bearer_auth(token)
        .json(&report)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
}

/// Whether the primary has rolled up the report of `cluster` (read there, not through the
/// server).
async fn rolled_up_on_primary(db_url: &str, cluster: &str) -> bool {
    let mut conn = sqlx::PgConnection::connect(db_url).await.unwrap();
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM rollup_hours r JOIN hosts h ON h.id = r.host_id
         WHERE h.cluster = $1",
    )
    .bind(cluster)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    n > 0
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_read_the_replica_say_how_fresh_and_show_a_change_at_once() {
    let db = test_support::postgres().await;
    let standby = on_standby(&db.url).await;
    let token = create_token(&db.url, "replica", "rep*");
    let server = start_server_env(
        &db.url,
        free_port(),
        None,
        &[
            ("GPULEDGER_READ_DATABASE_URL", standby.as_str()),
            ("GPULEDGER_MAX_REPLICA_LAG", "45s"),
            ("GPULEDGER_ROLLUP_INTERVAL", "1s"),
        ],
    )
    .await;
    let admin = signed_in(&server, "admin").await;
    let bi = server_run(&db.url, &["read-token", "create", "bi"])
        .trim()
        .to_owned();
    let reader = reqwest::Client::new();

    // A report, rolled up, read back from the replica with the time it is as of.
    post_report(&server, &token, "repa").await;
    until(30, "the replica to show cluster repa-1", || async {
        let r = clusters(&reader, &server, Some(&bi)).await;
        r.from == "replica" && r.clusters == ["repa-1"]
    })
    .await;
    let fresh = clusters(&reader, &server, Some(&bi)).await;
    let as_of = chrono::DateTime::parse_from_rfc3339(fresh.as_of.as_deref().unwrap()).unwrap();
    let behind = gpuledger_server::clock::now_ms() - as_of.timestamp_millis();
    assert!((0..10_000).contains(&behind), "as of {as_of}: {behind} ms");
    let page = page_text(&admin, &format!("{}/", server.url)).await;
    assert!(page.contains("repa-001"), "{page}");
    assert!(page.contains("(read replica)"), "{page}");
    let metrics = page_text(&reader, &format!("{}/metrics", server.url)).await;
    assert!(metrics.contains("gpuledger_read_replica_up 1"), "{metrics}");
    assert!(
        metrics.contains("gpuledger_read_replica_lag_seconds "),
        "{metrics}"
    );
    assert_promtool_passes(&metrics);

    // Every page and API read works on the replica: none of them writes where it reads.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let closed = (chrono::Utc::now() - chrono::Duration::days(40))
        .format("%Y-%m")
        .to_string();
    for path in [
        "/".to_owned(),
        format!("/review/{month}"),
        format!("/review/{closed}"),
        format!("/review/{month}/team?key=team-1"),
        format!("/review/{month}/cluster?key=repa-1"),
        "/billing".to_owned(),
        format!("/billing/{month}"),
        "/incidents".to_owned(),
        "/alerts".to_owned(),
        "/recommendations".to_owned(),
        "/budgets".to_owned(),
        format!("/api/v1/allocation?{}&by=team&format=csv", around_now()),
        format!("/api/v1/allocation?{}&format=focus", around_now()),
        "/api/v1/billing/imports".to_owned(),
        "/api/v1/billing/periods".to_owned(),
        format!("/api/v1/billing/reconciliation?month={month}"),
        format!("/api/v1/billing/commitments?month={month}"),
        "/api/v1/budgets".to_owned(),
        "/api/v1/anomalies".to_owned(),
        "/api/v1/variance".to_owned(),
        "/api/v1/incidents".to_owned(),
        "/api/v1/idle/history".to_owned(),
        "/api/v1/recommendations".to_owned(),
        "/api/v1/scale-to-zero".to_owned(),
        "/api/v1/shape".to_owned(),
        "/api/v1/usage".to_owned(),
        "/api/v1/runs".to_owned(),
    ] {
        let resp = admin
            .get(format!("{}{path}", server.url))
            .send()
            .await
            .unwrap();
        let from = resp.headers()["gpuledger-read-from"].to_str().unwrap();
        assert_eq!(from, "replica", "{path}");
        let status = resp.status();
        let body = resp.text().await.unwrap();
        assert!(
            status.is_success(),
            "{path} from the replica: {status} {body}"
        );
    }
    // The closed month's sections were kept, on the primary.
    let mut primary = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (kept,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM kept_sections")
        .fetch_one(&mut primary)
        .await
        .unwrap();
    assert!(
        kept > 0,
        "the closed month's sections are kept on the primary"
    );

    // The replica stops replaying: a new report is rolled up on the primary, and the replica's
    // pages still show the figures as they were, saying as of when.
    let _resume = ResumeOnDrop(standby.clone());
    replay(&standby, true).await;
    post_report(&server, &token, "repb").await;
    until(30, "the primary to roll up repb", || {
        rolled_up_on_primary(&db.url, "repb-1")
    })
    .await;
    let stale = clusters(&reader, &server, Some(&bi)).await;
    assert_eq!(stale.from, "replica");
    assert_eq!(
        stale.clusters,
        ["repa-1"],
        "the replica's figures, as they were"
    );
    let page = page_text(&admin, &format!("{}/", server.url)).await;
    assert!(!page.contains("repb-001"), "{page}");
    let said = stale.as_of.unwrap();
    assert!(page.contains("Figures as of"), "{page}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        clusters(&reader, &server, Some(&bi)).await.as_of.unwrap(),
        said,
        "a paused replica's figures stay as of the same time"
    );

    // A person's change shows on the page the form leads to (read from the primary), while a
    // reader without it still reads the replica.
    let set = set_budget(&admin, &server, &month, "1234").await;
    assert_eq!(set.status(), reqwest::StatusCode::SEE_OTHER);
    let written = set
        .headers()
        .get_all("set-cookie")
        .iter()
        .any(|c| c.to_str().unwrap().starts_with("gpl_written="));
    assert!(written, "a change keeps the primary's position");
    let after = admin
        .get(format!("{}/budgets?month={month}", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(after.headers()["gpuledger-read-from"], "primary");
    let after = after.text().await.unwrap();
    assert!(after.contains("1,234"), "{after}");
    assert!(!after.contains("(read replica)"), "{after}");
    let theirs = reader
        .get(format!("{}/api/v1/budgets?month={month}", server.url))
        .bearer_auth(&bi)
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.headers()["gpuledger-read-from"], "replica");
    let theirs: serde_json::Value = theirs.json().await.unwrap();
    assert!(
        !theirs.to_string().contains("team-1"),
        "the replica has not replayed the budget: {theirs}"
    );
    // The primary's other figures read there too: the report that came after the pause.
    let mine = admin
        .get(format!(
            "{}/api/v1/allocation?{}&by=cluster",
            server.url,
            around_now()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(mine.headers()["gpuledger-read-from"], "primary");

    // Further behind than --max-replica-lag (45 s), every page reads the primary.
    until(70, "the replica to fall too far behind", || async {
        clusters(&reader, &server, Some(&bi)).await.from == "primary"
    })
    .await;
    let far = clusters(&reader, &server, Some(&bi)).await;
    assert_eq!(far.clusters, ["repa-1", "repb-1"]);
    assert_eq!(far.as_of, None);
    let page = page_text(&admin, &format!("{}/", server.url)).await;
    assert!(
        page.contains("repb-001") && !page.contains("(read replica)"),
        "{page}"
    );
    let metrics = page_text(&reader, &format!("{}/metrics", server.url)).await;
    assert!(metrics.contains("gpuledger_read_replica_up 0"), "{metrics}");
    assert!(
        !metrics.contains("gpuledger_read_replica_lag_seconds"),
        "{metrics}"
    );

    // Replaying again, the replica catches up and is read again.
    replay(&standby, false).await;
    until(30, "the replica to catch up", || async {
        let r = clusters(&reader, &server, Some(&bi)).await;
        r.from == "replica" && r.clusters == ["repa-1", "repb-1"]
    })
    .await;

    // Once the replica has replayed a person's change, their pages read it again (the cookie
    // still held), and show the change.
    let set = set_budget(&admin, &server, &month, "5678").await;
    assert_eq!(
        set.status(),
        reqwest::StatusCode::SEE_OTHER,
        "{}",
        set.text().await.unwrap()
    );
    until(
        30,
        "the person's pages to read the replica again",
        || async {
            let page = admin
                .get(format!("{}/budgets?month={month}", server.url))
                .send()
                .await
                .unwrap();
            let from = page.headers()["gpuledger-read-from"]
                .to_str()
                .unwrap()
                .to_owned();
            let body = page.text().await.unwrap();
            assert!(
                body.contains("5,678"),
                "the change shows wherever it is read: {body}"
            );
            from == "replica"
        },
    )
    .await;
}

/// A read URL that names no standby (here the primary itself) is never read: pages read the
/// primary, and the metrics say the replica is not in use.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_url_that_is_no_standby_is_not_read() {
    let db = test_support::postgres().await;
    let server = start_server_env(
        &db.url,
        free_port(),
        None,
        &[("GPULEDGER_READ_DATABASE_URL", db.url.as_str())],
    )
    .await;
    let bi = server_run(&db.url, &["read-token", "create", "bi"])
        .trim()
        .to_owned();
    let reader = reqwest::Client::new();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let read = clusters(&reader, &server, Some(&bi)).await;
    assert_eq!((read.from.as_str(), read.as_of), ("primary", None));
    let metrics = page_text(&reader, &format!("{}/metrics", server.url)).await;
    assert!(metrics.contains("gpuledger_read_replica_up 0"), "{metrics}");
}
