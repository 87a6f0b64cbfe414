//! The README's run command in a real browser: `gpuledger-server demo` serves its simulated
//! fleet, headless Chromium (through chromedriver) signs in, reads the monthly review, follows a
//! model to its drill-down, and saves screenshots and a printed PDF of the review. Then every
//! page, at 1280 px and with a host and labels far longer than any column, is checked for
//! elements that overflow their box, and screenshotted (`docs/screenshots/` holds a copy). The
//! demo posts to a Slack webhook served here: one message per incident (the idle cluster, each
//! notebook host), each naming its GPUs, within a minute or so of starting.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/setup`, run by `scripts/test`, installs them);
//! `GPULEDGER_CHROMIUM` and `GPULEDGER_CHROMEDRIVER` point elsewhere.

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::Datelike;
use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};
use support::{artifact, free_port, slack_webhook, Proc};

fn tool(env: &str, default: &str) -> PathBuf {
    let p = PathBuf::from(std::env::var(env).unwrap_or_else(|_| default.to_owned()));
    assert!(
        p.exists(),
        "{} is missing: install Debian's chromium and chromium-driver (scripts/setup does), or set {env}",
        p.display()
    );
    p
}

/// The demo as started: its process, URL, the password it printed and its sandbox token.
struct Demo {
    _proc: Proc,
    url: String,
    password: String,
    sandbox_token: String,
}

