//! A simulated fleet for `gpuledger-server demo`: a few clusters of hosts whose windows go
//! through the same validation and ingest code as real agent reports.

use std::collections::BTreeMap;

use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};

use rust_decimal::Decimal;

use crate::store;
use crate::store::{AgentStatus, Store, StoreError};
use crate::validate::{self, Limits};
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::time::month_start_ms;

mod bill;

const GIB: u64 = 1024 * 1024 * 1024;
use gpuledger_core::time::{DAY_MS, HOUR_MS};

struct HostSpec {
    cluster: &'static str,
    hostname: String,
    instance_type: &'static str,
    gpu_name: &'static str,
    gpu_mem: u64,
    gpus: u32,
    workload: Workload,
    /// on_demand or spot.
    lifecycle: &'static str,
}

#[derive(Clone, Copy)]
enum Workload {
    /// A training run keeping every GPU busy.
    Training(&'static str, &'static str),
    /// An inference endpoint following the day: busy by day, quiet at night.
    Inference(&'static str, &'static str),
    /// A notebook holding memory and doing nothing.
    HeldIdle(&'static str),
    /// Nothing at all.
    Idle,
}

fn fleet() -> Vec<HostSpec> {
    let mut hosts = Vec::new();
    for i in 0..8 {
        hosts.push(HostSpec {
            cluster: "train-east",
            hostname: format!("train-east-{i:02}"),
            instance_type: "p4d.24xlarge",
            gpu_name: "NVIDIA A100-SXM4-80GB",
            gpu_mem: 80 * GIB,
            gpus: 8,
            workload: if i < 6 {
                Workload::Training("llama-70b-ft", "exp-lr-sweep")
            } else {
                Workload::HeldIdle("research")
            },
            lifecycle: "on_demand",
        });
    }
    for i in 0..6 {
        hosts.push(HostSpec {
            cluster: "serve-west",
            hostname: format!("serve-west-{i:02}"),
            instance_type: "g5.12xlarge",
            gpu_name: "NVIDIA A10G",
            gpu_mem: 24 * GIB,
            gpus: 4,
            workload: Workload::Inference("chat-api", "mistral-7b"),
            lifecycle: if i >= 4 { "spot" } else { "on_demand" },
        });
    }
    for i in 0..4 {
        hosts.push(HostSpec {
            cluster: "serve-eu",
            hostname: format!("serve-eu-{i:02}"),
            instance_type: "g6.xlarge",
            gpu_name: "NVIDIA L4",
            gpu_mem: 24 * GIB,
            gpus: 1,
            workload: Workload::Inference("rerank", "bge-reranker"),
            lifecycle: "on_demand",
        });
    }
    hosts.push(HostSpec {
        cluster: "serve-west",
        hostname: "serve-west-big".into(),
        instance_type: "p4de.24xlarge",
        gpu_name: "NVIDIA A100-SXM4-80GB",
        gpu_mem: 80 * GIB,
        gpus: 8,
        workload: Workload::Inference("embeddings", "bge-large"),
        lifecycle: "on_demand",
    });
    for i in 0..2 {
        hosts.push(HostSpec {
            cluster: "scratch",
            hostname: format!("scratch-{i:02}"),
            instance_type: "p5.48xlarge",
            gpu_name: "NVIDIA H100 80GB HBM3",
            gpu_mem: 80 * GIB,
            gpus: 8,
            workload: Workload::Idle,
            lifecycle: "on_demand",
        });
    }
    hosts
}

/// Weekdays 08:00–20:00 UTC.
fn office_hours(t_ms: i64) -> bool {
    let hour = t_ms.rem_euclid(DAY_MS) / HOUR_MS;
    gpuledger_core::time::weekday(t_ms) < 5 && (8..20).contains(&hour)
}

/// A cheap deterministic wobble in [0, 1) so the demo looks alive but is reproducible.
fn wobble(seed: u64) -> f64 {
    let x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((x >> 33) % 1000) as f64 / 1000.0
}

/// The day the serving team borrowed the idle H100 cluster for a load test: the day before the
/// demo starts, so its spend spike is on the review and in Slack. It ends at midnight, or at
/// least two whole hours before the demo starts, so the cluster has been idle longer than any
/// idle duration and is an incident at once whatever the time of day.
fn load_test_day(now_ms: i64) -> (i64, i64) {
    let today = gpuledger_core::time::day_floor(now_ms);
    let quiet_from = now_ms - now_ms.rem_euclid(HOUR_MS) - 2 * HOUR_MS;
    (today - DAY_MS, today.min(quiet_from))
}

/// What a host runs at `t_ms`: its own workload, but serving's load test on the idle cluster's
/// hosts during `load_test`.
fn workload_at(spec: &HostSpec, t_ms: i64, load_test: Option<(i64, i64)>) -> Workload {
    match (spec.workload, load_test) {
        (Workload::Idle, Some((from, to))) if (from..to).contains(&t_ms) => {
            Workload::Inference("chat-api", "mistral-7b")
        }
        (w, _) => w,
    }
}

fn gpu_window(
    spec: &HostSpec,
    g: u32,
    t_ms: i64,
    len_ms: i64,
    load_test: Option<(i64, i64)>,
) -> GpuWindow {
    let seed = (t_ms as u64 / 1000) ^ (u64::from(g) << 40) ^ spec.hostname.len() as u64;
    let hour = (t_ms / 3_600_000) % 24;
    let workload = workload_at(spec, t_ms, load_test);
    let (util, mem, proc_labels): (f64, u64, Option<BTreeMap<String, String>>) = match workload {
        Workload::Training(model, exp) => (
            85.0 + 10.0 * wobble(seed),
            spec.gpu_mem * 9 / 10,
            Some(BTreeMap::from([
                ("model".into(), model.into()),
                // A new sweep each week.
                (
                    "experiment".into(),
                    format!("{exp}-{}", t_ms / (7 * DAY_MS) % 10),
                ),
                ("team".into(), "foundation".into()),
            ])),
        ),
        Workload::Inference(endpoint, model) => {
            let daytime = (8..20).contains(&hour);
            let base = if daytime { 55.0 } else { 12.0 };
            // The reranker serves the office only: nobody calls it at night or at weekends,
            // and it holds its GPU all the same (a scale-to-zero window).
            let quiet = endpoint == "rerank" && !office_hours(t_ms);
            (
                if quiet {
                    0.5 * wobble(seed)
                } else {
                    base + 15.0 * wobble(seed)
                },
                if spec.gpu_mem > 40 * GIB {
                    10 * GIB
                } else {
                    14 * GIB
                },
                Some(BTreeMap::from([
                    ("endpoint".into(), endpoint.into()),
                    ("model".into(), model.into()),
                    ("team".into(), "applied".into()),
                ])),
            )
        }
        Workload::HeldIdle(team) => (
            0.5 * wobble(seed),
            30 * GIB,
            Some(BTreeMap::from([
                ("team".into(), team.into()),
                ("experiment".into(), "notebook".into()),
            ])),
        ),
        Workload::Idle => (0.0, 0, None),
    };
    // Who runs each kind of work: service accounts for jobs, a person for the notebook.
    let user = match workload {
        Workload::Training(..) => "svc-train",
        Workload::Inference(..) => "svc-serve",
        _ => "maria",
    };
    let processes = proc_labels
        .map(|labels| {
            vec![ProcessWindow {
                pid: 10_000 + g,
                name: Some(
                    match workload {
                        Workload::HeldIdle(_) => "jupyter-kernel",
                        _ => "python3",
                    }
                    .into(),
                ),
                user: Some(user.into()),
                memory_used_max_bytes: Some(mem),
                sm_util_avg: Some((util - 2.0).max(0.0)),
                labels,
                ..Default::default()
            }]
        })
        .unwrap_or_default();
    let watts = 60.0 + 3.2 * util;
    GpuWindow {
        uuid: format!("GPU-demo-{}-{g}", spec.hostname),
        index: g,
        name: spec.gpu_name.into(),
        parent_uuid: None,
        memory_total_bytes: Some(spec.gpu_mem),
        memory_used_max_bytes: Some(mem),
        util_avg: Some(util),
        util_max: Some((util + 5.0).min(100.0)),
        util_histogram: Vec::new(),
        mem_util_avg: Some(util / 2.0),
        power_avg_watts: Some(watts),
        temperature_max_c: Some(35.0 + util / 3.0),
        energy_mj: Some((watts * len_ms as f64) as u64),
        processes,
        ..Default::default()
    }
}

/// The hourly price the demo's bill charges a host: the rate card's, at spot for spot hosts
/// and 40% off on-demand under a savings plan for the training cluster.
fn billed_hourly(
    spec: &HostSpec,
    card: &RateCard,
) -> (Decimal, &'static str, Option<&'static str>) {
    let rate = card.instance_types.get(spec.instance_type);
    let on_demand = rate.map_or(Decimal::ZERO, |r| r.on_demand);
    match spec.lifecycle {
        "spot" => (
            rate.and_then(|r| r.spot).unwrap_or(on_demand),
            "Dynamic",
            None,
        ),
        _ if spec.cluster == "train-east" => {
            (on_demand * Decimal::new(6, 1), "Committed", Some("Used"))
        }
        _ => (on_demand, "Standard", None),
    }
}

/// The demo bill's compute savings plan, covering the training cluster.
pub const DEMO_SAVINGS_PLAN: &str = "arn:aws:savingsplans::111122223333:savingsplan/demo-sp";

/// The demo bill's GPU instance that no agent reports.
pub const FORGOTTEN_INSTANCE: &str = "i-0f0e0d0c0b0a09080";

fn instance_id(spec: &HostSpec) -> String {
    format!(
        "i-0{:0>16x}",
        spec.hostname
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
    )
}

/// The demo's agent token of `cluster`, made the first time (`tokens` keeps them by cluster).
async fn demo_token<'a>(
    store: &dyn Store,
    cluster: &'a str,
    tokens: &mut std::collections::HashMap<&'a str, i64>,
    now_ms: i64,
) -> Result<i64, DemoError> {
    if let Some(&id) = tokens.get(cluster) {
        return Ok(id);
    }
    let name = format!("demo-{cluster}");
    let hash = crate::auth::hash_token(&crate::auth::generate_token());
    store::tokens::create_token(
        store.db(),
        &crate::store::tokens::NewToken::for_cluster(&name, &hash, cluster),
        now_ms,
    )
    .await?;
    let id = store::tokens::token_by_name(store.db(), &name)
        .await?
        .ok_or_else(|| DemoError::Invalid(format!("token {name} was not stored")))?
        .id;
    tokens.insert(cluster, id);
    Ok(id)
}

