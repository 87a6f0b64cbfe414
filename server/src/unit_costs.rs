//! Cost per unit of work: what 1,000 requests and 1M tokens of an endpoint cost (from the
//! request and token counts that serving code posts), and what each training run cost (a run is one value of the
//! dimension with the experiment role).

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::Serialize;

use gpuledger_core::allocation::group;
use gpuledger_core::allocation::key_str;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::allocation::Step;

use crate::store::tokens::Refusal;
use crate::store::tokens::RefusalKind;
use crate::store::tokens::TokenRow;
use crate::store::usage::RunProgress;
use crate::store::usage::UsageCount;
use crate::store::{self, Store, StoreError};
use gpuledger_core::attribution::Attribution;
use gpuledger_core::attribution::Kind;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::rfc3339;
use gpuledger_core::time::HOUR_MS;

/// Stores a source's request counts (each replaces that source's count of the same endpoint and
/// start) and runs' progress, together; a refusal when one belongs to another token, or names
/// an endpoint or experiment that is not the token's ([`owner_not_of_token`]).
pub async fn record_counts(
    store: &dyn Store,
    schema: &OwnerSchema,
    source: &str,
    (counts, progress): (&[UsageCount], &[RunProgress]),
    token: &TokenRow,
    now_ms: i64,
) -> Result<Option<Refusal>, StoreError> {
    if let Some(refusal) = owner_not_of_token(store, schema, (counts, progress), token).await? {
        return Ok(Some(refusal));
    }
    store::usage::record(store.db(), source, (counts, progress), token.id, now_ms).await
}

/// The first count or progress report naming an owner the token may not post for, as a
/// refusal (403, the field named). A token may post for an endpoint or experiment that had a
/// process on one of its hosts from the day before the post's first period to its last (the
/// hourly ledger trails the agents by a roll-up, so a day's slack), and for one an admin bound
/// to it (`token bind`). Otherwise one agent token could add requests to any team's endpoint and
/// make its cost per request look as low as it liked.
pub async fn owner_not_of_token(
    store: &dyn Store,
    schema: &OwnerSchema,
    (counts, progress): (&[UsageCount], &[RunProgress]),
    token: &TokenRow,
) -> Result<Option<Refusal>, StoreError> {
    let endpoints = owners_of_token(
        (store, schema, token),
        Role::Endpoint,
        counts
            .iter()
            .map(|c| (c.endpoint.as_str(), c.start_ms, c.end_ms))
            .collect(),
    )
    .await?;
    let refusal = |field: String, role: Role, name: &str| Refusal {
        kind: RefusalKind::OwnerNotOfToken,
        field,
        message: format!(
            "{} {name:?} ran on none of token {:?}'s hosts from the day before this period \
             to its end (as the hourly ledger has them), and no admin bound it to the token; \
             post with the token of the hosts that run it, or have an admin run \
             `gpuledger-server token bind {} --{} {name}`",
            role.as_str(),
            token.name,
            token.name,
            role.as_str()
        ),
    };
    if let Some((i, c)) = counts
        .iter()
        .enumerate()
        .find(|(_, c)| !endpoints.contains(&c.endpoint))
    {
        return Ok(Some(refusal(
            format!("counts[{i}].endpoint"),
            Role::Endpoint,
            &c.endpoint,
        )));
    }
    let experiments = owners_of_token(
        (store, schema, token),
        Role::Experiment,
        progress
            .iter()
            .map(|p| (p.experiment.as_str(), p.at_ms, p.at_ms + 1))
            .collect(),
    )
    .await?;
    if let Some((i, p)) = progress
        .iter()
        .enumerate()
        .find(|(_, p)| !experiments.contains(&p.experiment))
    {
        return Ok(Some(refusal(
            format!("progress[{i}].experiment"),
            Role::Experiment,
            &p.experiment,
        )));
    }
    Ok(None)
}

