//! The HTTP surface: one module per concern, each with its own routes, merged here.

mod allocation;
mod assets;
mod fleet;
mod health;
mod ingest;
mod page;
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
}

impl AppState {
    pub fn new(store: Arc<dyn Store>) -> Self {
        AppState {
            store,
            metrics: Arc::new(Metrics::new()),
            limits: Limits::default(),
            max_body_bytes: 4 * 1024 * 1024,
            rate_card: Arc::new(RateCard::default_card()),
        }
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(ingest::router(state.max_body_bytes))
        .merge(fleet::router())
        .merge(allocation::router())
        .merge(health::router())
        .merge(assets::router())
        .fallback(page::not_found)
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