/// What a host's code counts in a window `[t, w_end)`: a training run's progress, or an
/// endpoint's requests and tokens (following its GPUs' load: a GPU held idle serves nobody).
fn usage_of_window(
    spec: &HostSpec,
    (t, w_end): (i64, i64),
    gpus: &[GpuWindow],
    load_test: (i64, i64),
) -> (Option<serde_json::Value>, Option<serde_json::Value>) {
    let mut progress = None;
    if let Workload::Training(_, exp) = workload_at(spec, t, Some(load_test)) {
        // The training code's progress: each week's sweep makes 1,200 optimizer steps an hour
        // (every rank reports the same step), an epoch each 50,000.
        let week = 7 * DAY_MS;
        let step = ((w_end - (t - t % week)) / HOUR_MS) * 1_200;
        progress = Some(serde_json::json!({
            "experiment": format!("{exp}-{}", t / week % 10),
            "at": gpuledger_core::time::rfc3339(w_end),
            "step": step,
            "epoch": step / 50_000,
        }));
    }
    let Workload::Inference(endpoint, _) = spec.workload else {
        return (None, progress);
    };
    // The serving code's request counter: requests follow the load.
    let per_util = if endpoint == "embeddings" {
        900.0
    } else {
        160.0
    };
    let busy: f64 = gpus
        .iter()
        .filter_map(|g| g.util_avg)
        .filter(|u| *u >= 1.0)
        .sum();
    let served = (busy * per_util) as u64;
    // And its token counters: chat prompts of about 600 tokens answered in about 250;
    // embeddings read about 300 and generate none.
    let (input, output) = if endpoint == "embeddings" {
        (300, 0)
    } else {
        (600, 250)
    };
    let counted = serde_json::json!({
        "endpoint": endpoint,
        "start": gpuledger_core::time::rfc3339(t),
        "end": gpuledger_core::time::rfc3339(w_end),
        "requests": served,
        "input_tokens": served * input,
        "output_tokens": served * output,
    });
    (Some(counted), progress)
}

