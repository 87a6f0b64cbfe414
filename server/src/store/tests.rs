//! The storage contract: every case runs on SQLite and on PostgreSQL.

use std::collections::{BTreeMap, BTreeSet};

use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};
use sqlx::Connection;

use super::{AgentStatus, IngestOutcome, NewToken, Refusal, RefusalKind, Store, StoreError};
use crate::test_support;

const T0: i64 = 1_800_000_000_000;

fn report(batch: &str, start_ms: i64, util: f64) -> Report {
    Report {
        batch_id: batch.into(),
        agent_version: "0.1.0".into(),
        host: HostInfo {
            hostname: "gpu-01".into(),
            cluster: "train".into(),
            provider: Some("aws".into()),
            instance_id: Some("i-0abc".into()),
            instance_type: Some("p4d.24xlarge".into()),
            region: Some("us-east-1".into()),
            lifecycle: Some("spot".into()),
        },
        windows: vec![Window {
            start_ms,
            end_ms: start_ms + 15_000,
            samples: 15,
            gpus: vec![GpuWindow {
                uuid: "GPU-1".into(),
                index: 0,
                name: "NVIDIA A100-SXM4-80GB".into(),
                memory_total_bytes: Some(85_899_345_920),
                memory_used_max_bytes: Some(42_000_000_000),
                util_avg: Some(util),
                util_max: Some(util + 5.0),
                util_histogram: vec![(0, 5), (90, 10)],
                mem_util_avg: None,
                power_avg_watts: Some(310.5),
                temperature_max_c: Some(61.0),
                energy_mj: Some(4_657_500),
                processes: vec![ProcessWindow {
                    pid: 4242,
                    name: Some("python3".into()),
                    memory_used_max_bytes: Some(41_000_000_000),
                    sm_util_avg: Some(util - 1.0),
                    labels: BTreeMap::from([
                        ("model".into(), "llama-70b".into()),
                        ("team".into(), "search".into()),
                        ("mlflow_run_id".into(), "r42".into()),
                    ]),
                    container_id: None,
                    pod_uid: Some("1f2e3d4c-aaaa-bbbb-cccc-111122223333".into()),
                    user: Some("ana".into()),
                }],
                parent_uuid: None,
            }],
        }],
    }
}

async fn with_token(store: &dyn Store) -> i64 {
    store
        .create_token(&NewToken::for_cluster("agent", "hash-1", "train"), T0)
        .await
        .unwrap();
    store.active_token("hash-1", T0).await.unwrap().unwrap().id
}

#[tokio::test]
async fn tokens_create_find_revoke() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        store
            .create_token(&NewToken::for_cluster("a", "h-a", "train"), T0)
            .await
            .unwrap();
        store
            .create_token(&NewToken::for_cluster("b", "h-b", "train"), T0 + 1)
            .await
            .unwrap();
        assert!(
            matches!(
                store
                    .create_token(&NewToken::for_cluster("a", "h-other", "train"), T0)
                    .await,
                Err(StoreError::Conflict(_))
            ),
            "{b}: a second token with the same name is a conflict"
        );
        assert_eq!(
            store
                .active_token("h-a", T0 + 1)
                .await
                .unwrap()
                .unwrap()
                .name,
            "a",
            "{b}"
        );
        assert!(
            store.active_token("nope", T0).await.unwrap().is_none(),
            "{b}"
        );
        assert!(store.revoke_token("a", T0 + 2).await.unwrap(), "{b}");
        assert!(
            !store.revoke_token("a", T0 + 3).await.unwrap(),
            "{b}: already revoked"
        );
        assert!(
            store.active_token("h-a", T0 + 1).await.unwrap().is_none(),
            "{b}: revoked tokens do not authenticate"
        );
        let list = store.list_tokens().await.unwrap();
        assert_eq!(list.len(), 2, "{b}");
        assert_eq!(list[0].revoked_ms, Some(T0 + 2), "{b}");
        assert_eq!(list[1].revoked_ms, None, "{b}");
    }
}

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
        assert_eq!(store.batch_count().await.unwrap(), 1, "{b}");

        let windows = store.gpu_windows(T0, T0 + 60_000).await.unwrap();
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

        let procs = store.process_windows(T0, T0 + 60_000).await.unwrap();
        assert_eq!(procs.len(), 1, "{b}");
        let p = &procs[0];
        assert_eq!(
            (
                p.pid,
                p.model.as_deref(),
                p.team.as_deref(),
                p.experiment.as_deref()
            ),
            (4242, Some("llama-70b"), Some("search"), None),
            "{b}"
        );
        let labels: BTreeMap<String, String> = serde_json::from_str(&p.labels_json).unwrap();
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
        let latest = store.fleet_processes().await.unwrap();
        assert_eq!(latest[0].user_name.as_deref(), Some("ana"), "{b}");

        let fleet = store.fleet().await.unwrap();
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

