//! `POST /api/v1/reports`: authenticated, size-limited, validated, stored once per batch id.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use gpuledger_proto::{IngestAck, Report, REPORTS_PATH, SPOOL_DEPTH_HEADER, SPOOL_DROPPED_HEADER};

use super::AppState;
use crate::error::ApiError;
use crate::store::{AgentStatus, IngestOutcome};
use crate::{auth, now_ms, validate};

pub fn router(max_body_bytes: usize) -> Router<AppState> {
    Router::new()
        .route(REPORTS_PATH, post(post_report))
        .layer(DefaultBodyLimit::max(max_body_bytes))
}

async fn post_report(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<IngestAck>, ApiError> {
    let started = Instant::now();
    let result = ingest(&state, &headers, body).await;
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
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::BadRequest {
            message: format!("invalid {what}: {}", e.inner()),
            field: (path != ".").then_some(path),
        }
    })
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
    body: Result<Bytes, BytesRejection>,
) -> Result<IngestAck, ApiError> {
    let token = auth::require_agent(state.store.as_ref(), headers).await?;
    let body = body.map_err(|r| body_error(r, state.max_body_bytes))?;
    let report = decode(&body)?;
    let now = now_ms();
    validate::validate(&report, now, &state.limits)?;
    let agent = AgentStatus {
        spool_depth: header_i64(headers, SPOOL_DEPTH_HEADER),
        spool_dropped: header_i64(headers, SPOOL_DROPPED_HEADER),
    };
    state.metrics.set_agent_spool(
        &report.host.cluster,
        &report.host.hostname,
        agent.spool_depth,
        agent.spool_dropped,
    );
    let outcome = state.store.ingest(&report, token.id, agent, now).await?;
    Ok(IngestAck {
        batch_id: report.batch_id,
        status: match outcome {
            IngestOutcome::Stored => "stored",
            IngestOutcome::Duplicate => "duplicate",
        }
        .to_owned(),
        windows: report.windows.len(),
    })
}
