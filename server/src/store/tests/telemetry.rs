use super::*;

#[tokio::test]
async fn a_report_is_stored_once_and_reads_back_exactly() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = with_token(store.as_ref()).await;
        let r = report("batch-1", T0, 80.0);
        let status = AgentStatus {
            spool_depth: Some(3),
            spool_dropped: Some(0),
        };
        assert_eq!(
            store.ingest(&r, token, status, T0 + 20_000).await.unwrap(),
            IngestOutcome::Stored,
            "{b}"
        );
        assert_eq!(
            store.ingest(&r, token, status, T0 + 21_000).await.unwrap(),
            IngestOutcome::Duplicate,
            "{b}"
        );
        assert_eq!(
            crate::store::telemetry::batch_count(store.db())
                .await
                .unwrap(),
            1,
            "{b}"
        );

        let windows = crate::store::telemetry::gpu_windows(store.db(), T0, T0 + 60_000)
            .await
            .unwrap();
        assert_eq!(windows.len(), 1, "{b}: a repeat stores nothing");
        let w = &windows[0];
        let g = &r.windows[0].gpus[0];
        assert_eq!(
            (w.start_ms, w.end_ms, w.samples),
            (T0, T0 + 15_000, 15),
            "{b}"
        );
        assert_eq!(w.memory_total_bytes, Some(85_899_345_920), "{b}");
        assert_eq!(w.util_avg, g.util_avg, "{b}");
        assert_eq!(w.mem_util_avg, None, "{b}: absent stays absent");
        assert_eq!(w.power_avg_watts, Some(310.5), "{b}");
        assert_eq!(w.energy_mj, Some(4_657_500), "{b}");

        let procs = crate::store::telemetry::process_windows(store.db(), T0, T0 + 60_000)
            .await
            .unwrap();
        assert_eq!(procs.len(), 1, "{b}");
        let p = &procs[0];
        let labels: BTreeMap<String, String> = serde_json::from_str(&p.labels_json).unwrap();
        let label = |k: &str| labels.get(k).map(String::as_str);
        assert_eq!(
            (p.pid, label("model"), label("team"), label("experiment")),
            (4242, Some("llama-70b"), Some("search"), None),
            "{b}"
        );
        assert_eq!(
            labels.get("mlflow_run_id").map(String::as_str),
            Some("r42"),
            "{b}"
        );
        assert_eq!(
            p.pod_uid.as_deref(),
            Some("1f2e3d4c-aaaa-bbbb-cccc-111122223333"),
            "{b}"
        );
        assert_eq!(p.user_name.as_deref(), Some("ana"), "{b}");
        let latest = crate::store::telemetry::fleet_processes(store.db())
            .await
            .unwrap();
        assert_eq!(latest[0].user_name.as_deref(), Some("ana"), "{b}");

        let fleet = crate::store::telemetry::fleet(store.db()).await.unwrap();
        assert_eq!(fleet.len(), 1, "{b}");
        assert_eq!(
            fleet[0].instance_type.as_deref(),
            Some("p4d.24xlarge"),
            "{b}"
        );
        assert_eq!(fleet[0].spool_depth, Some(3), "{b}");
        assert_eq!(fleet[0].last_util_avg, Some(80.0), "{b}");
    }
}

/// MIG instances are known as such (recommendations never pack them together).
#[tokio::test]
async fn mig_instances_are_listed() {
    for db in test_support::both().await {
        let store = db.open().await;
        let token = with_token(store.as_ref()).await;
        let mut r = report("batch-mig", T0, 30.0);
        let mut mig = r.windows[0].gpus[0].clone();
        mig.uuid = "MIG-1".into();
        mig.parent_uuid = Some("GPU-1".into());
        r.windows[0].gpus.push(mig);
        store
            .ingest(&r, token, AgentStatus::default(), T0)
            .await
            .unwrap();
        assert_eq!(
            crate::store::telemetry::mig_instances(store.db())
                .await
                .unwrap(),
            vec!["MIG-1".to_owned()],
            "{}",
            db.backend
        );
    }
}

