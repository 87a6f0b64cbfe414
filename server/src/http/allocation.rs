//! `GET /api/v1/allocation`: who the GPU bill belongs to, and `GET /api/v1/billing/imports`:
//! what bills are in, with their exact totals.

use crate::config::OwnerSchema;
use axum::extract::{Query, RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::session::{SignedIn, TeamScoped};
use super::AppState;
use crate::allocation::{self, AllocationRow, GroupBy, Step, Totals};
use crate::error::ApiError;
use crate::focus_export::Format;
use crate::ledger;
use crate::now_ms;
use crate::session::Scope;
use crate::store::RollupGrain;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/allocation", get(get_allocation))
        .route("/api/v1/billing/imports", get(get_imports))
        .route("/api/v1/billing/periods", get(get_periods))
}

#[derive(Debug, Default)]
struct AllocationQuery {
    from: Option<String>,
    to: Option<String>,
    by: Option<String>,
    step: Option<String>,
    format: Option<String>,
    /// Filters: only the parts whose key under that dimension (an owner dimension of the
    /// schema or a fleet dimension, by name) is this value. Any other name is refused.
    filters: std::collections::BTreeMap<String, String>,
}

impl AllocationQuery {
    /// Reads the query string. Filter names come from the owner schema, so they are read by
    /// hand rather than by a fixed struct; a name given twice (`team=a&team=b`) is refused
    /// rather than one value silently winning.
    fn parse(raw: Option<&str>) -> Result<Self, ApiError> {
        let mut q = AllocationQuery::default();
        let mut seen = std::collections::BTreeSet::new();
        for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
            if !seen.insert(name.clone()) {
                return Err(bad(
                    &name,
                    "is given more than once; each parameter takes one value",
                ));
            }
            let slot = match name.as_ref() {
                "from" => &mut q.from,
                "to" => &mut q.to,
                "by" => &mut q.by,
                "step" => &mut q.step,
                "format" => &mut q.format,
                _ => {
                    q.filters.insert(name.into_owned(), value.into_owned());
                    continue;
                }
            };
            *slot = Some(value.into_owned());
        }
        Ok(q)
    }

    fn filters(&self, schema: &OwnerSchema) -> Result<Vec<(GroupBy, String)>, ApiError> {
        self.filters
            .iter()
            .map(|(name, value)| match GroupBy::parse(name, schema) {
                Some(by) => Ok((by, value.clone())),
                None => Err(bad(
                    name,
                    format!(
                        "is not a parameter: from, to, by, step, format, or a filter by {}",
                        dimension_names(schema)
                    ),
                )),
            })
            .collect()
    }
}

/// The dimensions `by=` and the filters take, in order, comma-separated.
fn dimension_names(schema: &OwnerSchema) -> String {
    GroupBy::all(schema)
        .iter()
        .map(|g| g.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(Debug, Serialize)]
struct AllocationResponse {
    from: String,
    to: String,
    by: GroupBy,
    step: Step,
    rows: Vec<AllocationRow>,
    totals: Vec<Totals>,
}

pub(super) fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::BadRequest {
        message: message.into(),
        field: Some(field.to_owned()),
    }
}

/// `from` and `to` (this calendar month when absent), checked.
pub(super) fn range(from: &Option<String>, to: &Option<String>) -> Result<(i64, i64), ApiError> {
    let (default_from, default_to) = gpuledger_core::time::month_of(now_ms());
    let bound = |field: &str, v: &Option<String>, default: i64| match v {
        None => Ok(default),
        Some(t) => allocation::parse_bound(t).ok_or_else(|| {
            bad(
                field,
                format!("{t:?} is not YYYY-MM, YYYY-MM-DD or an RFC 3339 time"),
            )
        }),
    };
    let from = bound("from", from, default_from)?;
    let to = bound("to", to, default_to)?;
    if to <= from {
        return Err(bad("to", "must be after from"));
    }
    if to - from > 400 * gpuledger_core::time::DAY_MS {
        return Err(bad("to", "a range may span at most 400 days"));
    }
    Ok((from, to))
}