/// A big batch (an agent back after an outage): more rows than one bulk statement takes, several
/// windows per GPU. Every row lands, and each GPU's row shows its newest window.
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
            store.mig_instances().await.unwrap(),
            vec!["MIG-1".to_owned()],
            "{}",
            db.backend
        );
    }
}

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
        assert_eq!(store.gpu_windows(T0, end).await.unwrap().len(), 640, "{b}");
        assert_eq!(
            store.process_windows(T0, end).await.unwrap().len(),
            640,
            "{b}"
        );
        let fleet = store.fleet().await.unwrap();
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
        let fleet = store.fleet().await.unwrap();
        assert_eq!(
            fleet[0].last_util_avg,
            Some(70.0),
            "{b}: the newest window wins"
        );
        assert_eq!(
            store.gpu_windows(T0, now).await.unwrap().len(),
            2,
            "{b}: the late one is still kept"
        );
        let procs = store.fleet_processes().await.unwrap();
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
        store
            .create_token(&NewToken::for_cluster("other", "hash-2", "train"), T0)
            .await
            .unwrap();
        let other = store.active_token("hash-2", T0).await.unwrap().unwrap().id;
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
        let fleet = store.fleet().await.unwrap();
        assert_eq!(
            (fleet[0].spool_depth, fleet[0].last_report_ms),
            (Some(3), T0 + 20_000),
            "{b}: the host row is as the first report left it"
        );
        let windows = store.gpu_windows(T0, T0 + 60_000).await.unwrap();
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
        let fleet = store.fleet().await.unwrap();
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
        let fleet = store.fleet().await.unwrap();
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
            store.fleet().await.unwrap().is_empty(),
            "{b}: the host upsert was rolled back"
        );
        assert_eq!(store.batch_count().await.unwrap(), 0, "{b}");
        assert!(
            store.gpu_windows(0, i64::MAX).await.unwrap().is_empty(),
            "{b}"
        );
    }
}

/// Tables and columns of both schemas, so a migration added to one backend only fails here.
#[tokio::test]
async fn both_schemas_have_the_same_tables_and_columns() {
    let sqlite_db = test_support::sqlite();
    let pg_db = test_support::postgres().await;
    // Opening runs the migrations.
    sqlite_db.open().await;
    pg_db.open().await;

    let mut lite = sqlx::SqliteConnection::connect(&sqlite_db.url)
        .await
        .unwrap();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT m.name, p.name FROM sqlite_master m JOIN pragma_table_info(m.name) p
         WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND m.name NOT LIKE '_sqlx%'",
    )
    .fetch_all(&mut lite)
    .await
    .unwrap();
    let lite_cols: BTreeSet<(String, String)> = rows.into_iter().collect();

    let mut pg = sqlx::PgConnection::connect(&pg_db.url).await.unwrap();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text FROM information_schema.columns
         WHERE table_schema = 'public' AND table_name NOT LIKE '_sqlx%'",
    )
    .fetch_all(&mut pg)
    .await
    .unwrap();
    let pg_cols: BTreeSet<(String, String)> = rows.into_iter().collect();
    assert!(!lite_cols.is_empty());
    assert_eq!(lite_cols, pg_cols);
}

fn cost_line(line_no: u64, period: i64, cost: &str) -> crate::billing::CostLine {
    let amount = gpuledger_core::money::parse_amount(cost).unwrap();
    crate::billing::CostLine {
        line_no,
        provider: "AWS".into(),
        billing_account_id: "1111".into(),
        billing_period_start_ms: period,
        charge_period_start_ms: period + line_no as i64 * 3_600_000,
        charge_period_end_ms: period + (line_no as i64 + 1) * 3_600_000,
        charge_category: "Usage".into(),
        resource_id: Some("arn:aws:ec2:us-east-1:1111:instance/i-0abc".into()),
        resource_key: Some("i-0abc".into()),
        billed_cost: amount,
        effective_cost: amount,
        list_cost: amount,
        currency: "USD".into(),
        pricing_category: "on_demand".into(),
        commitment_discount_id: None,
        commitment_discount_status: None,
        service_name: Some("AmazonEC2".into()),
        sku_id: None,
        region: Some("us-east-1".into()),
        instance_type: Some("p4d.24xlarge".into()),
        tags_json: "{}".into(),
        extra_json: "{}".into(),
    }
}

