//! People: users, their sessions, and failed sign-ins (what throttles guessing).

use super::db::{on_backend, On};
use super::StoreError;

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UserRow {
    pub id: i64,
    pub username: String,
    pub password_hash: String,
    pub role: String,
    pub created_ms: i64,
    /// The teams a viewer sees (a JSON array); NULL for every team.
    pub teams: Option<String>,
    /// `ISSUER#SUBJECT` for a person who signs in through OpenID Connect.
    pub oidc_subject: Option<String>,
}

/// A live session with its user.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SessionRow {
    pub user_id: i64,
    pub username: String,
    pub role: String,
    pub teams: Option<String>,
    pub csrf_token: String,
    pub expires_ms: i64,
}

pub async fn create_user(
    on: impl Into<On<'_>>,
    username: &str,
    password_hash: &str,
    role: &str,
    teams: Option<&str>,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let result = sqlx::query(
            "INSERT INTO users (username, password_hash, role, teams, created_ms)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(username)
        .bind(password_hash)
        .bind(role)
        .bind(teams)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!("user {username:?}")));
        }
        Ok(())
    })
}

pub async fn user_by_name(
    on: impl Into<On<'_>>,
    username: &str,
) -> Result<Option<UserRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT id, username, password_hash, role, created_ms, teams, oidc_subject FROM users WHERE username = $1",
        )
        .bind(username)
        .fetch_optional(&mut *ex)
        .await?)
    })
}

pub async fn list_users(on: impl Into<On<'_>>) -> Result<Vec<UserRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT id, username, password_hash, role, created_ms, teams, oidc_subject FROM users ORDER BY username",
        )
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Sets the teams a user sees (`None`: every team). False where there is no such user.
pub async fn set_teams(
    on: impl Into<On<'_>>,
    user_id: i64,
    teams: Option<&str>,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query("UPDATE users SET teams = $1 WHERE id = $2")
            .bind(teams)
            .bind(user_id)
            .execute(&mut *ex)
            .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Locks the admins' rows until the transaction ends, so that two admins removed at once
/// cannot both see the other still there (PostgreSQL; SQLite has one writer anyway).
pub async fn lock_admins(on: impl Into<On<'_>>) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("UPDATE users SET role = role WHERE role = 'admin'")
            .execute(&mut *ex)
            .await?;
        Ok(())
    })
}

pub async fn admin_count(on: impl Into<On<'_>>) -> Result<i64, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM users WHERE role = 'admin'")
            .fetch_one(&mut *ex)
            .await?;
        Ok(n)
    })
}

/// Removes a user and every session of theirs.
pub async fn delete_user(on: impl Into<On<'_>>, user_id: i64) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("DELETE FROM sessions WHERE user_id = $1")
            .bind(user_id)
            .execute(&mut *ex)
            .await?;
        sqlx::query("DELETE FROM users WHERE id = $1")
            .bind(user_id)
            .execute(&mut *ex)
            .await?;
        Ok(())
    })
}

/// Sets a user's password hash and ends their sessions, but the one `keep` names (the hash of
/// the session that changed its own password).
pub async fn set_password_hash(
    on: impl Into<On<'_>>,
    user_id: i64,
    password_hash: &str,
    keep: Option<&str>,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("UPDATE users SET password_hash = $1 WHERE id = $2")
            .bind(password_hash)
            .bind(user_id)
            .execute(&mut *ex)
            .await?;
        sqlx::query("DELETE FROM sessions WHERE user_id = $1 AND token_hash <> $2")
            .bind(user_id)
            .bind(keep.unwrap_or(""))
            .execute(&mut *ex)
            .await?;
        Ok(())
    })
}

pub async fn create_session(
    on: impl Into<On<'_>>,
    token_hash: &str,
    user_id: i64,
    csrf_token: &str,
    now_ms: i64,
    expires_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        // Expired sessions go as new ones come, so the table stays small.
        sqlx::query("DELETE FROM sessions WHERE expires_ms <= $1")
            .bind(now_ms)
            .execute(&mut *ex)
            .await?;
        sqlx::query(
            "INSERT INTO sessions (token_hash, user_id, csrf_token, created_ms, expires_ms)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(token_hash)
        .bind(user_id)
        .bind(csrf_token)
        .bind(now_ms)
        .bind(expires_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// The session behind this token hash, if it has not expired.
pub async fn session(
    on: impl Into<On<'_>>,
    token_hash: &str,
    now_ms: i64,
) -> Result<Option<SessionRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT s.user_id, u.username, u.role, u.teams, s.csrf_token, s.expires_ms
             FROM sessions s JOIN users u ON u.id = s.user_id
             WHERE s.token_hash = $1 AND s.expires_ms > $2",
        )
        .bind(token_hash)
        .bind(now_ms)
        .fetch_optional(&mut *ex)
        .await?)
    })
}

