//! Spend anomalies over HTTP: `GET /api/v1/anomalies[?month=YYYY-MM]` for everyone signed in;
//! dismissing one for admins, from the review's button (`POST /anomalies/dismiss`) or the API
//! (`POST /api/v1/anomalies/dismiss`, JSON only, refused when a browser says another site sent
//! it). The review shows them ([`view`]).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::post;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::page::error_page;
use super::params::{bad, month_asked, MonthQuery};
use super::session::{write_body, AdminForm, AdminOnly, CsrfForm, TeamScoped};
use super::AppState;
use crate::anomalies::{DismissError, OwnerAnomaly};
use crate::clock::now_ms;
use crate::error::ApiError;
use gpuledger_core::time::{month_label, rfc3339};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/anomalies/dismiss", post(dismiss_from_form))
        .routes(routes!(anomalies_api))
        .routes(routes!(dismiss_api))
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
#[utoipa::path(
    get,
    path = "/api/v1/anomalies",
    operation_id = "get_anomalies",
    tag = "anomalies",
    summary = "The month's anomalies",
    description = "Each watched owner whose daily spend left its pattern in the month (a spike, \
        or a new level that lasts), with its days, expected and actual cost, the hosts and \
        processes that drove it, and its dismissal. A team-scoped reader gets its teams' only.",
    params(MonthQuery),
    responses(
        (status = 200, description = "The anomalies.", body = AnomaliesResponse),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn anomalies_api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<MonthQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AnomaliesResponse>, ApiError> {
    let (range, month) = month_asked(query)?;
    let store = user.reads.store();
    let found = crate::anomalies::find(
        store,
        &state.config,
        range,
        (now_ms(), crate::ledger::Keep::NOTHING),
    )
    .await?;
    let anomalies = crate::anomalies::within_scope(found, (&user.scope, &state.config.owners));
    Ok(Json(AnomaliesResponse { month, anomalies }))
}

/// A month's anomalies.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AnomaliesResponse {
    /// `YYYY-MM`.
    month: String,
    anomalies: Vec<OwnerAnomaly>,
}

/// A dismissal as stored: the anomaly it names and who dismissed it, when and why.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Dismissed {
    dimension: String,
    key: String,
    currency: String,
    /// The anomaly's first day, `YYYY-MM-DD`.
    start: String,
    dismissed_by: String,
    /// RFC 3339.
    dismissed_at: String,
    reason: String,
}

/// An anomaly to dismiss (from the review page's form, or as JSON), named by its owner,
/// currency and first day. Missing fields are read as empty, and refused naming the field.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct DismissForm {
    #[serde(default)]
    #[schema(ignore)]
    csrf: String,
    /// A watched owner dimension (`team`).
    #[serde(default)]
    #[schema(required = true)]
    dimension: String,
    /// The owner under it (`research`).
    #[serde(default)]
    #[schema(required = true)]
    key: String,
    #[serde(default)]
    #[schema(required = true)]
    currency: String,
    /// The anomaly's first day, `YYYY-MM-DD`.
    #[serde(default)]
    #[schema(required = true)]
    start: String,
    /// Why it is not a problem, for whoever reads the review.
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
#[utoipa::path(
    post,
    path = "/api/v1/anomalies/dismiss",
    operation_id = "dismiss_anomaly",
    tag = "anomalies",
    summary = "Dismiss an anomaly",
    description = "Marks an anomaly as not a problem: the review shows it dismissed, with who \
        and why. Admins only.",
    request_body = DismissForm,
    responses(
        (status = 200, description = "Dismissed.", body = Dismissed),
        super::responses::BadRequest,
        super::responses::Unauthorized,
        super::responses::Forbidden,
        super::responses::NotFound,
        super::responses::Conflict,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security(("session" = [])),
)]
async fn dismiss_api(
    State(state): State<AppState>,
    AdminOnly(user): AdminOnly,
    headers: axum::http::HeaderMap,
    body: Result<Json<DismissForm>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Dismissed>, ApiError> {
    let form = write_body(&headers, body)?;
    let row = crate::anomalies::dismiss(
        state.store.as_ref(),
        &state.config,
        form.ask(),
        &user.username,
        now_ms(),
    )
    .await?;
    Ok(Json(Dismissed {
        dimension: row.dimension,
        key: row.owner_key,
        currency: row.currency,
        start: rfc3339(row.start_ms)
            .get(..10)
            .unwrap_or_default()
            .to_owned(),
        dismissed_by: row.dismissed_by,
        dismissed_at: rfc3339(row.dismissed_ms),
        reason: row.reason,
    }))
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
