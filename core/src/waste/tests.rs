use super::*;

const T: i64 = 1_800_000_000_000;
const MIN: i64 = 60_000;

fn host(id: i64, cluster: &str) -> HostRow {
    HostRow {
        id,
        cluster: cluster.into(),
        hostname: format!("{cluster}-{id}"),
        provider: None,
        instance_id: None,
        instance_key: None,
        instance_type: None,
        lifecycle: None,
        region: None,
        from_bill: false,
    }
}

/// One-minute windows for `minutes` ending at `end`, at `util`.
fn run(host_id: i64, uuid: &str, end: i64, minutes: i64, util: f64) -> Vec<AttributionWindow> {
    (0..minutes)
        .map(|m| AttributionWindow {
            host_id,
            gpu_uuid: uuid.into(),
            parent_uuid: None,
            gpu_name: None,
            start_ms: end - (minutes - m) * MIN,
            end_ms: end - (minutes - m - 1) * MIN,
            memory_total_bytes: Some(80 << 30),
            util_avg: Some(util),
            util_histogram: None,
            energy_mj: None,
            ..Default::default()
        })
        .collect()
}

fn proc_in(w: &AttributionWindow, pid: i64, sm: f64, team: &str) -> StoredProcessWindow {
    StoredProcessWindow {
        gpu_uuid: w.gpu_uuid.clone(),
        start_ms: w.start_ms,
        pid,
        process_name: None,
        memory_used_max_bytes: Some(10 << 30),
        sm_util_avg: Some(sm),
        labels_json: serde_json::json!({"experiment": "notebook", "team": team}).to_string(),
        container_id: None,
        pod_uid: None,
        user_name: None,
    }
}

#[test]
fn a_cluster_idle_past_its_duration_is_one_finding() {
    let hosts = [host(1, "idle"), host(2, "idle"), host(3, "busy")];
    let mut w = run(1, "a", T, 45, 0.0);
    w.extend(run(1, "b", T, 45, 1.0));
    w.extend(run(2, "c", T, 45, 2.0));
    w.extend(run(3, "d", T, 45, 80.0));
    let f = find(&hosts, &w, &[], &IdleConfig::default(), T);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].kind, f[0].key.as_str()),
        (IncidentKind::ClusterIdle, "cluster:idle")
    );
    assert_eq!(f[0].gpus.len(), 3);
    assert_eq!(f[0].since_ms, T - 45 * MIN);
    // 20 minutes is not long enough.
    let f = find(&hosts, &w, &[], &IdleConfig::default(), T - 25 * MIN);
    assert!(f.is_empty(), "{f:?}");
}

#[test]
fn partly_idle_hosts_and_gpus() {
    let hosts = [host(1, "c"), host(2, "c")];
    let mut w = run(1, "a", T, 40, 0.0);
    w.extend(run(1, "b", T, 40, 0.0));
    w.extend(run(2, "c", T, 40, 0.0));
    w.extend(run(2, "d", T, 40, 90.0));
    let f = find(&hosts, &w, &[], &IdleConfig::default(), T);
    let kinds: Vec<(&str, IncidentKind, usize)> = f
        .iter()
        .map(|f| (f.key.as_str(), f.kind, f.gpus.len()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("gpus:c/c-2", IncidentKind::GpusIdle, 1),
            ("host:c/c-1", IncidentKind::HostIdle, 2)
        ]
    );
}

#[test]
fn a_gap_or_a_busy_spell_restarts_the_clock_and_silence_is_not_idleness() {
    let hosts = [host(1, "c")];
    let mut w = run(1, "a", T - 30 * MIN, 20, 0.0);
    w.extend(run(1, "a", T, 25, 0.0)); // a 5-minute gap before these
    assert!(find(&hosts, &w, &[], &IdleConfig::default(), T).is_empty());
    let mut w = run(1, "a", T - 20 * MIN, 30, 0.0);
    w.extend(run(1, "a", T, 20, 50.0));
    assert!(find(&hosts, &w, &[], &IdleConfig::default(), T).is_empty());
    // Idle, but the host stopped reporting 10 minutes ago.
    let w = run(1, "a", T - 10 * MIN, 45, 0.0);
    assert!(find(&hosts, &w, &[], &IdleConfig::default(), T).is_empty());
}

