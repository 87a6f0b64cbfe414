//! Turning idle findings into incidents with dollars, and into Slack messages.
//!
//! Every minute (one replica at a time) [`evaluate`] compares what is idle now with the open
//! incidents: a new finding opens an incident and says so once; a continuing one updates its
//! dollars and is brought up again at the reminder cadence; an incident no longer found is
//! resolved and says so once. Messages go to the Slack outbox, which a separate sender drains,
//! so a slow or failing webhook never holds anything else up.

use gpuledger_core::owners::{OwnerSchema, Role};
use std::collections::{BTreeMap, HashMap, HashSet};

use rust_decimal::Decimal;

use crate::billing::current_price::{self, GpuPrice};
use crate::config::Config;
use crate::slack;
use crate::store;
use crate::store::alerts::IncidentRow;
use crate::store::alerts::IncidentUpdate;
use crate::store::{Store, StoreError};
use gpuledger_core::money::to_text;
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::telemetry::AttributionWindow;
use gpuledger_core::telemetry::HostRow;
use gpuledger_core::time::HOUR_MS;
use gpuledger_core::waste::{self, Finding, IdleDevice};

/// How far back a new incident's start is looked for: the raw windows kept by default.
const RUN_HISTORY_MS: i64 = 35 * 24 * HOUR_MS;

/// When a new finding's idle run really began. The evaluation reads a short look-back, so a
/// cluster idle all month would otherwise start "26 minutes ago": the finding's hosts are read
/// further back (2, 4, 8… days, up to [`RUN_HISTORY_MS`]) while the run still reaches back to
/// the start of what was read. A run that reaches the oldest raw window (the look-back's end,
/// or the retention's edge where windows were deleted sooner) is read on in the ledger: neither
/// edge is ever shown as when it began.
async fn idle_run_start(
    store: &dyn Store,
    hosts: &[HostRow],
    f: &Finding,
    config: &Config,
    read_from: i64,
    now_ms: i64,
) -> Result<i64, StoreError> {
    let mine: Vec<HostRow> = hosts
        .iter()
        .filter(|h| f.host_ids.contains(&h.id))
        .cloned()
        .collect();
    // Raw windows before `edge` were deleted by the retention job.
    let edge = store::telemetry::raw_deleted_before(store.db())
        .await?
        .unwrap_or(i64::MIN);
    let exhausted = |from: i64| now_ms - from >= RUN_HISTORY_MS || from <= edge;
    let (mut since, mut from, mut span) = (f.since_ms, read_from.max(edge), 2 * 24 * HOUR_MS);
    // The run began inside what was read: nothing earlier to look for.
    while since <= from + waste::MAX_GAP_MS && !exhausted(from) {
        from = (now_ms - span).max(edge);
        let (windows, processes) = store::rollups::attribution_inputs_of_hosts(
            store.db(),
            from - crate::validate::MAX_WINDOW_MS,
            now_ms + 1,
            &f.host_ids,
        )
        .await?;
        let windows: Vec<AttributionWindow> =
            windows.into_iter().filter(|w| w.end_ms > from).collect();
        let Some(longer) = waste::find(&mine, &windows, &processes, &config.idle, now_ms)
            .into_iter()
            .find(|x| x.key == f.key)
        else {
            break;
        };
        since = since.min(longer.since_ms);
        span = (span * 2).min(RUN_HISTORY_MS);
    }
    // Still idle at the edge of the raw windows kept: the ledger says how long before.
    if since <= from + waste::MAX_GAP_MS && exhausted(from) {
        since = ledger_run_start(store, f, since).await?;
    }
    Ok(since)
}

/// How far back the ledger keeps an idle run's hours, at most.
const LEDGER_RUN_HISTORY_MS: i64 = 400 * 24 * HOUR_MS;

