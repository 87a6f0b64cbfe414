//! The agent: 8 GPUs sampled every second against the fake NVML.

use super::*;

pub(super) async fn agent(o: &Options) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = fresh_db("sqlite").await?;
    let token = create_token(&db.url, "bench-agent", "bench");
    let mut server = start_server(&db.url, free_port()).await;
    // Real processes for the agent to read labels of; they outlive the run.
    let mut sleepers = Vec::new();
    for g in 0..8 {
        sleepers.push(support::Proc(
            Command::new("sleep")
                .arg((o.agent_seconds + 120).to_string())
                .env("GPULEDGER_MODEL", format!("model-{g}"))
                .env("GPULEDGER_TEAM", "bench")
                .stdin(Stdio::null())
                .spawn()?,
        ));
    }
    let gpus: Vec<serde_json::Value> = sleepers
        .iter()
        .enumerate()
        .map(|(g, p)| {
            serde_json::json!({
                "model": "NVIDIA H100 80GB HBM3",
                "uuid": format!("GPU-agent-bench-{g}"),
                "power_mw": 400_000, "temperature_c": 60, "energy_start_mj": 1_000_000,
                "phases": [{ "at_s": 0, "gpu_util": 70, "mem_util": 30,
                             "memory_used_bytes": 42_949_672_960u64,
                             "processes": [{ "pid": p.pid(), "name": "python3",
                                             "memory_used_bytes": 42_949_672_960u64, "sm_util": 68 }] }]
            })
        })
        .collect();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(&serde_json::json!({ "driver_version": "550.54.15", "gpus": gpus }))?,
    )?;
    let started = Instant::now();
    let child = Command::new(artifact("gpuledger-agent"))
        .args(["run", "--server", &server.url, "--token", &token])
        .arg("--nvml-lib")
        .arg(artifact("libfake_nvml.so"))
        .arg("--spool-dir")
        .arg(dir.path().join("spool"))
        .args(["--cluster", "bench", "--hostname", "bench-agent"])
        .args([
            "--imds-endpoint",
            "off",
            "--sample-interval",
            "1s",
            "--window",
            "15s",
        ])
        .env("FAKE_NVML_SCENARIO", &scenario)
        .env("GPULEDGER_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()?;
    let pid = child.id();
    tokio::time::sleep(Duration::from_secs(o.agent_seconds)).await;
    let rss_now = proc_status_kib(pid, "VmRSS:") as f64 / 1024.0;
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    let usage = wait_usage(child).await?;
    let wall = started.elapsed().as_secs_f64();
    let stored = count(
        &db,
        "SELECT COUNT(*) FROM gpu_windows WHERE gpu_uuid LIKE 'GPU-agent-bench-%'",
    )
    .await?;
    server.proc.terminate(Duration::from_secs(30));
    println!(
        "agent: 8 GPUs sampled every 1 s, 15 s windows sent a minute at a time, for {wall:.0} s against the fake NVML ({stored} GPU windows reached the server)"
    );
    println!(
        "  CPU {:.2} s = {:.3}% of a core (target ≤ 0.1%), {:.1} s per hour; peak RSS {:.1} MiB (target ≤ 15 MB)",
        usage.cpu_s,
        usage.cpu_s / wall * 100.0,
        usage.cpu_s / wall * 3600.0,
        // The larger of the kernel's high-water mark and the last /proc reading (which also
        // counts shared pages).
        usage.max_rss_mib.max(rss_now)
    );
    if stored == 0 {
        bail!("the agent delivered nothing");
    }
    Ok(())
}