/// Posts what a host's code counted, as serving and training code post it.
async fn post_usage(
    store: &dyn Store,
    source: &str,
    (requests, run_progress): (Vec<serde_json::Value>, Vec<serde_json::Value>),
    (token_id, limits): (i64, &Limits),
    now_ms: i64,
) -> Result<(), DemoError> {
    if requests.is_empty() && run_progress.is_empty() {
        return Ok(());
    }
    let body = serde_json::json!({
        "source": source, "counts": requests, "progress": run_progress
    });
    let (source, counts, run_progress) = crate::http::usage::parse(
        body.to_string().as_bytes(),
        now_ms,
        limits.retention_ms,
        limits.max_clock_skew_ms,
    )
    .map_err(|e| DemoError::Invalid(format!("usage counts: {e:?}")))?;
    if let Some(refusal) = store::usage::record(
        store.db(),
        &source,
        (&counts, &run_progress),
        token_id,
        now_ms,
    )
    .await?
    {
        return Err(DemoError::Invalid(refusal.message));
    }
    Ok(())
}

/// Fills `store` with the simulated fleet from the first day of the previous month until now,
/// in one-hour windows sent as agents send reports, and imports its FOCUS bill (the last two
/// days not billed yet, so they show as estimates). Each cluster's agents report with their own
/// token (`demo-CLUSTER`), scoped to that cluster as a real fleet's would be. Returns how many
/// reports went in.
pub async fn seed(
    store: &dyn Store,
    card: &RateCard,
    rules: &gpuledger_core::attribution::Rules,
    now_ms: i64,
) -> Result<usize, DemoError> {
    seed_reporting(store, card, rules, now_ms, &crate::progress::Silent).await
}