/// Of the owners of `role` named (each with the period it was named for), those the token may
/// post for.
async fn owners_of_token(
    (store, schema, token): (&dyn Store, &OwnerSchema, &TokenRow),
    role: Role,
    names: Vec<(&str, i64, i64)>,
) -> Result<std::collections::HashSet<String>, StoreError> {
    let (Some(from), Some(to)) = (
        names.iter().map(|n| n.1).min(),
        names.iter().map(|n| n.2).max(),
    ) else {
        return Ok(Default::default());
    };
    let mut distinct: Vec<&str> = names.iter().map(|n| n.0).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let owners = store::usage::NamedOwners {
        role: role.as_str(),
        dimension: schema.role(role),
        days: (
            gpuledger_core::time::day_floor(from) - gpuledger_core::time::DAY_MS,
            to,
        ),
    };
    store::usage::owners_of_token(store.db(), token.id, owners, &distinct).await
}

/// Each run's steps and epochs in `[from_ms, to_ms)` ([`store::usage::progress_totals`]).
pub async fn progress_totals(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, i64, Option<i64>)>, StoreError> {
    store::usage::progress_totals(store.db(), from_ms, to_ms).await
}

/// Adds to each run the steps (and epochs) it reported in the range and what 1,000 steps (and
/// an epoch) cost: the run's cost in the range over the progress it made in it.
pub fn with_progress(runs: &mut [TrainingRun], progress: &[(String, i64, Option<i64>)]) {
    let per = |cost: Decimal, n: i64, unit: i64| {
        (n > 0).then(|| {
            (cost * Decimal::from(unit) / Decimal::from(n))
                .round_dp(gpuledger_core::money::MAX_SCALE)
        })
    };
    for run in runs.iter_mut() {
        let Some((_, steps, epochs)) = progress.iter().find(|(e, _, _)| *e == run.experiment)
        else {
            continue;
        };
        run.steps = Some(*steps);
        run.cost_per_1k_steps = per(run.cost, *steps, 1_000);
        run.epochs = *epochs;
        run.cost_per_epoch = epochs.and_then(|e| per(run.cost, e, 1));
    }
}

/// What each endpoint's requests in `[from_ms, to_ms)` cost, from `a`, the same range's
/// attribution.
pub async fn endpoint_costs_in(
    store: &dyn Store,
    a: &Attribution,
    (from_ms, to_ms): (i64, i64),
    (schema, scope): (&OwnerSchema, &Scope),
) -> Result<Vec<EndpointUnitCost>, StoreError> {
    let requests = store::usage::usage_totals(store.db(), from_ms, to_ms).await?;
    let tokens = token_totals(store, from_ms, to_ms).await?;
    let mut rows = if scope.is_all() {
        endpoint_costs(a, &requests, schema)
    } else {
        // A team-scoped reader: the endpoints wholly its teams', from its part of the ledger.
        let held = requests_of_held_endpoints(a, requests, (schema, scope));
        endpoint_costs(&scope.restrict(a.clone(), schema), &held, schema)
    };
    with_tokens(&mut rows, &tokens);
    let sources = usage_sources(store, from_ms, to_ms).await?;
    with_sources(&mut rows, &sources);
    Ok(rows)
}

/// Names who counted each row's requests (rows with counts the reader may see).
pub fn with_sources(rows: &mut [EndpointUnitCost], sources: &[(String, String)]) {
    for row in rows.iter_mut().filter(|r| r.requests.is_some()) {
        row.counted_by = sources
            .iter()
            .filter(|(e, _)| *e == row.endpoint)
            .map(|(_, s)| s.clone())
            .collect();
    }
}

/// Input and output tokens per endpoint in `[from_ms, to_ms)`, each where every count of the
/// endpoint carries it ([`store::usage::token_totals`]).
pub async fn token_totals(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, Option<i64>, Option<i64>)>, StoreError> {
    store::usage::token_totals(store.db(), from_ms, to_ms).await
}

