//! Rollups: attribution computed once per hour as data arrives, kept per hour and per day, so
//! pages and the allocation API read a few rows per GPU and owner instead of every raw window.
//!
//! Ingest and billing imports mark the hours they change (in their own transactions); the
//! roll-up job attributes each marked hour again from raw windows and bills and replaces its
//! rows, and the day's rows with them, in one transaction. Late windows and late or replaced
//! bills simply mark their hours again; a repeated batch is not stored, so it marks nothing.
//! Raw windows older than the retention are deleted in small batches, never before their hour
//! has been rolled up.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;

use crate::attribution;
use crate::store;
use crate::store::rollups::DirtyMark;
use crate::store::rollups::UnattributedRow;
use crate::store::rollups::UsageRow;
use crate::store::{RollupGrain, RollupRow, Store, StoreError};
use gpuledger_core::activity::util_band;
use gpuledger_core::attribution::Part;
use gpuledger_core::attribution::Rules;
use gpuledger_core::bill::StoredCostLine;
use gpuledger_core::commitment::charge_unused;
use gpuledger_core::money::to_nano_atto;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::telemetry::AttributionWindow;
use gpuledger_core::telemetry::HostRow;
use gpuledger_core::telemetry::StoredProcessWindow;
use gpuledger_core::time::{hour_floor, HOUR_MS};
use passes::{consecutive_runs, split_by_windows, HostGroup, HostRange};

/// Consecutive hours attributed in one pass: one load of raw data, bounded memory.
const HOURS_PER_PASS: usize = 24;

/// Raw GPU windows attributed in one pass (their process windows come with them): about 100 MB
/// with a process in every window, however long agents' windows are and however large the fleet.
const WINDOWS_PER_PASS: i64 = 100_000;

/// Marks read per round.
const MARKS_PER_ROUND: i64 = 5_000;

/// Raw rows deleted per statement: short transactions that never hold ingest up for long.
pub const RETENTION_BATCH: i64 = 5_000;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RollupSummary {
    pub hours: usize,
    pub rows: usize,
}

/// Attributes every marked hour again, oldest first, until none is left or `max_hours` are done,
/// closed months included: for the demo's seed and tests. The server's job and `rollup` leave
/// closed months alone ([`run_open_months`], [`rebuild`]).
pub async fn run(
    store: &dyn Store,
    card: &RateCard,
    rules: &Rules,
    max_hours: usize,
) -> Result<RollupSummary, StoreError> {
    run_in_passes(
        store,
        card,
        rules,
        max_hours,
        WINDOWS_PER_PASS,
        (i64::MIN, i64::MAX),
    )
    .await
}

/// What the periodic job does: [`run`] for the hours from `open_from_ms` on only, the months
/// still open. A closed month's marks stay as they are, shown on its review as changes waiting
/// for a restatement.
pub async fn run_open_months(
    store: &dyn Store,
    card: &RateCard,
    rules: &Rules,
    max_hours: usize,
    open_from_ms: i64,
) -> Result<RollupSummary, StoreError> {
    run_in_passes(
        store,
        card,
        rules,
        max_hours,
        WINDOWS_PER_PASS,
        (open_from_ms, i64::MAX),
    )
    .await
}

