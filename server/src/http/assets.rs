//! Files from `static/`, compiled into the binary so a deployed server needs nothing beside it.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use utoipa_axum::router::OpenApiRouter;

use super::AppState;

const APP_CSS: &str = include_str!("../../../static/app.css");

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().route("/static/app.css", get(app_css))
}

async fn app_css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        APP_CSS,
    )
}
