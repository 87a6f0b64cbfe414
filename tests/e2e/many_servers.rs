//! Three server replicas on one PostgreSQL behind a real load balancer (HAProxy, round robin,
//! health-checked), as a production deployment runs them: agents' reports spread over the three,
//! some sent twice as an agent does when an acknowledgement is lost, one replica stopped while
//! they arrive. Nothing is lost, nothing is stored twice, and the periodic jobs (idle evaluation,
//! Slack, roll-up) run once for the three, under their leases in the database.

use crate::support;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuledger_proto::{GpuWindow, HostInfo, Report, Window};
use gpuledger_server::test_support;
use sqlx::Connection;
use support::*;

/// HAProxy in front of `backends`, round robin, each checked on `/healthz` every 200 ms; a
/// request whose server refuses the connection is sent to another (`redispatch`).
fn start_haproxy(dir: &std::path::Path, port: u16, backends: &[u16]) -> Proc {
    let servers: String = backends
        .iter()
        .enumerate()
        .map(|(i, p)| format!("  server s{i} 127.0.0.1:{p} check inter 200ms fall 1 rise 1\n"))
        .collect();
    let config = format!(
        "global\n  maxconn 2048\n\
         defaults\n  mode http\n  timeout connect 2s\n  timeout client 30s\n  timeout server 30s\n  \
         retries 3\n  option redispatch\n\
         frontend gpuledger\n  bind 127.0.0.1:{port}\n  default_backend replicas\n\
         backend replicas\n  balance roundrobin\n  option httpchk GET /healthz\n{servers}"
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config).unwrap();
    let haproxy = ["/usr/sbin/haproxy", "haproxy"]
        .into_iter()
        .find(|h| Command::new(h).arg("-v").output().is_ok())
        .expect("haproxy is missing: run scripts/setup (scripts/test does)");
    let check = Command::new(haproxy)
        .arg("-c")
        .arg("-f")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "haproxy config: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    Proc(
        Command::new(haproxy)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Its notes of servers going up and down, which the test brings about.
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy"),
    )
}

