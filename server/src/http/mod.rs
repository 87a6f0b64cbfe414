//! The HTTP surface: one module per concern, each with its own routes, merged here.

mod allocation;
mod assets;
mod billing;
mod fleet;
mod health;
mod incidents;
mod ingest;
mod login;
pub(crate) mod page;
mod recommendations;
mod review;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use axum::Router;
use tower_http::trace::TraceLayer;

use crate::billing::ratecard::RateCard;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::validate::Limits;

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub max_body_bytes: usize,
    pub rate_card: Arc<RateCard>,
    /// Mark cookies Secure (the server is reached over HTTPS).
    pub secure_cookies: bool,
    /// Largest bill upload accepted through the web form.
    pub max_upload_bytes: usize,
    /// Idle thresholds and Slack routes.
    pub config: Arc<crate::config::Config>,
}

impl AppState {
    pub fn new(store: Arc<dyn Store>) -> Self {
        AppState {
            store,
            metrics: Arc::new(Metrics::new()),
            limits: Limits::default(),
            max_body_bytes: 4 * 1024 * 1024,
            rate_card: Arc::new(RateCard::default_card()),
            secure_cookies: false,
            max_upload_bytes: 512 * 1024 * 1024,
            config: Arc::new(crate::config::Config::default()),
        }
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(ingest::router(state.max_body_bytes))
        .merge(fleet::router())
        .merge(login::router())
        .merge(incidents::router())
        .merge(recommendations::router())
        .merge(review::router())
        .merge(billing::router(state.max_upload_bytes))
        .merge(allocation::router())
        .merge(health::router())
        .merge(assets::router())
        .fallback(page::not_found)
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