#[tokio::test]
async fn bills_import_once_and_a_newer_export_replaces_its_period() {
    const MAY: i64 = 1_777_593_600_000;
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let first = vec![
            cost_line(0, MAY, "32.7726"),
            cost_line(1, MAY, "0.000000000000001"),
        ];
        let s1 = crate::billing::store_lines(
            store.as_ref(),
            "focus",
            "may-v1.csv",
            "sha-1".into(),
            first,
            T0,
        )
        .await
        .unwrap();
        assert!(s1.new, "{b}");
        let again = crate::billing::store_lines(
            store.as_ref(),
            "focus",
            "may-v1.csv",
            "sha-1".into(),
            vec![cost_line(0, MAY, "1")],
            T0,
        )
        .await
        .unwrap();
        assert!(!again.new, "{b}: the same content imports once");
        assert_eq!(again.import_id, s1.import_id);

        let lines = store.cost_lines(MAY, MAY + 10 * 3_600_000).await.unwrap();
        assert_eq!(lines.len(), 2, "{b}");
        assert_eq!(
            lines[1].effective_cost, "0.000000000000001",
            "{b}: amounts round-trip exactly"
        );

        // A newer export of May: replaces both lines.
        let newer = vec![cost_line(0, MAY, "30")];
        let s2 = crate::billing::store_lines(
            store.as_ref(),
            "focus",
            "may-v2.csv",
            "sha-2".into(),
            newer,
            T0 + 1,
        )
        .await
        .unwrap();
        assert_eq!(s2.replaced_lines, 2, "{b}");
        let lines = store.cost_lines(MAY, MAY + 10 * 3_600_000).await.unwrap();
        assert_eq!(lines.len(), 1, "{b}");
        assert_eq!(lines[0].effective_cost, "30", "{b}");
        let imports = store.billing_imports().await.unwrap();
        assert_eq!(imports.len(), 2, "{b}");
        assert_eq!(
            (imports[0].current_lines, imports[1].current_lines),
            (0, 1),
            "{b}"
        );
        assert_eq!(imports[0].effective_total, "32.772600000000001", "{b}");

        // Another month is left alone.
        let june = MAY + 31 * 24 * 3_600_000;
        crate::billing::store_lines(
            store.as_ref(),
            "focus",
            "june.csv",
            "sha-3".into(),
            vec![cost_line(0, june, "5")],
            T0 + 2,
        )
        .await
        .unwrap();
        assert_eq!(
            store.cost_lines(MAY, june + 3_600_000).await.unwrap().len(),
            2,
            "{b}"
        );
    }
}

/// Runs one statement on a test database, whichever backend it is.
async fn execute_sql(db: &test_support::TestDb, sql: &str) {
    if db.backend == "postgres" {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query(sql).execute(&mut c).await.unwrap();
    } else {
        let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        sqlx::query(sql).execute(&mut c).await.unwrap();
    }
}

fn bill_file(
    name: &str,
    sha: &str,
    lines: Vec<crate::billing::CostLine>,
) -> crate::billing::BillFile {
    crate::billing::BillFile::Lines {
        source: "focus".into(),
        name: name.into(),
        content_sha256: sha.into(),
        lines,
    }
}

