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
