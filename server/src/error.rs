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
    Refused(crate::store::tokens::Refusal),
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

/// Connection-level failures mean "try again later", not "your request is wrong". So does a
/// statement that lost a race with another: a deadlock PostgreSQL broke, a lock not had in time,
/// or a row routed to a default partition just as the history job attached the partition for
/// it (store::partitions). Sent again as it is, it goes through.
fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(d) => match d.code().as_deref() {
            // 57014: a statement past its time (a read replica's statement_timeout).
            Some("40P01" | "40001" | "55P03" | "57014") => true,
            // A partition's bound is the one check that names no constraint (a CHECK does).
            Some("23514") => d.constraint().is_none(),
            _ => false,
        },
        _ => false,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Connection;

    /// Real PostgreSQL errors: those of a race are worth sending again (503, which agents retry),
    /// a check the data itself fails is not.
    #[tokio::test]
    async fn a_statement_that_lost_a_race_is_unavailable_not_internal() {
        let db = crate::test_support::postgres().await;
        let store = db.open().await;
        crate::store::partitions::make_ahead(
            store.db(),
            1_800_000_000_000,
            0,
            crate::store::partitions::Waiting::Move,
        )
        .await
        .unwrap();
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let status = |e: sqlx::Error| ApiError::Store(StoreError::Database(e)).parts().0;

        // A row routed to the default partition while its day's partition was attached.
        let routed = sqlx::query(
            "INSERT INTO process_windows_default (gpu_uuid, start_ms, pid, end_ms, labels_json)
             VALUES ('GPU-1', 1800000000000, 1, 1800000015000, '{}')",
        )
        .execute(&mut c)
        .await
        .unwrap_err();
        assert_eq!(status(routed), StatusCode::SERVICE_UNAVAILABLE);

        // A lock not had in time.
        let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
        sqlx::query("LOCK TABLE hosts IN ACCESS EXCLUSIVE MODE")
            .execute(&mut holder)
            .await
            .unwrap();
        sqlx::query("SET lock_timeout = '50ms'")
            .execute(&mut c)
            .await
            .unwrap();
        let waited = sqlx::query("SELECT COUNT(*) FROM hosts")
            .execute(&mut c)
            .await
            .unwrap_err();
        assert_eq!(status(waited), StatusCode::SERVICE_UNAVAILABLE);
        sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();

        // A check the row itself fails stays an internal error.
        let checked =
            sqlx::query("INSERT INTO ingest_window_guard (windows_all_new) VALUES (false)")
                .execute(&mut c)
                .await
                .unwrap_err();
        assert_eq!(status(checked), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
