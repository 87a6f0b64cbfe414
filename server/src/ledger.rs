//! The hourly ledger as it is read: attributed parts for any range, whole days from the daily
//! rollups and the hours at either end from the hourly ones, so a page reads a few rows per GPU
//! and owner instead of every raw window. Written by `rollup`; read here by pages, the API,
//! CSVs, recommendations and Slack alike.

use std::collections::{BTreeMap, HashMap};

use gpuledger_core::allocation::key_of;
use gpuledger_core::allocation::GroupBy;

use crate::store;
use crate::store::{RollupGrain, RollupRow, Store, StoreError};
use gpuledger_core::anomaly::DaySpend;
use gpuledger_core::attribution::Attribution;
use gpuledger_core::attribution::Kind;
use gpuledger_core::attribution::Owner;
use gpuledger_core::attribution::Part;
use gpuledger_core::money::from_nano_atto;
use gpuledger_core::time::{day_floor, hour_floor, month_start_ms, next_month_start, DAY_MS};

/// Which part of a read may be kept as first read ([`crate::sections`]): what lies before
/// `closed_before_ms`, the start of today (the roll-up rewrites today's hours every minute).
/// A roll-up that rewrites an hour of a kept day (late data, a restatement) retires what was
/// kept. A read whose kept part `grows` (the same stretch of the month before as the month so
/// far) replaces the day before's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    pub closed_before_ms: i64,
    pub now_ms: i64,
    pub grows: bool,
}

impl Keep {
    /// Nothing kept: every read live.
    pub const NOTHING: Keep = Keep {
        closed_before_ms: i64::MIN,
        now_ms: 0,
        grows: false,
    };

    /// What lies before `closed_before_ms`, at `now_ms`.
    pub fn before(closed_before_ms: i64, now_ms: i64) -> Keep {
        Keep {
            closed_before_ms,
            now_ms,
            grows: false,
        }
    }

    /// The days before today, at `now_ms`: what pages and the API keep.
    pub fn past_days(now_ms: i64) -> Keep {
        Keep::before(day_floor(now_ms), now_ms)
    }

    /// The same, for a range whose end moves on each day.
    pub fn growing(self) -> Keep {
        Keep {
            grows: true,
            ..self
        }
    }

    /// `[a, b)` split at the boundary: the kept part, then the live one (either may be empty).
    fn split(self, a: i64, b: i64) -> [(bool, i64, i64); 2] {
        let at = self.closed_before_ms.clamp(a, b);
        [(true, a, at), (false, at, b)]
    }
}

/// `read`'s rows of `[a, b)`: those of its kept part kept as `section` for `key`, the rest
/// read live. A kept part that ends at today's start (the range reaches today) grows with the
/// days.
async fn kept_or_live<T, F, R>(
    store: &dyn Store,
    keep: Keep,
    (section, key): (&str, &str),
    (a, b): (i64, i64),
    read: R,
) -> Result<Vec<T>, StoreError>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq,
    F: std::future::Future<Output = Result<Vec<T>, StoreError>>,
    R: Fn(i64, i64) -> F,
{
    let mut rows = Vec::new();
    for (kept, a, b_part) in keep.split(a, b) {
        if a >= b_part {
            continue;
        }
        rows.extend(if kept {
            let span = crate::sections::Span {
                from_ms: a,
                to_ms: b_part,
                // A range reaching into the day under way grows; one ending where it begins
                // (a month read on the day after it ended) is whole.
                grows: keep.grows || b > keep.closed_before_ms,
            };
            crate::sections::kept(store, (section, key), span, keep.now_ms, read(a, b_part)).await?
        } else {
            read(a, b_part).await?
        });
    }
    Ok(rows)
}