#[test]
fn a_notebook_holding_memory_at_zero_is_held_idle_with_its_owner() {
    let hosts = [host(1, "c")];
    let w = run(1, "a", T, 40, 0.0);
    let procs: Vec<_> = w.iter().map(|w| proc_in(w, 7, 0.0, "research")).collect();
    let f = find(&hosts, &w, &procs, &IdleConfig::default(), T);
    assert_eq!(f.len(), 1, "held, not plain idle: {f:?}");
    assert_eq!(f[0].kind, IncidentKind::HeldIdle);
    assert_eq!(
        f[0].owners.get("team").map(String::as_str),
        Some("research")
    );
    assert_eq!(f[0].key, "held:c/c-1");
    // The same process doing work is not held idle.
    let busy: Vec<_> = w.iter().map(|w| proc_in(w, 7, 30.0, "research")).collect();
    let w_busy = run(1, "a", T, 40, 30.0);
    assert!(find(&hosts, &w_busy, &busy, &IdleConfig::default(), T).is_empty());
}

/// Who holds a GPU is one rule for alerts and for the bill (`activity::holds`): a process the
/// driver reports SM work for but no memory holds it as much as one holding memory, so the
/// incident names the owner that attribution charges the held-idle hours to.
#[test]
fn a_process_without_memory_but_with_a_trickle_of_sm_is_named_as_holding() {
    let hosts = [host(1, "c")];
    let w = run(1, "a", T, 40, 0.0);
    let procs: Vec<_> = w
        .iter()
        .map(|w| StoredProcessWindow {
            memory_used_max_bytes: None,
            ..proc_in(w, 7, 0.5, "research")
        })
        .collect();
    let f = find(&hosts, &w, &procs, &IdleConfig::default(), T);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, IncidentKind::HeldIdle);
    assert_eq!(f[0].processes.len(), 1, "{f:?}");
    assert_eq!(
        f[0].owners.get("team").map(String::as_str),
        Some("research")
    );
}

/// A notebook host whose processes hold 4 GPUs idle is one finding listing the 4 GPUs, with
/// each owner once: one incident and one Slack message, not four.
#[test]
fn a_host_holding_gpus_idle_is_one_finding() {
    let hosts = [host(1, "c")];
    let mut windows = Vec::new();
    let mut procs = Vec::new();
    for (i, gpu) in ["a", "b", "c", "d"].into_iter().enumerate() {
        let w = run(1, gpu, T, 40, 0.0);
        let team = if i < 3 { "research" } else { "vision" };
        procs.extend(w.iter().map(|w| proc_in(w, 7 + i as i64, 0.0, team)));
        windows.extend(w);
    }
    let f = find(&hosts, &windows, &procs, &IdleConfig::default(), T);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, IncidentKind::HeldIdle);
    assert_eq!(f[0].gpus, ["a", "b", "c", "d"]);
    assert_eq!(f[0].gpu_equivalents, 4.0);
    assert_eq!(f[0].owners["team"], "research, vision");
}

