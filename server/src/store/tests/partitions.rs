//! History partitions, PostgreSQL's own (SQLite has none and keeps batched deletes): made ahead,
//! rows that waited in a default partition moved into theirs, past days dropped whole, and an
//! existing database migrated without losing a row. Every case runs on both backends: what is
//! read back must not depend on where the rows sit.

use super::*;
use crate::store::partitions::{self, Partition, Waiting};
use crate::store::RollupGrain;

const DAY: i64 = 86_400_000;

fn day_of(ms: i64) -> i64 {
    ms.div_euclid(DAY) * DAY
}

fn day_name(table: &str, ms: i64) -> String {
    let day = chrono::DateTime::from_timestamp_millis(ms).unwrap();
    format!("{table}_{}", day.format("%Y%m%d"))
}

async fn names(s: &dyn Store, table: &str) -> Vec<String> {
    partitions::partitions(s.db(), table)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect()
}

/// Rows held by one table (a partition, on PostgreSQL), read past the store.
async fn rows_in(db: &test_support::TestDb, table: &str) -> i64 {
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (n,): (i64,) = sqlx::query_as(&format!("SELECT COUNT(*) FROM \"{table}\""))
        .fetch_one(&mut c)
        .await
        .unwrap();
    n
}

async fn windows(s: &dyn Store, from: i64, to: i64) -> Vec<(String, i64)> {
    crate::store::telemetry::gpu_windows(s.db(), from, to)
        .await
        .unwrap()
        .into_iter()
        .map(|w| (w.gpu_uuid, w.start_ms))
        .collect()
}

async fn rollup_count(s: &dyn Store, from: i64, to: i64) -> usize {
    crate::store::ledger::rollup_rows(s.db(), RollupGrain::Hour, from, to)
        .await
        .unwrap()
        .len()
}

