//! `POST /api/v1/reports`: authenticated, size-limited, validated, stored once per batch id.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use gpuledger_proto::{IngestAck, Report, SPOOL_DEPTH_HEADER, SPOOL_DROPPED_HEADER};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::login::{client_key, Peer};
use super::AppState;
use crate::error::ApiError;
use crate::store::tokens::Refusal;
use crate::store::tokens::TokenRow;
use crate::store::{AgentStatus, IngestOutcome};
use crate::{auth, clock::now_ms, validate};

pub fn router(max_body_bytes: usize) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(post_report))
        .layer(DefaultBodyLimit::max(max_body_bytes))
}

#[utoipa::path(
    post,
    path = "/api/v1/reports",
    tag = "agents",
    summary = "Send an agent's report",
    description = "One batch of an agent's windows, with an agent token: stored once per \
        `batch_id` (a repeat is acknowledged as `duplicate`, not stored again). The agent's \
        token may send only its own cluster's hosts and GPUs.",
    params(
        ("x-gpuledger-spool-depth" = Option<i64>, Header, description = "Batches waiting in the \
            agent's spool when this one was sent."),
        ("x-gpuledger-spool-dropped" = Option<i64>, Header, description = "Batches the agent \
            dropped because its spool was full."),
    ),
    request_body = Report,
    responses(
        (status = 200, description = "Stored, or a repeat of a stored batch.", body = IngestAck),
        super::responses::BadRequest,
        super::responses::Unauthorized,
        super::responses::Forbidden,
        super::responses::Conflict,
        super::responses::TooLarge,
        super::responses::Invalid,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security(("agent_token" = [])),
)]
async fn post_report(
    State(state): State<AppState>,
    peer: Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<IngestAck>, ApiError> {
    let started = Instant::now();
    let result = ingest(&state, &headers, peer, body).await;
    state
        .metrics
        .batch_seconds
        .observe(started.elapsed().as_secs_f64());
    match &result {
        Ok(ack) if ack.status == "duplicate" => {
            state.metrics.reports_duplicate.inc();
        }
        Ok(ack) => {
            state.metrics.reports_accepted.inc();
            state.metrics.windows_stored.inc_by(ack.windows as u64);
        }
        Err(ApiError::Refused(r)) => state.metrics.reject(r.kind.reason()),
        Err(e) => state.metrics.reject(e.code()),
    }
    result.map(Json)
}

fn header_i64(headers: &HeaderMap, name: &str) -> Option<i64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// Decodes a report, naming the field at fault (`windows[0].gpus[1].util_avg`) when it is wrong.
pub fn decode(body: &[u8]) -> Result<Report, ApiError> {
    decode_json(body, "report")
}

/// Decodes a JSON body of any API type, naming the field at fault.
pub(crate) fn decode_json<T: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::BadRequest {
            message: format!("invalid {what}: {}", e.inner()),
            field: (path != ".").then_some(path),
        }
    })?;
    // One document a body: a second one after it (two reports sent as one) would otherwise be
    // dropped while the first is answered as stored.
    de.end().map_err(|e| ApiError::BadRequest {
        message: format!("invalid {what}: {e}: a body holds one JSON document"),
        field: None,
    })?;
    Ok(value)
}

/// The answer to a body that could not be read: too large, or otherwise unreadable.
pub(crate) fn body_error(rejection: BytesRejection, max_body_bytes: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge(max_body_bytes)
    } else {
        ApiError::BadRequest {
            message: rejection.body_text(),
            field: None,
        }
    }
}

