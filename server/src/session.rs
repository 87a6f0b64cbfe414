//! People signing in: roles, argon2 password hashes, and database-backed sessions (every
//! replica knows them), each with its own CSRF token. What HTTP makes of them (cookies, the
//! extractors that refuse a visitor who is not signed in, CSRF-checked forms) is in
//! `http::session`.

use std::sync::LazyLock;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use subtle::ConstantTimeEq;

use crate::auth::{generate_token, hash_token};
use crate::store::{self, Store, StoreError};
use gpuledger_core::scope::{Scope, ScopeError};

/// Failed sign-ins count for this long: after [`MAX_FAILURES_PER_USER`] for a name, or
/// [`MAX_FAILURES_PER_CLIENT`] from an address, sign-in pauses until the oldest ages out.
pub const FAILURE_WINDOW_MS: i64 = 15 * 60 * 1000;
pub const MAX_FAILURES_PER_USER: i64 = 5;
pub const MAX_FAILURES_PER_CLIENT: i64 = 20;
/// Where wrong current passwords at a password change are counted from (with the name's failed
/// sign-ins: both are guesses at the same password).
const PASSWORD_CHANGE_CLIENT: &str = "password change";
/// Usernames are stored for counting only; a megabyte of "username" is not.
const MAX_USERNAME_KEY: usize = 128;
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

/// How a sign-in ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignIn {
    /// Too many recent failures for this name or from this client: not even checked.
    TooManyAttempts,
    /// Wrong name or password (which one is not said); counted as a failure.
    Refused,
    /// Signed in: the new session's secret token, for the cookie.
    Started { token: String },
}

/// Signs `username` in with `password` from `client` (an address, or what stands for one) at
/// `now_ms`: refuses while failures for the name or the client are over their limits, checks
/// the password off the async threads (as slowly for a name that does not exist), counts a
/// failure, or clears the name's failures and starts a session.
pub async fn sign_in(
    store: &dyn Store,
    username: &str,
    password: String,
    client: &str,
    now_ms: i64,
) -> Result<SignIn, StoreError> {
    let username = username.trim();
    let username_key: String = username.chars().take(MAX_USERNAME_KEY).collect();
    let (by_user, by_client) = store::accounts::sign_in_failures(
        store.db(),
        &username_key,
        client,
        now_ms - FAILURE_WINDOW_MS,
    )
    .await?;
    if by_user >= MAX_FAILURES_PER_USER || by_client >= MAX_FAILURES_PER_CLIENT {
        tracing::warn!(username = %username_key, client = %client, "sign-in refused: too many failures");
        return Ok(SignIn::TooManyAttempts);
    }
    let user = store::accounts::user_by_name(store.db(), username).await?;
    // Verifying takes ~tens of milliseconds of CPU: off the async threads.
    let hash = user.as_ref().map(|u| u.password_hash.clone());
    let ok = tokio::task::spawn_blocking(move || verify_or_waste_time(hash.as_deref(), &password))
        .await
        .unwrap_or(false);
    let Some(user) = user.filter(|_| ok) else {
        tracing::info!(username = %username_key, client = %client, "failed sign-in");
        store::accounts::record_sign_in_failure(
            store.db(),
            &username_key,
            client,
            now_ms,
            now_ms - FAILURE_WINDOW_MS,
        )
        .await?;
        return Ok(SignIn::Refused);
    };
    if let Err(e) = store::accounts::clear_sign_in_failures(store.db(), &username_key).await {
        tracing::error!(error = %e, "sign-in: clearing failures");
    }
    let token = start(store, user.id, now_ms).await?;
    Ok(SignIn::Started { token })
}

/// The live session whose token hashes to `token_hash`, with its user.
pub async fn find(
    store: &dyn Store,
    token_hash: &str,
    now_ms: i64,
) -> Result<Option<crate::store::accounts::SessionRow>, StoreError> {
    store::accounts::session(store.db(), token_hash, now_ms).await
}

