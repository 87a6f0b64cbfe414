//! `GET /api/v1/allocation`: who the GPU bill belongs to, and `GET /api/v1/billing/imports`:
//! what bills are in, with their exact totals.

use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpuledger_core::owners::OwnerSchema;
use serde::Serialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::params::{bad, choice, csv_response, range};
use super::session::{SignedIn, TeamScoped};
use super::AppState;
use crate::allocation;
use crate::clock::now_ms;
use crate::error::ApiError;
use crate::focus_export::Format;
use crate::ledger;
use crate::store::RollupGrain;
use gpuledger_core::allocation::AllocationRow;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::allocation::Step;
use gpuledger_core::allocation::Totals;
use gpuledger_core::scope::Scope;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_allocation))
        .routes(routes!(get_imports))
        .routes(routes!(get_periods))
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

/// The allocation as JSON: a row per period and key, and the range's totals per currency.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AllocationResponse {
    /// `[from, to)`, RFC 3339.
    from: String,
    to: String,
    by: GroupBy,
    step: Step,
    rows: Vec<AllocationRow>,
    totals: Vec<Totals>,
}

/// What the allocation comes as: a table (JSON or CSV), or the FOCUS export (CSV or Parquet).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub(super) enum AllocationFormat {
    Json,
    Csv,
    Focus,
    FocusParquet,
}

/// Everything below is narrowed to the reader's teams: a team-scoped viewer or token gets its
/// teams' parts only, and no bill line outside GPU hosts.
#[utoipa::path(
    get,
    path = "/api/v1/allocation",
    tag = "allocation",
    summary = "Who the GPU bill belongs to",
    description = "Every dollar of the range, attributed to a key of one dimension per period \
        (used, held idle, idle and unmonitored), with the range's totals; as JSON, CSV, or the \
        FOCUS export (every bill column kept, the FOCUS 1.3 `Allocated*` columns added). A \
        team-scoped reader gets its teams' parts only.",
    params(
        ("from" = Option<String>, Query, description = "Start, inclusive: YYYY-MM, YYYY-MM-DD \
            or RFC 3339 (the start of this month by default).", example = "2026-10"),
        ("to" = Option<String>, Query, description = "End, exclusive, as `from` (the start of \
            next month by default); at most 400 days after `from`.", example = "2026-11"),
        ("by" = Option<GroupBy>, Query, description = "The dimension rows are keyed by (the \
            owner dimension with the team role by default, else `cluster`)."),
        ("step" = Option<Step>, Query, description = "The period of a row (`day` by default)."),
        ("format" = Option<AllocationFormat>, Query, description = "`json` (the default), \
            `csv`, `focus` (FOCUS CSV) or `focus-parquet`; the FOCUS export has a row per \
            charge period: `by` and `step` are checked but do not shape it."),
        ("filters" = Option<std::collections::BTreeMap<String, String>>, Query, style = Form, explode,
            description = "Any dimension by name, as `<dimension>=<value>` (`team=research`): \
            only the parts whose key under it is that value. Each parameter once."),
    ),
    responses(
        (status = 200, description = "The allocation.", content(
            (AllocationResponse = "application/json"),
            (String = "text/csv"),
            (String = "application/vnd.apache.parquet"),
        )),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn get_allocation(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = AllocationQuery::parse(raw.as_deref())?;
    let (from, to) = range(&q.from, &q.to)?;
    let schema = &state.config.owners;
    let by = match q.by.as_deref() {
        // The team's dimension, whatever the schema calls it; a fleet without one by cluster.
        None => {
            GroupBy::role(schema, gpuledger_core::owners::Role::Team).unwrap_or(GroupBy::Cluster)
        }
        Some(name) => GroupBy::parse(name, schema).ok_or_else(|| {
            bad(
                "by",
                format!("must be one of {}, got {name:?}", dimension_names(schema)),
            )
        })?,
    };
    let step: Step = choice("step", q.step.as_deref(), "day", "hour, day, month")?;
    let format: AllocationFormat = choice(
        "format",
        q.format.as_deref(),
        "json",
        "json, csv, focus or focus-parquet",
    )?;
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
    let focus = match format {
        AllocationFormat::Focus => Some(Format::Csv),
        AllocationFormat::FocusParquet => Some(Format::Parquet),
        AllocationFormat::Json | AllocationFormat::Csv => None,
    };
    if let Some(focus) = focus {
        return Ok(focus_response(
            state,
            user.reads.shared(),
            from,
            to,
            (filters, scope),
            focus,
        ));
    }
    // By an owner dimension per day or month, unfiltered, for whoever may read each of its
    // values: the database sums the days per value (and the grid they drew on), a few rows a
    // day where host-days are one per host and owner.
    let by_value = match by {
        GroupBy::Owner(name)
            if step != Step::Hour
                && filters.is_empty()
                && (scope.is_all()
                    || schema.role(gpuledger_core::owners::Role::Team) == Some(name)) =>
        {
            Some(name)
        }
        _ => None,
    };
    let loaded = match by_value {
        Some(name) => {
            // Past days change only when the roll-up rewrites them: their sums per value are
            // kept after the first read.
            let store = user.reads.store();
            let keep = ledger::Keep::past_days(now_ms());
            ledger::load_by_value(store, from, to, name, keep).await?
        }
        None => ledger::load(user.reads.store(), from, to, grain_for(step)).await?,
    };
    let grid = crate::carbon::grid(&loaded, &state.config.carbon);
    let loaded = scope.restrict(loaded, schema);
    // No filter: the parts as loaded, not a copy.
    let attributed = if filters.is_empty() {
        loaded
    } else {
        gpuledger_core::allocation::filtered(&loaded, &filters)
    };
    match format {
        AllocationFormat::Csv => {
            let rows = gpuledger_core::allocation::group(&attributed, by, step, &grid);
            let body = allocation::to_csv(&rows).map_err(|e| ApiError::Internal(e.to_string()))?;
            Ok(csv_response(body, "gpuledger-allocation.csv"))
        }
        _ => Ok(Json(AllocationResponse {
            from: gpuledger_core::time::rfc3339(from),
            to: gpuledger_core::time::rfc3339(to),
            by,
            step,
            rows: gpuledger_core::allocation::group(&attributed, by, step, &grid),
            totals: gpuledger_core::allocation::totals(&attributed, &grid),
        })
        .into_response()),
    }
}

/// The FOCUS export, streamed: written a day at a time by a task as the client reads it. A
/// failure half-way ends the download early (the client sees a cut body), and is logged.
fn focus_response(
    state: AppState,
    store: std::sync::Arc<dyn crate::store::Store>,
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
        let result =
            crate::focus_export::write_export(store.as_ref(), from, to, &selection, format, &tx)
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

/// One bill file imported (or one Cost Explorer sync), with its exact totals.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ImportView {
    id: i64,
    /// Where it came from: `focus` (a FOCUS export) or `aws-cost-explorer` (a sync).
    source: String,
    name: String,
    /// RFC 3339.
    imported_at: String,
    rows: i64,
    /// Of its rows, those no later file of the same billing period replaced.
    current_rows: i64,
    /// Its totals in each currency it was billed in, by currency: amounts in two currencies
    /// are never added.
    totals: Vec<ImportTotalView>,
}

/// An import's lines in one currency.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ImportTotalView {
    /// ISO 4217, as the bill's `BillingCurrency`.
    currency: String,
    rows: u64,
    /// Decimal, exactly as the bill adds up.
    billed_total: String,
    effective_total: String,
}

