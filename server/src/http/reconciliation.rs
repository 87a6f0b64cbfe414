//! The month's bill against the ledger, line by line, each figure linked to its rows (page
//! and API); admins sign a month off with its final bill; the month's commitment discounts
//! (API).

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use rust_decimal::Decimal;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::billing::{views, PeriodView};
use super::page::{error_page, render_with_status, Chrome};
use super::session::{AdminForm, CsrfForm, SignedIn};
use super::AppState;

use crate::closing::SignOff;
use crate::{clock::now_ms, format};
use gpuledger_core::allocation::calendar_month;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::time::month_label;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/billing/{month}", get(reconciliation_page))
        .route("/billing/{month}/sign-off", post(sign_off))
        .routes(routes!(reconciliation_api))
        .routes(routes!(commitments_api))
}

/// One line of a reconciliation: a label, the amount, and where its rows are.
pub struct ReconLine {
    pub label: String,
    pub amount: String,
    /// 0: the bill; 1: a part of it; 2: a part of a part; 3: a part of that.
    pub depth: u8,
    pub href: Option<String>,
}

/// One currency's reconciliation as the page shows it.
pub struct ReconView {
    pub currency: String,
    pub lines: Vec<ReconLine>,
    /// Zero difference: the ledger holds the bill to the cent.
    pub balanced: bool,
    pub difference: String,
    /// The billed hosts' lines and their attribution differ (should never happen).
    pub attribution_gap: Option<String>,
    pub estimated: String,
    pub estimated_parts: String,
    pub gpu_without_agent: Vec<GpuWithoutAgentRow>,
    /// Each commitment's unused dollars: (commitment, "", cost).
    pub unused_commitments: Vec<(String, String, String)>,
    /// Unused dollars the config charges to the owners each commitment covered, if any.
    pub unused_on_owners: Option<String>,
    pub not_gpu: Vec<(String, String, String)>,
    pub not_gpu_more: usize,
}

/// A GPU instance no agent reports, as the page lists it.
pub struct GpuWithoutAgentRow {
    pub resource: String,
    pub instance_type: String,
    pub cost: String,
    /// Whose its bill tags say it is ("team: search"); empty where they say nothing.
    pub owners: String,
    /// Whether the ledger holds its cost yet (on a host known from the bill alone).
    pub in_ledger: bool,
}

/// Whether the month can be signed off now, and if not, why.
pub struct SignOffView {
    /// Signed off already: by whom, when, with what note.
    pub done: Option<String>,
    /// The reason it cannot be signed off now; `None` when it can.
    pub blocked: Option<String>,
}

#[derive(Template)]
#[template(path = "reconciliation.html")]
struct ReconciliationPage {
    chrome: Option<Chrome>,
    is_admin: bool,
    csrf: String,
    sign_off: SignOffView,
    month: String,
    previous: String,
    next: Option<String>,
    pending_hours: i64,
    periods: Vec<PeriodView>,
    recs: Vec<ReconView>,
    api: String,
}

/// Rows of "not GPU" listed; the rest are counted (the FOCUS export has every line).
const NOT_GPU_LISTED: usize = 20;

