//! The cost gauges where people graph them: the real server on the demo's ledger, scraped by a
//! real Prometheus (Debian's package) with a read-only token. promtool passes the exposition,
//! Prometheus answers idle dollars per team as the server computed them, and every query of the
//! Grafana dashboard in `deploy/grafana/` runs there (those of gpuledger's own metrics with data).

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// The dashboard as committed.
fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/gpuledger-cost.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Each panel's title with its queries, the dashboard's variables filled as "All" fills them.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap().replace("$team", ".*");
            out.push((p["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    out
}

/// What Grafana needs of a dashboard to import it, and what keeps it usable beside
/// dcgm-exporter's: unique panel ids, each panel placed on the 24-column grid, every query on
/// the chosen Prometheus, a team variable read from the gauges.
#[test]
fn the_dashboard_is_one_grafana_imports() {
    let d = dashboard();
    for field in ["title", "uid", "schemaVersion", "panels", "templating"] {
        assert!(!d[field].is_null(), "no {field}");
    }
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    let panels = d["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let known = ["stat", "timeseries", "bargauge", "table"];
    for p in panels {
        let title = p["title"].as_str().unwrap();
        assert!(known.contains(&p["type"].as_str().unwrap()), "{title}");
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(x + w <= 24 && g["h"].as_u64().unwrap() > 0, "{title}: {g}");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}");
        let refs: BTreeSet<&str> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds are unique");
    }
    let vars = d["templating"]["list"].as_array().unwrap();
    let names: Vec<&str> = vars.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["datasource", "team"]);
    // It joins dcgm-exporter's GPUs on the label both carry.
    assert!(queries(&d)
        .iter()
        .any(|(_, q)| q.contains("DCGM_FI_DEV_GPU_UTIL") && q.contains("UUID")));
}

/// A Prometheus server scraping `target` every second with `token`.
struct Prometheus {
    _proc: Proc,
    _dir: tempfile::TempDir,
    url: String,
}

fn start_prometheus(target: &str, token: &str) -> Prometheus {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpuledger\n    \
             authorization:\n      credentials: {token}\n    static_configs:\n      - targets: \
             ['{target}']\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(
            "prometheus (Debian package prometheus) must be installed; scripts/setup installs it",
        );
    Prometheus {
        _proc: Proc(child),
        _dir: dir,
        url: format!("http://127.0.0.1:{port}"),
    }
}

/// An instant query's result, or Prometheus's error.
async fn query(prom: &Prometheus, q: &str) -> Result<Vec<Value>, String> {
    let resp = reqwest::Client::new()
        .get(format!("{}/api/v1/query", prom.url))
        .query(&[("query", q)])
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let v: Value = resp.json().await.map_err(|e| e.to_string())?;
    if v["status"] != "success" {
        return Err(v.to_string());
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// The sum per team of the `state`s of the month, from the server's own exposition.
fn idle_per_team(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("gpuledger_cost_month_to_date{"))
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        if !(series.contains("state=\"idle\"") || series.contains("state=\"held_idle\"")) {
            continue;
        }
        let team = series
            .split("team=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default();
        *out.entry(team.to_owned()).or_insert(0.0) += value.parse::<f64>().unwrap();
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_graphs_idle_dollars_per_team_from_the_demo() {
    let db = test_support::sqlite();
    let store = db.open().await;
    let now = gpuledger_server::clock::now_ms();
    gpuledger_server::demo::seed(
        store.as_ref(),
        &gpuledger_core::ratecard::RateCard::default_card(),
        &Default::default(),
        now,
    )
    .await
    .unwrap();
    drop(store);
    let token = server_run(&db.url, &["read-token", "create", "grafana"])
        .trim()
        .to_owned();
    let server = start_server(&db.url, free_port()).await;
    let text = reqwest::Client::new()
        .get(format!("{}/metrics", server.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("gpuledger_cost_month_to_date{"), "{text}");

    // promtool: valid exposition, names and help as Prometheus's conventions want them.
    assert_promtool_passes(&text);

    let expected = idle_per_team(&text);
    assert!(
        expected.iter().any(|(t, v)| !t.is_empty() && *v > 0.0),
        "a demo team holds GPUs idle: {expected:?}"
    );
    let prom = start_prometheus(server.url.trim_start_matches("http://"), &token);
    let per_team = "sum by (team) (max without (instance, pod) \
                    (gpuledger_cost_month_to_date{state=~\"idle|held_idle\"}))";
    let deadline = Instant::now() + Duration::from_secs(60);
    let got: BTreeMap<String, f64> = loop {
        if let Ok(result) = query(&prom, per_team).await {
            if !result.is_empty() {
                break result
                    .iter()
                    .map(|r| {
                        let team = r["metric"]["team"].as_str().unwrap_or_default().to_owned();
                        let v: f64 = r["value"][1].as_str().unwrap().parse().unwrap();
                        (team, v)
                    })
                    .collect();
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus scraped nothing: {:?}",
            query(&prom, "up").await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (team, v) in &expected {
        // The server renders within seconds of each scrape; the ledger changes hourly.
        assert!((got[team] - v).abs() < 0.01, "{team}: {} vs {v}", got[team]);
    }

    // Every query of the dashboard runs; those of gpuledger's metrics alone have data.
    for (title, q) in queries(&dashboard()) {
        let result = query(&prom, &q)
            .await
            .unwrap_or_else(|e| panic!("{title}: {q}: {e}"));
        if !q.contains("DCGM_") {
            assert!(!result.is_empty(), "{title}: {q} has no data on the demo");
        }
    }
}
