//! People: admins add and remove users and set their passwords on `/users` (the same as
//! `gpuledger-server user ...`); everybody signed in changes their own password on `/account`.
//! All of it goes through [`crate::session`].

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;

use super::page::{render_with_status, Chrome};
use super::session::{
    database_unavailable, AdminForm, AdminOnly, CsrfForm, SignedIn, SignedInForm, TeamScoped,
};
use super::AppState;
use crate::clock::now_ms;
use crate::session::AccountError;
use gpuledger_core::scope::Scope;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/users", get(users_page).post(add))
        .route("/users/remove", post(remove))
        .route("/users/password", post(set_password))
        .route("/users/teams", post(set_teams))
        .route("/account", get(account_page))
        .route("/account/password", post(change_own_password))
}

struct UserView {
    username: String,
    role: String,
    /// The teams a viewer sees, comma-separated; empty for every team.
    teams: String,
    /// Signs in through the provider, whose groups set their role and teams.
    sso: bool,
    created: String,
    is_me: bool,
}

#[derive(Template)]
#[template(path = "users.html")]
struct UsersPage {
    chrome: Option<Chrome>,
    csrf: String,
    users: Vec<UserView>,
    problem: Option<String>,
    done: Option<String>,
}

#[derive(Template)]
#[template(path = "account.html")]
struct AccountPage {
    chrome: Option<Chrome>,
    csrf: String,
    username: String,
    role: &'static str,
    /// The teams whose figures they see.
    teams: String,
    /// A read-only token has no password to change.
    read_token: bool,
    problem: Option<String>,
    done: Option<String>,
}

/// What the form's outcome says: done (200), the person's mistake (400), or storage (503).
type Outcome = Result<String, AccountError>;

/// What a page says after a form: its status, what was done or what was wrong; storage
/// trouble is a page of its own.
fn said(
    outcome: Option<Outcome>,
    context: &str,
) -> Result<(StatusCode, Option<String>, Option<String>), Box<Response>> {
    match outcome {
        None => Ok((StatusCode::OK, None, None)),
        Some(Ok(done)) => Ok((StatusCode::OK, Some(done), None)),
        Some(Err(AccountError::Store(e))) => Err(Box::new(database_unavailable(context, e))),
        Some(Err(e)) => Ok((StatusCode::BAD_REQUEST, None, Some(e.to_string()))),
    }
}

async fn users(state: &AppState, user: &SignedIn, outcome: Option<Outcome>) -> Response {
    let (status, done, problem) = match said(outcome, "changing users") {
        Ok(x) => x,
        Err(page) => return *page,
    };
    let rows = match crate::session::list_users(state.store.as_ref()).await {
        Ok(rows) => rows,
        Err(e) => return database_unavailable("users page", e),
    };
    render_with_status(
        status,
        &UsersPage {
            chrome: Some(Chrome::from(user)),
            csrf: user.csrf.clone(),
            users: rows
                .into_iter()
                .map(|u| UserView {
                    is_me: u.username == user.username,
                    sso: u.oidc_subject.is_some(),
                    teams: crate::session::scope_of(&u.role, u.teams.as_deref())
                        .team_names()
                        .map(|t| t.iter().cloned().collect::<Vec<_>>().join(", "))
                        .unwrap_or_default(),
                    username: u.username,
                    role: u.role,
                    created: crate::format::utc_minute(u.created_ms),
                })
                .collect(),
            problem,
            done,
        },
    )
}

/// `GET /users` (admins): every user and their role, with forms to add, remove and set
/// passwords.
async fn users_page(State(state): State<AppState>, AdminOnly(user): AdminOnly) -> Response {
    users(&state, &user, None).await
}

#[derive(Debug, Default, Deserialize)]
struct UserForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    role: String,
    #[serde(default)]
    password: String,
    /// Comma-separated; blank for every team.
    #[serde(default)]
    teams: String,
}

