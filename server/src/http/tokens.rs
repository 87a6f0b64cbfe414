//! Agent tokens for admins (`/tokens`): each token's scope, state and last use, and forms to
//! create, rotate and revoke tokens and to move a host to another token. The same operations as
//! `gpuledger-server token ...` (both go through [`crate::agent_tokens`]). A new secret is shown
//! once, on the page that answers the form, and never stored in clear.

use std::time::Duration;

use askama::Template;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;

use super::page::{error_page, render_with_status, Chrome};
use super::session::{AdminForm, AdminOnly, CsrfForm};
use super::AppState;
use crate::agent_tokens::{self, TokenAdminError, TokenRequest};
use crate::clock::now_ms;
use crate::format::ago;
use crate::store::tokens::TokenRow;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/tokens", get(tokens_page).post(create))
        .route("/tokens/rotate", post(rotate))
        .route("/tokens/revoke", post(revoke))
        .route("/tokens/rebind", post(rebind))
        .route("/tokens/bind", post(bind))
        .route("/tokens/unbind", post(unbind))
        .route("/tokens/read", post(create_read))
        .route("/tokens/read/revoke", post(revoke_read))
}

struct ReadTokenView {
    name: String,
    state: &'static str,
    created: String,
    created_by: String,
    last_used: String,
    teams: String,
}

fn read_view(t: &crate::store::read_tokens::ReadTokenRow, now: i64) -> ReadTokenView {
    ReadTokenView {
        name: t.name.clone(),
        state: if t.revoked_ms.is_some() {
            "revoked"
        } else {
            "active"
        },
        created: when(Some(t.created_ms)),
        created_by: t.created_by.clone(),
        last_used: t.last_used_ms.map_or("never".to_owned(), |u| ago(now - u)),
        teams: crate::read_tokens::scope_of(t).describe(),
    }
}

struct BindingView {
    token: String,
    role: String,
    value: String,
    since: String,
}

struct TokenView {
    name: String,
    state: &'static str,
    scope: String,
    created: String,
    expires: String,
    last_used: String,
    last_address: String,
    old_secret_until: String,
}

fn when(ms: Option<i64>) -> String {
    ms.map_or_else(|| "—".to_owned(), crate::format::utc_minute)
}

fn view(t: &TokenRow, now: i64) -> TokenView {
    TokenView {
        name: t.name.clone(),
        state: agent_tokens::state(t, now),
        scope: agent_tokens::scope_text(t),
        created: when(Some(t.created_ms)),
        expires: t.expires_ms.map_or("never".to_owned(), |e| when(Some(e))),
        last_used: t.last_used_ms.map_or("never".to_owned(), |u| ago(now - u)),
        last_address: t.last_address.clone().unwrap_or_else(|| "—".to_owned()),
        old_secret_until: t
            .previous_expires_ms
            .filter(|&e| e > now)
            .map_or(String::new(), |e| when(Some(e))),
    }
}

#[derive(Template)]
#[template(path = "tokens.html")]
struct TokensPage {
    chrome: Option<Chrome>,
    csrf: String,
    tokens: Vec<TokenView>,
    read_tokens: Vec<ReadTokenView>,
    /// Owners admins bound to tokens, by token.
    bindings: Vec<BindingView>,
    /// A secret just made: (token name, secret).
    issued: Option<(String, String)>,
    /// What went wrong with the last form, in words.
    problem: Option<String>,
    done: Option<String>,
}

