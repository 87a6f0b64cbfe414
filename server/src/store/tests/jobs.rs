use super::*;

#[tokio::test]
async fn a_stopping_process_gives_up_its_leases_and_no_other() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let jobs = crate::store::jobs::try_lease;
        for (job, holder) in [
            ("rollup", "host-a:41:0000beef"),
            ("retention", "host-a:41:0000cafe"),
            ("idle", "host-a:411:00000001"),
        ] {
            assert!(
                jobs(store.db(), job, holder, T0, 600_000).await.unwrap(),
                "{b}"
            );
        }
        let released = crate::store::jobs::release_leases_of(store.db(), "host-a:41:", T0 + 1)
            .await
            .unwrap();
        assert_eq!(released, 2, "{b}: process 41's leases, not 411's");
        for job in ["rollup", "retention"] {
            assert!(
                jobs(store.db(), job, "host-b:7:00000002", T0 + 2, 600_000)
                    .await
                    .unwrap(),
                "{b}: {job} free at once"
            );
        }
        assert!(
            !jobs(store.db(), "idle", "host-b:7:00000002", T0 + 2, 600_000)
                .await
                .unwrap(),
            "{b}: another process's lease still held"
        );
        assert_eq!(
            crate::store::jobs::job_last_run(store.db(), "rollup")
                .await
                .unwrap(),
            None,
            "{b}: giving up is not a run"
        );
    }
}

/// A job with a period runs once per period, whichever replica asks and however often.
#[tokio::test]
async fn a_periodic_lease_is_taken_once_per_period() {
    use crate::store::jobs::{finish_lease, try_lease_due};
    const EVERY: i64 = 300_000;
    for db in test_support::both().await {
        let store = db.open().await;
        let (s, b) = (store.db(), db.backend);
        let due = |holder: &'static str, at: i64| {
            try_lease_due(s, "refresh", holder, at, (60_000, EVERY))
        };
        assert!(due("replica-a", T0).await.unwrap(), "{b}: never run");
        assert!(!due("replica-b", T0 + 1).await.unwrap(), "{b}: held by a");
        finish_lease(s, "refresh", "replica-a", T0 + 10)
            .await
            .unwrap();
        assert!(
            !due("replica-b", T0 + 60_000).await.unwrap(),
            "{b}: free, but run a minute ago"
        );
        assert!(!due("replica-a", T0 + EVERY + 9).await.unwrap(), "{b}");
        assert!(due("replica-b", T0 + EVERY + 10).await.unwrap(), "{b}: due");
        finish_lease(s, "refresh", "replica-b", T0 + EVERY + 20)
            .await
            .unwrap();
        // Without a period, as before: whenever it is free.
        assert!(
            crate::store::jobs::try_lease(s, "refresh", "replica-a", T0 + EVERY + 21, 60_000)
                .await
                .unwrap(),
            "{b}"
        );
    }
}

#[tokio::test]
async fn one_replica_at_a_time_holds_a_job_lease() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        assert!(
            crate::store::jobs::try_lease(store.db(), "aws-sync", "replica-a", T0, 60_000)
                .await
                .unwrap(),
            "{b}"
        );
        assert!(
            !crate::store::jobs::try_lease(store.db(), "aws-sync", "replica-b", T0 + 1, 60_000)
                .await
                .unwrap(),
            "{b}: held by a"
        );
        assert!(
            crate::store::jobs::try_lease(store.db(), "aws-sync", "replica-a", T0 + 2, 60_000)
                .await
                .unwrap(),
            "{b}: a renews"
        );
        assert!(
            crate::store::jobs::try_lease(store.db(), "aws-sync", "replica-b", T0 + 70_000, 60_000)
                .await
                .unwrap(),
            "{b}: a's lease expired"
        );
        crate::store::jobs::finish_lease(store.db(), "aws-sync", "replica-b", T0 + 80_000)
            .await
            .unwrap();
        assert_eq!(
            crate::store::jobs::job_last_run(store.db(), "aws-sync")
                .await
                .unwrap(),
            Some(T0 + 80_000),
            "{b}"
        );
        assert!(
            crate::store::jobs::try_lease(store.db(), "aws-sync", "replica-a", T0 + 80_001, 60_000)
                .await
                .unwrap(),
            "{b}: released on finish"
        );
        assert_eq!(
            crate::store::jobs::job_last_run(store.db(), "other")
                .await
                .unwrap(),
            None,
            "{b}"
        );

        crate::store::jobs::mark_ce_synced(store.db(), &[T0, T0 + 86_400_000], T0)
            .await
            .unwrap();
        crate::store::jobs::mark_ce_synced(store.db(), &[T0], T0 + 5)
            .await
            .unwrap();
        assert_eq!(
            crate::store::jobs::ce_synced_days(store.db(), T0, T0 + 86_400_000)
                .await
                .unwrap(),
            vec![T0],
            "{b}"
        );
    }
}
