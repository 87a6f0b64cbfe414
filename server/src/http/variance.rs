//! `GET /api/v1/variance`: why a month's spend changed against the month before, per owner, in
//! volume, idle, mix and price that add up exactly to the change ([`crate::variance`]).

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::params::{bad, csv_response, query_of, TableFormat};
use super::session::TeamScoped;
use super::AppState;

use crate::clock::now_ms;
use crate::error::ApiError;
use gpuledger_core::allocation::calendar_month;
use gpuledger_core::allocation::GroupBy;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(variance_api))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct VarianceQuery {
    /// The calendar month, `YYYY-MM` (this month by default, to date).
    #[param(pattern = r"^[0-9]{4}-[0-9]{2}$", example = "2026-10")]
    month: Option<String>,
    /// The dimension rows are keyed by (the owner dimension with the team role by default,
    /// else `cluster`).
    #[param(value_type = Option<GroupBy>)]
    by: Option<String>,
    /// `json` (the default) or `csv`.
    #[param(value_type = Option<TableFormat>)]
    format: Option<String>,
}

/// `?month=YYYY-MM` (this month by default), `by=` an owner or fleet dimension (the team's by
/// default), `format=json|csv`.
#[utoipa::path(
    get,
    path = "/api/v1/variance",
    operation_id = "get_variance",
    tag = "allocation",
    summary = "Why the month's spend changed",
    description = "The month's cost against the month before (a running month to date against \
        the same days of the month before), per key, split into volume, idle, mix and price \
        that add up exactly to the change. A team-scoped reader gets its teams' keys only.",
    params(VarianceQuery),
    responses(
        (status = 200, description = "The variance.", content(
            (crate::variance::Variance = "application/json"),
            (String = "text/csv"),
        )),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn variance_api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<VarianceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query_of(query)?;
    let format = TableFormat::of(q.format.as_deref())?;
    let now = now_ms();
    let month = q
        .month
        .unwrap_or_else(|| gpuledger_core::time::month_label(now));
    let (from, to) = calendar_month(&month).ok_or_else(|| {
        bad(
            "month",
            format!("must be a calendar month, YYYY-MM, got {month:?}"),
        )
    })?;
    let schema = &state.config.owners;
    let by = match q.by.as_deref() {
        None => {
            GroupBy::role(schema, gpuledger_core::owners::Role::Team).unwrap_or(GroupBy::Cluster)
        }
        Some(name) => GroupBy::parse(name, schema).ok_or_else(|| {
            let names: Vec<&str> = GroupBy::all(schema).iter().map(|g| g.as_str()).collect();
            bad("by", format!("{name:?} is none of {}", names.join(", ")))
        })?,
    };
    let store = user.reads.store();
    let v = crate::variance::for_month(
        store,
        (from, to, now),
        by,
        (&user.scope, schema),
        crate::ledger::Keep::past_days(now),
    )
    .await?;
    match format {
        TableFormat::Json => Ok(Json(v).into_response()),
        TableFormat::Csv => {
            let mut w = crate::csv_out::SafeCsv::in_memory();
            let csv = (|| {
                w.write_record([
                    by.as_str(),
                    "currency",
                    "previous_cost",
                    "cost",
                    "change",
                    "volume",
                    "idle",
                    "mix",
                    "price",
                    "previous_gpu_hours",
                    "gpu_hours",
                ])?;
                for r in v.rows.iter().chain([&v.total]) {
                    w.write_record([
                        r.key.clone(),
                        v.currency.clone(),
                        r.previous_cost.normalize().to_string(),
                        r.cost.normalize().to_string(),
                        r.change.normalize().to_string(),
                        r.volume.normalize().to_string(),
                        r.idle.normalize().to_string(),
                        r.mix.normalize().to_string(),
                        r.price.normalize().to_string(),
                        format!("{:.6}", r.previous_gpu_hours),
                        format!("{:.6}", r.gpu_hours),
                    ])?;
                }
                w.into_string()
            })()
            .map_err(|e: csv::Error| ApiError::Internal(e.to_string()))?;
            Ok(csv_response(
                csv,
                &format!("gpuledger-variance-{month}.csv"),
            ))
        }
    }
}