async fn run_in_passes(
    store: &dyn Store,
    card: &RateCard,
    rules: &Rules,
    max_hours: usize,
    windows_per_pass: i64,
    (from_ms, to_ms): (i64, i64),
) -> Result<RollupSummary, StoreError> {
    let mut summary = RollupSummary::default();
    // Shared with the threads that attribute each group of hosts.
    let shared = Arc::new((card.clone(), rules.clone()));
    while summary.hours < max_hours {
        let marks =
            store::rollups::dirty_marks_in(store.db(), from_ms, to_ms, MARKS_PER_ROUND).await?;
        if marks.is_empty() {
            break;
        }
        let mut by_hour: BTreeMap<i64, Vec<DirtyMark>> = BTreeMap::new();
        for m in marks {
            by_hour.entry(m.hour_ms).or_default().push(m);
        }
        let hours: Vec<i64> = by_hour.keys().copied().collect();
        'runs: for run in consecutive_runs(&hours) {
            for pass in split_by_windows(store, &run, windows_per_pass).await? {
                let (from, to) = (pass.hours[0], pass.hours[pass.hours.len() - 1] + HOUR_MS);
                let lines = store::bills::cost_lines(store.db(), from, to).await?;
                let hosts = hosts_for(store, card, &lines).await?;
                // Before the lines are divided among host groups: an unused part charged to
                // the covered owners follows usage that may be in any group.
                let mut lines = charge_unused(lines, rules.unused_commitments, from, to);
                // The hours after the bill's last line are estimated at what it last charged.
                lines.extend(attribution::last_billed(store, &hosts, from).await?);
                let host_of = gpuledger_core::attribution::hosts_by_instance_key(&hosts);
                let (mut rows, mut unattributed, mut usage) = (Vec::new(), Vec::new(), Vec::new());
                let mut add = |(r, u, us): Attributed| {
                    rows.extend(r);
                    unattributed.extend(u);
                    usage.extend(us);
                };
                // Each group is read while the one before is attributed on a blocking thread:
                // reading (the database, and decoding its rows) and attributing take about the
                // same CPU, so with two cores the pass takes little more than the larger. At most
                // two groups' raw data is held at once.
                let mut attributing: Option<tokio::task::JoinHandle<Attributed>> = None;
                for group in &pass.host_groups {
                    let inputs =
                        read_group(store, &hosts, &host_of, &lines, group, (from, to)).await?;
                    if let Some(done) = attributing.take() {
                        add(joined(done.await)?);
                    }
                    let shared = Arc::clone(&shared);
                    attributing = Some(tokio::task::spawn_blocking(move || {
                        attribute_read(&shared.0, &shared.1, inputs, (from, to))
                    }));
                }
                if let Some(done) = attributing {
                    add(joined(done.await)?);
                }
                let marks: Vec<DirtyMark> = pass
                    .hours
                    .iter()
                    .flat_map(|h| by_hour.remove(h).unwrap_or_default())
                    .collect();
                let written = Written {
                    rows: &rows,
                    unattributed: &unattributed,
                    usage: &usage,
                };
                write(store, &marks, written, rules.owners.role(Role::Experiment)).await?;
                summary.hours += pass.hours.len();
                summary.rows += rows.len();
                if summary.hours >= max_hours {
                    break 'runs;
                }
            }
        }
    }
    Ok(summary)
}

/// What a roll-up pass writes for its marks' hours.
pub struct Written<'a> {
    pub rows: &'a [store::RollupRow],
    pub unattributed: &'a [crate::store::rollups::UnattributedRow],
    pub usage: &'a [crate::store::rollups::UsageRow],
}

/// Writes a pass's rollups for the marks' hours and retires what was kept from the days they
/// rewrite (kept review sections, recommendation snapshots), in one transaction: a kept copy
/// never outlives the rows it was computed from. `experiment`: the dimension training runs are
/// read from.
pub async fn write(
    store: &dyn Store,
    marks: &[DirtyMark],
    written: Written<'_>,
    experiment: Option<&str>,
) -> Result<(), StoreError> {
    let days = store::rollups::days_of_marks(marks);
    let mut tx = store.db().begin().await?;
    store::rollups::replace_rollups(
        &mut tx,
        marks,
        written.rows,
        written.unattributed,
        written.usage,
        experiment,
    )
    .await?;
    store::sections::retire_days(&mut tx, &days).await?;
    tx.commit().await
}

/// An attribution run on a blocking thread, or why it did not finish.
fn joined(result: Result<Attributed, tokio::task::JoinError>) -> Result<Attributed, StoreError> {
    result.map_err(|e| StoreError::Invalid(format!("attributing a group of hosts failed: {e}")))
}

/// Every host, with one known from the bill alone added for each GPU instance `lines` charge that
/// no host has yet ([`crate::billing::gpu_instances::without_host`]).
async fn hosts_for(
    store: &dyn Store,
    card: &RateCard,
    lines: &[StoredCostLine],
) -> Result<Vec<HostRow>, StoreError> {
    let hosts = store::telemetry::hosts(store.db()).await?;
    let missing = crate::billing::gpu_instances::without_host(lines, &hosts, card);
    if missing.is_empty() {
        return Ok(hosts);
    }
    store::telemetry::add_billed_hosts(store.db(), &missing).await?;
    store::telemetry::hosts(store.db()).await
}

