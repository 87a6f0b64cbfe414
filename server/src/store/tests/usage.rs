use super::*;

#[tokio::test]
async fn usage_counts_replace_per_source_and_add_across_sources() {
    use crate::store::UsageCount;
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
        crate::store::usage::upsert_usage(
            store.db(),
            "pod-a",
            &[count("chat", 0, 1_000), count("chat", 1, 2_000)],
            1,
            T0,
        )
        .await
        .unwrap();
        // A resend of hour 1 with a corrected count replaces it; another replica adds.
        crate::store::usage::upsert_usage(store.db(), "pod-a", &[count("chat", 1, 2_500)], 1, T0)
            .await
            .unwrap();
        crate::store::usage::upsert_usage(
            store.db(),
            "pod-b",
            &[count("chat", 1, 500), count("embed", 0, 7)],
            1,
            T0,
        )
        .await
        .unwrap();
        assert_eq!(
            crate::store::usage::usage_totals(store.db(), T0, T0 + 2 * 3_600_000)
                .await
                .unwrap(),
            vec![("chat".to_owned(), 4_000), ("embed".to_owned(), 7)],
            "{b}"
        );
        assert_eq!(
            crate::store::usage::usage_totals(store.db(), T0 + 3_600_000, T0 + 2 * 3_600_000)
                .await
                .unwrap(),
            vec![("chat".to_owned(), 3_000)],
            "{b}: only periods starting in the range"
        );
        // Another active token may not replace pod-a's counts: the whole post is refused.
        let rogue = token_for(store.as_ref(), "rogue", "rogue-hash", T0).await;
        let refusal = crate::store::usage::upsert_usage(
            store.db(),
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
            crate::store::usage::usage_totals(store.db(), T0, T0 + 6 * 3_600_000)
                .await
                .unwrap(),
            vec![("chat".to_owned(), 4_000), ("embed".to_owned(), 7)],
            "{b}: nothing of the refused post was kept"
        );
    }
}
