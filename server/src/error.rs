//! One error type for the JSON API: every failure answers `{"error", "message", "field"?}` with
//! the right status, and a 500 never shows internals (they go to the log).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpuledger_proto::ApiErrorBody;

use crate::store::StoreError;
use crate::validate::ValidationError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("sign in, or send a valid token")]
    Unauthorized,
    #[error("this needs an admin")]
    Forbidden,
    /// What a team-scoped viewer or token may not read (403), and why.
    #[error("{0}")]
    OutOfScope(String),
    #[error("{message}")]
    BadRequest {
        message: String,
        field: Option<String>,
    },
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the database is unavailable")]
    Unavailable,
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Internal(String),
    /// What the request names does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The address does not take the request's method (405).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// What the request would do is already done (409).
    #[error("{0}")]
    Conflict(String),
    /// A report refused because of who sent it (403) or what was already stored (409).
    #[error("{}", .0.message)]
    Refused(crate::store::Refusal),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, Option<String>) {
        match self {
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", None),
            ApiError::Forbidden => (StatusCode::FORBIDDEN, "forbidden", None),
            ApiError::OutOfScope(_) => (StatusCode::FORBIDDEN, "out_of_scope", None),
            ApiError::BadRequest { field, .. } => {
                (StatusCode::BAD_REQUEST, "bad_request", field.clone())
            }
            ApiError::Invalid(v) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                Some(v.field.clone()),
            ),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large", None),
            ApiError::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", None),
            ApiError::Store(StoreError::Database(e)) if is_unavailable(e) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable", None)
            }
            ApiError::Refused(r) if r.kind.is_forbidden() => {
                (StatusCode::FORBIDDEN, "forbidden", Some(r.field.clone()))
            }
            ApiError::Refused(r) => (StatusCode::CONFLICT, "conflict", Some(r.field.clone())),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found", None),
            ApiError::MethodNotAllowed(_) => {
                (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", None)
            }
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", None),
            ApiError::Store(_) | ApiError::Internal(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal", None)
            }
        }
    }

    /// A short machine-readable reason, for metrics labels.
    pub fn code(&self) -> &'static str {
        self.parts().1
    }
}

/// Connection-level failures mean "try again later", not "your request is wrong".
fn is_unavailable(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
    )
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, field) = self.parts();
        let message = if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
            match status {
                StatusCode::SERVICE_UNAVAILABLE => {
                    "the database is unavailable; retry later".to_owned()
                }
                _ => "internal error; see the server log".to_owned(),
            }
        } else {
            self.to_string()
        };
        let mut resp = (
            status,
            Json(ApiErrorBody {
                error: code.to_owned(),
                message,
                field,
            }),
        )
            .into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("5"),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}
