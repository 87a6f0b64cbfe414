use super::*;

#[tokio::test]
async fn usage_counts_replace_per_source_and_add_across_sources() {
    use crate::store::usage::UsageCount;
    let count = |endpoint: &str, hour: i64, requests: i64| UsageCount {
        endpoint: endpoint.into(),
        start_ms: T0 + hour * 3_600_000,
        end_ms: T0 + (hour + 1) * 3_600_000,
        requests,
        input_tokens: None,
        output_tokens: None,
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

/// Tokens add up across sources and periods, a resend replaces them, and an endpoint's total
/// is unknown where any of its counts in the range says nothing of them.
#[tokio::test]
async fn token_totals_are_whole_or_unknown() {
    use crate::store::usage::UsageCount;
    let count = |endpoint: &str, hour: i64, tokens: (Option<i64>, Option<i64>)| UsageCount {
        endpoint: endpoint.into(),
        start_ms: T0 + hour * 3_600_000,
        end_ms: T0 + (hour + 1) * 3_600_000,
        requests: 10,
        input_tokens: tokens.0,
        output_tokens: tokens.1,
    };
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let token = token_for(store.as_ref(), "owner", "owner-hash", T0).await;
        let post = |source: &'static str, counts: Vec<UsageCount>| {
            let store = store.clone();
            async move {
                let refused =
                    crate::store::usage::upsert_usage(store.db(), source, &counts, token, T0)
                        .await
                        .unwrap();
                assert!(refused.is_none());
            }
        };
        post(
            "pod-a",
            vec![
                count("chat", 0, (Some(6_000), Some(2_500))),
                count("chat", 1, (Some(1), Some(1))),
                // Embeddings count input only; the batch endpoint no tokens at all.
                count("embed", 0, (Some(3_000), None)),
                count("batch", 0, (None, None)),
                // A second hour of rerank whose count carries no tokens.
                count("rerank", 0, (Some(100), Some(5))),
                count("rerank", 1, (None, None)),
            ],
        )
        .await;
        post("pod-a", vec![count("chat", 1, (Some(7_000), Some(2_000)))]).await;
        post("pod-b", vec![count("chat", 1, (Some(1_000), Some(500)))]).await;
        let totals = crate::store::usage::token_totals(store.db(), T0, T0 + 2 * 3_600_000)
            .await
            .unwrap();
        assert_eq!(
            totals,
            vec![
                ("chat".to_owned(), Some(14_000), Some(5_000)),
                ("embed".to_owned(), Some(3_000), None),
            ],
            "{b}: rerank's second hour has no tokens, so neither has its total"
        );
        let first_hour = crate::store::usage::token_totals(store.db(), T0, T0 + 3_600_000)
            .await
            .unwrap();
        assert!(
            first_hour.contains(&("rerank".to_owned(), Some(100), Some(5))),
            "{b}: {first_hour:?}"
        );
    }
}

