//! Harness for end-to-end tests: the real server and agent binaries, the fake NVML library,
//! real child processes whose environments carry owner labels, and a temp database.
// Each test binary uses part of this harness.
#![allow(dead_code, unused_imports)]

pub mod captures;
pub mod slurm;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use gpuledger_server::test_support::{self, TestDb};

/// `target/debug` (or whichever profile built this test).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

pub fn artifact(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` first (scripts/test does)",
        p.display()
    );
    p
}

/// A port free now and not handed out before in this test run: tests run side by side (each in
/// its own process under nextest), and the kernel may offer a just-released port twice, so two
/// servers would race for it and one test would talk to the other's server (and lose it when
/// that test ends). Each port given is claimed by creating a file named after it in a folder
/// of the run's (nextest's run id; the process where tests run without nextest).
pub fn free_port() -> u16 {
    static CLAIMS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let claims = CLAIMS.get_or_init(|| {
        let run =
            std::env::var("NEXTEST_RUN_ID").unwrap_or_else(|_| std::process::id().to_string());
        let dir = std::env::temp_dir().join(format!("gpuledger-test-ports-{run}"));
        std::fs::create_dir_all(&dir).expect("the folder of claimed ports");
        dir
    });
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let claim = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(claims.join(port.to_string()));
        match claim {
            Ok(_) => return port,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("claiming port {port} in {}: {e}", claims.display()),
        }
    }
}

/// A child process killed when dropped, so a failing test leaves nothing running.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGTERM, then wait up to `timeout` for a clean exit.
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process {} did not exit after SIGTERM",
                self.0.id()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A long-running process whose environment declares its owner, as serving or training code would.
pub fn labelled_process(labels: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new("sleep");
    cmd.arg("300").stdin(Stdio::null()).stdout(Stdio::null());
    for (k, v) in labels {
        cmd.env(k, v);
    }
    Proc(cmd.spawn().expect("spawn sleep"))
}

pub struct Server {
    pub proc: Proc,
    pub url: String,
    pub db_url: String,
}

pub fn server_cmd(db_url: &str) -> Command {
    let mut cmd = Command::new(artifact("gpuledger-server"));
    // Warnings only, unless a run asks for more (e.g. `sqlx::query=debug` for every
    // statement's time while profiling a benchmark).
    let log = std::env::var("GPULEDGER_TEST_SERVER_LOG").unwrap_or_else(|_| "warn".into());
    cmd.env("GPULEDGER_DATABASE_URL", db_url)
        .env("GPULEDGER_LOG", log)
        .stdin(Stdio::null());
    cmd
}

/// An agent token for `cluster` (a name or pattern) through the command line.
pub fn create_token(db_url: &str, name: &str, cluster: &str) -> String {
    let out = server_cmd(db_url)
        .args(["token", "create", "--name", name, "--cluster", cluster])
        .output()
        .expect("run token create");
    assert!(
        out.status.success(),
        "token create failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub async fn start_server(db_url: &str, port: u16) -> Server {
    start_server_with(db_url, port, None).await
}

/// [`start_server`] with a config file (`--config`).
pub async fn start_server_with(db_url: &str, port: u16, config: Option<&Path>) -> Server {
    start_server_env(db_url, port, config, &[]).await
}

/// [`start_server_with`] with more environment variables for the server.
pub async fn start_server_env(
    db_url: &str,
    port: u16,
    config: Option<&Path>,
    env: &[(&str, &str)],
) -> Server {
    let mut cmd = server_cmd(db_url);
    cmd.envs(env.iter().copied());
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")]);
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    let child = cmd.stdout(Stdio::null()).spawn().expect("spawn server");
    let server = Server {
        proc: Proc(child),
        url: format!("http://127.0.0.1:{port}"),
        db_url: db_url.to_owned(),
    };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let health = client.get(format!("{}/healthz", server.url)).send().await;
        if health.is_ok_and(|r| r.status().is_success()) {
            return server;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("server did not become healthy on port {port}");
}

pub struct AgentOptions<'a> {
    pub server: &'a str,
    pub token: &'a str,
    pub scenario: &'a Path,
    pub spool: &'a Path,
    pub cluster: &'a str,
    pub hostname: &'a str,
    /// Aggregation window, e.g. "1s".
    pub window: &'a str,
}

pub fn start_agent(o: &AgentOptions<'_>) -> Proc {
    Proc(agent_command(o).spawn().expect("spawn agent"))
}

/// The agent's command line for `o`, for tests that start it in a wrapper.
pub fn agent_command(o: &AgentOptions<'_>) -> Command {
    let mut cmd = Command::new(artifact("gpuledger-agent"));
    cmd.args(["run", "--server", o.server, "--token", o.token])
        .arg("--nvml-lib")
        .arg(artifact("libfake_nvml.so"))
        .arg("--spool-dir")
        .arg(o.spool)
        .args(["--cluster", o.cluster, "--hostname", o.hostname])
        .args([
            "--instance-id",
            "i-0e2e0000000000001",
            "--instance-type",
            "p4d.24xlarge",
            "--provider",
            "aws",
        ])
        .args(["--imds-endpoint", "off"])
        .args(["--sample-interval", "200ms", "--window", o.window])
        .args([
            "--retry-initial",
            "100ms",
            "--retry-max",
            "400ms",
            "--request-timeout",
            "2s",
        ])
        .args(["--label-env-keys", "MLFLOW_RUN_ID"])
        // A report per window, so a test sees each window as it closes; tests of reports of
        // several windows set the variable again.
        .env("GPULEDGER_REPORT_EVERY", o.window)
        .env("FAKE_NVML_SCENARIO", o.scenario)
        .env("GPULEDGER_LOG", "warn")
        .stdin(Stdio::null());
    cmd
}

/// A tool from the repository's Python environment (scripts/python-env makes it).
pub fn python_tool(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".venv/bin")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/python-env (scripts/test does)",
        p.display()
    );
    p
}

/// Runs a server subcommand against `db_url` and returns its stdout; panics with stderr on failure.
pub fn server_run(db_url: &str, args: &[&str]) -> String {
    let out = server_cmd(db_url)
        .args(args)
        .output()
        .expect("run server command");
    assert!(
        out.status.success(),
        "gpuledger-server {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of the first hidden `csrf` field in a page.
pub fn csrf_of(html: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let start = html
        .find(marker)
        .map(|i| i + marker.len())
        .expect("a csrf field");
    html[start..]
        .split('"')
        .next()
        .unwrap_or_default()
        .to_owned()
}

pub const TEST_PASSWORD: &str = "correct horse battery staple";

/// Adds a person with `role` through the command line and signs them in through the real
/// sign-in form; the client keeps the session cookie.
pub async fn signed_in(server: &Server, role: &str) -> reqwest::Client {
    signed_in_at(&server.url, &server.db_url, role).await
}

/// [`signed_in`] at `url` (a load balancer in front of servers of `db_url`, say).
pub async fn signed_in_at(url: &str, db_url: &str, role: &str) -> reqwest::Client {
    let username = format!("{role}-{}", free_port());
    let out = server_cmd(db_url)
        .args(["user", "add", &username, "--role", role])
        .env("GPULEDGER_PASSWORD", TEST_PASSWORD)
        .output()
        .expect("user add");
    assert!(
        out.status.success(),
        "user add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = format!("{url}/login");
    let html = client
        .get(&login)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let resp = client
        .post(&login)
        .form(&[
            ("username", username.as_str()),
            ("password", TEST_PASSWORD),
            ("csrf", &csrf_of(&html)),
            ("next", "/"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        reqwest::StatusCode::SEE_OTHER,
        "sign-in failed"
    );
    client
}

pub const GIB: u64 = 1 << 30;
/// The agent's default window.
pub const WINDOW_MS: i64 = 15_000;
pub const GPUS_PER_HOST: u32 = 8;

/// A report as the agent sends it by default: one 15 s window of 8 GPUs, each with one process
/// labelled with a model and a team. Names start with `prefix` (`GPU-{prefix}-{host}-{g}`).
pub fn eight_gpu_report(
    prefix: &str,
    host: usize,
    seq: u64,
    start_ms: i64,
) -> gpuledger_proto::Report {
    use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};
    Report {
        batch_id: format!("{prefix}-{host}-{seq}"),
        agent_version: prefix.into(),
        host: HostInfo {
            hostname: format!("{prefix}-{host:03}"),
            cluster: format!("{prefix}-{}", host % 10),
            ..Default::default()
        },
        windows: vec![Window {
            serving: Vec::new(),
            start_ms,
            end_ms: start_ms + WINDOW_MS,
            samples: 15,
            gpus: (0..GPUS_PER_HOST)
                .map(|g| GpuWindow {
                    uuid: format!("GPU-{prefix}-{host:03}-{g}"),
                    index: g,
                    name: "NVIDIA H100 80GB HBM3".into(),
                    memory_total_bytes: Some(80 * GIB),
                    memory_used_max_bytes: Some(40 * GIB),
                    util_avg: Some(40.0 + (host % 50) as f64),
                    util_max: Some(95.0),
                    mem_util_avg: Some(30.0),
                    power_avg_watts: Some(400.0),
                    temperature_max_c: Some(60.0),
                    energy_mj: Some(6_000_000),
                    processes: vec![ProcessWindow {
                        pid: 1000 + g,
                        name: Some("python3".into()),
                        memory_used_max_bytes: Some(40 * GIB),
                        sm_util_avg: Some(40.0),
                        labels: [
                            ("model".to_string(), format!("model-{}", host % 20)),
                            ("team".to_string(), format!("team-{}", host % 7)),
                        ]
                        .into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
        }],
    }
}

/// A local moto server (AWS services, S3 and Cost Explorer among them); its URL.
pub async fn start_moto() -> (Proc, String) {
    let port = free_port();
    // Killed and reaped when the returned guard drops.
    let moto = Proc(
        Command::new(python_tool("moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if reqwest::get(format!("{url}/moto-api/"))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return (moto, url);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("moto_server did not start");
}

/// Checks `text` with `promtool check metrics` (valid exposition, names and help as Prometheus's
/// conventions want them); panics with what promtool said.
pub fn assert_promtool_passes(text: &str) {
    use std::io::Write;
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus) must be installed; scripts/setup (run by scripts/test) installs it");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `from=…&to=…` for the hours around now, where an agent run by a test lands.
pub fn around_now() -> String {
    let now = gpuledger_server::clock::now_ms();
    let hour = now - now % 3_600_000;
    format!(
        "from={}&to={}",
        gpuledger_core::time::rfc3339(hour - 3_600_000),
        gpuledger_core::time::rfc3339(hour + 3_600_000)
    )
}

/// The body of `GET url` as `client` sees it.
pub async fn page_text(client: &reqwest::Client, url: &str) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}

/// `GET /api/v1/allocation?{query}` as `client` sees it: the answer and its rows by key.
pub async fn allocation_rows(
    client: &reqwest::Client,
    server: &Server,
    query: &str,
) -> (
    serde_json::Value,
    std::collections::BTreeMap<String, serde_json::Value>,
) {
    let body = allocation_at(client, &server.url, query).await;
    let rows = body["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|r| (r["key"].as_str().unwrap_or_default().to_owned(), r.clone()))
        .collect();
    (body, rows)
}

/// Slack message bodies a webhook served here received.
pub type SlackPosts = std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>;

/// A Slack incoming webhook: keeps each JSON body posted to it and answers 200 "ok". Its URL
/// ends in `name`.
pub async fn slack_webhook(name: &str) -> (SlackPosts, String) {
    let posts = SlackPosts::default();
    let kept = posts.clone();
    let app = axum::Router::new().fallback(move |body: axum::body::Bytes| {
        let kept = kept.clone();
        async move {
            if let Ok(v) = serde_json::from_slice(&body) {
                kept.lock().unwrap().push(v);
            }
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (posts, format!("http://{addr}/services/T/B/{name}"))
}

/// `GET {url}/api/v1/allocation?{query}` as `client` sees it (`url`: a server, or a load
/// balancer in front of several).
pub async fn allocation_at(client: &reqwest::Client, url: &str, query: &str) -> serde_json::Value {
    client
        .get(format!("{url}/api/v1/allocation?{query}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
