//! `GET /api/v1/recommendations` and the `/recommendations` page.

use std::time::Duration;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Json;
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::page::{error_page, render, Chrome};
use super::params::TableFormat;
use super::session::TeamScoped;
use super::AppState;
use crate::clock::now_ms;
use crate::error::ApiError;
use crate::recommend::snapshots;
use crate::store::StoreError;
use gpuledger_core::recommend::Recommendations;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::HOUR_MS;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/recommendations", get(page))
        .routes(routes!(api))
        .routes(routes!(scale_to_zero_api))
        .routes(routes!(shape_api))
}

/// `GET /api/v1/shape[?month=YYYY-MM]`: the month's shape per GPU instance type.
#[utoipa::path(
    get,
    path = "/api/v1/shape",
    operation_id = "get_shape",
    tag = "waste",
    summary = "The shape of the work per GPU instance type",
    description = "Per GPU instance type over the month (up to the hour under way): the GPUs \
        held (used, held idle or idle) on average at each hour of the week (Monday first, \
        UTC), the always-on floor (GPUs held in all but 10 % of the hours), the median, the \
        peak and the GPU-hours, for the type and per team; and the purchase mix: the month \
        priced all on demand and with the floor's whole instances committed. A team-scoped \
        reader gets its teams' GPU time only, and no purchase mix.",
    params(super::params::MonthQuery),
    responses(
        (status = 200, description = "The types, most GPU-hours first.", body = ShapeResponse),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn shape_api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<super::params::MonthQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ShapeResponse>, ApiError> {
    let ((from, to), month) = super::params::month_asked(query)?;
    let types = crate::shape::for_range(
        user.reads.store(),
        &state.config.owners,
        &user.scope,
        (from, to),
        now_ms(),
    )
    .await?;
    // Buying is the whole fleet's: a team's reader gets its shape, not the fleet's advice.
    let purchase_mix = if user.scope.is_all() {
        let costs = crate::commitments::type_costs(user.reads.store(), from, to).await?;
        crate::purchase::of_shapes(&state.rate_card, &types, &costs)
    } else {
        Vec::new()
    };
    Ok(Json(ShapeResponse {
        month,
        types,
        purchase_mix,
    }))
}

/// A month's shape per GPU instance type, and what buying it each way would have cost.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct ShapeResponse {
    /// `YYYY-MM`.
    month: String,
    types: Vec<gpuledger_core::shape::TypeShape>,
    /// Per type the rate card prices: the month all on demand and with its floor's whole
    /// instances committed (at the rate card's `commit_1y`/`commit_3y`, else the committed rate
    /// the bill applied), the rest on demand. Empty for a team-scoped reader.
    purchase_mix: Vec<gpuledger_core::purchase::TypeMix>,
}

