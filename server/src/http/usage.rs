//! Units of work: `POST /api/v1/usage` takes request counts per endpoint from serving code (with
//! an agent token); `GET /api/v1/usage` answers cost per 1,000 requests per endpoint and
//! `GET /api/v1/runs` the cost of each training run, as JSON or CSV.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::owners::Role;
use serde::{Deserialize, Serialize};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::params::{bad, csv_response, query_of, range, TableFormat};
use super::session::TeamScoped;
use super::AppState;
use crate::error::ApiError;
use crate::ledger;
use crate::store::RollupGrain;

use crate::store::usage::RunProgress;
use crate::store::usage::UsageCount;
use crate::unit_costs::{self, EndpointUnitCost, TrainingRun};
use crate::{auth, clock::now_ms};
use gpuledger_core::scope::Scope;
use gpuledger_core::time::rfc3339;

/// Counts one post may carry.
pub const MAX_COUNTS: usize = 10_000;
const MAX_NAME: usize = 128;
const MAX_PERIOD_MS: i64 = 31 * gpuledger_core::time::DAY_MS;

pub fn router(max_body_bytes: usize) -> OpenApiRouter<AppState> {
    // What serving code posts is held to the body limit; the reads need none.
    let posted = OpenApiRouter::new()
        .routes(routes!(post_usage))
        .layer(DefaultBodyLimit::max(max_body_bytes));
    OpenApiRouter::new()
        .routes(routes!(get_usage))
        .routes(routes!(get_runs))
        .merge(posted)
}

/// Request counts from serving code, per endpoint and period, and training runs' progress.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct UsageReport {
    /// Who counted: a replica or pod name. Counts from different sources add up.
    #[schema(min_length = 1, max_length = 128)]
    source: String,
    /// At most 10,000.
    #[serde(default)]
    #[schema(max_items = 10_000)]
    counts: Vec<UsageCountIn>,
    /// How far training runs had got. At most 10,000.
    #[serde(default)]
    #[schema(max_items = 10_000)]
    progress: Vec<ProgressIn>,
}

/// The step (and epoch) a training run had reached at a time: cumulative, so resending it, or
/// several ranks sending the same, changes nothing.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ProgressIn {
    /// As the experiment owner dimension names the run (`llama-ft-7`).
    #[schema(min_length = 1, max_length = 128)]
    experiment: String,
    /// RFC 3339, not in the future, within the retention period.
    at: String,
    /// Optimizer steps done since the run began (a resumed run goes on counting).
    step: u64,
    /// Whole epochs done, where the run counts them.
    #[serde(default)]
    epoch: Option<u64>,
}

/// Requests an endpoint served in `[start, end)`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct UsageCountIn {
    /// As the endpoint owner dimension names it (`chat-api`).
    #[schema(min_length = 1, max_length = 128)]
    endpoint: String,
    /// RFC 3339; the period is `[start, end)`, at most 31 days, within the retention period.
    start: String,
    /// RFC 3339, not in the future.
    end: String,
    requests: u64,
    /// Tokens the endpoint read (prompts) in the period, where the serving code counts them:
    /// with them the endpoint's cost per 1M tokens is known.
    #[serde(default)]
    input_tokens: Option<u64>,
    /// Tokens it generated in the period.
    #[serde(default)]
    output_tokens: Option<u64>,
}

/// How many counts and progress reports were stored.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct UsageAck {
    stored: usize,
    progress: usize,
}

fn check_name(field: &str, value: &str) -> Result<(), ApiError> {
    if value.trim().is_empty() || value.chars().count() > MAX_NAME {
        return Err(bad(field, format!("must be 1 to {MAX_NAME} characters")));
    }
    if value.chars().any(char::is_control) {
        return Err(bad(field, "must not contain control characters"));
    }
    Ok(())
}

/// A usage post as checked: its source, counts and runs' progress.
pub(crate) type UsagePost = (String, Vec<UsageCount>, Vec<RunProgress>);

