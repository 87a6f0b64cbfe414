//! The monthly review at `/review/YYYY-MM`: what the GPUs cost, who used them, what was wasted,
//! against the previous month. Every figure comes from the same attribution as
//! `GET /api/v1/allocation`, and each table links to that query as CSV.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use chrono::Datelike;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use super::incidents::{view as incident_view, IncidentView};
use super::page::{error_page, render, Chrome};
use super::AppState;
use crate::allocation::{group, parse_bound, period_start, this_month, totals, GroupBy, Step};
use crate::attribution::{self, Attribution, Kind};
use crate::now_ms;
use crate::session::SignedIn;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/review", get(this_review))
        .route("/review/{month}", get(review))
}

pub struct Bar {
    pub key: String,
    pub cost: String,
    pub share: String,
    /// Bar length in SVG units (0..=200).
    pub width: f64,
    pub held_idle: String,
    pub gpu_hours: String,
}

pub struct Table {
    pub title: &'static str,
    pub by: &'static str,
    pub rows: Vec<Bar>,
}

pub struct DayBar {
    pub label: String,
    pub x: f64,
    pub used_y: f64,
    pub used_h: f64,
    pub held_y: f64,
    pub held_h: f64,
    pub idle_y: f64,
    pub idle_h: f64,
    pub total: String,
}

#[derive(Template)]
#[template(path = "review.html")]
struct ReviewPage {
    chrome: Option<Chrome>,
    month: String,
    previous: String,
    next: String,
    total: String,
    previous_total: String,
    change: String,
    held_idle: String,
    idle: String,
    unmonitored: String,
    unattributed: String,
    gpu_hours: String,
    estimated: bool,
    tables: Vec<Table>,
    days: Vec<DayBar>,
    chart_width: f64,
    incidents: Vec<IncidentView>,
    from: String,
    to: String,
}

fn dollars(d: Decimal) -> String {
    crate::format::usd(d)
}

/// The month `YYYY-MM` names, as [start, end) epoch ms.
fn month_range(month: &str) -> Option<(i64, i64)> {
    let start = parse_bound(month)?;
    if month.len() != 7 {
        return None;
    }
    Some(this_month(start))
}

fn label(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(String::new, |d| d.format("%Y-%m").to_string())
}

async fn this_review() -> Redirect {
    Redirect::to(&format!("/review/{}", label(now_ms())))
}

fn table(
    a: &Attribution,
    by: GroupBy,
    title: &'static str,
    by_name: &'static str,
    total: Decimal,
) -> Table {
    let rows = group(a, by, Step::Month);
    let max = rows
        .iter()
        .map(|r| r.cost)
        .max()
        .unwrap_or(Decimal::ONE)
        .max(Decimal::new(1, 6));
    Table {
        title,
        by: by_name,
        rows: rows
            .into_iter()
            .map(|r| Bar {
                width: (r.cost / max * Decimal::from(200))
                    .to_f64()
                    .unwrap_or(0.0)
                    .max(0.0),
                share: if total.is_zero() {
                    "—".into()
                } else {
                    format!("{}%", (r.cost / total * Decimal::from(100)).round_dp(1))
                },
                cost: dollars(r.cost),
                held_idle: dollars(r.held_idle_cost),
                gpu_hours: format!("{:.0}", r.gpu_hours),
                key: r.key,
            })
            .collect(),
    }
}

fn days(a: &Attribution, from: i64, to: i64) -> (Vec<DayBar>, f64) {
    let mut per_day: BTreeMap<i64, (Decimal, Decimal, Decimal)> = BTreeMap::new();
    let mut d = from;
    while d < to {
        per_day.insert(d, Default::default());
        d += 24 * attribution::HOUR_MS;
    }
    for p in &a.parts {
        let e = per_day
            .entry(period_start(p.hour_ms, Step::Day))
            .or_default();
        match p.kind {
            Kind::Used => e.0 += p.cost,
            Kind::HeldIdle => e.1 += p.cost,
            Kind::Idle | Kind::Unmonitored => e.2 += p.cost,
        }
    }
    let max = per_day
        .values()
        .map(|(u, h, i)| *u + *h + *i)
        .max()
        .unwrap_or(Decimal::ONE)
        .max(Decimal::new(1, 6));
    const HEIGHT: f64 = 160.0;
    const STEP: f64 = 22.0;
    let scale = |v: Decimal| (v / max).to_f64().unwrap_or(0.0).max(0.0) * HEIGHT;
    let bars = per_day
        .into_iter()
        .enumerate()
        .map(|(i, (day, (u, h, idle)))| {
            let (uh, hh, ih) = (scale(u), scale(h), scale(idle));
            DayBar {
                label: chrono::DateTime::from_timestamp_millis(day)
                    .map_or_else(String::new, |d| d.day().to_string()),
                x: i as f64 * STEP,
                idle_y: HEIGHT - ih,
                idle_h: ih,
                held_y: HEIGHT - ih - hh,
                held_h: hh,
                used_y: HEIGHT - ih - hh - uh,
                used_h: uh,
                total: dollars(u + h + idle),
            }
        })
        .collect::<Vec<_>>();
    let width = bars.len() as f64 * STEP;
    (bars, width)
}

