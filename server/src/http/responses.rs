//! The error answers, one type per status so each operation lists the ones it can give. Each is
//! an `ApiErrorBody`; the types describe answers [`crate::error::ApiError`] makes, and are never
//! built themselves.

#![allow(dead_code)]

use gpuledger_proto::ApiErrorBody;

/// The request is wrong: a parameter or body field (named in `field` where one is at fault)
/// has a value the operation does not take, or a parameter is unknown.
#[derive(utoipa::IntoResponses)]
#[response(status = 400)]
pub struct BadRequest(ApiErrorBody);

/// No valid session or token (`WWW-Authenticate: Bearer`).
#[derive(utoipa::IntoResponses)]
#[response(status = 401)]
pub struct Unauthorized(ApiErrorBody);

/// Not for this caller: `forbidden` (a write needs an admin's session and no other site's
/// page; a read-only token only reads; an agent token sends only its own cluster's hosts,
/// GPUs and sources, `field` naming what is not its own), or `out_of_scope` (it covers every
/// team, and the caller sees some only).
#[derive(utoipa::IntoResponses)]
#[response(status = 403)]
pub struct Forbidden(ApiErrorBody);

/// What the request names does not exist.
#[derive(utoipa::IntoResponses)]
#[response(status = 404)]
pub struct NotFound(ApiErrorBody);

/// What the request would do is already done, or conflicts with what is stored.
#[derive(utoipa::IntoResponses)]
#[response(status = 409)]
pub struct Conflict(ApiErrorBody);

/// The body is larger than the server takes (`max_body_bytes`).
#[derive(utoipa::IntoResponses)]
#[response(status = 413)]
pub struct TooLarge(ApiErrorBody);

/// The report decodes but a value is impossible (a utilization over 100 %, a window in the
/// future): `field` names it.
#[derive(utoipa::IntoResponses)]
#[response(status = 422)]
pub struct Invalid(ApiErrorBody);

/// The server failed; the log says why (the message never does).
#[derive(utoipa::IntoResponses)]
#[response(status = 500)]
pub struct Internal(ApiErrorBody);

/// The database cannot be reached just now: retry after the seconds `Retry-After` says.
#[derive(utoipa::IntoResponses)]
#[response(status = 503, headers(("Retry-After" = u32, description = "Seconds to wait.")))]
pub struct Unavailable(ApiErrorBody);

/// What every read of the ledger can answer besides its own: [`BadRequest`],
/// [`Unauthorized`], [`Unavailable`] and [`Internal`].
pub struct ReadErrors;

impl utoipa::IntoResponses for ReadErrors {
    fn responses() -> std::collections::BTreeMap<
        String,
        utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
    > {
        [
            BadRequest::responses(),
            Unauthorized::responses(),
            Unavailable::responses(),
            Internal::responses(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}
