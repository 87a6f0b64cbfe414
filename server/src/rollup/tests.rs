//! Rollups against attribution computed straight from raw data: equal to the cent and beyond,
//! on both backends, through late data, repeats, replaced bills and retention.

use super::passes::*;
use std::collections::BTreeMap;

use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};
use rust_decimal::Decimal;

use super::*;

use crate::ledger::{attributed_costs, experiment_hours, gpu_days, load, top_gpus, Keep};
use crate::recommend::evidence_from_raw;
use crate::store;
use crate::store::AgentStatus;
use crate::test_support;
use gpuledger_core::attribution::Attribution;
use gpuledger_core::attribution::Kind;
use gpuledger_core::attribution::Owner;
use gpuledger_core::attribution::Rules;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::recommend::recommend;
use gpuledger_core::recommend::Options;
use gpuledger_core::recommend::Recommendations;
use gpuledger_core::time::DAY_MS;

/// Three hours before a UTC midnight, so the data spans two days.
const DAY0: i64 = 1_800_000_000_000 - 1_800_000_000_000 % DAY_MS + DAY_MS;
const START: i64 = DAY0 - 3 * HOUR_MS;
const END: i64 = DAY0 + 27 * HOUR_MS;
const STEP: i64 = 20 * 60_000;

fn report(batch: &str, host: &str, instance: &str, start: i64, count: i64, model: &str) -> Report {
    let windows = (0..count)
        .map(|i| {
            let s = start + i * STEP;
            let util = ((i * 37) % 100) as f64;
            Window {
                serving: Vec::new(),
                start_ms: s,
                end_ms: s + STEP,
                samples: 20,
                gpus: (0..2)
                    .map(|g| GpuWindow {
                        uuid: format!("GPU-{host}-{g}"),
                        index: g,
                        name: "NVIDIA A100-SXM4-80GB".into(),
                        memory_total_bytes: Some(80 << 30),
                        memory_used_max_bytes: Some(10 << 30),
                        util_avg: Some(util),
                        util_max: Some(100.0),
                        util_histogram: Vec::new(),
                        mem_util_avg: None,
                        power_avg_watts: Some(300.0),
                        temperature_max_c: None,
                        energy_mj: Some(360_000_000),
                        // GPU 1 is idle every third window; otherwise a process works or holds.
                        processes: if g == 1 && i % 3 == 0 {
                            vec![]
                        } else {
                            vec![ProcessWindow {
                                pid: 100 + g,
                                name: None,
                                memory_used_max_bytes: Some(9 << 30),
                                sm_util_avg: Some(if i % 4 == 0 { 0.0 } else { util }),
                                labels: BTreeMap::from([
                                    ("model".into(), model.into()),
                                    ("team".into(), format!("team-{g}")),
                                    ("experiment".into(), format!("{model}-run-{g}")),
                                ]),
                                container_id: None,
                                pod_uid: None,
                                user: None,
                                owner_unknown: None,
                            }]
                        },
                        parent_uuid: None,
                        ..Default::default()
                    })
                    .collect(),
            }
        })
        .collect();
    Report {
        batch_id: batch.into(),
        agent_version: "test".into(),
        host: HostInfo {
            hostname: host.into(),
            cluster: "c".into(),
            provider: Some("aws".into()),
            instance_id: Some(instance.into()),
            instance_type: Some("p4d.24xlarge".into()),
            region: None,
            lifecycle: None,
        },
        windows,
    }
}

const FOCUS_HEADER: &str = "ProviderName,BillingAccountId,BillingPeriodStart,ChargePeriodStart,ChargePeriodEnd,ChargeCategory,BilledCost,EffectiveCost,ListCost,BillingCurrency,PricingCategory,CommitmentDiscountStatus,ServiceName,SkuId,SkuPriceDetails,ResourceId,RegionId,Tags";

/// An agent token for clusters matching `clusters`, created at `at`: its id.
async fn agent_token(s: &dyn Store, clusters: &str, at: i64) -> i64 {
    store::tokens::create_token(
        s.db(),
        &crate::store::tokens::NewToken::for_cluster("t", "h", clusters),
        at,
    )
    .await
    .unwrap();
    store::tokens::active_token(s.db(), "h", at)
        .await
        .unwrap()
        .unwrap()
        .id
}

fn iso(ms: i64) -> String {
    gpuledger_core::time::rfc3339(ms)
}

/// A bill: host a's two days at odd amounts (15 decimals, spread over 24 hours each), a line
/// for a machine gpuledger does not know, and nothing for host b (rate card).
async fn import_bill(store: &dyn Store, name: &str, scale: &str) {
    let period = iso(DAY0 - DAY_MS);
    let mut csv = String::from(FOCUS_HEADER);
    for (day, cost) in [
        (DAY0 - DAY_MS, "786.123456789012345"),
        (DAY0, "790.000000000000007"),
    ] {
        let cost =
            (cost.parse::<Decimal>().unwrap() * scale.parse::<Decimal>().unwrap()).to_string();
        csv.push_str(&format!(
            "\nAWS,1,{period},{},{},Usage,{cost},{cost},{cost},USD,Standard,,EC2,s,,i-aaa,us-east-1,",
            iso(day),
            iso(day + DAY_MS)
        ));
    }
    csv.push_str(&format!(
        "\nAWS,1,{period},{},{},Usage,7.77,7.77,7.77,USD,Standard,,S3,s,,bucket-x,us-east-1,",
        iso(DAY0),
        iso(DAY0 + HOUR_MS)
    ));
    let lines = crate::billing::focus_file::parse(csv.as_bytes()).unwrap();
    crate::billing::store_lines(store, "focus", name, format!("sha-{name}"), lines, DAY0)
        .await
        .unwrap();
}

/// Every cheaper GPU with the memory fits and every GPU in use is a packing candidate.
const WIDE_OPEN: Options = Options {
    headroom: 0.2,
    target_util: 1_000.0,
    consolidation_below: 100.0,
};

async fn recommended(store: &dyn Store, card: &RateCard, from: i64, to: i64) -> Recommendations {
    let evidence = crate::recommend::recommendation_evidence(
        store,
        from,
        to,
        &gpuledger_core::owners::OwnerSchema::default(),
    )
    .await
    .unwrap();
    recommend(&evidence, card, to - from, WIDE_OPEN)
}

/// Nothing fits a smaller GPU (no GPU has 100 times the memory): only packing is left, so the
/// packing candidates that right-sizing would cover are compared too.
const PACK_ONLY: Options = Options {
    headroom: 100.0,
    ..WIDE_OPEN
};

/// No GPU is busy under 0%: only right-sizing is left (a host's packing, opened wide, saves
/// more than moving its GPUs to a smaller model, and would win them).
const SIZE_ONLY: Options = Options {
    consolidation_below: 0.0,
    ..WIDE_OPEN
};

type Key = (i64, i64, Option<String>, Owner, Kind, String, String, bool);

/// Parts summed per (period, host, GPU, owner, kind, price, currency, estimated): cost exactly,
/// GPU time rounded to the millisecond.
fn summed(parts: &[Part], grain: RollupGrain) -> BTreeMap<Key, (Decimal, i64)> {
    let mut out: BTreeMap<Key, (Decimal, i64)> = BTreeMap::new();
    for p in parts {
        let period = match grain {
            RollupGrain::Hour | RollupGrain::OwnerHour(_) => p.hour_ms,
            RollupGrain::Day | RollupGrain::HostDay => p.hour_ms.div_euclid(DAY_MS) * DAY_MS,
            // The whole range at once.
            RollupGrain::HostRange | RollupGrain::HostGroupRange => 0,
        };
        let per_host = matches!(grain, RollupGrain::HostDay | RollupGrain::HostRange);
        let key = (
            period,
            p.host_id,
            // Per host: a host-day part names no GPU.
            p.gpu_uuid.clone().filter(|_| !per_host),
            p.owner.clone(),
            p.kind,
            p.pricing_category.clone(),
            p.currency.clone(),
            p.estimated,
        );
        let e = out.entry(key).or_default();
        e.0 += p.cost;
        e.1 += (p.gpu_seconds * 1000.0).round() as i64;
    }
    out.retain(|_, (c, _)| !c.is_zero());
    out
}

fn close(a: &BTreeMap<Key, (Decimal, i64)>, b: &BTreeMap<Key, (Decimal, i64)>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| ka == kb && va.0 == vb.0 && (va.1 - vb.1).abs() <= 1)
}

/// Attribution of `[from, to)` from raw data, with the default thresholds and owners.
async fn raw_attribution(store: &dyn Store, card: &RateCard, from: i64, to: i64) -> Attribution {
    attribution::compute(store, card, &Default::default(), from, to)
        .await
        .unwrap()
}

/// The hours summed per host (what scale-to-zero, the shape and coverage read) still hold the
/// hourly ledger's parts: each team's cost to the atto-dollar and GPU time per hour, kind and
/// currency, through every re-rolled hour.
async fn assert_host_hours_match(store: &dyn Store, from: i64, to: i64, what: &str) {
    let hourly = load(store, from, to, RollupGrain::Hour).await.unwrap();
    type Key = (i64, String, Kind, String);
    let mut want: BTreeMap<Key, (Decimal, f64)> = BTreeMap::new();
    for p in &hourly.parts {
        if let Some(team) = p.owner.get("team") {
            let e = want
                .entry((p.hour_ms, team.to_owned(), p.kind, p.currency.clone()))
                .or_default();
            e.0 += p.cost;
            e.1 += p.gpu_seconds;
        }
    }
    let rows = store::ledger::owner_hours(store.db(), from, to, "team", "team")
        .await
        .unwrap();
    let mut got: BTreeMap<Key, (Decimal, f64)> = BTreeMap::new();
    for (_, h) in rows {
        got.insert(
            (h.hour_ms, h.key, h.kind, h.currency),
            (h.cost, h.gpu_seconds),
        );
    }
    assert!(!want.is_empty(), "{what}: teams in the fixture");
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: owner-hours"
    );
    for (key, (cost, seconds)) in &want {
        assert_eq!(&got[key].0, cost, "{what}: {key:?}");
        assert!((got[key].1 - seconds).abs() < 1e-6, "{what}: {key:?}");
    }
}