/// Adds the tokens and the cost per 1M tokens to the rows that have request counts: the
/// endpoints whose traffic the reader may see (a scoped reader's rows of shared endpoints have
/// none, so get no tokens either).
pub fn with_tokens(rows: &mut [EndpointUnitCost], tokens: &[(String, Option<i64>, Option<i64>)]) {
    let per_million = |cost: Decimal, n: i64| {
        (n > 0).then(|| {
            (cost * Decimal::from(1_000_000) / Decimal::from(n))
                .round_dp(gpuledger_core::money::MAX_SCALE)
        })
    };
    for row in rows.iter_mut().filter(|r| r.requests.is_some()) {
        let Some((_, input, output)) = tokens.iter().find(|(e, _, _)| *e == row.endpoint) else {
            continue;
        };
        row.input_tokens = *input;
        row.output_tokens = *output;
        row.cost_per_1m_tokens = input
            .zip(*output)
            .and_then(|(i, o)| per_million(row.cost, i.saturating_add(o)));
        row.cost_per_1m_output_tokens = output.and_then(|o| per_million(row.cost, o));
    }
}

/// The request counts of the endpoints wholly the scope's teams' in `a` (every count for
/// every team): a scoped reader never sees another team's traffic.
pub fn requests_of_held_endpoints(
    a: &Attribution,
    requests: Vec<(String, i64)>,
    (schema, scope): (&OwnerSchema, &Scope),
) -> Vec<(String, i64)> {
    let held = GroupBy::role(schema, Role::Endpoint).map(|by| scope.held_keys(a, by, schema));
    match held {
        None if !scope.is_all() => Vec::new(),
        None | Some(None) => requests,
        Some(Some(keys)) => requests
            .into_iter()
            .filter(|(endpoint, _)| keys.contains(endpoint))
            .collect(),
    }
}

