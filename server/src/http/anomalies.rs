//! Spend anomalies over HTTP: `GET /api/v1/anomalies[?month=YYYY-MM]` for everyone signed in;
//! dismissing one for admins, from the review's button (`POST /anomalies/dismiss`) or the API
//! (`POST /api/v1/anomalies/dismiss`, JSON only, refused when a browser says another site sent
//! it). The review shows them ([`view`]).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::post;
use axum::{routing::get, Json, Router};
use serde::Deserialize;

use super::allocation::{bad, query_of};
use super::budgets::month_range;
use super::page::error_page;
use super::session::{write_body, AdminForm, AdminOnly, CsrfForm, TeamScoped};
use super::AppState;
use crate::anomalies::{DismissError, OwnerAnomaly};
use crate::error::ApiError;
use crate::format::money;
use crate::now_ms;
use gpuledger_core::time::{month_label, rfc3339};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/anomalies/dismiss", post(dismiss_from_form))
        .route("/api/v1/anomalies", get(anomalies_api))
        .route("/api/v1/anomalies/dismiss", post(dismiss_api))
}

#[derive(Debug, Deserialize)]
struct MonthQuery {
    month: Option<String>,
}

impl From<DismissError> for ApiError {
    fn from(e: DismissError) -> Self {
        match e {
            DismissError::Invalid { field, message } => bad(field, message),
            DismissError::NotFound(message) => ApiError::NotFound(message),
            DismissError::AlreadyDismissed(message) => ApiError::Conflict(message),
            DismissError::Store(s) => ApiError::Store(s),
        }
    }
}

/// `GET /api/v1/anomalies[?month=YYYY-MM]`: the month's anomalies (this month's by default),
/// each with its days, expected and actual cost, drivers and dismissal.
async fn anomalies_api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<MonthQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query_of(query)?;
    let (range, month) = month_range(q.month).map_err(|m| bad("month", m))?;
    let store = state.store.as_ref();
    let found = crate::anomalies::find(store, &state.config, range, now_ms()).await?;
    let found = crate::anomalies::within_scope(found, (&user.scope, &state.config.owners));
    Ok(Json(serde_json::json!({ "month": month, "anomalies": found })).into_response())
}

#[derive(Debug, Default, Deserialize)]
pub struct DismissForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    dimension: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    currency: String,
    /// The anomaly's first day, `YYYY-MM-DD`.
    #[serde(default)]
    start: String,
    #[serde(default)]
    reason: String,
}

impl CsrfForm for DismissForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl DismissForm {
    fn ask(&self) -> crate::anomalies::Dismiss<'_> {
        crate::anomalies::Dismiss {
            dimension: &self.dimension,
            key: &self.key,
            currency: &self.currency,
            start: &self.start,
            reason: &self.reason,
        }
    }
}

/// `POST /api/v1/anomalies/dismiss` (admins): `{dimension, key, currency, start, reason}`;
/// answers the dismissal as recorded, 404 for no such anomaly, 409 if already dismissed.
async fn dismiss_api(
    State(state): State<AppState>,
    AdminOnly(user): AdminOnly,
    headers: axum::http::HeaderMap,
    body: Result<Json<DismissForm>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let form = write_body(&headers, body)?;
    let row = crate::anomalies::dismiss(
        state.store.as_ref(),
        &state.config,
        form.ask(),
        &user.username,
        now_ms(),
    )
    .await?;
    Ok(Json(serde_json::json!({
        "dimension": row.dimension,
        "key": row.owner_key,
        "currency": row.currency,
        "start": &rfc3339(row.start_ms)[..10],
        "dismissed_by": row.dismissed_by,
        "dismissed_at": rfc3339(row.dismissed_ms),
        "reason": row.reason,
    }))
    .into_response())
}

/// `POST /anomalies/dismiss` (admins): the review's button; back to the review's anomalies.
async fn dismiss_from_form(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<DismissForm>,
) -> Response {
    let done = crate::anomalies::dismiss(
        state.store.as_ref(),
        &state.config,
        form.ask(),
        &user.username,
        now_ms(),
    )
    .await;
    match done {
        Ok(row) => Redirect::to(&format!("/review/{}#anomalies", month_label(row.start_ms)))
            .into_response(),
        Err(DismissError::Store(e)) => {
            super::session::database_unavailable("dismissing an anomaly", e)
        }
        Err(e) => error_page(StatusCode::BAD_REQUEST, "Not dismissed", &e.to_string()),
    }
}

/// An anomaly as the review shows it.
pub struct AnomalyView {
    pub owner: String,
    pub kind: &'static str,
    pub since: String,
    pub days: usize,
    /// Today is one of its days, judged on its cost so far.
    pub ongoing: bool,
    pub expected: String,
    pub actual: String,
    pub excess: String,
    /// Where the money went, one line per GPU.
    pub drivers: Vec<String>,
    pub dismissed: Option<String>,
    /// What the dismiss button sends.
    pub dimension: String,
    pub key: String,
    pub currency: String,
    pub start: String,
}

pub fn view(a: &OwnerAnomaly) -> AnomalyView {
    let m = |d| money(d, &a.currency);
    let day = |ms: i64| rfc3339(ms).get(..10).unwrap_or_default().to_owned();
    AnomalyView {
        owner: format!("{} {}", a.dimension.replace('_', " "), a.key),
        kind: a.anomaly.kind.label(),
        since: day(a.anomaly.start_ms),
        days: a.anomaly.days.len(),
        ongoing: a.anomaly.days.iter().any(|d| d.partial),
        expected: m(a.anomaly.expected),
        actual: m(a.anomaly.actual),
        excess: m(a.anomaly.excess()),
        drivers: a.drivers.iter().map(|d| d.label(m)).collect(),
        dismissed: a.dismissed.as_ref().map(|d| {
            let mut s = format!("dismissed by {} on {}", d.by, day(d.at_ms));
            if !d.reason.is_empty() {
                s.push_str(": ");
                s.push_str(&d.reason);
            }
            s
        }),
        dimension: a.dimension.clone(),
        key: a.key.clone(),
        currency: a.currency.clone(),
        start: day(a.anomaly.start_ms),
    }
}
