//! What HTTP makes of sessions: the HttpOnly SameSite cookie, the extractors that keep a
//! handler from running for a visitor who is not signed in (pages redirect to `/login`, the API
//! answers 401) or, for admin handlers, who is only a viewer (403), and [`AdminForm`], which
//! checks a posted form's CSRF token before the handler sees it.
//!
//! Team scopes are refused by default: [`SignedIn`] admits only people and tokens that see every
//! team, so a handler shows a team-scoped viewer nothing until it takes [`TeamScoped`] instead,
//! which it does only once it narrows every figure to [`SignedIn::scope`].

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, Json};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use serde::de::DeserializeOwned;

use super::page::{error_page, Chrome};
use super::AppState;
use crate::auth::hash_token;
use crate::clock::now_ms;
use crate::error::ApiError;
use crate::session::{tokens_equal, Role, SESSION_TTL_MS};
use gpuledger_core::scope::Scope;

use super::cookies::SESSION_COOKIE;

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

/// A signed-in person.
#[derive(Debug, Clone)]
pub struct SignedIn {
    pub username: String,
    pub role: Role,
    pub csrf: String,
    pub token_hash: String,
    /// A BI tool's read-only token rather than a person's session: it reads, never posts.
    pub read_token: bool,
    /// The teams whose figures this person or token sees (admins: every team).
    pub scope: Scope,
    /// Where this request reads its figures (the read replica or the primary).
    pub reads: super::reads::Reads,
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

/// Answered as the API answers (JSON errors, never a sign-in redirect): the API, and
/// `/metrics`, which Prometheus scrapes with a read-only token.
fn is_api(parts: &Parts) -> bool {
    let path = parts.uri.path();
    path.starts_with("/api/") || path == "/metrics"
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

/// A signed-in person or read-only token whose handler narrows what it shows to
/// [`SignedIn::scope`]: the one extractor that lets a team-scoped viewer through.
#[derive(Debug, Clone)]
pub struct TeamScoped(pub SignedIn);

impl FromRequestParts<AppState> for TeamScoped {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        signed_in(parts, state).await.map(TeamScoped)
    }
}

/// Somebody who sees every team: a team-scoped viewer or token gets 403, saying why.
impl FromRequestParts<AppState> for SignedIn {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let who = signed_in(parts, state).await?;
        if who.scope.is_all() {
            return Ok(who);
        }
        let message = format!(
            "This covers every team; {} sees {} only. Each team's own figures are on the \
             review and the budgets page, and in the API's allocation, variance, budgets and \
             anomalies.",
            who.username,
            who.scope.describe()
        );
        Err(if is_api(parts) {
            ApiError::OutOfScope(message).into_response()
        } else {
            error_page(StatusCode::FORBIDDEN, "Every team's figures", &message)
        })
    }
}

/// Whoever the request's session cookie or read-only token names, with their scope.
async fn signed_in(parts: &Parts, state: &AppState) -> Result<SignedIn, Response> {
    let jar = CookieJar::from_headers(&parts.headers);
    let Some(token) = jar.get(SESSION_COOKIE).map(|c| c.value().to_owned()) else {
        return read_only_token(parts, state).await;
    };
    let token_hash = hash_token(&token);
    match crate::session::find(state.store.as_ref(), &token_hash, now_ms()).await {
        Ok(Some(s)) => Ok(SignedIn {
            scope: crate::session::scope_of(&s.role, s.teams.as_deref()),
            username: s.username,
            role: Role::parse(&s.role).unwrap_or(Role::Viewer),
            csrf: s.csrf_token,
            token_hash,
            read_token: false,
            reads: super::reads::Reads::of(parts, state),
        }),
        Ok(None) => Err(unauthenticated(parts)),
        Err(e) => {
            if is_api(parts) {
                tracing::error!(error = %e, "reading a session");
            }
            Err(if is_api(parts) {
                ApiError::Unavailable.into_response()
            } else {
                database_unavailable("reading a session", &e)
            })
        }
    }
}