/// What attributing `[from, to)` for the hosts of one group reads, owned so that it can be
/// attributed on another thread.
struct GroupInputs {
    hosts: Vec<HostRow>,
    windows: Vec<AttributionWindow>,
    processes: Vec<StoredProcessWindow>,
    lines: Vec<StoredCostLine>,
}

/// Rollup rows, unattributed cost and usage rows of a group of hosts.
type Attributed = (Vec<RollupRow>, Vec<UnattributedRow>, Vec<UsageRow>);

/// The raw data of `[from, to)` (whole hours) for the hosts in `group`, with the group's bill
/// lines and hosts. Bill lines that match no host go with the group that starts the id range
/// (counted as unattributed there).
async fn read_group(
    store: &dyn Store,
    hosts: &[HostRow],
    host_of: &HashMap<&str, i64>,
    lines: &[StoredCostLine],
    group: &HostGroup,
    (from, to): (i64, i64),
) -> Result<GroupInputs, StoreError> {
    if group.range == HostRange::ALL {
        return Ok(GroupInputs {
            hosts: hosts.to_vec(),
            windows: store::rollups::attribution_windows(store.db(), from, to).await?,
            processes: store::telemetry::process_windows(store.db(), from, to).await?,
            lines: lines.to_vec(),
        });
    }
    let (windows, processes) =
        store::rollups::attribution_inputs_of_hosts(store.db(), from, to, &group.host_ids).await?;
    let lines = lines
        .iter()
        .filter(
            |l| match l.resource_key.as_deref().and_then(|k| host_of.get(k)) {
                Some(&host_id) => group.range.contains(host_id),
                None => group.range.first == i64::MIN,
            },
        )
        .cloned()
        .collect();
    // Only the group's hosts: a large fleet's hour is hundreds of groups, and copying every
    // host for each was a cost that grew with the square of the fleet.
    let hosts = hosts
        .iter()
        .filter(|h| group.range.contains(h.id))
        .cloned()
        .collect();
    Ok(GroupInputs {
        hosts,
        windows,
        processes,
        lines,
    })
}

/// Rollup rows, unattributed cost and usage of `[from, to)` from the raw data read for it.
fn attribute_read(
    card: &RateCard,
    rules: &Rules,
    inputs: GroupInputs,
    (from, to): (i64, i64),
) -> Attributed {
    let GroupInputs {
        hosts,
        windows,
        processes,
        lines,
    } = inputs;
    let usage = usage_rows(&windows, &processes, &rules.owners);
    let a = gpuledger_core::attribution::attribute_by(
        hosts,
        &windows,
        &processes,
        &lines,
        card,
        &rules.busy,
        &rules.owners,
        from,
        to,
    );
    let rows = a.parts.iter().map(row_of).collect();
    let unattributed = a
        .unattributed_hours
        .into_iter()
        .map(|((hour_ms, currency), amount)| {
            let (cost_nano, cost_atto) = to_nano_atto(amount);
            UnattributedRow {
                hour_ms,
                currency,
                cost_nano,
                cost_atto,
            }
        })
        .collect();
    (rows, unattributed, usage)
}

fn row_of(p: &Part) -> RollupRow {
    let (cost_nano, cost_atto) = to_nano_atto(p.cost);
    RollupRow {
        period_ms: p.hour_ms,
        host_id: p.host_id,
        gpu_uuid: p.gpu_uuid.clone().unwrap_or_default(),
        owner: p.owner.key(),
        kind: p.kind.as_str().to_owned(),
        pricing_category: p.pricing_category.clone(),
        currency: p.currency.clone(),
        estimated: i64::from(p.estimated),
        cost_nano,
        cost_atto,
        gpu_seconds: p.gpu_seconds,
        util_gpu_seconds: p.util_gpu_seconds,
        util_known_seconds: p.util_known_seconds,
        energy_j: p.energy_j,
        energy_known_seconds: p.energy_known_seconds,
    }
}