/// `unwatched_by_team`: whether unmonitored cost may count under a team (see
/// `OwnerSchema::names_unwatched_owners`), so that its line links to all of it.
fn recon_view(
    r: &crate::reconciliation::Reconciliation,
    month: &str,
    next: &str,
    unwatched_by_team: bool,
) -> ReconView {
    let money = |d: Decimal| format::money(d, &r.currency);
    let alloc = format!("/api/v1/allocation?from={month}&to={next}&by=host&step=month&format=csv");
    let drill = |key: &str| format!("/review/{month}/team?key={key}");
    let line = |label: &str, amount: Decimal, depth: u8, href: Option<String>| ReconLine {
        label: label.to_owned(),
        amount: money(amount),
        depth,
        href,
    };
    let rows = |v: &[crate::reconciliation::ResourceCost], n: usize| {
        v.iter()
            .take(n)
            .map(|c| {
                (
                    c.resource.clone(),
                    c.instance_type.clone().unwrap_or_default(),
                    money(c.cost),
                )
            })
            .collect::<Vec<_>>()
    };
    let focus = format!("/api/v1/allocation?from={month}&to={next}&format=focus");
    let gap = r.bill_on_known_hosts - r.attributed.total();
    let mut lines = vec![
        line(
            "On the bill for the month's hours",
            r.bill,
            0,
            Some(focus.clone()),
        ),
        line(
            "GPU hosts in the ledger, attributed",
            r.attributed.total(),
            1,
            Some(alloc.clone()),
        ),
        line(
            "used by their owners",
            r.attributed.used,
            2,
            Some(alloc.clone()),
        ),
        line(
            "held idle (memory held at ~0%), charged to its owners",
            r.attributed.held_idle,
            2,
            Some(alloc.clone()),
        ),
        line(
            "idle (no process)",
            r.attributed.idle,
            2,
            Some(drill(gpuledger_core::allocation::IDLE_KEY)),
        ),
        line(
            "unmonitored (billed hours with no agent data)",
            r.attributed.unmonitored,
            2,
            Some(if unwatched_by_team {
                alloc.clone()
            } else {
                drill(gpuledger_core::allocation::UNMONITORED_KEY)
            }),
        ),
        line(
            "of it, GPU instances no agent reports, on hosts known from the bill",
            r.gpu_without_agent_total() - r.gpu_without_agent_unattributed(),
            3,
            Some("#gpu-without-agent".into()),
        ),
        line(
            "GPU instances no agent reports, not yet in the ledger",
            r.gpu_without_agent_unattributed(),
            1,
            Some("#gpu-without-agent".into()),
        ),
        line(
            "commitments' unused part, charged to the fleet",
            r.unused_commitments_total(),
            1,
            Some("#unused-commitments".into()),
        ),
        line(
            "not GPU hosts",
            r.not_gpu_total(),
            1,
            Some("#not-gpu".into()),
        ),
    ];
    if !r.unused_commitments_on_owners.is_zero() {
        // Inside the attributed total, after its kinds: where the config charges it.
        lines.insert(
            7,
            line(
                "of it, commitments' unused part charged to the owners they covered",
                r.unused_commitments_on_owners,
                2,
                Some("#unused-commitments".into()),
            ),
        );
    }
    ReconView {
        currency: r.currency.clone(),
        lines,
        balanced: r.difference.is_zero(),
        difference: money(r.difference),
        attribution_gap: (!gap.is_zero()).then(|| money(gap)),
        estimated: money(r.estimated.total()),
        estimated_parts: format!(
            "used {}, held idle {}, idle {}, unmonitored {}",
            money(r.estimated.used),
            money(r.estimated.held_idle),
            money(r.estimated.idle),
            money(r.estimated.unmonitored)
        ),
        gpu_without_agent: (r.gpu_without_agent.iter())
            .zip(rows(&r.gpu_without_agent, usize::MAX))
            .map(|(c, (resource, instance_type, cost))| GpuWithoutAgentRow {
                resource,
                instance_type,
                cost,
                owners: owners_text(c),
                in_ledger: c.in_ledger,
            })
            .collect(),
        unused_commitments: rows(&r.unused_commitments, usize::MAX),
        unused_on_owners: (!r.unused_commitments_on_owners.is_zero())
            .then(|| money(r.unused_commitments_on_owners)),
        not_gpu: rows(&r.not_gpu, NOT_GPU_LISTED),
        not_gpu_more: r.not_gpu.len().saturating_sub(NOT_GPU_LISTED),
    }
}

