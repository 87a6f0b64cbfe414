//! Rendering pages for people: a template or, on failure, a readable error page.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    title: &'a str,
    message: &'a str,
}

/// Renders `template`, or a plain 500 page that says what to do.
pub fn render(template: &impl Template) -> Response {
    match template.render() {
        Ok(html) => Html(html).into_response(),
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
    let html = ErrorPage { title, message }
        .render()
        .unwrap_or_else(|_| format!("<h1>{}</h1>", status.as_u16()));
    (status, Html(html)).into_response()
}

pub async fn not_found() -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no page at this address.",
    )
}
