//! `/login` and `/logout`.
//!
//! The sign-in form has no session yet, so it is protected from cross-site posting by a
//! double-submit token: a random value both in a SameSite=Strict cookie and in the form.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use serde::Deserialize;

use super::page::{error_page, render_with_status, Chrome};
use super::AppState;
use crate::auth::generate_token;
use crate::session::{self, SignedIn, SESSION_COOKIE};

const LOGIN_CSRF_COOKIE: &str = "gpl_login";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    chrome: Option<Chrome>,
    csrf: String,
    next: String,
    error: Option<String>,
    username: String,
}

#[derive(Deserialize)]
struct NextQuery {
    next: Option<String>,
}

/// Only same-site paths: `/review/2026-11`, never `//evil.example` or `https://…`.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with('/') && !n.starts_with("//") && !n.contains('\\') => n.to_owned(),
        _ => "/".to_owned(),
    }
}

fn login_cookie(value: String, secure: bool) -> Cookie<'static> {
    Cookie::build((LOGIN_CSRF_COOKIE, value))
        .path("/login")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .build()
}

async fn login_form(
    State(state): State<AppState>,
    jar: CookieJar,
    Query(q): Query<NextQuery>,
) -> Response {
    let csrf = jar
        .get(LOGIN_CSRF_COOKIE)
        .map(|c| c.value().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(generate_token);
    let page = LoginPage {
        chrome: None,
        csrf: csrf.clone(),
        next: safe_next(q.next.as_deref()),
        error: None,
        username: String::new(),
    };
    (
        jar.add(login_cookie(csrf, state.secure_cookies)),
        render_with_status(StatusCode::OK, &page),
    )
        .into_response()
}

#[derive(Deserialize)]
struct LoginForm {
    username: String,
    password: String,
    csrf: String,
    next: Option<String>,
}

async fn login(
    State(state): State<AppState>,
    jar: CookieJar,
    Form(form): Form<LoginForm>,
) -> Response {
    let expected = jar
        .get(LOGIN_CSRF_COOKIE)
        .map(|c| c.value().to_owned())
        .unwrap_or_default();
    if expected.is_empty() || !session::tokens_equal(&expected, &form.csrf) {
        return error_page(
            StatusCode::FORBIDDEN,
            "This sign-in form has expired",
            "Open the sign-in page again and retry.",
        );
    }
    let user = match state.store.user_by_name(form.username.trim()).await {
        Ok(u) => u,
        Err(e) => {
            tracing::error!(error = %e, "sign-in: reading the user");
            return error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "Try again in a minute.",
            );
        }
    };
    // Verifying takes ~tens of milliseconds of CPU: off the async threads.
    let password = form.password.clone();
    let hash = user.as_ref().map(|u| u.password_hash.clone());
    let ok = tokio::task::spawn_blocking(move || {
        session::verify_or_waste_time(hash.as_deref(), &password)
    })
    .await
    .unwrap_or(false);
    let Some(user) = user.filter(|_| ok) else {
        tracing::info!(username = %form.username, "failed sign-in");
        let page = LoginPage {
            chrome: None,
            csrf: expected,
            next: safe_next(form.next.as_deref()),
            error: Some("Wrong username or password.".into()),
            username: form.username,
        };
        return render_with_status(StatusCode::UNAUTHORIZED, &page);
    };
    match session::start(&state, user.id).await {
        Ok(cookie) => {
            let jar = jar
                .remove(Cookie::build(LOGIN_CSRF_COOKIE).path("/login"))
                .add(cookie);
            (jar, Redirect::to(&safe_next(form.next.as_deref()))).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "sign-in: storing the session");
            error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "Try again in a minute.",
            )
        }
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: String,
}

async fn logout(
    State(state): State<AppState>,
    user: SignedIn,
    jar: CookieJar,
    Form(form): Form<CsrfForm>,
) -> Response {
    if !user.csrf_ok(&form.csrf) {
        return session::csrf_rejected();
    }
    if let Err(e) = state.store.delete_session(&user.token_hash).await {
        tracing::error!(error = %e, "sign-out: deleting the session");
    }
    (
        jar.remove(Cookie::build(SESSION_COOKIE).path("/")),
        Redirect::to("/login"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::safe_next;

    #[test]
    fn next_stays_on_this_site() {
        assert_eq!(
            safe_next(Some("/review/2026-11?x=1")),
            "/review/2026-11?x=1"
        );
        assert_eq!(safe_next(Some("//evil.example/")), "/");
        assert_eq!(safe_next(Some("https://evil.example/")), "/");
        assert_eq!(safe_next(Some("/\\evil.example")), "/");
        assert_eq!(safe_next(None), "/");
    }
}
