//! What sources posted to `POST /api/v1/usage` (request counts, runs' progress), per source and
//! the agent token that sent it: listed, and deleted where a source should not have sent it (a
//! wrong count leaves every cost per request wrong until it goes).

use crate::store::usage::PostedSource;
use crate::store::{self, Store, StoreError};

/// Why a source's usage could not be listed or deleted.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("no agent token named {0:?}")]
    NoSuchToken(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The id of the token named `name`; none asked for, none.
async fn token_id(store: &dyn Store, name: Option<&str>) -> Result<Option<i64>, UsageError> {
    let Some(name) = name else { return Ok(None) };
    let token = store::tokens::token_by_name(store.db(), name).await?;
    let token = token.ok_or_else(|| UsageError::NoSuchToken(name.to_owned()))?;
    Ok(Some(token.id))
}

/// Each source that posted, per token that sent it (only what `token` sent, if named).
pub async fn posted_sources(
    store: &dyn Store,
    token: Option<&str>,
) -> Result<Vec<PostedSource>, UsageError> {
    let id = token_id(store, token).await?;
    Ok(store::usage::posted_sources(store.db(), id).await?)
}

/// Deletes what `source` posted (only what `token` sent, if named): how many request counts and
/// progress reports went.
pub async fn delete_posted(
    store: &dyn Store,
    source: &str,
    token: Option<&str>,
) -> Result<(u64, u64), UsageError> {
    let id = token_id(store, token).await?;
    Ok(store::usage::delete_posted(store.db(), Some(source), id).await?)
}
