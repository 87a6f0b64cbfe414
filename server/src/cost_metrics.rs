//! The ledger's figures as Prometheus gauges, for the `/metrics` scrape of a read-only token:
//! cost this month and in the latest ledger hour per cluster, owner and state, per GPU (with
//! dcgm-exporter's labels, so the two join), GPUs per state, open idle incidents and budgets.
//! The same hourly ledger the pages and the API read, narrowed to the token's teams.
//!
//! Every replica answers alike (the figures come from the database), so dashboards take
//! `max without (instance)` before summing; see docs/metrics.md.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use prometheus::{Encoder, GaugeVec, Opts, Registry, TextEncoder};
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;
use tokio::sync::Mutex;

use crate::config::Config;
use crate::ledger;
use crate::store::{self, RollupGrain, Store, StoreError};
use gpuledger_core::cost_metrics::{gauges, latest_hour, CostGauges, Shape};
use gpuledger_core::owners::Role;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::{hour_floor, month_of, HOUR_MS};

/// How long one rendering is served again: a month of ledger is read once per this, however
/// many Prometheus servers scrape (the ledger itself changes hourly).
const FRESH_FOR_MS: i64 = 30_000;

/// The hours read to find the latest one the ledger holds (rollups lag the clock).
const RECENT_HOURS: i64 = 6;

/// Renderings per scope with the moment each was rendered at, each kept [`FRESH_FOR_MS`].
#[derive(Default, Clone)]
pub struct Cache(Arc<Mutex<HashMap<String, (i64, String)>>>);

impl Cache {
    /// The gauges as `scope` sees them at `now`, rendered anew once they are older than
    /// [`FRESH_FOR_MS`] (or rendered at a later moment than `now`). The lock is held while
    /// rendering, so concurrent scrapes read once.
    pub async fn exposition(
        &self,
        store: &dyn Store,
        config: &Config,
        scope: &Scope,
        now: i64,
    ) -> Result<String, CostMetricsError> {
        if crate::sections::reading_afresh() {
            return exposition(store, config, scope, now).await;
        }
        let key = scope.to_stored().unwrap_or_default();
        let fresh = |at: i64| (0..FRESH_FOR_MS).contains(&(now - at));
        let mut cache = self.0.lock().await;
        if let Some((at, text)) = cache.get(&key) {
            if fresh(*at) {
                return Ok(text.clone());
            }
        }
        let text = exposition(store, config, scope, now).await?;
        // Scopes come and go with tokens; keep the map from growing without end.
        cache.retain(|_, (at, _)| fresh(*at));
        cache.insert(key, (now, text.clone()));
        Ok(text)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CostMetricsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("encoding the gauges: {0}")]
    Encode(#[from] prometheus::Error),
}

/// The gauges as `scope` sees them at `now`, in the Prometheus text format.
pub async fn exposition(
    store: &dyn Store,
    config: &Config,
    scope: &Scope,
    now: i64,
) -> Result<String, CostMetricsError> {
    let schema = &config.owners;
    let (month_from, month_to) = month_of(now);
    // Complete hours only: the hour under way is rolled up as its windows arrive, so its cost
    // grows through the hour.
    let recent_to = hour_floor(now);
    let recent_from = recent_to - RECENT_HOURS * HOUR_MS;
    let (month, recent, open, budgets) = tokio::try_join!(
        ledger::load(store, month_from, now, RollupGrain::Day),
        ledger::load(store, recent_from, recent_to, RollupGrain::Hour),
        store::alerts::open_incidents(store.db()),
        crate::budgets::for_month(store, (schema, scope), (month_from, month_to), now),
    )?;
    // A scoped reader sees the incidents whose GPUs are its teams' this month, as on the page
    // (from the month already read).
    let open = crate::incidents::within_scope(open, &month, (scope, schema));
    let dimensions = config.metrics.dimensions(schema);
    let team = schema.role(Role::Team);
    let latest = latest_hour(&recent);
    let g = gauges(
        &scope.restrict(month, schema),
        (&scope.restrict(recent, schema), latest),
        &Shape {
            dimensions: &dimensions,
            team_dimension: team,
            max_series: config.metrics.max_series,
        },
    );
    let mut incidents: BTreeMap<(String, String), f64> = BTreeMap::new();
    for i in &open {
        *incidents
            .entry((i.cluster.clone(), i.kind.clone()))
            .or_default() += 1.0;
    }
    let budgets: Vec<Budget> = budgets
        .iter()
        .map(|b| Budget {
            dimension: b.dimension.clone(),
            key: b.key.clone(),
            currency: b.currency.clone(),
            amount: b.amount,
            spent: b.forecast.spent,
            forecast: b.forecast.expected,
        })
        .collect();
    render(
        &g,
        &Labels {
            dimensions: &dimensions,
            team: team.unwrap_or("team"),
            per_gpu: config.metrics.per_gpu,
            whole_bill: scope.is_all(),
        },
        &incidents,
        &budgets,
    )
}

struct Budget {
    dimension: String,
    key: String,
    currency: String,
    amount: Decimal,
    spent: Decimal,
    forecast: Decimal,
}

struct Labels<'a> {
    dimensions: &'a [String],
    team: &'a str,
    per_gpu: bool,
    /// Bill lines outside GPU hosts are the whole bill's: shown to readers of every team only.
    whole_bill: bool,
}

