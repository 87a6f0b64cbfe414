//! The hourly ledger as it is read: attributed parts for any range, whole days from the daily
//! rollups and the hours at either end from the hourly ones, so a page reads a few rows per GPU
//! and owner instead of every raw window. Written by `rollup`; read here by pages, the API,
//! CSVs, recommendations and Slack alike.

use std::collections::{BTreeMap, HashMap};

use crate::allocation::{key_of, GroupBy};
use crate::attribution::{Attribution, Kind, Owner, Part};
use crate::store;
use crate::store::{RollupGrain, RollupRow, Store, StoreError};
use gpuledger_core::anomaly::DaySpend;
use gpuledger_core::money::from_nano_atto;
use gpuledger_core::time::{day_floor, hour_floor, DAY_MS};

/// Owners read back from their text, each distinct one once.
#[derive(Default)]
pub(crate) struct OwnerTexts(HashMap<String, Owner>);

impl OwnerTexts {
    fn owner(&mut self, text: String) -> Owner {
        if let Some(o) = self.0.get(&text) {
            return o.clone();
        }
        let o = Owner::from_key(&text);
        self.0.insert(text, o.clone());
        o
    }
}

pub(crate) fn part_of(r: RollupRow, owners: &mut OwnerTexts) -> Part {
    let opt = |v: String| (!v.is_empty()).then_some(v);
    Part {
        hour_ms: r.period_ms,
        host_id: r.host_id,
        kind: Kind::parse(&r.kind).unwrap_or(Kind::Unmonitored),
        gpu_uuid: opt(r.gpu_uuid),
        owner: owners.owner(r.owner),
        pricing_category: r.pricing_category,
        currency: r.currency,
        cost: from_nano_atto(r.cost_nano, r.cost_atto),
        estimated: r.estimated != 0,
        gpu_seconds: r.gpu_seconds,
        util_gpu_seconds: r.util_gpu_seconds,
        util_known_seconds: r.util_known_seconds,
        energy_j: r.energy_j,
        energy_known_seconds: r.energy_known_seconds,
    }
}

/// The attribution of `[from_ms, to_ms)` as rolled up. With [`RollupGrain::Day`], whole days
/// come from the daily rollup (each part stands for its day, `hour_ms` is the day's start) and
/// the hours at either end from the hourly one ([`RollupGrain::HostDay`] likewise, its day parts
/// summed over each host's GPUs and naming none; [`RollupGrain::HostRange`] with the whole days
/// summed into one part per host and owner, standing for the first whole day); with [`RollupGrain::Hour`], every part is an
/// hour (and with [`RollupGrain::OwnerHour`], every hour of one dimension's owners' work).
pub async fn load(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    grain: RollupGrain,
) -> Result<Attribution, StoreError> {
    let (from, to) = (hour_floor(from_ms), to_ms);
    let mut rows = Vec::new();
    let daily = grain.is_daily();
    if let (true, Some((first_whole_day, last_whole_day))) = (daily, day_split(from, to)) {
        rows.extend(
            store::ledger::rollup_rows(store.db(), RollupGrain::Hour, from, first_whole_day)
                .await?,
        );
        rows.extend(
            store::ledger::rollup_rows(store.db(), grain, first_whole_day, last_whole_day).await?,
        );
        rows.extend(
            store::ledger::rollup_rows(store.db(), RollupGrain::Hour, last_whole_day, to).await?,
        );
    } else {
        // No whole day in range: hours (an owner's hours stay its hours).
        let hourly = if daily { RollupGrain::Hour } else { grain };
        rows = store::ledger::rollup_rows(store.db(), hourly, from, to).await?;
    }
    let mut owners = OwnerTexts::default();
    let mut parts: Vec<Part> = rows.into_iter().map(|r| part_of(r, &mut owners)).collect();
    // A stable order, whatever the database returns: by time, host, GPU.
    parts.sort_by(|a, b| {
        (a.hour_ms, a.host_id, &a.gpu_uuid).cmp(&(b.hour_ms, b.host_id, &b.gpu_uuid))
    });
    let unattributed = store::ledger::rollup_unattributed(store.db(), from, to)
        .await?
        .into_iter()
        .map(|u| (u.currency, from_nano_atto(u.cost_nano, u.cost_atto)))
        .filter(|(_, amount)| !amount.is_zero())
        .collect();
    let hosts: HashMap<i64, _> = store::telemetry::hosts(store.db())
        .await?
        .into_iter()
        .map(|h| (h.id, h))
        .collect();
    Ok(Attribution {
        parts,
        unattributed,
        // Readers want the range's total; the per-hour split is only written, never read back.
        unattributed_hours: BTreeMap::new(),
        hosts,
    })
}

