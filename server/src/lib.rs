//! gpuledger server: ingests agent reports, stores them on SQLite or PostgreSQL, and shows the
//! fleet. The binary in `main.rs` is a thin command line over this library.

pub mod agent_tokens;
pub mod allocation;
pub mod anomalies;
pub mod app;
pub mod attribution;
pub mod auth;
pub mod billing;
pub mod budgets;
pub mod carbon;
pub mod cli;
pub mod clock;
pub mod closing;
pub mod commitments;
pub mod config;
pub mod cost_metrics;
pub mod csv_out;
pub mod demo;
pub mod error;
pub mod exports;
pub mod fleet;
pub mod focus_export;
pub mod format;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod idle_history;
pub mod incidents;
pub mod jobs;
pub mod ledger;
pub mod metrics;
pub mod oidc;
pub mod progress;
pub mod purchase;
pub mod read_tokens;
pub mod recommend;
pub mod reconciliation;
pub mod replica;
pub mod review_sections;
pub mod rollup;
pub mod scale_to_zero;
pub mod sections;
pub mod session;
pub mod shape;
pub mod slack;
pub mod slack_app;
pub mod store;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod unit_costs;
pub mod validate;
pub mod variance;
use std::future::Future;

/// Serves the app on `listener` until `shutdown` resolves, finishing requests in flight, with
/// each connection held to `limits` (timeouts, a cap on how many are open).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: http::AppState,
    limits: http::connections::ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    http::connections::serve(listener, http::router(state), limits, shutdown).await
}
