//! `/login` and `/logout`; single sign-on through an OpenID Connect provider at `/login/oidc`
//! and its callback ([`crate::oidc`]).
//!
//! The sign-in form has no session yet, so it is protected from cross-site posting by a
//! double-submit token: a random value both in a SameSite=Strict cookie and in the form.
//!
//! Password guessing is slowed by counting failures in the shared database: after
//! [`MAX_FAILURES_PER_USER`] for one username or [`MAX_FAILURES_PER_CLIENT`] from one client
//! address within [`FAILURE_WINDOW_MS`], sign-in answers 429 until the window has passed.

use askama::Template;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Form;
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;

use super::cookies::SESSION_COOKIE;
use super::page::{error_page, render_with_status, Chrome};
use super::session::{database_unavailable, session_cookie, CsrfForm, SignedInForm};
use super::AppState;
use crate::auth::generate_token;
use crate::clock::now_ms;
use crate::oidc::{self, OidcError};
use crate::session::{self, SignIn, FAILURE_WINDOW_MS};

const LOGIN_CSRF_COOKIE: &str = "gpl_login";
/// The state of a sign-in sent to the provider, kept by the browser that started it.
const OIDC_STATE_COOKIE: &str = "gpl_oidc";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/login", get(login_form).post(login))
        .route("/login/oidc", get(oidc_start))
        .route("/login/oidc/callback", get(oidc_callback))
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
    /// The provider's name on the single sign-on button, where one is set up.
    sso: Option<String>,
}

#[derive(Deserialize)]
struct NextQuery {
    next: Option<String>,
}

/// Only same-site paths: `/review/2026-11`, never `//evil.example` or `https://…`.
fn safe_next(next: Option<&str>) -> String {
    match next {
        // Browsers drop tabs and newlines from a URL: `/\t/evil.example` would be `//evil.example`.
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control) =>
        {
            n.to_owned()
        }
        _ => "/".to_owned(),
    }
}

/// The sign-in form's token: the one this browser's cookie already holds, else a new one.
fn form_token(jar: &CookieJar) -> String {
    jar.get(LOGIN_CSRF_COOKIE)
        .map(|c| c.value().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(generate_token)
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
    let csrf = form_token(&jar);
    let page = LoginPage {
        chrome: None,
        csrf: csrf.clone(),
        next: safe_next(q.next.as_deref()),
        error: None,
        username: String::new(),
        sso: sso_name(&state),
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

/// Who is signing in, for counting failures: the peer address, or the address the proxy in
/// front saw (the last `X-Forwarded-For` entry) when the server is told to trust it. Behind a
/// load balancer every peer is the balancer, so without that every person would share one count.
/// The connection's peer address when the server was started with connect info (not in
/// router-only tests).
pub struct Peer(pub(crate) Option<SocketAddr>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
        ))
    }
}

pub(crate) fn client_key(
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
    trust_forwarded_for: bool,
) -> String {
    if trust_forwarded_for {
        let forwarded = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .rfind(|v| !v.is_empty());
        if let Some(addr) = forwarded {
            return addr.chars().take(64).collect();
        }
    }
    match peer {
        Some(addr) => addr.ip().to_string(),
        None => "unknown".to_owned(),
    }
}