/// Who a GPU instance no agent reports belongs to, as its tags say: `team: vision; owner: dana`.
fn owners_text(c: &crate::reconciliation::ResourceCost) -> String {
    (c.owners.iter())
        .map(|(dimension, values)| {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            format!("{}: {}", dimension.replace('_', " "), values.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The month's bill against the ledger (GPU instances without agent named by their tags'
/// owners), and the hours still waiting for the roll-up: what the page and the API show.
async fn month_reconciliation(
    state: &AppState,
    store: &dyn crate::store::Store,
    from: i64,
    to: i64,
) -> Result<(Vec<crate::reconciliation::Reconciliation>, i64), crate::store::StoreError> {
    let recs = crate::reconciliation::for_range(
        store,
        &state.rate_card,
        &state.config.attribution_rules(),
        from,
        to,
    )
    .await?;
    Ok((recs, crate::closing::pending_hours(store, from, to).await?))
}

/// `/billing/YYYY-MM`: the month's bill against the ledger, each figure linked to its rows.
async fn reconciliation_page(
    State(state): State<AppState>,
    user: SignedIn,
    axum::extract::Path(month): axum::extract::Path<String>,
) -> Response {
    let Some((from, to)) = calendar_month(&month) else {
        return error_page(
            StatusCode::NOT_FOUND,
            "No such month",
            "Reconciliations are at /billing/YYYY-MM, for example /billing/2026-10.",
        );
    };
    let loaded = async {
        let (recs, pending) = month_reconciliation(&state, user.reads.store(), from, to).await?;
        let periods = crate::billing::periods::all(user.reads.store()).await?;
        let sign_offs = crate::closing::sign_offs(user.reads.store()).await?;
        Ok::<_, crate::store::StoreError>((recs, pending, periods, sign_offs))
    }
    .await;
    let (recs, pending_hours, periods, sign_offs) = match loaded {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "reconciliation page");
            return error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "Try again in a minute.",
            );
        }
    };
    let next = month_label(to);
    let periods = periods
        .into_iter()
        .filter(|p| p.period_start_ms >= from && p.period_start_ms < to)
        .collect();
    let close = state.close.with_sign_offs(&sign_offs);
    let unwatched_by_team = state
        .config
        .owners
        .names_unwatched_owners(GroupBy::TEAM.as_str());
    let sign_off = SignOffView {
        done: sign_offs.iter().find(|s| s.month_ms == from).map(|s| {
            format!(
                "Signed off by {} at {}{}: its bill is final and so are its figures.",
                s.by_user,
                crate::format::utc_minute(s.signed_ms),
                if s.note.is_empty() {
                    String::new()
                } else {
                    format!(" (\u{201c}{}\u{201d})", s.note)
                }
            )
        }),
        blocked: crate::closing::sign_off_blocked(&close, &recs, pending_hours, from, to, now_ms()),
    };
    render_with_status(
        StatusCode::OK,
        &ReconciliationPage {
            chrome: Some(Chrome::from(&user)),
            is_admin: user.is_admin(),
            csrf: user.csrf.clone(),
            sign_off,
            previous: month_label(from - 1),
            next: (to <= now_ms()).then(|| next.clone()),
            pending_hours,
            periods: views(periods),
            recs: recs
                .iter()
                .map(|r| recon_view(r, &month, &next, unwatched_by_team))
                .collect(),
            api: format!("/api/v1/billing/reconciliation?month={month}"),
            month,
        },
    )
}

#[derive(serde::Deserialize)]
struct SignOffForm {
    csrf: String,
    #[serde(default)]
    note: String,
}

impl CsrfForm for SignOffForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

fn sign_off_unavailable(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "sign-off");
    error_page(
        StatusCode::SERVICE_UNAVAILABLE,
        "The database is unavailable",
        "Nothing was signed off. Try again in a minute.",
    )
}

/// `POST /billing/YYYY-MM/sign-off` (admins): the month's bill is final, close it now.
async fn sign_off(
    State(state): State<AppState>,
    axum::extract::Path(month): axum::extract::Path<String>,
    AdminForm { user, form }: AdminForm<SignOffForm>,
) -> Response {
    let Some((from, to)) = calendar_month(&month) else {
        return error_page(
            StatusCode::NOT_FOUND,
            "No such month",
            "Use /billing/YYYY-MM.",
        );
    };
    let note: String = form.note.trim().chars().take(500).collect();
    let signed = crate::closing::sign_off(
        state.store.as_ref(),
        &state.rate_card,
        state.close,
        (from, to),
        &user.username,
        note,
        now_ms(),
    )
    .await;
    match signed {
        Ok(SignOff::Blocked(why)) => error_page(
            StatusCode::CONFLICT,
            "This month cannot be signed off",
            &why,
        ),
        Ok(SignOff::Signed) => axum::response::IntoResponse::into_response(
            axum::response::Redirect::to(&format!("/billing/{month}")),
        ),
        Err(e) => sign_off_unavailable(e),
    }
}