/// What real GPUs report beyond readings reads back as sent, on both databases: a MIG-mode
/// GPU's compute slices, a MIG device's instances and slices, unseen memory and its cause, a
/// fault; and the fleet's latest state carries the unseen memory and the fault.
#[tokio::test]
async fn mig_slices_unseen_memory_and_faults_read_back() {
    use gpuledger_proto::{DeviceFault, MigPlacement};
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = with_token(store.as_ref()).await;
        let mut r = report("batch-facts", T0, 30.0);
        let gpu = &mut r.windows[0].gpus[0];
        gpu.mig_compute_slices = Some(7);
        gpu.processes.clear();
        let mut mig = gpu.clone();
        mig.uuid = "MIG-1".into();
        mig.parent_uuid = Some("GPU-1".into());
        mig.mig_compute_slices = None;
        mig.mig = Some(MigPlacement {
            gpu_instance_id: 5,
            compute_instance_id: 1,
            profile: Some("1c.3g.40gb".into()),
            gpu_instance_slices: 3,
            compute_instance_slices: 1,
        });
        mig.unseen_memory_bytes = Some(9 << 30);
        mig.unseen_cause = Some("pid_namespace".into());
        mig.fault = Some(DeviceFault {
            code: "xid".into(),
            detail: "XID 48: double-bit ECC error".into(),
        });
        r.windows[0].gpus.push(mig);
        store
            .ingest(&r, token, AgentStatus::default(), T0)
            .await
            .unwrap();
        let windows = crate::store::rollups::attribution_windows(store.db(), T0, T0 + 60_000)
            .await
            .unwrap();
        let by = |uuid: &str| windows.iter().find(|w| w.gpu_uuid == uuid).unwrap();
        assert_eq!(by("GPU-1").mig.gpu_slices, Some(7), "{b}");
        let m = by("MIG-1");
        assert_eq!(
            (
                m.mig.gpu_instance_id,
                m.mig.instance_slices,
                m.mig.compute_slices,
                m.mig.gpu_slices
            ),
            (Some(5), Some(3), Some(1), None),
            "{b}"
        );
        assert_eq!(
            (m.unseen_memory_bytes, m.unseen_cause.as_deref()),
            (Some(9 << 30), Some("pid_namespace")),
            "{b}"
        );
        let fault = m.fault.as_ref().unwrap();
        assert_eq!(
            (fault.code.as_str(), fault.detail.as_str()),
            ("xid", "XID 48: double-bit ECC error"),
            "{b}"
        );
        assert_eq!(by("GPU-1").fault, None, "{b}");
        let fleet = crate::store::telemetry::fleet(store.db()).await.unwrap();
        let row = fleet
            .iter()
            .find(|f| f.uuid.as_deref() == Some("MIG-1"))
            .unwrap();
        assert_eq!(row.last_unseen_memory_bytes, Some(9 << 30), "{b}");
        assert_eq!(row.last_fault_code.as_deref(), Some("xid"), "{b}");
    }
}

/// A big batch (an agent back after an outage): more rows than one bulk statement takes, several
/// windows per GPU. Every row lands, and each GPU's row shows its newest window.
#[tokio::test]
async fn a_large_report_is_stored_whole_in_bulk_statements() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = with_token(store.as_ref()).await;
        let mut r = report("big", T0, 10.0);
        let template = r.windows[0].clone();
        r.windows = (0..80)
            .map(|i| {
                let mut w = template.clone();
                w.start_ms = T0 + i * 15_000;
                w.end_ms = w.start_ms + 15_000;
                w.gpus = (0..8u32)
                    .map(|g| {
                        let mut gpu = template.gpus[0].clone();
                        gpu.uuid = format!("GPU-{g}");
                        gpu.index = g;
                        gpu.util_avg = Some(i as f64);
                        gpu
                    })
                    .collect();
                w
            })
            .collect();
        // Out of order, as a spool replay may send them: the newest is not last.
        r.windows.swap(79, 3);
        assert_eq!(
            store
                .ingest(&r, token, AgentStatus::default(), T0)
                .await
                .unwrap(),
            IngestOutcome::Stored,
            "{b}"
        );
        let end = T0 + 80 * 15_000;
        assert_eq!(
            crate::store::telemetry::gpu_windows(store.db(), T0, end)
                .await
                .unwrap()
                .len(),
            640,
            "{b}"
        );
        assert_eq!(
            crate::store::telemetry::process_windows(store.db(), T0, end)
                .await
                .unwrap()
                .len(),
            640,
            "{b}"
        );
        // Every process window carries its host, as its GPU window does (docs/scale.md).
        let mut conn = store.db().read().await.unwrap();
        let hosts: Vec<(Option<i64>, i64)> = crate::store::db::on_backend!(conn, |ex| {
            sqlx::query_as(
                "SELECT p.host_id, g.host_id FROM process_windows p
                 JOIN gpu_windows g ON g.gpu_uuid = p.gpu_uuid AND g.start_ms = p.start_ms",
            )
            .fetch_all(&mut *ex)
            .await
            .unwrap()
        });
        drop(conn);
        assert_eq!(hosts.len(), 640, "{b}");
        assert!(hosts.iter().all(|(p, g)| *p == Some(*g)), "{b}: {hosts:?}");
        let fleet = crate::store::telemetry::fleet(store.db()).await.unwrap();
        assert_eq!(fleet.len(), 8, "{b}");
        assert!(
            fleet.iter().all(|g| g.last_util_avg == Some(79.0)),
            "{b}: every GPU shows its newest window"
        );
    }
}