/// A period in several files: part 2 adds to part 1, a corrected part 1 replaces only part 1,
/// a whole delivery replaces every earlier file, a delivery with a bad file changes nothing,
/// and the billing page's per-file, per-period rows say all of it.
#[tokio::test]
async fn a_period_in_several_files_keeps_every_part_until_it_is_delivered_again() {
    use super::Replaces::{SameName, WholePeriods};
    use crate::billing::{focus::FocusError, import_files};
    const MAY: i64 = 1_777_593_600_000;
    for db in test_support::both().await {
        let store = db.open().await;
        let s = store.as_ref();
        let b = db.backend;
        let in_force = |lines: Vec<super::StoredCostLine>| {
            let mut costs: Vec<String> = lines.into_iter().map(|l| l.effective_cost).collect();
            costs.sort();
            costs
        };
        let part1 = bill_file(
            "exp-00001.csv",
            "sha-p1",
            vec![cost_line(0, MAY, "10"), cost_line(1, MAY, "20")],
        );
        let part2 = bill_file("exp-00002.csv", "sha-p2", vec![cost_line(0, MAY, "5")]);
        let got = import_files(s, SameName, None, vec![part1], T0)
            .await
            .unwrap();
        assert_eq!((got[0].rows, got[0].replaced_lines), (2, 0), "{b}");
        let got = import_files(s, SameName, None, vec![part2], T0 + 1)
            .await
            .unwrap();
        assert_eq!(
            got[0].replaced_lines, 0,
            "{b}: part 2 never replaces part 1"
        );
        let may = || s.cost_lines(MAY, MAY + 10 * 3_600_000);
        assert_eq!(in_force(may().await.unwrap()), ["10", "20", "5"], "{b}");

        // The same file again is a no-op.
        let again = bill_file(
            "exp-00001.csv",
            "sha-p1",
            vec![cost_line(0, MAY, "10"), cost_line(1, MAY, "20")],
        );
        let got = import_files(s, SameName, None, vec![again], T0 + 2)
            .await
            .unwrap();
        assert!(!got[0].new, "{b}");

        // Part 1 corrected: replaces part 1, keeps part 2.
        let fixed = bill_file("exp-00001.csv", "sha-p1b", vec![cost_line(0, MAY, "11")]);
        let got = import_files(s, SameName, None, vec![fixed], T0 + 3)
            .await
            .unwrap();
        assert_eq!(got[0].replaced_lines, 2, "{b}");
        let fixed_id = got[0].import_id;
        assert_eq!(in_force(may().await.unwrap()), ["11", "5"], "{b}");

        // The same lines under another name: a new export of May taken for a part, refused.
        let renamed = bill_file("may-again.csv", "sha-again", vec![cost_line(0, MAY, "11")]);
        match import_files(s, SameName, None, vec![renamed], T0 + 4).await {
            Err(crate::billing::ImportError::Focus {
                file,
                error:
                    FocusError::RepeatsFile {
                        other,
                        repeated,
                        sampled,
                    },
            }) => {
                assert_eq!(
                    (file.as_str(), other.as_str()),
                    ("may-again.csv", "exp-00001.csv"),
                    "{b}"
                );
                assert_eq!((repeated, sampled), (1, 1), "{b}");
            }
            other => panic!("{b}: {other:?}"),
        }
        assert_eq!(in_force(may().await.unwrap()), ["11", "5"], "{b}");

        // A delivery with a bad file stores nothing and replaces nothing.
        let good = bill_file("run2-00001.csv", "sha-r1", vec![cost_line(0, MAY, "1")]);
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(Err(FocusError::Line {
            line: 7,
            message: "broken".into(),
        }))
        .await
        .unwrap();
        drop(tx);
        let bad_lines = rx;
        let (ftx, mut files) = tokio::sync::mpsc::channel(2);
        let good_open = match good {
            crate::billing::BillFile::Lines { lines, .. } => {
                crate::billing::chunks_of(lines.into_iter().map(Ok))
            }
            _ => unreachable!(),
        };
        let import = |name: &str, sha: &str| super::NewImport {
            source: "focus".into(),
            name: name.into(),
            content_sha256: sha.into(),
            imported_ms: T0 + 4,
            delivery: Some("run-2".into()),
        };
        ftx.send((import("run2-00001.csv", "sha-r1"), good_open))
            .await
            .unwrap();
        ftx.send((import("run2-00002.csv", "sha-r2"), bad_lines))
            .await
            .unwrap();
        drop(ftx);
        match s.import_bill(WholePeriods, &mut files).await {
            Err(StoreError::Rejected { file, .. }) => assert_eq!(file, "run2-00002.csv", "{b}"),
            other => panic!("{b}: {other:?}"),
        }
        assert_eq!(in_force(may().await.unwrap()), ["11", "5"], "{b}");
        assert_eq!(s.billing_imports().await.unwrap().len(), 3, "{b}");

        // The whole delivery: every earlier file of May is replaced.
        let run2 = vec![
            bill_file("run2-00001.csv", "sha-r1", vec![cost_line(0, MAY, "1")]),
            bill_file("run2-00002.csv", "sha-r2", vec![cost_line(0, MAY, "2")]),
        ];
        let got = import_files(s, WholePeriods, Some("run-2".into()), run2, T0 + 5)
            .await
            .unwrap();
        assert_eq!(got.iter().map(|g| g.replaced_lines).sum::<u64>(), 2, "{b}");
        assert_eq!(in_force(may().await.unwrap()), ["1", "2"], "{b}");

        let periods = s.billing_file_periods().await.unwrap();
        let row = |name: &str, sha_new: bool| {
            periods
                .iter()
                .filter(|p| p.name == name)
                .find(|p| (p.import_id == fixed_id) == sha_new)
                .cloned()
                .unwrap_or_else(|| panic!("{b}: no row for {name}"))
        };
        let first = row("exp-00001.csv", false);
        assert_eq!(first.replaced_by, Some(fixed_id), "{b}");
        assert_eq!(first.replaced_ms, Some(T0 + 3), "{b}");
        assert_eq!(
            (first.row_count, first.billed_total.as_deref()),
            (2, Some("30")),
            "{b}"
        );
        assert_eq!(row("exp-00001.csv", true).replaced_ms, Some(T0 + 5), "{b}");
        let run = row("run2-00002.csv", false);
        assert_eq!(
            (run.replaced_ms, run.delivery.as_deref()),
            (None, Some("run-2")),
            "{b}"
        );
        assert_eq!(
            periods.iter().filter(|p| p.replaced_ms.is_none()).count(),
            2,
            "{b}"
        );

        // Files imported before per-period totals existed are summed once, on first read.
        execute_sql(
            &db,
            "UPDATE billing_file_periods SET billed_total = NULL, effective_total = NULL",
        )
        .await;
        let again = s.billing_file_periods().await.unwrap();
        let run = again.iter().find(|p| p.name == "run2-00002.csv").unwrap();
        assert_eq!(run.billed_total.as_deref(), Some("2"), "{b}");
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
        let hosts = store.hosts().await.unwrap();
        assert_eq!(
            hosts[0].instance_key.as_deref(),
            Some("i-0abc"),
            "{}",
            db.backend
        );
        let windows = store.attribution_windows(T0, T0 + 60_000).await.unwrap();
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
async fn one_replica_at_a_time_holds_a_job_lease() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        assert!(
            store
                .try_lease("aws-sync", "replica-a", T0, 60_000)
                .await
                .unwrap(),
            "{b}"
        );
        assert!(
            !store
                .try_lease("aws-sync", "replica-b", T0 + 1, 60_000)
                .await
                .unwrap(),
            "{b}: held by a"
        );
        assert!(
            store
                .try_lease("aws-sync", "replica-a", T0 + 2, 60_000)
                .await
                .unwrap(),
            "{b}: a renews"
        );
        assert!(
            store
                .try_lease("aws-sync", "replica-b", T0 + 70_000, 60_000)
                .await
                .unwrap(),
            "{b}: a's lease expired"
        );
        store
            .finish_lease("aws-sync", "replica-b", T0 + 80_000)
            .await
            .unwrap();
        assert_eq!(
            store.job_last_run("aws-sync").await.unwrap(),
            Some(T0 + 80_000),
            "{b}"
        );
        assert!(
            store
                .try_lease("aws-sync", "replica-a", T0 + 80_001, 60_000)
                .await
                .unwrap(),
            "{b}: released on finish"
        );
        assert_eq!(store.job_last_run("other").await.unwrap(), None, "{b}");

        store
            .mark_ce_synced(&[T0, T0 + 86_400_000], T0)
            .await
            .unwrap();
        store.mark_ce_synced(&[T0], T0 + 5).await.unwrap();
        assert_eq!(
            store.ce_synced_days(T0, T0 + 86_400_000).await.unwrap(),
            vec![T0],
            "{b}"
        );
    }
}