/// `GET /api/v1/billing/reconciliation[?month=YYYY-MM]`: the same figures as JSON (this month
/// by default).
#[utoipa::path(
    get,
    path = "/api/v1/billing/reconciliation",
    operation_id = "get_reconciliation",
    tag = "billing",
    summary = "The month against the bill",
    description = "Per currency, the month's bill against the ledger: the lines on the \
        ledger's GPU hosts and what they were attributed to (used, held idle, idle, \
        unmonitored), GPU instances no agent reports, and everything else the bill charges; \
        the difference is what the ledger does not hold yet. Covers every team: a \
        team-scoped reader gets 403.",
    params(super::params::MonthQuery),
    responses(
        (status = 200, description = "The reconciliation.", body = ReconciliationResponse),
        super::responses::BadRequest,
        super::responses::Unauthorized,
        super::responses::Forbidden,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn reconciliation_api(
    State(state): State<AppState>,
    user: SignedIn,
    query: Result<
        axum::extract::Query<super::params::MonthQuery>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<axum::Json<ReconciliationResponse>, crate::error::ApiError> {
    let ((from, to), month) = super::params::month_asked(query)?;
    let (currencies, hours_waiting_for_rollup) =
        month_reconciliation(&state, user.reads.store(), from, to).await?;
    Ok(axum::Json(ReconciliationResponse {
        month,
        hours_waiting_for_rollup,
        currencies,
    }))
}

/// `GET /api/v1/billing/commitments[?month=YYYY-MM]`: the month's commitment discounts.
#[utoipa::path(
    get,
    path = "/api/v1/billing/commitments",
    operation_id = "get_commitments",
    tag = "billing",
    summary = "Commitment discounts: utilization, unused dollars, coverage, ends",
    description = "Each savings plan, reserved instance or committed-use discount the month's \
        bill names: the amortized cost of what it covered on GPU instances and elsewhere, \
        what it cost unused (charged to the fleet unless configured to the owners it covered: `unused_charged_to`), utilization, what its \
        purchase rows invoice in the month and when it ends (from an upfront purchase row or \
        the config's `[commitments.ends]`; expiring within 90 days is flagged). Per GPU \
        instance type, how much of its cost in the ledger commitments covered. Covers every \
        team: a \
        team-scoped reader gets 403.",
    params(super::params::MonthQuery),
    responses(
        (status = 200, description = "The month's commitments.", body = CommitmentsResponse),
        super::responses::BadRequest,
        super::responses::Unauthorized,
        super::responses::Forbidden,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn commitments_api(
    State(state): State<AppState>,
    user: SignedIn,
    query: Result<
        axum::extract::Query<super::params::MonthQuery>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<axum::Json<CommitmentsResponse>, crate::error::ApiError> {
    let ((from, to), month) = super::params::month_asked(query)?;
    let costs = crate::commitments::type_costs(user.reads.store(), from, to).await?;
    let commitments = crate::commitments::for_range(
        user.reads.store(),
        &state.rate_card,
        &state.config,
        &costs,
        (from, to),
        now_ms(),
    )
    .await?;
    Ok(axum::Json(CommitmentsResponse { month, commitments }))
}

/// A month's commitment discounts.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct CommitmentsResponse {
    /// `YYYY-MM`.
    month: String,
    #[serde(flatten)]
    commitments: gpuledger_core::commitment::Commitments,
}

/// A month's reconciliation, one per currency its bill or ledger carries.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct ReconciliationResponse {
    /// `YYYY-MM`.
    month: String,
    /// Hours with new telemetry or bill lines the roll-up has not priced yet: until they are,
    /// the ledger is behind the bill by their cost.
    hours_waiting_for_rollup: i64,
    currencies: Vec<crate::reconciliation::Reconciliation>,
}