/// What agents read from serving engines is stored with the report, in its transaction: summed
/// per host, endpoint, model and hour; a repeated batch adds nothing; a refused report adds
/// nothing; a count some window could not read leaves the hour's unknown; and the totals hold
/// the engines' counts beside the posted ones, each source named.
#[tokio::test]
async fn serving_counts_ride_with_reports_once_on_both_databases() {
    use gpuledger_proto::ServingWindow;
    const HOUR: i64 = 3_600_000;
    let served =
        |model: Option<&str>, requests: u64, input: Option<u64>, output: u64| ServingWindow {
            endpoint: "chat".into(),
            model: model.map(str::to_owned),
            engine: "vllm".into(),
            requests: Some(requests),
            input_tokens: input,
            output_tokens: Some(output),
        };
    let with = |batch: &str, start: i64, serving: Vec<ServingWindow>| {
        let mut r = report(batch, start, 50.0);
        r.windows[0].serving = serving;
        r
    };
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let status = AgentStatus::default();
        let token = token_for(s, "rack-1", "hash-1", T0).await;
        let now = T0 + 3 * HOUR;
        // Two windows of one report in the same hour, and another report's window.
        let mut two = with("b-1", T0, vec![served(Some("llama"), 3, Some(300), 30)]);
        let mut second = with(
            "x",
            T0 + 15_000,
            vec![served(Some("llama"), 2, Some(200), 20)],
        )
        .windows
        .remove(0);
        second.gpus[0].util_histogram.clear();
        two.windows.push(second);
        assert_eq!(
            s.ingest(&two, token, status, now).await.unwrap(),
            IngestOutcome::Stored
        );
        assert_eq!(
            s.ingest(&two, token, status, now).await.unwrap(),
            IngestOutcome::Duplicate,
            "{b}"
        );
        let next = with(
            "b-2",
            T0 + 30_000,
            vec![served(Some("llama"), 1, Some(100), 10)],
        );
        s.ingest(&next, token, status, now).await.unwrap();
        let totals = |from: i64, to: i64| async move {
            (
                crate::store::usage::usage_totals(s.db(), from, to)
                    .await
                    .unwrap(),
                crate::store::usage::token_totals(s.db(), from, to)
                    .await
                    .unwrap(),
            )
        };
        assert_eq!(
            totals(T0, T0 + HOUR).await,
            (
                vec![("chat".to_owned(), 6)],
                vec![("chat".to_owned(), Some(600), Some(60))]
            ),
            "{b}: the repeat counted once"
        );
        // A refused report (a window another batch stored) keeps none of its counts.
        let refused = with("b-3", T0, vec![served(Some("llama"), 1_000, Some(1), 1)]);
        assert!(
            matches!(
                s.ingest(&refused, token, status, now).await.unwrap(),
                IngestOutcome::Refused(_)
            ),
            "{b}"
        );
        assert_eq!(
            totals(T0, T0 + HOUR).await.0,
            vec![("chat".to_owned(), 6)],
            "{b}"
        );
        // The next hour: a window whose engine did not expose input tokens makes the hour's
        // input unknown, and with it the range's (never a sum of part of the hours).
        let unknown = with("b-4", T0 + HOUR, vec![served(Some("llama"), 4, None, 40)]);
        s.ingest(&unknown, token, status, now).await.unwrap();
        assert_eq!(
            totals(T0, T0 + 2 * HOUR).await,
            (
                vec![("chat".to_owned(), 10)],
                vec![("chat".to_owned(), None, Some(100))]
            ),
            "{b}"
        );
        // Serving code posting the same endpoint too: added, and both sources named.
        crate::store::usage::upsert_usage(
            s.db(),
            "pod-a",
            &[crate::store::usage::UsageCount {
                endpoint: "chat".into(),
                start_ms: T0,
                end_ms: T0 + HOUR,
                requests: 5,
                input_tokens: None,
                output_tokens: None,
            }],
            token,
            now,
        )
        .await
        .unwrap();
        assert_eq!(
            totals(T0, T0 + HOUR).await.0,
            vec![("chat".to_owned(), 11)],
            "{b}"
        );
        assert_eq!(
            crate::store::usage::usage_sources(s.db(), T0, T0 + HOUR)
                .await
                .unwrap(),
            vec![
                ("chat".to_owned(), "posted".to_owned()),
                ("chat".to_owned(), "vllm".to_owned())
            ],
            "{b}"
        );
    }
}