/// The currency the unit costs are in: the one the month's pages show (costs in different
/// currencies are never added together).
pub fn main_currency(a: &Attribution) -> String {
    gpuledger_core::allocation::main_currency(a)
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EndpointUnitCost {
    pub endpoint: String,
    pub currency: String,
    pub requests: Option<i64>,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    /// `cost` × 1000 / `requests`, exact to the micro-unit; absent without a request count.
    #[serde(with = "rust_decimal::serde::str_option")]
    pub cost_per_1k_requests: Option<Decimal>,
    /// Tokens read and generated, where every count of the endpoint in the range carries them.
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    /// `cost` × 1M / (`input_tokens` + `output_tokens`): what a million tokens in and out cost.
    #[serde(with = "rust_decimal::serde::str_option")]
    pub cost_per_1m_tokens: Option<Decimal>,
    /// `cost` × 1M / `output_tokens`: the whole cost per million generated (decode, not
    /// prefill, is what holds a serving GPU).
    #[serde(with = "rust_decimal::serde::str_option")]
    pub cost_per_1m_output_tokens: Option<Decimal>,
    pub gpu_hours: f64,
    /// Who counted its requests and tokens: `posted` (serving code, `POST /api/v1/usage`) and
    /// each serving engine the agents read (`vllm`, `tgi`, `triton`). Counted both ways, the
    /// work is counted twice and each unit looks half its cost: pick one.
    pub counted_by: Vec<String>,
}

impl EndpointUnitCost {
    /// Whether serving code posted counts and agents also read an engine for it.
    pub fn counted_twice(&self) -> bool {
        self.counted_by.iter().any(|s| s == "posted") && self.counted_by.len() > 1
    }
}

fn blank(endpoint: &str, currency: &str) -> EndpointUnitCost {
    EndpointUnitCost {
        endpoint: endpoint.to_owned(),
        currency: currency.to_owned(),
        requests: None,
        cost: Decimal::ZERO,
        cost_per_1k_requests: None,
        input_tokens: None,
        output_tokens: None,
        cost_per_1m_tokens: None,
        cost_per_1m_output_tokens: None,
        gpu_hours: 0.0,
        counted_by: Vec::new(),
    }
}

/// Every endpoint with cost or requests in the range, costliest first.
/// Endpoints are the values of the dimension with the endpoint role in `schema`.
pub fn endpoint_costs(
    a: &Attribution,
    requests: &[(String, i64)],
    schema: &OwnerSchema,
) -> Vec<EndpointUnitCost> {
    let currency = main_currency(a);
    let mut out: BTreeMap<String, EndpointUnitCost> = BTreeMap::new();
    let rows = GroupBy::role(schema, Role::Endpoint).map_or_else(Vec::new, |by| {
        group(a, by, Step::Month, &gpuledger_core::carbon::Grid::unknown())
    });
    for row in rows {
        if row.currency != currency || row.key.starts_with('(') {
            continue;
        }
        let e = out
            .entry(row.key.clone())
            .or_insert_with(|| blank(&row.key, &currency));
        e.cost += row.cost;
        e.gpu_hours += row.gpu_hours;
    }
    for (endpoint, n) in requests {
        let e = out
            .entry(endpoint.clone())
            .or_insert_with(|| blank(endpoint, &currency));
        e.requests = Some(e.requests.unwrap_or(0) + n);
    }
    let mut rows: Vec<EndpointUnitCost> = out
        .into_values()
        .map(|mut e| {
            e.cost_per_1k_requests = e.requests.filter(|n| *n > 0).map(|n| {
                (e.cost * Decimal::from(1000) / Decimal::from(n))
                    .round_dp(gpuledger_core::money::MAX_SCALE)
            });
            e
        })
        .collect();
    rows.sort_by(|x, y| y.cost.cmp(&x.cost).then(x.endpoint.cmp(&y.endpoint)));
    rows
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TrainingRun {
    pub experiment: String,
    /// The model and team that carried most of the run's cost.
    pub model: Option<String>,
    pub team: Option<String>,
    pub currency: String,
    /// First and last hour with GPU time in the range (RFC 3339).
    pub started: String,
    pub last_seen: String,
    pub hours_active: i64,
    pub gpu_hours: f64,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub held_idle_cost: Decimal,
    pub estimated: bool,
    /// Optimizer steps the run reported making in the range (`POST /api/v1/usage`,
    /// `progress`), where it reports them.
    pub steps: Option<i64>,
    /// `cost` × 1000 / `steps`.
    #[serde(with = "rust_decimal::serde::str_option")]
    pub cost_per_1k_steps: Option<Decimal>,
    /// Whole epochs it reported finishing in the range.
    pub epochs: Option<i64>,
    /// `cost` / `epochs`.
    #[serde(with = "rust_decimal::serde::str_option")]
    pub cost_per_epoch: Option<Decimal>,
}

/// When a run had GPU work, for runs read from daily rows (see [`training_runs_by_day`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunHours {
    pub first_hour_ms: i64,
    pub last_hour_ms: i64,
    pub hours: i64,
}

/// One row per experiment label in the range (its GPU work, busy or held idle), costliest first.
/// Only real runs: an experiment that never did work (a notebook holding GPUs idle all along)
/// is held-idle waste, not a training run, and would skew what a run costs on average.
/// `a` holds hourly parts.
pub fn training_runs(a: &Attribution, schema: &OwnerSchema) -> Vec<TrainingRun> {
    runs_of(a, None, schema)
}

/// [`training_runs`] from daily parts: a day part cannot say in which hours the run was active,
/// so that comes from `hours` (the daily rollup's experiment hours).
pub fn training_runs_by_day(
    a: &Attribution,
    hours: &std::collections::HashMap<String, RunHours>,
    schema: &OwnerSchema,
) -> Vec<TrainingRun> {
    runs_of(a, Some(hours), schema)
}

/// A run is one value of the dimension with the experiment role; its model and team those of
/// the dimensions with those roles.
fn runs_of<'a>(
    a: &'a Attribution,
    run_hours: Option<&std::collections::HashMap<String, RunHours>>,
    schema: &OwnerSchema,
) -> Vec<TrainingRun> {
    let model_by = GroupBy::role(schema, Role::Model);
    let team_by = GroupBy::role(schema, Role::Team);
    let currency = main_currency(a);
    struct Acc<'a> {
        first: i64,
        last: i64,
        hours: std::collections::BTreeSet<i64>,
        gpu_seconds: f64,
        cost: Decimal,
        held: Decimal,
        /// GPU time doing work: a run has some.
        used_seconds: f64,
        estimated: bool,
        models: BTreeMap<&'a str, Decimal>,
        teams: BTreeMap<&'a str, Decimal>,
    }
    // Keys borrowed from the parts: a month of a large fleet has a part per host and owner.
    let mut runs: BTreeMap<&str, Acc<'a>> = BTreeMap::new();
    for p in &a.parts {
        if p.currency != currency || !matches!(p.kind, Kind::Used | Kind::HeldIdle) {
            continue;
        }
        let Some(experiment) = schema.value(&p.owner, Role::Experiment) else {
            continue;
        };
        let r = runs.entry(experiment).or_insert_with(|| Acc {
            first: p.hour_ms,
            last: p.hour_ms,
            hours: Default::default(),
            gpu_seconds: 0.0,
            cost: Decimal::ZERO,
            held: Decimal::ZERO,
            used_seconds: 0.0,
            estimated: false,
            models: BTreeMap::new(),
            teams: BTreeMap::new(),
        });
        r.first = r.first.min(p.hour_ms);
        r.last = r.last.max(p.hour_ms);
        r.hours.insert(p.hour_ms);
        r.gpu_seconds += p.gpu_seconds;
        r.cost += p.cost;
        if p.kind == Kind::HeldIdle {
            r.held += p.cost;
        } else {
            r.used_seconds += p.gpu_seconds;
        }
        r.estimated |= p.estimated;
        if let Some(by) = model_by {
            *r.models.entry(key_str(p, by, a)).or_default() += p.cost;
        }
        if let Some(by) = team_by {
            *r.teams.entry(key_str(p, by, a)).or_default() += p.cost;
        }
    }
    let top = |m: &BTreeMap<&str, Decimal>| {
        m.iter()
            .filter(|(k, _)| !k.starts_with('('))
            .max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(x.0)))
            .map(|(k, _)| (*k).to_owned())
    };
    let mut rows: Vec<TrainingRun> = runs
        .into_iter()
        .filter(|(_, r)| r.used_seconds > 0.0)
        .map(|(experiment, r)| {
            let (first, last, hours) = match run_hours.and_then(|h| h.get(experiment)) {
                Some(h) => (h.first_hour_ms, h.last_hour_ms, h.hours),
                None => (r.first, r.last, r.hours.len() as i64),
            };
            (experiment, r, first, last, hours)
        })
        .map(|(experiment, r, first, last, hours)| TrainingRun {
            model: top(&r.models),
            team: top(&r.teams),
            currency: currency.clone(),
            started: rfc3339(first),
            last_seen: rfc3339(last + HOUR_MS),
            hours_active: hours,
            gpu_hours: r.gpu_seconds / 3600.0,
            cost: r.cost,
            held_idle_cost: r.held,
            estimated: r.estimated,
            experiment: experiment.to_owned(),
            steps: None,
            cost_per_1k_steps: None,
            epochs: None,
            cost_per_epoch: None,
        })
        .collect();
    rows.sort_by(|x, y| y.cost.cmp(&x.cost).then(x.experiment.cmp(&y.experiment)));
    rows
}