#[tokio::test]
async fn users_and_sessions() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        store.create_user("ana", "hash", "admin", T0).await.unwrap();
        assert!(
            matches!(
                store.create_user("ana", "h2", "viewer", T0).await,
                Err(StoreError::Conflict(_))
            ),
            "{b}"
        );
        let ana = store.user_by_name("ana").await.unwrap().unwrap();
        assert_eq!(ana.role, "admin", "{b}");
        assert!(store.user_by_name("bob").await.unwrap().is_none(), "{b}");
        store
            .create_session("s1", ana.id, "csrf-1", T0, T0 + 1_000)
            .await
            .unwrap();
        let s = store.session("s1", T0 + 10).await.unwrap().unwrap();
        assert_eq!(
            (s.username.as_str(), s.role.as_str(), s.csrf_token.as_str()),
            ("ana", "admin", "csrf-1"),
            "{b}"
        );
        assert!(
            store.session("s1", T0 + 1_000).await.unwrap().is_none(),
            "{b}: expired"
        );
        store
            .create_session("s2", ana.id, "csrf-2", T0 + 2_000, T0 + 5_000)
            .await
            .unwrap();
        assert!(
            store.session("s2", T0 + 2_001).await.unwrap().is_some(),
            "{b}"
        );
        store.delete_session("s2").await.unwrap();
        assert!(
            store.session("s2", T0 + 2_002).await.unwrap().is_none(),
            "{b}: signed out"
        );
        assert_eq!(store.list_users().await.unwrap().len(), 1, "{b}");
    }
}

#[test]
fn database_passwords_never_reach_logs() {
    use super::redacted_url;
    assert_eq!(
        redacted_url("postgres://ledger:s3cret@db.internal:5432/gpuledger"),
        "postgres://ledger:***@db.internal:5432/gpuledger"
    );
    assert_eq!(
        redacted_url("postgresql://ledger@db/gl?sslmode=require&password=s3cret"),
        "postgresql://ledger@db/gl?sslmode=require&password=***"
    );
    assert_eq!(
        redacted_url("sqlite://gpuledger.db"),
        "sqlite://gpuledger.db"
    );
    assert_eq!(redacted_url("sqlite:data.db"), "sqlite:data.db");
}

