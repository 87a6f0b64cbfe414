//! The monthly review at `/review/YYYY-MM` and its drill-downs at
//! `/review/YYYY-MM/{dimension}?key=…`: what the GPUs cost, who used them, what was wasted and
//! what to change, against the previous month. Every figure comes from the same attribution as
//! `GET /api/v1/allocation`; each table links to that query as CSV and each row to its
//! drill-down.

use std::collections::{BTreeMap, BTreeSet};

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use rust_decimal::Decimal;
use serde::Deserialize;

use super::charts::{self, query, DayBar, Heatmap, Table};
use super::page::{error_page, render, Chrome};
use super::AppState;
use crate::allocation::{self, calendar_month, totals, GroupBy, InCurrency, Step};
use crate::attribution::Attribution;
use crate::config::OwnerSchema;
use crate::ledger;
use crate::now_ms;
use crate::recommend::{snapshots, Recommendations};
use crate::review_sections;
use crate::store::RollupGrain;
use gpuledger_core::owners::Role;
use gpuledger_core::time::{month_label, month_of};

use super::session::{database_unavailable, TeamScoped};
use crate::format::money;
use crate::unit_costs;
use crate::variance::comparison;
use rows::{endpoint_view, episode_view, runs_view, savings_view};
pub use rows::{EndpointRow, EpisodeView, RunRow, SavingRow};

mod rows;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/review", get(this_review))
        .route("/review/{month}", get(review))
        .route("/review/{month}/{dimension}", get(drill_down))
}

/// How many GPUs the review's heatmap shows (the costliest); the CSV has all.
const REVIEW_HEATMAP_GPUS: usize = review_sections::HEATMAP_GPUS;
const DRILL_HEATMAP_GPUS: usize = 200;
const TOP_ROWS: usize = review_sections::TOP_ROWS;

/// A headline figure and where it comes from.
pub struct Figure {
    pub value: String,
    pub caption: String,
    pub href: String,
}

#[derive(Template)]
#[template(path = "review.html")]
struct ReviewPage {
    chrome: Option<Chrome>,
    /// A team-scoped reader's teams: the page is theirs alone.
    teams: Option<String>,
    month: String,
    previous: String,
    next: String,
    /// The next month has begun: a link to it leads somewhere.
    next_begun: bool,
    figures: Vec<Figure>,
    unattributed: String,
    /// What the bill carries in currencies other than the page's, in words ("" when none).
    other_currencies: String,
    /// How much of the month is estimated (hours after the bill's last line), in words; ""
    /// when none is.
    estimated: String,
    tables: Vec<Table>,
    days: Vec<DayBar>,
    /// Some day is estimated: no bill covers it yet (the chart marks it).
    days_estimated: bool,
    chart_width: f64,
    ticks: Vec<charts::Tick>,
    heatmap: Heatmap,
    episodes: Vec<EpisodeView>,
    episode_count: usize,
    /// The episodes' dollars, and the ledger's idle + held idle: equal.
    idle_waste: String,
    ledger_waste: String,
    endpoints: Vec<EndpointRow>,
    endpoints_csv: String,
    runs: Vec<RunRow>,
    run_count: usize,
    run_average: String,
    runs_csv: String,
    savings: Vec<SavingRow>,
    total_saving: String,
    /// Commitment the recommendations free (not cash); "" where none.
    total_frees: String,
    /// The month's budgets in words ("2 of 5 over budget, 1 heading over"); empty when none.
    budgets: String,
    /// Days an owner spent well above its usual, biggest first (dismissed ones last).
    anomalies: Vec<super::anomalies::AnomalyView>,
    /// Admins see a button to dismiss each.
    is_admin: bool,
    csrf: String,
    /// Why spend changed against the previous month, per team.
    variance: rows::VarianceView,
    /// Whether the month's figures are final, in words.
    closing: ClosingView,
    /// The days the recommendations looked at.
    saving_days: String,
    /// The month's commitment discounts: the whole bill's, shown to those who see every team.
    commitments: rows::CommitmentsView,
    /// Endpoints and experiments quiet in the same hours every week.
    scale_to_zero: rows::ScaleToZeroView,
    /// GPUs held per instance type by hour of the week.
    shape: rows::ShapeView,
    /// Each type's month priced all on demand and with its floor committed.
    purchase_mix: Vec<rows::PurchaseRow>,
    /// What every purchase mix assumes.
    purchase_assumes: &'static str,
}

#[derive(Template)]
#[template(path = "drilldown.html")]
struct DrillDownPage {
    chrome: Option<Chrome>,
    month: String,
    dimension: &'static str,
    key: String,
    review_href: String,
    previous_href: String,
    next_href: String,
    previous: String,
    next: String,
    next_begun: bool,
    figures: Vec<Figure>,
    tables: Vec<Table>,
    days: Vec<DayBar>,
    /// Some day is estimated: no bill covers it yet (the chart marks it).
    days_estimated: bool,
    chart_width: f64,
    ticks: Vec<charts::Tick>,
    heatmap: Heatmap,
    endpoint: Option<EndpointRow>,
    runs: Vec<RunRow>,
    /// How many runs there are, where more than `runs` shows ("54,980").
    runs_more: Option<String>,
    runs_csv: String,
    empty: bool,
    /// What this key spent in currencies other than the page's, in words ("" when none).
    other_currencies: String,
}