/// Where a run still idle at `since` began, by the ledger: back hour by hour while every host
/// of the finding carried idle or held-idle cost (for held-idle GPUs: on one of those GPUs).
/// The raw windows go after their retention; the hourly ledger stays, so a notebook held idle
/// since the 1st says so rather than "since" the retention's edge.
async fn ledger_run_start(store: &dyn Store, f: &Finding, since: i64) -> Result<i64, StoreError> {
    let first = since - since.rem_euclid(HOUR_MS);
    let mut hour = first;
    let mut span = 7 * 24 * HOUR_MS;
    let oldest = hour - LEDGER_RUN_HISTORY_MS;
    loop {
        let from = (hour - span).max(oldest);
        let rows = store::idle::idle_hours_of_hosts(store.db(), &f.host_ids, from, hour).await?;
        let mut idle: HashMap<i64, HashSet<i64>> = HashMap::new();
        for (host, at, gpus) in rows {
            let carried: Vec<String> = serde_json::from_str(&gpus)
                .map_err(|e| StoreError::Invalid(format!("idle hours' GPUs {gpus:?}: {e}")))?;
            let held = f.kind != waste::IncidentKind::HeldIdle
                || f.gpus.iter().any(|g| carried.contains(g));
            if held {
                idle.entry(at).or_default().insert(host);
            }
        }
        let all_idle = |at: i64| {
            idle.get(&at)
                .is_some_and(|hosts| f.host_ids.iter().all(|h| hosts.contains(h)))
        };
        while hour > from && all_idle(hour - HOUR_MS) {
            hour -= HOUR_MS;
        }
        if hour > from || from <= oldest {
            return Ok(if hour < first { hour } else { since });
        }
        span *= 2;
    }
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct EvaluationSummary {
    pub opened: usize,
    pub resolved: usize,
    pub reminders: usize,
    pub open: usize,
}

/// What a finding costs per hour, in which currency, and whether it is estimated. Hosts priced
/// in another currency than most of the finding's (a cluster spanning two billing accounts)
/// are left out: amounts in two currencies never add.
fn price(f: &Finding, hourly: &HashMap<i64, GpuPrice>) -> (Decimal, String, bool) {
    let gpus_per_host = f.gpu_equivalents / f.host_ids.len().max(1) as f64;
    let share = Decimal::from_f64_retain(gpus_per_host).unwrap_or(Decimal::ONE);
    let prices: Vec<&GpuPrice> = f.host_ids.iter().filter_map(|h| hourly.get(h)).collect();
    let currency = gpuledger_core::money::main_currency(
        prices.iter().map(|p| (p.currency.as_str(), p.per_gpu_hour)),
    );
    let mut total = Decimal::ZERO;
    let mut estimated = false;
    for p in prices.into_iter().filter(|p| p.currency == currency) {
        total += p.per_gpu_hour * share;
        estimated |= p.estimated;
    }
    (total.round_dp(6), currency, estimated)
}

/// A finding's GPUs as people name them, each with the processes holding it idle.
fn devices(f: &Finding, named: &HashMap<String, (String, Option<i64>)>) -> Vec<IdleDevice> {
    f.gpus
        .iter()
        .map(|uuid| {
            let (host, index) = named
                .get(uuid)
                .cloned()
                .unwrap_or_else(|| (f.hostname.clone().unwrap_or_default(), None));
            IdleDevice {
                host,
                uuid: uuid.clone(),
                index,
                processes: f
                    .processes
                    .iter()
                    .filter(|p| &p.gpu_uuid == uuid)
                    .cloned()
                    .collect(),
                fault: f.faults.get(uuid).cloned(),
            }
        })
        .collect()
}

/// Dollars burned so far: the hourly cost over the time idle.
pub fn wasted(cost_per_hour: Decimal, since_ms: i64, until_ms: i64) -> Decimal {
    (cost_per_hour * Decimal::from((until_ms - since_ms).max(0)) / Decimal::from(HOUR_MS))
        .round_dp(6)
}

/// What the ledger knows of an incident's hours, read once per evaluation.
pub struct Ledger {
    /// Idle and held-idle hourly rows of the hosts involved.
    rows: Vec<crate::store::RollupRow>,
    /// Host-hours waiting to be rolled up (host 0: every host of that hour).
    waiting: HashSet<(i64, i64)>,
    /// Each MIG instance's physical GPU: idle findings name physical GPUs, the ledger leaves.
    parent_of: HashMap<String, String>,
}

impl Ledger {
    /// The ledger's rows and waiting marks for `host_ids` over `[from_ms, to_ms)`.
    pub async fn read(
        store: &dyn Store,
        host_ids: &[i64],
        from_ms: i64,
        to_ms: i64,
        parent_of: HashMap<String, String>,
    ) -> Result<Ledger, StoreError> {
        let from = gpuledger_core::time::hour_floor(from_ms);
        let rows = store::idle::idle_rollups_of_hosts(store.db(), from, to_ms, host_ids).await?;
        let waiting = store::rollups::dirty_marks_in(store.db(), from, to_ms, i64::MAX)
            .await?
            .into_iter()
            .map(|m| (m.hour_ms, m.host_id))
            .collect();
        Ok(Ledger {
            rows,
            waiting,
            parent_of,
        })
    }

    /// What an incident has cost from `since_ms` to `until_ms`: per hour, the ledger's idle (or,
    /// for held idle, held-idle) dollars of its GPUs where the hour is over and rolled up with
    /// nothing waiting; elsewhere (the hour under way, hours not rolled up yet) `cost_per_hour`
    /// over the idle part of the hour. Once its hours are rolled up an incident carries exactly
    /// the dollars the ledger holds for its GPU-hours, the same the idle history shows. Only
    /// the ledger's amounts in the incident's `currency` count.
    #[allow(clippy::too_many_arguments)]
    pub fn wasted(
        &self,
        kind: &str,
        host_ids: &[i64],
        gpus: &[String],
        since_ms: i64,
        until_ms: i64,
        now_ms: i64,
        (cost_per_hour, currency): (Decimal, &str),
    ) -> Decimal {
        use gpuledger_core::time::hour_floor;
        let ledger_kind = if kind == waste::IncidentKind::HeldIdle.as_str() {
            "held_idle"
        } else {
            "idle"
        };
        let mine = |uuid: &str| {
            gpus.iter().any(|g| g == uuid)
                || self
                    .parent_of
                    .get(uuid)
                    .is_some_and(|p| gpus.iter().any(|g| g == p))
        };
        let mut in_ledger: BTreeMap<i64, Decimal> = BTreeMap::new();
        for r in &self.rows {
            if r.kind == ledger_kind
                && r.currency == currency
                && host_ids.contains(&r.host_id)
                && mine(&r.gpu_uuid)
            {
                *in_ledger.entry(r.period_ms).or_default() +=
                    gpuledger_core::money::from_nano_atto(r.cost_nano, r.cost_atto);
            }
        }
        let mut total = Decimal::ZERO;
        let mut hour = hour_floor(since_ms);
        while hour < until_ms {
            let rolled_up = hour + HOUR_MS <= hour_floor(now_ms)
                && !self
                    .waiting
                    .contains(&(hour, crate::store::BILLING_MARK_HOST))
                && !host_ids.iter().any(|h| self.waiting.contains(&(hour, *h)));
            total += if rolled_up {
                in_ledger.get(&hour).copied().unwrap_or_default()
            } else {
                wasted(
                    cost_per_hour,
                    since_ms.max(hour),
                    until_ms.min(hour + HOUR_MS),
                )
            };
            hour += HOUR_MS;
        }
        total
    }
}

/// The teams an incident's owners name (its processes', or its cluster's).
pub fn teams_of_incident(i: &IncidentRow, schema: &OwnerSchema) -> Vec<String> {
    teams(&i.owners_json, schema, &i.cluster)
}

/// Whether an incident is `team`'s alone: every team its owners name is that one. What
/// `/gpuledger idle TEAM` lists and a team's Slack route is sent, as its viewer sees it
/// ([`within_scope`]); one shared with another team is the fleet's.
pub fn is_teams_alone(i: &IncidentRow, schema: &OwnerSchema, team: &str) -> bool {
    let named = teams_of_incident(i, schema);
    !named.is_empty() && named.iter().all(|t| t == team)
}

/// The teams an incident's processes belong to: the team dimension's value as attribution
/// reads it from their labels (several held processes list theirs comma-separated), else the
/// cluster's value. An incident has no bill line, so no tag.
fn teams(owners_json: &str, schema: &OwnerSchema, cluster: &str) -> Vec<String> {
    let labels: BTreeMap<String, String> = serde_json::from_str(owners_json).unwrap_or_default();
    teams_of(&labels, schema, cluster)
}

/// [`teams`] of owner labels already read.
fn teams_of(labels: &BTreeMap<String, String>, schema: &OwnerSchema, cluster: &str) -> Vec<String> {
    let owner = schema.with_tags(&schema.owner_of(labels, cluster), &BTreeMap::new(), cluster);
    let mut teams: Vec<String> = Vec::new();
    for value in schema
        .value(&owner, Role::Team)
        .into_iter()
        .flat_map(|v| v.split(", "))
    {
        if !value.is_empty() && !teams.iter().any(|t| t == value) {
            teams.push(value.to_owned());
        }
    }
    teams
}

async fn notify(
    store: &dyn Store,
    config: &Config,
    incident: &IncidentRow,
    event: slack::Event,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let Some(route) = config.slack.route_for(
        &incident.cluster,
        &teams(&incident.owners_json, &config.owners, &incident.cluster),
    ) else {
        return Ok(false);
    };
    let payload = slack::incident_message(
        incident,
        event,
        &config.slack.base_url,
        now_ms,
        config.slack.app.is_some(),
    );
    store::alerts::enqueue_slack(
        store.db(),
        Some(incident.id),
        event.as_str(),
        &route,
        &payload.to_string(),
        now_ms,
    )
    .await?;
    store::alerts::mark_incident_notified(store.db(), incident.id, now_ms).await?;
    Ok(true)
}

/// The incidents open now.
pub async fn open(store: &dyn Store) -> Result<Vec<IncidentRow>, StoreError> {
    store::alerts::open_incidents(store.db()).await
}

/// Incidents open at any time in `[from_ms, to_ms)`, newest first.
pub async fn overlapping(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<crate::store::alerts::IncidentRow>, StoreError> {
    store::alerts::incidents(store.db(), from_ms, to_ms).await
}

/// The incidents a team-scoped reader may see: those whose GPUs are all its teams' over
/// `[from_ms, to_ms)` ([`gpuledger_core::scope::Scope::held_keys`] of the ledger's GPU days), so
/// no other team's GPU, process or owner is named. All of them for every team.
pub async fn for_scope(
    store: &dyn Store,
    rows: Vec<crate::store::alerts::IncidentRow>,
    (from_ms, to_ms): (i64, i64),
    (scope, owners): (&gpuledger_core::scope::Scope, &OwnerSchema),
) -> Result<Vec<crate::store::alerts::IncidentRow>, StoreError> {
    if scope.is_all() || rows.is_empty() {
        return Ok(rows);
    }
    let days = crate::ledger::load(store, from_ms, to_ms, store::RollupGrain::Day).await?;
    Ok(within_scope(rows, &days, (scope, owners)))
}

/// [`for_scope`] with the ledger of the range already read (at day grain or finer).
pub fn within_scope(
    rows: Vec<crate::store::alerts::IncidentRow>,
    days: &gpuledger_core::attribution::Attribution,
    (scope, owners): (&gpuledger_core::scope::Scope, &OwnerSchema),
) -> Vec<crate::store::alerts::IncidentRow> {
    if scope.is_all() {
        return rows;
    }
    let held = scope
        .held_keys(days, gpuledger_core::allocation::GroupBy::Gpu, owners)
        .unwrap_or_default();
    // The ledger lags the live findings by up to an hour: the processes an incident names
    // must be the scope's teams' too.
    // An incident that names no team (idle GPUs with no process, on a cluster no team owns) is
    // the whole fleet's, as its idle dollars are in the ledger (`idle_history::in_scope`).
    let only_ours = |r: &crate::store::alerts::IncidentRow| {
        let devices: Vec<IdleDevice> = serde_json::from_str(&r.devices_json).unwrap_or_default();
        let named = teams(&r.owners_json, owners, &r.cluster);
        !named.is_empty()
            && named.iter().all(|t| scope.admits_team(t))
            && devices.iter().flat_map(|d| &d.processes).all(|p| {
                let named = teams_of(&p.owners, owners, &r.cluster);
                !named.is_empty() && named.iter().all(|t| scope.admits_team(t))
            })
    };
    rows.into_iter()
        .filter(|r| {
            let gpus: Vec<String> = serde_json::from_str(&r.gpus_json).unwrap_or_default();
            !gpus.is_empty() && gpus.iter().all(|g| held.contains(g)) && only_ours(r)
        })
        .collect()
}

/// One incident with the Slack messages sent about it; `None` if there is no such incident.
pub async fn with_messages(
    store: &dyn Store,
    id: i64,
) -> Result<
    Option<(
        crate::store::alerts::IncidentRow,
        Vec<crate::store::alerts::SlackMessageRow>,
    )>,
    StoreError,
> {
    let Some(row) = store::alerts::incident(store.db(), id).await? else {
        return Ok(None);
    };
    let messages = store::alerts::incident_messages(store.db(), id).await?;
    Ok(Some((row, messages)))
}

/// Snoozes that are still running at `now_ms`, by cluster.
pub async fn active_snoozes(
    store: &dyn Store,
    now_ms: i64,
) -> Result<Vec<crate::store::alerts::SnoozeRow>, StoreError> {
    store::alerts::active_snoozes(store.db(), now_ms).await
}

/// Marks open incident `id` as idle on purpose: no more reminders. `None` if there is no
/// such incident, else whether it was still open.
pub async fn mark_intended(
    store: &dyn Store,
    id: i64,
    by_user: &str,
    now_ms: i64,
) -> Result<Option<(IncidentRow, bool)>, StoreError> {
    let Some(row) = store::alerts::incident(store.db(), id).await? else {
        return Ok(None);
    };
    let marked = store::alerts::mark_intended(store.db(), id, by_user, now_ms).await?;
    Ok(Some((row, marked)))
}

/// Silences `cluster`'s incident alerts until `until_ms` (replacing a snooze it had).
pub async fn snooze(
    store: &dyn Store,
    cluster: &str,
    until_ms: i64,
    by_user: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    store::alerts::snooze(store.db(), cluster, until_ms, by_user, now_ms).await
}

/// The clusters hosts report from, sorted: what a snooze can name.
pub async fn clusters(store: &dyn Store) -> Result<Vec<String>, StoreError> {
    let mut clusters: Vec<String> = store::telemetry::hosts(store.db())
        .await?
        .into_iter()
        .filter(|h| !h.from_bill)
        .map(|h| h.cluster)
        .collect();
    clusters.sort();
    clusters.dedup();
    Ok(clusters)
}

/// Each host's current price per GPU-hour: the bill where it reaches, else the rate card.
async fn prices(
    store: &dyn Store,
    (hosts, windows): (&[HostRow], &[AttributionWindow]),
    card: &RateCard,
    now_ms: i64,
) -> Result<HashMap<i64, GpuPrice>, StoreError> {
    let mut physical: HashMap<i64, BTreeMap<&str, &str>> = HashMap::new();
    for w in windows.iter().filter(|w| w.parent_uuid.is_none()) {
        physical
            .entry(w.host_id)
            .or_default()
            .insert(&w.gpu_uuid, w.gpu_name.as_deref().unwrap_or(""));
    }
    let names: HashMap<i64, Vec<String>> = physical
        .into_iter()
        .map(|(h, gpus)| (h, gpus.into_values().map(str::to_owned).collect()))
        .collect();
    current_price::gpu_prices(store, hosts, &names, card, now_ms).await
}

/// A finding written to its incident: opened (and said, unless its cluster is snoozed), or the
/// open one updated and, when a reminder is due, brought up again (never one someone said is
/// idle on purpose). Whether it opened, and whether a reminder went.
async fn open_or_update(
    store: &dyn Store,
    config: &Config,
    (existing, update): (Option<IncidentRow>, &IncidentUpdate),
    is_snoozed: bool,
    now_ms: i64,
) -> Result<(bool, bool), StoreError> {
    let Some(existing) = existing else {
        let id = store::alerts::insert_incident(store.db(), update).await?;
        if !is_snoozed {
            if let Some(row) = store::alerts::incident(store.db(), id).await? {
                notify(store, config, &row, slack::Event::Opened, now_ms).await?;
            }
        }
        return Ok((true, false));
    };
    store::alerts::update_incident(store.db(), existing.id, update).await?;
    let remind_ms = config.slack.remind_every.as_millis() as i64;
    let due = existing
        .last_notified_ms
        .is_none_or(|t| now_ms - t >= remind_ms);
    // Idle on purpose, someone said: not brought up again.
    let intended = existing.intended_by.is_some();
    if !due || is_snoozed || intended {
        return Ok((false, false));
    }
    let Some(row) = store::alerts::incident(store.db(), existing.id).await? else {
        return Ok((false, false));
    };
    // First word on an incident opened while snoozed is its opening.
    let event = if existing.last_notified_ms.is_some() {
        slack::Event::Reminder
    } else {
        slack::Event::Opened
    };
    let said = notify(store, config, &row, event, now_ms).await?;
    Ok((false, said && event == slack::Event::Reminder))
}

/// An incident no longer idle: resolved, and said as resolved when its hosts still report (their
/// GPUs are busy or released) or as "stopped reporting" when they went silent, where it was said
/// to be open and its cluster is not snoozed.
async fn resolve(
    store: &dyn Store,
    config: &Config,
    incident: &IncidentRow,
    (still_reporting, is_snoozed): (bool, bool),
    now_ms: i64,
) -> Result<(), StoreError> {
    store::alerts::resolve_incident(store.db(), incident.id, now_ms).await?;
    let event = if still_reporting {
        slack::Event::Resolved
    } else {
        slack::Event::StoppedReporting
    };
    if incident.last_notified_ms.is_some() && !is_snoozed {
        if let Some(row) = store::alerts::incident(store.db(), incident.id).await? {
            notify(store, config, &row, event, now_ms).await?;
        }
    }
    Ok(())
}

/// An ended incident's dollars from the ledger, as its last hours are rolled up.
async fn settle_wasted(
    store: &dyn Store,
    ledger: &Ledger,
    (hosts, i): (&[HostRow], &IncidentRow),
    now_ms: i64,
) -> Result<(), StoreError> {
    let Some(ended) = i.ended_ms else {
        return Ok(());
    };
    let gpus: Vec<String> = serde_json::from_str(&i.gpus_json).unwrap_or_default();
    let settled = ledger.wasted(
        &i.kind,
        &hosts_of(hosts, i),
        &gpus,
        i.started_ms,
        ended,
        now_ms,
        (
            gpuledger_core::money::from_text(&i.cost_per_hour),
            &i.currency,
        ),
    );
    if settled != gpuledger_core::money::from_text(&i.wasted) {
        store::alerts::set_incident_wasted(store.db(), i.id, &to_text(settled)).await?;
    }
    Ok(())
}

pub async fn evaluate(
    store: &dyn Store,
    card: &RateCard,
    config: &Config,
    now_ms: i64,
) -> Result<EvaluationSummary, StoreError> {
    // Twice the longest duration: an incident first seen now still gets its true start.
    let lookback = 2 * config.idle.longest_duration().as_millis() as i64 + 10 * 60_000;
    let from = now_ms - lookback;
    let hosts = store::telemetry::hosts(store.db()).await?;
    // Every window overlapping the look-back, long ones that began before it included: an
    // hour-long window that started just before would otherwise be missed, and whether an idle
    // run is long enough would depend on the minute the evaluation runs.
    let read_from = from - crate::validate::MAX_WINDOW_MS;
    let windows: Vec<_> = store::rollups::attribution_windows(store.db(), read_from, now_ms + 1)
        .await?
        .into_iter()
        .filter(|w| w.end_ms > from)
        .collect();
    let processes = store::telemetry::process_windows(store.db(), read_from, now_ms + 1).await?;
    let findings = waste::find(&hosts, &windows, &processes, &config.idle, now_ms);

    let hourly = prices(store, (&hosts, &windows), card, now_ms).await?;
    // How people name each GPU: its host and NVML index.
    let named: HashMap<String, (String, Option<i64>)> = store::telemetry::fleet(store.db())
        .await?
        .into_iter()
        .filter_map(|r| Some((r.uuid?, (r.hostname, r.gpu_index))))
        .collect();

    let snoozed: Vec<String> = store::alerts::active_snoozes(store.db(), now_ms)
        .await?
        .into_iter()
        .map(|s| s.cluster)
        .collect();
    let mut open: HashMap<String, IncidentRow> = store::alerts::open_incidents(store.db())
        .await?
        .into_iter()
        .map(|i| (i.incident_key.clone(), i))
        .collect();
    let mut summary = EvaluationSummary::default();

    // An open incident keeps the start it was opened with, even past the look-back; a new one
    // starts where its idle run really began.
    let mut sinces = Vec::with_capacity(findings.len());
    for f in &findings {
        sinces.push(match open.get(&f.key) {
            Some(i) => i.started_ms.min(f.since_ms),
            None => idle_run_start(store, &hosts, f, config, from, now_ms).await?,
        });
    }
    // Dollars come from the ledger where it holds the hours: of the findings, of the open
    // incidents (which may resolve now) and of those resolved lately (settled below).
    let settling: Vec<IncidentRow> =
        store::alerts::incidents(store.db(), now_ms - SETTLE_MS, now_ms + 1)
            .await?
            .into_iter()
            .filter(|i| i.ended_ms.is_some())
            .collect();
    let mut involved: Vec<i64> = findings.iter().flat_map(|f| f.host_ids.clone()).collect();
    for i in open.values().chain(&settling) {
        involved.extend(hosts_of(&hosts, i));
    }
    involved.sort_unstable();
    involved.dedup();
    let ledger_from = sinces
        .iter()
        .copied()
        .chain(open.values().chain(&settling).map(|i| i.started_ms))
        .min()
        .unwrap_or(now_ms);
    let parent_of: HashMap<String, String> = windows
        .iter()
        .filter_map(|w| Some((w.gpu_uuid.clone(), w.parent_uuid.clone()?)))
        .collect();
    let ledger = Ledger::read(store, &involved, ledger_from, now_ms + 1, parent_of).await?;

    for (f, since) in findings.iter().zip(sinces) {
        let (cost_per_hour, currency, estimated) = price(f, &hourly);
        let wasted = ledger.wasted(
            f.kind.as_str(),
            &f.host_ids,
            &f.gpus,
            since,
            now_ms,
            now_ms,
            (cost_per_hour, &currency),
        );
        let update = IncidentUpdate {
            incident_key: f.key.clone(),
            kind: f.kind.as_str().to_owned(),
            cluster: f.cluster.clone(),
            hostname: f.hostname.clone(),
            gpus_json: serde_json::to_string(&f.gpus).unwrap_or_else(|_| "[]".into()),
            owners_json: serde_json::to_string(&f.owners).unwrap_or_else(|_| "{}".into()),
            devices_json: serde_json::to_string(&devices(f, &named))
                .unwrap_or_else(|_| "[]".into()),
            started_ms: since,
            last_seen_ms: now_ms,
            cost_per_hour: to_text(cost_per_hour),
            currency,
            estimated,
            wasted: to_text(wasted),
        };
        let is_snoozed = snoozed.contains(&f.cluster);
        let existing = open.remove(&f.key);
        let (opened, reminded) =
            open_or_update(store, config, (existing, &update), is_snoozed, now_ms).await?;
        summary.opened += usize::from(opened);
        summary.reminders += usize::from(reminded);
    }
    // Whatever is no longer idle is over: resolved when its hosts still report (their GPUs are
    // busy or released), said as "stopped reporting" when they went silent.
    let reporting: std::collections::HashSet<i64> = windows
        .iter()
        .filter(|w| w.end_ms >= now_ms - waste::STALE_AFTER_MS)
        .map(|w| w.host_id)
        .collect();
    // Those resolved lately, and those resolving now, are settled below.
    let mut settle = settling;
    for (_, incident) in open {
        let still_reporting = hosts_of(&hosts, &incident)
            .iter()
            .any(|h| reporting.contains(h));
        let is_snoozed = snoozed.contains(&incident.cluster);
        resolve(
            store,
            config,
            &incident,
            (still_reporting, is_snoozed),
            now_ms,
        )
        .await?;
        settle.push(IncidentRow {
            ended_ms: Some(now_ms),
            ..incident
        });
        summary.resolved += 1;
    }
    // Incidents resolved lately take their dollars from the ledger as their last hours are
    // rolled up, so a finished incident ends with exactly the idle dollars of its GPU-hours.
    for i in settle {
        settle_wasted(store, &ledger, (&hosts, &i), now_ms).await?;
    }
    summary.open = findings.len();
    Ok(summary)
}

/// How long after it ends an incident's dollars are still brought in line with the ledger: the
/// roll-up job has long caught up by then.
const SETTLE_MS: i64 = 24 * HOUR_MS;

/// The hosts an incident is about: its host, or every host of its cluster.
fn hosts_of(hosts: &[HostRow], incident: &IncidentRow) -> Vec<i64> {
    hosts
        .iter()
        .filter(|h| {
            h.cluster == incident.cluster
                && incident.hostname.as_ref().is_none_or(|n| *n == h.hostname)
        })
        .map(|h| h.id)
        .collect()
}

#[cfg(test)]
mod tests;