/// Cost and GPU time of `[from_ms, to_ms)` per day and value of `dimension` (`None`: per day
/// alone), summed by the database over hosts and GPUs: parts that name no host or GPU, whose
/// owner holds the dimension's value alone (nothing where the owner has none), each standing
/// for its day (`hour_ms` is the day's start), and whose utilization and energy are left at
/// zero. Whole days from the days summed per host, the days at either end from the hours summed
/// per host. What a daily series of a dimension's owners reads (the review's chart, anomalies)
/// in a few rows a day and value, where [`RollupGrain::HostDay`] holds one per host and owner.
pub async fn days_by(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    dimension: Option<&str>,
) -> Result<Attribution, StoreError> {
    let name = dimension.unwrap_or("");
    let mut rows = Vec::new();
    for (grain, a, b) in spans(from_ms, to_ms) {
        let grain = if grain.is_daily() {
            RollupGrain::HostDay
        } else {
            grain
        };
        rows.extend(store::ledger::dimension_days(store.db(), grain, a, b, name).await?);
    }
    let mut owners: HashMap<Option<String>, Owner> = HashMap::new();
    let parts = rows
        .into_iter()
        .map(|r| Part {
            hour_ms: r.day_ms,
            host_id: 0,
            kind: Kind::parse(&r.kind).unwrap_or(Kind::Unmonitored),
            gpu_uuid: None,
            owner: owners
                .entry(r.value)
                .or_insert_with_key(|value| match value {
                    Some(v) => [(name, v.as_str())].into_iter().collect(),
                    None => Owner::default(),
                })
                .clone(),
            pricing_category: r.pricing_category,
            currency: r.currency,
            cost: from_nano_atto(r.cost_nano, r.cost_atto),
            estimated: r.estimated != 0,
            gpu_seconds: r.gpu_seconds,
            util_gpu_seconds: 0.0,
            util_known_seconds: 0.0,
            energy_j: 0.0,
            energy_known_seconds: 0.0,
        })
        .collect();
    Ok(Attribution {
        parts,
        unattributed: BTreeMap::new(),
        unattributed_hours: BTreeMap::new(),
        hosts: HashMap::new(),
    })
}

/// Spend per day of `[from, until)` for each key of each of `dimensions`, in each currency.
pub type DailySpend = BTreeMap<(GroupBy, String, String), BTreeMap<i64, DaySpend>>;

/// Each dimension's spend per key and day of `[from, until)` (what anomalies and budgets judge):
/// an owner dimension's (or the price's) summed per day and value by the database, a dimension
/// of the host (cluster, type) from the days summed per host.
pub async fn daily_spend(
    store: &dyn Store,
    dimensions: &[GroupBy],
    from: i64,
    until: i64,
) -> Result<DailySpend, StoreError> {
    let mut daily = DailySpend::new();
    let mut per_host: Option<Attribution> = None;
    for by in dimensions {
        let summed;
        let ledger = match *by {
            GroupBy::Owner(name) => {
                summed = days_by(store, from, until, Some(name)).await?;
                &summed
            }
            GroupBy::PricingCategory => {
                summed = days_by(store, from, until, None).await?;
                &summed
            }
            _ => {
                if per_host.is_none() {
                    per_host = Some(load(store, from, until, RollupGrain::HostDay).await?);
                }
                match &per_host {
                    Some(l) => l,
                    None => continue,
                }
            }
        };
        for p in &ledger.parts {
            let day = daily
                .entry((*by, key_of(p, *by, ledger), p.currency.clone()))
                .or_default()
                .entry(day_floor(p.hour_ms))
                .or_default();
            day.cost += p.cost;
            day.gpu_seconds += p.gpu_seconds;
            day.estimated |= p.estimated;
        }
    }
    Ok(daily)
}

