//! Load: 500 simulated agents with 8 GPUs each report every 15 s for 10 minutes to a server on
//! loopback. Zero errors, zero lost windows, and the server's memory sampled throughout.
//!
//! Ten minutes is too long for every CI run, so it is ignored there; run it with
//! `scripts/with-postgres cargo test --release --test e2e load:: -- --ignored --nocapture`
//! (figures in docs/load-test.md). `GPULEDGER_LOAD_AGENTS`, `GPULEDGER_LOAD_SECONDS` and
//! `GPULEDGER_LOAD_BACKEND` (`sqlite` or `postgres`) shrink or redirect it.

use crate::support;

use gpuledger_server::store;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{
    create_token, eight_gpu_report, free_port, start_server, test_support, GPUS_PER_HOST, WINDOW_MS,
};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "ten minutes: run by hand, figures in docs/load-test.md"]
async fn five_hundred_agents_for_ten_minutes() {
    let agents = env_or("GPULEDGER_LOAD_AGENTS", 500) as usize;
    let seconds = env_or("GPULEDGER_LOAD_SECONDS", 600);
    let db = match std::env::var("GPULEDGER_LOAD_BACKEND").as_deref() {
        Ok("sqlite") => test_support::sqlite(),
        _ => test_support::postgres().await,
    };
    let token = create_token(&db.url, "load", "load-*");
    let server = start_server(&db.url, free_port()).await;
    let pid = server.proc.pid();
    let errors = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let windows_each = seconds * 1000 / WINDOW_MS as u64;
    let t0 = gpuledger_server::clock::now_ms();
    let started = Instant::now();
    // Memory sampled every second while the load runs.
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let tasks: Vec<_> = (0..agents)
        .map(|host| {
            let (client, url, token) = (client.clone(), server.url.clone(), token.clone());
            let (errors, retries) = (errors.clone(), retries.clone());
            tokio::spawn(async move {
                // Agents start spread over the first window, like a real fleet.
                let offset = (host as u64 * WINDOW_MS as u64) / agents as u64;
                let mut latencies = Vec::new();
                for seq in 0..windows_each {
                    let start_ms = t0 - WINDOW_MS + (seq as i64) * WINDOW_MS + offset as i64;
                    let due = started + Duration::from_millis(seq * WINDOW_MS as u64 + offset);
                    tokio::time::sleep_until(due.into()).await;
                    let body = eight_gpu_report("load", host, seq, start_ms);
                    loop {
                        let sent = Instant::now();
                        let resp = client
                            .post(format!("{url}/api/v1/reports"))
                            .bearer_auth(&token)
                            .json(&body)
                            .send()
                            .await;
                        match resp {
                            Ok(r) if r.status().is_success() => {
                                latencies.push(sent.elapsed().as_micros() as u64);
                                break;
                            }
                            Ok(r) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                eprintln!("load-{host}: {}", r.status());
                                if r.status().is_client_error() {
                                    break;
                                }
                            }
                            Err(e) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                eprintln!("load-{host}: {e}");
                            }
                        }
                        retries.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    sampler.abort();
    peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
    latencies.sort_unstable();

    let store = db.open().await;
    let stored_windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap()
        .len() as u64;
    let stored_batches = store::telemetry::batch_count(store.db()).await.unwrap() as u64;
    let sent = agents as u64 * windows_each;
    println!("load test on {}", db.backend);
    println!(
        "  {agents} agents x {GPUS_PER_HOST} GPUs, one report per {} s, for {:.0} s",
        WINDOW_MS / 1000,
        elapsed.as_secs_f64()
    );
    println!(
        "  reports sent {sent}, stored {stored_batches}; GPU-windows expected {}, stored {stored_windows}",
        sent * u64::from(GPUS_PER_HOST)
    );
    println!(
        "  errors {} (retried {}), ingest latency p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        errors.load(Ordering::Relaxed),
        retries.load(Ordering::Relaxed),
        percentile(&latencies, 0.50) as f64 / 1000.0,
        percentile(&latencies, 0.95) as f64 / 1000.0,
        percentile(&latencies, 0.99) as f64 / 1000.0,
        latencies.last().copied().unwrap_or(0) as f64 / 1000.0,
    );
    println!(
        "  server peak RSS {:.1} MiB",
        peak.load(Ordering::Relaxed) as f64 / 1024.0
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0, "zero errors");
    assert_eq!(stored_batches, sent, "every report stored once");
    assert_eq!(
        stored_windows,
        sent * u64::from(GPUS_PER_HOST),
        "zero lost windows"
    );
}