/// `GET url` until it answers 200, for at most 30 s.
async fn until_up(url: &str) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A host whose two GPUs did nothing for the `minutes` before `end_ms` (one-minute windows).
fn idle_report(end_ms: i64, minutes: i64) -> Report {
    Report {
        batch_id: "idle-001-1".into(),
        agent_version: "many".into(),
        host: HostInfo {
            hostname: "idle-001".into(),
            cluster: "many-idle".into(),
            ..Default::default()
        },
        windows: (0..minutes)
            .map(|m| {
                let start_ms = end_ms - (minutes - m) * 60_000;
                Window {
                    serving: Vec::new(),
                    start_ms,
                    end_ms: start_ms + 60_000,
                    samples: 60,
                    gpus: (0..2)
                        .map(|g| GpuWindow {
                            uuid: format!("GPU-idle-001-{g}"),
                            index: g,
                            name: "NVIDIA H100 80GB HBM3".into(),
                            memory_total_bytes: Some(80 * GIB),
                            memory_used_max_bytes: Some(0),
                            util_avg: Some(0.0),
                            util_max: Some(0.0),
                            ..Default::default()
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// Sends `report` through `url` until it is acknowledged, as the agent does (its spool keeps it
/// meanwhile): any failure, a connection cut by a stopping replica included, is sent again.
/// Answers the acknowledgement's status (`stored`, `duplicate`).
async fn deliver(client: &reqwest::Client, url: &str, token: &str, report: &Report) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sent = client
            .post(format!("{url}/api/v1/reports"))
            .bearer_auth(token)
            .json(report)
            .send()
            .await;
        if let Ok(r) = sent {
            if r.status().is_success() {
                let ack: serde_json::Value = r.json().await.unwrap();
                return ack["status"].as_str().unwrap().to_owned();
            }
            assert!(
                !r.status().is_client_error(),
                "{} refused: {}",
                report.batch_id,
                r.text().await.unwrap()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} never acknowledged",
            report.batch_id
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn count(db_url: &str, sql: &str) -> i64 {
    let mut conn = sqlx::PgConnection::connect(db_url).await.unwrap();
    sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
}

const HOSTS: usize = 24;
const REPORTS_EACH: u64 = 12;

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_behind_a_load_balancer_lose_nothing_store_nothing_twice_and_run_jobs_once()
{
    let db = test_support::postgres().await;
    let dir = tempfile::tempdir().unwrap();
    let (posts, webhook) = slack_webhook("many").await;
    let config = dir.path().join("gpuledger.toml");
    std::fs::write(
        &config,
        format!(
            "[idle]\nduration = \"10m\"\n\n[slack]\ndefault_webhook = \"{webhook}\"\n\
             base_url = \"http://gpuledger.test\"\n"
        ),
    )
    .unwrap();
    let token = create_token(&db.url, "many", "many-*");
    let ports = [free_port(), free_port(), free_port()];
    let lb_port = free_port();
    let _lb = start_haproxy(dir.path(), lb_port, &ports);
    let lb = format!("http://127.0.0.1:{lb_port}");
    let env = [("GPULEDGER_ROLLUP_INTERVAL", "1s")];
    let mut servers = vec![start_server_env(&db.url, ports[0], Some(&config), &env).await];
    until_up(&format!("{lb}/healthz")).await;
    let client = reqwest::Client::new();

    // A host idle for the last 40 minutes, then two more replicas starting together.
    let now = gpuledger_server::clock::now_ms();
    let minute = now - now % 60_000;
    assert_eq!(
        deliver(&client, &lb, &token, &idle_report(minute, 40)).await,
        "stored"
    );
    let (second, third) = tokio::join!(
        start_server_env(&db.url, ports[1], Some(&config), &env),
        start_server_env(&db.url, ports[2], Some(&config), &env),
    );
    servers.push(second);
    servers.push(third);

    // Every host's reports through the balancer at once; every third one sent again (its
    // acknowledgement lost), to whichever replica the balancer picks. One replica stops half way.
    let acknowledged = Arc::new(AtomicU64::new(0));
    let t0 = now - now % WINDOW_MS;
    let tasks: Vec<_> = (0..HOSTS)
        .map(|host| {
            let (client, lb, token) = (client.clone(), lb.clone(), token.clone());
            let acknowledged = acknowledged.clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for seq in 0..REPORTS_EACH {
                    let start_ms = t0 - (REPORTS_EACH - seq) as i64 * WINDOW_MS;
                    let report = eight_gpu_report("many", host, seq, start_ms);
                    let first = deliver(&client, &lb, &token, &report).await;
                    let again = if seq % 3 == 0 {
                        Some(deliver(&client, &lb, &token, &report).await)
                    } else {
                        None
                    };
                    answers.push((report.batch_id, first, again));
                    acknowledged.fetch_add(1, Ordering::Relaxed);
                }
                answers
            })
        })
        .collect();
    let half = HOSTS as u64 * REPORTS_EACH / 2;
    let deadline = Instant::now() + Duration::from_secs(60);
    while acknowledged.load(Ordering::Relaxed) < half {
        assert!(Instant::now() < deadline, "half the reports never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped = servers[1].proc.terminate(Duration::from_secs(30));
    assert!(stopped.success(), "a replica stops cleanly: {stopped}");
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.unwrap());
    }
    let sent_once = HOSTS as u64 * REPORTS_EACH;
    assert_eq!(answers.len() as u64, sent_once);
    for (batch, first, again) in &answers {
        // A first answer lost with the stopping replica would make the one that follows it
        // "duplicate": the report was stored all the same.
        assert!(
            first == "stored" || first == "duplicate",
            "{batch}: {first}"
        );
        if let Some(again) = again {
            assert_eq!(again, "duplicate", "{batch} sent again is a repeat");
        }
    }
    let stored = answers.iter().filter(|a| a.1 == "stored").count() as u64;
    assert!(
        stored + 3 > sent_once,
        "{stored} of {sent_once} stored at first"
    );

    // Nothing lost, nothing twice: every window in the database once.
    let windows = count(
        &db.url,
        "SELECT COUNT(*) FROM gpu_windows w JOIN hosts h ON h.id = w.host_id
         WHERE h.hostname LIKE 'many-%'",
    )
    .await;
    assert_eq!(windows as u64, sent_once * u64::from(GPUS_PER_HOST));
    let batches = count(&db.url, "SELECT COUNT(*) FROM ingested_batches").await;
    assert_eq!(
        batches as u64,
        sent_once + 1,
        "one batch each, and the idle host's"
    );
    // Each replica took its share: the balancer spread them.
    for (i, port) in ports.iter().enumerate().filter(|(i, _)| *i != 1) {
        let metrics = page_text(&client, &format!("http://127.0.0.1:{port}/metrics")).await;
        let accepted = metrics
            .lines()
            .find_map(|l| l.strip_prefix("gpuledger_reports_accepted_total "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_default();
        assert!(accepted > 0.0, "replica {i} took no report");
    }

    // The roll-up, on whichever replica holds its lease, attributes every GPU-hour once.
    let expected_hours = (sent_once * u64::from(GPUS_PER_HOST) * WINDOW_MS as u64) as f64
        / 3_600_000.0
        + 2.0 * 40.0 / 60.0;
    let admin = signed_in_at(&lb, &db.url, "admin").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waiting = count(&db.url, "SELECT COUNT(*) FROM rollup_dirty_hours").await;
        let body = allocation_at(&admin, &lb, &around_now()).await;
        let hours: f64 = body["totals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["gpu_hours"].as_f64().unwrap())
            .sum();
        // The API writes GPU-hours to 4 decimals.
        if waiting == 0 && (hours - expected_hours).abs() < 1e-4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rolled up {hours} GPU-hours of {expected_hours}, {waiting} host-hours waiting"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The idle cluster is one incident and one message, sent once, though three replicas
    // evaluate and three send. The first replica holds the idle evaluation's lease from its
    // start (it renews it each minute), so the incident opens at its next minute.
    let deadline = Instant::now() + Duration::from_secs(100);
    while count(
        &db.url,
        "SELECT COUNT(*) FROM slack_messages WHERE status = 'sent'",
    )
    .await
        == 0
    {
        assert!(Instant::now() < deadline, "no Slack message was sent");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Two more rounds of the sender (every 5 s on each replica): a double send would show.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let incidents = count(&db.url, "SELECT COUNT(*) FROM incidents").await;
    assert_eq!(incidents, 1, "the idle cluster is one incident");
    let sent = count(
        &db.url,
        "SELECT COUNT(*) FROM slack_messages WHERE status = 'sent'",
    )
    .await;
    let opened = count(
        &db.url,
        "SELECT COUNT(*) FROM slack_messages WHERE event = 'opened'",
    )
    .await;
    assert_eq!(opened, 1, "the incident opened once");
    let posts = posts.lock().unwrap().clone();
    assert_eq!(
        posts.len() as i64,
        sent,
        "each message posted once: {posts:?}"
    );
    assert!(posts[0].to_string().contains("many-idle"), "{}", posts[0]);
}
