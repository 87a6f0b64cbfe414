//! Budgets: the page at `/budgets` (admins set and remove them there) and
//! `/api/v1/budgets` (GET for everyone signed in; PUT and DELETE for admins, JSON only and
//! refused when a browser says another site sent them).

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::page::{error_page, render_with_status, Chrome};
use super::params::{bad, month_asked, month_range, MonthQuery};
use super::session::{write_body, AdminForm, AdminOnly, CsrfForm, SignedIn, TeamScoped};
use super::AppState;
use crate::budgets::{BudgetError, BudgetStatus, SetBudget};
use crate::clock::now_ms;
use crate::error::ApiError;
use crate::format::money;
use gpuledger_core::allocation::calendar_month;
use gpuledger_core::time::{month_label, month_of};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/budgets", get(budgets_page).post(set_from_form))
        .route("/budgets/delete", post(delete_from_form))
        .routes(routes!(budgets_api, set_api, delete_api))
}

impl From<BudgetError> for ApiError {
    fn from(e: BudgetError) -> Self {
        match e {
            BudgetError::Invalid { field, message } => bad(field, message),
            BudgetError::Store(s) => ApiError::Store(s),
        }
    }
}

/// `GET /api/v1/budgets[?month=YYYY-MM]`: each budget in force, spent, forecast and range.
#[utoipa::path(
    get,
    path = "/api/v1/budgets",
    operation_id = "get_budgets",
    tag = "budgets",
    summary = "The month's budgets",
    description = "Each budget in force in the month, with what its owner has spent, the \
        month's forecast and its range, and where it stands. A team-scoped reader gets its \
        teams' budgets only.",
    params(MonthQuery),
    responses(
        (status = 200, description = "The budgets.", body = BudgetsResponse),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn budgets_api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<MonthQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<BudgetsResponse>, ApiError> {
    let (range, month) = month_asked(query)?;
    let budgets = crate::budgets::for_month(
        user.reads.store(),
        (&state.config.owners, &user.scope),
        range,
        now_ms(),
    )
    .await?;
    Ok(Json(BudgetsResponse { month, budgets }))
}

/// A month's budgets.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct BudgetsResponse {
    /// `YYYY-MM`.
    month: String,
    budgets: Vec<BudgetStatus>,
}

/// A budget to set: for an owner, from a month on, until a later one replaces it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct SetBody {
    /// An owner dimension (`team`) or a fleet one (`cluster`).
    dimension: String,
    /// The owner under it (`research`).
    key: String,
    /// A month's amount: a decimal (`12000`, `12000.50`).
    #[schema(example = "12000.00")]
    amount: String,
    /// `USD` by default.
    #[serde(default = "usd")]
    currency: String,
    /// `YYYY-MM`, this month by default.
    from_month: Option<String>,
}

fn usd() -> String {
    "USD".into()
}

/// `PUT /api/v1/budgets` (admins): sets a budget; answers it as it now stands.
#[utoipa::path(
    put,
    path = "/api/v1/budgets",
    operation_id = "set_budget",
    tag = "budgets",
    summary = "Set a budget",
    description = "Sets an owner's monthly budget from a month on (replacing the one set from \
        that month, if any) and answers it as it now stands. Admins only.",
    request_body = SetBody,
    responses(
        (status = 200, description = "The budget as it now stands.", body = BudgetStatus),
        super::responses::BadRequest,
        super::responses::Unauthorized,
        super::responses::Forbidden,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security(("session" = [])),
)]
async fn set_api(
    State(state): State<AppState>,
    AdminOnly(user): AdminOnly,
    headers: axum::http::HeaderMap,
    body: Result<Json<SetBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<BudgetStatus>, ApiError> {
    let b = write_body(&headers, body)?;
    let from_month = b.from_month.unwrap_or_else(|| month_label(now_ms()));
    let status = crate::budgets::set(
        state.store.as_ref(),
        &state.config.owners,
        SetBudget {
            dimension: &b.dimension,
            key: &b.key,
            amount: &b.amount,
            currency: &b.currency,
            from_month: &from_month,
        },
        &user.username,
        now_ms(),
    )
    .await?;
    Ok(Json(status))
}

/// The budget to remove: the one set for this owner from this month.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct DeleteBody {
    dimension: String,
    key: String,
    /// `YYYY-MM`.
    from_month: String,
}

/// `DELETE /api/v1/budgets` (admins), the budget named in the JSON body: 204, or 404.
#[utoipa::path(
    delete,
    path = "/api/v1/budgets",
    operation_id = "delete_budget",
    tag = "budgets",
    summary = "Remove a budget",
    description = "Removes the budget set for an owner from a month; the one set before it, if \
        any, is in force again. Admins only.",
    request_body = DeleteBody,
    responses(
        (status = 204, description = "Removed."),
        super::responses::BadRequest,
        super::responses::Unauthorized,
        super::responses::Forbidden,
        super::responses::NotFound,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security(("session" = [])),
)]
async fn delete_api(
    State(state): State<AppState>,
    AdminOnly(_user): AdminOnly,
    headers: axum::http::HeaderMap,
    body: Result<Json<DeleteBody>, axum::extract::rejection::JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let b = write_body(&headers, body)?;
    let ((from, _), _) = month_range(Some(b.from_month)).map_err(|m| bad("from_month", m))?;
    if crate::budgets::remove(state.store.as_ref(), &b.dimension, &b.key, from).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!(
            "no budget of {} {} set from {}",
            b.dimension,
            b.key,
            month_label(from)
        )))
    }
}