/// Ends the session whose token hashes to `token_hash` (signing out).
pub async fn end(store: &dyn Store, token_hash: &str) -> Result<(), StoreError> {
    store::accounts::delete_session(store.db(), token_hash).await
}

/// Starts a session for `user_id` at `now_ms`; returns its secret token, which only the
/// person's cookie holds (the database keeps its hash).
pub async fn start(store: &dyn Store, user_id: i64, now_ms: i64) -> Result<String, StoreError> {
    open_session(store.db(), user_id, now_ms).await
}

/// [`start`] on `on` (a transaction, where the session starts with another change).
async fn open_session(
    on: impl Into<store::db::On<'_>>,
    user_id: i64,
    now_ms: i64,
) -> Result<String, StoreError> {
    let (token, csrf) = (generate_token(), generate_token());
    store::accounts::create_session(
        on,
        &hash_token(&token),
        user_id,
        &csrf,
        now_ms,
        now_ms + SESSION_TTL_MS,
    )
    .await?;
    Ok(token)
}

/// Why a change to people was refused.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("there is no user {0:?}")]
    NoSuchUser(String),
    #[error("{0:?} is the last admin: add another admin first, or nobody could manage the server")]
    LastAdmin(String),
    #[error("the current password is not right")]
    WrongPassword,
    #[error("too many wrong passwords for this name: wait a quarter of an hour")]
    TooManyAttempts,
    #[error("the two new passwords differ")]
    Mismatch,
    #[error("{0:?} is not a user name: 1 to 64 letters, digits and . _ @ -")]
    BadName(String),
    #[error("{0:?} is not a role: viewer or admin")]
    BadRole(String),
    #[error("there is a user {0:?} already")]
    Exists(String),
    #[error("admins see every team: only a viewer is scoped to teams")]
    AdminScoped,
    #[error(
        "there is a local user {0:?} already (or another of the provider's accounts took the \
         name): an admin removes it before {0} signs in through the provider"
    )]
    NameTaken(String),
    #[error("{0} signs in through the provider: their role and teams come from its groups")]
    FromProvider(String),
    #[error(transparent)]
    Scope(#[from] ScopeError),
    #[error(transparent)]
    Password(#[from] PasswordError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Hashes off the async threads: argon2 takes tens of milliseconds of CPU.
async fn hash_off_thread(password: String) -> Result<String, AccountError> {
    tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| AccountError::Password(PasswordError::Hash(e.to_string())))?
        .map_err(AccountError::from)
}

/// Adds a person: a name of 1 to 64 characters without spaces or control characters, a role,
/// the teams a viewer sees (admins see all), a password of at least [`MIN_PASSWORD_LEN`]
/// characters.
pub async fn add_user(
    store: &dyn Store,
    username: &str,
    role: &str,
    scope: &Scope,
    password: String,
    now_ms: i64,
) -> Result<(), AccountError> {
    let username = checked_name(username)?;
    let role = Role::parse(role.trim()).ok_or_else(|| AccountError::BadRole(role.to_owned()))?;
    if role == Role::Admin && !scope.is_all() {
        return Err(AccountError::AdminScoped);
    }
    let hash = hash_off_thread(password).await?;
    let teams = scope.to_stored();
    store::accounts::create_user(
        store.db(),
        username,
        &hash,
        role.as_str(),
        teams.as_deref(),
        now_ms,
    )
    .await
    .map_err(|e| match e {
        StoreError::Conflict(_) => AccountError::Exists(username.to_owned()),
        e => AccountError::Store(e),
    })?;
    tracing::info!(username, role = role.as_str(), teams = %scope.describe(), "user added");
    Ok(())
}

/// What a user sees: their teams, or every team (admins always).
pub fn scope_of(user_role: &str, stored_teams: Option<&str>) -> Scope {
    if Role::parse(user_role) == Some(Role::Admin) {
        return Scope::all();
    }
    Scope::from_stored(stored_teams)
}

/// Scopes a viewer to teams, or to every team; open sessions see the change at their next
/// request. Admins see every team and cannot be scoped.
pub async fn set_teams(
    store: &dyn Store,
    username: &str,
    scope: &Scope,
) -> Result<(), AccountError> {
    let username = username.trim();
    let user = store::accounts::user_by_name(store.db(), username)
        .await?
        .ok_or_else(|| AccountError::NoSuchUser(username.to_owned()))?;
    if user.oidc_subject.is_some() {
        return Err(AccountError::FromProvider(user.username));
    }
    if user.role == Role::Admin.as_str() && !scope.is_all() {
        return Err(AccountError::AdminScoped);
    }
    let teams = scope.to_stored();
    if !store::accounts::set_teams(store.db(), user.id, teams.as_deref()).await? {
        return Err(AccountError::NoSuchUser(username.to_owned()));
    }
    tracing::info!(username = %user.username, teams = %scope.describe(), "user's teams set");
    Ok(())
}

/// A name of 1 to 64 plain characters: a name is shown and recorded as who did what, and must
/// not look like another (no spaces, no look-alike or direction-changing characters).
fn checked_name(username: &str) -> Result<&str, AccountError> {
    let username = username.trim();
    if username.is_empty()
        || username.chars().count() > 64
        || !username
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c))
    {
        return Err(AccountError::BadName(username.chars().take(80).collect()));
    }
    Ok(username)
}