/// Per hour, GPU and endpoint or model (the values of the dimensions with those roles, from the
/// process's labels): GPU windows per utilization band and the largest GPU memory one of its
/// processes held (what the roll-up keeps for right-sizing). A window counts once per value
/// however many of its processes carry it.
pub(crate) fn usage_rows(
    windows: &[AttributionWindow],
    processes: &[StoredProcessWindow],
    owners: &OwnerSchema,
) -> Vec<UsageRow> {
    use foldhash::{HashMap as FastMap, HashMapExt};
    let window_of: FastMap<(&str, i64), &AttributionWindow> = windows
        .iter()
        .map(|w| ((w.gpu_uuid.as_str(), w.start_ms), w))
        .collect();
    // Per distinct label set, its endpoint and model (read from labels only, not from a
    // cluster or a bill tag), shared rather than copied into every key.
    let mut labelled: FastMap<&str, [Option<Rc<str>>; 2]> = FastMap::new();
    type Key<'a> = (i64, i64, &'a str, &'static str, Rc<str>, i64);
    let mut counted: FastMap<Key, (BTreeSet<i64>, i64)> = FastMap::new();
    for p in processes {
        let Some(w) = window_of.get(&(p.gpu_uuid.as_str(), p.start_ms)) else {
            continue;
        };
        let values = labelled.entry(p.labels_json.as_str()).or_insert_with(|| {
            let labels: BTreeMap<String, String> =
                serde_json::from_str(&p.labels_json).unwrap_or_default();
            let owner = owners.owner_of(&labels, "");
            [Role::Endpoint, Role::Model].map(|role| owners.value(&owner, role).map(Rc::from))
        });
        let band = w.util_avg.map_or(-1, util_band);
        let hour = gpuledger_core::time::hour_floor(w.start_ms);
        for (role, value) in [Role::Endpoint, Role::Model].iter().zip(values.iter()) {
            let Some(value) = value else {
                continue;
            };
            let e = counted
                .entry((
                    hour,
                    w.host_id,
                    w.gpu_uuid.as_str(),
                    role.as_str(),
                    Rc::clone(value),
                    band,
                ))
                .or_default();
            e.0.insert(w.start_ms);
            e.1 = e.1.max(p.memory_used_max_bytes.unwrap_or(0));
        }
    }
    let mut counted: Vec<_> = counted.into_iter().collect();
    counted.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    counted
        .into_iter()
        .map(
            |((period_ms, host_id, gpu, by, key, util_band), (starts, peak))| UsageRow {
                period_ms,
                host_id,
                gpu_uuid: gpu.to_owned(),
                owner_by: by.to_owned(),
                owner_key: key.to_string(),
                util_band,
                windows: starts.len() as i64,
                peak_memory_bytes: peak,
            },
        )
        .collect()
}

/// Why a range was not attributed again.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// Closed months without `--reopen`, or raw data that is gone: the message says what to do.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Attributed cost per team of `[from_ms, to_ms)`, with the unattributed lines, as JSON of
/// decimal strings: what a restatement keeps of before and after. Amounts are in the month's
/// main currency; another currency's are keyed `team (CUR)` and written `amount CUR`, never
/// added to them.
async fn team_totals(
    store: &dyn Store,
    owners: &OwnerSchema,
    from_ms: i64,
    to_ms: i64,
) -> Result<String, StoreError> {
    let a = crate::ledger::load(store, from_ms, to_ms, RollupGrain::Day).await?;
    let main = gpuledger_core::allocation::main_currency(&a);
    let mut totals: BTreeMap<(String, String), rust_decimal::Decimal> = BTreeMap::new();
    for row in gpuledger_core::allocation::group(
        &a,
        gpuledger_core::allocation::GroupBy::role(owners, Role::Team)
            .unwrap_or(gpuledger_core::allocation::GroupBy::TEAM),
        gpuledger_core::allocation::Step::Month,
        // Costs only: emissions do not enter the check.
        &gpuledger_core::carbon::Grid::unknown(),
    ) {
        *totals.entry((row.key, row.currency)).or_default() += row.cost;
    }
    for (currency, cost) in &a.unattributed {
        *totals
            .entry(("(not a GPU host)".to_owned(), currency.clone()))
            .or_default() += *cost;
    }
    let as_text: BTreeMap<String, String> = totals
        .into_iter()
        .map(|((team, currency), v)| {
            let v = v.round_dp(2);
            if currency == main {
                (team, v.to_string())
            } else {
                (format!("{team} ({currency})"), format!("{v} {currency}"))
            }
        })
        .collect();
    Ok(serde_json::to_string(&as_text).unwrap_or_else(|_| "{}".to_owned()))
}