/// [`kept_or_live`] keeping whole calendar months only, each on its own: whatever range a
/// client asks for reuses the months kept and leaves no section of its own behind; the part
/// months at either end are read live.
async fn kept_months_or_live<T, F, R>(
    store: &dyn Store,
    keep: Keep,
    (section, key): (&str, &str),
    (a, b): (i64, i64),
    read: R,
) -> Result<Vec<T>, StoreError>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq,
    F: std::future::Future<Output = Result<Vec<T>, StoreError>>,
    R: Fn(i64, i64) -> F,
{
    let mut rows = Vec::new();
    let mut at = a;
    while at < b {
        let next = next_month_start(at);
        let end = next.min(b);
        rows.extend(if month_start_ms(at) == at && end == next {
            kept_or_live(store, keep, (section, key), (at, end), &read).await?
        } else {
            read(at, end).await?
        });
        at = end;
    }
    Ok(rows)
}

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

/// Owners that hold one dimension's value alone (no value: the owner of nothing), each distinct
/// one made once: the owners of rows summed per value.
struct ValueOwners<'d> {
    dimension: &'d str,
    made: HashMap<Option<String>, Owner>,
}

impl<'d> ValueOwners<'d> {
    fn of(dimension: &'d str) -> Self {
        ValueOwners {
            dimension,
            made: HashMap::new(),
        }
    }