/// The days summed by the database per value of a dimension (what the review's chart and
/// anomalies read) hold the host-days' parts: cost to the atto-dollar and GPU time per day,
/// value, kind, price, currency and estimate, for a dimension and for none.
async fn assert_days_by_match(store: &dyn Store, from: i64, to: i64, what: &str) {
    let per_host = load(store, from, to, RollupGrain::HostDay).await.unwrap();
    // The range summed per host is the host-days summed per host and owner, days without GPU
    // time apart (what variance counts as cost without hours).
    type RangeKey = (i64, Option<String>, Owner, Kind, String, String, bool, bool);
    let per_range = |a: &Attribution| {
        let mut out: BTreeMap<RangeKey, Decimal> = BTreeMap::new();
        for p in &a.parts {
            let key = (
                p.host_id,
                // Hours at the range's ends name their GPU, whole days none.
                p.gpu_uuid.clone(),
                p.owner.clone(),
                p.kind,
                p.pricing_category.clone(),
                p.currency.clone(),
                p.estimated,
                p.gpu_seconds == 0.0,
            );
            *out.entry(key).or_default() += p.cost;
        }
        out
    };
    let ranged = load(store, from, to, RollupGrain::HostRange).await.unwrap();
    assert_eq!(
        per_range(&ranged),
        per_range(&per_host),
        "{what}: the range summed per host"
    );
    // Kept as a closed range's: the first read keeps the rows, the next reads them back, and a
    // roll-up since (this runs after each change of the fixture) retires them.
    let keep = crate::ledger::Keep::before(i64::MAX, to);
    let canonical = |a: &Attribution| {
        let mut parts: Vec<String> = a.parts.iter().map(|p| format!("{p:?}")).collect();
        parts.sort();
        parts
    };
    for read in ["computed", "read back"] {
        let kept = crate::ledger::load_kept(store, from, to, RollupGrain::HostRange, keep)
            .await
            .unwrap();
        assert_eq!(canonical(&kept), canonical(&ranged), "{what}: kept, {read}");
        assert_eq!(kept.unattributed, ranged.unattributed, "{what}: {read}");
    }
    let whole_days = (
        (hour_floor(from) + DAY_MS - 1).div_euclid(DAY_MS) * DAY_MS,
        to.div_euclid(DAY_MS) * DAY_MS,
    );
    // What is kept is the database's rows, bit for bit; and it is what is served.
    let section = ("ledger-host-range", "all");
    let body = store::sections::section_snapshot(store.db(), section, whole_days)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: the whole days kept"));
    let sorted = |mut rows: Vec<store::RollupRow>| {
        rows.sort_by_key(|r| format!("{r:?}"));
        rows
    };
    let live = store::ledger::rollup_rows(
        store.db(),
        RollupGrain::HostRange,
        whole_days.0,
        whole_days.1,
    )
    .await
    .unwrap();
    let stored: Vec<store::RollupRow> = serde_json::from_str(&body).unwrap();
    assert!(!live.is_empty(), "{what}");
    assert_eq!(sorted(stored.clone()), sorted(live), "{what}: kept rows");
    let generation = store::sections::rollup_generation(store.db(), whole_days)
        .await
        .unwrap();
    let put = |rows: &[store::RollupRow]| {
        let body = serde_json::to_string(rows).unwrap();
        async move {
            store::sections::put_section_snapshot(
                store.db(),
                section,
                (whole_days.0, whole_days.1, false),
                (generation, to),
                &body,
            )
            .await
            .unwrap();
        }
    };
    let mut changed = stored.clone();
    changed[0].cost_nano += 1;
    put(&changed).await;
    let served = crate::ledger::load_kept(store, from, to, RollupGrain::HostRange, keep)
        .await
        .unwrap();
    let total = |a: &Attribution| a.parts.iter().map(|p| p.cost).sum::<Decimal>();
    assert_eq!(
        total(&served) - total(&ranged),
        Decimal::new(1, 9),
        "{what}: the kept rows are served"
    );
    put(&stored).await;
    type Key = (i64, Option<String>, Kind, String, String, bool);
    for dimension in [Some("team"), Some("model"), None] {
        let by_day = |a: &Attribution| {
            let mut out: BTreeMap<Key, (Decimal, f64)> = BTreeMap::new();
            for p in &a.parts {
                let value = dimension.and_then(|d| p.owner.get(d)).map(str::to_owned);
                let e = out
                    .entry((
                        p.hour_ms.div_euclid(DAY_MS) * DAY_MS,
                        value,
                        p.kind,
                        p.pricing_category.clone(),
                        p.currency.clone(),
                        p.estimated,
                    ))
                    .or_default();
                e.0 += p.cost;
                e.1 += p.gpu_seconds;
            }
            out
        };
        let want = by_day(&per_host);
        let summed = crate::ledger::days_by(store, from, to, dimension, Keep::NOTHING)
            .await
            .unwrap();
        for read in ["computed", "read back"] {
            let kept = crate::ledger::days_by(store, from, to, dimension, keep)
                .await
                .unwrap();
            assert_eq!(
                by_day(&kept),
                by_day(&summed),
                "{what}: {dimension:?} kept, {read}"
            );
        }
        // One row per key: the database summed them.
        assert_eq!(
            summed.parts.len(),
            by_day(&summed).len(),
            "{what}: {dimension:?}"
        );
        let got = by_day(&summed);
        assert!(
            want.keys().any(|k| k.1.is_some()) || dimension.is_none(),
            "{what}: {dimension:?} values in the fixture"
        );
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{what}: {dimension:?} days"
        );
        for (key, (cost, seconds)) in &want {
            assert_eq!(&got[key].0, cost, "{what}: {dimension:?} {key:?}");
            assert!(
                (got[key].1 - seconds).abs() < 1e-6,
                "{what}: {dimension:?} {key:?}"
            );
        }
        assert!(summed.parts.iter().all(|p| p.gpu_uuid.is_none()));
    }
}

/// Allocation by an owner dimension read from the days summed per value and grid is
/// allocation from the host-days: the same rows and totals, to the atto-dollar, with the same
/// GPU-hours, utilization, energy and emissions (each host's grid by its region).
async fn assert_by_value_matches(store: &dyn Store, from: i64, to: i64, what: &str) {
    use gpuledger_core::allocation::group;
    use gpuledger_core::allocation::totals;
    use gpuledger_core::allocation::GroupBy;
    use gpuledger_core::allocation::Step;
    let per_host = load(store, from, to, RollupGrain::HostDay).await.unwrap();
    let table = gpuledger_core::carbon::GridTable::default();
    let close = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(1.0),
        (x, y) => x == y,
    };
    for dimension in ["model", "team"] {
        let by_value = crate::ledger::load_by_value(store, from, to, dimension, Keep::NOTHING)
            .await
            .unwrap();
        assert!(by_value.parts.len() <= per_host.parts.len(), "{what}");
        let (want_grid, got_grid) = (
            crate::carbon::grid(&per_host, &table),
            crate::carbon::grid(&by_value, &table),
        );
        for step in [Step::Day, Step::Month] {
            let by = GroupBy::Owner(dimension);
            let want = group(&per_host, by, step, &want_grid);
            let got = group(&by_value, by, step, &got_grid);
            assert!(!want.is_empty(), "{what}");
            assert_eq!(got.len(), want.len(), "{what}: {dimension} {step:?}");
            for (g, w) in got.iter().zip(&want) {
                let money = |r: &gpuledger_core::allocation::AllocationRow| {
                    (
                        r.period_start.clone(),
                        r.key.clone(),
                        r.currency.clone(),
                        [
                            r.cost,
                            r.used_cost,
                            r.held_idle_cost,
                            r.idle_cost,
                            r.unmonitored_cost,
                        ],
                        r.estimated,
                    )
                };
                assert_eq!(money(g), money(w), "{what}: {dimension} {step:?}");
                for (x, y) in [
                    (Some(g.gpu_hours), Some(w.gpu_hours)),
                    (g.avg_util, w.avg_util),
                    (Some(g.presence_gpu_hours), Some(w.presence_gpu_hours)),
                    (g.energy_kwh, w.energy_kwh),
                    (g.energy_measured_share, w.energy_measured_share),
                    (g.kg_co2e, w.kg_co2e),
                ] {
                    assert!(close(x, y), "{what}: {dimension} {step:?} {g:?} {w:?}");
                }
            }
        }
        let (got, want) = (totals(&by_value, &got_grid), totals(&per_host, &want_grid));
        assert_eq!(got.len(), want.len(), "{what}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(
                (&g.currency, g.cost, g.unattributed_cost, g.idle_cost),
                (&w.currency, w.cost, w.unattributed_cost, w.idle_cost),
                "{what}"
            );
            assert!(close(g.kg_co2e, w.kg_co2e), "{what}: {g:?} {w:?}");
        }
    }
}

