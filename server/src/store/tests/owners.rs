//! Owners as data: migration 0020 turns the rollups' four owner columns into rows of `owners`
//! without losing a cent, and owners written afterwards find the migrated rows.

use super::*;
use crate::store::{DirtyMark, RollupGrain, RollupRow};
use gpuledger_core::owners::Owner;
use gpuledger_core::time::{DAY_MS, HOUR_MS};

const HOUR: i64 = T0 - T0 % DAY_MS + 5 * HOUR_MS;
const DAY: i64 = HOUR - 5 * HOUR_MS;

/// Rollups as the old schema held them: three owners (one with a quote and a non-ASCII letter
/// in its values, one nobody) over hours, days and host days, with atto parts to carry.
fn before_owners() -> Vec<String> {
    let hour = |model: &str, experiment: &str, team: &str, nano: i64, atto: i64| {
        format!(
            "INSERT INTO rollup_hours (hour_ms, host_id, gpu_uuid, model, experiment, endpoint,
                team, kind, pricing_category, currency, estimated, cost_nano, cost_atto,
                gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j)
             VALUES ({HOUR}, 1, 'GPU-1', '{model}', '{experiment}', '', '{team}', 'used',
                'on_demand', 'USD', 0, {nano}, {atto}, 1800, 900, 1800, 0)"
        )
    };
    let day = |table: &str, gpu: &str, model: &str, team: &str, nano: i64, atto: i64| {
        let gpu_column = if gpu.is_empty() { "" } else { "gpu_uuid, " };
        let gpu_value = if gpu.is_empty() {
            String::new()
        } else {
            format!("'{gpu}', ")
        };
        format!(
            "INSERT INTO {table} (day_ms, host_id, {gpu_column}model, experiment, endpoint, team,
                kind, pricing_category, currency, estimated, cost_nano, cost_atto, gpu_seconds,
                util_gpu_seconds, util_known_seconds, energy_j)
             VALUES ({DAY}, 1, {gpu_value}'{model}', '', '', '{team}', 'used', 'on_demand',
                'USD', 0, {nano}, {atto}, 1800, 900, 1800, 0)"
        )
    };
    vec![
        hour("llama", "run-1", "search", 1_234_567_890, 999_999_999),
        hour("ll\"ama ü", "", "r&d", 5_000_000_000, 1),
        hour("", "", "", 7, 0),
        day(
            "rollup_days",
            "GPU-1",
            "llama",
            "search",
            2_000_000_000,
            500_000_000,
        ),
        day("rollup_days", "GPU-1", "", "", 3, 0),
        day("rollup_host_days", "", "ll\"ama ü", "r&d", 4_000_000_000, 0),
    ]
}

/// An hour of GPU-1's used time on host 1, for `owner`, of `nano` nanodollars.
fn used_row(owner: &str, nano: i64) -> RollupRow {
    RollupRow {
        period_ms: HOUR,
        host_id: 1,
        gpu_uuid: "GPU-1".into(),
        owner: owner.into(),
        kind: "used".into(),
        pricing_category: "on_demand".into(),
        currency: "USD".into(),
        estimated: 0,
        cost_nano: nano,
        cost_atto: 0,
        gpu_seconds: 1800.0,
        util_gpu_seconds: 900.0,
        util_known_seconds: 1800.0,
        energy_j: 0.0,
        energy_known_seconds: 0.0,
    }
}

/// Rolls `HOUR` up again as `rows`, as the roll-up would.
async fn rewrite_hour(s: &dyn Store, rows: &[RollupRow]) -> Result<(), StoreError> {
    crate::store::rollups::mark_dirty_hours(s.db(), &[HOUR]).await?;
    let marks: Vec<DirtyMark> = crate::store::rollups::dirty_marks(s.db(), 10).await?;
    crate::store::rollups::replace_rollups(s.db(), &marks, rows, &[], &[], Some("experiment")).await
}

/// Per owner and grain, the cost as the ledger reads it back.
async fn costs(s: &dyn Store) -> BTreeMap<(&'static str, String), rust_decimal::Decimal> {
    let mut out = BTreeMap::new();
    for (name, grain, from) in [
        ("hour", RollupGrain::Hour, HOUR),
        ("day", RollupGrain::Day, DAY),
        ("host day", RollupGrain::HostDay, DAY),
    ] {
        for r in crate::store::ledger::rollup_rows(s.db(), grain, from, from + DAY_MS)
            .await
            .unwrap()
        {
            *out.entry((name, r.owner)).or_default() +=
                gpuledger_core::money::from_nano_atto(r.cost_nano, r.cost_atto);
        }
    }
    out
}