impl CsrfForm for UserForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /users` (admins): adds a user.
async fn add(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<UserForm>,
) -> Response {
    let outcome = match Scope::parse_list(&form.teams) {
        Err(e) => Err(AccountError::from(e)),
        Ok(scope) => crate::session::add_user(
            state.store.as_ref(),
            &form.username,
            &form.role,
            &scope,
            form.password,
            now_ms(),
        )
        .await
        .map(|()| {
            format!(
                "{} added as {}, seeing {}.",
                form.username.trim(),
                form.role.trim(),
                scope.describe()
            )
        }),
    };
    users(&state, &user, Some(outcome)).await
}

/// `POST /users/teams` (admins): scopes a viewer to teams (blank: every team).
async fn set_teams(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<UserForm>,
) -> Response {
    let outcome = match Scope::parse_list(&form.teams) {
        Err(e) => Err(AccountError::from(e)),
        Ok(scope) => crate::session::set_teams(state.store.as_ref(), &form.username, &scope)
            .await
            .map(|()| format!("{} now sees {}.", form.username.trim(), scope.describe())),
    };
    users(&state, &user, Some(outcome)).await
}

/// `POST /users/remove` (admins): removes a user and ends their sessions (never the last
/// admin).
async fn remove(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<UserForm>,
) -> Response {
    let outcome = crate::session::remove_user(state.store.as_ref(), &form.username, now_ms())
        .await
        .map(|()| format!("{} removed; their sessions ended.", form.username.trim()));
    users(&state, &user, Some(outcome)).await
}

/// `POST /users/password` (admins): sets a user's password and ends their sessions.
async fn set_password(
    State(state): State<AppState>,
    AdminForm { user, form }: AdminForm<UserForm>,
) -> Response {
    let outcome = crate::session::set_password(state.store.as_ref(), &form.username, form.password)
        .await
        .map(|()| {
            format!(
                "{}'s password is set; their sessions ended.",
                form.username.trim()
            )
        });
    users(&state, &user, Some(outcome)).await
}

async fn account(user: &SignedIn, outcome: Option<Outcome>) -> Response {
    let (status, done, problem) = match said(outcome, "changing a password") {
        Ok(x) => x,
        Err(page) => return *page,
    };
    render_with_status(
        status,
        &AccountPage {
            chrome: Some(Chrome::from(user)),
            csrf: user.csrf.clone(),
            username: user.username.clone(),
            role: user.role.as_str(),
            teams: user.scope.describe(),
            read_token: user.read_token,
            problem,
            done,
        },
    )
}

#[derive(Debug, Deserialize)]
struct AccountQuery {
    changed: Option<String>,
}

/// `GET /account`: who is signed in, and a form to change one's own password.
async fn account_page(TeamScoped(user): TeamScoped, Query(q): Query<AccountQuery>) -> Response {
    let done = q
        .changed
        .map(|_| Ok("Your password is changed; every other session of yours ended.".to_owned()));
    account(&user, done).await
}

#[derive(Debug, Default, Deserialize)]
struct PasswordForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    current: String,
    #[serde(default)]
    new: String,
    #[serde(default)]
    repeat: String,
}

impl CsrfForm for PasswordForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /account/password`: the current password, the new one twice. Every session ends,
/// this one too; the answer carries a new session's cookie and goes back to `/account`.
async fn change_own_password(
    State(state): State<AppState>,
    SignedInForm { user, form }: SignedInForm<PasswordForm>,
) -> Response {
    let changed = crate::session::change_own_password(
        state.store.as_ref(),
        &user.username,
        (form.current, form.new, form.repeat),
        now_ms(),
    )
    .await;
    match changed {
        Ok(token) => {
            let jar = axum_extra::extract::cookie::CookieJar::new()
                .add(super::session::session_cookie(token, state.secure_cookies));
            (jar, Redirect::to("/account?changed=1")).into_response()
        }
        Err(e) => account(&user, Some(Err(e))).await,
    }
}
