//! Spend anomalies from the hourly ledger: each watched owner's cost per day judged by
//! [`gpuledger_core::anomaly`], with the GPUs, hosts and processes that drove it, whether it
//! was dismissed and by whom; announced in Slack once per anomaly and kind.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rust_decimal::Decimal;
use serde::Serialize;

use crate::config::Config;
use crate::ledger::{self, Keep};
use crate::store::anomalies::{AnomalyId, DismissalRow};
use crate::store::{RollupGrain, Store, StoreError};
use gpuledger_core::allocation::key_of;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::anomaly::{self, Anomaly, Driver, ProcessSeen};
use gpuledger_core::attribution::Attribution;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::{day_floor, weekday, DAY_MS};

/// Hosts named as an anomaly's drivers, and processes per host.
const DRIVERS: usize = 5;
const PROCESSES_PER_HOST: usize = 3;

/// One owner's anomaly, with what drove it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct OwnerAnomaly {
    pub dimension: String,
    pub key: String,
    pub currency: String,
    #[serde(flatten)]
    pub anomaly: Anomaly,
    /// Its day furthest above expectation, where its drivers were looked for.
    pub peak_day_ms: i64,
    /// The hosts whose cost to the owner rose most that day.
    pub drivers: Vec<Driver>,
    pub dismissed: Option<Dismissal>,
}

/// How far before an anomaly's first day a name recorded for it (a dismissal, a Slack claim)
/// still counts as its own: late data or a bill replacing estimates can move the first day.
const NAME_SLACK_MS: i64 = 7 * DAY_MS;

impl OwnerAnomaly {
    /// Whether a dismissal or claim recorded under `id` is about this anomaly: the same owner
    /// and currency, a first day within its days or the week before.
    pub fn is_named_by(&self, id: &AnomalyId) -> bool {
        id.dimension == self.dimension
            && id.owner_key == self.key
            && id.currency == self.currency
            && (self.anomaly.start_ms - NAME_SLACK_MS..=self.anomaly.last_day_ms())
                .contains(&id.start_ms)
    }