#[tokio::test]
async fn usage_counts_replace_per_source_and_add_across_sources() {
    use super::UsageCount;
    let count = |endpoint: &str, hour: i64, requests: i64| UsageCount {
        endpoint: endpoint.into(),
        start_ms: T0 + hour * 3_600_000,
        end_ms: T0 + (hour + 1) * 3_600_000,
        requests,
    };
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let owner = token_for(store.as_ref(), "owner", "owner-hash", T0).await;
        assert_eq!(owner, 1, "{b}: the counts below come from token 1");
        store
            .upsert_usage(
                "pod-a",
                &[count("chat", 0, 1_000), count("chat", 1, 2_000)],
                1,
                T0,
            )
            .await
            .unwrap();
        // A resend of hour 1 with a corrected count replaces it; another replica adds.
        store
            .upsert_usage("pod-a", &[count("chat", 1, 2_500)], 1, T0)
            .await
            .unwrap();
        store
            .upsert_usage(
                "pod-b",
                &[count("chat", 1, 500), count("embed", 0, 7)],
                1,
                T0,
            )
            .await
            .unwrap();
        assert_eq!(
            store.usage_totals(T0, T0 + 2 * 3_600_000).await.unwrap(),
            vec![("chat".to_owned(), 4_000), ("embed".to_owned(), 7)],
            "{b}"
        );
        assert_eq!(
            store
                .usage_totals(T0 + 3_600_000, T0 + 2 * 3_600_000)
                .await
                .unwrap(),
            vec![("chat".to_owned(), 3_000)],
            "{b}: only periods starting in the range"
        );
        // Another active token may not replace pod-a's counts: the whole post is refused.
        let rogue = token_for(store.as_ref(), "rogue", "rogue-hash", T0).await;
        let refusal = store
            .upsert_usage(
                "pod-a",
                &[count("chat", 5, 1), count("chat", 1, 999_999)],
                rogue,
                T0,
            )
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{b}: another token's counts must not be replaced"));
        assert_eq!(refusal.kind, RefusalKind::SourceOfAnotherToken, "{b}");
        assert_eq!(refusal.field, "counts[1]", "{b}");
        assert_eq!(
            store.usage_totals(T0, T0 + 6 * 3_600_000).await.unwrap(),
            vec![("chat".to_owned(), 4_000), ("embed".to_owned(), 7)],
            "{b}: nothing of the refused post was kept"
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
        let all = store.attribution_windows(from, to).await.unwrap();
        assert_eq!(all.len(), 35, "{b}");
        let mut ids: Vec<i64> = all.iter().map(|w| w.host_id).collect();
        ids.dedup();
        // Not host 1, which reported GPU-h1-0 first.
        let chosen = vec![ids[2], ids[4], ids[5]];
        let (windows, processes) = store
            .attribution_inputs_of_hosts(from, to, &chosen)
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
        let expected: Vec<_> = store
            .process_windows(from, to)
            .await
            .unwrap()
            .into_iter()
            .filter(|p| gpus.contains(p.gpu_uuid.as_str()))
            .collect();
        // One more than the windows: GPU-h1-0's process of its window on host 1, which readers
        // match to no window of the group.
        assert_eq!(processes.len(), 19, "{b}");
        assert_eq!(processes, expected, "{b}: their GPUs' processes, in order");
        let none = store
            .attribution_inputs_of_hosts(from, to, &[])
            .await
            .unwrap();
        assert_eq!(none, (vec![], vec![]), "{b}: no hosts, nothing read");
    }
}

async fn token_for(store: &dyn Store, name: &str, hash: &str, now: i64) -> i64 {
    store
        .create_token(&NewToken::for_cluster(name, hash, "train"), now)
        .await
        .unwrap();
    store.active_token(hash, now).await.unwrap().unwrap().id
}