#[tokio::test]
async fn rollups_keep_every_cent_and_their_owners_through_the_migration() {
    for db in test_support::both().await {
        let b = db.backend;
        let (_dir, migrator) = migrations_before(b, "0020").await;
        let statements = before_owners();
        let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
        old_database(&db, &migrator, &statements).await;
        let store = db.open().await;
        let s = store.as_ref();

        let owner = |pairs: &[(&str, &str)]| pairs.iter().copied().collect::<Owner>().key();
        let llama = owner(&[
            ("model", "llama"),
            ("experiment", "run-1"),
            ("team", "search"),
        ]);
        let quoted = owner(&[("model", "ll\"ama ü"), ("team", "r&d")]);
        let nobody = Owner::default().key();
        let d = |s: &str| gpuledger_core::money::from_text(s);
        let want: BTreeMap<(&str, String), rust_decimal::Decimal> = [
            (("hour", llama.clone()), d("1.234567890999999999")),
            (("hour", quoted.clone()), d("5.000000000000000001")),
            (("hour", nobody.clone()), d("0.000000007")),
            (
                ("day", owner(&[("model", "llama"), ("team", "search")])),
                d("2.0000000005"),
            ),
            (("day", nobody.clone()), d("0.000000003")),
            (("host day", quoted.clone()), d("4")),
        ]
        .into_iter()
        .collect();
        assert_eq!(costs(s).await, want, "{b}: every owner, every cent");
        // Migration 0037 sums the hours per host as they were: every team's cent, to the
        // atto-dollar, carried from atto into nano parts.
        let by_team: BTreeMap<String, rust_decimal::Decimal> =
            crate::store::ledger::owner_hours(s.db(), HOUR, HOUR + HOUR_MS, "team", "team")
                .await
                .unwrap()
                .into_iter()
                .map(|(_, h)| (h.key, h.cost))
                .collect();
        let teams: BTreeMap<String, rust_decimal::Decimal> = [
            ("search".to_owned(), d("1.234567890999999999")),
            ("r&d".to_owned(), d("5.000000000000000001")),
        ]
        .into_iter()
        .collect();
        assert_eq!(by_team, teams, "{b}: the hours summed per host");

        // The server's own text of a migrated owner finds its row: writing the hour again under
        // the same owners adds none.
        let owners_before: i64 = count_owners(s).await;
        assert_eq!(owners_before, 4, "{b}: one row per distinct owner");
        // Owners an older server wrote without their values (during a rolling upgrade) get
        // them when an hour of theirs is rolled up again.
        execute_sql(&db, "DELETE FROM owner_values").await;
        rewrite_hour(s, &[used_row(&llama, 10), used_row(&quoted, 20)])
            .await
            .unwrap();
        assert_eq!(count_owners(s).await, owners_before, "{b}: no owner twice");
        let teams: Vec<String> =
            crate::store::ledger::owner_hours(s.db(), HOUR, HOUR + HOUR_MS, "team", "team")
                .await
                .unwrap()
                .into_iter()
                .map(|(_, h)| h.key)
                .collect();
        assert_eq!(teams.len(), 2, "{b}: {teams:?}");
        assert!(teams.iter().any(|t| t == "search"), "{b}: {teams:?}");
        let after = costs(s).await;
        assert_eq!(after[&("hour", quoted.clone())], d("0.00000002"), "{b}");
        let runs = crate::store::ledger::rollup_experiment_days(s.db(), DAY, DAY + DAY_MS)
            .await
            .unwrap();
        assert_eq!(
            runs.iter()
                .map(|r| r.experiment.as_str())
                .collect::<Vec<_>>(),
            ["run-1"],
            "{b}: runs read from the experiment dimension's values"
        );
    }
}

async fn count_owners(s: &dyn Store) -> i64 {
    let mut conn = s.db().read().await.unwrap();
    crate::store::db::on_backend!(conn, |ex| {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM owners")
            .fetch_one(&mut *ex)
            .await
            .unwrap();
        n
    })
}

/// An owner of many dimensions with long values is a text of several KB, more than one
/// PostgreSQL btree entry holds: it is stored, found again, and never stored twice.
#[tokio::test]
async fn an_owner_of_many_long_values_is_stored_once() {
    for db in test_support::both().await {
        let b = db.backend;
        let store = db.open().await;
        let s = store.as_ref();
        // Values that do not compress (PostgreSQL compresses a long repetitive key to fit).
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut value = || {
            (0..40)
                .map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    format!("{:x}", seed >> 40)
                })
                .collect::<String>()
        };
        let long: Owner = (0..16)
            .map(|i| (format!("dimension_{i}"), format!("\"é{}", value())))
            .collect();
        let long = long.key();
        assert!(long.len() > 4000, "{b}: {} bytes", long.len());
        let short = [("team", "search")].into_iter().collect::<Owner>().key();
        for pass in 0..2 {
            rewrite_hour(s, &[used_row(&long, 10 + pass), used_row(&short, 20)])
                .await
                .unwrap_or_else(|e| panic!("{b}: pass {pass}: {e}"));
            assert_eq!(
                count_owners(s).await,
                2,
                "{b}: pass {pass}: each owner once"
            );
        }
        let costs = costs(s).await;
        assert_eq!(
            costs[&("hour", long.clone())],
            gpuledger_core::money::from_text("0.000000011"),
            "{b}: the long owner's row, as written the second time"
        );
    }
}

/// An owner's hour reads what hours a commitment covered apart (scale-to-zero counts it as
/// freed commitment, not cash), to the atto-dollar, in one row per owner and hour.
#[tokio::test]
async fn owner_hours_keep_what_commitments_covered_apart() {
    for db in test_support::both().await {
        let b = db.backend;
        let store = db.open().await;
        let s = store.as_ref();
        let team = [("team", "search")].into_iter().collect::<Owner>().key();
        let mut covered = used_row(&team, 3_000_000_000);
        covered.pricing_category = "committed".into();
        covered.cost_atto = 5;
        let mut on_demand = used_row(&team, 1_000_000_000);
        on_demand.gpu_uuid = "GPU-2".into();
        rewrite_hour(s, &[covered, on_demand]).await.unwrap();
        let rows = crate::store::ledger::owner_hours(s.db(), HOUR, HOUR + HOUR_MS, "team", "team")
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{b}: {rows:?}");
        let d = |s: &str| gpuledger_core::money::from_text(s);
        assert_eq!(
            (rows[0].1.cost, rows[0].1.committed),
            (d("4.000000000000000005"), d("3.000000000000000005")),
            "{b}"
        );
    }
}
