//! Read-only API tokens for BI tools (`gpr_…`): what a viewer may read, by `GET` with
//! `Authorization: Bearer`, and nothing else: no form, no write, no ingest. Shown once when made,
//! stored as a SHA-256 hash (like agent tokens: 190 random bits leave nothing to brute-force);
//! revoked, they stop working at once on every replica.

use crate::auth::{generate_secret, hash_token};
use crate::store::read_tokens::ReadTokenRow;
use crate::store::{Store, StoreError};
use gpuledger_core::scope::Scope;

/// What a read-only token's secret starts with (agent tokens start `gpl_`).
pub const PREFIX: &str = "gpr_";

#[derive(Debug, thiserror::Error)]
pub enum ReadTokenError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Makes a token named `name` (1 to 64 characters, no control characters) for `by_user`, that
/// reads what `scope` sees; returns its secret, which is never stored.
pub async fn create(
    store: &dyn Store,
    name: &str,
    scope: &Scope,
    by_user: &str,
    now_ms: i64,
) -> Result<String, ReadTokenError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
        return Err(ReadTokenError::Invalid(format!(
            "{:?} is not a token name: 1 to 64 characters",
            name.chars().take(80).collect::<String>()
        )));
    }
    let secret = generate_secret(PREFIX);
    let teams = scope.to_stored();
    crate::store::read_tokens::create(
        store.db(),
        name,
        &hash_token(&secret),
        teams.as_deref(),
        by_user,
        now_ms,
    )
    .await
    .map_err(|e| match e {
        StoreError::Conflict(_) => {
            ReadTokenError::Invalid(format!("there is a token {name:?} already"))
        }
        e => ReadTokenError::Store(e),
    })?;
    tracing::info!(name, by = by_user, teams = %scope.describe(), "read-only token made");
    Ok(secret)
}

/// Revokes the token named `name`; false where there is none still active.
pub async fn revoke(store: &dyn Store, name: &str, now_ms: i64) -> Result<bool, StoreError> {
    let done = crate::store::read_tokens::revoke(store.db(), name.trim(), now_ms).await?;
    if done {
        tracing::info!(name = name.trim(), "read-only token revoked");
    }
    Ok(done)
}

pub async fn list(store: &dyn Store) -> Result<Vec<ReadTokenRow>, StoreError> {
    crate::store::read_tokens::list(store.db()).await
}

/// The active token a request's secret names, its use recorded; `None` for anything else
/// (another kind of secret, an unknown or revoked token).
pub async fn authenticate(
    store: &dyn Store,
    secret: &str,
    now_ms: i64,
) -> Result<Option<ReadTokenRow>, StoreError> {
    if !secret.starts_with(PREFIX) {
        return Ok(None);
    }
    let token = crate::store::read_tokens::active(store.db(), &hash_token(secret)).await?;
    // Its use is recorded at most once a minute: a write waits its turn (SQLite has one
    // writer), and a BI refresh makes many reads.
    if let Some(t) = token
        .as_ref()
        .filter(|t| t.last_used_ms.is_none_or(|u| now_ms - u >= 60_000))
    {
        // Knowing when a token was last used matters less than answering the read.
        if let Err(e) = crate::store::read_tokens::touch(store.db(), t.id, now_ms).await {
            tracing::warn!(error = %e, "recording a read-only token's use");
        }
    }
    Ok(token)
}

/// What a token reads: its teams, or every team.
pub fn scope_of(token: &ReadTokenRow) -> Scope {
    Scope::from_stored(token.teams.as_deref())
}