impl ReviewPage {
    /// Whether the spend tables mark used-by-presence dollars (explained once, under them).
    fn presence_note(&self) -> bool {
        charts::any_presence(&self.tables)
    }
}

impl DrillDownPage {
    fn presence_note(&self) -> bool {
        charts::any_presence(&self.tables)
    }
}

/// The month `YYYY-MM` names, as [start, end) epoch ms.
/// Heatmap row labels of the GPUs in `parts`; failing to read them costs the labels (rows fall
/// back to the end of the UUID), not the page.
async fn heatmap_labels(
    store: &dyn crate::store::Store,
    parts: &[crate::attribution::Part],
) -> std::collections::HashMap<String, String> {
    let uuids: Vec<String> = parts
        .iter()
        .filter_map(|p| p.gpu_uuid.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    match crate::fleet::gpu_labels(store, &uuids).await {
        Ok(labels) => labels,
        Err(e) => {
            tracing::warn!(error = %e, "review: GPU indexes for the heatmap");
            Default::default()
        }
    }
}

/// Where the month stands: open (figures may change until it closes) or closed, with changes
/// that arrived after it closed and its restatements.
struct ClosingView {
    closed: bool,
    text: String,
    /// Host-hours marked after the month closed and not applied.
    waiting: i64,
    restatements: Vec<RestatementView>,
}

struct RestatementView {
    when: String,
    reason: String,
    /// Team, before, after: the teams whose figure changed.
    changes: Vec<(String, String, String)>,
}

fn day_and_time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(String::new, |d| d.format("%-d %b %Y %H:%M UTC").to_string())
}

fn closing_view(
    close: crate::closing::ClosePolicy,
    (from, now): (i64, i64),
    (empty, waiting): (bool, i64),
    restatements: &[crate::store::RestatementRow],
    currency: &str,
) -> ClosingView {
    let closes = close.closes_at(from);
    // A month nothing was reported or billed for has no figures to be final.
    let closed = close.is_closed(from, now) && !empty;
    let text = if empty {
        format!(
            "No data: no agent reported and no bill covers {}, so there is nothing to review{}.",
            month_label(from),
            if close.is_closed(from, now) {
                ""
            } else {
                " yet"
            }
        )
    } else if closed && close.is_signed_off(from) && closes > now {
        "Closed: signed off with its final bill; these figures are final.".to_owned()
    } else if closed {
        format!("Closed {}: these figures are final.", day_and_time(closes))
    } else {
        let under_way = now < gpuledger_core::time::next_month_start(from);
        format!(
            "Open: late data and bills may still change these figures until the month closes on {}.{}",
            day_and_time(closes),
            if under_way {
                // Kept between refreshes (review_sections): say how old they can be.
                " The idle history, the heatmap's GPUs, coverage, scale-to-zero and the week's shape can be up to 10 minutes old."
            } else {
                ""
            }
        )
    };
    let parse =
        |json: &str| -> BTreeMap<String, String> { serde_json::from_str(json).unwrap_or_default() };
    let restatements = restatements
        .iter()
        .map(|r| {
            let (before, after) = (parse(&r.before_json), parse(&r.after_json));
            let teams: std::collections::BTreeSet<&String> =
                before.keys().chain(after.keys()).collect();
            // Amounts are in the month's currency unless written "amount CUR".
            let money = |v: Option<&String>| {
                v.map_or_else(
                    || "—".to_owned(),
                    |v| {
                        let (amount, c) = v.split_once(' ').unwrap_or((v, currency));
                        money(gpuledger_core::money::from_text(amount), c)
                    },
                )
            };
            RestatementView {
                when: day_and_time(r.created_ms),
                reason: r.reason.clone(),
                changes: teams
                    .into_iter()
                    .filter(|t| before.get(*t) != after.get(*t))
                    .map(|t| (t.clone(), money(before.get(t)), money(after.get(t))))
                    .collect(),
            }
        })
        .collect();
    ClosingView {
        closed,
        text,
        waiting: if closed { waiting } else { 0 },
        restatements,
    }
}

/// The month's budgets in a line: how many are over, heading over and on track.
fn budget_result(budgets: &[crate::budgets::BudgetStatus]) -> String {
    use crate::budgets::Standing;
    if budgets.is_empty() {
        return String::new();
    }
    let count = |s: Standing| budgets.iter().filter(|b| b.standing == s).count();
    let over = count(Standing::Over);
    let risk = count(Standing::AtRisk);
    format!(
        "{over} of {} budgets over, {risk} heading over, {} on track",
        budgets.len(),
        count(Standing::OnTrack)
    )
}