async fn page(
    state: &AppState,
    user: &super::session::SignedIn,
    status: StatusCode,
    issued: Option<(String, String)>,
    problem: Option<String>,
    done: Option<String>,
) -> Response {
    let now = now_ms();
    let listed = tokio::try_join!(
        agent_tokens::list(state.store.as_ref()),
        crate::read_tokens::list(state.store.as_ref()),
        agent_tokens::owner_bindings(state.store.as_ref()),
    );
    let (tokens, read_tokens, bindings) = match listed {
        Ok((t, r, b)) => (
            t.iter().map(|t| view(t, now)).collect(),
            r.iter().map(|r| read_view(r, now)).collect(),
            b.into_iter()
                .map(|b| BindingView {
                    since: when(Some(b.bound_ms)),
                    token: b.token,
                    role: b.role,
                    value: b.value,
                })
                .collect(),
        ),
        Err(e) => {
            tracing::error!(error = %e, "tokens page: storage failed");
            return error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "Tokens cannot be read right now. Try again in a minute.",
            );
        }
    };
    let secret_shown = issued.is_some();
    let mut resp = render_with_status(
        status,
        &TokensPage {
            chrome: Some(Chrome::from(user)),
            csrf: user.csrf.clone(),
            tokens,
            read_tokens,
            bindings,
            issued,
            problem,
            done,
        },
    );
    if secret_shown {
        // The secret must not stay in any cache.
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

async fn tokens_page(State(state): State<AppState>, AdminOnly(user): AdminOnly) -> Response {
    page(&state, &user, StatusCode::OK, None, None, None).await
}

/// What a refused form shows: the admin's mistake with a 400, storage trouble with a 503.
async fn answer_error(
    state: &AppState,
    user: &super::session::SignedIn,
    e: TokenAdminError,
) -> Response {
    match e {
        TokenAdminError::Invalid(message) => {
            page(
                state,
                user,
                StatusCode::BAD_REQUEST,
                None,
                Some(message),
                None,
            )
            .await
        }
        TokenAdminError::Store(e) => {
            tracing::error!(error = %e, "tokens: storage failed");
            error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "Nothing was changed. Try again in a minute.",
            )
        }
    }
}

fn days(text: &str, what: &str) -> Result<Option<Duration>, TokenAdminError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    match text.parse::<u32>() {
        Ok(d) if (1..=3650).contains(&d) => Ok(Some(Duration::from_secs(u64::from(d) * 86_400))),
        _ => Err(TokenAdminError::Invalid(format!(
            "{what} must be a whole number of days from 1 to 3650, not {text:?}"
        ))),
    }
}

fn hours(text: &str) -> Result<Duration, TokenAdminError> {
    match text.trim().parse::<u32>() {
        Ok(h) if h <= 24 * 30 => Ok(Duration::from_secs(u64::from(h) * 3_600)),
        _ => Err(TokenAdminError::Invalid(format!(
            "the overlap must be a whole number of hours from 0 to 720, not {text:?}"
        ))),
    }
}

#[derive(Debug, Deserialize)]
struct CreateForm {
    csrf: String,
    name: String,
    cluster: String,
    #[serde(default)]
    hosts: String,
    #[serde(default)]
    expires_days: String,
}

impl CsrfForm for CreateForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

async fn create(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<CreateForm>,
) -> Response {
    let result = async {
        let request = TokenRequest {
            name: form.name.trim().to_owned(),
            cluster: form.cluster.clone(),
            hosts: Some(form.hosts.clone()).filter(|h| !h.trim().is_empty()),
            expires_in: days(&form.expires_days, "the lifetime")?,
        };
        agent_tokens::create(state.store.as_ref(), &request, now_ms()).await
    }
    .await;
    answer_issued(&state, &user, result, |t| {
        format!(
            "Token {:?} created for {}.",
            t.name,
            agent_tokens::scope_text(t)
        )
    })
    .await
}

/// The page after a form that made a secret: the secret shown once and what was done, or what
/// was wrong.
async fn answer_issued(
    state: &AppState,
    user: &super::session::SignedIn,
    result: Result<agent_tokens::Issued, TokenAdminError>,
    done: impl FnOnce(&TokenRow) -> String,
) -> Response {
    match result {
        Ok(issued) => {
            let done = done(&issued.token);
            let shown = Some((issued.token.name, issued.secret));
            page(state, user, StatusCode::OK, shown, None, Some(done)).await
        }
        Err(e) => answer_error(state, user, e).await,
    }
}

#[derive(Debug, Deserialize)]
struct RotateForm {
    csrf: String,
    name: String,
    overlap_hours: String,
}

impl CsrfForm for RotateForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

async fn rotate(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<RotateForm>,
) -> Response {
    let result = async {
        let overlap = hours(&form.overlap_hours)?;
        agent_tokens::rotate(state.store.as_ref(), &form.name, overlap, now_ms()).await
    }
    .await;
    answer_issued(&state, &user, result, |t| {
        format!(
            "Token {:?} has a new secret; {}.",
            t.name,
            agent_tokens::rotation_text(t)
        )
    })
    .await
}

#[derive(Debug, Deserialize)]
struct NameForm {
    csrf: String,
    name: String,
    /// A read-only token's teams, comma-separated; blank for every team.
    #[serde(default)]
    teams: String,
}

impl CsrfForm for NameForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

#[derive(Debug, Deserialize)]
struct RevokeForm {
    csrf: String,
    name: String,
    /// `keep` or `remove`: what becomes of the counts and progress the token sent.
    #[serde(default)]
    usage: String,
}