pub async fn delete_session(on: impl Into<On<'_>>, token_hash: &str) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("DELETE FROM sessions WHERE token_hash = $1")
            .bind(token_hash)
            .execute(&mut *ex)
            .await?;
        Ok(())
    })
}

/// Records a failed sign-in and forgets those older than `forget_before_ms`.
pub async fn record_sign_in_failure(
    on: impl Into<On<'_>>,
    username: &str,
    client: &str,
    at_ms: i64,
    forget_before_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        sqlx::query("DELETE FROM sign_in_failures WHERE at_ms < $1")
            .bind(forget_before_ms)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO sign_in_failures (at_ms, username, client) VALUES ($1, $2, $3)")
            .bind(at_ms)
            .bind(username)
            .bind(client)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    })
}

/// Failed sign-ins since `since_ms`: (for this username, from this client).
pub async fn sign_in_failures(
    on: impl Into<On<'_>>,
    username: &str,
    client: &str,
    since_ms: i64,
) -> Result<(i64, i64), StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT
               (SELECT COUNT(*) FROM sign_in_failures WHERE username = $1 AND at_ms >= $3),
               (SELECT COUNT(*) FROM sign_in_failures WHERE client = $2 AND at_ms >= $3)",
        )
        .bind(username)
        .bind(client)
        .bind(since_ms)
        .fetch_one(&mut *ex)
        .await?)
    })
}

/// A successful sign-in wipes the username's failures.
pub async fn clear_sign_in_failures(
    on: impl Into<On<'_>>,
    username: &str,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("DELETE FROM sign_in_failures WHERE username = $1")
            .bind(username)
            .execute(&mut *ex)
            .await?;
        Ok(())
    })
}

/// The person the OpenID Connect provider names `subject` (`ISSUER#SUB`).
pub async fn oidc_user(
    on: impl Into<On<'_>>,
    subject: &str,
) -> Result<Option<UserRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT id, username, password_hash, role, created_ms, teams, oidc_subject
             FROM users WHERE oidc_subject = $1",
        )
        .bind(subject)
        .fetch_optional(&mut *ex)
        .await?)
    })
}

/// Adds a person who signs in through the provider: no password of ours can sign them in (the
/// hash is not one). A name already taken, or the subject already known, is a conflict.
pub async fn create_oidc_user(
    on: impl Into<On<'_>>,
    username: &str,
    subject: &str,
    (role, teams): (&str, Option<&str>),
    now_ms: i64,
) -> Result<i64, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let id: Option<(i64,)> = sqlx::query_as(
            "INSERT INTO users (username, password_hash, role, teams, created_ms, oidc_subject)
             VALUES ($1, '!', $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING id",
        )
        .bind(username)
        .bind(role)
        .bind(teams)
        .bind(now_ms)
        .bind(subject)
        .fetch_optional(&mut *ex)
        .await?;
        id.map(|(id,)| id)
            .ok_or_else(|| StoreError::Conflict(format!("user {username:?}")))
    })
}

/// Sets a person's role and teams (from the provider's groups at each sign-in).
pub async fn set_role_and_teams(
    on: impl Into<On<'_>>,
    user_id: i64,
    role: &str,
    teams: Option<&str>,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("UPDATE users SET role = $1, teams = $2 WHERE id = $3")
            .bind(role)
            .bind(teams)
            .bind(user_id)
            .execute(&mut *ex)
            .await?;
        Ok(())
    })
}

/// A sign-in under way at the provider, as its callback needs it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OidcLogin {
    pub verifier: String,
    pub nonce: String,
    pub next: String,
}

/// Records a sign-in sent to the provider, and forgets those started before `expired_before`.
pub async fn put_oidc_login(
    on: impl Into<On<'_>>,
    state_hash: &str,
    login: &OidcLogin,
    now_ms: i64,
    expired_before: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("DELETE FROM oidc_logins WHERE created_ms < $1")
            .bind(expired_before)
            .execute(&mut *ex)
            .await?;
        sqlx::query(
            "INSERT INTO oidc_logins (state_hash, verifier, nonce, next, created_ms)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(state_hash)
        .bind(&login.verifier)
        .bind(&login.nonce)
        .bind(&login.next)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// Takes the sign-in `state_hash` names, once: a second callback with the same state finds
/// nothing. `None` also where it started before `not_before`.
pub async fn take_oidc_login(
    on: impl Into<On<'_>>,
    state_hash: &str,
    not_before: i64,
) -> Result<Option<OidcLogin>, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "DELETE FROM oidc_logins WHERE state_hash = $1 AND created_ms >= $2
             RETURNING verifier, nonce, next",
        )
        .bind(state_hash)
        .bind(not_before)
        .fetch_optional(&mut *ex)
        .await?)
    })
}