/// The rogue-agent case in storage: a host, and each of its GPUs, belong to the first token
/// that reports them. Another token's report for the host or one of its GPUs is refused whole
/// (nothing of it stored, the first token's data untouched) until an admin moves the host; a
/// host whose token was revoked is free for the next token.
#[tokio::test]
async fn a_host_and_its_gpus_belong_to_the_first_token_that_reports_them() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let status = AgentStatus::default();
        let real = token_for(s, "rack-1", "hash-real", T0).await;
        let rogue = token_for(s, "rogue", "hash-rogue", T0).await;
        let now = T0 + 600_000;
        let first = report("real-1", T0, 0.0);
        assert_eq!(
            s.ingest(&first, real, status, now).await.unwrap(),
            IngestOutcome::Stored
        );

        // The same host, the next window, from the rogue token.
        let mut same_host = report("rogue-1", T0 + 15_000, 100.0);
        same_host.windows[0].gpus[0].processes[0]
            .labels
            .insert("team".into(), "evil".into());
        let IngestOutcome::Refused(refusal) =
            s.ingest(&same_host, rogue, status, now).await.unwrap()
        else {
            panic!("{b}: another token's report for a bound host must be refused");
        };
        assert_eq!(refusal.kind, RefusalKind::HostOfAnotherToken, "{b}");
        assert_eq!(refusal.field, "host.hostname", "{b}");
        assert!(
            refusal.message.contains("\"rack-1\""),
            "{b}: {}",
            refusal.message
        );

        // Its own host name, but the real host's GPU.
        let mut stolen_gpu = report("rogue-2", T0 + 15_000, 100.0);
        stolen_gpu.host.hostname = "rogue-host".into();
        let IngestOutcome::Refused(refusal) =
            s.ingest(&stolen_gpu, rogue, status, now).await.unwrap()
        else {
            panic!("{b}: another token's report for a bound GPU must be refused");
        };
        assert_eq!(refusal.kind, RefusalKind::GpuOfAnotherToken, "{b}");
        assert_eq!(refusal.field, "windows[0].gpus[0].uuid", "{b}");
        assert_eq!(
            s.batch_count().await.unwrap(),
            1,
            "{b}: nothing of either was stored"
        );
        let hosts = s.hosts().await.unwrap();
        assert_eq!(
            hosts.len(),
            1,
            "{b}: the rogue's host was not created either"
        );
        let windows = s.gpu_windows(T0, T0 + 60_000).await.unwrap();
        assert_eq!(windows.len(), 1, "{b}");
        assert_eq!(windows[0].util_avg, Some(0.0), "{b}");

        // The real agent goes on.
        let next = report("real-2", T0 + 15_000, 5.0);
        assert_eq!(
            s.ingest(&next, real, status, now).await.unwrap(),
            IngestOutcome::Stored
        );

        // An admin moves the host: from then on the other token reports it, and the first not.
        assert!(
            s.rebind_host("train", "gpu-01", rogue).await.unwrap(),
            "{b}"
        );
        assert!(!s.rebind_host("train", "nope", rogue).await.unwrap(), "{b}");
        let moved = report("rogue-3", T0 + 30_000, 50.0);
        assert_eq!(
            s.ingest(&moved, rogue, status, now).await.unwrap(),
            IngestOutcome::Stored
        );
        let back = report("real-3", T0 + 45_000, 5.0);
        assert!(
            matches!(
                s.ingest(&back, real, status, now).await.unwrap(),
                IngestOutcome::Refused(_)
            ),
            "{b}"
        );

        // Revoking the holder frees the host for the next token that reports it.
        assert!(s.revoke_token("rogue", now).await.unwrap());
        assert_eq!(
            s.ingest(&back, real, status, now + 1).await.unwrap(),
            IngestOutcome::Stored
        );
        assert_eq!(
            s.token_clusters(real).await.unwrap(),
            vec!["train".to_owned()]
        );
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
        let windows = s.gpu_windows(T0, T0 + 60_000).await.unwrap();
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
        assert_eq!(s.batch_count().await.unwrap(), 1, "{b}");
        // The batch id was not used up: the agent can send the new window alone under it.
        let alone = report("b-2", T0 + 15_000, 90.0);
        assert_eq!(
            s.ingest(&alone, token, status, now).await.unwrap(),
            IngestOutcome::Stored
        );
    }
}

/// Rotation keeps the old secret working for the overlap only; expiry ends a token; last use is
/// kept; refused reports are counted per token, host and reason.
#[tokio::test]
async fn tokens_rotate_expire_and_keep_their_refusals() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        token_for(s, "rack-1", "old", T0).await;
        assert!(s
            .rotate_token("rack-1", "new", T0 + 1_000, T0)
            .await
            .unwrap());
        assert!(!s.rotate_token("nope", "x", T0 + 1_000, T0).await.unwrap());
        assert!(
            s.active_token("new", T0 + 5_000).await.unwrap().is_some(),
            "{b}"
        );
        assert!(
            s.active_token("old", T0 + 999).await.unwrap().is_some(),
            "{b}: overlap"
        );
        assert!(
            s.active_token("old", T0 + 1_000).await.unwrap().is_none(),
            "{b}: overlap over"
        );

        s.create_token(
            &NewToken {
                expires_ms: Some(T0 + 10_000),
                host_pattern: Some("gpu-*"),
                ..NewToken::for_cluster("short", "short-hash", "train")
            },
            T0,
        )
        .await
        .unwrap();
        let short = s
            .active_token("short-hash", T0 + 9_999)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(short.host_pattern.as_deref(), Some("gpu-*"), "{b}");
        assert!(
            s.active_token("short-hash", T0 + 10_000)
                .await
                .unwrap()
                .is_none(),
            "{b}"
        );
        assert!(
            !s.rotate_token("short", "x", T0 + 20_000, T0 + 10_000)
                .await
                .unwrap(),
            "{b}: an expired token cannot be rotated back to life"
        );

        s.touch_token(short.id, T0 + 5, Some("10.0.0.7"))
            .await
            .unwrap();
        s.touch_token(short.id, T0 + 4, None).await.unwrap();
        let listed = s.token_by_name("short").await.unwrap().unwrap();
        assert_eq!(
            (listed.last_used_ms, listed.last_address.as_deref()),
            (Some(T0 + 5), Some("10.0.0.7")),
            "{b}: last use only moves forward"
        );

        let refusal = Refusal {
            kind: RefusalKind::ClusterOutOfScope,
            field: "host.cluster".into(),
            message: "not this cluster".into(),
        };
        for at in [T0 + 100, T0 + 200] {
            s.record_refusal(short.id, "infer", "gpu-9", &refusal, at)
                .await
                .unwrap();
        }
        let rows = s.ingest_refusals(T0).await.unwrap();
        assert_eq!(rows.len(), 1, "{b}");
        assert_eq!(
            (
                rows[0].token.as_str(),
                rows[0].reason.as_str(),
                rows[0].attempts
            ),
            ("short", "cluster_out_of_scope", 2),
            "{b}"
        );
        assert_eq!(
            (rows[0].first_ms, rows[0].last_ms),
            (T0 + 100, T0 + 200),
            "{b}"
        );
        assert!(s.ingest_refusals(T0 + 201).await.unwrap().is_empty(), "{b}");
    }
}