#[tokio::test]
async fn late_windows_do_not_replace_the_latest_state() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = with_token(store.as_ref()).await;
        let now = T0 + 120_000;
        store
            .ingest(
                &report("new", T0 + 30_000, 70.0),
                token,
                AgentStatus::default(),
                now,
            )
            .await
            .unwrap();
        store
            .ingest(&report("old", T0, 10.0), token, AgentStatus::default(), now)
            .await
            .unwrap();
        let fleet = crate::store::telemetry::fleet(store.db()).await.unwrap();
        assert_eq!(
            fleet[0].last_util_avg,
            Some(70.0),
            "{b}: the newest window wins"
        );
        assert_eq!(
            crate::store::telemetry::gpu_windows(store.db(), T0, now)
                .await
                .unwrap()
                .len(),
            2,
            "{b}: the late one is still kept"
        );
        let procs = crate::store::telemetry::fleet_processes(store.db())
            .await
            .unwrap();
        assert_eq!(procs.len(), 1, "{b}: processes come from the newest window");
        assert_eq!(procs[0].sm_util_avg, Some(69.0), "{b}");
    }
}

/// A repeat is refused whole: it does not even touch the host's row (PostgreSQL stores a report
/// in one statement without a transaction to roll back, so the statement itself must hold back).
/// A retry with the same content is a duplicate; the same batch id with other content, or from
/// another token, is refused naming `batch_id`.
#[tokio::test]
async fn a_repeat_changes_nothing_not_even_the_host() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = with_token(store.as_ref()).await;
        let r = report("batch-1", T0, 80.0);
        let first = AgentStatus {
            spool_depth: Some(3),
            spool_dropped: Some(0),
        };
        store.ingest(&r, token, first, T0 + 20_000).await.unwrap();
        let later = AgentStatus {
            spool_depth: Some(7),
            spool_dropped: Some(1),
        };
        assert_eq!(
            store.ingest(&r, token, later, T0 + 90_000).await.unwrap(),
            IngestOutcome::Duplicate,
            "{b}: the same content again"
        );
        let mut changed = r.clone();
        changed.windows[0].gpus[0].util_avg = Some(1.0);
        let IngestOutcome::Refused(refusal) = store
            .ingest(&changed, token, later, T0 + 90_000)
            .await
            .unwrap()
        else {
            panic!("{b}: other content under a stored batch id must be refused");
        };
        assert_eq!(refusal.kind, RefusalKind::BatchReused, "{b}");
        assert_eq!(refusal.field, "batch_id", "{b}");
        crate::store::tokens::create_token(
            store.db(),
            &NewToken::for_cluster("other", "hash-2", "train"),
            T0,
        )
        .await
        .unwrap();
        let other = crate::store::tokens::active_token(store.db(), "hash-2", T0)
            .await
            .unwrap()
            .unwrap()
            .id;
        assert!(
            matches!(
                store.ingest(&r, other, later, T0 + 90_000).await.unwrap(),
                IngestOutcome::Refused(Refusal {
                    kind: RefusalKind::BatchReused,
                    ..
                })
            ),
            "{b}: another token's repeat of a batch is not a duplicate"
        );
        let fleet = crate::store::telemetry::fleet(store.db()).await.unwrap();
        assert_eq!(
            (fleet[0].spool_depth, fleet[0].last_report_ms),
            (Some(3), T0 + 20_000),
            "{b}: the host row is as the first report left it"
        );
        let windows = crate::store::telemetry::gpu_windows(store.db(), T0, T0 + 60_000)
            .await
            .unwrap();
        assert_eq!(
            windows[0].util_avg,
            Some(80.0),
            "{b}: the stored window is kept"
        );
    }
}