async fn review(
    State(state): State<AppState>,
    user: SignedIn,
    Path(month): Path<String>,
) -> Response {
    let Some((from, to)) = month_range(&month) else {
        return error_page(
            StatusCode::NOT_FOUND,
            "No such month",
            "Months are written YYYY-MM, e.g. /review/2026-11.",
        );
    };
    let (prev_from, _) = this_month(from - 1);
    let loaded = async {
        let a = attribution::compute(state.store.as_ref(), &state.rate_card, from, to).await?;
        let prev =
            attribution::compute(state.store.as_ref(), &state.rate_card, prev_from, from).await?;
        let incidents = state.store.incidents(from, to).await?;
        Ok::<_, crate::store::StoreError>((a, prev, incidents))
    }
    .await;
    let (a, prev, incidents) = match loaded {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "review page");
            return error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "Try again in a minute.",
            );
        }
    };
    let t = totals(&a);
    let usd = t.iter().find(|t| t.currency == "USD").or(t.first());
    let total = usd.map_or(Decimal::ZERO, |t| t.cost);
    let previous_total = totals(&prev)
        .iter()
        .find(|t| t.currency == "USD")
        .map_or(Decimal::ZERO, |t| t.cost);
    let change = if previous_total.is_zero() {
        "no spend the month before".to_owned()
    } else {
        let diff = total - previous_total;
        let pct = (diff / previous_total * Decimal::from(100)).round_dp(1);
        format!(
            "{}{} ({}{}%) against {}",
            if diff.is_sign_negative() { "−" } else { "+" },
            dollars(diff.abs()),
            if pct.is_sign_negative() { "" } else { "+" },
            pct,
            label(prev_from)
        )
    };
    let tables = vec![
        table(&a, GroupBy::Model, "By model", "model", total),
        table(&a, GroupBy::Team, "By team", "team", total),
        table(&a, GroupBy::Endpoint, "By endpoint", "endpoint", total),
        table(
            &a,
            GroupBy::Experiment,
            "By experiment",
            "experiment",
            total,
        ),
        table(
            &a,
            GroupBy::PricingCategory,
            "By pricing",
            "pricing_category",
            total,
        ),
        table(&a, GroupBy::Cluster, "By cluster", "cluster", total),
    ];
    let (days, chart_width) = days(&a, from, to);
    let now = now_ms();
    let mut incidents: Vec<IncidentView> = incidents
        .into_iter()
        .map(|r| incident_view(r, now))
        .collect();
    incidents.sort_by_key(|i| std::cmp::Reverse(i.wasted));
    incidents.truncate(10);
    render(&ReviewPage {
        chrome: Some(Chrome::from(&user)),
        previous: label(prev_from),
        next: label(to),
        month: label(from),
        total: dollars(total),
        previous_total: dollars(previous_total),
        change,
        held_idle: dollars(usd.map_or(Decimal::ZERO, |t| t.held_idle_cost)),
        idle: dollars(usd.map_or(Decimal::ZERO, |t| t.idle_cost)),
        unmonitored: dollars(usd.map_or(Decimal::ZERO, |t| t.unmonitored_cost)),
        unattributed: dollars(usd.map_or(Decimal::ZERO, |t| t.unattributed_cost)),
        gpu_hours: format!("{:.0}", usd.map_or(0.0, |t| t.gpu_hours)),
        estimated: a.parts.iter().any(|p| p.estimated),
        tables,
        days,
        chart_width,
        incidents,
        from: month.clone(),
        to: label(to),
    })
    .into_response()
}