pub fn endpoint_costs_csv(rows: &[EndpointUnitCost]) -> Result<String, csv::Error> {
    let mut w = crate::csv_out::SafeCsv::in_memory();
    w.write_record([
        "endpoint",
        "currency",
        "requests",
        "cost",
        "cost_per_1k_requests",
        "input_tokens",
        "output_tokens",
        "cost_per_1m_tokens",
        "cost_per_1m_output_tokens",
        "gpu_hours",
        "counted_by",
    ])?;
    for r in rows {
        w.write_record([
            r.endpoint.clone(),
            r.currency.clone(),
            r.requests.map(|n| n.to_string()).unwrap_or_default(),
            r.cost.to_string(),
            r.cost_per_1k_requests
                .map(|c| c.to_string())
                .unwrap_or_default(),
            r.input_tokens.map(|n| n.to_string()).unwrap_or_default(),
            r.output_tokens.map(|n| n.to_string()).unwrap_or_default(),
            r.cost_per_1m_tokens
                .map(|c| c.to_string())
                .unwrap_or_default(),
            r.cost_per_1m_output_tokens
                .map(|c| c.to_string())
                .unwrap_or_default(),
            format!("{:.4}", r.gpu_hours),
            r.counted_by.join(" "),
        ])?;
    }
    w.into_string()
}