/// A run's progress in a range is its highest step reported in it less its highest before it,
/// whatever the number of ranks reporting and resends; another token's report refuses the whole
/// post, counts included.
#[tokio::test]
async fn run_progress_counts_steps_made_in_the_range_on_both_databases() {
    use crate::store::usage::{RunProgress, UsageCount};
    const HOUR: i64 = 3_600_000;
    let at = |run: &str, hour: i64, step: i64, epoch: Option<i64>| RunProgress {
        experiment: run.into(),
        at_ms: T0 + hour * HOUR,
        step,
        epoch,
    };
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let token = token_for(s, "trainer", "hash-t", T0).await;
        let post = |source: &'static str, progress: Vec<RunProgress>| async move {
            crate::store::usage::record(s.db(), source, (&[], &progress), token, T0)
                .await
                .unwrap()
        };
        // Hour 0 (before the range): step 1,000; in the range, two ranks up to 4,000 and 3
        // epochs; a resend of the same report; a run that began in the range, with no epochs.
        assert!(post("rank-0", vec![at("big", 0, 1_000, Some(1))])
            .await
            .is_none());
        assert!(post(
            "rank-0",
            vec![at("big", 2, 2_500, Some(2)), at("big", 3, 4_000, Some(3))]
        )
        .await
        .is_none());
        assert!(post("rank-1", vec![at("big", 3, 4_000, Some(3))])
            .await
            .is_none());
        assert!(post("rank-1", vec![at("big", 3, 4_000, Some(3))])
            .await
            .is_none());
        assert!(post("rank-0", vec![at("small", 2, 300, None)])
            .await
            .is_none());
        let range = |from: i64, to: i64| async move {
            crate::store::usage::progress_totals(s.db(), T0 + from * HOUR, T0 + to * HOUR)
                .await
                .unwrap()
        };
        assert_eq!(
            range(1, 4).await,
            vec![
                ("big".to_owned(), 3_000, Some(2)),
                ("small".to_owned(), 300, None)
            ],
            "{b}"
        );
        // A range with no report of a run leaves it out.
        assert_eq!(range(4, 9).await, vec![], "{b}");
        // Another token may not replace rank-0's report: the post is refused whole, its
        // counts too.
        let rogue = token_for(s, "rogue", "hash-r", T0).await;
        let refusal = crate::store::usage::record(
            s.db(),
            "rank-0",
            (
                &[UsageCount {
                    endpoint: "chat".into(),
                    start_ms: T0,
                    end_ms: T0 + HOUR,
                    requests: 9,
                    input_tokens: None,
                    output_tokens: None,
                }],
                &[at("big", 3, 9_999_999, None)],
            ),
            rogue,
            T0,
        )
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{b}: another token's report must not be replaced"));
        assert_eq!(refusal.field, "progress[0]", "{b}");
        assert_eq!(range(1, 4).await[0].1, 3_000, "{b}");
        assert!(
            crate::store::usage::usage_totals(s.db(), T0, T0 + HOUR)
                .await
                .unwrap()
                .is_empty(),
            "{b}: nothing of the refused post was kept"
        );
    }
}

/// Counts stored before they were bounded (or by many sources at once) sum without failing:
/// the sum is capped, never an overflow that took every reader's page down.
#[tokio::test]
async fn sums_of_counts_never_overflow() {
    use crate::store::usage::UsageCount;
    let count = |endpoint: &str, requests: i64| UsageCount {
        endpoint: endpoint.into(),
        start_ms: T0,
        end_ms: T0 + 3_600_000,
        requests,
        input_tokens: Some(requests),
        output_tokens: Some(1),
    };
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        token_for(store.as_ref(), "owner", "owner-hash", T0).await;
        for source in ["pod-a", "pod-b"] {
            crate::store::usage::upsert_usage(
                store.db(),
                source,
                &[count("chat", i64::MAX), count("embed", 3)],
                1,
                T0,
            )
            .await
            .unwrap();
        }
        let range = (T0, T0 + 3_600_000);
        let cap = crate::store::db::COUNT_SUM_CAP;
        assert_eq!(
            crate::store::usage::usage_totals(store.db(), range.0, range.1)
                .await
                .unwrap(),
            vec![("chat".to_owned(), cap), ("embed".to_owned(), 6)],
            "{b}"
        );
        assert_eq!(
            crate::store::usage::token_totals(store.db(), range.0, range.1)
                .await
                .unwrap(),
            vec![
                ("chat".to_owned(), Some(cap), Some(2)),
                ("embed".to_owned(), Some(6), Some(2))
            ],
            "{b}"
        );
    }
}