fn too_many_attempts() -> Response {
    let mut resp = error_page(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many failed sign-ins",
        "Sign-in is paused for this account or address for 15 minutes after repeated wrong \
         passwords. Wait, then try again, or ask an admin to check the account.",
    );
    if let Ok(v) = header::HeaderValue::from_str(&(FAILURE_WINDOW_MS / 1000).to_string()) {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

async fn login(
    State(state): State<AppState>,
    Peer(peer): Peer,
    headers: HeaderMap,
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
    let client = client_key(&headers, peer, state.trust_forwarded_for);
    let outcome = session::sign_in(
        state.store.as_ref(),
        &form.username,
        form.password.clone(),
        &client,
        now_ms(),
    )
    .await;
    match outcome {
        Ok(SignIn::TooManyAttempts) => too_many_attempts(),
        Ok(SignIn::Refused) => {
            let page = LoginPage {
                chrome: None,
                csrf: expected,
                next: safe_next(form.next.as_deref()),
                error: Some("Wrong username or password.".into()),
                username: form.username,
                sso: sso_name(&state),
            };
            render_with_status(StatusCode::UNAUTHORIZED, &page)
        }
        Ok(SignIn::Started { token }) => {
            let jar = jar
                .remove(Cookie::build(LOGIN_CSRF_COOKIE).path("/login"))
                .add(session_cookie(token, state.secure_cookies));
            (jar, Redirect::to(&safe_next(form.next.as_deref()))).into_response()
        }
        Err(e) => database_unavailable("sign-in", e),
    }
}

fn sso_name(state: &AppState) -> Option<String> {
    state.config.oidc.as_ref().map(|o| o.name.clone())
}

/// The sign-in page again, saying why single sign-on did not sign the person in; the password
/// form works as before.
fn sso_failed(state: &AppState, jar: CookieJar, error: &OidcError) -> Response {
    let status = match error {
        OidcError::NotConfigured => StatusCode::NOT_FOUND,
        OidcError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        OidcError::Refused(_) => StatusCode::BAD_GATEWAY,
        OidcError::Expired => StatusCode::BAD_REQUEST,
        OidcError::Denied(_) | OidcError::NoAccess(_) | OidcError::Account(_) => {
            StatusCode::FORBIDDEN
        }
        OidcError::Store(e) => return database_unavailable("single sign-on", e),
    };
    tracing::warn!(error = %error, "single sign-on refused");
    let csrf = form_token(&jar);
    let page = LoginPage {
        chrome: None,
        csrf: csrf.clone(),
        next: "/".into(),
        error: Some(format!(
            "Single sign-on failed: {error}. Nothing was changed; sign in with a password, or \
             try again."
        )),
        username: String::new(),
        sso: sso_name(state),
    };
    let jar = jar
        .remove(Cookie::build(OIDC_STATE_COOKIE).path("/login/oidc"))
        .add(login_cookie(csrf, state.secure_cookies));
    (jar, render_with_status(status, &page)).into_response()
}

/// `GET /login/oidc[?next=…]`: off to the provider, the state in a cookie of this browser's.
async fn oidc_start(
    State(state): State<AppState>,
    jar: CookieJar,
    Query(q): Query<NextQuery>,
) -> Response {
    let next = safe_next(q.next.as_deref());
    match oidc::begin(
        state.store.as_ref(),
        state.config.oidc.as_ref(),
        &next,
        now_ms(),
    )
    .await
    {
        Ok(started) => {
            // Lax: the provider's redirect back is a top-level navigation from its site.
            let cookie = Cookie::build((OIDC_STATE_COOKIE, started.state))
                .path("/login/oidc")
                .http_only(true)
                .same_site(SameSite::Lax)
                .secure(state.secure_cookies)
                .max_age(cookie::time::Duration::milliseconds(oidc::LOGIN_TTL_MS))
                .build();
            (jar.add(cookie), Redirect::to(&started.authorize_url)).into_response()
        }
        Err(e) => sso_failed(&state, jar, &e),
    }
}

#[derive(Deserialize)]
struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// `GET /login/oidc/callback`: the provider's answer, verified before anything is stored.
async fn oidc_callback(
    State(state): State<AppState>,
    jar: CookieJar,
    Query(q): Query<CallbackQuery>,
) -> Response {
    let back = oidc::Callback {
        cookie_state: jar.get(OIDC_STATE_COOKIE).map(|c| c.value().to_owned()),
        state: q.state,
        code: q.code,
        error: q.error,
        error_description: q.error_description,
    };
    match oidc::finish(
        state.store.as_ref(),
        state.config.oidc.as_ref(),
        back,
        now_ms(),
    )
    .await
    {
        Ok(signed_in) => {
            let jar = jar
                .remove(Cookie::build(OIDC_STATE_COOKIE).path("/login/oidc"))
                .add(session_cookie(signed_in.session, state.secure_cookies));
            (jar, Redirect::to(&safe_next(Some(&signed_in.next)))).into_response()
        }
        Err(e) => sso_failed(&state, jar, &e),
    }
}

#[derive(Deserialize)]
struct LogoutForm {
    csrf: String,
}

impl CsrfForm for LogoutForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

async fn logout(
    State(state): State<AppState>,
    jar: CookieJar,
    SignedInForm { user, .. }: SignedInForm<LogoutForm>,
) -> Response {
    if let Err(e) = session::end(state.store.as_ref(), &user.token_hash).await {
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
    use super::*;

    #[test]
    fn client_key_trusts_forwarded_for_only_when_told() {
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", "6.6.6.6, 10.0.0.7".parse().unwrap());
        let peer = Some(SocketAddr::from(([10, 0, 0, 1], 4000)));
        assert_eq!(client_key(&headers, peer, false), "10.0.0.1");
        // The last entry is the one the trusted proxy added; earlier ones the client wrote.
        assert_eq!(client_key(&headers, peer, true), "10.0.0.7");
        assert_eq!(client_key(&HeaderMap::new(), peer, true), "10.0.0.1");
        assert_eq!(client_key(&HeaderMap::new(), None, false), "unknown");
    }

    #[test]
    fn next_stays_on_this_site() {
        assert_eq!(
            safe_next(Some("/review/2026-11?x=1")),
            "/review/2026-11?x=1"
        );
        assert_eq!(safe_next(Some("//evil.example/")), "/");
        assert_eq!(safe_next(Some("https://evil.example/")), "/");
        assert_eq!(safe_next(Some("/\\evil.example")), "/");
        assert_eq!(safe_next(Some("/\t/evil.example")), "/");
        assert_eq!(safe_next(Some("/\n/evil.example")), "/");
        assert_eq!(safe_next(None), "/");
    }
}