/// Days of windows ingested before any partition was made land in the default partition; the
/// job makes their days and the week ahead, moves them in, and a second run makes nothing.
/// Reads, repeats and refusals are unchanged. Retention then drops whole past days (PostgreSQL)
/// or deletes their rows (SQLite), and both read the same history after.
#[tokio::test]
async fn history_partitions_are_made_ahead_filled_from_the_default_and_dropped_whole() {
    for db in test_support::both().await {
        let store = db.open().await;
        let s = store.as_ref();
        let b = db.backend;
        let token = with_token(s).await;
        for k in 0..4 {
            let r = report(&format!("day-{k}"), T0 + k * DAY, 50.0);
            let at = T0 + k * DAY + 20_000;
            assert_eq!(
                s.ingest(&r, token, AgentStatus::default(), at)
                    .await
                    .unwrap(),
                IngestOutcome::Stored,
                "{b}"
            );
        }
        test_support::roll_up(s).await;
        let span = (T0 - 40 * DAY, T0 + 60 * DAY);
        let before = windows(s, span.0, span.1).await;
        let rollups = rollup_count(s, span.0, span.1).await;
        assert_eq!(before.len(), 4, "{b}");
        assert!(rollups >= 4, "{b}: {rollups} rollup rows");

        let now = T0 + 2 * DAY;
        // As `serve` starts: the days and months ahead, none whose rows wait in the default.
        let ahead = partitions::make_ahead(s.db(), now, now - 35 * DAY, Waiting::Leave)
            .await
            .unwrap();
        if b == "postgres" {
            // Only the table with nothing waiting in its default: the others' backlog (and the
            // read of it each attach makes) is the job's.
            let expected = ["rollup_unattributed_202701", "rollup_unattributed_202702"];
            assert_eq!(ahead.partitions, expected, "{b}");
            assert_eq!(ahead.rows_moved, 0, "{b}");
            assert_eq!(
                rows_in(&db, "gpu_windows_default").await,
                4,
                "{b}: left for the job"
            );
        } else {
            assert_eq!(ahead, Default::default(), "{b}");
        }
        let made = partitions::make_ahead(s.db(), now, now - 35 * DAY, Waiting::Move)
            .await
            .unwrap();
        if b == "postgres" {
            // The four waiting days, then yesterday, today and the week ahead.
            let mut days: Vec<String> = (0..=9)
                .map(|k| day_name("gpu_windows", T0 + k * DAY))
                .collect();
            days.push("gpu_windows_default".into());
            assert_eq!(names(s, "gpu_windows").await, days, "{b}");
            assert_eq!(rows_in(&db, "gpu_windows_default").await, 0, "{b}");
            assert_eq!(rows_in(&db, "process_windows_default").await, 0, "{b}");
            assert_eq!(rows_in(&db, &day_name("gpu_windows", T0)).await, 1, "{b}");
            assert_eq!(
                names(s, "rollup_hours").await,
                [
                    "rollup_hours_202701",
                    "rollup_hours_202702",
                    "rollup_hours_default"
                ],
                "{b}: this month and the next"
            );
            assert_eq!(rows_in(&db, "rollup_hours_default").await, 0, "{b}");
            assert!(
                made.rows_moved as usize >= 4 + 4 + rollups,
                "{b}: windows, processes and rollups moved: {made:?}"
            );
            assert!(made.left_for_later.is_empty(), "{b}");
            // Autovacuum never analyzes a parent: making a partition does.
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            let (sampled,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM pg_stats WHERE tablename = 'gpu_windows' AND inherited",
            )
            .fetch_one(&mut c)
            .await
            .unwrap();
            assert!(sampled > 0, "{b}: the parent's statistics");
            let again = partitions::make_ahead(s.db(), now, now - 35 * DAY, Waiting::Move)
                .await
                .unwrap();
            assert_eq!(again, Default::default(), "{b}: nothing more to make");
        } else {
            assert_eq!(made, Default::default(), "{b}: SQLite has no partitions");
            assert!(names(s, "gpu_windows").await.is_empty(), "{b}");
        }
        assert_eq!(windows(s, span.0, span.1).await, before, "{b}");
        assert_eq!(rollup_count(s, span.0, span.1).await, rollups, "{b}");

        // Ingest is the same across partitions: a repeat is acknowledged, a stored window under
        // a new batch id refused, a day made ahead and a day far ahead (the default) both taken.
        let again = report("day-1", T0 + DAY, 50.0);
        assert_eq!(
            s.ingest(&again, token, AgentStatus::default(), now)
                .await
                .unwrap(),
            IngestOutcome::Duplicate,
            "{b}"
        );
        let resent = report("day-1-again", T0 + DAY, 50.0);
        assert!(
            matches!(
                s.ingest(&resent, token, AgentStatus::default(), now)
                    .await
                    .unwrap(),
                IngestOutcome::Refused(_)
            ),
            "{b}: a stored window under a new batch id"
        );
        for (batch, at) in [("ahead", T0 + 5 * DAY), ("far", T0 + 30 * DAY)] {
            let r = report(batch, at, 50.0);
            assert_eq!(
                s.ingest(&r, token, AgentStatus::default(), now)
                    .await
                    .unwrap(),
                IngestOutcome::Stored,
                "{b}: {batch}"
            );
        }
        if b == "postgres" {
            assert_eq!(rows_in(&db, "gpu_windows_default").await, 1, "{b}");
            let made = partitions::make_ahead(s.db(), now, now - 35 * DAY, Waiting::Move)
                .await
                .unwrap();
            let far = day_name("gpu_windows", T0 + 30 * DAY);
            assert!(made.partitions.contains(&far), "{b}: {made:?}");
            assert_eq!(made.rows_moved, 2, "{b}: its GPU and process windows");
            assert_eq!(rows_in(&db, &far).await, 1, "{b}");
        }
        let kept = windows(s, span.0, span.1).await;
        assert_eq!(kept.len(), 6, "{b}");
        // The fleet's latest state is the newest window, whichever partition holds it.
        let fleet = crate::store::telemetry::fleet(s.db()).await.unwrap();
        let gpu = fleet.iter().find(|f| f.uuid.as_deref() == Some("GPU-1"));
        assert_eq!(
            gpu.and_then(|g| g.last_window_end_ms),
            Some(T0 + 30 * DAY + 15_000),
            "{b}"
        );
        let procs = crate::store::telemetry::fleet_processes(s.db())
            .await
            .unwrap();
        assert_eq!(
            procs.iter().map(|p| p.pid).collect::<Vec<_>>(),
            [4242],
            "{b}"
        );

        // Retention to 10:00 of T0's third day keeps that day whole (its window is at 08:00):
        // the first two days go whole on PostgreSQL, and no row of the third goes an hour at a
        // time.
        let cutoff = day_of(T0) + 2 * DAY;
        let retention = 35 * DAY;
        let now = cutoff + 10 * 3_600_000 + retention;
        let deleted = crate::rollup::enforce_retention(s, now, retention, i64::MAX)
            .await
            .unwrap();
        let after = windows(s, span.0, span.1).await;
        let expected: Vec<(String, i64)> = kept
            .iter()
            .filter(|(_, start)| *start >= cutoff)
            .cloned()
            .collect();
        assert_eq!(after, expected, "{b}");
        assert_eq!(after.len(), 4, "{b}");
        assert!(
            crate::store::telemetry::process_windows(s.db(), span.0, cutoff)
                .await
                .unwrap()
                .is_empty(),
            "{b}"
        );
        if b == "postgres" {
            let left = names(s, "gpu_windows").await;
            assert!(
                !left.contains(&day_name("gpu_windows", T0)),
                "{b}: {left:?}"
            );
            assert!(!left.contains(&day_name("gpu_windows", T0 + DAY)), "{b}");
            assert!(left.contains(&day_name("gpu_windows", T0 + 2 * DAY)), "{b}");
            assert!(
                !names(s, "process_windows")
                    .await
                    .contains(&day_name("process_windows", T0)),
                "{b}"
            );
            assert_eq!(deleted, 2, "{b}: only the batch ids went row by row");
        } else {
            assert!(
                deleted >= 2 + 2 + 2,
                "{b}: windows, processes, batches: {deleted}"
            );
        }
        assert_eq!(
            rollup_count(s, span.0, span.1).await,
            rollups,
            "{b}: attribution keeps every month"
        );
    }
}