/// [`seed`], saying how far it is: each host's days of reports, then the bill and the roll-up.
pub async fn seed_reporting(
    store: &dyn Store,
    card: &RateCard,
    rules: &gpuledger_core::attribution::Rules,
    now_ms: i64,
    progress: &dyn crate::progress::Progress,
) -> Result<usize, DemoError> {
    let this_month = month_start_ms(now_ms);
    let start = month_start_ms(this_month - 1);
    let end = now_ms - now_ms % 60_000;
    let load_test = load_test_day(now_ms);
    // The demo carries two months of history, more than the default 35-day ingest window.
    let limits = Limits {
        retention_ms: end - start + HOUR_MS,
        ..Limits::default()
    };
    let mut batches = 0;
    let mut tokens: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    let days = u64::try_from((end - start + DAY_MS - 1) / DAY_MS).unwrap_or_default();
    progress.total(days * fleet().len() as u64);
    for spec in fleet() {
        progress.part(&spec.hostname);
        let token_id = demo_token(store, spec.cluster, &mut tokens, now_ms).await?;
        let host = HostInfo {
            hostname: spec.hostname.clone(),
            cluster: spec.cluster.into(),
            provider: Some("aws".into()),
            instance_id: Some(instance_id(&spec)),
            instance_type: Some(spec.instance_type.into()),
            region: Some("us-east-1".into()),
            lifecycle: Some(spec.lifecycle.into()),
        };
        // One report per day of hourly windows, as an agent catching up after an outage would.
        let mut t = start;
        let mut requests = Vec::new();
        let mut run_progress = Vec::new();
        while t < end {
            let day_end = (t + DAY_MS).min(end);
            let mut windows = Vec::new();
            while t < day_end {
                let w_end = (t + HOUR_MS).min(day_end);
                let gpus: Vec<GpuWindow> = (0..spec.gpus)
                    .map(|g| gpu_window(&spec, g, t, w_end - t, Some(load_test)))
                    .collect();
                let (counted, stepped) = usage_of_window(&spec, (t, w_end), &gpus, load_test);
                requests.extend(counted);
                run_progress.extend(stepped);
                windows.push(Window {
                    serving: Vec::new(),
                    start_ms: t,
                    end_ms: w_end,
                    samples: ((w_end - t) / 1000) as u32,
                    gpus,
                });
                t = w_end;
            }
            let report = Report {
                batch_id: format!("demo-{}-{}", spec.hostname, t),
                agent_version: "demo".into(),
                host: host.clone(),
                windows,
            };
            validate::validate(&report, now_ms, &limits)
                .map_err(|e| DemoError::Invalid(e.to_string()))?;
            let outcome = store
                .ingest(&report, token_id, AgentStatus::default(), now_ms)
                .await?;
            if outcome != crate::store::IngestOutcome::Stored {
                return Err(DemoError::Invalid(format!(
                    "report {} was not stored: {outcome:?}",
                    report.batch_id
                )));
            }
            batches += 1;
            progress.advance(1);
        }
        let usage = (requests, run_progress);
        post_usage(store, &spec.hostname, usage, (token_id, &limits), now_ms).await?;
    }
    let billed_until = (end - 2 * DAY_MS) - (end - 2 * DAY_MS).rem_euclid(HOUR_MS);
    progress.part("the bill");
    let bill = bill::focus_bill(card, start, billed_until);
    crate::billing::import_focus(store, "demo-focus-export.csv", bill.into_bytes(), now_ms)
        .await
        .map_err(|e| DemoError::Invalid(e.to_string()))?;
    // Roll it all up now, so the first page opened shows everything.
    progress.part("rolling up");
    crate::rollup::run(store, card, rules, usize::MAX).await?;
    set_budgets(store, &rules.owners, now_ms).await?;
    Ok(batches)
}