/// Allocation by value with its closed months kept reads what it reads live, computed and read
/// back; only a whole calendar month is kept (a range inside one leaves nothing behind), and the
/// kept body is what is served.
async fn assert_by_value_kept(store: &dyn Store, what: &str) {
    use gpuledger_core::time::{month_start_ms, next_month_start};
    let month = (month_start_ms(START), next_month_start(START));
    assert!(
        month.0 < START && END < month.1,
        "the fixture lies in one month"
    );
    // Half a day of the month before (read live), the whole month (kept).
    let (from, to) = (month.0 - 12 * HOUR_MS, month.1);
    let keep = Keep::before(month.1, month.1 + DAY_MS);
    let canonical = |a: &Attribution| {
        let mut parts: Vec<String> = a.parts.iter().map(|p| format!("{p:?}")).collect();
        parts.sort();
        (parts, format!("{:?}", a.hosts), a.unattributed.clone())
    };
    let section = ("ledger-by-value", "team");
    let live = crate::ledger::load_by_value(store, from, to, "team", Keep::NOTHING)
        .await
        .unwrap();
    assert!(!live.parts.is_empty(), "{what}");
    // A range inside the month is read live: its whole days are not kept on their own.
    crate::ledger::load_by_value(store, START, END, "team", keep)
        .await
        .unwrap();
    let whole_days = (DAY0, DAY0 + DAY_MS);
    assert!(START < whole_days.0 && whole_days.1 < END);
    let inside = store::sections::section_snapshot(store.db(), section, whole_days)
        .await
        .unwrap();
    assert_eq!(inside, None, "{what}: part of a month kept");
    let kept_body = || store::sections::section_snapshot(store.db(), section, month);
    for read in ["computed", "read back"] {
        let kept = crate::ledger::load_by_value(store, from, to, "team", keep)
            .await
            .unwrap();
        assert_eq!(canonical(&kept), canonical(&live), "{what}: kept, {read}");
    }
    // The whole month alone is kept, as the database's rows bit for bit; and it is served.
    let body = kept_body()
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: the month kept"));
    let mut stored: Vec<store::ledger::ValueDayRow> = serde_json::from_str(&body).unwrap();
    let sorted = |mut rows: Vec<store::ledger::ValueDayRow>| {
        rows.sort_by_key(|r| format!("{r:?}"));
        rows
    };
    let rows =
        store::ledger::value_days(store.db(), RollupGrain::HostDay, month.0, month.1, "team")
            .await
            .unwrap();
    assert_eq!(sorted(stored.clone()), sorted(rows), "{what}: kept rows");
    let generation = store::sections::rollup_generation(store.db(), month)
        .await
        .unwrap();
    let put = |rows: Vec<store::ledger::ValueDayRow>| async move {
        let body = serde_json::to_string(&rows).unwrap();
        store::sections::put_section_snapshot(
            store.db(),
            section,
            (month.0, month.1, false),
            (generation, keep.now_ms),
            &body,
        )
        .await
        .unwrap();
    };
    let original = stored.clone();
    stored[0].cost_nano += 1;
    put(stored).await;
    let served = crate::ledger::load_by_value(store, from, to, "team", keep)
        .await
        .unwrap();
    let total = |a: &Attribution| a.parts.iter().map(|p| p.cost).sum::<Decimal>();
    assert_eq!(
        total(&served) - total(&live),
        Decimal::new(1, 9),
        "{what}: the kept rows are served"
    );
    put(original).await;
}

/// Hosts alike summed together give every figure that groups by a host's attributes or its
/// owner as hosts summed one by one do: the review's tables, totals and emissions, and each pair
/// of dimensions (variance sets teams against instance types), to the nano-dollar.
async fn assert_host_groups_match(store: &dyn Store, from: i64, to: i64, what: &str) {
    use gpuledger_core::allocation::group;
    use gpuledger_core::allocation::key_of;
    use gpuledger_core::allocation::GroupBy;
    use gpuledger_core::allocation::Step;
    let per_host = load(store, from, to, RollupGrain::HostRange).await.unwrap();
    let grouped = load(store, from, to, RollupGrain::HostGroupRange)
        .await
        .unwrap();
    assert!(!grouped.parts.is_empty(), "{what}");
    assert!(grouped.parts.len() <= per_host.parts.len(), "{what}");
    assert_eq!(grouped.unattributed, per_host.unattributed, "{what}");
    let grid = |a: &Attribution| crate::carbon::grid(a, &Default::default());
    let close_to = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0);
    let dimensions = [
        GroupBy::Cluster,
        GroupBy::InstanceType,
        GroupBy::PricingCategory,
        GroupBy::Owner("model"),
        GroupBy::Owner("team"),
        GroupBy::Owner("experiment"),
    ];
    for by in dimensions {
        let (g, h) = (
            group(&grouped, by, Step::Month, &grid(&grouped)),
            group(&per_host, by, Step::Month, &grid(&per_host)),
        );
        assert_eq!(g.len(), h.len(), "{what}: {by:?}");
        for (g, h) in g.iter().zip(&h) {
            let money = |r: &gpuledger_core::allocation::AllocationRow| {
                (
                    r.key.clone(),
                    r.currency.clone(),
                    r.cost,
                    r.used_cost,
                    r.held_idle_cost,
                    r.idle_cost,
                    r.unmonitored_cost,
                    r.estimated,
                )
            };
            assert_eq!(money(g), money(h), "{what}: {by:?}");
            assert!(close_to(g.gpu_hours, h.gpu_hours), "{what}: {by:?}");
            let opt = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) => close_to(a, b),
                (a, b) => a == b,
            };
            assert!(opt(g.energy_kwh, h.energy_kwh), "{what}: {by:?}");
            assert!(opt(g.kg_co2e, h.kg_co2e), "{what}: {by:?}");
            assert!(opt(g.avg_util, h.avg_util), "{what}: {by:?}");
        }
        for other in dimensions {
            let pairs = |a: &Attribution| {
                let mut out: BTreeMap<(String, String, String, Kind), (Decimal, i64)> =
                    BTreeMap::new();
                for p in &a.parts {
                    let key = (
                        key_of(p, by, a),
                        key_of(p, other, a),
                        p.currency.clone(),
                        p.kind,
                    );
                    let sum = out.entry(key).or_default();
                    sum.0 += p.cost;
                    sum.1 += (p.gpu_seconds * 1000.0).round() as i64;
                }
                out
            };
            assert_eq!(
                pairs(&grouped),
                pairs(&per_host),
                "{what}: {by:?} × {other:?}"
            );
        }
    }
}

/// The month under way's days before today are kept as its read per host (the review's, the
/// allocation API's) first reads them; today's are read live, and the two add up to the live
/// read of the whole month. A roll-up of today's hours leaves the kept days alone; one of a
/// kept day retires them. The next day's read replaces the day before's.
async fn assert_past_days_kept(store: &dyn Store, what: &str) {
    use gpuledger_core::time::{month_start_ms, next_month_start};
    let month = (month_start_ms(START), next_month_start(START));
    let today = DAY0 + DAY_MS;
    let now = today + 2 * HOUR_MS;
    let keep = Keep::past_days(now);
    type Key = (i64, Option<String>, String, Kind, String, bool);
    let sums = |a: &Attribution| {
        let mut out: BTreeMap<Key, (Decimal, i64)> = BTreeMap::new();
        for p in &a.parts {
            let key = (
                p.host_id,
                p.gpu_uuid.clone(),
                p.owner.key(),
                p.kind,
                p.currency.clone(),
                p.estimated,
            );
            let sum = out.entry(key).or_default();
            sum.0 += p.cost;
            sum.1 += p.gpu_seconds.round() as i64;
        }
        (out, a.unattributed.clone())
    };
    let read = |keep: Keep| {
        crate::ledger::load_kept(store, month.0, month.1, RollupGrain::HostRange, keep)
    };
    let live = sums(&read(Keep::NOTHING).await.unwrap());
    assert!(!live.0.is_empty(), "{what}");
    let section = ("ledger-host-range", "all");
    let stored = |to: i64| store::sections::stored_section(store.db(), section, (month.0, to));
    for pass in ["computed", "read back"] {
        let kept = read(keep).await.unwrap();
        assert_eq!(sums(&kept), live, "{what}: kept days and today, {pass}");
    }
    let past = stored(today)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: the days before today kept"));
    assert!(past.current, "{what}");
    // The roll-up rewrites today's first hour: the days before stay current.
    store::rollups::mark_dirty_hours(store.db(), &[today])
        .await
        .unwrap();
    crate::test_support::roll_up(store).await;
    let after = stored(today).await.unwrap();
    assert_eq!(after, Some(past.clone()), "{what}: today's roll-up");
    // The next day: its days before it replace the day before's.
    let tomorrow = Keep::past_days(now + DAY_MS);
    assert_eq!(
        sums(&read(tomorrow).await.unwrap()),
        live,
        "{what}: a day on"
    );
    assert!(stored(today + DAY_MS).await.unwrap().is_some(), "{what}");
    assert_eq!(stored(today).await.unwrap(), None, "{what}: replaced");
    // Late data for a kept day retires what was kept; it is read again.
    store::rollups::mark_dirty_hours(store.db(), &[DAY0 + 5 * HOUR_MS])
        .await
        .unwrap();
    crate::test_support::roll_up(store).await;
    assert_eq!(
        stored(today + DAY_MS).await.unwrap(),
        None,
        "{what}: retired"
    );
    assert_eq!(sums(&read(keep).await.unwrap()), live, "{what}: read again");
    assert!(
        stored(today).await.unwrap().is_some_and(|s| s.current),
        "{what}"
    );
}