/// Decodes and checks a usage post, naming the field at fault.
pub(crate) fn parse(
    body: &[u8],
    now: i64,
    retention_ms: i64,
    skew_ms: i64,
) -> Result<UsagePost, ApiError> {
    let report: UsageReport = super::ingest::decode_json(body, "usage report")?;
    check_name("source", &report.source)?;
    if report.counts.len() > MAX_COUNTS {
        return Err(bad(
            "counts",
            format!("at most {MAX_COUNTS} counts per post"),
        ));
    }
    if report.progress.len() > MAX_COUNTS {
        return Err(bad(
            "progress",
            format!("at most {MAX_COUNTS} progress reports per post"),
        ));
    }
    let mut progress = Vec::with_capacity(report.progress.len());
    for (i, p) in report.progress.into_iter().enumerate() {
        let field = |name: &str| format!("progress[{i}].{name}");
        check_name(&field("experiment"), &p.experiment)?;
        let at_ms = chrono::DateTime::parse_from_rfc3339(&p.at)
            .map(|d| d.timestamp_millis())
            .map_err(|_| bad(&field("at"), format!("{:?} is not an RFC 3339 time", p.at)))?;
        if at_ms > now + skew_ms {
            return Err(bad(&field("at"), "is in the future"));
        }
        if at_ms < now - retention_ms {
            return Err(bad(&field("at"), "is older than the retention period"));
        }
        let whole =
            |name: &str, n: u64| i64::try_from(n).map_err(|_| bad(&field(name), "is too large"));
        progress.push(RunProgress {
            experiment: p.experiment,
            at_ms,
            step: whole("step", p.step)?,
            epoch: p.epoch.map(|e| whole("epoch", e)).transpose()?,
        });
    }
    let mut counts = Vec::with_capacity(report.counts.len());
    for (i, c) in report.counts.into_iter().enumerate() {
        let field = |name: &str| format!("counts[{i}].{name}");
        check_name(&field("endpoint"), &c.endpoint)?;
        let time = |name: &str, text: &str| {
            chrono::DateTime::parse_from_rfc3339(text)
                .map(|d| d.timestamp_millis())
                .map_err(|_| bad(&field(name), format!("{text:?} is not an RFC 3339 time")))
        };
        let start_ms = time("start", &c.start)?;
        let end_ms = time("end", &c.end)?;
        if end_ms <= start_ms {
            return Err(bad(&field("end"), "must be after start"));
        }
        if end_ms - start_ms > MAX_PERIOD_MS {
            return Err(bad(&field("end"), "a period may span at most 31 days"));
        }
        if end_ms > now + skew_ms {
            return Err(bad(&field("end"), "is in the future"));
        }
        if start_ms < now - retention_ms {
            return Err(bad(&field("start"), "is older than the retention period"));
        }
        // Bounded by the period, as an engine's counts are by their window: no sum of them
        // comes near a 64-bit integer.
        let period = end_ms - start_ms;
        let bounded = |name: &str, n: Option<u64>, per_second: u64| {
            crate::validate::count_within(&field(name), n, per_second, period)
                .map_err(|e| bad(&e.field, e.message))?;
            n.map(|n| i64::try_from(n).map_err(|_| bad(&field(name), "is too large")))
                .transpose()
        };
        let requests = bounded(
            "requests",
            Some(c.requests),
            crate::validate::MAX_REQUESTS_PER_SECOND,
        )?
        .unwrap_or_default();
        let tokens =
            |name: &str, n: Option<u64>| bounded(name, n, crate::validate::MAX_TOKENS_PER_SECOND);
        counts.push(UsageCount {
            endpoint: c.endpoint,
            start_ms,
            end_ms,
            requests,
            input_tokens: tokens("input_tokens", c.input_tokens)?,
            output_tokens: tokens("output_tokens", c.output_tokens)?,
        });
    }
    Ok((report.source, counts, progress))
}

/// Where refused request counts show on the fleet page, in place of a cluster.
const USAGE_SOURCES: &str = "request counts";

