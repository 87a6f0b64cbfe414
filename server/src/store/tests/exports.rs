use super::*;
use crate::store::exports::{self, ExportHealth, ExportRow};

fn row(period: &str, status: &str, attempts: i64, updated_ms: i64) -> ExportRow {
    ExportRow {
        period: period.into(),
        start_ms: T0,
        end_ms: T0 + 86_400_000,
        status: status.into(),
        attempts,
        next_attempt_ms: updated_ms + 300_000,
        last_error: (status == "failed").then(|| "object storage: NoSuchBucket".into()),
        manifest_key: (status == "done").then(|| "lake/daily/m.json".into()),
        files_json: (status == "done").then(|| "[]".into()),
        updated_ms,
    }
}

/// A period's state is written whole and replaced whole (a failure, then its success); the
/// failed ones and the latest read back as written.
#[tokio::test]
async fn an_exports_state_is_kept_per_period() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let on = store.db();
        let health = move || async move { exports::health(on).await.unwrap() };
        assert_eq!(health().await, ExportHealth::default(), "{b}");
        let failed = row("day:2027-01-14", "failed", 1, T0);
        exports::put(store.db(), &failed).await.unwrap();
        exports::put(store.db(), &row("month:2026-12", "failed", 3, T0 + 1))
            .await
            .unwrap();
        assert_eq!(
            health().await,
            ExportHealth {
                failing: 2,
                last_done_ms: None
            },
            "{b}"
        );
        assert_eq!(
            exports::get(store.db(), "day:2027-01-14").await.unwrap(),
            Some(failed),
            "{b}"
        );
        let periods = |rows: Vec<ExportRow>| rows.into_iter().map(|r| r.period).collect::<Vec<_>>();
        assert_eq!(
            periods(exports::failed(store.db()).await.unwrap()).len(),
            2,
            "{b}"
        );
        let done = row("day:2027-01-14", "done", 2, T0 + 2);
        exports::put(store.db(), &done).await.unwrap();
        assert_eq!(
            exports::get(store.db(), "day:2027-01-14").await.unwrap(),
            Some(done),
            "{b}"
        );
        assert_eq!(
            periods(exports::failed(store.db()).await.unwrap()),
            ["month:2026-12"],
            "{b}"
        );
        // What /metrics says: one still failing, and when the latest was written.
        assert_eq!(
            health().await,
            ExportHealth {
                failing: 1,
                last_done_ms: Some(T0 + 2)
            },
            "{b}"
        );
        assert_eq!(
            periods(exports::recent(store.db(), 10).await.unwrap()),
            ["day:2027-01-14", "month:2026-12"],
            "{b}: newest first"
        );
        assert_eq!(
            exports::get(store.db(), "day:1999-01-01").await.unwrap(),
            None
        );
    }
}
