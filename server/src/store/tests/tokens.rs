use super::*;

#[tokio::test]
async fn tokens_create_find_revoke() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        crate::store::tokens::create_token(
            store.db(),
            &NewToken::for_cluster("a", "h-a", "train"),
            T0,
        )
        .await
        .unwrap();
        crate::store::tokens::create_token(
            store.db(),
            &NewToken::for_cluster("b", "h-b", "train"),
            T0 + 1,
        )
        .await
        .unwrap();
        assert!(
            matches!(
                crate::store::tokens::create_token(
                    store.db(),
                    &NewToken::for_cluster("a", "h-other", "train"),
                    T0
                )
                .await,
                Err(StoreError::Conflict(_))
            ),
            "{b}: a second token with the same name is a conflict"
        );
        assert_eq!(
            crate::store::tokens::active_token(store.db(), "h-a", T0 + 1)
                .await
                .unwrap()
                .unwrap()
                .name,
            "a",
            "{b}"
        );
        assert!(
            crate::store::tokens::active_token(store.db(), "nope", T0)
                .await
                .unwrap()
                .is_none(),
            "{b}"
        );
        assert!(
            crate::store::tokens::revoke_token(store.db(), "a", T0 + 2)
                .await
                .unwrap(),
            "{b}"
        );
        assert!(
            !crate::store::tokens::revoke_token(store.db(), "a", T0 + 3)
                .await
                .unwrap(),
            "{b}: already revoked"
        );
        assert!(
            crate::store::tokens::active_token(store.db(), "h-a", T0 + 1)
                .await
                .unwrap()
                .is_none(),
            "{b}: revoked tokens do not authenticate"
        );
        let list = crate::store::tokens::list_tokens(store.db()).await.unwrap();
        assert_eq!(list.len(), 2, "{b}");
        assert_eq!(list[0].revoked_ms, Some(T0 + 2), "{b}");
        assert_eq!(list[1].revoked_ms, None, "{b}");
    }
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

        // Several windows, the stolen GPU only in the second, behind a GPU of the rogue's own:
        // named where it first appears.
        let mut later = report("rogue-3", T0 + 15_000, 100.0);
        later.host.hostname = "rogue-host".into();
        later.windows[0].gpus[0].uuid = "GPU-rogue-own".into();
        let mut second = report("rogue-3", T0 + 30_000, 100.0).windows.remove(0);
        let mut own = second.gpus[0].clone();
        own.uuid = "GPU-rogue-own".into();
        second.gpus.insert(0, own);
        later.windows.push(second);
        let IngestOutcome::Refused(refusal) = s.ingest(&later, rogue, status, now).await.unwrap()
        else {
            panic!("{b}: a bound GPU in a later window must be refused");
        };
        assert_eq!(refusal.kind, RefusalKind::GpuOfAnotherToken, "{b}");
        assert_eq!(refusal.field, "windows[1].gpus[1].uuid", "{b}");
        assert_eq!(
            crate::store::telemetry::batch_count(s.db()).await.unwrap(),
            1,
            "{b}: nothing of either was stored"
        );
        let hosts = crate::store::telemetry::hosts(s.db()).await.unwrap();
        assert_eq!(
            hosts.len(),
            1,
            "{b}: the rogue's host was not created either"
        );
        let windows = crate::store::telemetry::gpu_windows(s.db(), T0, T0 + 60_000)
            .await
            .unwrap();
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
            crate::store::tokens::rebind_host(s.db(), "train", "gpu-01", rogue)
                .await
                .unwrap(),
            "{b}"
        );
        assert!(
            !crate::store::tokens::rebind_host(s.db(), "train", "nope", rogue)
                .await
                .unwrap(),
            "{b}"
        );
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
        assert!(crate::store::tokens::revoke_token(s.db(), "rogue", now)
            .await
            .unwrap());
        assert_eq!(
            s.ingest(&back, real, status, now + 1).await.unwrap(),
            IngestOutcome::Stored
        );
        assert_eq!(
            crate::store::tokens::token_clusters(s.db(), real)
                .await
                .unwrap(),
            vec!["train".to_owned()]
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
        assert!(
            crate::store::tokens::rotate_token(s.db(), "rack-1", "new", T0 + 1_000, T0)
                .await
                .unwrap()
        );
        assert!(
            !crate::store::tokens::rotate_token(s.db(), "nope", "x", T0 + 1_000, T0)
                .await
                .unwrap()
        );
        assert!(
            crate::store::tokens::active_token(s.db(), "new", T0 + 5_000)
                .await
                .unwrap()
                .is_some(),
            "{b}"
        );
        assert!(
            crate::store::tokens::active_token(s.db(), "old", T0 + 999)
                .await
                .unwrap()
                .is_some(),
            "{b}: overlap"
        );
        assert!(
            !crate::store::tokens::rotate_token(s.db(), "rack-1", "newer", T0 + 9_000, T0 + 500)
                .await
                .unwrap(),
            "{b}: a second rotation inside the overlap would end it at once"
        );
        assert!(
            crate::store::tokens::active_token(s.db(), "old", T0 + 999)
                .await
                .unwrap()
                .is_some(),
            "{b}: the overlap is kept"
        );
        assert!(
            crate::store::tokens::active_token(s.db(), "old", T0 + 1_000)
                .await
                .unwrap()
                .is_none(),
            "{b}: overlap over"
        );
        assert!(
            crate::store::tokens::rotate_token(s.db(), "rack-1", "newer", T0 + 3_000, T0 + 1_000)
                .await
                .unwrap(),
            "{b}: once the overlap is over the token rotates again"
        );
        assert!(
            crate::store::tokens::active_token(s.db(), "new", T0 + 2_999)
                .await
                .unwrap()
                .is_some(),
            "{b}"
        );

        crate::store::tokens::create_token(
            s.db(),
            &NewToken {
                expires_ms: Some(T0 + 10_000),
                host_pattern: Some("gpu-*"),
                ..NewToken::for_cluster("short", "short-hash", "train")
            },
            T0,
        )
        .await
        .unwrap();
        let short = crate::store::tokens::active_token(s.db(), "short-hash", T0 + 9_999)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(short.host_pattern.as_deref(), Some("gpu-*"), "{b}");
        assert!(
            crate::store::tokens::active_token(s.db(), "short-hash", T0 + 10_000)
                .await
                .unwrap()
                .is_none(),
            "{b}"
        );
        assert!(
            !crate::store::tokens::rotate_token(s.db(), "short", "x", T0 + 20_000, T0 + 10_000)
                .await
                .unwrap(),
            "{b}: an expired token cannot be rotated back to life"
        );

        crate::store::tokens::touch_token(s.db(), short.id, T0 + 5, Some("10.0.0.7"))
            .await
            .unwrap();
        crate::store::tokens::touch_token(s.db(), short.id, T0 + 4, None)
            .await
            .unwrap();
        let listed = crate::store::tokens::token_by_name(s.db(), "short")
            .await
            .unwrap()
            .unwrap();
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
            crate::store::tokens::record_refusal(s.db(), short.id, "infer", "gpu-9", &refusal, at)
                .await
                .unwrap();
        }
        let rows = crate::store::tokens::ingest_refusals(s.db(), T0)
            .await
            .unwrap();
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
        assert!(
            crate::store::tokens::ingest_refusals(s.db(), T0 + 201)
                .await
                .unwrap()
                .is_empty(),
            "{b}"
        );
    }
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
        let (_dir, migrator) = super::migrations_before(b, "0014").await;
        super::old_database(&db, &migrator, BEFORE_SCOPES).await;
        let store = db.open().await;
        let s = store.as_ref();
        let tokens = crate::store::tokens::list_tokens(s.db()).await.unwrap();
        let scopes: Vec<Option<&str>> = tokens.iter().map(|t| t.cluster.as_deref()).collect();
        assert_eq!(scopes, [Some("a"), None, None], "{b}");
        assert_eq!(
            crate::store::tokens::token_clusters(s.db(), 1)
                .await
                .unwrap(),
            ["a"],
            "{b}"
        );
        assert_eq!(
            crate::store::tokens::token_clusters(s.db(), 2)
                .await
                .unwrap(),
            ["b", "c"],
            "{b}: host x stays t1's"
        );

        let host = |cluster: &str| HostInfo {
            cluster: cluster.into(),
            hostname: "new".into(),
            ..HostInfo::default()
        };
        let allowed = |t: &crate::store::tokens::TokenRow, cluster: &str| {
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
        let t3 = crate::store::tokens::token_by_name(s.db(), "t3")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(t3.cluster.as_deref(), Some("d"), "{b}");
        assert!(!allowed(&t3, "a").await, "{b}: and only that one");
    }
}