#[utoipa::path(
    post,
    path = "/api/v1/usage",
    tag = "agents",
    summary = "Send request counts",
    description = "Serving code's request (and, where it counts them, token) counts per \
        endpoint, with an agent token: what cost per 1,000 requests and per 1M tokens are \
        computed from. A source's count of an endpoint from a start replaces the one it sent \
        before; counts from different sources add up. A token posts counts only for \
        endpoints, and progress only for experiments, that ran on hosts it reports or that an \
        admin bound to it (`token bind`); anything else is refused whole with 403 naming the \
        field.",
    request_body = UsageReport,
    responses(
        (status = 200, description = "Stored.", body = UsageAck),
        super::responses::BadRequest,
        super::responses::Unauthorized,
        super::responses::Forbidden,
        super::responses::TooLarge,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security(("agent_token" = [])),
)]
async fn post_usage(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<UsageAck>, ApiError> {
    let token = auth::require_agent(state.store.as_ref(), &headers, now_ms()).await?;
    let body = body.map_err(|r| super::ingest::body_error(r, state.max_body_bytes))?;
    let now = now_ms();
    let (source, counts, progress) = parse(
        &body,
        now,
        state.limits.retention_ms,
        state.limits.max_clock_skew_ms,
    )?;
    if let Some(refusal) = unit_costs::record_counts(
        state.store.as_ref(),
        &state.config.owners,
        &source,
        (&counts, &progress),
        &token,
        now,
    )
    .await?
    {
        state.metrics.reject(refusal.kind.reason());
        return Err(
            super::ingest::refused(&state, &token, USAGE_SOURCES, &source, refusal, now).await,
        );
    }
    Ok(Json(UsageAck {
        stored: counts.len(),
        progress: progress.len(),
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct RangeQuery {
    /// Start, inclusive: YYYY-MM, YYYY-MM-DD or RFC 3339 (the start of this month by default).
    #[param(example = "2026-10")]
    from: Option<String>,
    /// End, exclusive, as `from` (the start of next month by default); at most 400 days
    /// after `from`.
    #[param(example = "2026-11")]
    to: Option<String>,
    /// `json` (the default) or `csv`.
    #[param(value_type = Option<TableFormat>)]
    format: Option<String>,
}

fn range_query(
    q: Result<Query<RangeQuery>, QueryRejection>,
) -> Result<(i64, i64, TableFormat), ApiError> {
    let q = query_of(q)?;
    let format = TableFormat::of(q.format.as_deref())?;
    let (from, to) = range(&q.from, &q.to)?;
    Ok((from, to, format))
}

/// Cost per 1,000 requests per endpoint over a range.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct UsageResponse {
    /// `[from, to)`, RFC 3339.
    from: String,
    to: String,
    endpoints: Vec<EndpointUnitCost>,
}

/// Cost per 1,000 requests per endpoint over `[from, to)`.
pub(super) async fn endpoint_costs(
    state: &AppState,
    store: &dyn crate::store::Store,
    a: &gpuledger_core::attribution::Attribution,
    range: (i64, i64),
    scope: &Scope,
) -> Result<Vec<EndpointUnitCost>, ApiError> {
    Ok(unit_costs::endpoint_costs_in(store, a, range, (&state.config.owners, scope)).await?)
}

/// `GET /api/v1/usage`: cost per 1,000 requests per endpoint; a scoped reader's endpoints only.
#[utoipa::path(
    get,
    path = "/api/v1/usage",
    tag = "unit costs",
    summary = "Cost per request",
    description = "Per endpoint over the range: its cost, the requests (and tokens) its \
        serving code posted or the agents read from its serving engine (`counted_by`), and \
        cost per 1,000 requests and per 1M tokens, exact to the micro-unit. A team-scoped \
        reader gets its teams' endpoints only.",
    params(RangeQuery),
    responses(
        (status = 200, description = "Cost per endpoint.", content(
            (UsageResponse = "application/json"),
            (String = "text/csv"),
        )),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn get_usage(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<RangeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (from, to, format) = range_query(query)?;
    let a = ledger::load(user.reads.store(), from, to, RollupGrain::Day).await?;
    let endpoints = endpoint_costs(&state, user.reads.store(), &a, (from, to), &user.scope).await?;
    if format == TableFormat::Csv {
        let body = unit_costs::endpoint_costs_csv(&endpoints)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        return Ok(csv_response(body, "gpuledger-cost-per-request.csv"));
    }
    Ok(Json(UsageResponse {
        from: rfc3339(from),
        to: rfc3339(to),
        endpoints,
    })
    .into_response())
}

/// Training runs over a range.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct RunsResponse {
    /// `[from, to)`, RFC 3339.
    from: String,
    to: String,
    runs: Vec<TrainingRun>,
}

/// `GET /api/v1/runs`: training runs, from a scoped reader's part of the ledger.
#[utoipa::path(
    get,
    path = "/api/v1/runs",
    tag = "unit costs",
    summary = "Cost per training run",
    description = "Each experiment that did GPU work in the range (by the owner dimension with \
        the experiment role; none without one): when it ran, its GPU-hours, cost and held-idle \
        cost, costliest first; with the steps and epochs it reported (`POST /api/v1/usage`, \
        `progress`), cost per 1,000 steps and per epoch. A team-scoped reader gets its teams' runs only.",
    params(RangeQuery),
    responses(
        (status = 200, description = "The runs.", content(
            (RunsResponse = "application/json"),
            (String = "text/csv"),
        )),
        super::responses::ReadErrors,
    ),
    security(("read_token" = []), ("session" = [])),
)]
async fn get_runs(
    State(state): State<AppState>,
    TeamScoped(user): TeamScoped,
    query: Result<Query<RangeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (from, to, format) = range_query(query)?;
    let schema = &state.config.owners;
    let runs = match GroupBy::role(schema, Role::Experiment) {
        Some(GroupBy::Owner(experiment)) => {
            let grain = RollupGrain::OwnerHour(experiment);
            let a = ledger::load(user.reads.store(), from, to, grain).await?;
            let mut runs = unit_costs::training_runs(&user.scope.restrict(a, schema), schema);
            let progress = unit_costs::progress_totals(user.reads.store(), from, to).await?;
            unit_costs::with_progress(&mut runs, &progress);
            runs
        }
        _ => Vec::new(),
    };
    if format == TableFormat::Csv {
        let body =
            unit_costs::training_runs_csv(&runs).map_err(|e| ApiError::Internal(e.to_string()))?;
        return Ok(csv_response(body, "gpuledger-training-runs.csv"));
    }
    Ok(Json(RunsResponse {
        from: rfc3339(from),
        to: rfc3339(to),
        runs,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_790_000_000_000;
    const DAY: i64 = 24 * 3_600_000;

    fn body(counts: &str) -> Vec<u8> {
        format!(r#"{{"source":"pod-1","counts":[{counts}]}}"#).into_bytes()
    }

    fn field_of(r: Result<UsagePost, ApiError>) -> Option<String> {
        match r {
            Err(ApiError::BadRequest { field, .. }) => field,
            other => panic!("expected a bad request, got {other:?}"),
        }
    }

    #[test]
    fn usage_posts_are_checked_field_by_field() {
        let ok = r#"{"endpoint":"chat","start":"2026-09-21T10:00:00Z","end":"2026-09-21T11:00:00Z","requests":1200}"#;
        let (source, counts, progress) = parse(&body(ok), NOW, 35 * DAY, 300_000).unwrap();
        assert_eq!(source, "pod-1");
        let most = r#"{"endpoint":"chat","start":"2026-09-21T10:00:00Z","end":"2026-09-21T11:00:00Z","requests":36000000000}"#;
        assert!(
            parse(&body(most), NOW, 35 * DAY, 300_000).is_ok(),
            "10 million a second"
        );
        assert!(progress.is_empty());
        assert_eq!(counts[0].requests, 1200);
        assert_eq!(counts[0].end_ms - counts[0].start_ms, 3_600_000);
        let bad_cases = [
            (
                r#"{"endpoint":"chat","start":"x","end":"2026-09-21T11:00:00Z","requests":1}"#,
                "counts[0].start",
            ),
            (
                r#"{"endpoint":"chat","start":"2026-09-21T11:00:00Z","end":"2026-09-21T10:00:00Z","requests":1}"#,
                "counts[0].end",
            ),
            (
                r#"{"endpoint":"","start":"2026-09-21T10:00:00Z","end":"2026-09-21T11:00:00Z","requests":1}"#,
                "counts[0].endpoint",
            ),
            (
                r#"{"endpoint":"chat","start":"2026-09-21T10:00:00Z","end":"2026-09-21T11:00:00Z","requests":-1}"#,
                "counts[0].requests",
            ),
            (
                r#"{"endpoint":"chat","start":"2026-09-21T10:00:00Z","end":"2026-09-21T11:00:00Z","requests":1,"x":1}"#,
                "counts[0].x",
            ),
            (
                r#"{"endpoint":"chat","start":"2026-09-21T10:00:00Z","end":"2026-12-21T11:00:00Z","requests":1}"#,
                "counts[0].end",
            ),
            (
                r#"{"endpoint":"chat","start":"2026-01-21T10:00:00Z","end":"2026-01-21T11:00:00Z","requests":1}"#,
                "counts[0].start",
            ),
            // More than 10 million requests a second over the hour, or 2^63 - 1 of them: no
            // count a sum of counts could overflow on.
            (
                r#"{"endpoint":"chat","start":"2026-09-21T10:00:00Z","end":"2026-09-21T11:00:00Z","requests":36000000001}"#,
                "counts[0].requests",
            ),
            (
                r#"{"endpoint":"chat","start":"2026-09-21T10:00:00Z","end":"2026-09-21T11:00:00Z","requests":9223372036854775807}"#,
                "counts[0].requests",
            ),
            (
                r#"{"endpoint":"chat","start":"2026-09-21T10:00:00Z","end":"2026-09-21T11:00:00Z","requests":1,"output_tokens":4611686018427387904}"#,
                "counts[0].output_tokens",
            ),
        ];
        for (count, field) in bad_cases {
            let got = field_of(parse(
                &body(&format!("{ok},{count}")),
                NOW,
                35 * DAY,
                300_000,
            ));
            assert_eq!(
                got.as_deref().map(|f| f.replace("counts[1]", "counts[0]")),
                Some(field.to_owned()),
                "{count}"
            );
        }
        assert_eq!(
            field_of(parse(br#"{"source":"","counts":[]}"#, NOW, 35 * DAY, 0)).as_deref(),
            Some("source")
        );
    }

    /// Training progress: a run, a time in the retention and not ahead, whole counts; a post
    /// may carry it alone.
    #[test]
    fn progress_reports_are_checked_field_by_field() {
        let post = |p: &str| format!(r#"{{"source":"trainer-0","progress":[{p}]}}"#).into_bytes();
        let ok =
            r#"{"experiment":"llama-ft-7","at":"2026-09-21T10:00:00Z","step":12000,"epoch":3}"#;
        let (_, counts, progress) = parse(&post(ok), NOW, 35 * DAY, 300_000).unwrap();
        assert!(counts.is_empty());
        assert_eq!(
            progress,
            [RunProgress {
                experiment: "llama-ft-7".into(),
                at_ms: 1_789_984_800_000,
                step: 12_000,
                epoch: Some(3),
            }]
        );
        for (p, field) in [
            (
                r#"{"experiment":"","at":"2026-09-21T10:00:00Z","step":1}"#,
                "progress[0].experiment",
            ),
            (
                r#"{"experiment":"r","at":"yesterday","step":1}"#,
                "progress[0].at",
            ),
            (
                r#"{"experiment":"r","at":"2026-12-21T10:00:00Z","step":1}"#,
                "progress[0].at",
            ),
            (
                r#"{"experiment":"r","at":"2026-01-21T10:00:00Z","step":1}"#,
                "progress[0].at",
            ),
            (
                r#"{"experiment":"r","at":"2026-09-21T10:00:00Z","step":-5}"#,
                "progress[0].step",
            ),
            (
                r#"{"experiment":"r","at":"2026-09-21T10:00:00Z","step":18446744073709551615}"#,
                "progress[0].step",
            ),
            (
                r#"{"experiment":"r","at":"2026-09-21T10:00:00Z"}"#,
                "progress[0]",
            ),
            (
                r#"{"experiment":"r","at":"2026-09-21T10:00:00Z","step":1,"loss":0.3}"#,
                "progress[0].loss",
            ),
        ] {
            assert_eq!(
                field_of(parse(&post(p), NOW, 35 * DAY, 300_000)).as_deref(),
                Some(field),
                "{p}"
            );
        }
    }
}