/// The rollups say exactly what attribution from raw data says, per hour and per day.
async fn assert_matches_raw(store: &dyn Store, card: &RateCard, what: &str) {
    let (from, to) = (START - HOUR_MS, END + HOUR_MS);
    let raw = raw_attribution(store, card, from, to).await;
    for grain in [
        RollupGrain::Hour,
        RollupGrain::Day,
        RollupGrain::HostDay,
        RollupGrain::HostRange,
    ] {
        let rolled = load(store, from, to, grain).await.unwrap();
        assert!(
            close(&summed(&rolled.parts, grain), &summed(&raw.parts, grain)),
            "{what}: {grain:?} rollup differs from raw attribution"
        );
        assert_eq!(rolled.unattributed, raw.unattributed, "{what}: {grain:?}");
    }
    assert_host_hours_match(store, from, to, what).await;
    assert_days_by_match(store, from, to, what).await;
    assert_by_value_matches(store, from, to, what).await;
    assert_by_value_kept(store, what).await;
    assert_past_days_kept(store, what).await;
    assert_host_groups_match(store, START - HOUR_MS, END + HOUR_MS, what).await;
    assert_host_groups_match(store, DAY0, DAY0 + DAY_MS, what).await;
    // A range that starts and ends inside days takes hours at the edges, days between.
    let (from, to) = (START + HOUR_MS, END - 2 * HOUR_MS);
    let raw = raw_attribution(store, card, from, to).await;
    let rolled = load(store, from, to, RollupGrain::Day).await.unwrap();
    let total = |a: &Attribution| a.parts.iter().map(|p| p.cost).sum::<Decimal>();
    assert_eq!(total(&rolled), total(&raw), "{what}: a partial-day range");
    let per_host = load(store, from, to, RollupGrain::HostRange).await.unwrap();
    assert!(
        close(
            &summed(&per_host.parts, RollupGrain::HostRange),
            &summed(&raw.parts, RollupGrain::HostRange)
        ),
        "{what}: a partial-day range summed per host"
    );
    assert_days_by_match(store, from, to, what).await;
    assert!(total(&raw) > Decimal::ZERO);
    let summed_by_db = attributed_costs(store, from, to).await.unwrap();
    assert_eq!(
        summed_by_db.values().copied().sum::<Decimal>(),
        total(&raw),
        "{what}: the database's sum of a partial-day range"
    );

    // Recommendations drawn from the rollups are the ones drawn from raw windows, for whole
    // and partial days (thresholds opened wide so every list has entries to compare).
    for ((from, to), options) in [
        ((START - HOUR_MS, END + HOUR_MS), WIDE_OPEN),
        ((START - HOUR_MS, END + HOUR_MS), SIZE_ONLY),
        ((START + HOUR_MS, END - 2 * HOUR_MS), SIZE_ONLY),
        ((START - HOUR_MS, END + HOUR_MS), PACK_ONLY),
    ] {
        let a = raw_attribution(store, card, from, to).await;
        let ws = store::rollups::attribution_windows(store.db(), from, to)
            .await
            .unwrap();
        let ps = store::telemetry::process_windows(store.db(), from, to)
            .await
            .unwrap();
        let raw = recommend(&evidence_from_raw(&a, &ws, &ps), card, to - from, options);
        let listed = if options.consolidation_below <= 0.0 {
            raw.right_size.len()
        } else {
            raw.consolidation.len()
        };
        assert!(listed > 0, "{what}: {raw:?}");
        let evidence = crate::recommend::recommendation_evidence(
            store,
            from,
            to,
            &gpuledger_core::owners::OwnerSchema::default(),
        )
        .await
        .unwrap();
        assert_eq!(
            serde_json::to_value(recommend(&evidence, card, to - from, options)).unwrap(),
            serde_json::to_value(&raw).unwrap(),
            "{what}: recommendations from rollups"
        );
    }

    // Training runs from days (and the per-day experiment hours) equal runs from hours.
    let (from, to) = (DAY0 - DAY_MS, DAY0 + 2 * DAY_MS);
    let hourly = load(store, from, to, RollupGrain::OwnerHour("experiment"))
        .await
        .unwrap();
    let daily = load(store, from, to, RollupGrain::Day).await.unwrap();
    let hours = experiment_hours(store, from, to).await.unwrap();
    for grain in [RollupGrain::HostDay, RollupGrain::HostRange] {
        let per_host = load(store, from, to, grain).await.unwrap();
        assert_eq!(
            crate::unit_costs::training_runs_by_day(
                &per_host,
                &hours,
                &gpuledger_core::owners::OwnerSchema::default()
            ),
            crate::unit_costs::training_runs(
                &hourly,
                &gpuledger_core::owners::OwnerSchema::default()
            ),
            "{what}: training runs from {grain:?} rollups"
        );
    }
    // The heatmap's GPUs: the costliest first, with all their days.
    let (ranked, count) = top_gpus(store, from, to, 1).await.unwrap();
    let top = gpu_days(store, from, to, &ranked).await.unwrap();
    assert_eq!(count, 4, "{what}: GPUs with rows");
    let top_gpu = top.first().and_then(|p| p.gpu_uuid.clone());
    let mut by_gpu: BTreeMap<Option<String>, Decimal> = BTreeMap::new();
    for p in daily.parts.iter().filter(|p| p.gpu_uuid.is_some()) {
        *by_gpu.entry(p.gpu_uuid.clone()).or_default() += p.cost;
    }
    let most = by_gpu.values().copied().max();
    // The database orders by whole nano-units; below that two GPUs may tie.
    let nano = |d: Option<Decimal>| d.map(|d| (d * Decimal::from(1_000_000_000)).floor());
    assert_eq!(
        nano(by_gpu.get(&top_gpu).copied()),
        nano(most),
        "{what}: the costliest GPU"
    );
    assert!(top.iter().all(|p| p.gpu_uuid == top[0].gpu_uuid));
    let by_hour =
        crate::unit_costs::training_runs(&hourly, &gpuledger_core::owners::OwnerSchema::default());
    assert!(by_hour.len() >= 2, "{what}: runs in the fixture");
    assert_eq!(
        crate::unit_costs::training_runs_by_day(
            &daily,
            &hours,
            &gpuledger_core::owners::OwnerSchema::default()
        ),
        by_hour,
        "{what}: training runs from daily rollups"
    );
    assert_eq!(
        attributed_costs(store, from, to)
            .await
            .unwrap()
            .values()
            .copied()
            .sum::<Decimal>(),
        total(&daily),
        "{what}: the database's sum of whole days"
    );
}