/// A GPU's row follows what it is and where it sits: it moves with its host and takes a new MIG
/// layout, while its latest state is its newest window wherever that was reported from.
#[tokio::test]
async fn a_gpu_that_moves_or_changes_is_rewritten() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = with_token(store.as_ref()).await;
        let status = AgentStatus::default();
        let now = T0 + 600_000;
        store
            .ingest(&report("a", T0, 10.0), token, status, now)
            .await
            .unwrap();
        // The same GPU, unchanged: nothing to rewrite, and the newest window shows.
        store
            .ingest(&report("b", T0 + 15_000, 20.0), token, status, now)
            .await
            .unwrap();
        let fleet = crate::store::telemetry::fleet(store.db()).await.unwrap();
        assert_eq!(fleet.len(), 1, "{b}");
        assert_eq!(
            (fleet[0].hostname.as_str(), fleet[0].last_util_avg),
            ("gpu-01", Some(20.0)),
            "{b}"
        );
        assert_eq!(
            fleet[0].last_window_end_ms,
            Some(T0 + 30_000),
            "{b}: the newest window's end"
        );

        // Moved to another host, reported with a new index and less memory (a MIG layout).
        let mut moved = report("c", T0 + 30_000, 30.0);
        moved.host.hostname = "gpu-02".into();
        moved.windows[0].gpus[0].index = 3;
        moved.windows[0].gpus[0].memory_total_bytes = Some(42_949_672_960);
        store.ingest(&moved, token, status, now).await.unwrap();
        let fleet = crate::store::telemetry::fleet(store.db()).await.unwrap();
        let gpu = |host: &str| {
            fleet
                .iter()
                .find(|r| r.hostname == host)
                .map(|r| (r.uuid.clone(), r.gpu_index, r.memory_total_bytes))
        };
        assert_eq!(
            gpu("gpu-01"),
            Some((None, None, None)),
            "{b}: the old host has no GPU now"
        );
        assert_eq!(
            gpu("gpu-02"),
            Some((Some("GPU-1".into()), Some(3), Some(42_949_672_960))),
            "{b}"
        );
    }
}

#[tokio::test]
async fn a_failed_ingest_stores_nothing() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        // No such token: the batch row's foreign key fails after the host row was written.
        let result = store
            .ingest(&report("x", T0, 50.0), 9_999, AgentStatus::default(), T0)
            .await;
        assert!(result.is_err(), "{b}");
        assert!(
            crate::store::telemetry::fleet(store.db())
                .await
                .unwrap()
                .is_empty(),
            "{b}: the host upsert was rolled back"
        );
        assert_eq!(
            crate::store::telemetry::batch_count(store.db())
                .await
                .unwrap(),
            0,
            "{b}"
        );
        assert!(
            crate::store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
                .await
                .unwrap()
                .is_empty(),
            "{b}"
        );
    }
}

#[tokio::test]
async fn hosts_carry_a_normalised_instance_key() {
    for db in test_support::both().await {
        let store = db.open().await;
        let token = with_token(store.as_ref()).await;
        let mut r = report("k", T0, 10.0);
        r.host.instance_id = Some("arn:aws:ec2:us-east-1:1111:instance/i-0ABC".into());
        store
            .ingest(&r, token, AgentStatus::default(), T0 + 20_000)
            .await
            .unwrap();
        let hosts = crate::store::telemetry::hosts(store.db()).await.unwrap();
        assert_eq!(
            hosts[0].instance_key.as_deref(),
            Some("i-0abc"),
            "{}",
            db.backend
        );
        let windows = crate::store::rollups::attribution_windows(store.db(), T0, T0 + 60_000)
            .await
            .unwrap();
        assert_eq!(
            windows[0].gpu_name.as_deref(),
            Some("NVIDIA A100-SXM4-80GB"),
            "{}",
            db.backend
        );
        // The samples per utilization percent come back as sent, for attribution's split.
        assert_eq!(
            windows[0].util_histogram.as_deref(),
            Some("[[0,5],[90,10]]"),
            "{}",
            db.backend
        );
    }
}