/// What a database of a release before partitions holds.
const BEFORE_PARTITIONS: &[&str] = &[
    "INSERT INTO hosts (cluster, hostname, last_report_ms) VALUES ('train', 'old-01', 0)",
    "INSERT INTO gpu_windows (gpu_uuid, start_ms, end_ms, host_id, batch_id, samples)
     SELECT 'GPU-OLD', s, s + 15000, id, 'old-' || s, 15 FROM hosts,
        (SELECT 1800000000000 AS s UNION ALL SELECT 1800086400000) AS starts",
    "INSERT INTO process_windows (gpu_uuid, start_ms, pid, end_ms, labels_json, host_id)
     SELECT 'GPU-OLD', 1800000000000, 7, 1800000015000, '{}', id FROM hosts",
    "INSERT INTO owners (labels) VALUES ('{\"team\":\"old\"}')",
    "INSERT INTO rollup_hours (hour_ms, host_id, gpu_uuid, kind, pricing_category, currency,
        estimated, cost_nano, cost_atto, gpu_seconds, util_gpu_seconds, util_known_seconds,
        energy_j, owner_id)
     SELECT 1799999999999 - 1799999999999 % 3600000, h.id, 'GPU-OLD', 'used', 'on_demand',
        'USD', 1, 5000000000, 0, 3600, 1800, 3600, 0, o.id FROM hosts h, owners o",
    "INSERT INTO rollup_unattributed (hour_ms, currency, cost_nano, cost_atto)
     VALUES (1799996400000, 'USD', 1000000000, 0)",
];

