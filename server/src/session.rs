//! People signing in: argon2 password hashes, database-backed sessions (every replica knows
//! them), HttpOnly SameSite cookies, and a per-session CSRF token on every form.
//!
//! [`SignedIn`] and [`AdminOnly`] are extractors: a handler that takes one cannot run for a
//! visitor who is not signed in (pages redirect to `/login`, the API answers 401) or, for
//! `AdminOnly`, who is only a viewer (403).

use std::sync::LazyLock;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use subtle::ConstantTimeEq;

use crate::auth::{generate_token, hash_token};
use crate::error::ApiError;
use crate::http::page::error_page;
use crate::http::AppState;
use crate::now_ms;
use crate::store;

pub const SESSION_COOKIE: &str = "gpl_session";
pub const SESSION_TTL_MS: i64 = 12 * 3600 * 1000;
pub const MIN_PASSWORD_LEN: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Viewer,
    Admin,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Admin => "admin",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("a password needs at least {MIN_PASSWORD_LEN} characters")]
    TooShort,
    #[error("hashing the password: {0}")]
    Hash(String),
}

pub fn hash_password(password: &str) -> Result<String, PasswordError> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(PasswordError::TooShort);
    }
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
}

pub fn verify_password(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash)
        .and_then(|h| Argon2::default().verify_password(password.as_bytes(), &h))
        .is_ok()
}

/// Checked against when the user does not exist, so a wrong name takes as long as a wrong
/// password and sign-in does not reveal which names exist.
static DUMMY_HASH: LazyLock<String> =
    LazyLock::new(|| hash_password("not-a-real-password").unwrap_or_default());

pub fn verify_or_waste_time(hash: Option<&str>, password: &str) -> bool {
    match hash {
        Some(h) => verify_password(h, password),
        None => {
            let _ = verify_password(&DUMMY_HASH, password);
            false
        }
    }
}

pub fn tokens_equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The session cookie: HttpOnly (no script reads it), SameSite=Lax (not sent on cross-site
/// posts), Secure when the server is reached over HTTPS.
pub fn session_cookie(token: String, secure: bool) -> Cookie<'static> {
    Cookie::build((SESSION_COOKIE, token))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(secure)
        .max_age(cookie::time::Duration::milliseconds(SESSION_TTL_MS))
        .build()
}

/// Starts a session; returns the cookie to set.
pub async fn start(
    state: &AppState,
    user_id: i64,
) -> Result<Cookie<'static>, crate::store::StoreError> {
    let token = generate_token();
    let csrf = generate_token();
    let now = now_ms();
    store::accounts::create_session(
        state.store.db(),
        &hash_token(&token),
        user_id,
        &csrf,
        now,
        now + SESSION_TTL_MS,
    )
    .await?;
    Ok(session_cookie(token, state.secure_cookies))
}

/// A signed-in person.
#[derive(Debug, Clone)]
pub struct SignedIn {
    pub username: String,
    pub role: Role,
    pub csrf: String,
    pub token_hash: String,
}

impl SignedIn {
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Every form carries the session's CSRF token; a form posted from elsewhere does not.
    pub fn csrf_ok(&self, submitted: &str) -> bool {
        tokens_equal(&self.csrf, submitted)
    }
}

/// The answer to a form whose CSRF token is missing or wrong.
pub fn csrf_rejected() -> Response {
    error_page(
        StatusCode::FORBIDDEN,
        "This form has expired",
        "Reload the page and try again.",
    )
}

fn is_api(parts: &Parts) -> bool {
    parts.uri.path().starts_with("/api/")
}

fn unauthenticated(parts: &Parts) -> Response {
    if is_api(parts) {
        return ApiError::Unauthorized.into_response();
    }
    let next = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let encoded: String = form_urlencoded::byte_serialize(next.as_bytes()).collect();
    Redirect::to(&format!("/login?next={encoded}")).into_response()
}

impl FromRequestParts<AppState> for SignedIn {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let jar = CookieJar::from_headers(&parts.headers);
        let Some(token) = jar.get(SESSION_COOKIE).map(|c| c.value().to_owned()) else {
            return Err(unauthenticated(parts));
        };
        let token_hash = hash_token(&token);
        match store::accounts::session(state.store.db(), &token_hash, now_ms()).await {
            Ok(Some(s)) => Ok(SignedIn {
                username: s.username,
                role: Role::parse(&s.role).unwrap_or(Role::Viewer),
                csrf: s.csrf_token,
                token_hash,
            }),
            Ok(None) => Err(unauthenticated(parts)),
            Err(e) => {
                tracing::error!(error = %e, "reading a session");
                Err(if is_api(parts) {
                    ApiError::Unavailable.into_response()
                } else {
                    error_page(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The database is unavailable",
                        "Try again in a minute.",
                    )
                })
            }
        }
    }
}

/// A signed-in admin.
#[derive(Debug, Clone)]
pub struct AdminOnly(pub SignedIn);

impl FromRequestParts<AppState> for AdminOnly {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let user = SignedIn::from_request_parts(parts, state).await?;
        if user.is_admin() {
            return Ok(AdminOnly(user));
        }
        Err(if is_api(parts) {
            ApiError::Forbidden.into_response()
        } else {
            error_page(
                StatusCode::FORBIDDEN,
                "Admins only",
                "Your account can read everything here but change nothing. Ask an admin.",
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_and_verify() {
        let h = hash_password("correct horse battery").unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password(&h, "correct horse battery"));
        assert!(!verify_password(&h, "correct horse batterY"));
        assert!(!verify_password("not a hash", "x"));
        assert!(matches!(
            hash_password("short"),
            Err(PasswordError::TooShort)
        ));
        assert!(!verify_or_waste_time(None, "anything at all"));
    }

    #[test]
    fn csrf_comparison() {
        assert!(tokens_equal("abc", "abc"));
        assert!(!tokens_equal("abc", "abd"));
        assert!(!tokens_equal("abc", "ab"));
    }
}
