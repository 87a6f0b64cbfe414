//! Stored recommendations: served while valid, recomputed when the rollups under an ended range
//! change or a range under way gets old, on both backends.

use gpuledger_core::owners::OwnerSchema;
use rust_decimal::Decimal;

use super::*;
use crate::store;
use crate::store::rollups::UsageRow;
use crate::store::RollupRow;
use crate::test_support;

const DAY: i64 = 1_800_000_000_000 - 1_800_000_000_000 % DAY_MS;

/// One hour of day `DAY` on GPU-a, serving endpoint chat at 10% for `dollars`.
async fn roll_up_hour(store: &dyn Store, dollars: i64) {
    let hour = DAY + 5 * HOUR_MS;
    store::rollups::mark_dirty_hours(store.db(), &[hour])
        .await
        .unwrap();
    let marks = store::rollups::dirty_marks(store.db(), 10).await.unwrap();
    let row = RollupRow {
        period_ms: hour,
        host_id: 1,
        gpu_uuid: "GPU-a".into(),
        owner: r#"{"endpoint":"chat"}"#.into(),
        kind: "used".into(),
        pricing_category: "on_demand".into(),
        currency: "USD".into(),
        estimated: 0,
        cost_nano: dollars * 1_000_000_000,
        cost_atto: 0,
        gpu_seconds: 3600.0,
        util_gpu_seconds: 36_000.0,
        util_known_seconds: 3600.0,
        energy_j: 0.0,
        energy_known_seconds: 0.0,
    };
    let usage = UsageRow {
        period_ms: hour,
        host_id: 1,
        gpu_uuid: "GPU-a".into(),
        owner_by: "endpoint".into(),
        owner_key: "chat".into(),
        util_band: 2,
        windows: 240,
        peak_memory_bytes: 10 << 30,
    };
    crate::rollup::write(
        store,
        &marks,
        crate::rollup::Written {
            rows: &[row],
            unattributed: &[],
            usage: &[usage],
        },
        None,
    )
    .await
    .unwrap();
}

fn packing_cost(r: &Recommendations) -> Decimal {
    r.consolidation
        .iter()
        .find(|c| c.gpus == ["GPU-a"])
        .map(|c| c.monthly_cost)
        .unwrap_or_default()
}

/// Marks a stored body so a test can tell it was served from the table.
async fn tamper(store: &dyn Store, range: Range, computed_ms: i64) {
    tamper_at(store, range, computed_ms, None).await;
}