#[utoipa::path(
    get,
    path = "/api/v1/billing/imports",
    tag = "billing",
    summary = "The bills imported",
    description = "Every bill file and sync imported, in the order imported, with its exact \
        totals in each currency it was billed in. Covers every team: a team-scoped reader gets \
        403.",
    responses(
        (status = 200, description = "The imports.", body = Vec<ImportView>),
        super::responses::Unauthorized,
        super::responses::Forbidden,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn get_imports(user: SignedIn) -> Result<Json<Vec<ImportView>>, ApiError> {
    let rows = crate::billing::imports(user.reads.store()).await?;
    Ok(Json(
        rows.into_iter()
            .map(|r| ImportView {
                id: r.id,
                source: r.source,
                name: r.name,
                imported_at: gpuledger_core::time::rfc3339(r.imported_ms),
                rows: r.row_count,
                current_rows: r.current_lines,
                totals: r
                    .totals
                    .iter()
                    .map(|(currency, t)| ImportTotalView {
                        currency: currency.clone(),
                        rows: t.rows,
                        billed_total: gpuledger_core::money::to_text(t.billed),
                        effective_total: gpuledger_core::money::to_text(t.effective),
                    })
                    .collect(),
            })
            .collect(),
    ))
}

/// One billing period of one account, and the files that make it up.
#[derive(Serialize, utoipa::ToSchema)]
struct PeriodJson {
    provider: String,
    billing_account_id: String,
    /// RFC 3339.
    billing_period_start: String,
    currency: String,
    /// Over the files in force.
    rows: i64,
    billed_total: String,
    effective_total: String,
    files: Vec<PeriodFileJson>,
}

/// A file of a billing period: in force, or replaced by a later delivery.
#[derive(Serialize, utoipa::ToSchema)]
struct PeriodFileJson {
    import_id: i64,
    name: String,
    source: String,
    /// The delivery the file came in, where the export names one.
    delivery: Option<String>,
    /// RFC 3339.
    imported_at: String,
    rows: i64,
    billed_total: Option<String>,
    effective_total: Option<String>,
    replaced_at: Option<String>,
    replaced_by: Option<i64>,
}

/// `GET /api/v1/billing/periods`: each billing period with the files that make it up.
#[utoipa::path(
    get,
    path = "/api/v1/billing/periods",
    tag = "billing",
    summary = "The billing periods",
    description = "Each billing period with its totals over the files in force, and every \
        file delivered for it. Covers every team: a team-scoped reader gets 403.",
    responses(
        (status = 200, description = "The periods.", body = Vec<PeriodJson>),
        super::responses::Unauthorized,
        super::responses::Forbidden,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn get_periods(user: SignedIn) -> Result<Json<Vec<PeriodJson>>, ApiError> {
    let rows = crate::billing::periods::file_rows(user.reads.store()).await?;
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