/// The `limit` costliest GPUs in the whole days of `[from_ms, to_ms)`, costliest first, and how
/// many GPUs there are in all (what a utilization heatmap shows, with [`gpu_days`]): a ranking
/// of every GPU-day of the range, which a closed month's review keeps.
pub async fn top_gpus(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    limit: usize,
) -> Result<(Vec<String>, usize), StoreError> {
    let (top, count) =
        store::ledger::rollup_top_gpus(store.db(), from_ms, to_ms, limit as i64).await?;
    Ok((top, usize::try_from(count).unwrap_or(0)))
}

/// The daily rows of these GPUs in the whole days of `[from_ms, to_ms)`.
pub async fn gpu_days(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    gpus: &[String],
) -> Result<Vec<Part>, StoreError> {
    let rows = store::ledger::rollup_gpu_days(store.db(), from_ms, to_ms, gpus).await?;
    let mut owners = OwnerTexts::default();
    Ok(rows.into_iter().map(|r| part_of(r, &mut owners)).collect())
}

/// `[from_ms, to_ms)` as the rollups hold it: whole days from the daily rows, the hours at
/// either end from the hourly ones (empty spans left out).
pub(crate) fn spans(from_ms: i64, to_ms: i64) -> Vec<(RollupGrain, i64, i64)> {
    let (from, to) = (hour_floor(from_ms), to_ms);
    let spans = match day_split(from, to) {
        Some((first, last)) => vec![
            (RollupGrain::Hour, from, first),
            (RollupGrain::Day, first, last),
            (RollupGrain::Hour, last, to),
        ],
        None => vec![(RollupGrain::Hour, from, to)],
    };
    spans.into_iter().filter(|(_, a, b)| a < b).collect()
}

/// Splits `[from, to)` (`from` on an hour) into the hours before its first whole day, its whole
/// days, and the hours after them; `None` for the days when there is no whole day.
fn day_split(from: i64, to: i64) -> Option<(i64, i64)> {
    let first_day = from.div_euclid(DAY_MS) * DAY_MS;
    let first_whole_day = if first_day == from {
        from
    } else {
        first_day + DAY_MS
    };
    let last_whole_day = to.div_euclid(DAY_MS) * DAY_MS;
    (first_whole_day < last_whole_day).then_some((first_whole_day, last_whole_day))
}

/// Attributed cost per currency in `[from_ms, to_ms)`, summed by the database (what a page that
/// shows only a total needs, without loading rows).
pub async fn attributed_costs(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<BTreeMap<String, rust_decimal::Decimal>, StoreError> {
    let mut sums = Vec::new();
    for (grain, a, b) in spans(from_ms, to_ms) {
        sums.extend(store::ledger::rollup_costs(store.db(), grain, a, b).await?);
    }
    let mut costs: BTreeMap<String, rust_decimal::Decimal> = BTreeMap::new();
    for s in sums {
        *costs.entry(s.currency).or_default() += from_nano_atto(s.cost_nano, s.cost_atto);
    }
    Ok(costs)
}

/// When each experiment label had GPU work in the whole days of `[from_ms, to_ms)`: first and
/// last active hour and the number of active hours (summed over days, which never share an hour).
pub async fn experiment_hours(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<HashMap<String, crate::unit_costs::RunHours>, StoreError> {
    let mut runs: HashMap<String, crate::unit_costs::RunHours> = HashMap::new();
    for d in store::ledger::rollup_experiment_days(store.db(), from_ms, to_ms).await? {
        let r = runs
            .entry(d.experiment)
            .or_insert(crate::unit_costs::RunHours {
                first_hour_ms: d.first_hour_ms,
                last_hour_ms: d.last_hour_ms,
                hours: 0,
            });
        r.first_hour_ms = r.first_hour_ms.min(d.first_hour_ms);
        r.last_hour_ms = r.last_hour_ms.max(d.last_hour_ms);
        r.hours += d.hours;
    }
    Ok(runs)
}