/// Attributes the hours of `[from_ms, to_ms)` again (a rate-card change, a rebuild). A month that
/// has closed is restated only with `reopen` (a reason, kept with the restatement) and only while
/// its raw windows are all still there: attributing hours whose windows are gone would move
/// their cost to "(unmonitored)". Each closed month restated is recorded with its cost per team
/// before and after. Returns what was rolled up and the restatements recorded.
#[allow(clippy::too_many_arguments)]
pub async fn rebuild(
    store: &dyn Store,
    card: &RateCard,
    rules: &Rules,
    from_ms: i64,
    to_ms: i64,
    close: crate::closing::ClosePolicy,
    reopen: Option<&str>,
    now_ms: i64,
) -> Result<(RollupSummary, Vec<crate::store::closing::RestatementRow>), RebuildError> {
    let close = close.current(store).await?;
    let mut closed = Vec::new();
    let mut month = gpuledger_core::time::month_start_ms(from_ms);
    while month < to_ms {
        if close.is_closed(month, now_ms) {
            closed.push(month);
        }
        month = gpuledger_core::time::next_month_start(month);
    }
    let label = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map_or_else(String::new, |d| d.format("%Y-%m").to_string())
    };
    let reason = match (closed.is_empty(), reopen.map(str::trim)) {
        (true, _) => None,
        (false, Some(reason)) if !reason.is_empty() => Some(reason.to_owned()),
        (false, _) => {
            let months: Vec<String> = closed.iter().map(|m| label(*m)).collect();
            return Err(RebuildError::Refused(format!(
                "{} closed: its figures are final. To restate them, add --reopen \"why\" (the \
                 reason is kept with the figures before and after, and shown on the review)",
                months.join(", ")
            )));
        }
    };
    if let Some(deleted_before) = store::telemetry::raw_deleted_before(store.db()).await? {
        // Only hours the ledger attributed from windows would lose anything: hours it never
        // did (a bill imported for a month no agent reported) are safe to attribute.
        if from_ms < deleted_before
            && store::ledger::has_rollups(
                store.db(),
                hour_floor(from_ms),
                to_ms.min(deleted_before),
                true,
            )
            .await?
        {
            let at = gpuledger_core::time::rfc3339(deleted_before);
            return Err(RebuildError::Refused(format!(
                "raw windows before {at} are gone (retention): attributing those hours again \
                 would move their cost to \"(unmonitored)\". Rebuild from {at} on, or keep raw \
                 windows longer (--retention)"
            )));
        }
    }
    let mut before = Vec::new();
    for m in &closed {
        before.push(
            team_totals(
                store,
                &rules.owners,
                *m,
                gpuledger_core::time::next_month_start(*m),
            )
            .await?,
        );
    }
    let hours: Vec<i64> = (hour_floor(from_ms)..to_ms)
        .step_by(HOUR_MS as usize)
        .collect();
    store::rollups::mark_dirty_hours(store.db(), &hours).await?;
    // The range, and no other closed month's waiting changes.
    let mut summary = run_in_passes(
        store,
        card,
        rules,
        usize::MAX,
        WINDOWS_PER_PASS,
        (hour_floor(from_ms), to_ms),
    )
    .await?;
    let open = run_open_months(store, card, rules, usize::MAX, close.open_from(now_ms)).await?;
    summary.hours += open.hours;
    summary.rows += open.rows;
    let mut restated = Vec::new();
    if let Some(reason) = reason {
        for (m, before_json) in closed.iter().zip(before) {
            let row = crate::store::closing::RestatementRow {
                month_ms: *m,
                created_ms: now_ms,
                reason: reason.clone(),
                before_json,
                after_json: team_totals(
                    store,
                    &rules.owners,
                    *m,
                    gpuledger_core::time::next_month_start(*m),
                )
                .await?,
            };
            store::closing::add_restatement(store.db(), &row).await?;
            restated.push(row);
        }
    }
    Ok((summary, restated))
}