/// How much of a month's `total` (in `currency`) is estimated, in words: the hours after the
/// bill's last line, each priced at what the bill last charged its host (the rate card for a
/// host it never charged); "" when the bill covers it all.
fn estimated_share(a: &Attribution, total: Decimal, currency: &str) -> String {
    let (cost, seconds) = a
        .parts
        .iter()
        .filter(|p| p.estimated)
        .fold((Decimal::ZERO, 0.0), |(c, s), p| {
            (c + p.cost, s + p.gpu_seconds)
        });
    if cost.is_zero() && seconds == 0.0 {
        return String::new();
    }
    let pct = if total.is_zero() {
        Decimal::ZERO
    } else {
        (cost / total * Decimal::from(100)).round_dp(1)
    };
    format!(
        "{} of these figures ({pct:.1}%, {} GPU-hours) is estimated: hours the bill does not \
         cover yet, each priced at what the bill last charged its host (the rate card's price \
         for a host no bill has charged).",
        money(cost, currency),
        crate::format::whole(seconds / 3600.0)
    )
}

/// How the comparison is named on the page.
fn comparison_caption(prev_from: i64, prev_to: i64, partial: bool, total: &str) -> String {
    let at = |ms: i64, f: &str| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map_or_else(String::new, |d| d.format(f).to_string())
    };
    if partial {
        format!(
            "month to date, against the same stretch of {} ({} to {} UTC: {total})",
            month_label(prev_from),
            at(prev_from, "%-d %b"),
            at(prev_to, "%-d %b %H:%M"),
        )
    } else {
        format!(
            "against {}, the whole month ({total})",
            month_label(prev_from)
        )
    }
}

/// The energy and emissions figures of a month or a key, from its `(energy_kwh,
/// energy_measured_share, kg_co2e)`: the figures, or why there are none (nothing measured the
/// energy, or some was drawn where the grid's intensity is unknown).
fn footprint_figures(
    footprint: Option<(Option<f64>, Option<f64>, Option<f64>)>,
    (energy_href, co2e_href): (String, String),
) -> [Figure; 2] {
    let (kwh, share, kg) = footprint.unwrap_or_default();
    let energy = Figure {
        value: match kwh {
            Some(_) => format!("{} kWh", charts::energy_text(kwh, share)),
            None => "unknown".into(),
        },
        caption: match share {
            Some(m) if m >= 0.999 => "energy measured by the GPUs".into(),
            Some(m) if m > 0.0 => format!(
                "energy measured by the GPUs, on {:.0}% of the GPU-hours (the rest report none)",
                m * 100.0
            ),
            _ => "energy: no GPU here reports it".into(),
        },
        href: energy_href,
    };
    let co2e = Figure {
        value: match kg {
            Some(_) => format!("{} kg CO2e", charts::co2e_text(kg, share)),
            None => "unknown".into(),
        },
        caption: match (kwh, kg) {
            (_, Some(_)) => "emissions of that energy, from each host's grid".into(),
            (Some(_), None) => {
                "emissions: some hosts' grid intensity is unknown ([carbon] in the config)".into()
            }
            (None, None) => "emissions: no measured energy".into(),
        },
        href: co2e_href,
    };
    [energy, co2e]
}

fn day_label(rfc: &str) -> String {
    rfc.get(..10).unwrap_or(rfc).to_owned()
}

/// `read`, its time logged at debug level (`GPULEDGER_LOG=gpuledger_server::http::review=debug`):
/// where a slow view spends it. Reads run side by side, so each time includes waiting for the
/// database while it works on the others.
async fn timed<T>(what: &'static str, read: impl std::future::Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let out = read.await;
    tracing::debug!(
        read = what,
        ms = started.elapsed().as_secs_f64() * 1e3,
        "review read"
    );
    out
}

async fn this_review() -> Redirect {
    Redirect::to(&format!("/review/{}", month_label(now_ms())))
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    database_unavailable("review page", e)
}

/// A month still to come has no review: no figures, no comparison, no forecast.
fn not_begun(from: i64, now: i64) -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        "This month has not begun",
        &format!(
            "{} begins on {}; its review opens then. The month under way is /review/{}.",
            month_label(from),
            day_and_time(from),
            month_label(now)
        ),
    )
}

fn no_such_month() -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        "No such month",
        "Months are written YYYY-MM, e.g. /review/2026-11.",
    )
}

/// The allocation API's JSON for a month, `by` one dimension, narrowed by `filters`.
fn api_href(month: &str, next: &str, by: GroupBy, filters: &[(GroupBy, String)]) -> String {
    charts::api_href(month, next, by, "month", filters)
}