#[tokio::test]
async fn a_group_of_hosts_reads_its_windows_and_their_processes() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = with_token(store.as_ref()).await;
        // Six hosts of three GPUs, two windows each; GPU-h1-0 moves to host 5 in the second.
        for h in 0..6 {
            let mut r = report(&format!("b{h}"), T0, 50.0);
            r.host.hostname = format!("gpu-{h:02}");
            r.host.instance_id = Some(format!("i-{h}"));
            let template = r.windows[0].clone();
            r.windows = (0..2)
                .map(|i| {
                    let mut w = template.clone();
                    w.start_ms = T0 + i * 15_000;
                    w.end_ms = w.start_ms + 15_000;
                    w.gpus = (0..3)
                        .map(|g| {
                            let mut gpu = template.gpus[0].clone();
                            gpu.uuid = format!("GPU-h{h}-{g}");
                            gpu.processes[0].pid = 100 + g;
                            gpu
                        })
                        .collect();
                    if h == 5 && i == 1 {
                        w.gpus[0].uuid = "GPU-h1-0".into();
                    }
                    if h == 1 && i == 1 {
                        w.gpus.remove(0);
                    }
                    w
                })
                .collect();
            store
                .ingest(&r, token, AgentStatus::default(), T0)
                .await
                .unwrap();
        }
        let (from, to) = (T0, T0 + 30_000);
        let all = crate::store::rollups::attribution_windows(store.db(), from, to)
            .await
            .unwrap();
        assert_eq!(all.len(), 35, "{b}");
        let mut ids: Vec<i64> = all.iter().map(|w| w.host_id).collect();
        ids.dedup();
        // Not host 1, which reported GPU-h1-0 first.
        let chosen = vec![ids[2], ids[4], ids[5]];
        let (windows, processes) =
            crate::store::rollups::attribution_inputs_of_hosts(store.db(), from, to, &chosen)
                .await
                .unwrap();
        let expected: Vec<_> = all
            .iter()
            .filter(|w| chosen.contains(&w.host_id))
            .cloned()
            .collect();
        assert_eq!(windows, expected, "{b}: the group's windows, in order");
        let gpus: BTreeSet<&str> = windows.iter().map(|w| w.gpu_uuid.as_str()).collect();
        assert_eq!(windows.len(), 18, "{b}");
        assert_eq!(gpus.len(), 10, "{b}: {gpus:?}");
        let expected: Vec<_> = crate::store::telemetry::process_windows(store.db(), from, to)
            .await
            .unwrap()
            .into_iter()
            .filter(|p| gpus.contains(p.gpu_uuid.as_str()))
            .collect();
        // One more than the windows: GPU-h1-0's process of its window on host 1, which readers
        // match to no window of the group.
        assert_eq!(processes.len(), 19, "{b}");
        assert_eq!(processes, expected, "{b}: their GPUs' processes, in order");
        let none = crate::store::rollups::attribution_inputs_of_hosts(store.db(), from, to, &[])
            .await
            .unwrap();
        assert_eq!(none, (vec![], vec![]), "{b}: no hosts, nothing read");
    }
}

/// A window another batch already stored is never overwritten and never answered "stored":
/// the whole report is refused naming the window, even when its other windows are new.
#[tokio::test]
async fn a_window_already_stored_is_refused_not_dropped() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let status = AgentStatus::default();
        let token = token_for(s, "rack-1", "hash-1", T0).await;
        let now = T0 + 600_000;
        s.ingest(&report("b-1", T0, 10.0), token, status, now)
            .await
            .unwrap();
        let mut overlapping = report("b-2", T0 + 15_000, 90.0);
        let mut old = report("b-2", T0, 90.0).windows.remove(0);
        old.gpus[0].util_avg = Some(90.0);
        overlapping.windows.push(old);
        let IngestOutcome::Refused(refusal) =
            s.ingest(&overlapping, token, status, now).await.unwrap()
        else {
            panic!("{b}: a report repeating a stored window under a new batch id must be refused");
        };
        assert_eq!(refusal.kind, RefusalKind::WindowStored, "{b}");
        assert_eq!(refusal.field, "windows[1].gpus[0]", "{b}");
        assert!(
            refusal.message.contains("\"b-1\""),
            "{b}: {}",
            refusal.message
        );
        let windows = crate::store::telemetry::gpu_windows(s.db(), T0, T0 + 60_000)
            .await
            .unwrap();
        assert_eq!(
            windows.len(),
            1,
            "{b}: the new window was not stored either"
        );
        assert_eq!(
            windows[0].util_avg,
            Some(10.0),
            "{b}: the stored one is untouched"
        );
        assert_eq!(
            crate::store::telemetry::batch_count(s.db()).await.unwrap(),
            1,
            "{b}"
        );
        // The batch id was not used up: the agent can send the new window alone under it.
        let alone = report("b-2", T0 + 15_000, 90.0);
        assert_eq!(
            s.ingest(&alone, token, status, now).await.unwrap(),
            IngestOutcome::Stored
        );
    }
}

