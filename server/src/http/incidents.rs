//! Waste incidents for people (`/incidents`, `/incidents/{id}`), the Slack history with a test
//! button per route (`/alerts`), snoozes per cluster, and `GET /api/v1/incidents`.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::page::{error_page, render, Chrome};
use super::params::TableFormat;
use super::session::{database_unavailable, AdminForm, CsrfForm, SignedIn, TeamScoped};
use super::AppState;
use crate::clock::now_ms;
use crate::error::ApiError;
use crate::format::ago;
use crate::incidents;
use crate::slack;

use crate::store::alerts::IncidentRow;
use crate::store::alerts::SlackMessageRow;
use gpuledger_core::money::from_text;
use gpuledger_core::time::rfc3339;
use gpuledger_core::waste::IncidentKind;

use gpuledger_core::time::DAY_MS;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/incidents", get(incidents_page))
        .route("/incidents/{id}", get(incident_page))
        .route("/snoozes", post(snooze))
        .route("/alerts", get(alerts_page))
        .route("/alerts/test", post(test_route))
        .routes(routes!(incidents_api))
        .routes(routes!(idle_history_api))
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct IncidentView {
    pub id: i64,
    /// `cluster_idle`, `host_idle`, `gpus_idle`, `held_idle` or `gpu_fault`.
    pub kind: String,
    /// The kind, in words.
    pub title: String,
    pub cluster: String,
    /// The host, for an incident on one.
    pub hostname: Option<String>,
    /// The GPUs' (and MIG instances') UUIDs.
    pub gpus: Vec<String>,
    /// The GPUs by host and NVML index, with the processes holding them idle.
    pub devices: Vec<gpuledger_core::waste::IdleDevice>,
    /// Whose the GPUs are, per owner dimension, where the processes holding them say.
    pub owners: BTreeMap<String, String>,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339; null while open.
    pub ended_at: Option<String>,
    pub open: bool,
    /// Who said the GPUs are idle on purpose (no more reminders), and when.
    pub intended: Option<Intended>,
    /// How long it lasted (or has lasted so far), in words: `3 h`, `2 d`.
    pub idle_for: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost_per_hour: rust_decimal::Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub wasted: rust_decimal::Decimal,
    /// What `cost_per_hour` and `wasted` are in.
    pub currency: String,
    pub estimated: bool,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Intended {
    pub by: String,
    /// RFC 3339.
    pub at: String,
}

impl IncidentView {
    pub fn per_hour_text(&self) -> String {
        crate::format::money(self.cost_per_hour, &self.currency)
    }
    pub fn wasted_text(&self) -> String {
        crate::format::money(self.wasted, &self.currency)
    }
    /// One line per host's idle GPUs and per process holding one.
    pub fn device_lines(&self) -> Vec<String> {
        gpuledger_core::waste::describe_devices(&self.devices)
    }
    pub fn owners_text(&self) -> String {
        self.owners
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub fn view(r: IncidentRow, now: i64) -> IncidentView {
    let end = r.ended_ms.unwrap_or(now);
    IncidentView {
        id: r.id,
        title: IncidentKind::parse(&r.kind)
            .map_or("Idle", IncidentKind::title)
            .to_owned(),
        kind: r.kind,
        gpus: serde_json::from_str(&r.gpus_json).unwrap_or_default(),
        devices: serde_json::from_str(&r.devices_json).unwrap_or_default(),
        owners: serde_json::from_str(&r.owners_json).unwrap_or_default(),
        started_at: rfc3339(r.started_ms),
        ended_at: r.ended_ms.map(rfc3339),
        open: r.ended_ms.is_none(),
        intended: r.intended_by.clone().map(|by| Intended {
            by,
            at: r.intended_ms.map(rfc3339).unwrap_or_default(),
        }),
        idle_for: ago(end - r.started_ms).trim_end_matches(" ago").to_owned(),
        cost_per_hour: from_text(&r.cost_per_hour),
        wasted: from_text(&r.wasted),
        currency: r.currency,
        estimated: r.estimated != 0,
        cluster: r.cluster,
        hostname: r.hostname,
    }
}

#[derive(Template)]
#[template(path = "incidents.html")]
struct IncidentsPage {
    chrome: Option<Chrome>,
    is_admin: bool,
    csrf: String,
    open: Vec<IncidentView>,
    resolved: Vec<IncidentView>,
    clusters: Vec<String>,
    /// Preselected in the snooze form.
    selected: String,
    snoozes: Vec<(String, String, String)>,
    /// Idle and held-idle dollars of the last 30 days' whole hours, from the ledger.
    wasted_30d: String,
    /// Where they come from: the idle history of the same hours.
    wasted_30d_href: String,
}

/// The idle episodes of `[from, to)` from the ledger, those whose idle the ledger gave the
/// reader's teams for a scoped reader ([`crate::idle_history::in_scope`]): what
/// `/api/v1/idle/history` answers and what `/incidents` adds up.
async fn scoped_episodes(
    state: &AppState,
    user: &super::session::SignedIn,
    (from, to): (i64, i64),
) -> Result<Vec<crate::idle_history::IdleEpisode>, crate::store::StoreError> {
    let episodes = crate::idle_history::load(user.reads.store(), from, to).await?;
    let schema = &state.config.owners;
    Ok(episodes
        .into_iter()
        .filter(|e| crate::idle_history::in_scope(e, &user.scope, schema))
        .collect())
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    database_unavailable("incidents page", e)
}

/// Incidents overlapping `range`, those on the scope's GPUs alone.
async fn scoped_incidents(
    state: &AppState,
    store: &dyn crate::store::Store,
    range: (i64, i64),
    scope: &gpuledger_core::scope::Scope,
) -> Result<Vec<IncidentRow>, crate::store::StoreError> {
    let rows = incidents::overlapping(store, range.0, range.1).await?;
    incidents::for_scope(store, rows, range, (scope, &state.config.owners)).await
}

#[derive(Deserialize)]
struct IncidentsPageQuery {
    /// The cluster to preselect in the snooze form (Slack's "Snooze the cluster" links here).
    snooze: Option<String>,
}

/// `GET /incidents`: the last 30 days' incidents; a scoped reader's those on its teams' GPUs.
async fn incidents_page(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    Query(q): Query<IncidentsPageQuery>,
) -> Response {
    let now = now_ms();
    let range = (now - 30 * DAY_MS, now + 1);
    let rows = match scoped_incidents(&state, user.reads.store(), range, &user.scope).await {
        Ok(r) => r,
        Err(e) => return unavailable(e),
    };
    let snoozes = match incidents::active_snoozes(user.reads.store(), now).await {
        Ok(s) => s,
        Err(e) => return unavailable(e),
    };
    let clusters = incidents::clusters(user.reads.store())
        .await
        .unwrap_or_default();
    let views: Vec<IncidentView> = rows.into_iter().map(|r| view(r, now)).collect();
    // The last 30 days' whole hours, from the ledger: the same dollars the review and the idle
    // history have for those hours (incidents' own figures cover only their open spells).
    let hours = {
        let to = now - now.rem_euclid(gpuledger_core::time::HOUR_MS);
        (to - 30 * DAY_MS, to)
    };
    let episodes = match scoped_episodes(&state, &user, hours).await {
        Ok(e) => e,
        Err(e) => return unavailable(e),
    };
    // A scoped reader hears of snoozes of the clusters its incidents are on, no others.
    let snoozes: Vec<_> = snoozes
        .into_iter()
        .filter(|s| user.scope.is_all() || views.iter().any(|v| v.cluster == s.cluster))
        .collect();
    // Per currency, never added across.
    let mut wasted: BTreeMap<String, rust_decimal::Decimal> = BTreeMap::new();
    for e in &episodes {
        *wasted.entry(e.currency.clone()).or_default() += e.cost;
    }
    let wasted_30d = crate::format::money_sums(&wasted);
    let wasted_30d_href = format!(
        "/api/v1/idle/history?from={}&to={}",
        rfc3339(hours.0),
        rfc3339(hours.1)
    );
    let (open, resolved): (Vec<_>, Vec<_>) = views.into_iter().partition(|v| v.open);
    render(&IncidentsPage {
        chrome: Some(Chrome::from(&user)),
        is_admin: user.is_admin(),
        csrf: user.csrf.clone(),
        selected: q.snooze.unwrap_or_default(),
        open,
        resolved,
        clusters,
        snoozes: snoozes
            .into_iter()
            .map(|s| (s.cluster, rfc3339(s.until_ms), s.by_user))
            .collect(),
        wasted_30d,
        wasted_30d_href,
    })
}

#[derive(Template)]
#[template(path = "incident.html")]
struct IncidentPage {
    chrome: Option<Chrome>,
    i: IncidentView,
    messages: Vec<SlackMessageRow>,
}

/// `GET /incidents/ID`; not found for a scoped reader unless its GPUs are the reader's teams'.
async fn incident_page(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    Path(id): Path<i64>,
) -> Response {
    let found = async {
        let Some((row, messages)) = incidents::with_messages(user.reads.store(), id).await? else {
            return Ok(None);
        };
        // Judged as the list judges it: over the last 30 days, or since it started.
        let now = now_ms();
        let range = ((now - 30 * DAY_MS).min(row.started_ms), now + 1);
        let kept = incidents::for_scope(
            user.reads.store(),
            vec![row],
            range,
            (&user.scope, &state.config.owners),
        )
        .await?;
        Ok::<_, crate::store::StoreError>(kept.into_iter().next().map(|row| (row, messages)))
    };
    match found.await {
        Ok(Some((row, messages))) => render(&IncidentPage {
            chrome: Some(Chrome::from(&user)),
            i: view(row, now_ms()),
            messages,
        }),
        Ok(None) => error_page(
            StatusCode::NOT_FOUND,
            "No such incident",
            "It may have been typed wrong.",
        ),
        Err(e) => unavailable(e),
    }
}

#[derive(Deserialize)]
struct SnoozeForm {
    csrf: String,
    cluster: String,
    hours: i64,
}

impl CsrfForm for SnoozeForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

async fn snooze(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<SnoozeForm>,
) -> Response {
    if !(0..=24 * 14).contains(&form.hours) || form.cluster.trim().is_empty() {
        return error_page(
            StatusCode::BAD_REQUEST,
            "Cannot snooze that",
            "Pick a cluster and 0 to 336 hours.",
        );
    }
    let now = now_ms();
    match incidents::snooze(
        state.store.as_ref(),
        form.cluster.trim(),
        now + form.hours * 3_600_000,
        &user.username,
        now,
    )
    .await
    {
        Ok(()) => Redirect::to("/incidents").into_response(),
        Err(e) => unavailable(e),
    }
}

#[derive(Template)]
#[template(path = "alerts.html")]
struct AlertsPage {
    chrome: Option<Chrome>,
    is_admin: bool,
    csrf: String,
    routes: Vec<String>,
    messages: Vec<MessageView>,
}

struct MessageView {
    created_at: String,
    event: String,
    route: String,
    status: String,
    attempts: i64,
    last_error: String,
    incident_id: Option<i64>,
}

async fn alerts_page(State(state): State<AppState>, user: SignedIn) -> Response {
    match slack::history(user.reads.store(), 200).await {
        Ok(rows) => render(&AlertsPage {
            chrome: Some(Chrome::from(&user)),
            is_admin: user.is_admin(),
            csrf: user.csrf.clone(),
            routes: state.config.slack.labels(),
            messages: rows
                .into_iter()
                .map(|m| MessageView {
                    created_at: rfc3339(m.created_ms),
                    event: m.event,
                    route: m.route,
                    status: m.status,
                    attempts: m.attempts,
                    last_error: m.last_error.unwrap_or_default(),
                    incident_id: m.incident_id,
                })
                .collect(),
        }),
        Err(e) => unavailable(e),
    }
}

#[derive(Deserialize)]
struct TestForm {
    csrf: String,
    route: String,
}

impl CsrfForm for TestForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

async fn test_route(
    State(state): State<AppState>,
    AdminForm { form, .. }: AdminForm<TestForm>,
) -> Response {
    if state.config.slack.webhook(&form.route).is_none() {
        return error_page(
            StatusCode::BAD_REQUEST,
            "No such route",
            "Routes come from the server's config file.",
        );
    }
    match slack::send_test(
        state.store.as_ref(),
        &form.route,
        &state.config.slack.base_url,
        now_ms(),
    )
    .await
    {
        Ok(()) => Redirect::to("/alerts").into_response(),
        Err(e) => unavailable(e),
    }
}

/// A range and a format. Both bounds absent: the operation's own default range; one absent:
/// this month's.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct IncidentsQuery {
    /// Start, inclusive: YYYY-MM, YYYY-MM-DD or RFC 3339 (this month's start when only `to`
    /// is given).
    #[param(example = "2026-10")]
    from: Option<String>,
    /// End, exclusive, as `from`, at most 400 days after it (next month's start when only
    /// `from` is given).
    #[param(example = "2026-11")]
    to: Option<String>,
    /// `json` (the default) or `csv`.
    #[param(value_type = Option<TableFormat>)]
    format: Option<String>,
}

/// Incidents overlapping `[from, to)` (the last 30 days by default), as JSON or CSV.
#[utoipa::path(
    get,
    path = "/api/v1/incidents",
    operation_id = "get_incidents",
    tag = "waste",
    summary = "Waste incidents",
    description = "Incidents (GPUs idle or held idle past the cluster's threshold, and faulted \
        GPUs) overlapping the range, the last 30 days when neither bound is given, open or \
        ended, with their GPUs, owners, cost per hour and what they wasted. A team-scoped \
        reader gets its teams' incidents only.",
    params(IncidentsQuery),
    responses(
        (status = 200, description = "The incidents.", content(
            (Vec<IncidentView> = "application/json"),
            (String = "text/csv"),
        )),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn incidents_api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<IncidentsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = super::params::query_of(query)?;
    let format = TableFormat::of(q.format.as_deref())?;
    let now = now_ms();
    let (from, to) = if q.from.is_none() && q.to.is_none() {
        (now - 30 * DAY_MS, now + 1)
    } else {
        super::params::range(&q.from, &q.to)?
    };
    let views: Vec<IncidentView> =
        scoped_incidents(&state, user.reads.store(), (from, to), &user.scope)
            .await?
            .into_iter()
            .map(|r| view(r, now))
            .collect();
    match format {
        TableFormat::Json => Ok(Json(views).into_response()),
        TableFormat::Csv => {
            let body = incidents_csv(&views).map_err(|e| ApiError::Internal(e.to_string()))?;
            Ok(super::params::csv_response(body, "gpuledger-incidents.csv"))
        }
    }
}

/// Idle and held-idle runs of hours in a range.
#[derive(Serialize, utoipa::ToSchema)]
struct IdleHistory {
    /// `[from, to)`, RFC 3339.
    from: String,
    to: String,
    episodes: Vec<crate::idle_history::IdleEpisode>,
}

/// `GET /api/v1/idle/history?from=&to=[&format=csv]`: runs of idle and held-idle hours per
/// host from the ledger, for any range it holds (this month by default); their dollars add up
/// to the range's idle and held-idle dollars.
#[utoipa::path(
    get,
    path = "/api/v1/idle/history",
    operation_id = "get_idle_history",
    tag = "waste",
    summary = "Idle history",
    description = "Runs of idle and held-idle hours per host from the ledger, for any range \
        it holds (this month when neither bound is given); their dollars add up to the \
        range's idle and held-idle dollars. A team-scoped reader gets the runs the ledger \
        gave its teams (their processes held the GPUs, or the cluster is theirs): idle time \
        that names no team is the whole fleet's.",
    params(IncidentsQuery),
    responses(
        (status = 200, description = "The idle history.", content(
            (IdleHistory = "application/json"),
            (String = "text/csv"),
        )),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn idle_history_api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<IncidentsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = super::params::query_of(query)?;
    let format = TableFormat::of(q.format.as_deref())?;
    let (from, to) = if q.from.is_none() && q.to.is_none() {
        gpuledger_core::time::month_of(now_ms())
    } else {
        super::params::range(&q.from, &q.to)?
    };
    let episodes = scoped_episodes(&state, &user, (from, to)).await?;
    match format {
        TableFormat::Json => Ok(Json(IdleHistory {
            from: gpuledger_core::time::rfc3339(from),
            to: gpuledger_core::time::rfc3339(to),
            episodes,
        })
        .into_response()),
        TableFormat::Csv => {
            let mut w = crate::csv_out::SafeCsv::in_memory();
            let csv = (|| {
                w.write_record([
                    "cluster",
                    "host",
                    "kind",
                    "start",
                    "end",
                    "hours",
                    "gpus",
                    "owners",
                    "currency",
                    "cost",
                    "estimated",
                ])?;
                for e in &episodes {
                    let owners: Vec<String> = e
                        .owners
                        .iter()
                        .map(|(k, v)| format!("{k}={}", v.join("|")))
                        .collect();
                    w.write_record([
                        e.cluster.clone(),
                        e.hostname.clone(),
                        e.kind.to_owned(),
                        gpuledger_core::time::rfc3339(e.start_ms),
                        gpuledger_core::time::rfc3339(e.end_ms),
                        e.hours.to_string(),
                        e.gpus.join(" "),
                        owners.join(" "),
                        e.currency.clone(),
                        e.cost.to_string(),
                        e.estimated.to_string(),
                    ])?;
                }
                w.into_string()
            })()
            .map_err(|e: csv::Error| ApiError::Internal(e.to_string()))?;
            Ok(super::params::csv_response(
                csv,
                "gpuledger-idle-history.csv",
            ))
        }
    }
}

fn incidents_csv(views: &[IncidentView]) -> Result<String, csv::Error> {
    let mut w = crate::csv_out::SafeCsv::in_memory();
    w.write_record([
        "id",
        "kind",
        "cluster",
        "host",
        "gpus",
        "which_gpus",
        "owners",
        "started_at",
        "ended_at",
        "cost_per_hour",
        "wasted",
        "currency",
        "estimated",
    ])?;
    for v in views {
        w.write_record([
            v.id.to_string(),
            v.kind.clone(),
            v.cluster.clone(),
            v.hostname.clone().unwrap_or_default(),
            v.gpus.join(" "),
            v.device_lines().join("; "),
            v.owners_text(),
            v.started_at.clone(),
            v.ended_at.clone().unwrap_or_default(),
            v.cost_per_hour.to_string(),
            v.wasted.to_string(),
            v.currency.clone(),
            v.estimated.to_string(),
        ])?;
    }
    w.into_string()
}