/// A query string as `T`, or a 400 that says what is wrong with it.
pub(super) fn query_of<T>(
    query: Result<Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, ApiError> {
    query.map(|Query(q)| q).map_err(|e| ApiError::BadRequest {
        message: e.body_text(),
        field: None,
    })
}

/// Parses `value` as one of the snake_case names of `T`.
fn choice<T: serde::de::DeserializeOwned>(
    field: &str,
    value: Option<&str>,
    default: &str,
    allowed: &str,
) -> Result<T, ApiError> {
    let v = value.unwrap_or(default);
    serde_json::from_value(serde_json::Value::String(v.to_owned()))
        .map_err(|_| bad(field, format!("must be one of {allowed}, got {v:?}")))
}

/// Everything below is narrowed to the reader's teams: a team-scoped viewer or token gets its
/// teams' parts only, and no bill line outside GPU hosts.
async fn get_allocation(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = AllocationQuery::parse(raw.as_deref())?;
    let (from, to) = range(&q.from, &q.to)?;
    let schema = &state.config.owners;
    let by_name = q.by.as_deref().unwrap_or("team");
    let by = GroupBy::parse(by_name, schema).ok_or_else(|| {
        bad(
            "by",
            format!(
                "must be one of {}, got {by_name:?}",
                dimension_names(schema)
            ),
        )
    })?;
    let step: Step = choice("step", q.step.as_deref(), "day", "hour, day, month")?;
    let format = q.format.as_deref().unwrap_or("json");
    if !["json", "csv", "focus", "focus-parquet"].contains(&format) {
        return Err(bad("format", "must be json, csv, focus or focus-parquet"));
    }
    // Hourly rows when hours are asked for (FOCUS rows are hourly charge periods); days
    // otherwise: a month is ~30 rows a GPU instead of ~720.
    // Rows per host unless single GPUs are asked for.
    let per_gpu = by == GroupBy::Gpu || q.filters.contains_key("gpu");
    let grain_for = |step| match step {
        Step::Hour => RollupGrain::Hour,
        _ if per_gpu => RollupGrain::Day,
        _ => RollupGrain::HostDay,
    };
    let filters = q.filters(schema)?;
    let scope = user.scope;
    match format {
        "focus" => {
            return Ok(focus_response(
                state,
                from,
                to,
                (filters, scope),
                Format::Csv,
            ))
        }
        "focus-parquet" => {
            return Ok(focus_response(
                state,
                from,
                to,
                (filters, scope),
                Format::Parquet,
            ))
        }
        _ => {}
    }
    let loaded = ledger::load(state.store.as_ref(), from, to, grain_for(step)).await?;
    let loaded = scope.restrict(loaded, schema);
    // No filter: the parts as loaded, not a copy.
    let attributed = if filters.is_empty() {
        loaded
    } else {
        allocation::filtered(&loaded, &filters)
    };
    match format {
        "csv" => {
            let rows = allocation::group(&attributed, by, step);
            let body = allocation::to_csv(&rows).map_err(|e| ApiError::Internal(e.to_string()))?;
            Ok(csv_response(body, "gpuledger-allocation.csv"))
        }
        _ => Ok(Json(AllocationResponse {
            from: gpuledger_core::time::rfc3339(from),
            to: gpuledger_core::time::rfc3339(to),
            by,
            step,
            rows: allocation::group(&attributed, by, step),
            totals: allocation::totals(&attributed),
        })
        .into_response()),
    }
}

/// The FOCUS export, streamed: written a day at a time by a task as the client reads it. A
/// failure half-way ends the download early (the client sees a cut body), and is logged.
fn focus_response(
    state: AppState,
    from: i64,
    to: i64,
    (filters, scope): (Vec<(GroupBy, String)>, Scope),
    format: Format,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(2);
    tokio::spawn(async move {
        // Each send waits for the client to take the day before: memory stays at a day or two.
        let selection = crate::focus_export::Selection {
            filters: &filters,
            scope: &scope,
            schema: &state.config.owners,
        };
        let result = crate::focus_export::write_export(
            state.store.as_ref(),
            from,
            to,
            &selection,
            format,
            &tx,
        )
        .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "FOCUS export");
            let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
        }
    });
    let body = axum::body::Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async {
        rx.recv().await.map(|chunk| (chunk, rx))
    }));
    let (content_type, file) = match format {
        Format::Csv => ("text/csv; charset=utf-8", "gpuledger-allocation-focus.csv"),
        Format::Parquet => (
            "application/vnd.apache.parquet",
            "gpuledger-allocation-focus.parquet",
        ),
    };
    (
        [
            (header::CONTENT_TYPE, content_type.to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{file}\""),
            ),
        ],
        body,
    )
        .into_response()
}