#[tokio::test]
async fn rollups_track_raw_attribution_through_late_data_repeats_and_new_bills() {
    let card = RateCard::default_card();
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let token = agent_token(s, "c?*", START).await;
        let status = AgentStatus::default();
        // 30 hours of host a (billed) and host b (rate card), with a gap in host b's data.
        let a = report("a-1", "a", "i-aaa", START, 90, "llama");
        s.ingest(&a, token, status, START).await.unwrap();
        let b1 = report("b-1", "b", "i-bbb", START, 40, "bert");
        s.ingest(&b1, token, status, START).await.unwrap();
        import_bill(s, "bill-1", "1").await;
        assert!(
            !store::rollups::dirty_marks(s.db(), 10)
                .await
                .unwrap()
                .is_empty(),
            "{b}: ingest and bills mark"
        );

        // Passes of ~100 GPU windows (an hour is 12): many short passes, same figures.
        let hours: Vec<i64> = (0..24).map(|h| START + h * HOUR_MS).collect();
        let passes = split_by_windows(s, &hours, 100).await.unwrap();
        assert!(passes.len() >= 3, "{b}: {} passes", passes.len());
        let in_passes: Vec<i64> = passes.iter().flat_map(|p| p.hours.clone()).collect();
        assert_eq!(in_passes, hours, "{b}: every hour once, in order");
        assert!(
            passes.iter().all(|p| p.host_groups == [HostGroup::ALL]),
            "{b}: an hour fits, every host at once"
        );
        // Passes of ~5 windows: an hour a host at a time.
        let passes = split_by_windows(s, &hours, 5).await.unwrap();
        assert_eq!(passes.len(), hours.len(), "{b}: an hour a pass");
        let groups = &passes[0].host_groups;
        assert_eq!(groups.len(), 2, "{b}: one host a group: {groups:?}");
        assert_eq!(
            (groups[0].range.first, groups[1].range.last),
            (i64::MIN, i64::MAX),
            "{b}: every host id covered"
        );
        assert_eq!(
            groups[0].range.last + 1,
            groups[1].range.first,
            "{b}: {groups:?}"
        );
        assert!(
            groups
                .iter()
                .all(|g| g.host_ids.len() == 1 && g.range.contains(g.host_ids[0])),
            "{b}: each group reads its host: {groups:?}"
        );
        let summary = run_in_passes(
            s,
            &card,
            &Default::default(),
            usize::MAX,
            5,
            (i64::MIN, i64::MAX),
        )
        .await
        .unwrap();
        assert!(summary.hours >= 30 && summary.rows > 0, "{b}: {summary:?}");
        assert!(
            store::rollups::dirty_marks(s.db(), 10)
                .await
                .unwrap()
                .is_empty(),
            "{b}: all rolled up"
        );
        assert_matches_raw(s, &card, &format!("{b}: first roll-up, a host at a time")).await;
        // Again in passes of several hours, all hosts at once: the same figures.
        store::rollups::mark_dirty_hours(s.db(), &hours)
            .await
            .unwrap();
        run_in_passes(
            s,
            &card,
            &Default::default(),
            usize::MAX,
            100,
            (i64::MIN, i64::MAX),
        )
        .await
        .unwrap();
        assert_matches_raw(s, &card, &format!("{b}: again, hours at a time")).await;

        // A repeated batch stores nothing and marks nothing.
        s.ingest(&a, token, status, START).await.unwrap();
        assert!(
            store::rollups::dirty_marks(s.db(), 10)
                .await
                .unwrap()
                .is_empty(),
            "{b}: a repeat marks nothing"
        );

        // Late data: host b's gap filled a day later, by another owner.
        let late = report("b-late", "b", "i-bbb", START + 40 * STEP, 20, "whisper");
        s.ingest(&late, token, status, END).await.unwrap();
        let marked = store::rollups::dirty_marks(s.db(), 100).await.unwrap();
        assert!(
            !marked.is_empty() && marked.len() <= 8,
            "{b}: only late hours: {marked:?}"
        );
        run(s, &card, &Default::default(), usize::MAX)
            .await
            .unwrap();
        assert_matches_raw(s, &card, &format!("{b}: after late data")).await;

        // A newer export of the same billing period replaces the old one.
        import_bill(s, "bill-2", "1.5").await;
        run(s, &card, &Default::default(), usize::MAX)
            .await
            .unwrap();
        assert_matches_raw(s, &card, &format!("{b}: after a replaced bill")).await;

        // A report arriving while an hour is rolled up keeps that hour marked.
        let marks_before = {
            let late = report("b-later", "b", "i-bbb", START + 60 * STEP, 1, "whisper");
            s.ingest(&late, token, status, END).await.unwrap();
            let marks = store::rollups::dirty_marks(s.db(), 10).await.unwrap();
            let again = report("a-again", "a", "i-aaa", START + 60 * STEP + 60_000, 1, "x");
            s.ingest(&again, token, status, END).await.unwrap();
            let mut b2 = report("b-again", "b", "i-bbb", START + 60 * STEP + 60_000, 1, "x");
            b2.windows[0].end_ms = b2.windows[0].start_ms + 30_000;
            s.ingest(&b2, token, status, END).await.unwrap();
            marks
        };
        store::rollups::replace_rollups(s.db(), &marks_before, &[], &[], &[], None)
            .await
            .unwrap();
        assert!(
            store::rollups::dirty_marks(s.db(), 10)
                .await
                .unwrap()
                .iter()
                .any(|m| marks_before
                    .iter()
                    .any(|o| o.hour_ms == m.hour_ms && o.host_id == m.host_id)),
            "{b}: a mark changed during the roll-up survives it"
        );
        run(s, &card, &Default::default(), usize::MAX)
            .await
            .unwrap();
        assert_matches_raw(s, &card, &format!("{b}: after a racing report")).await;

        // Retention: raw windows go, the rollups keep every figure.
        let before = load(s, START - HOUR_MS, END + HOUR_MS, RollupGrain::Day)
            .await
            .unwrap();
        let recs_before = recommended(s, &card, START - HOUR_MS, END + HOUR_MS).await;
        // Nothing is deleted from a month still open, however old: its hours may be marked and
        // attributed again (here the first one is).
        store::rollups::mark_dirty_hours(s.db(), &[START])
            .await
            .unwrap();
        let retention = 35 * DAY_MS;
        let open_from = gpuledger_core::time::month_start_ms(START);
        assert_eq!(
            enforce_retention(s, END + retention + DAY_MS, retention, open_from)
                .await
                .unwrap(),
            0,
            "{b}: the month is open"
        );
        run(s, &card, &Default::default(), usize::MAX)
            .await
            .unwrap();
        // In batches of 50 rows: many short statements, all of it gone in the end.
        let deleted = delete_in_batches(s, END + retention + DAY_MS, retention, i64::MAX, 50)
            .await
            .unwrap();
        assert!(deleted > 500, "{b}: deleted {deleted}");
        assert!(
            store::rollups::attribution_windows(s.db(), START - HOUR_MS, END + HOUR_MS)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            store::telemetry::process_windows(s.db(), START - HOUR_MS, END + HOUR_MS)
                .await
                .unwrap()
                .is_empty()
        );
        let after = load(s, START - HOUR_MS, END + HOUR_MS, RollupGrain::Day)
            .await
            .unwrap();
        assert_eq!(
            after.parts, before.parts,
            "{b}: rollups outlive raw windows"
        );
        assert_eq!(
            serde_json::to_value(recommended(s, &card, START - HOUR_MS, END + HOUR_MS).await)
                .unwrap(),
            serde_json::to_value(recs_before).unwrap(),
            "{b}: recommendations outlive raw windows"
        );
    }
}

#[test]
fn runs_are_consecutive_and_bounded() {
    let hours: Vec<i64> = (0..30).chain(40..42).map(|h| h * HOUR_MS).collect();
    let runs = consecutive_runs(&hours);
    assert_eq!(
        runs.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![HOURS_PER_PASS, 30 - HOURS_PER_PASS, 2]
    );
}

#[test]
fn passes_follow_where_the_windows_are() {
    let hours: Vec<i64> = (0..24).map(|h| START + h * HOUR_MS).collect();
    // A day in which 40 hosts of 600 windows each report only in its fourth hour.
    let counts: Vec<(i64, i64, i64)> = (1..=40).map(|host| (hours[3], host, 600)).collect();
    let passes = plan_passes(&hours, &counts, 5_000);
    let heavy: Vec<&Pass> = passes.iter().filter(|p| p.hours == [hours[3]]).collect();
    assert_eq!(heavy.len(), 1, "{passes:?}");
    // 24,000 windows in groups of at most 5,000: 8 hosts a group, 5 groups.
    assert_eq!(heavy[0].host_groups.len(), 5, "{:?}", heavy[0].host_groups);
    let read: Vec<i64> = heavy[0]
        .host_groups
        .iter()
        .flat_map(|g| g.host_ids.clone())
        .collect();
    assert_eq!(read, (1..=40).collect::<Vec<_>>(), "every host read once");
    for g in &heavy[0].host_groups {
        let windows: i64 = counts
            .iter()
            .filter(|(_, host, _)| g.range.contains(*host))
            .map(|(_, _, n)| n)
            .sum();
        assert!(windows <= 5_000, "{g:?} holds {windows}");
    }
    let in_passes: Vec<i64> = passes.iter().flat_map(|p| p.hours.clone()).collect();
    assert_eq!(in_passes, hours, "every hour once, in order");
    assert!(
        passes
            .iter()
            .filter(|p| p.hours != [hours[3]])
            .all(|p| p.host_groups == [HostGroup::ALL]),
        "empty hours need no split: {passes:?}"
    );

    // Evenly filled hours of 1,500 windows: three hours a pass, never more than the budget.
    let even: Vec<(i64, i64, i64)> = hours.iter().map(|&h| (h, 1, 1_500)).collect();
    let passes = plan_passes(&hours, &even, 5_000);
    assert_eq!(passes.len(), 8, "{passes:?}");
    assert!(passes.iter().all(|p| p.hours.len() == 3));
}

/// A closed month stays as it closed: a late bill marks its hours, but the roll-up job leaves
/// them, the marks are counted as changes waiting, and `rebuild` refuses without `--reopen`.
/// With it, the month is restated and the restatement keeps the cost per team before and after
/// and the reason. Raw windows go with retention once the month is closed, and a restatement
/// that would need them is refused.
/// Two hosts alike but for their names running the same owners' work are summed together by
/// [`RollupGrain::HostGroupRange`]; a host of another type, and one of another cluster, stay
/// apart; every figure is the same as summed host by host.
#[tokio::test]
async fn hosts_alike_are_summed_together_with_the_same_figures() {
    for db in test_support::both().await {
        let store = db.open().await;
        let (s, b) = (store.as_ref(), db.backend);
        let token = agent_token(s, "*", START).await;
        let status = AgentStatus::default();
        let mut other_type = report("z-1", "z", "i-zzz", START, 60, "llama");
        other_type.host.instance_type = Some("p5.48xlarge".into());
        let mut other_cluster = report("w-1", "w", "i-www", START, 60, "llama");
        other_cluster.host.cluster = "d".into();
        for r in [
            report("x-1", "x", "i-xxx", START, 60, "llama"),
            report("y-1", "y", "i-yyy", START, 60, "llama"),
            other_type,
            other_cluster,
        ] {
            s.ingest(&r, token, status, START).await.unwrap();
        }
        crate::test_support::roll_up(s).await;
        // A whole day: the hours at a range's ends are read per GPU, as for every grain.
        let day = (DAY0, DAY0 + DAY_MS);
        let grouped = load(s, day.0, day.1, RollupGrain::HostGroupRange)
            .await
            .unwrap();
        let per_host = load(s, day.0, day.1, RollupGrain::HostRange).await.unwrap();
        let hosts = |a: &Attribution| {
            a.parts
                .iter()
                .map(|p| p.host_id)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        };
        assert_eq!(hosts(&per_host), 4, "{b}");
        assert_eq!(hosts(&grouped), 3, "{b}: x and y together");
        assert!(grouped.parts.len() < per_host.parts.len(), "{b}");
        assert_host_groups_match(s, day.0, day.1, b).await;
        assert_host_groups_match(s, START - HOUR_MS, END + HOUR_MS, b).await;
    }
}