    fn holding(&mut self, value: Option<String>) -> Owner {
        let dimension = self.dimension;
        self.made
            .entry(value)
            .or_insert_with_key(|value| match value {
                Some(v) => [(dimension, v.as_str())].into_iter().collect(),
                None => Owner::default(),
            })
            .clone()
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
/// summed into one part per host and owner, standing for the first whole day, and
/// [`RollupGrain::HostGroupRange`] into one per group of hosts alike and owner); with
/// [`RollupGrain::Hour`], every part is an hour (and with [`RollupGrain::OwnerHour`], every hour
/// of one dimension's owners' work).
pub async fn load(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    grain: RollupGrain,
) -> Result<Attribution, StoreError> {
    load_kept(store, from_ms, to_ms, grain, Keep::NOTHING).await
}

/// [`load`], with the whole days of [`RollupGrain::HostRange`] (and
/// [`RollupGrain::HostGroupRange`]) that `keep` says are past read as kept after the first read:
/// they change only when the roll-up rewrites one of those days, and summing their host-days
/// again on every view would give the same rows slower.
pub async fn load_kept(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    grain: RollupGrain,
    keep: Keep,
) -> Result<Attribution, StoreError> {
    let (from, to) = (hour_floor(from_ms), to_ms);
    let mut rows = Vec::new();
    let daily = grain.is_daily();
    if let (true, Some((first_whole_day, last_whole_day))) = (daily, day_split(from, to)) {
        rows.extend(
            store::ledger::rollup_rows(store.db(), RollupGrain::Hour, from, first_whole_day)
                .await?,
        );
        let whole_days = |a, b| store::ledger::rollup_rows(store.db(), grain, a, b);
        let range = (first_whole_day, last_whole_day);
        rows.extend(match grain {
            RollupGrain::HostRange => {
                kept_or_live(store, keep, ("ledger-host-range", "all"), range, whole_days).await?
            }
            RollupGrain::HostGroupRange => {
                kept_or_live(
                    store,
                    keep,
                    ("ledger-host-groups", "all"),
                    range,
                    whole_days,
                )
                .await?
            }
            _ => whole_days(range.0, range.1).await?,
        });
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
    let unattributed = unattributed(store, from, to).await?;
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

/// The cost of `[from_ms, to_ms)` no GPU took, per currency.
async fn unattributed(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<BTreeMap<String, rust_decimal::Decimal>, StoreError> {
    Ok(
        store::ledger::rollup_unattributed(store.db(), hour_floor(from_ms), to_ms)
            .await?
            .into_iter()
            .map(|u| (u.currency, from_nano_atto(u.cost_nano, u.cost_atto)))
            .filter(|(_, amount)| !amount.is_zero())
            .collect(),
    )
}

/// Cost and GPU time of `[from_ms, to_ms)` per day and value of `dimension` (`None`: per day
/// alone), summed by the database over hosts and GPUs: parts that name no host or GPU, whose
/// owner holds the dimension's value alone (nothing where the owner has none), each standing
/// for its day (`hour_ms` is the day's start), and whose utilization and energy are left at
/// zero. Whole days from the days summed per host, the days at either end from the hours summed
/// per host. What a daily series of a dimension's owners reads (the review's chart, anomalies)
/// in a few rows a day and value, where [`RollupGrain::HostDay`] holds one per host and owner;
/// the whole days `keep` says are closed kept after the first read.
pub async fn days_by(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    dimension: Option<&str>,
    keep: Keep,
) -> Result<Attribution, StoreError> {
    let name = dimension.unwrap_or("");
    let mut rows = Vec::new();
    for (grain, a, b) in spans(from_ms, to_ms) {
        if grain.is_daily() {
            // Whole days: what `keep` says is closed read as kept after the first read.
            let days =
                |a, b| store::ledger::dimension_days(store.db(), RollupGrain::HostDay, a, b, name);
            rows.extend(kept_or_live(store, keep, ("ledger-days-by", name), (a, b), days).await?);
        } else {
            rows.extend(store::ledger::dimension_days(store.db(), grain, a, b, name).await?);
        }
    }
    // One order whatever the rows came from (the database, or kept): sums over them agree to
    // the bit.
    rows.sort_by(|a, b| {
        (
            a.day_ms,
            &a.value,
            &a.kind,
            &a.pricing_category,
            &a.currency,
            a.estimated,
        )
            .cmp(&(
                b.day_ms,
                &b.value,
                &b.kind,
                &b.pricing_category,
                &b.currency,
                b.estimated,
            ))
    });
    let mut owners = ValueOwners::of(name);
    let parts = rows
        .into_iter()
        .map(|r| Part {
            hour_ms: r.day_ms,
            host_id: 0,
            kind: Kind::parse(&r.kind).unwrap_or(Kind::Unmonitored),
            gpu_uuid: None,
            owner: owners.holding(r.value),
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

/// The attribution of `[from_ms, to_ms)` summed by the database per day, value of `dimension`
/// and the cluster and region of the hosts it ran on: parts that name no GPU, whose owner holds
/// the dimension's value alone (nothing where the owner has none), each standing for its day,
/// and whose `host_id` stands for the hosts of one cluster and region (in `hosts` with that
/// cluster and region, and no name: whose grid the energy was drawn on). What allocation by an
/// owner dimension per day or month needs, in rows per day and value rather than per host and
/// owner; not what needs a host, a GPU or another dimension. The whole months `keep` says are
/// closed are kept after the first read.
pub async fn load_by_value(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    dimension: &'static str,
    keep: Keep,
) -> Result<Attribution, StoreError> {
    let mut rows = Vec::new();
    for (grain, a, b) in spans(from_ms, to_ms) {
        if grain.is_daily() {
            let days =
                |a, b| store::ledger::value_days(store.db(), RollupGrain::HostDay, a, b, dimension);
            rows.extend(
                kept_months_or_live(store, keep, ("ledger-by-value", dimension), (a, b), days)
                    .await?,
            );
        } else {
            rows.extend(store::ledger::value_days(store.db(), grain, a, b, dimension).await?);
        }
    }
    // One order whatever the database returns: sums over the parts agree run to run.
    rows.sort_by(|a, b| {
        let (ka, kb) = (
            (a.day_ms, &a.value, &a.cluster, &a.region, &a.kind),
            (b.day_ms, &b.value, &b.cluster, &b.region, &b.kind),
        );
        (ka, &a.pricing_category, &a.currency, a.estimated).cmp(&(
            kb,
            &b.pricing_category,
            &b.currency,
            b.estimated,
        ))
    });
    let mut grids: BTreeMap<(String, Option<String>), i64> = BTreeMap::new();
    let mut owners = ValueOwners::of(dimension);
    let mut parts = Vec::with_capacity(rows.len());
    for r in rows {
        // A host no longer known stays unknown (id 0 is no host's).
        let host_id = match r.cluster {
            Some(cluster) => {
                let next = grids.len() as i64 + 1;
                *grids.entry((cluster, r.region)).or_insert(next)
            }
            None => 0,
        };
        parts.push(Part {
            hour_ms: r.day_ms,
            host_id,
            kind: Kind::parse(&r.kind).unwrap_or(Kind::Unmonitored),
            gpu_uuid: None,
            owner: owners.holding(r.value),
            pricing_category: r.pricing_category,
            currency: r.currency,
            cost: from_nano_atto(r.cost_nano, r.cost_atto),
            estimated: r.estimated != 0,
            gpu_seconds: r.gpu_seconds,
            util_gpu_seconds: r.util_gpu_seconds,
            util_known_seconds: r.util_known_seconds,
            energy_j: r.energy_j,
            energy_known_seconds: r.energy_known_seconds,
        });
    }
    let hosts = grids
        .into_iter()
        .map(|((cluster, region), id)| {
            let host = gpuledger_core::telemetry::HostRow {
                id,
                from_bill: cluster == gpuledger_core::telemetry::BILLED_ONLY_CLUSTER,
                cluster,
                hostname: String::new(),
                provider: None,
                instance_id: None,
                instance_key: None,
                instance_type: None,
                lifecycle: None,
                region,
            };
            (id, host)
        })
        .collect();
    Ok(Attribution {
        parts,
        unattributed: unattributed(store, from_ms, to_ms).await?,
        unattributed_hours: BTreeMap::new(),
        hosts,
    })
}

/// Spend per day of `[from, until)` for each key of each of `dimensions`, in each currency.
pub type DailySpend = BTreeMap<(GroupBy, String, String), BTreeMap<i64, DaySpend>>;

/// Each dimension's spend per key and day of `[from, until)` (what anomalies and budgets judge):
/// an owner dimension's (or the price's) summed per day and value by the database, a dimension
/// of the host (cluster, type) from the days summed per host. The former's closed days, as
/// `keep` says, are kept after the first read.
pub async fn daily_spend(
    store: &dyn Store,
    dimensions: &[GroupBy],
    (from, until): (i64, i64),
    keep: Keep,
) -> Result<DailySpend, StoreError> {
    let mut daily = DailySpend::new();
    let mut per_host: Option<Attribution> = None;
    for by in dimensions {
        let summed;
        let ledger = match *by {
            GroupBy::Owner(name) => {
                summed = days_by(store, from, until, Some(name), keep).await?;
                &summed
            }
            GroupBy::PricingCategory => {
                summed = days_by(store, from, until, None, keep).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support;
    use gpuledger_core::time::{DAY_MS, HOUR_MS};

    /// 2026-10-01 00:00 UTC.
    const OCTOBER: i64 = 1_790_812_800_000;
    const NOVEMBER: i64 = OCTOBER + 31 * DAY_MS;

    /// 2027-01-01 00:00 UTC: a month no wall clock has closed yet, so its hours roll up.
    const JANUARY: i64 = 1_798_761_600_000;
    const FEBRUARY: i64 = JANUARY + 31 * DAY_MS;

    /// A quarter hour of one GPU of host `h-1` at 50%, from `region`.
    async fn report(store: &dyn Store, region: &str, at: i64) {
        let gpu = gpuledger_proto::GpuWindow {
            uuid: "GPU-kept-0".into(),
            index: 0,
            name: "NVIDIA A100-SXM4-40GB".into(),
            memory_total_bytes: Some(40 << 30),
            memory_used_max_bytes: Some(1 << 30),
            util_avg: Some(50.0),
            util_max: Some(50.0),
            ..Default::default()
        };
        let report = gpuledger_proto::Report {
            batch_id: format!("kept-{at}"),
            agent_version: "test".into(),
            host: gpuledger_proto::HostInfo {
                hostname: "h-1".into(),
                cluster: "c-1".into(),
                instance_type: Some("p4d.24xlarge".into()),
                region: Some(region.into()),
                ..Default::default()
            },
            windows: vec![gpuledger_proto::Window {
                serving: Vec::new(),
                start_ms: at,
                end_ms: at + 15 * 60_000,
                samples: 900,
                gpus: vec![gpu],
            }],
        };
        store
            .ingest(&report, 1, store::AgentStatus::default(), at)
            .await
            .unwrap();
    }

    /// A host's attributes are read as they are now, kept or not: a month kept before its host
    /// reported from another region reads the new region, as a fresh computation does.
    #[tokio::test]
    async fn a_kept_month_follows_a_hosts_new_region() {
        for db in test_support::both().await {
            let store = db.open().await;
            let (s, b) = (store.as_ref(), db.backend);
            store::tokens::create_token(
                s.db(),
                &crate::store::tokens::NewToken::for_cluster("agent", "h", "c-*"),
                JANUARY,
            )
            .await
            .unwrap();
            report(s, "us-east-1", JANUARY + 10 * DAY_MS).await;
            test_support::roll_up(s).await;
            let now = FEBRUARY + 2 * DAY_MS;
            let read = |keep| load_by_value(s, JANUARY, FEBRUARY, "team", keep);
            let regions = |a: &Attribution| -> Vec<Option<String>> {
                a.hosts.values().map(|h| h.region.clone()).collect()
            };
            let first = read(Keep::past_days(now)).await.unwrap();
            assert_eq!(regions(&first), [Some("us-east-1".to_owned())], "{b}");
            // Today, the host reports from another region; January's hours are not rewritten.
            report(s, "eu-west-1", now).await;
            let fresh = read(Keep::NOTHING).await.unwrap();
            assert_eq!(regions(&fresh), [Some("eu-west-1".to_owned())], "{b}");
            let kept = read(Keep::past_days(now)).await.unwrap();
            assert_eq!(
                regions(&kept),
                regions(&fresh),
                "{b}: the kept month froze the region"
            );
        }
    }

    /// October read in the first hour of November is kept as a whole month, not as a range
    /// under way: the next day's month-so-far from the same start (October 1 to now) does not
    /// replace it, and it is served as kept.
    #[tokio::test]
    async fn a_month_kept_on_the_day_after_it_ended_is_whole() {
        for db in test_support::both().await {
            let store = db.open().await;
            let (s, b) = (store.as_ref(), db.backend);
            let read = |answer: u32| {
                move |_: i64, _: i64| async move { Ok::<_, StoreError>(vec![answer]) }
            };
            let key = ("test-range", "all");
            let on_the_first = Keep::past_days(NOVEMBER + HOUR_MS);
            let october = kept_or_live(s, on_the_first, key, (OCTOBER, NOVEMBER), read(1)).await;
            assert_eq!(october.unwrap(), [1], "{b}");
            // A day on: October 1 to now, its kept part growing to November 2.
            let a_day_on = NOVEMBER + DAY_MS + HOUR_MS;
            let so_far = kept_or_live(
                s,
                Keep::past_days(a_day_on),
                key,
                (OCTOBER, a_day_on),
                read(2),
            )
            .await;
            assert_eq!(so_far.unwrap(), [2, 2], "{b}: kept part and today");
            let stored = store::sections::stored_section(s.db(), key, (OCTOBER, NOVEMBER)).await;
            assert!(stored.unwrap().is_some(), "{b}: October replaced");
            let again = kept_or_live(
                s,
                Keep::past_days(a_day_on),
                key,
                (OCTOBER, NOVEMBER),
                read(3),
            )
            .await;
            assert_eq!(again.unwrap(), [1], "{b}: October served as kept");
        }
    }
}
