//! Rendering pages for people: a template or, on failure, a readable error page.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

/// What the page frame shows of the signed-in person: name, role, and the CSRF token for the
/// sign-out form; and, on printed pages, when the page was generated.
pub struct Chrome {
    pub username: String,
    pub role: &'static str,
    pub csrf: String,
    /// The teams a scoped viewer sees (`serving, research`); `None` for every team. The menu
    /// then offers only the pages that narrow to them.
    pub teams: Option<String>,
    /// `YYYY-MM-DD HH:MM UTC`, in the printed footer beside the page numbers.
    pub generated: String,
    /// When the figures are from, where they were read from a replica (else they are current).
    pub freshness: Option<String>,
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    chrome: Option<Chrome>,
    title: &'a str,
    message: &'a str,
}

/// Renders `template`, or a plain 500 page that says what to do.
pub fn render(template: &impl Template) -> Response {
    render_with_status(StatusCode::OK, template)
}

pub fn render_with_status(status: StatusCode, template: &impl Template) -> Response {
    match template.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "template failed to render");
            error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Something went wrong",
                "This page could not be shown. The server log has the details.",
            )
        }
    }
}

pub fn error_page(status: StatusCode, title: &str, message: &str) -> Response {
    let html = ErrorPage {
        chrome: None,
        title,
        message,
    }
    .render()
    .unwrap_or_else(|_| format!("<h1>{}</h1>", status.as_u16()));
    (status, Html(html)).into_response()
}

/// What answers an address nothing serves: the API's JSON error under `/api/`, a page elsewhere.
pub async fn not_found(uri: axum::http::Uri) -> Response {
    if uri.path().starts_with("/api/") {
        return crate::error::ApiError::NotFound(format!(
            "there is no {} in the API; {} describes every operation",
            uri.path(),
            super::openapi::OPENAPI_PATH
        ))
        .into_response();
    }
    error_page(
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no page at this address.",
    )
}

/// What answers a method an address does not take (axum adds the `Allow` header): the API's
/// JSON error under `/api/` and on `/metrics`, a page elsewhere.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    if path.starts_with("/api/") || path == "/metrics" {
        return crate::error::ApiError::MethodNotAllowed(format!(
            "{path} does not take {method}; the Allow header says what it takes"
        ))
        .into_response();
    }
    error_page(
        StatusCode::METHOD_NOT_ALLOWED,
        "Not allowed",
        &format!("This address does not take {method}."),
    )
}