/// Migration 0041 on a database with history: each table becomes the first partition of its
/// partitioned table (everything before the day, or month, after its latest row), nothing is
/// copied or lost, new days go to partitions of their own, and once retention passes its bound
/// the old table is dropped whole. SQLite's tables are left as they were.
#[tokio::test]
async fn an_existing_database_keeps_every_row_when_its_history_is_partitioned() {
    for db in test_support::both().await {
        let b = db.backend;
        let (_dir, migrator) = migrations_before(b, "0041").await;
        old_database(&db, &migrator, BEFORE_PARTITIONS).await;
        let store = db.open().await;
        let s = store.as_ref();
        let span = (T0 - 40 * DAY, T0 + 60 * DAY);
        let old = windows(s, span.0, span.1).await;
        assert_eq!(
            old,
            [("GPU-OLD".to_owned(), T0), ("GPU-OLD".to_owned(), T0 + DAY)],
            "{b}"
        );
        assert_eq!(
            crate::store::telemetry::process_windows(s.db(), span.0, span.1)
                .await
                .unwrap()
                .len(),
            1,
            "{b}"
        );
        assert_eq!(rollup_count(s, span.0, span.1).await, 1, "{b}");
        let unattributed = crate::store::ledger::rollup_unattributed(s.db(), span.0, span.1)
            .await
            .unwrap();
        assert_eq!(unattributed.len(), 1, "{b}");

        let bound = day_of(T0 + DAY) + DAY;
        if b == "postgres" {
            let first = day_name("gpu_windows_before", bound);
            assert_eq!(
                partitions::partitions(s.db(), "gpu_windows").await.unwrap(),
                [
                    Partition {
                        name: first.clone(),
                        from_ms: None,
                        to_ms: Some(bound),
                        is_default: false
                    },
                    Partition {
                        name: "gpu_windows_default".into(),
                        from_ms: None,
                        to_ms: None,
                        is_default: true
                    }
                ],
                "{b}"
            );
            assert_eq!(rows_in(&db, &first).await, 2, "{b}");
            assert_eq!(
                names(s, "rollup_hours").await,
                ["rollup_hours_before_202702", "rollup_hours_default"],
                "{b}"
            );
            assert_eq!(
                names(s, "rollup_unattributed").await,
                [
                    "rollup_unattributed_before_202702",
                    "rollup_unattributed_default"
                ],
                "{b}"
            );
        }

        // New windows: one within the old table's range, one after it.
        let token = with_token(s).await;
        for (batch, at) in [("new-early", T0 + 15_000), ("new-late", bound + DAY)] {
            assert_eq!(
                s.ingest(&report(batch, at, 40.0), token, AgentStatus::default(), at)
                    .await
                    .unwrap(),
                IngestOutcome::Stored,
                "{b}: {batch}"
            );
        }
        let made = partitions::make_ahead(s.db(), bound + DAY, bound - 35 * DAY, Waiting::Move)
            .await
            .unwrap();
        if b == "postgres" {
            assert!(
                made.partitions
                    .contains(&day_name("gpu_windows", bound + DAY)),
                "{b}: {made:?}"
            );
            // The old table's range is not made again.
            assert!(
                !made.partitions.contains(&day_name("gpu_windows", T0)),
                "{b}: {made:?}"
            );
            assert_eq!(
                rows_in(&db, &day_name("gpu_windows_before", bound)).await,
                3,
                "{b}: an early window goes to the old table"
            );
        }
        assert_eq!(windows(s, span.0, span.1).await.len(), 4, "{b}");

        // Retention past the old table's bound drops it whole.
        let retention = 35 * DAY;
        crate::rollup::enforce_retention(s, bound + retention, retention, i64::MAX)
            .await
            .unwrap();
        assert_eq!(
            windows(s, span.0, span.1).await,
            [("GPU-1".to_owned(), bound + DAY)],
            "{b}"
        );
        if b == "postgres" {
            let left = names(s, "gpu_windows").await;
            assert_eq!(
                left,
                [
                    day_name("gpu_windows", bound),
                    day_name("gpu_windows", bound + DAY),
                    day_name("gpu_windows", bound + 2 * DAY),
                    day_name("gpu_windows", bound + 3 * DAY),
                    day_name("gpu_windows", bound + 4 * DAY),
                    day_name("gpu_windows", bound + 5 * DAY),
                    day_name("gpu_windows", bound + 6 * DAY),
                    day_name("gpu_windows", bound + 7 * DAY),
                    day_name("gpu_windows", bound + 8 * DAY),
                    "gpu_windows_default".to_owned(),
                ],
                "{b}: the old table is gone"
            );
        }
        assert_eq!(
            rollup_count(s, span.0, span.1).await,
            1,
            "{b}: attribution is never dropped"
        );
    }
}

/// Partitions are made while agents report into the days being made, the default partition
/// included: every report is stored once (an agent sends again what failed, as a real one does
/// from its spool), and the default partition ends empty.
#[tokio::test]
async fn partitions_are_made_while_reports_arrive_and_none_is_lost() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = with_token(store.as_ref()).await;
        let mut agents = Vec::new();
        for i in 0..60i64 {
            let store = store.clone();
            agents.push(tokio::spawn(async move {
                let start = T0 + (i % 12) * DAY + (i / 12) * 15_000;
                let r = report(&format!("c-{i}"), start, 30.0);
                for _ in 0..20 {
                    match store.ingest(&r, token, AgentStatus::default(), start).await {
                        Ok(outcome) => return outcome,
                        Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                    }
                }
                panic!("report {i} never stored");
            }));
        }
        let mut made = Vec::new();
        for k in 0..12 {
            let now = T0 + k * DAY;
            let work = partitions::make_ahead(store.db(), now, now - 35 * DAY, Waiting::Move)
                .await
                .unwrap();
            made.extend(work.partitions);
        }
        for agent in agents {
            let outcome = agent.await.unwrap();
            assert!(
                matches!(outcome, IngestOutcome::Stored | IngestOutcome::Duplicate),
                "{b}: {outcome:?}"
            );
        }
        // The job's next runs: a partition whose lock was not had in time (on a busy machine)
        // is made by a later one, as the hourly job would.
        let mut runs = 0;
        loop {
            let work = partitions::make_ahead(store.db(), T0, T0 - 35 * DAY, Waiting::Move)
                .await
                .unwrap();
            runs += 1;
            if work.left_for_later.is_empty() {
                break;
            }
            assert!(runs < 10, "{b}: still left for later: {work:?}");
        }
        let s = store.as_ref();
        assert_eq!(windows(s, T0 - DAY, T0 + 40 * DAY).await.len(), 60, "{b}");
        if b == "postgres" {
            assert!(made.len() >= 12, "{b}: {made:?}");
            assert_eq!(rows_in(&db, "gpu_windows_default").await, 0, "{b}");
            assert_eq!(rows_in(&db, "process_windows_default").await, 0, "{b}");
        }
    }
}