/// Signs in a person the OpenID Connect provider vouched for, named by its `subject`
/// (`ISSUER#SUB`): added at their first sign-in (with no password of ours), and their role and
/// teams set from the provider's groups at every one, so a change of groups there takes effect
/// at the next sign-in. A local user of the same name is never taken over. Returns the new
/// session's secret.
pub async fn sign_in_from_provider(
    store: &dyn Store,
    subject: &str,
    username: &str,
    (role, scope): (Role, &Scope),
    now_ms: i64,
) -> Result<String, AccountError> {
    let username = checked_name(username)?;
    let teams = scope.to_stored();
    let mut tx = store.db().begin().await?;
    let user_id = match store::accounts::oidc_user(&mut tx, subject).await? {
        Some(user) => {
            store::accounts::set_role_and_teams(&mut tx, user.id, role.as_str(), teams.as_deref())
                .await?;
            user.id
        }
        None => store::accounts::create_oidc_user(
            &mut tx,
            username,
            subject,
            (role.as_str(), teams.as_deref()),
            now_ms,
        )
        .await
        .map_err(|e| match e {
            StoreError::Conflict(_) => AccountError::NameTaken(username.to_owned()),
            e => AccountError::Store(e),
        })?,
    };
    let token = open_session(&mut tx, user_id, now_ms).await?;
    tx.commit().await?;
    tracing::info!(username, role = role.as_str(), teams = %scope.describe(), "signed in through the provider");
    Ok(token)
}

/// The provider vouched for a person it no longer puts in any group that gives access (removed,
/// or moved): every session of theirs ends now, not when it expires. False for a stranger.
pub async fn end_provider_sessions(store: &dyn Store, subject: &str) -> Result<bool, StoreError> {
    let Some(user) = store::accounts::oidc_user(store.db(), subject).await? else {
        return Ok(false);
    };
    // Their hash stays one no password matches; only the sessions go.
    store::accounts::set_password_hash(store.db(), user.id, &user.password_hash, None).await?;
    tracing::warn!(username = %user.username, "in no group that gives access any more: sessions ended");
    Ok(true)
}

/// Everybody who signs in, by name.
pub async fn list_users(
    store: &dyn Store,
) -> Result<Vec<crate::store::accounts::UserRow>, StoreError> {
    store::accounts::list_users(store.db()).await
}