async fn ingest(
    state: &AppState,
    headers: &HeaderMap,
    peer: Peer,
    body: Result<Bytes, BytesRejection>,
) -> Result<IngestAck, ApiError> {
    let now = now_ms();
    let token = auth::require_agent(state.store.as_ref(), headers, now).await?;
    let address = client_key(headers, peer.0, state.trust_forwarded_for);
    auth::note_use(state.store.as_ref(), &token, &address, now).await?;
    let body = body.map_err(|r| body_error(r, state.max_body_bytes))?;
    let report = decode(&body)?;
    validate::validate(&report, now, &state.limits)?;
    if let Err(refusal) = auth::authorize_report(state.store.as_ref(), &token, &report.host).await?
    {
        let host = &report.host;
        return Err(refused(state, &token, &host.cluster, &host.hostname, refusal, now).await);
    }
    if let Some(refusal) = window_in_closed_month(state, &report, now).await? {
        let host = &report.host;
        return Err(refused(state, &token, &host.cluster, &host.hostname, refusal, now).await);
    }
    if let Some(refusal) =
        auth::window_overlap(state.store.as_ref(), &report, token.id, now).await?
    {
        let host = &report.host;
        return Err(refused(state, &token, &host.cluster, &host.hostname, refusal, now).await);
    }
    let agent = AgentStatus {
        spool_depth: header_i64(headers, SPOOL_DEPTH_HEADER),
        spool_dropped: header_i64(headers, SPOOL_DROPPED_HEADER),
    };
    let status = match state.store.ingest(&report, token.id, agent, now).await? {
        IngestOutcome::Stored => {
            state.metrics.count_owners_unknown(&report);
            "stored"
        }
        IngestOutcome::Duplicate => "duplicate",
        IngestOutcome::Refused(refusal) => {
            let host = &report.host;
            return Err(refused(state, &token, &host.cluster, &host.hostname, refusal, now).await);
        }
    };
    state.metrics.set_agent_spool(
        &report.host.cluster,
        &report.host.hostname,
        agent.spool_depth,
        agent.spool_dropped,
    );
    Ok(IngestAck {
        batch_id: report.batch_id,
        status: status.to_owned(),
        windows: report.windows.len(),
    })
}

/// The report's first window in a month whose figures are final, as a refusal: taken in, it
/// would change a closed month without a restatement (or wait for one for ever). The agent
/// keeps a batch refused so in its dead-letter folder.
async fn window_in_closed_month(
    state: &AppState,
    report: &Report,
    now: i64,
) -> Result<Option<Refusal>, ApiError> {
    use gpuledger_core::time::month_start_ms;
    let Some((i, earliest)) = report
        .windows
        .iter()
        .enumerate()
        .min_by_key(|(_, w)| w.start_ms)
    else {
        return Ok(None);
    };
    // This month is open: only a report reaching back past its start asks the sign-offs.
    if earliest.start_ms >= month_start_ms(now) {
        return Ok(None);
    }
    let close = state.close.current(state.store.as_ref()).await?;
    if !close.is_closed(earliest.start_ms, now) {
        return Ok(None);
    }
    let month = gpuledger_core::time::month_label(earliest.start_ms);
    let why = if close.is_signed_off(earliest.start_ms) {
        "it was signed off".to_owned()
    } else {
        format!(
            "it closed {}",
            crate::format::utc_minute(close.closes_at(earliest.start_ms))
        )
    };
    Ok(Some(Refusal {
        kind: crate::store::tokens::RefusalKind::MonthClosed,
        field: format!("windows[{i}].start_ms"),
        message: format!(
            "{month} is closed ({why}): its figures are final, and a window for it would change \
             them without a restatement. An admin restates a closed month with \
             `gpuledger-server rollup --reopen`"
        ),
    }))
}

/// Keeps a refused report on record for the fleet page (where it came from: a host of a
/// cluster, or a source of request counts), then answers it.
pub(crate) async fn refused(
    state: &AppState,
    token: &TokenRow,
    cluster: &str,
    hostname: &str,
    refusal: Refusal,
    now: i64,
) -> ApiError {
    tracing::warn!(
        token = %token.name,
        cluster = %cluster,
        host = %hostname,
        reason = refusal.kind.reason(),
        "report refused: {}",
        refusal.message
    );
    if let Err(e) = auth::record_refusal(
        state.store.as_ref(),
        token.id,
        cluster,
        hostname,
        &refusal,
        now,
    )
    .await
    {
        tracing::error!(error = %e, "could not record a refused report");
    }
    ApiError::Refused(refusal)
}