/// A database as it was before migration 0014: migrations 0001–0013 only, from a copy of this
/// backend's folder.
async fn migrations_before_scopes(backend: &str) -> (tempfile::TempDir, sqlx::migrate::Migrator) {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(backend);
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.as_str() < "0014" {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    let migrator = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
    (dir, migrator)
}

/// What the old schema held: t1 reported cluster a, t2 clusters b and c, t3 nothing yet.
const BEFORE_SCOPES: &[&str] = &[
    "INSERT INTO api_tokens (id, name, token_hash, created_ms) VALUES
        (1, 't1', 'h1', 0), (2, 't2', 'h2', 0), (3, 't3', 'h3', 0)",
    "INSERT INTO hosts (id, cluster, hostname, last_report_ms) VALUES
        (1, 'a', 'x', 0), (2, 'b', 'y', 0), (3, 'c', 'z', 0)",
    "INSERT INTO ingested_batches (batch_id, host_id, token_id, received_ms, windows) VALUES
        ('b1', 1, 1, 10, 1), ('b2', 2, 2, 10, 1), ('b3', 3, 2, 10, 1), ('b4', 1, 2, 20, 1)",
];

/// Migration 0014 on a database with tokens made before scopes: hosts are bound to the token of
/// their first batch; a token of one cluster is scoped to it; one of several clusters keeps
/// reporting those only; one that never reported takes the first cluster it reports.
#[tokio::test]
async fn tokens_made_before_scopes_keep_reporting_what_they_reported() {
    use gpuledger_proto::HostInfo;
    for db in test_support::both().await {
        let b = db.backend;
        let (_dir, migrator) = migrations_before_scopes(b).await;
        if b == "sqlite" {
            use sqlx::sqlite::SqliteConnectOptions;
            let options = std::str::FromStr::from_str(&db.url)
                .map(|o: SqliteConnectOptions| o.create_if_missing(true));
            let pool = sqlx::SqlitePool::connect_with(options.unwrap())
                .await
                .unwrap();
            migrator.run(&pool).await.unwrap();
            for sql in BEFORE_SCOPES {
                sqlx::query(sql).execute(&pool).await.unwrap();
            }
            pool.close().await;
        } else {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            migrator.run(&pool).await.unwrap();
            for sql in BEFORE_SCOPES {
                sqlx::query(sql).execute(&pool).await.unwrap();
            }
            pool.close().await;
        }
        let store = db.open().await;
        let s = store.as_ref();
        let tokens = s.list_tokens().await.unwrap();
        let scopes: Vec<Option<&str>> = tokens.iter().map(|t| t.cluster.as_deref()).collect();
        assert_eq!(scopes, [Some("a"), None, None], "{b}");
        assert_eq!(s.token_clusters(1).await.unwrap(), ["a"], "{b}");
        assert_eq!(
            s.token_clusters(2).await.unwrap(),
            ["b", "c"],
            "{b}: host x stays t1's"
        );

        let host = |cluster: &str| HostInfo {
            cluster: cluster.into(),
            hostname: "new".into(),
            ..HostInfo::default()
        };
        let allowed = |t: &crate::store::TokenRow, cluster: &str| {
            let store = store.clone();
            let (t, h) = (t.clone(), host(cluster));
            async move {
                crate::auth::authorize_report(store.as_ref(), &t, &h)
                    .await
                    .unwrap()
                    .is_ok()
            }
        };
        assert!(
            allowed(&tokens[0], "a").await && !allowed(&tokens[0], "b").await,
            "{b}"
        );
        assert!(
            allowed(&tokens[1], "c").await && !allowed(&tokens[1], "a").await,
            "{b}"
        );
        assert!(
            allowed(&tokens[2], "d").await,
            "{b}: t3 takes its first cluster"
        );
        let t3 = s.token_by_name("t3").await.unwrap().unwrap();
        assert_eq!(t3.cluster.as_deref(), Some("d"), "{b}");
        assert!(!allowed(&t3, "a").await, "{b}: and only that one");
    }
}