impl CsrfForm for RevokeForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

async fn revoke(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<RevokeForm>,
) -> Response {
    let sent = match form.usage.as_str() {
        "keep" => Some(agent_tokens::SentUsage::Keep),
        "remove" => Some(agent_tokens::SentUsage::Remove),
        _ => None,
    };
    match agent_tokens::revoke(state.store.as_ref(), &form.name, sent, now_ms()).await {
        Ok(_) => Redirect::to("/tokens").into_response(),
        Err(e) => answer_error(&state, &user, e).await,
    }
}

#[derive(Debug, Deserialize)]
struct RebindForm {
    csrf: String,
    host: String,
    token: String,
}

impl CsrfForm for RebindForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

async fn rebind(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<RebindForm>,
) -> Response {
    let host = form.host.trim();
    match agent_tokens::rebind(state.store.as_ref(), host, form.token.trim(), now_ms()).await {
        Ok(()) => {
            let done = format!(
                "Host {host} now reports with token {:?}.",
                form.token.trim()
            );
            page(&state, &user, StatusCode::OK, None, None, Some(done)).await
        }
        Err(e) => answer_error(&state, &user, e).await,
    }
}

#[derive(Debug, Deserialize)]
struct BindForm {
    csrf: String,
    token: String,
    role: String,
    value: String,
}

impl CsrfForm for BindForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /tokens/bind` (admins): lets a token post counts or progress for an endpoint or
/// experiment its hosts do not run.
async fn bind(state: State<AppState>, form: AdminForm<BindForm>) -> Response {
    change_binding(state, form, true).await
}

/// `POST /tokens/unbind` (admins): takes a binding back.
async fn unbind(state: State<AppState>, form: AdminForm<BindForm>) -> Response {
    change_binding(state, form, false).await
}

async fn change_binding(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<BindForm>,
    bind: bool,
) -> Response {
    let token = form.token.trim();
    let changed = async {
        let owner = (
            agent_tokens::BoundRole::parse(&form.role)?,
            form.value.as_str(),
        );
        if bind {
            agent_tokens::bind_owner(state.store.as_ref(), token, owner, now_ms()).await
        } else {
            agent_tokens::unbind_owner(state.store.as_ref(), token, owner).await
        }
    };
    match changed.await {
        Ok(()) => {
            let (role, value) = (form.role.trim(), form.value.trim());
            let done = if bind {
                format!("Token {token:?} may post for {role} {value:?} wherever it runs.")
            } else {
                format!("Token {token:?} posts for {role} {value:?} only while its hosts run it.")
            };
            page(&state, &user, StatusCode::OK, None, None, Some(done)).await
        }
        Err(e) => answer_error(&state, &user, e).await,
    }
}

/// `POST /tokens/read` (admins): makes a read-only API token; its secret is shown once.
async fn create_read(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<NameForm>,
) -> Response {
    let scope = match gpuledger_core::scope::Scope::parse_list(&form.teams) {
        Ok(scope) => scope,
        Err(e) => {
            return answer_error(&state, &user, TokenAdminError::Invalid(e.to_string())).await
        }
    };
    match crate::read_tokens::create(
        state.store.as_ref(),
        &form.name,
        &scope,
        &user.username,
        now_ms(),
    )
    .await
    {
        Ok(secret) => {
            let name = form.name.trim().to_owned();
            let done = format!(
                "Read-only token {name:?} created; it reads {}.",
                scope.describe()
            );
            page(
                &state,
                &user,
                StatusCode::OK,
                Some((name, secret)),
                None,
                Some(done),
            )
            .await
        }
        Err(crate::read_tokens::ReadTokenError::Invalid(m)) => {
            answer_error(&state, &user, TokenAdminError::Invalid(m)).await
        }
        Err(crate::read_tokens::ReadTokenError::Store(e)) => {
            answer_error(&state, &user, TokenAdminError::Store(e)).await
        }
    }
}

/// `POST /tokens/read/revoke` (admins): the token stops working at once.
async fn revoke_read(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<NameForm>,
) -> Response {
    match crate::read_tokens::revoke(state.store.as_ref(), &form.name, now_ms()).await {
        Ok(true) => Redirect::to("/tokens").into_response(),
        Ok(false) => {
            let m = format!("there is no active read-only token {:?}", form.name.trim());
            answer_error(&state, &user, TokenAdminError::Invalid(m)).await
        }
        Err(e) => answer_error(&state, &user, TokenAdminError::Store(e)).await,
    }
}