/// A budget as the page shows it.
pub struct BudgetView {
    pub dimension: String,
    pub dimension_label: String,
    pub key: String,
    pub from_month: String,
    pub budget: String,
    pub spent: String,
    pub forecast: String,
    pub range: String,
    pub standing: &'static str,
    pub class: &'static str,
    pub set_by: String,
}

#[derive(Template)]
#[template(path = "budgets.html")]
struct BudgetsPage {
    chrome: Option<Chrome>,
    is_admin: bool,
    csrf: String,
    month: String,
    previous: String,
    next: String,
    budgets: Vec<BudgetView>,
    dimensions: Vec<&'static str>,
    error: Option<String>,
    /// The form as it was sent, kept after an error.
    form: BudgetForm,
}

fn view(s: &BudgetStatus) -> BudgetView {
    let m = |d| money(d, &s.currency);
    BudgetView {
        dimension: s.dimension.clone(),
        dimension_label: s.dimension.replace('_', " "),
        key: s.key.clone(),
        from_month: s.from_month.clone(),
        budget: m(s.amount),
        spent: m(s.forecast.spent),
        forecast: m(s.forecast.expected),
        range: if s.standing == gpuledger_core::budget::Standing::NotBegun {
            "the month has not begun".into()
        } else if s.forecast.basis_days == 0 {
            "no history yet".into()
        } else {
            format!("{} – {}", m(s.forecast.low), m(s.forecast.high))
        },
        standing: s.standing.as_str(),
        class: match s.standing {
            gpuledger_core::budget::Standing::Over => "over",
            gpuledger_core::budget::Standing::AtRisk => "risk",
            gpuledger_core::budget::Standing::OnTrack => "ok",
            gpuledger_core::budget::Standing::NotBegun => "not-begun",
        },
        set_by: s.set_by.clone(),
    }
}

async fn page(
    state: &AppState,
    user: &SignedIn,
    month: Option<String>,
    error: Option<String>,
    form: BudgetForm,
) -> Response {
    let ((from, to), month) = match month_range(month) {
        Ok(x) => x,
        Err(m) => return error_page(StatusCode::NOT_FOUND, "No such month", &m),
    };
    let rows = match crate::budgets::for_month(
        user.reads.store(),
        (&state.config.owners, &user.scope),
        (from, to),
        now_ms(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return super::session::database_unavailable("budgets page", e),
    };
    let status = if error.is_some() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    render_with_status(
        status,
        &BudgetsPage {
            chrome: Some(Chrome::from(user)),
            is_admin: user.is_admin(),
            csrf: user.csrf.clone(),
            previous: month_label(month_of(from - 1).0),
            next: month_label(to),
            month,
            budgets: rows.iter().map(view).collect(),
            dimensions: gpuledger_core::allocation::GroupBy::all(&state.config.owners)
                .into_iter()
                .map(|g| g.as_str())
                .collect(),
            error,
            form,
        },
    )
}

/// `GET /budgets[?month=YYYY-MM]`: budget, spent, forecast and range per owner, most at risk
/// first.
async fn budgets_page(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    Query(q): Query<PageQuery>,
) -> Response {
    page(&state, &user, q.month, None, BudgetForm::default()).await
}

/// The page's `?month=`; other parameters (a link's tracking tags) are no concern of a page.
#[derive(Debug, Deserialize)]
struct PageQuery {
    month: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct BudgetForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    pub dimension: String,
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub amount: String,
    #[serde(default)]
    pub currency: String,
    #[serde(default)]
    pub from_month: String,
}

impl CsrfForm for BudgetForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /budgets` (admins): sets a budget from the page's form.
async fn set_from_form(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<BudgetForm>,
) -> Response {
    let currency = if form.currency.trim().is_empty() {
        "USD"
    } else {
        form.currency.as_str()
    };
    let set = crate::budgets::set(
        state.store.as_ref(),
        &state.config.owners,
        SetBudget {
            dimension: &form.dimension,
            key: &form.key,
            amount: &form.amount,
            currency,
            from_month: &form.from_month,
        },
        &user.username,
        now_ms(),
    )
    .await;
    match set {
        Ok(_) => {
            Redirect::to(&format!("/budgets?month={}", form.from_month.trim())).into_response()
        }
        Err(BudgetError::Invalid { message, .. }) => {
            page(&state, &user, None, Some(message), form).await
        }
        Err(BudgetError::Store(e)) => super::session::database_unavailable("setting a budget", e),
    }
}

/// `POST /budgets/delete` (admins): removes the budget the row's button names.
async fn delete_from_form(
    State(state): State<AppState>,
    AdminForm { form, .. }: AdminForm<BudgetForm>,
) -> Response {
    let Some((from, _)) = calendar_month(form.from_month.trim()) else {
        return error_page(StatusCode::BAD_REQUEST, "No such month", "Use YYYY-MM.");
    };
    match crate::budgets::remove(state.store.as_ref(), &form.dimension, &form.key, from).await {
        Ok(_) => Redirect::to("/budgets").into_response(),
        Err(e) => super::session::database_unavailable("removing a budget", e),
    }
}
