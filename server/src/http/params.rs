//! What the API's handlers share: reading their parameters (ranges, months, formats) with a 400
//! that names the one at fault, and answering with CSV.

use axum::extract::Query;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::clock::now_ms;
use crate::error::ApiError;
use gpuledger_core::allocation::calendar_month;
use gpuledger_core::time::month_label;

/// A 400 naming the parameter or body field at fault.
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
        Some(t) => gpuledger_core::allocation::parse_bound(t).ok_or_else(|| {
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

/// A query string as `T`, or a 400 that says what is wrong with it (an unknown parameter, one
/// given twice, a value of the wrong kind).
pub(super) fn query_of<T>(
    query: Result<Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, ApiError> {
    query.map(|Query(q)| q).map_err(|e| ApiError::BadRequest {
        message: e.body_text(),
        field: None,
    })
}

/// `?month=YYYY-MM`: the calendar month an operation is about.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct MonthQuery {
    /// The calendar month, `YYYY-MM` (this month by default).
    #[param(pattern = r"^[0-9]{4}-[0-9]{2}$", example = "2026-10")]
    pub month: Option<String>,
}

/// `month` (this month when absent) as its range and its label.
pub(super) fn month_range(month: Option<String>) -> Result<((i64, i64), String), String> {
    let month = month.unwrap_or_else(|| month_label(now_ms()));
    calendar_month(&month)
        .map(|r| (r, month.clone()))
        .ok_or_else(|| format!("must be a calendar month, YYYY-MM, got {month:?}"))
}

/// [`month_range`] of a [`MonthQuery`], or a 400 naming `month`.
pub(super) fn month_asked(
    query: Result<Query<MonthQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<((i64, i64), String), ApiError> {
    month_range(query_of(query)?.month).map_err(|m| bad("month", m))
}

/// What a table of the API comes as: `format=json` (the default) or `format=csv`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum TableFormat {
    Json,
    Csv,
}

impl TableFormat {
    /// The `format` parameter, or a 400 naming it.
    pub(super) fn of(value: Option<&str>) -> Result<Self, ApiError> {
        choice("format", value, "json", "json, csv")
    }
}

/// Parses `value` (or `default` when absent) as one of the serialized names of `T`, or a 400
/// naming `field` and listing what it takes.
pub(super) fn choice<T: serde::de::DeserializeOwned>(
    field: &str,
    value: Option<&str>,
    default: &str,
    allowed: &str,
) -> Result<T, ApiError> {
    let v = value.unwrap_or(default);
    serde_json::from_value(serde_json::Value::String(v.to_owned()))
        .map_err(|_| bad(field, format!("must be one of {allowed}, got {v:?}")))
}

/// A CSV table, as a download named `filename`.
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