/// A BI tool's read-only token (`Authorization: Bearer gpr_…`) reads as a viewer does, by GET
/// only: any other method is refused (403), and the CSRF token it carries is random, so no
/// form could ever pass with it. Anything else is not signed in.
async fn read_only_token(parts: &Parts, state: &AppState) -> Result<SignedIn, Response> {
    let Some(secret) =
        crate::auth::bearer(&parts.headers).filter(|s| s.starts_with(crate::read_tokens::PREFIX))
    else {
        return Err(unauthenticated(parts));
    };
    if !matches!(parts.method, Method::GET | Method::HEAD) {
        return Err(if is_api(parts) {
            ApiError::Forbidden.into_response()
        } else {
            error_page(
                StatusCode::FORBIDDEN,
                "Read-only token",
                "A read-only API token reads; it changes nothing.",
            )
        });
    }
    match crate::read_tokens::authenticate(state.store.as_ref(), secret, now_ms()).await {
        Ok(Some(t)) => Ok(SignedIn {
            scope: crate::read_tokens::scope_of(&t),
            username: format!("token {}", t.name),
            role: Role::Viewer,
            csrf: crate::auth::generate_token(),
            token_hash: String::new(),
            read_token: true,
            reads: super::reads::Reads::of(parts, state),
        }),
        Ok(None) => Err(unauthenticated(parts)),
        Err(e) => {
            tracing::error!(error = %e, "reading a read-only token");
            Err(if is_api(parts) {
                ApiError::Unavailable.into_response()
            } else {
                database_unavailable("reading a token", &e)
            })
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

/// A form that carries the session's CSRF token in a `csrf` field.
pub trait CsrfForm {
    fn csrf(&self) -> &str;
}

/// A form a signed-in person posted, its CSRF token already checked. A form without the
/// session's token (posted from elsewhere, or from a page older than the session) gets a page
/// saying it has expired, and the handler never runs.
pub struct SignedInForm<T> {
    pub user: SignedIn,
    // Signing out posts the token alone; a form of a signed-in viewer with fields reads this.
    #[allow(dead_code)]
    pub form: T,
}

/// A form an admin posted, its CSRF token already checked: every handler that changes something
/// takes this, so none of them can forget the check. A viewer gets 403.
pub struct AdminForm<T> {
    pub user: SignedIn,
    pub form: T,
}

/// The form of a request whose person has been extracted already, its token checked against
/// theirs.
async fn checked_form<T>(user: &SignedIn, req: Request, state: &AppState) -> Result<T, Response>
where
    T: DeserializeOwned + CsrfForm,
{
    // A read-only token never gets this far (it may only GET); should that ever change, no
    // form of any kind is posted with one.
    if user.read_token {
        return Err(error_page(
            StatusCode::FORBIDDEN,
            "Read-only token",
            "A read-only API token reads; it changes nothing.",
        ));
    }
    let Form(form) = Form::<T>::from_request(req, state)
        .await
        .map_err(IntoResponse::into_response)?;
    if !user.csrf_ok(form.csrf()) {
        return Err(csrf_rejected());
    }
    Ok(form)
}

impl<T> FromRequest<AppState> for SignedInForm<T>
where
    T: DeserializeOwned + CsrfForm + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        // Signing out and changing one's password show no team's figures.
        let TeamScoped(user) = TeamScoped::from_request_parts(&mut parts, state).await?;
        let form = checked_form(&user, Request::from_parts(parts, body), state).await?;
        Ok(SignedInForm { user, form })
    }
}

impl<T> FromRequest<AppState> for AdminForm<T>
where
    T: DeserializeOwned + CsrfForm + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let AdminOnly(user) = AdminOnly::from_request_parts(&mut parts, state).await?;
        let form = checked_form(&user, Request::from_parts(parts, body), state).await?;
        Ok(AdminForm { user, form })
    }
}

/// The page for a request the database could not answer; `context` names it in the log.
pub fn database_unavailable(context: &str, error: impl std::fmt::Display) -> Response {
    tracing::error!(error = %error, "{context}");
    error_page(
        StatusCode::SERVICE_UNAVAILABLE,
        "The database is unavailable",
        "Try again in a minute.",
    )
}

/// Whether a write sent with the session cookie comes from this site. A browser says where a
/// request comes from (`Sec-Fetch-Site`, `Origin`); a script or BI tool says neither. JSON bodies
/// and `SameSite=Lax` already keep other sites out; this says so outright, so that a CORS layer
/// added one day cannot let them in.
pub(super) fn from_this_site(headers: &axum::http::HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("sec-fetch-site").is_some_and(|s| s != "same-origin" && s != "none") {
        return false;
    }
    match (header("origin"), header("host")) {
        (None, _) => true,
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(host)),
        (Some(_), None) => false,
    }
}

/// A write's JSON body (budgets, dismissals), from this site only ([`from_this_site`]).
pub(super) fn write_body<T>(
    headers: &axum::http::HeaderMap,
    body: Result<Json<T>, axum::extract::rejection::JsonRejection>,
) -> Result<T, ApiError> {
    if !from_this_site(headers) {
        return Err(ApiError::Forbidden);
    }
    body.map(|Json(b)| b).map_err(|e| ApiError::BadRequest {
        message: e.body_text(),
        field: None,
    })
}

/// The page frame of a signed-in person.
impl From<&SignedIn> for Chrome {
    fn from(s: &SignedIn) -> Self {
        Chrome {
            username: s.username.clone(),
            role: s.role.as_str(),
            csrf: s.csrf.clone(),
            teams: (!s.scope.is_all()).then(|| s.scope.describe()),
            generated: crate::format::utc_minute(crate::clock::now_ms()),
            freshness: s.reads.freshness(),
        }
    }
}
