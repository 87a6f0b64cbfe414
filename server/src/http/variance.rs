//! `GET /api/v1/variance`: why a month's spend changed against the month before, per owner, in
//! volume, idle, mix and price that add up exactly to the change ([`crate::variance`]).

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::allocation::{bad, csv_response, query_of};
use super::session::TeamScoped;
use super::AppState;
use crate::allocation::{calendar_month, GroupBy};
use crate::error::ApiError;
use crate::now_ms;

pub fn router() -> Router<AppState> {
    Router::new().route("/api/v1/variance", get(variance_api))
}

#[derive(Debug, Deserialize)]
struct VarianceQuery {
    month: Option<String>,
    by: Option<String>,
    format: Option<String>,
}

/// `?month=YYYY-MM` (this month by default), `by=` an owner or fleet dimension (the team's by
/// default), `format=json|csv`.
async fn variance_api(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<VarianceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query_of(query)?;
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
    let v = crate::variance::for_month(
        state.store.as_ref(),
        (from, to, now),
        by,
        (&user.scope, schema),
    )
    .await?;
    match q.format.as_deref().unwrap_or("json") {
        "json" => Ok(Json(v).into_response()),
        "csv" => {
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
        _ => Err(bad("format", "must be json or csv")),
    }
}