/// `GET /review/YYYY-MM`. A team-scoped reader gets the review of its teams: every figure and
/// table from their part of the ledger, and of lists (recommendations, idle episodes,
/// anomalies, endpoints' requests) only what is wholly theirs.
async fn review(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    Path(month): Path<String>,
) -> Response {
    let Some((from, to)) = calendar_month(&month) else {
        return no_such_month();
    };
    let started = std::time::Instant::now();
    let store = user.reads.store();
    let now = now_ms();
    if from > now {
        return not_begun(from, now);
    }
    let (prev_from, prev_to, partial) = comparison(from, to, now);
    let recs = async {
        match snapshots::review_range(from, to, now) {
            Some(range) => {
                let all = snapshots::get(store, &state.rate_card, &state.config.owners, range, now)
                    .await?;
                let scoped = (&user.scope, &state.config.owners);
                crate::recommend::for_scope(store, all, range, scoped).await
            }
            None => Ok(Recommendations::default()),
        }
    };
    // Independent reads, side by side: the database works on one while this process decodes
    // another.
    let scope = &user.scope;
    let schema = &state.config.owners;
    // A scoped reader's GPUs: which recommendations are theirs, and their heatmap.
    let scoped_gpus = async {
        if scope.is_all() {
            return Ok(None);
        }
        ledger::load(store, from, to, RollupGrain::Day)
            .await
            .map(Some)
    };
    let close = match state.close.current(store).await {
        Ok(c) => c,
        Err(e) => return unavailable(e),
    };
    // The ledger's past days (this month's, the month before's, the weeks of history
    // anomalies are judged on) are read as kept after the first view; today's live.
    let keep = ledger::Keep::past_days(now);
    // The heaviest sections, kept (the month under way's refreshed by a job); then the
    // heatmap's GPUs' days, a few thousand rows, read on each view.
    // Boxed: its five sections side by side make a large future, too deep for a thread's
    // stack beside the page's other reads in an unoptimized build.
    let heavy = Box::pin(async {
        let sections =
            crate::review_sections::read(store, (schema, scope), (from, to), (now, false)).await?;
        let heat = ledger::gpu_days(store, from, to, &sections.heatmap_gpus.0).await?;
        Ok((sections, heat))
    });
    // Per host, summed over the month: the review shows no single GPU except in the heatmap,
    // and no day except in its chart. Whoever sees every team needs no host by name either
    // (a team's reader needs its hosts, to keep to them): hosts alike are summed together.
    let summed = if scope.is_all() {
        RollupGrain::HostGroupRange
    } else {
        RollupGrain::HostRange
    };
    let loaded = tokio::try_join!(
        timed("month", ledger::load_kept(store, from, to, summed, keep)),
        // The chart: per day and team, so a scoped reader's is its teams'.
        timed(
            "chart",
            ledger::days_by(store, from, to, schema.role(Role::Team), keep)
        ),
        timed("kept sections", heavy),
        timed("run hours", ledger::experiment_hours(store, from, to)),
        timed("recommendations", recs),
        // Its total, and why this month differs from it. A month to date is compared with
        // the same stretch of the month before, whose kept days grow by one a day.
        timed(
            "month before",
            ledger::load_kept(
                store,
                prev_from,
                prev_to,
                summed,
                if partial { keep.growing() } else { keep },
            )
        ),
        timed(
            "requests",
            crate::unit_costs::request_totals(store, from, to)
        ),
        timed("tokens", crate::unit_costs::token_totals(store, from, to)),
        timed(
            "usage sources",
            crate::unit_costs::usage_sources(store, from, to)
        ),
        timed(
            "progress",
            crate::unit_costs::progress_totals(store, from, to)
        ),
        timed(
            "pending hours",
            crate::closing::pending_hours(store, from, to)
        ),
        timed("restatements", crate::closing::restatements(store, from)),
        timed(
            "budgets",
            crate::budgets::for_month(store, (schema, scope), (from, to), now)
        ),
        timed(
            "anomalies",
            crate::anomalies::find(store, &state.config, (from, to), (now, keep))
        ),
        timed("scoped GPUs", scoped_gpus),
    );
    let (
        all,
        per_day,
        (heavy, heat_parts),
        run_hours,
        recs,
        prev,
        requests,
        tokens,
        sources,
        progress,
        waiting,
        restated,
        budgets,
        anomalies,
        scoped_gpus,
    ) = match loaded {
        Ok(x) => x,
        Err(e) => return unavailable(e),
    };
    let review_sections::Sections {
        heatmap_gpus: (_, gpu_count),
        idle: idle_episodes,
        type_costs,
        scale_to_zero: quiet,
        shape,
    } = heavy;
    let read_ms = started.elapsed().as_secs_f64() * 1e3;
    // Commitments and buying are the whole bill's and fleet's: only for who sees every team.
    let (commitments, purchase_mix) = if scope.is_all() {
        let commitments = crate::commitments::for_range(
            store,
            &state.rate_card,
            &state.config,
            &type_costs,
            (from, to),
            now,
        );
        let commitments = timed("commitments", commitments).await;
        match commitments {
            Ok(c) => (
                Some(c),
                crate::purchase::of_shapes(&state.rate_card, &shape, &type_costs),
            ),
            Err(e) => return unavailable(e),
        }
    } else {
        (None, Vec::new())
    };
    let grid = crate::carbon::grid(&all, &state.config.carbon);
    // What is wholly the scope's, judged on the whole ledger; then the ledger it sees.
    let anomalies = crate::anomalies::within_scope(anomalies, (scope, schema));
    let held_runs =
        GroupBy::role(schema, Role::Experiment).and_then(|by| scope.held_keys(&all, by, schema));
    let idle_summary = match idle_episodes {
        review_sections::IdleWaste::Summary(summary) => summary,
        review_sections::IdleWaste::Episodes(episodes) => crate::idle_history::Summary::of(
            (episodes.into_iter()).filter(|e| crate::idle_history::in_scope(e, scope, schema)),
            TOP_ROWS,
        ),
    };
    let requests = unit_costs::requests_of_held_endpoints(&all, requests, (schema, scope));
    // The bill's restatements are the whole bill's: not a team's to read.
    let restated = if scope.is_all() { restated } else { Vec::new() };
    // Nor is how much of the whole fleet changed after the month closed.
    let waiting = if scope.is_all() { waiting } else { 0 };
    // Nothing reported, billed, waiting or restated for the whole fleet: the month says so (a
    // team's part of a month with data can be empty and still final).
    let empty = all.parts.is_empty()
        && all.unattributed.values().all(Decimal::is_zero)
        && waiting == 0
        && restated.is_empty();
    let all = scope.restrict(all, schema);
    let prev = scope.restrict(prev, schema);
    let per_day = scope.restrict(per_day, schema);
    // The heatmap of the scope's own GPU-days, or the fleet's costliest GPUs.
    let (heat_parts, gpu_count) = match scoped_gpus {
        Some(days) => {
            let days = scope.restrict(days, schema);
            let gpus: BTreeSet<&str> = days
                .parts
                .iter()
                .filter_map(|p| p.gpu_uuid.as_deref())
                .collect();
            let count = gpus.len();
            (days.parts, count)
        }
        None => (heat_parts, gpu_count),
    };
    let (month, next) = (month_label(from), month_label(to));
    // One currency on the page; what the bill carries in others is listed apart.
    let InCurrency {
        currency: cur,
        attribution: a,
        others,
    } = allocation::in_main_currency(&all);
    let shown = |d: Decimal| money(d, &cur);
    let closing = closing_view(close, (from, now), (empty, waiting), &restated, &cur);
    let t = totals(&a, &grid);
    let month_totals = t.first();
    let total = month_totals.map_or(Decimal::ZERO, |t| t.cost);
    let previous_total: Decimal = prev
        .parts
        .iter()
        .filter(|p| p.currency == cur)
        .map(|p| p.cost)
        .sum();
    // Why it differs, per team (or the cluster where the schema has no team dimension).
    let variance = rows::variance_view(
        &crate::variance::of(
            &all,
            &prev,
            GroupBy::role(&state.config.owners, Role::Team).unwrap_or(GroupBy::Cluster),
            (from, to, prev_from, prev_to, partial),
        ),
        &month_label(from),
    );
    let change = if previous_total.is_zero() {
        "no spend the month before".to_owned()
    } else {
        let diff = total - previous_total;
        let pct = (diff / previous_total * Decimal::from(100)).round_dp(1);
        // One sign, written once for both figures.
        let sign = if diff.is_sign_negative() { "−" } else { "+" };
        format!("{sign}{} ({sign}{}%)", shown(diff.abs()), pct.abs())
    };
    let none: &[(GroupBy, String)] = &[];
    let mut figures = vec![
        Figure {
            value: shown(total),
            caption: "GPU spend, attributed to the cent".into(),
            href: api_href(&month, &next, GroupBy::Cluster, none),
        },
        Figure {
            value: change,
            caption: comparison_caption(prev_from, prev_to, partial, &shown(previous_total)),
            href: format!("/review/{}", month_label(prev_from)),
        },
        Figure {
            value: shown(month_totals.map_or(Decimal::ZERO, |t| t.idle_cost)),
            caption: "idle (no process)".into(),
            href: charts::drill_href(&month, GroupBy::TEAM, allocation::IDLE_KEY),
        },
        Figure {
            value: shown(month_totals.map_or(Decimal::ZERO, |t| t.held_idle_cost)),
            caption: "held idle (memory held at ~0%)".into(),
            href: api_href(&month, &next, GroupBy::TEAM, none),
        },
        Figure {
            value: shown(month_totals.map_or(Decimal::ZERO, |t| t.unmonitored_cost)),
            caption: "unmonitored (no agent data)".into(),
            // Where bill tags or the cluster map name owners of unwatched time, the cost is
            // spread over teams: the API lists it per team, as for held idle.
            href: if state
                .config
                .owners
                .names_unwatched_owners(GroupBy::TEAM.as_str())
            {
                api_href(&month, &next, GroupBy::TEAM, none)
            } else {
                charts::drill_href(&month, GroupBy::TEAM, allocation::UNMONITORED_KEY)
            },
        },
        Figure {
            value: crate::format::whole(month_totals.map_or(0.0, |t| t.gpu_hours)),
            caption: "GPU-hours".into(),
            href: api_href(&month, &next, GroupBy::Cluster, none),
        },
    ];
    figures.extend(footprint_figures(
        month_totals.map(|t| (t.energy_kwh, t.energy_measured_share, t.kg_co2e)),
        (
            api_href(&month, &next, GroupBy::MODEL, none),
            api_href(&month, &next, GroupBy::TEAM, none),
        ),
    ));
    // One table per owner dimension (the default four first, as finance reads them), then
    // how it was bought and where.
    let default_order = [
        GroupBy::MODEL,
        GroupBy::TEAM,
        GroupBy::ENDPOINT,
        GroupBy::EXPERIMENT,
    ];
    let owner_tables = GroupBy::all(&state.config.owners)
        .into_iter()
        .filter(|g| g.is_owner() && !default_order.contains(g));
    let tables = default_order
        .into_iter()
        .chain(owner_tables)
        .chain([GroupBy::PricingCategory, GroupBy::Cluster])
        .map(|by| {
            charts::table(
                (&a, &grid),
                by,
                (&month, &next),
                none,
                total,
                (&cur, &others),
            )
        })
        .collect();
    let (days, chart_width, ticks) = charts::days(&per_day, from, to, none, &cur);
    let heat = Attribution {
        parts: heat_parts,
        unattributed: Default::default(),
        unattributed_hours: Default::default(),
        hosts: a.hosts.clone(),
    };
    let labels = timed(
        "heatmap labels",
        heatmap_labels(user.reads.store(), &heat.parts),
    )
    .await;
    let mut heatmap = charts::heatmap(
        &heat,
        from,
        to,
        &month,
        &next,
        none,
        REVIEW_HEATMAP_GPUS,
        &labels,
    );
    heatmap.total_gpus = gpu_count;
    // Idle waste from the ledger: episodes whose dollars add up to the month's idle and held
    // idle, for any month (live incidents need raw windows, gone once a month closes).
    let in_cur = idle_summary
        .currencies
        .into_iter()
        .find(|c| c.currency == cur);
    let idle_waste: Decimal = in_cur.as_ref().map_or(Decimal::ZERO, |c| c.cost);
    let ledger_waste = month_totals.map_or(Decimal::ZERO, |t| t.idle_cost + t.held_idle_cost);
    let episode_count = in_cur.as_ref().map_or(0, |c| c.count);
    let episodes: Vec<EpisodeView> = in_cur
        .into_iter()
        .flat_map(|c| c.costliest)
        .map(|e| episode_view(e, &month))
        .collect();
    let mut endpoints = unit_costs::endpoint_costs(&a, &requests, schema);
    unit_costs::with_tokens(&mut endpoints, &tokens);
    unit_costs::with_sources(&mut endpoints, &sources);
    let mut runs = unit_costs::training_runs_by_day(&a, &run_hours, schema);
    unit_costs::with_progress(&mut runs, &progress);
    // A run shared with another team is not the scope's to read (its hours are both teams').
    runs.retain(|r| held_runs.as_ref().is_none_or(|h| h.contains(&r.experiment)));
    let run_total: Decimal = runs.iter().map(|r| r.cost).sum();
    let run_average = if runs.is_empty() {
        "—".to_owned()
    } else {
        shown(run_total / Decimal::from(runs.len() as i64))
    };
    let (savings, total_saving) = savings_view(&recs, &month, &cur, schema);
    tracing::debug!(
        read_ms,
        figures_ms = started.elapsed().as_secs_f64() * 1e3 - read_ms,
        "review computed"
    );
    render(&ReviewPage {
        chrome: Some(Chrome::from(&user)),
        teams: (!scope.is_all()).then(|| scope.describe()),
        previous: month_label(prev_from),
        figures,
        budgets: budget_result(&budgets),
        anomalies: anomalies.iter().map(super::anomalies::view).collect(),
        is_admin: user.is_admin(),
        csrf: user.csrf.clone(),
        variance,
        unattributed: shown(month_totals.map_or(Decimal::ZERO, |t| t.unattributed_cost)),
        other_currencies: others
            .iter()
            .map(|(c, d)| money(*d, c))
            .collect::<Vec<_>>()
            .join(", "),
        estimated: estimated_share(&a, total, &cur),
        tables,
        days_estimated: days.iter().any(|d| d.estimated),
        days,
        chart_width,
        ticks,
        heatmap,
        episodes,
        episode_count,
        idle_waste: shown(idle_waste),
        ledger_waste: shown(ledger_waste),
        endpoints: endpoints
            .iter()
            .take(TOP_ROWS)
            .map(|e| endpoint_view(e, &month, schema))
            .collect(),
        endpoints_csv: format!(
            "/api/v1/usage?{}",
            query(&[("from", &month), ("to", &next), ("format", "csv")])
        ),
        run_count: runs.len(),
        run_average,
        runs: runs_view(&runs[..runs.len().min(TOP_ROWS)], &month, schema),
        runs_csv: format!(
            "/api/v1/runs?{}",
            query(&[("from", &month), ("to", &next), ("format", "csv")])
        ),
        savings,
        total_saving,
        total_frees: super::recommendations::frees_text(&recs),
        closing,
        saving_days: crate::format::days_and_hours(recs.lookback_days),
        // A commitment is the whole bill's, never a team's to read.
        commitments: commitments
            .map(|c| rows::commitments_view(&c, &cur, &month))
            .unwrap_or_default(),
        scale_to_zero: rows::scale_to_zero_view(&quiet, &cur, &month, (from, to, now)),
        shape: rows::shape_view(&shape, &month),
        purchase_mix: rows::purchase_view(&purchase_mix),
        purchase_assumes: crate::purchase::ASSUMES,
        month,
        next,
        next_begun: to <= now,
    })
    .into_response()
}