/// [`tamper`], drawn from the rollups of `generation` (the current one by default).
async fn tamper_at(store: &dyn Store, range: Range, computed_ms: i64, generation: Option<i64>) {
    let kept = store::recommendations::recommendation_snapshot(
        store.db(),
        range.from_ms,
        range.to_ms,
        range.observed_ms,
    )
    .await
    .unwrap()
    .unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&kept.body).unwrap();
    v["lookback_days"] = serde_json::json!(99.0);
    let current = store::sections::rollup_generation(store.db(), (range.from_ms, range.to_ms))
        .await
        .unwrap();
    store::recommendations::put_recommendation_snapshot(
        store.db(),
        (range.from_ms, range.to_ms, range.observed_ms),
        (generation.unwrap_or(current), computed_ms),
        &v.to_string(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn stored_recommendations_are_served_until_their_rollups_change_or_they_age() {
    let card = RateCard::default_card();
    for db in test_support::both().await {
        let store = db.open().await;
        let s = store.as_ref();
        let b = db.backend;
        roll_up_hour(s, 10).await;

        // An ended range: computed once, then served from the table.
        let ended = Range {
            from_ms: DAY,
            to_ms: DAY + DAY_MS,
            observed_ms: DAY_MS,
        };
        let later = DAY + 3 * DAY_MS;
        let first = get(s, &card, &OwnerSchema::default(), ended, later)
            .await
            .unwrap();
        // $10 a day is $304.17 over a 730-hour month.
        assert_eq!(packing_cost(&first), "304.17".parse().unwrap(), "{b}");
        tamper(s, ended, later).await;
        let served = get(
            s,
            &card,
            &OwnerSchema::default(),
            ended,
            later + 30 * DAY_MS,
        )
        .await
        .unwrap();
        assert_eq!(served.lookback_days, 99.0, "{b}: an ended range never ages");

        // A range under way: served for minutes, then recomputed.
        let under_way = Range {
            from_ms: DAY,
            to_ms: DAY + 2 * DAY_MS,
            observed_ms: DAY_MS,
        };
        let now = DAY + DAY_MS;
        get(s, &card, &OwnerSchema::default(), under_way, now)
            .await
            .unwrap();
        tamper(s, under_way, now).await;
        let fresh = get(
            s,
            &card,
            &OwnerSchema::default(),
            under_way,
            now + MAX_AGE_MS - 1,
        )
        .await
        .unwrap();
        assert_eq!(fresh.lookback_days, 99.0, "{b}: fresh enough");
        let aged = get(
            s,
            &card,
            &OwnerSchema::default(),
            under_way,
            now + MAX_AGE_MS,
        )
        .await
        .unwrap();
        assert_eq!(aged.lookback_days, 1.0, "{b}: recomputed once old");
        tamper(s, under_way, now).await;

        // Late data rolled up into the day: the ended range is recomputed from the new rows;
        // the one under way is left to age.
        roll_up_hour(s, 20).await;
        assert!(store::recommendations::recommendation_snapshot(
            s.db(),
            ended.from_ms,
            ended.to_ms,
            ended.observed_ms
        )
        .await
        .unwrap()
        .is_none());
        let again = get(
            s,
            &card,
            &OwnerSchema::default(),
            ended,
            later + 31 * DAY_MS,
        )
        .await
        .unwrap();
        assert_eq!(again.lookback_days, 1.0, "{b}");
        assert_eq!(packing_cost(&again), "608.33".parse().unwrap(), "{b}");
        assert!(store::recommendations::recommendation_snapshot(
            s.db(),
            under_way.from_ms,
            under_way.to_ms,
            under_way.observed_ms
        )
        .await
        .unwrap()
        .is_some());

        // Expiry drops old snapshots of ranges under way, never ended ones.
        assert_eq!(
            store::recommendations::expire_recommendation_snapshots(s.db(), now + MAX_AGE_MS)
                .await
                .unwrap(),
            1,
            "{b}"
        );
        assert!(store::recommendations::recommendation_snapshot(
            s.db(),
            ended.from_ms,
            ended.to_ms,
            ended.observed_ms
        )
        .await
        .unwrap()
        .is_some());

        // A view that raced a roll-up: it read the rollups before the roll-up committed (and
        // deleted the stored ones) and writes after. What it drew is kept but never served.
        let before = store::sections::rollup_generation(s.db(), (ended.from_ms, ended.to_ms))
            .await
            .unwrap();
        roll_up_hour(s, 30).await;
        let stale = serde_json::to_string(&Recommendations {
            lookback_days: 99.0,
            ..Default::default()
        })
        .unwrap();
        let write = |generation: i64| {
            store::recommendations::put_recommendation_snapshot(
                s.db(),
                (ended.from_ms, ended.to_ms, ended.observed_ms),
                (generation, later),
                &stale,
            )
        };
        write(before).await.unwrap();
        let after = get(
            s,
            &card,
            &OwnerSchema::default(),
            ended,
            later + 32 * DAY_MS,
        )
        .await
        .unwrap();
        assert_eq!(
            after.lookback_days, 1.0,
            "{b}: the raced copy is not served"
        );
        // $30 a day.
        assert_eq!(packing_cost(&after), "912.50".parse().unwrap(), "{b}");
        // Nor does a copy of older rollups replace the one computed since.
        write(before).await.unwrap();
        let kept = store::recommendations::recommendation_snapshot(
            s.db(),
            ended.from_ms,
            ended.to_ms,
            ended.observed_ms,
        )
        .await
        .unwrap()
        .unwrap();
        assert!(
            kept.current && !kept.body.contains("99.0"),
            "{b}: {}",
            kept.body
        );
    }
}

#[test]
fn the_review_reads_the_months_last_seven_whole_days() {
    let month = (DAY - 20 * DAY_MS, DAY + 10 * DAY_MS);
    // Mid-month, 14:30: up to tonight's midnight, observed to the end of this hour.
    let now = DAY + 14 * HOUR_MS + 30 * 60_000;
    assert_eq!(
        review_range(month.0, month.1, now),
        Some(Range {
            from_ms: DAY + DAY_MS - 7 * DAY_MS,
            to_ms: DAY + DAY_MS,
            observed_ms: 6 * DAY_MS + 15 * HOUR_MS,
        })
    );
    // A past month: its last 7 days, all of them observed.
    let past = review_range(month.0, month.1, month.1 + 40 * DAY_MS).unwrap();
    assert_eq!(
        (past.from_ms, past.to_ms, past.observed_ms),
        (month.1 - 7 * DAY_MS, month.1, 7 * DAY_MS)
    );
    // Its second day: from the month's start.
    let early = review_range(month.0, month.1, month.0 + DAY_MS + HOUR_MS).unwrap();
    assert_eq!(
        (early.from_ms, early.to_ms, early.observed_ms),
        (month.0, month.0 + 2 * DAY_MS, DAY_MS + 2 * HOUR_MS)
    );
    // A month that has not started.
    assert_eq!(review_range(month.0, month.1, month.0 - HOUR_MS), None);
}
