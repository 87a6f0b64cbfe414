//! `/healthz` for load balancers and `/metrics` for Prometheus (with a read-only token, the
//! ledger's cost gauges too: [`crate::cost_metrics`]).

use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::session::TeamScoped;
use super::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    match state.store.ping().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({"status": "ok", "database": state.store.backend()})),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "health check: database unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "database": state.store.backend()})),
            )
        }
    }
}

/// This replica's own counters, for anyone; with a read-only token (`Authorization: Bearer
/// gpr_…`), also the ledger's cost gauges as the token's teams see them. A bad token is 401.
async fn metrics(State(state): State<AppState>, request: Request) -> Response {
    let text_error = |status: StatusCode, message: &str| {
        (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            message.to_owned(),
        )
            .into_response()
    };
    let (mut parts, _) = request.into_parts();
    // A read-only token's bearer asks for the cost gauges; any other header (a proxy's basic
    // auth) is none of ours.
    let asks_cost = crate::auth::bearer(&parts.headers)
        .is_some_and(|t| t.starts_with(crate::read_tokens::PREFIX));
    let reader = if asks_cost {
        match TeamScoped::from_request_parts(&mut parts, &state).await {
            Ok(TeamScoped(who)) => Some(who.scope),
            Err(refused) => return refused,
        }
    } else {
        None
    };
    let Ok(mut text) = state.metrics.encode() else {
        return text_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "could not encode metrics",
        );
    };
    if let Some(scope) = reader {
        match state
            .cost_metrics
            .exposition(state.store.as_ref(), &state.config, &scope, crate::now_ms())
            .await
        {
            Ok(cost) => text.push_str(&cost),
            Err(e) => {
                tracing::error!(error = %e, "rendering the cost gauges");
                return text_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the ledger could not be read; the cost gauges are missing from this scrape",
                );
            }
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        text,
    )
        .into_response()
}