pub fn training_runs_csv(rows: &[TrainingRun]) -> Result<String, csv::Error> {
    let mut w = crate::csv_out::SafeCsv::in_memory();
    w.write_record([
        "experiment",
        "model",
        "team",
        "currency",
        "started",
        "last_seen",
        "hours_active",
        "gpu_hours",
        "cost",
        "held_idle_cost",
        "estimated",
        "steps",
        "cost_per_1k_steps",
        "epochs",
        "cost_per_epoch",
    ])?;
    for r in rows {
        w.write_record([
            r.experiment.clone(),
            r.model.clone().unwrap_or_default(),
            r.team.clone().unwrap_or_default(),
            r.currency.clone(),
            r.started.clone(),
            r.last_seen.clone(),
            r.hours_active.to_string(),
            format!("{:.4}", r.gpu_hours),
            r.cost.to_string(),
            r.held_idle_cost.to_string(),
            r.estimated.to_string(),
            r.steps.map(|n| n.to_string()).unwrap_or_default(),
            r.cost_per_1k_steps
                .map(|c| c.to_string())
                .unwrap_or_default(),
            r.epochs.map(|n| n.to_string()).unwrap_or_default(),
            r.cost_per_epoch.map(|c| c.to_string()).unwrap_or_default(),
        ])?;
    }
    w.into_string()
}

/// Who counted each endpoint in `[from_ms, to_ms)` ([`store::usage::usage_sources`]).
pub async fn usage_sources(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, String)>, StoreError> {
    store::usage::usage_sources(store.db(), from_ms, to_ms).await
}