/// Removes a user, ends their sessions and revokes the read-only tokens they made (a departing
/// admin keeps no way in). The last admin cannot be removed: the admins' rows are locked first,
/// so two admins removing each other at once cannot leave none.
pub async fn remove_user(
    store: &dyn Store,
    username: &str,
    now_ms: i64,
) -> Result<(), AccountError> {
    let username = username.trim();
    let mut tx = store.db().begin().await?;
    store::accounts::lock_admins(&mut tx).await?;
    let user = store::accounts::user_by_name(&mut tx, username)
        .await?
        .ok_or_else(|| AccountError::NoSuchUser(username.to_owned()))?;
    if user.role == Role::Admin.as_str() && store::accounts::admin_count(&mut tx).await? <= 1 {
        return Err(AccountError::LastAdmin(user.username));
    }
    store::accounts::delete_user(&mut tx, user.id).await?;
    let revoked = store::read_tokens::revoke_made_by(&mut tx, &user.username, now_ms).await?;
    tx.commit().await?;
    tracing::info!(username = %user.username, revoked, "user removed, with their read-only tokens");
    Ok(())
}

/// Sets a user's password (an admin, or the command line) and ends every session of theirs.
pub async fn set_password(
    store: &dyn Store,
    username: &str,
    password: String,
) -> Result<(), AccountError> {
    let username = username.trim();
    let user = store::accounts::user_by_name(store.db(), username)
        .await?
        .ok_or_else(|| AccountError::NoSuchUser(username.to_owned()))?;
    if user.oidc_subject.is_some() {
        // A password of ours would let them in past the provider.
        return Err(AccountError::FromProvider(user.username));
    }
    let hash = hash_off_thread(password).await?;
    // The new hash and the end of every session, as one change.
    let mut tx = store.db().begin().await?;
    store::accounts::set_password_hash(&mut tx, user.id, &hash, None).await?;
    tx.commit().await?;
    tracing::info!(username = %user.username, "password set; sessions ended");
    Ok(())
}

/// A signed-in person changes their own password: the current one first, the new one twice.
/// Wrong guesses at the current one count as failed sign-ins (the same limits), so a stolen
/// session cannot be used to find the password. Every session of theirs ends, the one they
/// changed it from too (it may be the stolen one): returns the secret of a new session.
pub async fn change_own_password(
    store: &dyn Store,
    username: &str,
    (current, new, repeated): (String, String, String),
    now_ms: i64,
) -> Result<String, AccountError> {
    if new != repeated {
        return Err(AccountError::Mismatch);
    }
    if new.chars().count() < MIN_PASSWORD_LEN {
        return Err(AccountError::Password(PasswordError::TooShort));
    }
    let username_key: String = username.chars().take(MAX_USERNAME_KEY).collect();
    let (by_user, _) = store::accounts::sign_in_failures(
        store.db(),
        &username_key,
        PASSWORD_CHANGE_CLIENT,
        now_ms - FAILURE_WINDOW_MS,
    )
    .await?;
    if by_user >= MAX_FAILURES_PER_USER {
        return Err(AccountError::TooManyAttempts);
    }
    let user = store::accounts::user_by_name(store.db(), username)
        .await?
        .ok_or_else(|| AccountError::NoSuchUser(username.to_owned()))?;
    let old_hash = user.password_hash.clone();
    let ok = tokio::task::spawn_blocking(move || verify_password(&old_hash, &current))
        .await
        .unwrap_or(false);
    if !ok {
        tracing::warn!(username = %username_key, "wrong current password at a password change");
        store::accounts::record_sign_in_failure(
            store.db(),
            &username_key,
            PASSWORD_CHANGE_CLIENT,
            now_ms,
            now_ms - FAILURE_WINDOW_MS,
        )
        .await?;
        return Err(AccountError::WrongPassword);
    }
    let hash = hash_off_thread(new).await?;
    let mut tx = store.db().begin().await?;
    store::accounts::set_password_hash(&mut tx, user.id, &hash, None).await?;
    let token = open_session(&mut tx, user.id, now_ms).await?;
    tx.commit().await?;
    tracing::info!(username = %user.username, "password changed; sessions ended, a new one started");
    Ok(token)
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