/// A GPU instance only the bill names gets one host (known from the bill, in cluster
/// "(no agent)", named by its resource), once however often it is asked for; none where an
/// agent's host has the instance; and every hour its lines charge, beyond the hours at hand
/// too, is marked for the roll-up again.
#[tokio::test]
async fn a_host_known_from_the_bill_is_added_once_and_marks_its_hours() {
    use crate::store::telemetry::{add_billed_hosts, BilledHost};
    const HOUR: i64 = 3_600_000;
    let t = T0 - T0.rem_euclid(HOUR);
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = with_token(store.as_ref()).await;
        let mut r = report("k", t, 10.0);
        r.host.instance_id = Some("i-0agent".into());
        store
            .ingest(&r, token, AgentStatus::default(), t + 20_000)
            .await
            .unwrap();
        let iso = gpuledger_core::time::rfc3339;
        let bill = format!(
            "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,ServiceProviderName,ResourceId,x_InstanceType\n\
             8.00,acct,USD,{p},Usage,{e1},{s1},8.00,8.00,AWS,i-0ghost,p4d.24xlarge\n\
             4.00,acct,USD,{p},Usage,{e2},{s2},4.00,4.00,AWS,i-0ghost,p4d.24xlarge\n",
            p = iso(t - 40 * 24 * HOUR),
            s1 = iso(t),
            e1 = iso(t + 2 * HOUR),
            s2 = iso(t + 30 * HOUR),
            e2 = iso(t + 31 * HOUR),
        );
        crate::billing::import_focus(store.as_ref(), "ghost.csv", bill.into_bytes(), t)
            .await
            .unwrap();
        let generations = || async {
            crate::store::rollups::dirty_marks_in(store.db(), t, t + 40 * HOUR, 100)
                .await
                .unwrap()
                .into_iter()
                .filter(|m| m.host_id == crate::store::BILLING_MARK_HOST)
                .map(|m| (m.hour_ms, m.generation))
                .collect::<Vec<_>>()
        };
        let before = generations().await;
        let wanted = [
            BilledHost {
                resource_key: "i-0ghost".into(),
                instance_type: Some("p4d.24xlarge".into()),
            },
            BilledHost {
                resource_key: "i-0agent".into(),
                instance_type: None,
            },
        ];
        assert_eq!(
            add_billed_hosts(store.db(), &wanted).await.unwrap(),
            1,
            "{b}"
        );
        let after = generations().await;
        assert_eq!(
            after.iter().map(|(h, _)| *h).collect::<Vec<_>>(),
            [t, t + HOUR, t + 30 * HOUR],
            "{b}: every hour the instance's lines charge"
        );
        assert!(
            after
                .iter()
                .zip(&before)
                .all(|((h, g), (h0, g0))| h == h0 && *g == g0 + 1),
            "{b}: marked again: {before:?} → {after:?}"
        );
        assert_eq!(
            add_billed_hosts(store.db(), &wanted).await.unwrap(),
            0,
            "{b}"
        );
        assert_eq!(generations().await, after, "{b}: nothing marked twice");
        let hosts = crate::store::telemetry::hosts(store.db()).await.unwrap();
        assert_eq!(hosts.len(), 2, "{b}: {hosts:?}");
        let ghost = hosts.iter().find(|h| h.from_bill).unwrap();
        assert_eq!(
            (
                ghost.cluster.as_str(),
                ghost.hostname.as_str(),
                ghost.instance_key.as_deref(),
                ghost.instance_type.as_deref()
            ),
            (
                "(no agent)",
                "i-0ghost",
                Some("i-0ghost"),
                Some("p4d.24xlarge")
            ),
            "{b}"
        );
        assert!(
            hosts
                .iter()
                .any(|h| !h.from_bill && h.instance_key.as_deref() == Some("i-0agent")),
            "{b}"
        );
        // The fleet shows what agents report, not the bill's hosts.
        let fleet = crate::store::telemetry::fleet(store.db()).await.unwrap();
        assert!(fleet.iter().all(|f| f.hostname != "i-0ghost"), "{b}");
    }
}