fn gauge(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<GaugeVec, prometheus::Error> {
    let g = GaugeVec::new(Opts::new(name, help).namespace("gpuledger"), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

/// Money as Prometheus carries every value: a float, converted once here from the exact sum.
fn float(d: Decimal) -> f64 {
    d.to_f64().unwrap_or(0.0)
}

fn render(
    g: &CostGauges,
    labels: &Labels,
    incidents: &BTreeMap<(String, String), f64>,
    budgets: &[Budget],
) -> Result<String, CostMetricsError> {
    let registry = Registry::new();
    let mut owner_labels: Vec<&str> = vec!["cluster"];
    owner_labels.extend(labels.dimensions.iter().map(String::as_str));
    owner_labels.extend(["state", "currency"]);
    let month = gauge(
        &registry,
        "cost_month_to_date",
        "Cost this calendar month (UTC) so far, from the hourly ledger, per cluster, owner and \
         state (used, held_idle, idle, unmonitored)",
        &owner_labels,
    )?;
    let hour = gauge(
        &registry,
        "cost_per_hour",
        "Cost of the latest hour the ledger holds, per cluster, owner and state",
        &owner_labels,
    )?;
    for o in &g.owners {
        let mut values: Vec<&str> = vec![&o.labels.cluster];
        values.extend(o.labels.values.iter().map(String::as_str));
        values.extend([o.labels.state.as_str(), &o.labels.currency]);
        month.with_label_values(&values).set(float(o.month_to_date));
        hour.with_label_values(&values).set(float(o.last_hour));
    }
    if let Some(ms) = g.last_hour_ms {
        gauge(
            &registry,
            "ledger_latest_hour_timestamp_seconds",
            "Start of the latest hour the ledger holds: how fresh cost_per_hour is",
            &[],
        )?
        .with_label_values(&[] as &[&str])
        .set(ms as f64 / 1000.0);
    }
    if labels.per_gpu {
        let gpu = gauge(
            &registry,
            "gpu_cost_per_hour",
            "Cost of one GPU or MIG instance in the latest ledger hour (labels as dcgm-exporter's)",
            &["UUID", "Hostname", "cluster", "currency"],
        )?;
        for c in &g.gpus {
            gpu.with_label_values(&[&c.uuid, &c.hostname, &c.cluster, &c.currency])
                .set(float(c.last_hour));
        }
    }
    let states = gauge(
        &registry,
        "gpus",
        "GPUs in each state over the latest ledger hour (GPU-seconds / 3600), per cluster and team",
        &["cluster", labels.team, "state"],
    )?;
    for s in &g.gpu_states {
        states
            .with_label_values(&[&s.cluster, &s.team, s.state.as_str()])
            .set(s.gpus);
    }
    if labels.whole_bill {
        let outside = gauge(
            &registry,
            "bill_outside_gpu_hosts_month_to_date",
            "Cost this month on bill lines of no GPU host: in the bill's total, owned by nobody",
            &["currency"],
        )?;
        for (currency, cost) in &g.outside_gpu_hosts {
            outside.with_label_values(&[currency]).set(float(*cost));
        }
    }
    let open = gauge(
        &registry,
        "incidents_open",
        "Idle incidents open now, per cluster and kind",
        &["cluster", "kind"],
    )?;
    for ((cluster, kind), n) in incidents {
        open.with_label_values(&[cluster, kind]).set(*n);
    }
    let budget_labels = ["dimension", "owner", "currency"];
    let amount = gauge(
        &registry,
        "budget",
        "This month's budget per owner",
        &budget_labels,
    )?;
    let spent = gauge(
        &registry,
        "budget_spent",
        "Spent this month against the owner's budget",
        &budget_labels,
    )?;
    let forecast = gauge(
        &registry,
        "budget_forecast",
        "The month's expected total against the owner's budget",
        &budget_labels,
    )?;
    for b in budgets {
        let l = [b.dimension.as_str(), &b.key, &b.currency];
        amount.with_label_values(&l).set(float(b.amount));
        spent.with_label_values(&l).set(float(b.spent));
        forecast.with_label_values(&l).set(float(b.forecast));
    }
    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}
