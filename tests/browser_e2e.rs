//! The README's run command in a real browser: `gpuledger-server demo` serves its simulated
//! fleet, headless Chromium (through chromedriver) signs in, reads the monthly review, follows a
//! model to its drill-down, and saves screenshots and a printed PDF of the review.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/setup`, run by `scripts/test`, installs them);
//! `GPULEDGER_CHROMIUM` and `GPULEDGER_CHROMEDRIVER` point elsewhere.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use support::{artifact, free_port, Proc};

fn tool(env: &str, default: &str) -> PathBuf {
    let p = PathBuf::from(std::env::var(env).unwrap_or_else(|_| default.to_owned()));
    assert!(
        p.exists(),
        "{} is missing: install Debian's chromium and chromium-driver (scripts/setup does), or set {env}",
        p.display()
    );
    p
}

/// Starts the demo and returns it with its URL and the demo password it printed.
fn start_demo(dir: &Path) -> (Proc, String, String) {
    let port = free_port();
    let mut child = Command::new(artifact("gpuledger-server"))
        .arg("demo")
        .arg("--demo-db")
        .arg(dir.join("demo.db"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("GPULEDGER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn demo");
    let stdout = child.stdout.take().unwrap();
    let proc = Proc(child);
    // "demo: sign in as  demo / PASSWORD" comes once the fleet is simulated.
    let (tx, rx) = std::sync::mpsc::channel();
    // Keep reading to the end: a closed pipe would end the server at its next line of output.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("demo / ").nth(1) {
                let _ = tx.send(rest.trim().to_owned());
            }
        }
    });
    let password = rx
        .recv_timeout(Duration::from_secs(300))
        .expect("the demo printed no credentials");
    (proc, format!("http://127.0.0.1:{port}"), password)
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
    let (_demo, url, password) = start_demo(dir.path());
    wait_healthy(&format!("{url}/healthz")).await;
    let (_driver, driver_url) = start_chromedriver(&driver);
    wait_healthy(&format!("{driver_url}/status")).await;
    let c = browser(&driver_url, &chromium, &dir.path().join("profile")).await;
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();

    // The review asks for sign-in first, then comes back.
    c.goto(&format!("{url}/review")).await.unwrap();
    assert_eq!(text_of(&c, "h1").await, "Sign in");
    c.find(Locator::Css("input[name=username]"))
        .await
        .unwrap()
        .send_keys("demo")
        .await
        .unwrap();
    c.find(Locator::Css("input[name=password]"))
        .await
        .unwrap()
        .send_keys(&password)
        .await
        .unwrap();
    c.find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
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
        .find_all(Locator::Css("svg.heatmap rect"))
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
    std::fs::write(shots.join("review.png"), c.screenshot().await.unwrap()).unwrap();
    let pdf = c.print(Default::default()).await.unwrap();
    assert!(pdf.starts_with(b"%PDF"), "printing gives a PDF");
    std::fs::write(shots.join("review.pdf"), pdf).unwrap();

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
    eprintln!("screenshots and PDF in {}", shots.display());
    c.close().await.unwrap();
}
