//! `/healthz` for load balancers and `/metrics` for Prometheus (with a read-only token, the
//! ledger's cost gauges too: [`crate::cost_metrics`]).

use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::time::Duration;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::session::TeamScoped;
use super::AppState;
use crate::error::ApiError;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(metrics))
}

/// Whether this replica can serve: its database answers.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct Health {
    /// `ok`, or `unavailable` when the database does not answer.
    status: &'static str,
    /// `sqlite` or `postgres`.
    database: &'static str,
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    summary = "Health",
    description = "For load balancers: 200 while this replica's database answers, 503 when it \
        does not.",
    responses(
        (status = 200, description = "Serving.", body = Health),
        (status = 503, description = "The database does not answer.", body = Health),
    ),
)]
async fn healthz(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    let database = state.store.backend();
    match state.store.ping().await {
        Ok(()) => (
            StatusCode::OK,
            Json(Health {
                status: "ok",
                database,
            }),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "health check: database unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(Health {
                    status: "unavailable",
                    database,
                }),
            )
        }
    }
}

/// This replica's own counters and the scheduled exports' state (from the database, alike on
/// every replica), for anyone; with a read-only token (`Authorization: Bearer gpr_…`), also the
/// ledger's cost gauges as the token's teams see them. A bad token is 401.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    summary = "Prometheus metrics",
    description = "This replica's counters (ingest, refusals, agents' spools) and the scheduled \
        exports' state in the Prometheus text format, for anyone; with a read-only token, also \
        the ledger's cost gauges as the token's teams see them (docs/metrics.md).",
    responses(
        (status = 200, description = "The exposition.", content_type = "text/plain", body = String),
        super::responses::Unauthorized,
        super::responses::Unavailable,
        super::responses::Internal,
    ),
    security((), ("read_token" = [])),
)]
async fn metrics(State(state): State<AppState>, request: Request) -> Result<Response, ApiError> {
    let (mut parts, _) = request.into_parts();
    // A read-only token's bearer asks for the cost gauges; any other header (a proxy's basic
    // auth) is none of ours.
    let asks_cost = crate::auth::bearer(&parts.headers)
        .is_some_and(|t| t.starts_with(crate::read_tokens::PREFIX));
    let reader = if asks_cost {
        match TeamScoped::from_request_parts(&mut parts, &state).await {
            Ok(TeamScoped(who)) => Some(who.scope),
            Err(refused) => return Ok(refused),
        }
    } else {
        None
    };
    let mut text = state
        .metrics
        .encode()
        .map_err(|e| ApiError::Internal(format!("encoding the metrics: {e}")))?;
    text.push_str(&export_gauges(&state).await);
    if let Some(replica) = &state.replica {
        text.push_str(&replica.exposition(crate::clock::now_ms()));
    }
    if let Some(scope) = reader {
        let cost = state
            .cost_metrics
            .exposition(
                state.store.as_ref(),
                &state.config,
                &scope,
                crate::clock::now_ms(),
            )
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "rendering the cost gauges");
                ApiError::Unavailable
            })?;
        text.push_str(&cost);
    }
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        text,
    )
        .into_response())
}

/// Longest the scrape waits for the exports' state: past it, the gauges are left out rather
/// than the replica's own counters (Prometheus gives up on a scrape after 10 s by default).
const EXPORT_STATE_WAIT: Duration = Duration::from_secs(3);

/// The scheduled exports' gauges, or nothing (logged) when the database does not answer: the
/// counters above still say what this replica did.
async fn export_gauges(state: &AppState) -> String {
    let read = tokio::time::timeout(
        EXPORT_STATE_WAIT,
        crate::exports::health(state.store.as_ref()),
    )
    .await;
    let health = match read {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "metrics: reading the exports' state");
            return String::new();
        }
        Err(_) => {
            tracing::warn!("metrics: the exports' state took too long; left out");
            return String::new();
        }
    };
    crate::metrics::export_gauges(&health).unwrap_or_else(|e| {
        tracing::error!(error = %e, "metrics: encoding the exports' gauges");
        String::new()
    })
}
