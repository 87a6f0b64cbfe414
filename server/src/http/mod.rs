//! The HTTP surface: one module per concern, each with its own routes, merged here.

mod allocation;
mod anomalies;
#[cfg(test)]
mod anomalies_tests;
mod assets;
mod billing;
mod budgets;
#[cfg(test)]
mod budgets_tests;
pub mod connections;
mod cookies;
#[cfg(test)]
mod cost_metrics_tests;
#[cfg(test)]
mod differential_tests;
mod fleet;
mod health;
mod incidents;
pub(crate) mod ingest;
mod login;
mod openapi;
#[cfg(test)]
mod openapi_tests;
#[cfg(test)]
mod owner_dimension_tests;
pub(crate) mod page;
mod params;
pub mod reads;
mod recommendations;
mod reconciliation;
mod responses;
mod review;
#[cfg(test)]
mod review_tests;
#[cfg(test)]
mod scope_tests;
#[cfg(test)]
mod security_tests;
pub(crate) mod session;
mod slack_app;
#[cfg(test)]
mod slack_app_tests;
#[cfg(test)]
mod tests;
mod tokens;
#[cfg(test)]
mod unused_commitment_tests;
pub(crate) mod usage;
mod users;
#[cfg(test)]
mod users_tests;
mod variance;
#[cfg(test)]
mod variance_tests;

use std::sync::Arc;

use axum::http::{self, HeaderName, HeaderValue};
use axum::Router;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::metrics::Metrics;
use crate::store::Store;
use crate::validate::Limits;
use gpuledger_core::ratecard::RateCard;

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
    /// Count sign-in failures per the address a proxy in front reports (`X-Forwarded-For`).
    pub trust_forwarded_for: bool,
    /// When a month's figures become final.
    pub close: crate::closing::ClosePolicy,
    /// The cost gauges `/metrics` renders for read-only tokens, kept a few seconds.
    pub cost_metrics: crate::cost_metrics::Cache,
    /// The read replica pages read from when it is current enough (`--read-database-url`).
    pub replica: Option<Arc<crate::replica::Replica>>,
}

impl AppState {
    pub fn new(store: Arc<dyn Store>) -> Self {
        let metrics = Metrics::new();
        metrics.register_ingest_groups(store.ingest_groups());
        AppState {
            store,
            metrics: Arc::new(metrics),
            limits: Limits::default(),
            max_body_bytes: 4 * 1024 * 1024,
            rate_card: Arc::new(RateCard::default_card()),
            secure_cookies: false,
            max_upload_bytes: 512 * 1024 * 1024,
            config: Arc::new(crate::config::Config::default()),
            trust_forwarded_for: false,
            close: crate::closing::ClosePolicy::default(),
            cost_metrics: crate::cost_metrics::Cache::default(),
            replica: None,
        }
    }
}

impl AppState {
    /// What a use case reads from for one request: `store` (the replica or the primary, as
    /// the request's reads were routed), the server's settings, and now.
    pub fn read_context<'a>(&'a self, store: &'a dyn Store) -> crate::app::ReadContext<'a> {
        crate::app::ReadContext {
            store,
            config: &self.config,
            rate_card: &self.rate_card,
            close: self.close,
            now: crate::clock::now_ms(),
        }
    }
}

/// Every route, each API operation with its OpenAPI description (the `#[utoipa::path]` beside
/// its handler): routes and the document are declared once, here, together. Pages are plain
/// routes the document leaves out. `max_body_bytes` holds what agents and serving code post,
/// `max_upload_bytes` a bill uploaded through the web form.
fn routes(max_body_bytes: usize, max_upload_bytes: usize) -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(allocation::router())
        .merge(reconciliation::router())
        .merge(variance::router())
        .merge(budgets::router())
        .merge(anomalies::router())
        .merge(incidents::router())
        .merge(recommendations::router())
        .merge(usage::router(max_body_bytes))
        .merge(ingest::router(max_body_bytes))
        .merge(health::router())
        .merge(slack_app::router())
        .merge(openapi::router())
        .merge(fleet::router())
        .merge(login::router())
        .merge(review::router())
        .merge(billing::router(max_upload_bytes))
        .merge(tokens::router())
        .merge(users::router())
        .merge(assets::router())
}

pub fn router(state: AppState) -> Router {
    let (routes, _) = routes(state.max_body_bytes, state.max_upload_bytes).split_for_parts();
    routes
        .method_not_allowed_fallback(page::method_not_allowed)
        .fallback(page::not_found)
        .layer(header(
            http::header::CONTENT_SECURITY_POLICY,
            CONTENT_SECURITY_POLICY,
        ))
        .layer(header(http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .layer(header(http::header::X_FRAME_OPTIONS, "DENY"))
        .layer(header(http::header::REFERRER_POLICY, "same-origin"))
        // Pages, API answers and downloads hold money and names: no shared or browser cache
        // keeps them. Static assets set their own caching.
        .layer(header(http::header::CACHE_CONTROL, "no-store"))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            reads::route,
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// The policy every response carries. Pages use no script at all and no inline styles (charts
/// are SVG elements, styles come from /static), so the policy can forbid both; no page may be
/// framed (clickjacking of the admin forms); forms post only to this server.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; style-src 'self'; img-src 'self' data:; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

fn header(name: HeaderName, value: &'static str) -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::if_not_present(name, HeaderValue::from_static(value))
}
