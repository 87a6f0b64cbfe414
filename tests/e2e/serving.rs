//! Cost per token from the serving engine itself: the agent reads a vLLM server's `/metrics`
//! (served here exactly as vLLM writes it) each window, the server stores what its counters
//! rose by with the reports, and `GET /api/v1/usage` divides the endpoint's cost by them. An
//! engine that is down is said so by `once`, and the daemon goes on.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rust_decimal::Decimal;
use serde_json::{json, Value};
use support::*;

const GIB: u64 = 1 << 30;
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// vLLM's V1 counters as prometheus_client writes them: prompt and generation tokens, and
/// requests by how they finished, each with its `_created` gauge.
fn vllm_metrics(prompt: u64, generated: u64, stop: u64, aborted: u64) -> String {
    let labels = format!("engine=\"0\",model_name=\"{MODEL}\"");
    let created = "1.7537953269354987e+09";
    format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{{labels}}} 1.0\n\
         # HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n\
         # TYPE vllm:prompt_tokens_total counter\n\
         vllm:prompt_tokens_total{{{labels}}} {prompt}.0\n\
         # HELP vllm:prompt_tokens_created Number of prefill tokens processed.\n\
         # TYPE vllm:prompt_tokens_created gauge\n\
         vllm:prompt_tokens_created{{{labels}}} {created}\n\
         # HELP vllm:generation_tokens_total Number of generation tokens processed.\n\
         # TYPE vllm:generation_tokens_total counter\n\
         vllm:generation_tokens_total{{{labels}}} {generated}.0\n\
         # HELP vllm:generation_tokens_created Number of generation tokens processed.\n\
         # TYPE vllm:generation_tokens_created gauge\n\
         vllm:generation_tokens_created{{{labels}}} {created}\n\
         # HELP vllm:request_success_total Count of successfully processed requests.\n\
         # TYPE vllm:request_success_total counter\n\
         vllm:request_success_total{{engine=\"0\",finished_reason=\"abort\",model_name=\"{MODEL}\"}} {aborted}.0\n\
         vllm:request_success_total{{engine=\"0\",finished_reason=\"length\",model_name=\"{MODEL}\"}} 0.0\n\
         vllm:request_success_total{{engine=\"0\",finished_reason=\"stop\",model_name=\"{MODEL}\"}} {stop}.0\n"
    )
}

/// A vLLM server's metrics endpoint serving whatever `body` holds.
async fn engine(body: Arc<Mutex<String>>) -> String {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = body.lock().unwrap().clone();
            async move { text }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_reads_vllms_token_counters_into_cost_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let chat = labelled_process(&[
        ("GPULEDGER_ENDPOINT", "chat-api"),
        ("GPULEDGER_TEAM", "serving"),
    ]);
    let scenario = dir.path().join("serving.json");
    let fleet = json!({ "gpus": [{
        "model": "NVIDIA L4", "uuid": "GPU-serving-e2e-0",
        "power_mw": 60_000, "temperature_c": 50, "energy_start_mj": 0,
        "phases": [{ "gpu_util": 60, "mem_util": 30, "memory_used_bytes": 16 * GIB, "processes": [
            { "pid": chat.pid(), "name": "vllm", "memory_used_bytes": 16 * GIB, "sm_util": 58 }
        ]}]
    }]});
    std::fs::write(&scenario, fleet.to_string()).unwrap();
    // The engine has served for a while before the agent starts: that is not this run's.
    let body = Arc::new(Mutex::new(vllm_metrics(50_000, 9_000, 40, 2)));
    let url = engine(body.clone()).await;

    let db = test_support::sqlite();
    let server = start_server(&db.url, free_port()).await;
    let token = create_token(&db.url, "serving", "serving");
    let mut agent = agent_command(&AgentOptions {
        server: &server.url,
        token: &token,
        scenario: &scenario,
        spool: &dir.path().join("spool"),
        cluster: "serving",
        hostname: "l4-node",
        window: "1s",
    });
    agent
        .args(["--kubernetes", "off", "--slurm", "off"])
        .args(["--serving-metrics", &format!("chat-api={url}")]);
    let mut agent = Proc(agent.spawn().unwrap());
    tokio::time::sleep(Duration::from_secs(2)).await;
    // It serves 12 requests (and one aborted) reading 6,000 tokens and writing 1,500.
    *body.lock().unwrap() = vllm_metrics(56_000, 10_500, 52, 3);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(agent.terminate(Duration::from_secs(15)).success());
    let dead_letter = dir.path().join("spool/dead-letter");
    assert!(
        !dead_letter.exists() || std::fs::read_dir(&dead_letter).unwrap().next().is_none(),
        "the server refused none of the reports"
    );

    server_run(&db.url, &["rollup"]);
    let viewer = signed_in(&server, "viewer").await;
    let usage: Value = viewer
        .get(format!("{}/api/v1/usage?{}", server.url, around_now()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let endpoints = usage["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1, "{usage}");
    let e = &endpoints[0];
    assert_eq!(e["endpoint"], "chat-api", "{usage}");
    assert_eq!(e["requests"], 12, "{usage}: aborted requests served nobody");
    assert_eq!(e["input_tokens"], 6_000, "{usage}");
    assert_eq!(e["output_tokens"], 1_500, "{usage}");
    assert_eq!(e["counted_by"], json!(["vllm"]), "{usage}");
    let cost: Decimal = e["cost"].as_str().unwrap().parse().unwrap();
    assert!(cost > Decimal::ZERO, "{usage}");
    let per_1m: Decimal = e["cost_per_1m_tokens"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        per_1m,
        (cost * Decimal::from(1_000_000) / Decimal::from(7_500))
            .round_dp(gpuledger_core::money::MAX_SCALE),
        "{usage}"
    );
    drop(chat);
}

/// `once` with an engine that is not there says which, why, and what happens meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn an_engine_that_is_down_or_speaks_garbage_is_said_so() {
    let garbage = engine(Arc::new(Mutex::new(
        "<html>502 Bad Gateway</html>\n".into(),
    )))
    .await;
    let down = format!("http://127.0.0.1:{}/metrics", free_port());
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("one.json");
    std::fs::write(
        &scenario,
        json!({ "gpus": [{ "model": "NVIDIA L4", "uuid": "GPU-once-0",
            "phases": [{ "gpu_util": 0, "memory_used_bytes": 0 }] }] })
        .to_string(),
    )
    .unwrap();
    let out = std::process::Command::new(artifact("gpuledger-agent"))
        .args(["once", "--imds-endpoint", "off"])
        .args(["--kubernetes", "off", "--slurm", "off"])
        .arg("--nvml-lib")
        .arg(artifact("libfake_nvml.so"))
        .env("FAKE_NVML_SCENARIO", &scenario)
        .args([
            "--serving-metrics",
            &format!("chat-api={down},rerank={garbage}"),
        ])
        .args(["--duration", "300ms", "--sample-interval", "100ms"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["windows"][0].get("serving").is_none(),
        "nothing invented: {report}"
    );
    for (endpoint, url, why) in [
        ("chat-api", &down, "error sending request"),
        ("rerank", &garbage, "line 1, column 1"),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.contains(&format!("endpoint {endpoint:?}")))
            .unwrap_or_else(|| panic!("{endpoint}: {stderr}"));
        assert!(line.contains(url.as_str()), "{line}");
        assert!(line.contains("cannot be read"), "{line}");
        assert!(line.contains(why), "{line}");
    }
}