#[tokio::test]
async fn a_closed_month_stays_closed_until_restated() {
    let card = RateCard::default_card();
    let close = crate::closing::ClosePolicy::default();
    let month = gpuledger_core::time::month_start_ms(START);
    let next = gpuledger_core::time::next_month_start(month);
    assert!(END < next, "the test's data sits in one month");
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let token = agent_token(s, "c", START).await;
        let status = AgentStatus::default();
        s.ingest(
            &report("a-1", "a", "i-aaa", START, 90, "llama"),
            token,
            status,
            START,
        )
        .await
        .unwrap();
        import_bill(s, "bill-1", "1").await;
        let open_now = END + DAY_MS;
        assert!(!close.is_closed(START, open_now));
        run_open_months(
            s,
            &card,
            &Default::default(),
            usize::MAX,
            close.open_from(open_now),
        )
        .await
        .unwrap();
        let closed_total = attributed_costs(s, month, next).await.unwrap();
        assert!(closed_total["USD"] > Decimal::ZERO, "{b}");

        // The month closes; then its bill is replaced by one twice as large.
        let now = close.closes_at(START) + HOUR_MS;
        import_bill(s, "bill-2", "2").await;
        let done = run_open_months(
            s,
            &card,
            &Default::default(),
            usize::MAX,
            close.open_from(now),
        )
        .await
        .unwrap();
        assert_eq!(done.hours, 0, "{b}: the job leaves a closed month alone");
        assert_eq!(
            attributed_costs(s, month, next).await.unwrap(),
            closed_total,
            "{b}"
        );
        assert!(
            store::rollups::dirty_mark_count(s.db(), month, next)
                .await
                .unwrap()
                > 0,
            "{b}: changes waiting"
        );

        let refused = rebuild(s, &card, &Default::default(), month, next, close, None, now)
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("closed"), "{b}: {refused}");
        let blank = rebuild(
            s,
            &card,
            &Default::default(),
            month,
            next,
            close,
            Some("  "),
            now,
        )
        .await;
        assert!(blank.is_err(), "{b}: a restatement needs a reason");
        assert_eq!(
            attributed_costs(s, month, next).await.unwrap(),
            closed_total,
            "{b}"
        );

        let (_, restated) = rebuild(
            s,
            &card,
            &Default::default(),
            month,
            next,
            close,
            Some("late bill"),
            now,
        )
        .await
        .unwrap();
        assert_eq!(restated.len(), 1, "{b}");
        let listed = store::closing::restatements(s.db(), month).await.unwrap();
        assert_eq!(listed, restated, "{b}");
        assert_eq!(listed[0].reason, "late bill");
        let before: BTreeMap<String, String> =
            serde_json::from_str(&listed[0].before_json).unwrap();
        let after: BTreeMap<String, String> = serde_json::from_str(&listed[0].after_json).unwrap();
        assert_ne!(before, after, "{b}");
        let restated_total = attributed_costs(s, month, next).await.unwrap()["USD"];
        let gpu_hosts: Decimal = after
            .iter()
            .filter(|(k, _)| *k != "(not a GPU host)")
            .map(|(_, v)| v.parse::<Decimal>().unwrap())
            .sum();
        // Each team's figure is rounded to the cent on its own.
        let slack = Decimal::new(after.len() as i64, 2);
        assert!(
            (gpu_hosts - restated_total).abs() <= slack,
            "{b}: after is what the month says now: {gpu_hosts} vs {restated_total}"
        );
        assert_eq!(after["(not a GPU host)"], "7.77", "{b}");
        assert!(restated_total > closed_total["USD"], "{b}");
        assert_eq!(
            store::rollups::dirty_mark_count(s.db(), month, next)
                .await
                .unwrap(),
            0,
            "{b}"
        );

        // Closed, its raw windows may go; restating it again would need them, so it is refused.
        let deleted = enforce_retention(s, now, DAY_MS, close.open_from(now))
            .await
            .unwrap();
        assert!(deleted > 0, "{b}");
        let gone = rebuild(
            s,
            &card,
            &Default::default(),
            month,
            next,
            close,
            Some("again"),
            now,
        )
        .await
        .unwrap_err();
        assert!(gone.to_string().contains("gone"), "{b}: {gone}");
    }
}

/// A bill for a month that closed before gpuledger ever attributed it (a first import of last
/// year's bills) is attributed by the job without `--reopen`, recorded as a restatement from
/// nothing; a month attributed before keeps waiting for one. Past retention, a rebuild of hours
/// the ledger never attributed from windows is not refused: there is nothing to lose.
#[tokio::test]
async fn a_late_bill_for_a_never_attributed_closed_month_is_attributed_once() {
    let card = RateCard::default_card();
    let close = crate::closing::ClosePolicy::default();
    let month = gpuledger_core::time::month_start_ms(START);
    let next = gpuledger_core::time::next_month_start(month);
    let now = close.closes_at(START) + 40 * DAY_MS;
    let open_from = close.open_from(now);
    assert!(next <= open_from, "the bill's month is closed");
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        import_bill(s, "old-bill", "1").await;
        let rules = Rules::default();
        let done = run_open_months(s, &card, &rules, usize::MAX, open_from)
            .await
            .unwrap();
        assert_eq!(done.hours, 0, "{b}: the open-month job leaves it");
        assert!(
            !store::ledger::has_rollups(s.db(), month, next, false)
                .await
                .unwrap(),
            "{b}"
        );

        let first = attribute_new_closed_months(s, &card, &rules, open_from, now)
            .await
            .unwrap();
        assert_eq!(first.len(), 1, "{b}");
        assert_eq!(first[0].month_ms, month, "{b}");
        assert_eq!(first[0].before_json, "{}", "{b}");
        assert_eq!(
            store::closing::restatements(s.db(), month).await.unwrap(),
            first,
            "{b}"
        );
        // No agent reports i-aaa: its two days and the bucket, the whole bill, are in the
        // ledger now, unattributed.
        let ledger = load(s, month, next, RollupGrain::Day).await.unwrap();
        let parts: Decimal = ledger.parts.iter().map(|p| p.cost).sum();
        let unattributed: Decimal = ledger.unattributed.values().sum();
        assert_eq!(
            parts + unattributed,
            Decimal::from_str_exact("1583.893456789012352").unwrap(),
            "{b}"
        );
        assert_eq!(
            store::rollups::dirty_mark_count(s.db(), month, next)
                .await
                .unwrap(),
            0,
            "{b}"
        );

        // Attributed now: a corrected bill waits for a restatement like any closed month's.
        import_bill(s, "old-bill-2", "2").await;
        let again = attribute_new_closed_months(s, &card, &rules, open_from, now)
            .await
            .unwrap();
        assert!(again.is_empty(), "{b}");
        assert!(
            store::rollups::dirty_mark_count(s.db(), month, next)
                .await
                .unwrap()
                > 0,
            "{b}"
        );

        // Retention passed that month long ago, but no GPU hour of it came from windows.
        store::telemetry::set_raw_deleted_before(s.db(), open_from)
            .await
            .unwrap();
        let (_, restated) = rebuild(
            s,
            &card,
            &rules,
            month,
            next,
            close,
            Some("corrected bill"),
            now,
        )
        .await
        .unwrap();
        assert_eq!(restated.len(), 1, "{b}");
        assert_eq!(
            store::rollups::dirty_mark_count(s.db(), month, next)
                .await
                .unwrap(),
            0,
            "{b}"
        );
    }
}