#[derive(Deserialize)]
struct KeyQuery {
    key: Option<String>,
}

/// Which tables a drill-down of `by` shows: the fleet dimensions that narrow it down and every
/// other owner dimension of the schema.
fn related(by: GroupBy, schema: &OwnerSchema) -> Vec<GroupBy> {
    use GroupBy::*;
    let owners = GroupBy::all(schema)
        .into_iter()
        .filter(|g| g.is_owner() && *g != by);
    let (before, after): (&[GroupBy], &[GroupBy]) = match by {
        Owner(_) => (&[], &[Cluster, Host, Gpu, PricingCategory]),
        Cluster => (&[Host], &[Gpu, PricingCategory]),
        Host => (&[Gpu], &[]),
        Gpu => (&[], &[]),
        InstanceType => (&[Cluster, Host], &[]),
        PricingCategory => (&[Cluster], &[]),
    };
    before
        .iter()
        .copied()
        .chain(owners)
        .chain(after.iter().copied())
        .collect()
}

/// `GET /review/YYYY-MM/DIMENSION?key=…`. A team-scoped reader sees its teams' part of the
/// key, and a key with nothing of its teams is not found (its name is not repeated back).
async fn drill_down(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    Path((month, dimension)): Path<(String, String)>,
    Query(q): Query<KeyQuery>,
) -> Response {
    let Some((from, to)) = calendar_month(&month) else {
        return no_such_month();
    };
    let schema = &state.config.owners;
    let Some(by) = GroupBy::parse(&dimension, schema) else {
        let names: Vec<&str> = GroupBy::all(schema).iter().map(|g| g.as_str()).collect();
        return error_page(
            StatusCode::NOT_FOUND,
            "No such breakdown",
            &format!("Drill-downs are by {}.", names.join(", ")),
        );
    };
    let Some(key) = q.key.filter(|k| !k.is_empty()) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "Which one?",
            "Add ?key=… to the address: the model, team, host or other name to look at.",
        );
    };
    let now = now_ms();
    if from > now {
        return not_begun(from, now);
    }
    let loaded = async {
        let store = user.reads.store();
        let a = ledger::load(store, from, to, RollupGrain::Day).await?;
        let run_hours = ledger::experiment_hours(store, from, to).await?;
        let requests = crate::unit_costs::request_totals(store, from, to).await?;
        let tokens = crate::unit_costs::token_totals(store, from, to).await?;
        let sources = crate::unit_costs::usage_sources(store, from, to).await?;
        Ok::<_, crate::store::StoreError>((a, run_hours, requests, (tokens, sources)))
    }
    .await;
    let (all, run_hours, requests, (tokens, sources)): (Attribution, _, _, _) = match loaded {
        Ok(x) => x,
        Err(e) => return unavailable(e),
    };
    let grid = crate::carbon::grid(&all, &state.config.carbon);
    let scope = &user.scope;
    let requests = unit_costs::requests_of_held_endpoints(&all, requests, (schema, scope));
    let held_runs =
        GroupBy::role(schema, Role::Experiment).and_then(|by| scope.held_keys(&all, by, schema));
    let all = scope.restrict(all, schema);
    let (month, next) = (month_label(from), month_label(to));
    let filters = vec![(by, key.clone())];
    if !scope.is_all() && allocation::filtered(&all, &filters).parts.is_empty() {
        return error_page(
            StatusCode::NOT_FOUND,
            "Nothing of your teams here",
            &format!(
                "This {} has no spend of {} in {month}.",
                by.as_str(),
                scope.describe()
            ),
        );
    }
    // In the currency that carries most of this key's spend; the rest listed apart.
    let InCurrency {
        currency: cur,
        attribution: a,
        others,
    } = allocation::in_main_currency(&allocation::filtered(&all, &filters));
    let shown = |d: Decimal| money(d, &cur);
    let row = allocation::group(&a, by, Step::Month, &grid);
    let mine = row.iter().find(|r| r.key == key);
    let month_total: Decimal = totals(&all, &grid)
        .iter()
        .find(|t| t.currency == cur)
        .map_or(Decimal::ZERO, |t| t.cost);
    let cost = mine.map_or(Decimal::ZERO, |r| r.cost);
    let api = api_href(&month, &next, by, &filters);
    let mut figures = vec![
        Figure {
            value: shown(cost),
            caption: if month_total.is_zero() {
                format!("{} spend", by.as_str())
            } else {
                format!(
                    "{}% of {} GPU spend",
                    (cost / month_total * Decimal::from(100)).round_dp(1),
                    if scope.is_all() {
                        "the month's"
                    } else {
                        "your teams'"
                    }
                )
            },
            href: api.clone(),
        },
        Figure {
            value: crate::format::whole(mine.map_or(0.0, |r| r.gpu_hours)),
            caption: "GPU-hours".into(),
            href: api.clone(),
        },
        Figure {
            value: mine
                .and_then(|r| r.avg_util)
                .map_or_else(|| "—".into(), |u| format!("{u:.0}%")),
            caption: "average GPU utilization".into(),
            href: api.clone(),
        },
        Figure {
            value: shown(mine.map_or(Decimal::ZERO, |r| r.held_idle_cost)),
            caption: "held idle".into(),
            href: api.clone(),
        },
    ];
    figures.extend(footprint_figures(
        mine.map(|r| (r.energy_kwh, r.energy_measured_share, r.kg_co2e)),
        (api.clone(), api),
    ));
    let tables = related(by, schema)
        .into_iter()
        .map(|other| {
            charts::table(
                (&a, &grid),
                other,
                (&month, &next),
                &filters,
                cost,
                (&cur, &others),
            )
        })
        .collect();
    let (days, chart_width, ticks) = charts::days(&a, from, to, &filters, &cur);
    let labels = heatmap_labels(user.reads.store(), &a.parts).await;
    let heatmap = charts::heatmap(
        &a,
        from,
        to,
        &month,
        &next,
        &filters,
        DRILL_HEATMAP_GPUS,
        &labels,
    );
    let endpoint_by = GroupBy::role(schema, Role::Endpoint);
    let endpoint = (Some(by) == endpoint_by)
        .then(|| {
            let mut rows = unit_costs::endpoint_costs(&all, &requests, schema);
            unit_costs::with_tokens(&mut rows, &tokens);
            unit_costs::with_sources(&mut rows, &sources);
            rows.into_iter().find(|e| e.endpoint == key)
        })
        .flatten()
        .map(|e| endpoint_view(&e, &month, schema));
    // Training runs of an owner (but an endpoint, which serves) or of a cluster.
    let runs = if (by.is_owner() && Some(by) != endpoint_by) || by == GroupBy::Cluster {
        let mut runs = unit_costs::training_runs_by_day(
            &allocation::filtered(&all, &filters),
            &run_hours,
            schema,
        );
        runs.retain(|r| held_runs.as_ref().is_none_or(|h| h.contains(&r.experiment)));
        runs
    } else {
        Vec::new()
    };
    // The costliest, as on the review: a large cluster runs tens of thousands a month.
    let runs_more = (runs.len() > TOP_ROWS).then(|| crate::format::thousands(runs.len() as i64));
    // No cost per step here: a run's part on one host or cluster is not what its steps cost.
    let runs = runs_view(&runs[..runs.len().min(TOP_ROWS)], &month, schema);
    let (prev_from, _) = month_of(from - 1);
    let drill = |m: &str| charts::drill_href(m, by, &key);
    render(&DrillDownPage {
        chrome: Some(Chrome::from(&user)),
        empty: a.parts.is_empty(),
        review_href: format!("/review/{month}"),
        previous_href: drill(&month_label(prev_from)),
        next_href: drill(&next),
        next_begun: to <= now,
        previous: month_label(prev_from),
        dimension: by.as_str(),
        key,
        figures,
        tables,
        days_estimated: days.iter().any(|d| d.estimated),
        days,
        chart_width,
        ticks,
        heatmap,
        endpoint,
        runs,
        runs_more,
        runs_csv: format!(
            "/api/v1/runs?{}",
            query(&[("from", &month), ("to", &next), ("format", "csv")])
        ),
        other_currencies: others
            .iter()
            .map(|(c, d)| money(*d, c))
            .collect::<Vec<_>>()
            .join(", "),
        month,
        next,
    })
    .into_response()
}

#[cfg(test)]
mod comparison_tests;