/// Starts the demo (with `config`, if any) and returns it with its URL, password and sandbox
/// agent token.
fn start_demo(dir: &Path, config: Option<&Path>) -> Demo {
    let port = free_port();
    let mut command = Command::new(artifact("gpuledger-server"));
    if let Some(c) = config {
        command.arg("demo").arg("--config").arg(c);
    } else {
        command.arg("demo");
    }
    let mut child = command
        .arg("--demo-db")
        .arg(dir.join("demo.db"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("GPULEDGER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("demo.stderr")).expect("demo's stderr file"))
        .spawn()
        .expect("spawn demo");
    let stdout = child.stdout.take().unwrap();
    let proc = Proc(child);
    // "demo: agent token for trying ingest yourself (cluster "sandbox"): gpl_…", then
    // "demo: sign in as  demo / PASSWORD" once the fleet is simulated.
    let (tx, rx) = std::sync::mpsc::channel();
    // Keep reading to the end: a closed pipe would end the server at its next line of output.
    std::thread::spawn(move || {
        let mut token = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("(cluster \"sandbox\")") {
                token = line.rsplit(' ').next().unwrap_or_default().to_owned();
            }
            if let Some(rest) = line.split("demo / ").nth(1) {
                let _ = tx.send((rest.trim().to_owned(), token.clone()));
            }
        }
    });
    let (password, sandbox_token) = rx
        .recv_timeout(Duration::from_secs(300))
        .expect("the demo printed no credentials");
    // Seeding said how far it got (stderr is no terminal: plain lines, no bar) and ended with
    // a summary, before the credentials.
    let said = std::fs::read_to_string(dir.join("demo.stderr")).unwrap_or_default();
    assert!(
        said.lines()
            .any(|l| l.starts_with("demo: ") && l.contains(" host-days so far)")),
        "{said}"
    );
    assert!(
        said.contains("demo: simulated this month and the last for a fleet in "),
        "{said}"
    );
    assert!(
        sandbox_token.starts_with("gpl_"),
        "sandbox token: {sandbox_token:?}"
    );
    Demo {
        _proc: proc,
        url: format!("http://127.0.0.1:{port}"),
        password,
        sandbox_token,
    }
}

/// Longer than any column: a host name and owner labels at the 256-byte limit, with no
/// space to break at.
fn long_name(prefix: &str) -> String {
    let mut name = prefix.to_owned();
    while name.len() < 250 {
        name.push_str("-very-long-name");
    }
    name.truncate(250);
    name
}

/// A report from the sandbox cluster with a host and labels as long as ingest allows, for the
/// last five minutes (the demo rolls it up within a minute).
async fn post_long_names(url: &str, token: &str) {
    let end = chrono::Utc::now().timestamp_millis() / 60_000 * 60_000;
    let start = end - 5 * 60_000;
    let labels = [
        ("model", long_name("model")),
        ("team", long_name("team")),
        ("experiment", long_name("experiment")),
        ("endpoint", long_name("endpoint")),
    ];
    let report = Report {
        batch_id: "long-names".into(),
        agent_version: "test".into(),
        host: HostInfo {
            hostname: long_name("host"),
            cluster: "sandbox".into(),
            provider: Some("aws".into()),
            instance_id: Some("i-0long".into()),
            instance_type: Some("g5.xlarge".into()),
            region: Some("us-east-1".into()),
            lifecycle: None,
        },
        windows: vec![Window {
            serving: Vec::new(),
            start_ms: start,
            end_ms: end,
            samples: 300,
            gpus: vec![GpuWindow {
                uuid: "GPU-long-names-0".into(),
                index: 0,
                name: "NVIDIA A10G".into(),
                memory_total_bytes: Some(24 << 30),
                memory_used_max_bytes: Some(12 << 30),
                util_avg: Some(70.0),
                util_max: Some(90.0),
                processes: vec![ProcessWindow {
                    pid: 4242,
                    name: Some(long_name("python")),
                    memory_used_max_bytes: Some(12 << 30),
                    sm_util_avg: Some(65.0),
                    labels: labels.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }],
    };
    let resp = reqwest::Client::new()
        .post(format!("{url}/api/v1/reports"))
        .bearer_auth(token)
        .json(&report)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    assert!(
        status.is_success(),
        "{status}: {}",
        resp.text().await.unwrap()
    );
}

/// Every element whose box reaches outside its parent's (where the parent does not clip or
/// scroll), and the page's own width: what a reader would see spill over a column or the
/// window. SVG internals are left to their SVG.
const OVERFLOWING: &str = r#"
const out = [];
const doc = document.documentElement;
if (doc.scrollWidth > window.innerWidth) out.push(`page ${doc.scrollWidth}px wide in ${window.innerWidth}px`);
for (const e of document.body.querySelectorAll('*')) {
  if (e.closest('svg') && e.tagName.toLowerCase() !== 'svg') continue;
  const p = e.parentElement;
  if (!p || getComputedStyle(p).overflowX !== 'visible') continue;
  const r = e.getBoundingClientRect(), pr = p.getBoundingClientRect();
  if (r.width === 0 || r.height === 0) continue;
  if (r.right > pr.right + 1 || r.left < pr.left - 1) {
    out.push(`${e.tagName.toLowerCase()}.${e.className.baseVal ?? e.className} in ${p.tagName.toLowerCase()}.${p.className.baseVal ?? p.className}: ${Math.round(r.right - pr.right)}px over ("${(e.textContent || '').trim().slice(0, 40)}")`);
  }
}
return out;
"#;

/// Switches the page's CSS media to `print` (or back to `screen`) through chromedriver's
/// DevTools endpoint, so the print stylesheet can be checked like the screen one.
async fn emulate_media(c: &Client, driver_url: &str, media: &str) {
    let session = c.session_id().await.unwrap().unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{driver_url}/session/{session}/goog/cdp/execute"))
        .json(&serde_json::json!({
            "cmd": "Emulation.setEmulatedMedia",
            "params": { "media": media },
        }))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
}

/// Opens `path` as printed on A4 (a 700 px wide page: 210 mm less 12 mm margins at 96 dpi) and
/// asserts nothing overflows its box there either.
async fn fits_in_print(c: &Client, driver_url: &str, url: &str, path: &str) {
    emulate_media(c, driver_url, "print").await;
    c.set_window_size(700, 900).await.unwrap();
    c.goto(&format!("{url}{path}")).await.unwrap();
    text_of(c, "h1").await;
    let found = c.execute(OVERFLOWING, vec![]).await.unwrap();
    let found: Vec<String> = serde_json::from_value(found).unwrap();
    emulate_media(c, driver_url, "screen").await;
    c.set_window_size(1280, 900).await.unwrap();
    assert!(found.is_empty(), "{path} printed: {found:#?}");
}

/// Opens `path`, waits for its heading, asserts nothing overflows, and saves a screenshot.
async fn fits_at_1280(c: &Client, url: &str, path: &str, shot: &Path) {
    c.goto(&format!("{url}{path}")).await.unwrap();
    text_of(c, "h1").await;
    let found = c.execute(OVERFLOWING, vec![]).await.unwrap();
    let found: Vec<String> = serde_json::from_value(found).unwrap();
    assert!(found.is_empty(), "{path} at 1280 px: {found:#?}");
    std::fs::write(shot, c.screenshot().await.unwrap()).unwrap();
}

fn start_chromedriver(driver: &Path) -> (Proc, String) {
    let port = free_port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn chromedriver");
    (Proc(child), format!("http://127.0.0.1:{port}"))
}

async fn wait_healthy(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let client = reqwest::Client::new();
    while Instant::now() < deadline {
        if client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{url} did not answer");
}

async fn browser(driver_url: &str, chromium: &Path, profile: &Path) -> Client {
    let mut caps = Capabilities::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            // No sandbox as root in a container; no background connections on a closed network.
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1400,1800",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(driver_url)
        .await
        .expect("start a Chromium session")
}

/// Fills in the sign-in form on the page and sends it.
async fn submit_sign_in(c: &Client, username: &str, password: &str) {
    for (field, value) in [("username", username), ("password", password)] {
        c.find(Locator::Css(&format!("input[name={field}]")))
            .await
            .unwrap()
            .send_keys(value)
            .await
            .unwrap();
    }
    c.find(Locator::Css("main button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn text_of(c: &Client, css: &str) -> String {
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_finance_lead_signs_in_reads_the_review_and_drills_down() {
    let chromium = tool("GPULEDGER_CHROMIUM", "/usr/bin/chromium");
    let driver = tool("GPULEDGER_CHROMEDRIVER", "/usr/bin/chromedriver");
    let dir = tempfile::tempdir().unwrap();
    let (posts, webhook) = slack_webhook("demo").await;
    let config = dir.path().join("gpuledger.toml");
    std::fs::write(
        &config,
        format!("[slack]\ndefault_webhook = \"{webhook}\"\nbase_url = \"http://demo.test\"\n"),
    )
    .unwrap();
    let demo = start_demo(dir.path(), Some(&config));
    let (url, password) = (demo.url.clone(), demo.password.clone());
    wait_healthy(&format!("{url}/healthz")).await;
    post_long_names(&url, &demo.sandbox_token).await;
    let (_driver, driver_url) = start_chromedriver(&driver);
    wait_healthy(&format!("{driver_url}/status")).await;
    let c = browser(&driver_url, &chromium, &dir.path().join("profile")).await;
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();

    // The review asks for sign-in first, then comes back.
    c.goto(&format!("{url}/review")).await.unwrap();
    assert_eq!(text_of(&c, "h1").await, "Sign in");
    submit_sign_in(&c, "demo", &password).await;
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let review = format!("{url}/review/{month}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.current_url().await.unwrap().as_str() != review {
        assert!(
            Instant::now() < deadline,
            "signed in and back on the review"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(text_of(&c, "h1").await, format!("GPU review: {month}"));

    // The stylesheet applied under the Content-Security-Policy, the charts drew.
    let display = c
        .execute(
            "return getComputedStyle(document.querySelector('section.headline')).display",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(display, "grid", "the stylesheet is in force");
    let cells = c
        .find_all(Locator::Css("svg.heatmap:not(.week) rect"))
        .await
        .unwrap()
        .len();
    assert!(cells > 100, "heatmap cells: {cells}");
    assert!(
        c.find_all(Locator::Css("svg.chart rect.used"))
            .await
            .unwrap()
            .len()
            >= 20
    );
    let models: Vec<String> = {
        let mut out = Vec::new();
        for a in c
            .find_all(Locator::Css("table.spend[data-by=model] td.key a"))
            .await
            .unwrap()
        {
            out.push(a.text().await.unwrap());
        }
        out
    };
    assert!(models.iter().any(|m| m == "llama-70b-ft"), "{models:?}");
    assert!(!text_of(&c, "table.endpoints").await.is_empty());
    // The savings plan bought for nine training hosts, eight left: its utilization, and the
    // training type wholly covered.
    assert_eq!(
        text_of(&c, "table.commitments td.utilization").await,
        "88.9%"
    );
    assert!(
        text_of(&c, "table.coverage").await.contains("p4d.24xlarge"),
        "coverage per GPU instance type"
    );
    // The week's shape per instance type: a 7 × 24 heatmap each, the floor against the peak.
    let week_cells = c
        .find_all(Locator::Css("section.shape svg.week rect"))
        .await
        .unwrap()
        .len();
    assert!(
        week_cells >= 3 * 168 && week_cells % 168 == 0,
        "{week_cells}"
    );
    assert!(text_of(&c, "section.shape").await.contains("floor"));
    // And what buying it each way would have cost: the training type committed is cheapest.
    let mix = text_of(&c, "table.purchase-mix").await;
    assert!(
        mix.contains("p4d.24xlarge") && mix.contains("(cheapest)") && mix.contains("$"),
        "{mix}"
    );
    // The reranker nobody calls at night or at weekends: its windows and what they cost, once
    // the month has three weeks of them; before, the page says it is too soon to tell.
    let day_of_month: u32 = chrono::Utc::now().format("%d").to_string().parse().unwrap();
    if day_of_month <= 21 {
        let soon = text_of(&c, "p.too-soon").await;
        assert!(soon.contains("Too soon to tell"), "{soon}");
    }
    std::fs::write(shots.join("review.png"), c.screenshot().await.unwrap()).unwrap();
    let pdf = c.print(Default::default()).await.unwrap();
    assert!(pdf.starts_with(b"%PDF"), "printing gives a PDF");
    std::fs::write(shots.join("review.pdf"), pdf).unwrap();
    // The month before, whole: the reranker's windows.
    let last_month = (chrono::Utc::now().date_naive().with_day(1).unwrap() - chrono::Days::new(1))
        .format("%Y-%m")
        .to_string();
    c.goto(&format!("{url}/review/{last_month}")).await.unwrap();
    let quiet = text_of(&c, "table.scale-to-zero").await;
    assert!(
        quiet.contains("endpoint: rerank") && quiet.contains("Fri 20:00 – Mon 08:00 UTC"),
        "{quiet}"
    );
    c.goto(&review).await.unwrap();
    assert_eq!(text_of(&c, "h1").await, format!("GPU review: {month}"));

    // Follow the training model to its page.
    let model = "llama-70b-ft";
    c.find(Locator::LinkText(model))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The click navigates: wait for the new page's heading (the old one may go stale).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut heading = String::new();
    while !heading.starts_with("model") && Instant::now() < deadline {
        if let Ok(h1) = c.find(Locator::Css("h1")).await {
            heading = h1.text().await.unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        heading.contains(model) && heading.starts_with("model"),
        "{heading}"
    );
    assert!(
        !c.find_all(Locator::Css("table.runs tbody tr"))
            .await
            .unwrap()
            .is_empty(),
        "its training runs"
    );
    assert!(!c
        .find_all(Locator::Css("table.spend[data-by=host] tbody tr"))
        .await
        .unwrap()
        .is_empty());
    std::fs::write(shots.join("drilldown.png"), c.screenshot().await.unwrap()).unwrap();

    // Yesterday's load test is on its month's review, with the hosts that drove it.
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1))
        .format("%Y-%m")
        .to_string();
    c.set_window_size(1280, 900).await.unwrap();
    c.goto(&format!("{url}/review/{yesterday}#anomalies"))
        .await
        .unwrap();
    let anomalies = text_of(&c, "table.anomalies").await;
    assert!(
        anomalies.contains("team applied") && anomalies.contains("scratch-0"),
        "{anomalies}"
    );
    std::fs::write(
        shots.join("review-anomalies.png"),
        c.screenshot().await.unwrap(),
    )
    .unwrap();

    // Every page at 1280 px, once the long names are rolled up into this month.
    c.set_window_size(1280, 900).await.unwrap();
    let long_model = long_name("model");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        c.goto(&review).await.unwrap();
        let keys = c
            .find_all(Locator::Css("table.spend[data-by=model] td.key a"))
            .await
            .unwrap();
        let mut found = false;
        for k in keys {
            found |= k.attr("title").await.unwrap().as_deref() == Some(long_model.as_str());
        }
        if found {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the long names never reached the review"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let previous = (chrono::Utc::now().date_naive().with_day(1).unwrap() - chrono::Days::new(1))
        .format("%Y-%m")
        .to_string();
    let pages = [
        ("fleet", "/".to_owned()),
        ("review", format!("/review/{month}")),
        ("review-previous", format!("/review/{previous}")),
        ("model", format!("/review/{month}/model?key={long_model}")),
        (
            "cluster",
            format!("/review/{previous}/cluster?key=train-east"),
        ),
        (
            "host",
            format!("/review/{month}/host?key={}", long_name("host")),
        ),
        ("incidents", "/incidents".to_owned()),
        ("recommendations", "/recommendations".to_owned()),
        ("alerts", "/alerts".to_owned()),
        ("billing", "/billing".to_owned()),
        ("reconciliation", format!("/billing/{previous}")),
        ("budgets", "/budgets".to_owned()),
        ("tokens", "/tokens".to_owned()),
        ("users", "/users".to_owned()),
        ("account", "/account".to_owned()),
    ];
    for (name, path) in &pages {
        fits_at_1280(&c, &url, path, &shots.join(format!("{name}.png"))).await;
    }
    // The pages a finance lead prints: the reviews, a drill-down, the reconciliation.
    for (name, path) in &pages {
        if [
            "review",
            "review-previous",
            "cluster",
            "reconciliation",
            "budgets",
        ]
        .contains(name)
        {
            fits_in_print(&c, &driver_url, &url, path).await;
        }
    }
    // One incident's page: the demo opens its idle incidents within a minute of starting.
    let deadline = Instant::now() + Duration::from_secs(120);
    let incident = loop {
        c.goto(&format!("{url}/incidents")).await.unwrap();
        let href = c
            .execute(
                "const a = document.querySelector('td a[href^=\"/incidents/\"]'); return a ? a.getAttribute('href') : null",
                vec![],
            )
            .await
            .unwrap();
        if let Some(h) = href.as_str() {
            break h.to_owned();
        }
        assert!(Instant::now() < deadline, "no incident on /incidents");
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    fits_at_1280(&c, &url, &incident, &shots.join("incident.png")).await;

    // Slack: one message per incident, never one per GPU or process, each naming its GPUs.
    let deadline = Instant::now() + Duration::from_secs(120);
    let headers = loop {
        let headers: Vec<String> = posts
            .lock()
            .unwrap()
            .iter()
            .map(|p| {
                p["blocks"][0]["text"]["text"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect();
        let cluster = headers.iter().any(|h| h == "Idle cluster: scratch");
        let notebooks = headers
            .iter()
            .filter(|h| h.starts_with("GPU held idle: train-east"))
            .count();
        // The demo's serving team has a budget below last month's spend: its forecast is past it.
        let budget = headers
            .iter()
            .any(|h| h == "Budget heading to 100%: team applied");
        // Serving's load test on the idle cluster yesterday: a spend spike, heard of at once.
        let spike = headers.iter().any(|h| h == "Spend spike: team applied");
        if cluster && notebooks >= 2 && budget && spike {
            break headers;
        }
        assert!(
            Instant::now() < deadline,
            "Slack got no message for the idle cluster, both notebook hosts, the serving \
             team's budget and its spend spike: {headers:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let mut unique = headers.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        headers.len(),
        "one message per incident: {headers:?}"
    );
    // The notebook hosts; at night and at weekends also the reranker's four hosts, one each.
    assert_eq!(
        headers
            .iter()
            .filter(|h| h.starts_with("GPU held idle: train-east"))
            .count(),
        2,
        "{headers:?}"
    );
    assert!(
        headers
            .iter()
            .filter(|h| h.starts_with("GPU held idle:"))
            .all(|h| h.contains("train-east") || h.contains("serve-eu")),
        "{headers:?}"
    );
    for p in posts.lock().unwrap().iter() {
        if p["blocks"][0]["text"]["text"]
            .as_str()
            .is_some_and(|h| h.starts_with("Budget"))
        {
            continue; // about money, not GPUs
        }
        if p["blocks"][0]["text"]["text"]
            .as_str()
            .is_some_and(|h| h.starts_with("Spend spike"))
        {
            // About money, driven by GPUs: the load test's hosts and what ran there.
            let drivers = p["blocks"][3]["text"]["text"].as_str().unwrap_or("");
            assert!(
                drivers.starts_with("*Driven by") && drivers.contains("scratch-0"),
                "{p}"
            );
            continue;
        }
        let gpus = p["blocks"][2]["text"]["text"].as_str().unwrap_or("");
        assert!(gpus.starts_with("*Which GPUs:*"), "{p}");
        if p["blocks"][0]["text"]["text"] == "Idle cluster: scratch" {
            assert!(gpus.contains("scratch-00: GPU #0, #1, #2"), "{gpus}");
        } else if p["blocks"][0]["text"]["text"]
            .as_str()
            .is_some_and(|h| h.starts_with("GPU held idle: train-east"))
        {
            assert!(gpus.contains("jupyter-kernel, user maria"), "{gpus}");
        } else if p["blocks"][0]["text"]["text"]
            .as_str()
            .is_some_and(|h| h.starts_with("GPU held idle:"))
        {
            assert!(gpus.contains("python3, user svc-serve"), "{gpus}");
        }
    }
    // A team lead signs in and sees their team's month only: the other teams' budgets are
    // not there, and the pages that cover every team are not offered.
    c.goto(&format!("{url}/account")).await.unwrap();
    c.find(Locator::Css("form.who button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.goto(&format!("{url}/login")).await.unwrap();
    submit_sign_in(&c, "applied-lead", &password).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.current_url().await.unwrap().as_str() != format!("{url}/") {
        assert!(
            Instant::now() < deadline,
            "the team lead lands on the fleet"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Their hosts now: the serving clusters', never the training ones.
    let fleet = text_of(&c, "main").await;
    assert!(
        fleet.contains("serve-") && !fleet.contains("train-east"),
        "{fleet}"
    );
    std::fs::write(shots.join("fleet-team.png"), c.screenshot().await.unwrap()).unwrap();
    c.goto(&review).await.unwrap();
    assert_eq!(
        text_of(&c, "h1").await,
        format!("GPU review: {month} · applied")
    );
    let teams = text_of(&c, "table.spend[data-by=team]").await;
    assert!(
        teams.contains("applied") && !teams.contains("foundation"),
        "{teams}"
    );
    std::fs::write(shots.join("review-team.png"), c.screenshot().await.unwrap()).unwrap();
    // Yesterday's spike is the team's: on its review, with what drove it.
    c.goto(&format!("{url}/review/{yesterday}#anomalies"))
        .await
        .unwrap();
    let anomalies = text_of(&c, "table.anomalies").await;
    assert!(
        anomalies.contains("team applied") && anomalies.contains("scratch-0"),
        "{anomalies}"
    );
    c.goto(&format!("{url}/budgets")).await.unwrap();
    let budgets = text_of(&c, "table.budgets").await;
    assert!(
        budgets.contains("applied") && !budgets.contains("foundation"),
        "{budgets}"
    );
    let menu = text_of(&c, "header nav").await;
    assert!(
        !menu.contains("Billing") && menu.contains("Budgets"),
        "{menu}"
    );
    std::fs::write(
        shots.join("budgets-team.png"),
        c.screenshot().await.unwrap(),
    )
    .unwrap();
    c.goto(&format!("{url}/billing")).await.unwrap();
    assert_eq!(text_of(&c, "h1").await, "Every team's figures");

    eprintln!("screenshots and PDF in {}", shots.display());
    c.close().await.unwrap();
}