/// An A100's MIG devices report no utilization: one held by a process is in use by its
/// presence (never alerted as held idle), one with no process is idle like any GPU.
#[test]
fn mig_devices_without_gpm_are_in_use_by_presence_or_idle() {
    let hosts = [host(1, "c")];
    let mut windows = run(1, "GPU-0", T, 40, 0.0);
    for w in &mut windows {
        w.util_avg = None;
        w.mig.gpu_slices = Some(7);
    }
    let device = |uuid: &str, gpu_instance_id: i64| {
        let mut ws = run(1, uuid, T, 40, 0.0);
        for w in &mut ws {
            w.util_avg = None;
            w.parent_uuid = Some("GPU-0".into());
            w.mig = crate::telemetry::MigFacts {
                gpu_instance_id: Some(gpu_instance_id),
                instance_slices: Some(3),
                compute_slices: Some(3),
                gpu_slices: None,
            };
        }
        ws
    };
    let used = device("MIG-used", 1);
    let empty = device("MIG-empty", 2);
    let procs: Vec<_> = used
        .iter()
        .map(|w| StoredProcessWindow {
            sm_util_avg: None,
            ..proc_in(w, 7, 0.0, "research")
        })
        .collect();
    windows.extend(used);
    windows.extend(empty);
    let f = find(&hosts, &windows, &procs, &IdleConfig::default(), T);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, IncidentKind::GpusIdle);
    assert_eq!(f[0].gpus, ["MIG-empty"], "the empty instance alone: {f:?}");
    assert!((f[0].gpu_equivalents - 3.0 / 7.0).abs() < 1e-12, "{f:?}");
    assert!(f[0].processes.is_empty());
    // Both instances idle: the host (here its whole cluster) is idle whole, its GPU in MIG
    // mode named with them (its slices no instance holds are idle too), one GPU.
    let procs: Vec<StoredProcessWindow> = Vec::new();
    let f = find(&hosts, &windows, &procs, &IdleConfig::default(), T);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, IncidentKind::ClusterIdle);
    assert_eq!(f[0].gpus, ["MIG-empty", "MIG-used", "GPU-0"]);
    assert_eq!(f[0].gpu_equivalents, 1.0);
}

/// Memory held at 0% by processes the agent cannot see is held idle by them (pid 0, named
/// as such); a GPU that could not be read is not idle.
#[test]
fn unseen_holders_are_held_idle_and_a_lost_gpu_is_not_idle() {
    let hosts = [host(1, "c")];
    let mut w = run(1, "a", T, 40, 0.0);
    for x in &mut w {
        x.unseen_memory_bytes = Some(9 << 30);
    }
    let f = find(&hosts, &w, &[], &IdleConfig::default(), T);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, IncidentKind::HeldIdle);
    assert_eq!(f[0].processes[0].pid, UNSEEN_PID);
    assert!(f[0].processes[0].describe().contains("cannot see"));

    // Lost for 40 minutes: not idle, a fault, with the agent's words for it.
    let mut lost = run(1, "b", T, 40, 0.0);
    for x in &mut lost {
        x.util_avg = None;
        x.fault = Some(crate::telemetry::Fault {
            code: "gpu_lost".into(),
            detail: "XID 79: the GPU has fallen off the bus".into(),
        });
    }
    let f = find(&hosts, &lost, &[], &IdleConfig::default(), T);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].kind, f[0].key.as_str()),
        (IncidentKind::GpuFault, "fault:c/c-1")
    );
    assert_eq!(f[0].since_ms, T - 40 * MIN);
    assert_eq!(f[0].faults["b"], "XID 79: the GPU has fallen off the bus");
    let device = IdleDevice {
        host: "c-1".into(),
        uuid: "b".into(),
        index: Some(1),
        processes: Vec::new(),
        fault: Some(f[0].faults["b"].clone()),
    };
    assert_eq!(
        describe_devices(&[device]),
        ["c-1 GPU #1: XID 79: the GPU has fallen off the bus"]
    );
    // A fault of four minutes is not yet one; one with work in sight is not one at all.
    assert!(find(&hosts, &lost[36..], &[], &IdleConfig::default(), T).is_empty());
    for x in &mut lost {
        x.util_avg = Some(80.0);
    }
    assert!(find(&hosts, &lost, &[], &IdleConfig::default(), T).is_empty());
}

#[test]
fn per_cluster_thresholds() {
    let hosts = [host(1, "strict")];
    let w = run(1, "a", T, 40, 3.0);
    let mut cfg = IdleConfig::default();
    cfg.clusters.insert(
        "strict".into(),
        crate::idle::IdleOverride {
            threshold_percent: Some(2.0),
            duration: None,
        },
    );
    assert!(
        find(&hosts, &w, &[], &cfg, T).is_empty(),
        "3% is busy under a 2% threshold"
    );
    assert_eq!(find(&hosts, &w, &[], &IdleConfig::default(), T).len(), 1);
}