    pub fn id(&self) -> AnomalyId {
        AnomalyId {
            dimension: self.dimension.clone(),
            owner_key: self.key.clone(),
            currency: self.currency.clone(),
            start_ms: self.anomaly.start_ms,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Dismissal {
    pub by: String,
    pub at_ms: i64,
    pub reason: String,
}

/// The owner dimensions watched: the config's, else the team dimension, else every one.
pub fn watched(config: &Config) -> Vec<GroupBy> {
    let schema = &config.owners;
    if !config.anomalies.dimensions.is_empty() {
        return config
            .anomalies
            .dimensions
            .iter()
            .filter_map(|d| GroupBy::parse(d, schema))
            .collect();
    }
    match GroupBy::role(schema, Role::Team) {
        Some(team) => vec![team],
        None => GroupBy::all(schema)
            .into_iter()
            .filter(|g| g.is_owner())
            .collect(),
    }
}

/// The anomalies with a day in `[from, to)` at `now`, with their drivers, biggest excess first
/// (dismissed ones last); the days of spend `keep` says are closed read as kept.
pub async fn find(
    store: &dyn Store,
    config: &Config,
    range: (i64, i64),
    (now, keep): (i64, Keep),
) -> Result<Vec<OwnerAnomaly>, StoreError> {
    let (mut found, history_from) = detect(store, config, range, (now, keep)).await?;
    add_drivers(store, config, &mut found, history_from, now).await?;
    Ok(found)
}

/// The anomalies a team-scoped reader may see: its own teams' (on the team dimension; an
/// anomaly of a model or endpoint is judged on weeks of history that may be another team's),
/// their drivers showing only its teams' processes. All of them for every team.
pub fn within_scope(
    found: Vec<OwnerAnomaly>,
    (scope, schema): (&Scope, &OwnerSchema),
) -> Vec<OwnerAnomaly> {
    if scope.is_all() {
        return found;
    }
    let team = schema.role(Role::Team);
    found
        .into_iter()
        .filter(|a| Some(a.dimension.as_str()) == team && scope.admits_team(&a.key))
        .map(|mut a| {
            for d in &mut a.drivers {
                let cluster = d.cluster.clone();
                d.processes
                    .retain(|p| scope.admits(&schema.owner_of(&p.labels, &cluster), schema));
            }
            a
        })
        .collect()
}

/// The anomalies as [`find`] has them, but without their drivers (which read days of per-GPU
/// ledger and raw processes: the Slack job looks for them only for what it will announce);
/// and the day the ledger begins.
async fn detect(
    store: &dyn Store,
    config: &Config,
    (from, to): (i64, i64),
    (now, keep): (i64, Keep),
) -> Result<(Vec<OwnerAnomaly>, i64), StoreError> {
    let dimensions = watched(config);
    let load_from =
        day_floor(from) - (anomaly::RUN_LOOKBACK_DAYS + anomaly::BASELINE_WEEKS * 7) * DAY_MS;
    // Past the range too: a run that goes on after it has the same days and kind in any view.
    let until = now
        .min(to + anomaly::RUN_LOOKBACK_DAYS * DAY_MS)
        .max(load_from);
    let history_from = crate::store::ledger::first_day(store.db())
        .await?
        .unwrap_or(load_from);
    let daily = ledger::daily_spend(store, &dimensions, (load_from, until), keep).await?;
    let sensitivity = config.anomalies.sensitivity();
    let mut found = Vec::new();
    for ((by, key, currency), days) in &daily {
        for a in anomaly::find(days, (from, to), history_from, now, &sensitivity) {
            found.push((*by, key.clone(), currency.clone(), a));
        }
    }
    let dismissed = crate::store::anomalies::dismissals(store.db(), load_from, to).await?;
    let mut out = Vec::new();
    for (by, key, currency, a) in found {
        let mut o = OwnerAnomaly {
            dimension: by.as_str().to_owned(),
            key,
            currency,
            peak_day_ms: a.peak_day_ms(),
            anomaly: a,
            drivers: Vec::new(),
            dismissed: None,
        };
        o.dismissed = dismissed
            .iter()
            .find(|d| o.is_named_by(&d.id()))
            .map(|d| Dismissal {
                by: d.dismissed_by.clone(),
                at_ms: d.dismissed_ms,
                reason: d.reason.clone(),
            });
        out.push(o);
    }
    out.sort_by(|a, b| {
        (
            a.dismissed.is_some(),
            b.anomaly.excess(),
            a.anomaly.start_ms,
            &a.key,
        )
            .cmp(&(
                b.dismissed.is_some(),
                a.anomaly.excess(),
                b.anomaly.start_ms,
                &b.key,
            ))
    });
    Ok((out, history_from))
}

/// Fills in each anomaly's drivers, each day of per-GPU ledger read once for all of them.
async fn add_drivers(
    store: &dyn Store,
    config: &Config,
    anomalies: &mut [OwnerAnomaly],
    history_from: i64,
    now: i64,
) -> Result<(), StoreError> {
    let mut days = DayLedgers::default();
    for a in anomalies {
        let Some(by) = GroupBy::parse(&a.dimension, &config.owners) else {
            continue;
        };
        a.drivers = drivers(
            store,
            &mut days,
            (by, &a.key, &a.currency),
            (a.peak_day_ms, a.anomaly.start_ms),
            (history_from, now),
        )
        .await?;
    }
    Ok(())
}

/// Days of the ledger per GPU, each read once however many anomalies look at it.
#[derive(Default)]
struct DayLedgers(HashMap<i64, Attribution>);

impl DayLedgers {
    async fn day(
        &mut self,
        store: &dyn Store,
        day: i64,
        now: i64,
    ) -> Result<&Attribution, StoreError> {
        Ok(match self.0.entry(day) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(ledger::load(store, day, (day + DAY_MS).min(now), RollupGrain::Day).await?)
            }
        })
    }
}

/// The hosts whose cost to the owner rose most on `peak` against the average of the same
/// weekday in the weeks before the anomaly began, with the owner's GPUs on them and the
/// processes seen on those that day.
async fn drivers(
    store: &dyn Store,
    days: &mut DayLedgers,
    (by, key, currency): (GroupBy, &str, &str),
    (peak, start): (i64, i64),
    (history_from, now): (i64, i64),
) -> Result<Vec<Driver>, StoreError> {
    // Per host: the owner's cost, and the GPUs it was on.
    let cost_on = |a: &Attribution, into: &mut BTreeMap<i64, (Decimal, BTreeSet<String>)>| {
        for p in &a.parts {
            if p.currency == currency && key_of(p, by, a) == key {
                let host = into.entry(p.host_id).or_default();
                host.0 += p.cost;
                host.1.extend(p.gpu_uuid.clone());
            }
        }
    };
    let mut actual = BTreeMap::new();
    let today = days.day(store, peak, now).await?;
    cost_on(today, &mut actual);
    let hosts = today.hosts.clone();
    let mut before = BTreeMap::new();
    let mut samples = 0i64;
    let mut day = day_floor(start) - DAY_MS;
    while day >= day_floor(start) - anomaly::BASELINE_WEEKS * 7 * DAY_MS
        && day >= day_floor(history_from)
    {
        if weekday(day) == weekday(peak) {
            cost_on(days.day(store, day, now).await?, &mut before);
            samples += 1;
        }
        day -= DAY_MS;
    }
    let mut rises: Vec<(i64, Decimal, Decimal, Vec<String>)> = actual
        .into_iter()
        .map(|(host, (cost, gpus))| {
            let usual = before.get(&host).map_or(Decimal::ZERO, |(c, _)| {
                gpuledger_core::money::cents(*c / Decimal::from(samples.max(1)))
            });
            (host, usual, cost, gpus.into_iter().collect())
        })
        // A rise of less than a cent is no driver.
        .filter(|(_, usual, cost, _)| gpuledger_core::money::cents(*cost) > *usual)
        .collect();
    rises.sort_by(|a, b| (b.2 - b.1).cmp(&(a.2 - a.1)).then(a.0.cmp(&b.0)));
    rises.truncate(DRIVERS);
    let uuids: Vec<String> = rises.iter().flat_map(|r| r.3.iter().cloned()).collect();
    let seen =
        crate::store::telemetry::processes_on(store.db(), &uuids, peak, peak + DAY_MS).await?;
    Ok(rises
        .into_iter()
        .map(|(host_id, expected, actual, gpus)| {
            // The host's processes, most often seen first, each (name, user, labels) once.
            let mut on_host: BTreeMap<(&Option<String>, &Option<String>, &str), i64> =
                BTreeMap::new();
            for s in seen.iter().filter(|s| gpus.contains(&s.gpu_uuid)) {
                *on_host
                    .entry((&s.process_name, &s.user_name, s.labels_json.as_str()))
                    .or_default() += s.windows;
            }
            let mut ranked: Vec<_> = on_host.into_iter().collect();
            ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let processes = ranked
                .into_iter()
                .take(PROCESSES_PER_HOST)
                .map(|((name, user, labels), _)| ProcessSeen {
                    name: name.clone().unwrap_or_else(|| "(unnamed)".into()),
                    user: user.clone(),
                    labels: serde_json::from_str(labels).unwrap_or_default(),
                })
                .collect();
            let host = hosts.get(&host_id);
            Driver {
                cluster: host.map_or_else(|| "?".into(), |h| h.cluster.clone()),
                host: host.map_or_else(|| "?".into(), |h| h.hostname.clone()),
                gpus,
                expected,
                actual,
                processes,
            }
        })
        .collect())
}

/// Why an anomaly cannot be dismissed as asked.
#[derive(Debug, thiserror::Error)]
pub enum DismissError {
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyDismissed(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An anomaly to dismiss, as an admin names it: owner, currency and first day (`YYYY-MM-DD`).
pub struct Dismiss<'a> {
    pub dimension: &'a str,
    pub key: &'a str,
    pub currency: &'a str,
    pub start: &'a str,
    pub reason: &'a str,
}

/// Records that `by_user` dismissed the anomaly (it stays on the review, marked, and is no
/// longer announced). Only an anomaly the ledger shows can be dismissed, once.
pub async fn dismiss(
    store: &dyn Store,
    config: &Config,
    ask: Dismiss<'_>,
    by_user: &str,
    now: i64,
) -> Result<DismissalRow, DismissError> {
    let invalid = |field, message: String| DismissError::Invalid { field, message };
    let start = chrono::NaiveDate::parse_from_str(ask.start.trim(), "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|d| d.and_utc().timestamp_millis())
        .ok_or_else(|| {
            invalid(
                "start",
                format!("must be a day, YYYY-MM-DD, got {:?}", ask.start),
            )
        })?;
    let dimension = ask.dimension.trim();
    if !watched(config).iter().any(|g| g.as_str() == dimension) {
        let names: Vec<&str> = watched(config).iter().map(|g| g.as_str()).collect();
        return Err(invalid(
            "dimension",
            format!(
                "{dimension:?} is not watched for anomalies; watched: {}",
                names.join(", ")
            ),
        ));
    }
    if ask.key.trim().is_empty() {
        return Err(invalid("key", "the owner key is empty".into()));
    }
    let currency = gpuledger_core::money::currency_code(ask.currency).ok_or_else(|| {
        invalid(
            "currency",
            format!("{:?} is not a three-letter currency code", ask.currency),
        )
    })?;
    let reason = ask.reason.trim();
    if reason.chars().count() > 500
        || reason
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\r')
    {
        return Err(invalid(
            "reason",
            "a reason is at most 500 characters without control characters".into(),
        ));
    }
    let found = find(store, config, (start, start + DAY_MS), (now, Keep::NOTHING)).await?;
    let Some(a) = found.into_iter().find(|a| {
        a.dimension == dimension
            && a.key == ask.key.trim()
            && a.currency == currency
            && a.anomaly.start_ms == start
    }) else {
        return Err(DismissError::NotFound(format!(
            "no anomaly of {dimension} {:?} in {currency} began on {}",
            ask.key.trim(),
            ask.start.trim()
        )));
    };
    if let Some(d) = &a.dismissed {
        return Err(DismissError::AlreadyDismissed(format!(
            "already dismissed by {} at {}",
            d.by,
            gpuledger_core::time::rfc3339(d.at_ms)
        )));
    }
    let row = DismissalRow {
        dimension: a.dimension.clone(),
        owner_key: a.key.clone(),
        currency: a.currency.clone(),
        start_ms: start,
        dismissed_by: by_user.to_owned(),
        dismissed_ms: now,
        reason: reason.to_owned(),
    };
    if !crate::store::anomalies::dismiss(store.db(), &row).await? {
        return Err(DismissError::AlreadyDismissed(
            "already dismissed by someone else just now".into(),
        ));
    }
    Ok(row)
}

/// Announces in Slack each anomaly still going on (a day in the last two), once as a spike and
/// once more if it holds as a new level: the kind is claimed in the transaction that queues the
/// message, so with several replicas one announces it (a claim made under a first day that late
/// data moved since still counts, see [`OwnerAnomaly::is_named_by`]). Dismissed anomalies are not announced.
/// An anomaly of a team goes to the team's route, others by the cluster of their biggest
/// driver; with no route nothing is claimed. Returns how many messages were queued.
pub async fn alert(store: &dyn Store, config: &Config, now: i64) -> Result<usize, StoreError> {
    let today = day_floor(now);
    let team = GroupBy::role(&config.owners, Role::Team);
    let (found, history_from) = detect(
        store,
        config,
        (today - DAY_MS, today + DAY_MS),
        (now, Keep::NOTHING),
    )
    .await?;
    // Drivers only for what may be announced: not dismissed, its kind not claimed yet.
    let mut due = Vec::new();
    for a in found.into_iter().filter(|a| a.dismissed.is_none()) {
        let kind = a.anomaly.kind.as_str();
        let claimed = crate::store::anomalies::claims(store.db(), &a.id(), kind).await?;
        if !claimed.iter().any(|c| a.is_named_by(c)) {
            due.push(a);
        }
    }
    add_drivers(store, config, &mut due, history_from, now).await?;
    let mut queued = 0;
    for a in due {
        let teams = if team.is_some_and(|t| t.as_str() == a.dimension) {
            vec![a.key.clone()]
        } else {
            Vec::new()
        };
        let cluster = a.drivers.first().map_or("", |d| d.cluster.as_str());
        let Some(route) = config.slack.route_for(cluster, &teams) else {
            continue;
        };
        let mut tx = store.db().begin().await?;
        let kind = a.anomaly.kind.as_str();
        let claimed = crate::store::anomalies::claims(&mut tx, &a.id(), kind).await?;
        if !claimed.iter().any(|c| a.is_named_by(c))
            && crate::store::anomalies::claim_alert(&mut tx, &a.id(), kind, now).await?
        {
            let payload = crate::slack::anomaly_message(
                (&a.dimension, &a.key, &a.currency),
                &a.anomaly,
                &a.drivers,
                &config.slack.base_url,
            );
            crate::store::alerts::enqueue_slack(
                &mut tx,
                None,
                "anomaly",
                &route,
                &payload.to_string(),
                now,
            )
            .await?;
            queued += 1;
        }
        tx.commit().await?;
    }
    Ok(queued)
}

#[cfg(test)]
mod tests;