/// This month's budgets for the demo's teams, from what each spent last month: training a
/// little above it, serving below it (heading over), research well above.
async fn set_budgets(
    store: &dyn Store,
    owners: &gpuledger_core::owners::OwnerSchema,
    now_ms: i64,
) -> Result<(), StoreError> {
    use gpuledger_core::allocation::key_of;
    use gpuledger_core::allocation::GroupBy;
    let Some(team) = GroupBy::role(owners, gpuledger_core::owners::Role::Team) else {
        return Ok(());
    };
    let this = month_start_ms(now_ms);
    let (from, to) = gpuledger_core::time::month_of(this - 1);
    let last = crate::ledger::load(store, from, to, crate::store::RollupGrain::HostRange).await?;
    for (name, percent) in [("foundation", 110), ("applied", 85), ("research", 150)] {
        let spent: Decimal = last
            .parts
            .iter()
            .filter(|p| p.currency == "USD" && key_of(p, team, &last) == name)
            .map(|p| p.cost)
            .sum();
        // In round hundreds, as a finance lead would set it.
        let amount =
            (spent * Decimal::from(percent) / Decimal::from(10_000)).round() * Decimal::from(100);
        if amount.is_zero() {
            continue;
        }
        store::budgets::set_budget(
            store.db(),
            &store::budgets::BudgetRow {
                dimension: team.as_str().to_owned(),
                owner_key: name.to_owned(),
                from_month_ms: this,
                amount: gpuledger_core::money::to_text(amount),
                currency: "USD".into(),
                set_by: "demo".into(),
                set_ms: now_ms,
            },
        )
        .await?;
    }
    Ok(())
}

/// Keeps the simulated fleet reporting while the demo serves, as its agents would: the windows
/// of `[from_ms, to_ms)` for every host, one report per host, with each cluster's token. The
/// Idle page and Slack then see a live fleet (a fleet that stopped reporting is not idle, it is
/// unmonitored). Returns how many windows went in.
pub async fn report_live(store: &dyn Store, from_ms: i64, to_ms: i64) -> Result<usize, DemoError> {
    if to_ms <= from_ms {
        return Ok(0);
    }
    let mut stored = 0;
    for spec in fleet() {
        let name = format!("demo-{}", spec.cluster);
        let Some(token) = store::tokens::token_by_name(store.db(), &name).await? else {
            return Err(DemoError::Invalid(format!("token {name} is missing")));
        };
        let report = Report {
            batch_id: format!("demo-live-{}-{from_ms}", spec.hostname),
            agent_version: "demo".into(),
            host: HostInfo {
                hostname: spec.hostname.clone(),
                cluster: spec.cluster.into(),
                provider: Some("aws".into()),
                instance_id: Some(instance_id(&spec)),
                instance_type: Some(spec.instance_type.into()),
                region: Some("us-east-1".into()),
                lifecycle: Some(spec.lifecycle.into()),
            },
            windows: vec![Window {
                serving: Vec::new(),
                start_ms: from_ms,
                end_ms: to_ms,
                samples: ((to_ms - from_ms) / 1000) as u32,
                gpus: (0..spec.gpus)
                    .map(|g| gpu_window(&spec, g, from_ms, to_ms - from_ms, None))
                    .collect(),
            }],
        };
        match store
            .ingest(&report, token.id, AgentStatus::default(), to_ms)
            .await?
        {
            crate::store::IngestOutcome::Refused(r) => {
                return Err(DemoError::Invalid(format!(
                    "live report refused: {}",
                    r.message
                )))
            }
            _ => stored += report.windows[0].gpus.len(),
        }
    }
    Ok(stored)
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the simulated data was refused: {0}")]
    Invalid(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

#[cfg(test)]
mod tests;