/// A GPU instance the bill charges and no agent reports is attributed on a host known from the
/// bill (unmonitored, to the team its tag names), to the cent. When an agent starts reporting
/// the same instance, each hour attributed again moves whole to the agent's host: every hour on
/// one host, the bill counted once, and after every hour is attributed again, all of it on the
/// agent's host, as attribution from raw data says.
#[tokio::test]
async fn a_gpu_instance_without_agent_is_attributed_until_its_agent_comes() {
    let card = RateCard::default_card();
    let schema: OwnerSchema =
        toml::from_str(r#"team = { from = ["label:team", "tag:team"] }"#).unwrap();
    let rules = Rules {
        owners: schema.clone(),
        ..Rules::default()
    };
    let (from, to) = (DAY0 - DAY_MS, DAY0 + DAY_MS);
    let billed = "340.000000000000001".parse::<Decimal>().unwrap();
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let period = iso(DAY0 - DAY_MS);
        let mut csv = String::from(FOCUS_HEADER);
        for (day, cost) in [(DAY0 - DAY_MS, "240.000000000000001"), (DAY0, "100")] {
            csv.push_str(&format!(
                "\nAWS,1,{period},{},{},Usage,{cost},{cost},{cost},USD,Standard,,EC2,s,\
                 \"{{\"\"InstanceType\"\":\"\"p4d.24xlarge\"\"}}\",i-ghost,us-east-1,\
                 \"{{\"\"team\"\":\"\"vision\"\"}}\"",
                iso(day),
                iso(day + DAY_MS)
            ));
        }
        let lines = crate::billing::focus_file::parse(csv.as_bytes()).unwrap();
        crate::billing::store_lines(s, "focus", "ghost", "sha-ghost".into(), lines, DAY0)
            .await
            .unwrap();
        run(s, &card, &rules, usize::MAX).await.unwrap();

        let hosts = store::telemetry::hosts(s.db()).await.unwrap();
        let ghost = hosts
            .iter()
            .find(|h| h.from_bill)
            .expect("a host from the bill");
        let ledger = load(s, from, to, RollupGrain::Hour).await.unwrap();
        assert_eq!(ledger.parts.len(), 48, "{b}: one part per hour");
        assert!(
            ledger.parts.iter().all(|p| p.host_id == ghost.id
                && p.kind == Kind::Unmonitored
                && p.owner.get("team") == Some("vision")),
            "{b}: {:?}",
            ledger.parts.first()
        );
        let total = |a: &Attribution| a.parts.iter().map(|p| p.cost).sum::<Decimal>();
        assert_eq!(total(&ledger), billed, "{b}");
        assert!(ledger.unattributed.is_empty(), "{b}");

        // The agent comes: two hours of day 0 from host g, on the same instance.
        let token = agent_token(s, "c", DAY0).await;
        let g = report("g-1", "g", "i-ghost", DAY0 + 2 * HOUR_MS, 6, "llama");
        s.ingest(&g, token, AgentStatus::default(), DAY0 + 5 * HOUR_MS)
            .await
            .unwrap();
        run(s, &card, &rules, usize::MAX).await.unwrap();
        let hosts = store::telemetry::hosts(s.db()).await.unwrap();
        let agent = hosts
            .iter()
            .find(|h| !h.from_bill)
            .expect("the agent's host");
        let ledger = load(s, from, to, RollupGrain::Hour).await.unwrap();
        assert_eq!(total(&ledger), billed, "{b}: counted once");
        let mut hosts_of_hour: BTreeMap<i64, std::collections::BTreeSet<i64>> = BTreeMap::new();
        for p in &ledger.parts {
            hosts_of_hour
                .entry(p.hour_ms)
                .or_default()
                .insert(p.host_id);
        }
        assert_eq!(hosts_of_hour.len(), 48, "{b}");
        for (hour, on) in &hosts_of_hour {
            let expected = if (DAY0 + 2 * HOUR_MS..DAY0 + 4 * HOUR_MS).contains(hour) {
                agent.id
            } else {
                ghost.id
            };
            assert_eq!(
                on.iter().collect::<Vec<_>>(),
                [&expected],
                "{b}: hour {hour}"
            );
        }
        assert!(
            ledger
                .parts
                .iter()
                .any(|p| p.host_id == agent.id && p.kind == Kind::Used),
            "{b}: the agent's hours are used"
        );

        // The FOCUS export splits every line-hour of the instance, whichever host holds it.
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let export = tokio::spawn({
            let store = store.clone();
            async move {
                crate::focus_export::write_export(
                    store.as_ref(),
                    from,
                    to,
                    &crate::focus_export::Selection::everything(
                        &gpuledger_core::owners::OwnerSchema::default(),
                    ),
                    crate::focus_export::Format::Csv,
                    &tx,
                )
                .await
            }
        });
        let mut csv = Vec::new();
        while let Some(chunk) = rx.recv().await {
            csv.extend(chunk.unwrap());
        }
        export.await.unwrap().unwrap();
        let mut reader = csv::Reader::from_reader(csv.as_slice());
        let headers = reader.headers().unwrap().clone();
        let col = |n: &str| headers.iter().position(|h| h == n).unwrap();
        let (method, cost) = (col("AllocatedMethodId"), col("EffectiveCost"));
        let (mut split, mut whole) = (Decimal::ZERO, 0);
        for r in reader.records() {
            let r = r.unwrap();
            if r[method].is_empty() {
                whole += 1;
            } else {
                split += r[cost].parse::<Decimal>().unwrap();
            }
        }
        assert_eq!((whole, split), (0, billed), "{b}: every line-hour split");

        // Every hour attributed again: all of it on the agent's host, as from raw data.
        let hours: Vec<i64> = (from..to).step_by(HOUR_MS as usize).collect();
        store::rollups::mark_dirty_hours(s.db(), &hours)
            .await
            .unwrap();
        run(s, &card, &rules, usize::MAX).await.unwrap();
        let ledger = load(s, from, to, RollupGrain::Hour).await.unwrap();
        assert_eq!(total(&ledger), billed, "{b}");
        assert!(ledger.parts.iter().all(|p| p.host_id == agent.id), "{b}");
        let raw = attribution::compute(s, &card, &rules, from, to)
            .await
            .unwrap();
        assert!(
            close(
                &summed(&ledger.parts, RollupGrain::Hour),
                &summed(&raw.parts, RollupGrain::Hour)
            ),
            "{b}: rollups equal raw attribution"
        );
        let r = &crate::reconciliation::for_range(s, &card, &rules, from, to)
            .await
            .unwrap()[0];
        assert!(r.gpu_without_agent.is_empty(), "{b}: {r:?}");
        assert_eq!(r.bill_on_known_hosts, billed, "{b}");
        assert_eq!(r.difference, Decimal::ZERO, "{b}");
    }
}

/// Energy no GPU measured stays unknown through the rollups (not 0 kWh), a key that is only
/// partly measured says how much, and emissions are the measured energy × each host's grid, by
/// its region in the built-in table or its cluster in the config; hourly and daily rollups
/// agree. Both backends.
#[tokio::test]
async fn energy_nobody_measured_is_unknown_and_emissions_follow_each_hosts_grid() {
    use gpuledger_core::allocation::group;
    use gpuledger_core::allocation::totals;
    use gpuledger_core::allocation::GroupBy;
    use gpuledger_core::allocation::Step;
    use gpuledger_core::carbon::GridTable;
    let card = RateCard::default_card();
    let schema = OwnerSchema::default();
    let rules = Rules {
        owners: schema.clone(),
        ..Rules::default()
    };
    let (from, to) = (START, DAY0 + DAY_MS);
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let token = agent_token(s, "c", START).await;
        // Host m in af-south-1 measures 360 kJ a window per GPU; host d (pre-Volta boards) none.
        let mut m = report("m-1", "m", "i-m", START, 12, "measured");
        m.host.region = Some("af-south-1".into());
        let mut d = report("d-1", "d", "i-d", START, 12, "dark");
        for g in d.windows.iter_mut().flat_map(|w| w.gpus.iter_mut()) {
            g.energy_mj = None;
        }
        for r in [&m, &d] {
            s.ingest(r, token, AgentStatus::default(), START)
                .await
                .unwrap();
        }
        run(s, &card, &rules, usize::MAX).await.unwrap();

        let daily = load(s, from, to, RollupGrain::Day).await.unwrap();
        let grid = crate::carbon::grid(&daily, &GridTable::default());
        let hourly = load(s, from, to, RollupGrain::Hour).await.unwrap();
        let rows = |a: &Attribution, by| group(a, by, Step::Month, &grid);
        let models = rows(&daily, GroupBy::MODEL);
        let model = |k: &str| models.iter().find(|r| r.key == k).unwrap().clone();
        let dark = model("dark");
        assert_eq!(dark.energy_kwh, None, "{b}: unknown, not 0: {dark:?}");
        assert_eq!(dark.kg_co2e, None, "{b}");
        assert_eq!(dark.energy_measured_share, Some(0.0), "{b}");
        let measured = model("measured");
        let kwh = measured.energy_kwh.unwrap();
        assert!(kwh > 0.0, "{b}");
        assert!(
            (measured.energy_measured_share.unwrap() - 1.0).abs() < 1e-9,
            "{b}"
        );
        let kg = measured.kg_co2e.unwrap();
        assert!(
            (kg - kwh * 0.9006).abs() < 1e-9 * kg.max(1.0),
            "{b}: {kg} for {kwh} kWh"
        );
        // Each team ran on both hosts: half its GPU time measured, its kWh a floor, and its
        // emissions whole (the dark host's unknown grid carries no measured energy).
        for team in rows(&daily, GroupBy::TEAM)
            .iter()
            .filter(|r| r.key.starts_with("team-"))
        {
            let share = team.energy_measured_share.unwrap();
            assert!((share - 0.5).abs() < 1e-9, "{b}: {team:?}");
            assert!(
                team.energy_kwh.is_some() && team.kg_co2e.is_some(),
                "{b}: {team:?}"
            );
        }
        // The hourly rows say the same.
        for by in [GroupBy::MODEL, GroupBy::TEAM, GroupBy::Host] {
            let (d, h) = (rows(&daily, by), rows(&hourly, by));
            assert_eq!(d.len(), h.len(), "{b}");
            for (d, h) in d.iter().zip(&h) {
                assert_eq!(d.energy_kwh.is_some(), h.energy_kwh.is_some(), "{b}: {d:?}");
                let close = |x: Option<f64>, y: Option<f64>| match (x, y) {
                    (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(1.0),
                    (x, y) => x == y,
                };
                assert!(close(d.energy_kwh, h.energy_kwh), "{b}: {d:?} {h:?}");
                assert!(close(d.kg_co2e, h.kg_co2e), "{b}: {d:?} {h:?}");
                assert!(
                    close(d.energy_measured_share, h.energy_measured_share),
                    "{b}"
                );
            }
        }
        // A cluster's figure beats the region's; with the dark host's cluster named too, the
        // whole fleet has a total.
        let config: GridTable = toml::from_str("[clusters]\nc = 100.0").unwrap();
        let by_cluster = crate::carbon::grid(&daily, &config);
        let t = &totals(&daily, &by_cluster)[0];
        let total_kwh = t.energy_kwh.unwrap();
        assert!(
            (t.kg_co2e.unwrap() - total_kwh * 0.1).abs() < 1e-9 * total_kwh.max(1.0),
            "{b}"
        );
        assert!(t.energy_measured_share.unwrap() < 0.51, "{b}: {t:?}");
        // Energy drawn where no grid is known: no total that leaves it out.
        let no_grid = totals(&daily, &gpuledger_core::carbon::Grid::unknown());
        assert_eq!(no_grid[0].kg_co2e, None, "{b}");
        assert_eq!(no_grid[0].energy_kwh, t.energy_kwh, "{b}");
        // Summed per value and grid by the database, the same figures.
        assert_by_value_matches(s, from, to, b).await;
    }
}