/// `GET /api/v1/scale-to-zero[?month=YYYY-MM]`: the month's scale-to-zero windows.
#[utoipa::path(
    get,
    path = "/api/v1/scale-to-zero",
    operation_id = "get_scale_to_zero",
    tag = "waste",
    summary = "Scale-to-zero windows",
    description = "Inference endpoints and experiments (notebooks, dev jobs) that held GPUs \
        idle in the same hours of the week, every week of the month they ran (three weeks at \
        least, four hours or more in a row, UTC): each window, and the evidence of turning \
        them off then: the quiet hours, the GPU-hours held, their rate and cost. A \
        team-scoped reader gets its teams' only.",
    params(super::params::MonthQuery),
    responses(
        (status = 200, description = "The windows, largest saving first.", body = ScaleToZeroResponse),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn scale_to_zero_api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<super::params::MonthQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ScaleToZeroResponse>, ApiError> {
    let ((from, to), month) = super::params::month_asked(query)?;
    let windows = crate::scale_to_zero::for_range(
        user.reads.store(),
        &state.config.owners,
        &user.scope,
        from,
        to,
    )
    .await?;
    Ok(Json(ScaleToZeroResponse { month, windows }))
}

/// A month's scale-to-zero windows.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct ScaleToZeroResponse {
    /// `YYYY-MM`.
    month: String,
    windows: Vec<crate::scale_to_zero::OwnerWindows>,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct LookbackQuery {
    /// How far back to look, as `7d` or `72h`: 1h to 35d (7d by default).
    #[param(example = "7d")]
    lookback: Option<String>,
    /// `YYYY-MM`: the range that month's review draws on instead (its last 7 days, up to now
    /// while it is under way). Not with `lookback`.
    #[param(example = "2026-10")]
    month: Option<String>,
    /// `json` (the default) or `csv`.
    #[param(value_type = Option<TableFormat>)]
    format: Option<String>,
}

fn lookback(q: &LookbackQuery) -> Result<i64, ApiError> {
    let d = match &q.lookback {
        None => Duration::from_millis(snapshots::DEFAULT_LOOKBACK_MS as u64),
        Some(t) => humantime::parse_duration(t).map_err(|_| ApiError::BadRequest {
            message: format!("{t:?} is not a duration such as 7d or 72h"),
            field: Some("lookback".into()),
        })?,
    };
    let ms = d.as_millis() as i64;
    if !(HOUR_MS..=35 * gpuledger_core::time::DAY_MS).contains(&ms) {
        return Err(ApiError::BadRequest {
            message: "lookback must be between 1h and 35d".into(),
            field: Some("lookback".into()),
        });
    }
    Ok(ms)
}

/// The range a query asks for at `now`: a month's review range, or a look-back to now.
fn asked_range(q: &LookbackQuery, now: i64) -> Result<snapshots::Range, ApiError> {
    let Some(month) = &q.month else {
        return Ok(snapshots::lookback_range(now, lookback(q)?));
    };
    let bad = |message: String| ApiError::BadRequest {
        message,
        field: Some("month".into()),
    };
    if q.lookback.is_some() {
        return Err(bad("month and lookback are two ranges: ask for one".into()));
    }
    let (from, to) = gpuledger_core::allocation::calendar_month(month)
        .ok_or_else(|| bad(format!("{month:?} is not a month such as 2026-10")))?;
    snapshots::review_range(from, to, now).ok_or_else(|| bad(format!("{month} has not begun")))
}

/// The range's recommendations, those of the reader's teams alone where it is scoped.
async fn compute(
    state: &AppState,
    store: &dyn crate::store::Store,
    range: snapshots::Range,
    scope: &Scope,
) -> Result<Recommendations, StoreError> {
    let now = now_ms();
    let all = snapshots::get(store, &state.rate_card, &state.config.owners, range, now).await?;
    crate::recommend::for_scope(store, all, range, (scope, &state.config.owners)).await
}

#[utoipa::path(
    get,
    path = "/api/v1/recommendations",
    operation_id = "get_recommendations",
    tag = "waste",
    summary = "What to change",
    description = "Over the look-back: serving on larger GPUs than it needs (right-size), \
        GPUs busy too little to keep (consolidate), training that could have run on spot, and \
        GPUs held idle to release, each with its cost and saving; the savings cover separate \
        GPUs and add up. A team-scoped reader gets its teams' only.",
    params(LookbackQuery),
    responses(
        (status = 200, description = "The recommendations.", content(
            (Recommendations = "application/json"),
            (String = "text/csv"),
        )),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<LookbackQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = super::params::query_of(query)?;
    let format = TableFormat::of(q.format.as_deref())?;
    let range = asked_range(&q, now_ms())?;
    let r = compute(&state, user.reads.store(), range, &user.scope).await?;
    if format == TableFormat::Csv {
        let body = recommendations_csv(&r).map_err(|e| ApiError::Internal(e.to_string()))?;
        return Ok(super::params::csv_response(
            body,
            "gpuledger-recommendations.csv",
        ));
    }
    Ok(Json(r).into_response())
}

/// Every recommendation as one row: what, where it runs now, what to change, the GPUs it
/// covers, and its cost and saving over the look-back (and a month, where the work is steady).
fn recommendations_csv(r: &Recommendations) -> Result<String, csv::Error> {
    let mut w = crate::csv_out::SafeCsv::in_memory();
    w.write_record([
        "kind",
        "key",
        "current",
        "recommended",
        "gpus",
        "lookback_days",
        "currency",
        "cost",
        "saving",
        "monthly_cost",
        "monthly_saving",
        "frees_commitment",
        "monthly_frees_commitment",
        "detail",
    ])?;
    let days = format!("{}", r.lookback_days);
    for x in &r.right_size {
        w.write_record([
            format!("right_size_{}", x.by),
            x.key.clone(),
            format!("{} x {}", x.gpus.len(), x.current_gpu),
            format!("{} ({})", x.recommended_gpu, x.recommended_instance_type),
            x.gpus.join(" "),
            days.clone(),
            x.currency.clone(),
            x.cost.to_string(),
            x.saving.to_string(),
            x.monthly_cost.to_string(),
            x.monthly_saving.to_string(),
            x.frees_commitment.to_string(),
            x.monthly_frees_commitment.to_string(),
            format!(
                "peak {} GB, p95 {}% now, {}% projected",
                x.peak_memory_gb, x.p95_util, x.projected_p95_util
            ),
        ])?;
    }
    for c in &r.consolidation {
        w.write_record([
            "consolidate".to_owned(),
            c.host.clone(),
            format!("average utilization {}%", c.avg_util),
            c.action.clone(),
            c.gpus.join(" "),
            days.clone(),
            c.currency.clone(),
            c.cost.to_string(),
            c.saving.to_string(),
            c.monthly_cost.to_string(),
            c.monthly_saving.to_string(),
            c.frees_commitment.to_string(),
            c.monthly_frees_commitment.to_string(),
            String::new(),
        ])?;
    }
    for s in &r.spot {
        w.write_record([
            "spot".to_owned(),
            s.experiment.clone(),
            format!("on-demand {}", s.instance_types.join(" ")),
            "spot".to_owned(),
            s.gpus.join(" "),
            days.clone(),
            s.currency.clone(),
            s.cost.to_string(),
            s.saving.to_string(),
            String::new(),
            String::new(),
            // On-demand hours only: a spot move frees no commitment.
            "0".to_owned(),
            String::new(),
            format!("{} GPU-hours run", s.gpu_hours),
        ])?;
    }
    for x in &r.release {
        let owners: Vec<String> = x.owners.iter().map(|(k, v)| format!("{k}={v}")).collect();
        w.write_record([
            "release".to_owned(),
            x.host.clone(),
            "held idle".to_owned(),
            x.action.clone(),
            x.gpus.join(" "),
            days.clone(),
            x.currency.clone(),
            x.cost.to_string(),
            x.saving.to_string(),
            String::new(),
            x.monthly_saving.to_string(),
            x.frees_commitment.to_string(),
            x.monthly_frees_commitment.to_string(),
            owners.join(" "),
        ])?;
    }
    w.into_string()
}

#[derive(Template)]
#[template(path = "recommendations.html")]
struct RecommendationsPage {
    chrome: Option<Chrome>,
    r: Recommendations,
    total_saving: String,
    total_frees: String,
}

impl RecommendationsPage {
    /// Money as every page shows it.
    fn money(&self, amount: &rust_decimal::Decimal, currency: &str) -> String {
        crate::format::money(*amount, currency)
    }
}

async fn page(State(state): State<AppState>, TeamScoped(user): TeamScoped) -> Response {
    let range = snapshots::lookback_range(now_ms(), snapshots::DEFAULT_LOOKBACK_MS);
    match compute(&state, user.reads.store(), range, &user.scope).await {
        Ok(r) => render(&RecommendationsPage {
            chrome: Some(Chrome::from(&user)),
            total_saving: crate::recommend::savings_text(&r),
            total_frees: crate::recommend::frees_text(&r),
            r,
        }),
        Err(e) => {
            tracing::error!(error = %e, "recommendations page");
            error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "Try again in a minute.",
            )
        }
    }
}