/// An admin lists what each source posted and under which token, and deletes a source's
/// counts (or one token's of them); revoking a token that sent counts needs a word on what
/// becomes of them, and removing them leaves no count of it behind.
#[tokio::test]
async fn a_sources_usage_is_listed_deleted_and_kept_or_removed_with_its_token() {
    use crate::agent_tokens::{revoke, SentUsage};
    use crate::store::usage::{RunProgress, UsageCount};
    let count = |hour: i64, requests: i64| UsageCount {
        endpoint: "chat".into(),
        start_ms: T0 + hour * 3_600_000,
        end_ms: T0 + (hour + 1) * 3_600_000,
        requests,
        input_tokens: None,
        output_tokens: None,
    };
    let step = |hour: i64| RunProgress {
        experiment: "exp-1".into(),
        at_ms: T0 + hour * 3_600_000,
        step: hour * 100,
        epoch: None,
    };
    for db in test_support::both().await {
        let store = db.open().await;
        let (b, s) = (db.backend, store.as_ref());
        let good = token_for(s, "good", "good-hash", T0).await;
        let bad = token_for(s, "bad", "bad-hash", T0).await;
        let post = |source: &'static str,
                    counts: Vec<UsageCount>,
                    progress: Vec<RunProgress>,
                    token: i64| async move {
            crate::store::usage::record(s.db(), source, (&counts, &progress), token, T0)
                .await
                .unwrap()
        };
        assert_eq!(
            post(
                "pod-a",
                vec![count(0, 10), count(1, 20)],
                vec![step(1)],
                good
            )
            .await,
            None
        );
        assert_eq!(post("pod-b", vec![count(0, 5)], vec![], good).await, None);
        assert_eq!(
            post(
                "pod-x",
                vec![count(2, 1_000_000)],
                vec![step(2), step(3)],
                bad
            )
            .await,
            None
        );

        let listed = crate::store::usage::posted_sources(s.db(), None)
            .await
            .unwrap();
        let row = |l: &crate::store::usage::PostedSource| {
            (
                l.source.clone(),
                l.token.clone().unwrap_or_default(),
                l.counts,
                l.requests,
                l.progress,
            )
        };
        assert_eq!(
            listed.iter().map(row).collect::<Vec<_>>(),
            [
                ("pod-a".into(), "good".into(), 2, 30, 1),
                ("pod-b".into(), "good".into(), 1, 5, 0),
                ("pod-x".into(), "bad".into(), 1, 1_000_000, 2),
            ],
            "{b}"
        );
        assert_eq!(listed[0].first_ms, T0, "{b}");
        assert_eq!(listed[0].last_ms, T0 + 2 * 3_600_000, "{b}");
        let only_bad = crate::store::usage::posted_sources(s.db(), Some(bad))
            .await
            .unwrap();
        assert_eq!(only_bad.len(), 1, "{b}");

        // Deleting one source leaves the others.
        assert_eq!(
            crate::store::usage::delete_posted(s.db(), Some("pod-b"), None)
                .await
                .unwrap(),
            (1, 0),
            "{b}"
        );
        assert_eq!(
            crate::store::usage::usage_totals(s.db(), T0, T0 + 3 * 3_600_000)
                .await
                .unwrap(),
            vec![("chat".to_owned(), 1_000_030)],
            "{b}"
        );

        // Revoking a token that sent counts needs a word on them; nothing changes without it.
        let err = revoke(s, "bad", None, T0).await.unwrap_err().to_string();
        assert!(
            err.contains("pod-x") && err.contains("--remove-usage"),
            "{b}: {err}"
        );
        assert!(
            crate::store::tokens::active_token(s.db(), "bad-hash", T0)
                .await
                .unwrap()
                .is_some(),
            "{b}"
        );
        assert_eq!(
            revoke(s, "bad", Some(SentUsage::Remove), T0).await.unwrap(),
            (1, 2),
            "{b}"
        );
        assert_eq!(
            crate::store::usage::usage_totals(s.db(), T0, T0 + 3 * 3_600_000)
                .await
                .unwrap(),
            vec![("chat".to_owned(), 30)],
            "{b}: what the revoked token sent is gone"
        );
        assert_eq!(
            revoke(s, "good", Some(SentUsage::Keep), T0).await.unwrap(),
            (0, 0),
            "{b}"
        );
        assert_eq!(
            crate::store::usage::posted_sources(s.db(), None)
                .await
                .unwrap()
                .len(),
            1,
            "{b}: kept"
        );
    }
}
