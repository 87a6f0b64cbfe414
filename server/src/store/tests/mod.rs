//! The storage contract, one file per concern: every case runs on SQLite and on PostgreSQL.

mod accounts;
mod bills;
mod exports;
mod jobs;
mod owners;
mod partitions;
mod telemetry;
mod tokens;
mod usage;

use std::collections::{BTreeMap, BTreeSet};

use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};
use sqlx::Connection;

use super::tokens::NewToken;
use super::{AgentStatus, IngestOutcome, Refusal, RefusalKind, Store, StoreError};
use crate::test_support;

pub(super) const T0: i64 = 1_800_000_000_000;

/// A database as it was before migration `version`: the earlier migrations only, from a copy of
/// this backend's folder.
pub(super) async fn migrations_before(
    backend: &str,
    version: &str,
) -> (tempfile::TempDir, sqlx::migrate::Migrator) {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(backend);
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.as_str() < version {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    let migrator = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
    (dir, migrator)
}

/// Runs `migrator` on `db`'s empty database and then `statements`, before the store opens it
/// (and runs the rest of the migrations).
pub(super) async fn old_database(
    db: &test_support::TestDb,
    migrator: &sqlx::migrate::Migrator,
    statements: &[&str],
) {
    if db.backend == "sqlite" {
        use sqlx::sqlite::SqliteConnectOptions;
        let options = std::str::FromStr::from_str(&db.url)
            .map(|o: SqliteConnectOptions| o.create_if_missing(true));
        let pool = sqlx::SqlitePool::connect_with(options.unwrap())
            .await
            .unwrap();
        migrator.run(&pool).await.unwrap();
        for sql in statements {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        pool.close().await;
    } else {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        migrator.run(&pool).await.unwrap();
        for sql in statements {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        pool.close().await;
    }
}

pub(super) fn report(batch: &str, start_ms: i64, util: f64) -> Report {
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
            serving: Vec::new(),
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
                    owner_unknown: None,
                }],
                parent_uuid: None,
                ..Default::default()
            }],
        }],
    }
}

pub(super) async fn with_token(store: &dyn Store) -> i64 {
    super::tokens::create_token(
        store.db(),
        &NewToken::for_cluster("agent", "hash-1", "train"),
        T0,
    )
    .await
    .unwrap();
    super::tokens::active_token(store.db(), "hash-1", T0)
        .await
        .unwrap()
        .unwrap()
        .id
}

/// Tables and columns of both schemas, so a migration added to one backend only fails here
/// (PostgreSQL's partitions are its tables' storage, not tables of their own).
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
         WHERE table_schema = 'public' AND table_name NOT LIKE '_sqlx%'
           AND table_name NOT IN (SELECT relname FROM pg_class WHERE relispartition)",
    )
    .fetch_all(&mut pg)
    .await
    .unwrap();
    let pg_cols: BTreeSet<(String, String)> = rows.into_iter().collect();
    assert!(!lite_cols.is_empty());
    assert_eq!(lite_cols, pg_cols);
}

/// Runs one statement on a test database, whichever backend it is.
pub(super) async fn execute_sql(db: &test_support::TestDb, sql: &str) {
    if db.backend == "postgres" {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query(sql).execute(&mut c).await.unwrap();
    } else {
        let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        sqlx::query(sql).execute(&mut c).await.unwrap();
    }
}

pub(super) async fn token_for(store: &dyn Store, name: &str, hash: &str, now: i64) -> i64 {
    super::tokens::create_token(store.db(), &NewToken::for_cluster(name, hash, "train"), now)
        .await
        .unwrap();
    super::tokens::active_token(store.db(), hash, now)
        .await
        .unwrap()
        .unwrap()
        .id
}

/// Storage functions of different concerns compose into one transaction: what the caller drops
/// uncommitted leaves nothing of any of them, and what it commits lands whole. On SQLite the
/// transaction holds the writer's turn, so another write waits for it instead of failing.
#[tokio::test]
async fn one_transaction_spans_concerns_and_rolls_back_whole() {
    use crate::store::{accounts, alerts, jobs};
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;

        let mut tx = store.db().begin().await.unwrap();
        accounts::create_user(&mut tx, "ana", "hash", "admin", None, T0)
            .await
            .unwrap();
        alerts::snooze(&mut tx, "train", T0 + 3_600_000, "ana", T0)
            .await
            .unwrap();
        // Reads through the transaction see its own writes.
        assert!(
            accounts::user_by_name(&mut tx, "ana")
                .await
                .unwrap()
                .is_some(),
            "{b}"
        );
        drop(tx);
        assert!(
            accounts::user_by_name(store.db(), "ana")
                .await
                .unwrap()
                .is_none(),
            "{b}"
        );
        assert!(
            alerts::active_snoozes(store.db(), T0)
                .await
                .unwrap()
                .is_empty(),
            "{b}"
        );

        let mut tx = store.db().begin().await.unwrap();
        accounts::create_user(&mut tx, "ana", "hash", "admin", None, T0)
            .await
            .unwrap();
        jobs::try_lease(&mut tx, "nightly", "replica-1", T0, 60_000)
            .await
            .unwrap();
        // A write from elsewhere waits for the open transaction (SQLite: for the writer's
        // turn; PostgreSQL: for the row lock) and then sees the committed lease.
        let db2 = store.db().clone();
        let other = tokio::spawn(async move {
            jobs::try_lease(&db2, "nightly", "replica-2", T0 + 1, 60_000).await
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        tx.commit().await.unwrap();
        assert!(
            !other.await.unwrap().unwrap(),
            "{b}: the lease was taken in the transaction"
        );
        assert!(
            accounts::user_by_name(store.db(), "ana")
                .await
                .unwrap()
                .is_some(),
            "{b}"
        );
    }
}