/// Reports sent at the same time are written as one group (one transaction on SQLite, one
/// statement on PostgreSQL), and each still gets the answer it would get alone: stored, a
/// repeat, or refused with its reason, with nothing of a refused report kept. Two reports of
/// one host, and one batch sent twice, land in the same group too.
#[tokio::test]
async fn reports_sent_together_are_written_together_each_with_its_own_answer() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let status = AgentStatus::default();
        let real = token_for(s, "rack-1", "hash-real", T0).await;
        let rogue = token_for(s, "rogue", "hash-rogue", T0).await;
        let now = T0 + 600_000;
        let seed = report("seed", T0, 10.0);
        assert_eq!(
            s.ingest(&seed, real, status, now).await.unwrap(),
            IngestOutcome::Stored
        );
        let mut theirs = report("rogue-1", T0, 10.0);
        theirs.host.hostname = "rogue-host".into();
        theirs.windows[0].gpus[0].uuid = "GPU-R".into();
        assert_eq!(
            s.ingest(&theirs, rogue, status, now).await.unwrap(),
            IngestOutcome::Stored
        );

        let on_host = |batch: &str, host: &str, gpu: &str, start: i64| {
            let mut r = report(batch, start, 50.0);
            r.host.hostname = host.into();
            r.windows[0].gpus[0].uuid = gpu.into();
            r
        };
        // What each report should be answered, by batch id.
        let mut sent: Vec<(Report, &str)> = (0..20)
            .map(|i| {
                let r = on_host(
                    &format!("b-{i}"),
                    &format!("h-{i}"),
                    &format!("GPU-h{i}"),
                    T0,
                );
                (r, "stored")
            })
            .collect();
        sent.push((seed.clone(), "duplicate"));
        sent.push((report("seed", T0, 99.0), "batch_reused"));
        sent.push((report("next-1", T0 + 15_000, 20.0), "stored"));
        sent.push((report("next-2", T0 + 30_000, 30.0), "stored"));
        sent.push((
            on_host("thief", "thief-host", "GPU-R", T0 + 15_000),
            "gpu_of_another_token",
        ));
        // A window the seed stored, beside a new one: refused whole.
        let mut overlap = report("overlap", T0, 10.0);
        let mut later = overlap.windows[0].clone();
        later.start_ms = T0 + 45_000;
        later.end_ms = T0 + 60_000;
        overlap.windows.push(later);
        sent.push((overlap, "window_stored"));
        let twice = on_host("twice", "h-twice", "GPU-twice", T0);
        sent.push((twice.clone(), "stored or duplicate"));
        sent.push((twice, "stored or duplicate"));

        let counters = s.ingest_groups();
        let (groups_before, reports_before) = (counters.groups.get(), counters.reports.get());
        let mut tasks = Vec::new();
        for (r, _) in &sent {
            let (store, r) = (store.clone(), r.clone());
            tasks.push(tokio::spawn(async move {
                store.ingest(&r, real, status, now).await
            }));
        }
        let mut twice_answers = Vec::new();
        for (task, (r, expected)) in tasks.into_iter().zip(&sent) {
            let answer = match task.await.unwrap().unwrap() {
                IngestOutcome::Stored => "stored",
                IngestOutcome::Duplicate => "duplicate",
                IngestOutcome::Refused(refusal) => refusal.kind.reason(),
            };
            if *expected == "stored or duplicate" {
                twice_answers.push(answer);
            } else {
                assert_eq!(answer, *expected, "{b}: batch {}", r.batch_id);
            }
        }
        twice_answers.sort();
        assert_eq!(twice_answers, ["duplicate", "stored"], "{b}");
        let groups = counters.groups.get() - groups_before;
        assert_eq!(
            counters.reports.get() - reports_before,
            sent.len() as u64,
            "{b}"
        );
        assert!(
            groups < sent.len() as u64,
            "{b}: {} reports in {groups} groups",
            sent.len()
        );

        // Exactly the stored reports' rows: the seed, the rogue's, 20 hosts, next-1 and next-2,
        // and the twice-sent batch once; nothing of the overlap's new window.
        let windows = crate::store::telemetry::gpu_windows(s.db(), T0, T0 + 120_000)
            .await
            .unwrap();
        assert_eq!(windows.len(), 25, "{b}");
        assert!(
            !windows.iter().any(|w| w.start_ms == T0 + 45_000),
            "{b}: a refused report keeps nothing"
        );
        let procs = crate::store::telemetry::process_windows(s.db(), T0, T0 + 120_000)
            .await
            .unwrap();
        assert_eq!(procs.len(), 25, "{b}");
        assert_eq!(
            crate::store::telemetry::batch_count(s.db()).await.unwrap(),
            25,
            "{b}"
        );
        let hosts = crate::store::telemetry::hosts(s.db()).await.unwrap();
        assert_eq!(
            hosts.len(),
            23,
            "{b}: gpu-01, rogue-host, 20 hosts, h-twice"
        );
        let seeded = crate::store::telemetry::gpu_windows(s.db(), T0, T0 + 1)
            .await
            .unwrap();
        assert!(
            seeded
                .iter()
                .any(|w| w.gpu_uuid == "GPU-1" && w.util_avg == Some(10.0)),
            "{b}: the seed's window is as it was"
        );

        // A burst of reports of distinct hosts is written together: the group takes the new
        // ones and leaves a repeat and a refusal to be named on their own (PostgreSQL), or
        // undoes them in their savepoints (SQLite).
        let alone_before = counters.alone.get();
        let groups_before = counters.groups.get();
        let mut burst: Vec<(Report, &str)> = (0..20)
            .map(|i| {
                let r = on_host(
                    &format!("c-{i}"),
                    &format!("h-{i}"),
                    &format!("GPU-h{i}"),
                    T0 + 15_000,
                );
                (r, "stored")
            })
            .collect();
        burst.push((
            on_host("thief-2", "thief-2", "GPU-R", T0 + 30_000),
            "gpu_of_another_token",
        ));
        burst.push((seed.clone(), "duplicate"));
        // The rogue's GPU on one of this token's hosts that reports in the same burst, in
        // another hour (so no roll-up mark is shared): refused, and the GPU stays the rogue's.
        burst.push((
            on_host("x-foreign", "h-5", "GPU-R", T0 + 3_600_000),
            "gpu_of_another_token",
        ));
        // One batch id from two new hosts with other content: the first stored, the other
        // refused, and its host not created.
        burst.push((
            on_host("shared", "s-1", "GPU-s1", T0),
            "stored or batch_reused",
        ));
        burst.push((
            on_host("shared", "s-2", "GPU-s2", T0),
            "stored or batch_reused",
        ));
        // A report across two hours marks both.
        let mut span = on_host("span", "h-span", "GPU-span", T0 + 3_585_000);
        let mut next = span.windows[0].clone();
        next.start_ms = T0 + 3_600_000;
        next.end_ms = T0 + 3_615_000;
        span.windows.push(next);
        burst.push((span, "stored"));
        // A window stored before, sent again under a new batch id: refused whole, and on
        // PostgreSQL the group is halved around it rather than written a report at a time.
        burst.push((
            on_host("resent", "h-resent", "GPU-twice", T0),
            "window_stored",
        ));
        let mut tasks = Vec::new();
        for (r, _) in &burst {
            let (store, r) = (store.clone(), r.clone());
            tasks.push(tokio::spawn(async move {
                store.ingest(&r, real, status, now).await
            }));
        }
        let mut shared_answers = Vec::new();
        for (task, (r, expected)) in tasks.into_iter().zip(&burst) {
            let answer = match task.await.unwrap().unwrap() {
                IngestOutcome::Stored => "stored",
                IngestOutcome::Duplicate => "duplicate",
                IngestOutcome::Refused(refusal) => refusal.kind.reason(),
            };
            if *expected == "stored or batch_reused" {
                shared_answers.push((answer, r.host.hostname.clone()));
            } else {
                assert_eq!(answer, *expected, "{b}: batch {}", r.batch_id);
            }
        }
        shared_answers.sort();
        assert_eq!(
            shared_answers.iter().map(|a| a.0).collect::<Vec<_>>(),
            ["batch_reused", "stored"],
            "{b}"
        );
        // On PostgreSQL the repeat, the refusals and the report sharing a host or batch id with
        // another are named on their own (the test runtime has one thread, so the whole burst
        // is queued before the writer takes it).
        let alone = if b == "postgres" { 5 } else { 0 };
        assert_eq!(counters.alone.get() - alone_before, alone, "{b}");
        assert!(counters.groups.get() - groups_before < 20, "{b}");
        let hosts = crate::store::telemetry::hosts(s.db()).await.unwrap();
        let names: BTreeSet<&str> = hosts.iter().map(|h| h.hostname.as_str()).collect();
        assert_eq!(hosts.len(), 25, "{b}: {names:?}");
        assert!(names.contains(shared_answers[1].1.as_str()), "{b}");
        assert!(!names.contains(shared_answers[0].1.as_str()), "{b}");
        // Each GPU on the host that reported it.
        let fleet = crate::store::telemetry::fleet(s.db()).await.unwrap();
        let host_of = |gpu: &str| {
            fleet
                .iter()
                .find(|f| f.uuid.as_deref() == Some(gpu))
                .map(|f| f.hostname.clone())
        };
        assert_eq!(host_of("GPU-R").as_deref(), Some("rogue-host"), "{b}");
        assert_eq!(host_of("GPU-h5").as_deref(), Some("h-5"), "{b}");
        assert_eq!(host_of("GPU-span").as_deref(), Some("h-span"), "{b}");
        let windows = crate::store::telemetry::gpu_windows(s.db(), T0, T0 + 7_200_000)
            .await
            .unwrap();
        assert_eq!(windows.len(), 25 + 20 + 1 + 2, "{b}");
        // Every host that reported has the hours of its windows marked for the roll-up, once.
        let marks = crate::store::rollups::dirty_marks(s.db(), 1000)
            .await
            .unwrap();
        let marked: BTreeSet<(i64, i64)> = marks.iter().map(|m| (m.hour_ms, m.host_id)).collect();
        assert_eq!(marked.len(), marks.len(), "{b}");
        let mut expected: BTreeSet<(i64, i64)> = hosts.iter().map(|h| (T0, h.id)).collect();
        let span_host = hosts.iter().find(|h| h.hostname == "h-span").unwrap();
        expected.insert((T0 + 3_600_000, span_host.id));
        assert_eq!(marked, expected, "{b}");
    }
}