/// Requests per endpoint in `[from_ms, to_ms)`, summed over sources.
pub async fn request_totals(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, i64)>, StoreError> {
    store::usage::usage_totals(store.db(), from_ms, to_ms).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_core::attribution::Part;
    use std::collections::HashMap;

    fn part(
        hour: i64,
        endpoint: Option<&str>,
        experiment: Option<&str>,
        kind: Kind,
        cost: &str,
    ) -> Part {
        Part {
            hour_ms: hour * HOUR_MS,
            host_id: 1,
            gpu_uuid: Some("GPU-1".into()),
            owner: [
                ("model", Some("m")),
                ("experiment", experiment),
                ("endpoint", endpoint),
                ("team", Some("t")),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect(),
            kind,
            pricing_category: "on_demand".into(),
            currency: "USD".into(),
            cost: cost.parse().unwrap(),
            estimated: false,
            gpu_seconds: 1800.0,
            util_gpu_seconds: 0.0,
            util_known_seconds: 0.0,
            energy_j: 0.0,
            energy_known_seconds: 0.0,
        }
    }

    fn attribution(parts: Vec<Part>) -> Attribution {
        Attribution {
            parts,
            unattributed: BTreeMap::new(),
            unattributed_hours: BTreeMap::new(),
            hosts: HashMap::new(),
        }
    }

    #[test]
    fn cost_per_thousand_requests_is_exact() {
        let a = attribution(vec![
            part(0, Some("chat"), None, Kind::Used, "10.00"),
            part(1, Some("chat"), None, Kind::HeldIdle, "2.00"),
            part(0, Some("embed"), None, Kind::Used, "1.00"),
            part(0, None, None, Kind::Idle, "5.00"),
        ]);
        let rows = endpoint_costs(
            &a,
            &[("chat".into(), 3_000), ("search".into(), 10)],
            &OwnerSchema::default(),
        );
        let chat = &rows[0];
        assert_eq!(
            (chat.endpoint.as_str(), chat.cost),
            ("chat", "12.00".parse().unwrap())
        );
        assert_eq!(chat.cost_per_1k_requests, Some("4".parse().unwrap()));
        assert_eq!(chat.gpu_hours, 1.0);
        // Cost without counts, and counts without cost, are both shown for what they are.
        let embed = rows.iter().find(|r| r.endpoint == "embed").unwrap();
        assert_eq!((embed.requests, embed.cost_per_1k_requests), (None, None));
        let search = rows.iter().find(|r| r.endpoint == "search").unwrap();
        assert_eq!(search.cost_per_1k_requests, Some(Decimal::ZERO));
        assert!(
            rows.iter().all(|r| !r.endpoint.starts_with('(')),
            "no idle key"
        );
    }

    #[test]
    fn a_run_is_an_experiment_with_its_span_and_cost() {
        let a = attribution(vec![
            part(5, None, Some("run-7"), Kind::Used, "3.50"),
            part(7, None, Some("run-7"), Kind::HeldIdle, "0.50"),
            part(6, None, Some("run-8"), Kind::Used, "9.00"),
            part(6, None, None, Kind::Used, "1.00"),
            // A notebook that held its GPU idle all along is no run.
            part(5, None, Some("notebook"), Kind::HeldIdle, "40.00"),
            part(6, None, Some("notebook"), Kind::HeldIdle, "40.00"),
        ]);
        let runs = training_runs(&a, &gpuledger_core::owners::OwnerSchema::default());
        assert_eq!(runs.len(), 2, "{runs:?}");
        assert_eq!(runs[0].experiment, "run-8");
        let r7 = &runs[1];
        assert_eq!(r7.cost, "4.00".parse().unwrap());
        assert_eq!(r7.held_idle_cost, "0.50".parse().unwrap());
        assert_eq!(r7.hours_active, 2);
        assert_eq!(r7.started, rfc3339(5 * HOUR_MS));
        assert_eq!(r7.last_seen, rfc3339(8 * HOUR_MS));
        assert_eq!(r7.model.as_deref(), Some("m"));
    }

    #[test]
    fn cost_per_million_tokens_is_exact_and_only_for_counted_endpoints() {
        let row = |endpoint: &str, cost: &str, requests: Option<i64>| EndpointUnitCost {
            cost: cost.parse().unwrap(),
            requests,
            ..blank(endpoint, "USD")
        };
        let mut rows = vec![
            row("chat", "100", Some(1_000)),
            row("embed", "3", Some(50)),
            // A scoped reader's row of a shared endpoint: no counts, so no tokens either.
            row("shared", "40", None),
        ];
        let tokens = vec![
            ("chat".to_owned(), Some(3_000_000), Some(1_000_000)),
            ("embed".to_owned(), Some(7_000_000), Some(0)),
            ("shared".to_owned(), Some(1), Some(1)),
        ];
        with_tokens(&mut rows, &tokens);
        let d = |s: &str| s.parse::<Decimal>().unwrap();
        assert_eq!(rows[0].cost_per_1m_tokens, Some(d("25")));
        assert_eq!(rows[0].cost_per_1m_output_tokens, Some(d("100")));
        // 3 × 1M / 7M, exact to the last digit money keeps.
        assert_eq!(rows[1].cost_per_1m_tokens, Some(d("0.428571428571428571")));
        assert_eq!(
            rows[1].cost_per_1m_output_tokens, None,
            "no output: no price per output"
        );
        assert_eq!(rows[2].input_tokens, None);
        assert_eq!(rows[2].cost_per_1m_tokens, None);
        let csv = endpoint_costs_csv(&rows).unwrap();
        let chat = csv.lines().find(|l| l.starts_with("chat,")).unwrap();
        assert!(chat.contains(",3000000,1000000,25,100,"), "{csv}");
        let shared = csv.lines().find(|l| l.starts_with("shared,")).unwrap();
        assert!(shared.contains(",,,,,"), "unknown cells are empty: {csv}");
    }
}