pub(super) fn csv_response(body: String, filename: &str) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{filename}\""),
            ),
        ],
        body,
    )
        .into_response()
}

#[derive(Debug, Serialize)]
struct ImportView {
    id: i64,
    source: String,
    name: String,
    imported_at: String,
    rows: i64,
    current_rows: i64,
    billed_total: String,
    effective_total: String,
}

async fn get_imports(
    State(state): State<AppState>,
    _user: SignedIn,
) -> Result<Json<Vec<ImportView>>, ApiError> {
    let rows = crate::billing::imports(state.store.as_ref()).await?;
    Ok(Json(
        rows.into_iter()
            .map(|r| ImportView {
                id: r.id,
                source: r.source,
                name: r.name,
                imported_at: gpuledger_core::time::rfc3339(r.imported_ms),
                rows: r.row_count,
                current_rows: r.current_lines,
                billed_total: r.billed_total,
                effective_total: r.effective_total,
            })
            .collect(),
    ))
}

#[derive(Serialize)]
struct PeriodJson {
    provider: String,
    billing_account_id: String,
    billing_period_start: String,
    currency: String,
    /// Over the files in force.
    rows: i64,
    billed_total: String,
    effective_total: String,
    files: Vec<PeriodFileJson>,
}

#[derive(Serialize)]
struct PeriodFileJson {
    import_id: i64,
    name: String,
    source: String,
    delivery: Option<String>,
    imported_at: String,
    rows: i64,
    billed_total: Option<String>,
    effective_total: Option<String>,
    replaced_at: Option<String>,
    replaced_by: Option<i64>,
}

/// `GET /api/v1/billing/periods`: each billing period with the files that make it up.
async fn get_periods(
    State(state): State<AppState>,
    _user: SignedIn,
) -> Result<Json<Vec<PeriodJson>>, ApiError> {
    let rows = crate::billing::periods::file_rows(state.store.as_ref()).await?;
    Ok(Json(
        crate::billing::periods::periods_of(rows)
            .into_iter()
            .map(|p| PeriodJson {
                provider: p.provider,
                billing_account_id: p.billing_account_id,
                billing_period_start: gpuledger_core::time::rfc3339(p.period_start_ms),
                currency: p.currency,
                rows: p.rows,
                billed_total: gpuledger_core::money::to_text(p.billed_total),
                effective_total: gpuledger_core::money::to_text(p.effective_total),
                files: p
                    .files
                    .into_iter()
                    .map(|f| PeriodFileJson {
                        import_id: f.import_id,
                        name: f.name,
                        source: f.source,
                        delivery: f.delivery,
                        imported_at: gpuledger_core::time::rfc3339(f.imported_ms),
                        rows: f.row_count,
                        billed_total: f.billed_total,
                        effective_total: f.effective_total,
                        replaced_at: f.replaced_ms.map(gpuledger_core::time::rfc3339),
                        replaced_by: f.replaced_by,
                    })
                    .collect(),
            })
            .collect(),
    ))
}
