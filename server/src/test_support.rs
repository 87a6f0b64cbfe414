//! Helpers for tests that must run on both storage backends.
//!
//! PostgreSQL comes from `GPULEDGER_TEST_PG_URL`, which `scripts/test` sets after starting a
//! throwaway server. Without it these helpers fail loudly rather than skip: a storage test that
//! silently ran on one backend would prove nothing about the other.

use std::sync::Arc;

use sqlx::Connection;

use crate::store::{self, Store};

/// A database for one test, removed with it where that is cheap (the SQLite file).
pub struct TestDb {
    pub url: String,
    pub backend: &'static str,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn open(&self) -> Arc<dyn Store> {
        match store::connect(&self.url).await {
            Ok(s) => s,
            Err(e) => panic!("opening {} test database {}: {e}", self.backend, self.url),
        }
    }
}

pub fn sqlite() -> TestDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("test.db").display());
    TestDb {
        url,
        backend: "sqlite",
        _dir: Some(dir),
    }
}

/// A fresh, empty PostgreSQL database on the test server.
pub async fn postgres() -> TestDb {
    let admin = std::env::var("GPULEDGER_TEST_PG_URL").unwrap_or_else(|_| {
        panic!("GPULEDGER_TEST_PG_URL is not set: run the tests through scripts/test, which starts a throwaway PostgreSQL")
    });
    let name = format!("gpl_test_{}", uuid_like());
    let mut conn = sqlx::PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test PostgreSQL at {admin}: {e}"));
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("create test database");
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    TestDb {
        url: format!("{base}/{name}"),
        backend: "postgres",
        _dir: None,
    }
}

/// Both backends, SQLite first.
pub async fn both() -> Vec<TestDb> {
    vec![sqlite(), postgres().await]
}

fn uuid_like() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..16)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)]))
        .collect()
}

/// Brings the rollups up to date as `serve` does every minute: the default rate card and idle
/// thresholds.
pub async fn roll_up(store: &dyn crate::store::Store) {
    crate::rollup::run(
        store,
        &gpuledger_core::ratecard::RateCard::default_card(),
        &Default::default(),
        usize::MAX,
    )
    .await
    .unwrap();
}