/// The shape per instance type, summed by each database per hour, type and team, holds the
/// hourly ledger's GPU time: per type and per team, and a team's reader sees its own alone.
#[tokio::test]
async fn the_shape_per_type_and_team_is_the_ledgers_gpu_time_on_both_databases() {
    let card = RateCard::default_card();
    let schema = OwnerSchema::default();
    let rules = Rules {
        owners: schema.clone(),
        ..Rules::default()
    };
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let token = agent_token(s, "c", START).await;
        for r in [
            report("a-1", "a", "i-a", START, 12, "m"),
            report("b-1", "b", "i-b", START + 2 * HOUR_MS, 6, "m"),
        ] {
            s.ingest(&r, token, AgentStatus::default(), START)
                .await
                .unwrap();
        }
        run(s, &card, &rules, usize::MAX).await.unwrap();
        let hourly = load(s, START, END, RollupGrain::Hour).await.unwrap();
        let held = |f: &dyn Fn(&Part) -> bool| -> f64 {
            hourly
                .parts
                .iter()
                .filter(|p| f(p))
                .map(|p| p.gpu_seconds)
                .sum::<f64>()
                / 3600.0
        };
        let everyone = gpuledger_core::scope::Scope::all();
        let shapes = crate::shape::for_range(s, &schema, &everyone, (START, END), END)
            .await
            .unwrap();
        assert_eq!(shapes.len(), 1, "{b}: {shapes:?}");
        let p4d = &shapes[0];
        assert_eq!(p4d.instance_type, "p4d.24xlarge");
        assert_eq!(p4d.hours, 30, "{b}");
        let round = |x: f64| (x * 100.0).round() / 100.0;
        assert_eq!(p4d.spread.gpu_hours, round(held(&|_| true)), "{b}");
        // What could run on spot: the GPU time experiments used doing work.
        let experiments_work =
            held(&|p: &Part| p.kind == Kind::Used && p.owner.get("experiment").is_some());
        assert!(experiments_work > 0.0, "{b}");
        assert_eq!(p4d.interruptible_gpu_hours, round(experiments_work), "{b}");
        // Two GPUs from START, four for the two hours both hosts reported, none after.
        assert_eq!((p4d.spread.floor, p4d.spread.peak), (0.0, 4.0), "{b}");
        for o in &p4d.owners {
            let team = o.owner.clone();
            let want = held(&|p: &Part| p.owner.get("team").map(str::to_owned) == team);
            assert_eq!(o.spread.gpu_hours, round(want), "{b}: {team:?}");
        }
        assert!(p4d.owners.len() >= 2, "{b}: {:?}", p4d.owners);
        let team0 = gpuledger_core::scope::Scope::teams(["team-0"]).unwrap();
        let scoped = crate::shape::for_range(s, &schema, &team0, (START, END), END)
            .await
            .unwrap();
        let owners: Vec<Option<&str>> = scoped[0]
            .owners
            .iter()
            .map(|o| o.owner.as_deref())
            .collect();
        assert_eq!(owners, [Some("team-0")], "{b}");
    }
}

/// Scale-to-zero reads each owner's hours summed by the database per hour, kind, currency and
/// team: the same cost, to the atto-dollar, and GPU time as the hourly ledger's parts summed.
#[tokio::test]
async fn owner_hours_are_the_ledgers_parts_summed_on_both_databases() {
    let card = RateCard::default_card();
    let schema = OwnerSchema::default();
    let rules = Rules {
        owners: schema.clone(),
        ..Rules::default()
    };
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let token = agent_token(s, "c", START).await;
        for r in [
            report("a-1", "a", "i-a", START, 12, "m"),
            report("b-1", "b", "i-b", START + 2 * HOUR_MS, 6, "n"),
        ] {
            s.ingest(&r, token, AgentStatus::default(), START)
                .await
                .unwrap();
        }
        run(s, &card, &rules, usize::MAX).await.unwrap();
        let hourly = load(s, START, END, RollupGrain::Hour).await.unwrap();
        type Key = (i64, String, Option<String>, Kind, String);
        let mut want: BTreeMap<Key, (Decimal, f64)> = BTreeMap::new();
        for p in &hourly.parts {
            let Some(experiment) = p.owner.get("experiment") else {
                continue;
            };
            let team = p.owner.get("team").map(str::to_owned);
            let e = want
                .entry((
                    p.hour_ms,
                    experiment.to_owned(),
                    team,
                    p.kind,
                    p.currency.clone(),
                ))
                .or_default();
            e.0 += p.cost;
            e.1 += p.gpu_seconds;
        }
        let rows = store::ledger::owner_hours(s.db(), START, END, "experiment", "team")
            .await
            .unwrap();
        assert_eq!(rows.len(), want.len(), "{b}");
        let kinds: std::collections::BTreeSet<Kind> = rows.iter().map(|(_, h)| h.kind).collect();
        assert!(
            kinds.contains(&Kind::Used) && kinds.contains(&Kind::HeldIdle),
            "{b}"
        );
        for (team, h) in &rows {
            let key = (
                h.hour_ms,
                h.key.clone(),
                team.clone(),
                h.kind,
                h.currency.clone(),
            );
            let (cost, seconds) = want.get(&key).unwrap_or_else(|| panic!("{b}: {key:?}"));
            assert_eq!(&h.cost, cost, "{b}: {key:?}");
            assert!((h.gpu_seconds - seconds).abs() < 1e-6, "{b}: {key:?}");
        }
        // Owners without a value in the dimension are left out, not summed under "": of the
        // endpoint's, only the GPU time of processes the agent could not see.
        let endpoints = store::ledger::owner_hours(s.db(), START, END, "endpoint", "team")
            .await
            .unwrap();
        assert!(
            endpoints
                .iter()
                .all(|(_, h)| h.key == gpuledger_core::owners::UNSEEN_OWNER),
            "{b}: {endpoints:?}"
        );
    }
}

/// Unused commitment dollars charged to the covered owners come out the same however the
/// roll-up divides its work: an hour a host at a time (the plan's usage on one host, its unused
/// row with the other group) gives each host the share attribution from raw data gives, and
/// the month reconciles with the shares counted on the hosts.
#[tokio::test]
async fn unused_shares_follow_usage_across_host_groups() {
    let card = RateCard::default_card();
    let rules = Rules {
        unused_commitments: gpuledger_core::commitment::UnusedCharge::CoveredOwners,
        ..Rules::default()
    };
    let sp = "arn:aws:savingsplans::1:savingsplan/sp-groups";
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let s = store.as_ref();
        let token = agent_token(s, "c?*", START).await;
        for (batch, host, instance) in [("g-a", "a", "i-aaa"), ("g-b", "b", "i-bbb")] {
            let r = report(batch, host, instance, START, 12, "llama");
            s.ingest(&r, token, AgentStatus::default(), START)
                .await
                .unwrap();
        }
        let (period, from, to) = (iso(DAY0 - DAY_MS), iso(START), iso(START + HOUR_MS));
        let header = "ProviderName,BillingAccountId,BillingPeriodStart,ChargePeriodStart,ChargePeriodEnd,ChargeCategory,BilledCost,EffectiveCost,ListCost,BillingCurrency,PricingCategory,CommitmentDiscountId,CommitmentDiscountStatus,ResourceId";
        let csv = format!(
            "{header}\n\
             AWS,1,{period},{from},{to},Usage,0,0.60,0.90,USD,Committed,{sp},Used,i-aaa\n\
             AWS,1,{period},{from},{to},Usage,0,0.20,0.30,USD,Committed,{sp},Used,i-bbb\n\
             AWS,1,{period},{from},{to},Usage,0,0.40,0.40,USD,Committed,{sp},Unused,{sp}\n"
        );
        let lines = crate::billing::focus_file::parse(csv.as_bytes()).unwrap();
        crate::billing::store_lines(s, "focus", "plan", "sha-plan".into(), lines, DAY0)
            .await
            .unwrap();
        // Passes of ~5 windows: one host a group.
        run_in_passes(s, &card, &rules, usize::MAX, 5, (i64::MIN, i64::MAX))
            .await
            .unwrap();
        let (f, t) = (START, START + HOUR_MS);
        let per_host = |a: &Attribution| {
            let mut m: BTreeMap<i64, Decimal> = BTreeMap::new();
            for p in &a.parts {
                *m.entry(p.host_id).or_default() += p.cost;
            }
            m
        };
        let rolled = load(s, f, t, RollupGrain::Hour).await.unwrap();
        let raw = attribution::compute(s, &card, &rules, f, t).await.unwrap();
        assert_eq!(per_host(&rolled), per_host(&raw), "{b}");
        let costs: Vec<Decimal> = per_host(&rolled).into_values().collect();
        let d = |t: &str| Decimal::from_str_exact(t).unwrap();
        assert_eq!(costs, [d("0.90"), d("0.30")], "{b}: 3:1");
        assert!(rolled.unattributed.values().all(|u| u.is_zero()), "{b}");
        let r = crate::reconciliation::for_range(s, &card, &rules, f, t)
            .await
            .unwrap();
        assert_eq!(r[0].unused_commitments_on_owners, d("0.40"), "{b}");
        assert_eq!(r[0].difference, Decimal::ZERO, "{b}: {:?}", r[0]);
    }
}