/// Attributes closed months that the ledger has never held anything for, where hours wait: a
/// bill for a past month imported after it closed (a first import of last year's bills, say).
/// Nothing anybody saw changes, so no `--reopen` is needed; each is recorded as a restatement
/// from nothing, so its review says when its figures appeared and why. Returns those records.
pub async fn attribute_new_closed_months(
    store: &dyn Store,
    card: &RateCard,
    rules: &Rules,
    open_from_ms: i64,
    now_ms: i64,
) -> Result<Vec<crate::store::closing::RestatementRow>, StoreError> {
    let mut recorded = Vec::new();
    let mut from = i64::MIN;
    loop {
        let Some(mark) = store::rollups::dirty_marks_in(store.db(), from, open_from_ms, 1)
            .await?
            .into_iter()
            .next()
        else {
            break;
        };
        let month = gpuledger_core::time::month_start_ms(mark.hour_ms);
        let next = gpuledger_core::time::next_month_start(month).min(open_from_ms);
        from = next;
        if store::ledger::has_rollups(store.db(), month, next, false).await? {
            continue; // attributed before: its changes wait for a restatement
        }
        run_in_passes(
            store,
            card,
            rules,
            usize::MAX,
            WINDOWS_PER_PASS,
            (month, next),
        )
        .await?;
        let after_json = team_totals(store, &rules.owners, month, next).await?;
        if after_json == "{}" {
            continue; // the marks held nothing to attribute
        }
        let row = crate::store::closing::RestatementRow {
            month_ms: month,
            created_ms: now_ms,
            reason: "first attributed after the month closed: its bill arrived late".to_owned(),
            before_json: "{}".to_owned(),
            after_json,
        };
        store::closing::add_restatement(store.db(), &row).await?;
        recorded.push(row);
    }
    Ok(recorded)
}

/// Deletes raw windows of the UTC days before the one `now_ms - retention_ms` falls in, but none
/// of a month still open (from `open_from_ms`): its hours may be attributed again, and every hour
/// waiting to be rolled up is in one. On PostgreSQL whole days go at once (their partitions are
/// dropped); the rest goes batch by batch. Returns how many rows the batches deleted.
pub async fn enforce_retention(
    store: &dyn Store,
    now_ms: i64,
    retention_ms: i64,
    open_from_ms: i64,
) -> Result<u64, StoreError> {
    delete_in_batches(store, now_ms, retention_ms, open_from_ms, RETENTION_BATCH).await
}

async fn delete_in_batches(
    store: &dyn Store,
    now_ms: i64,
    retention_ms: i64,
    open_from_ms: i64,
    batch: i64,
) -> Result<u64, StoreError> {
    // Every hour still to be rolled up is in an open month (closed months' marks wait for a
    // restatement), so keeping open months keeps them too. Whole UTC days: PostgreSQL then drops
    // a day's partition once past, instead of deleting it an hour at a time (up to a day more
    // is kept; ingest refuses windows past retention anyway).
    let cutoff = (now_ms - retention_ms)
        .min(open_from_ms)
        .div_euclid(gpuledger_core::time::DAY_MS)
        * gpuledger_core::time::DAY_MS;
    // Recorded first: should a batch fail, the hours may have lost windows already.
    store::telemetry::set_raw_deleted_before(store.db(), cutoff).await?;
    // PostgreSQL drops the days wholly before the cutoff at once; the rest goes in batches.
    let dropped = store::partitions::drop_before(store.db(), cutoff).await?;
    if !dropped.partitions.is_empty() {
        tracing::info!(partitions = ?dropped.partitions, "raw-window partitions past retention dropped");
    }
    if !dropped.left_for_later.is_empty() {
        tracing::warn!(partitions = ?dropped.left_for_later, "raw-window partitions not dropped: a lock was not had in time; the next run tries again");
    }
    let mut deleted = 0;
    loop {
        let n = store::telemetry::delete_raw_before(store.db(), cutoff, batch).await?;
        deleted += n;
        if n == 0 {
            return Ok(deleted);
        }
        // Let other work in between batches.
        tokio::task::yield_now().await;
    }
}

mod passes;

#[cfg(test)]
mod tests;
