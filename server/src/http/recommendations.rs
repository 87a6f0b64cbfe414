//! `GET /api/v1/recommendations` and the `/recommendations` page.

use std::time::Duration;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::page::{error_page, render, Chrome};
use super::AppState;
use crate::attribution::{attribute, hour_floor, HOUR_MS};
use crate::error::ApiError;
use crate::money::cents;
use crate::now_ms;
use crate::recommend::{recommend, Options, Recommendations};
use crate::session::SignedIn;
use crate::store::StoreError;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/recommendations", get(page))
        .route("/api/v1/recommendations", get(api))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LookbackQuery {
    lookback: Option<String>,
}

fn lookback(q: &LookbackQuery) -> Result<i64, ApiError> {
    let d = match &q.lookback {
        None => Duration::from_secs(7 * 86_400),
        Some(t) => humantime::parse_duration(t).map_err(|_| ApiError::BadRequest {
            message: format!("{t:?} is not a duration such as 7d or 72h"),
            field: Some("lookback".into()),
        })?,
    };
    let ms = d.as_millis() as i64;
    if !(HOUR_MS..=35 * 24 * HOUR_MS).contains(&ms) {
        return Err(ApiError::BadRequest {
            message: "lookback must be between 1h and 35d".into(),
            field: Some("lookback".into()),
        });
    }
    Ok(ms)
}

async fn compute(state: &AppState, lookback_ms: i64) -> Result<Recommendations, StoreError> {
    let to = hour_floor(now_ms()) + HOUR_MS;
    let from = to - lookback_ms;
    let hosts = state.store.hosts().await?;
    let windows = state.store.attribution_windows(from, to).await?;
    let processes = state.store.process_windows(from, to).await?;
    let lines = state.store.cost_lines(from, to).await?;
    let attribution = attribute(
        hosts,
        &windows,
        &processes,
        &lines,
        &state.rate_card,
        from,
        to,
    );
    Ok(recommend(
        &attribution,
        &windows,
        &processes,
        &state.rate_card,
        lookback_ms,
        Options::default(),
    ))
}

async fn api(
    State(state): State<AppState>,
    _user: SignedIn,
    query: Result<Query<LookbackQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Recommendations>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::BadRequest {
        message: e.body_text(),
        field: None,
    })?;
    Ok(Json(compute(&state, lookback(&q)?).await?))
}

#[derive(Template)]
#[template(path = "recommendations.html")]
struct RecommendationsPage {
    chrome: Option<Chrome>,
    r: Recommendations,
    total_saving: String,
}

async fn page(State(state): State<AppState>, user: SignedIn) -> Response {
    match compute(&state, 7 * 24 * HOUR_MS).await {
        Ok(r) => {
            let total: rust_decimal::Decimal = r
                .right_size
                .iter()
                .map(|x| x.monthly_saving)
                .sum::<rust_decimal::Decimal>()
                + r.spot
                    .iter()
                    .map(|x| x.monthly_saving)
                    .sum::<rust_decimal::Decimal>();
            render(&RecommendationsPage {
                chrome: Some(Chrome::from(&user)),
                total_saving: format!("${}", cents(total)),
                r,
            })
        }
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
