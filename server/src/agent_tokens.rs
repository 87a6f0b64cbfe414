//! Managing agent tokens, for the CLI and the admin page alike: create one for a scope, list,
//! rotate with an overlap, revoke, and move a host to another token. Every check happens before
//! anything is written, so a refused request changes nothing.

use std::time::Duration;

use crate::auth::{self, TokenScope};
use crate::store;
use crate::store::tokens::NewToken;
use crate::store::tokens::TokenRow;
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum TokenAdminError {
    /// What the admin asked for cannot be done; the message says what to change.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn invalid(message: impl Into<String>) -> TokenAdminError {
    TokenAdminError::Invalid(message.into())
}

/// A token as the admin asks for it.
#[derive(Debug, Clone, Default)]
pub struct TokenRequest {
    pub name: String,
    pub cluster: String,
    pub hosts: Option<String>,
    /// How long it works; `None` until revoked.
    pub expires_in: Option<Duration>,
}

/// A new secret, shown only once.
#[derive(Debug)]
pub struct Issued {
    pub secret: String,
    pub token: TokenRow,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Every agent token, by name (never a secret).
pub async fn list(store: &dyn Store) -> Result<Vec<TokenRow>, StoreError> {
    store::tokens::list_tokens(store.db()).await
}

/// Creates a token for a scope. A host pattern that matches none of the hosts the scope's
/// clusters already have is refused: it is almost surely a typo, and the agents it was meant
/// for would all be refused.
pub async fn create(
    store: &dyn Store,
    request: &TokenRequest,
    now_ms: i64,
) -> Result<Issued, TokenAdminError> {
    let name = request.name.trim();
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(invalid(
            "a token needs a name of 1 to 128 characters without control characters",
        ));
    }
    let scope = TokenScope::parse(&request.cluster, request.hosts.as_deref()).map_err(invalid)?;
    if let Some(pattern) = request.hosts.as_deref() {
        let known: Vec<String> = store::telemetry::hosts(store.db())
            .await?
            .into_iter()
            .filter(|h| !h.from_bill && scope.permits_cluster(&h.cluster))
            .map(|h| h.hostname)
            .collect();
        if !known.is_empty() && !known.iter().any(|h| scope.permits_host(h)) {
            let some: Vec<&str> = known.iter().take(5).map(String::as_str).collect();
            return Err(invalid(format!(
                "the host pattern {pattern:?} matches none of the {} hosts cluster {:?} has \
                 (such as {}); check the pattern",
                known.len(),
                request.cluster,
                some.join(", ")
            )));
        }
    }
    if request.expires_in.is_some_and(|d| d.is_zero()) {
        return Err(invalid("a token that expires at once would never work"));
    }
    let secret = auth::generate_token();
    let hash = auth::hash_token(&secret);
    store::tokens::create_token(
        store.db(),
        &NewToken {
            name,
            hash: &hash,
            cluster: &request.cluster,
            host_pattern: request.hosts.as_deref(),
            expires_ms: request.expires_in.map(|d| now_ms.saturating_add(millis(d))),
        },
        now_ms,
    )
    .await
    .map_err(|e| match e {
        StoreError::Conflict(_) => invalid(format!("a token named {name:?} already exists")),
        e => e.into(),
    })?;
    let token = store::tokens::token_by_name(store.db(), name)
        .await?
        .ok_or_else(|| invalid(format!("token {name:?} was not stored")))?;
    Ok(Issued { secret, token })
}

/// Gives a token a new secret. The old one keeps working for `overlap`, so agents can be given
/// the new one without a gap. A token inside an earlier rotation's overlap is not rotated: its
/// previous secret would stop working at once, cutting off agents not yet given the new one.
pub async fn rotate(
    store: &dyn Store,
    name: &str,
    overlap: Duration,
    now_ms: i64,
) -> Result<Issued, TokenAdminError> {
    let secret = auth::generate_token();
    let until = now_ms.saturating_add(millis(overlap));
    if !store::tokens::rotate_token(store.db(), name, &auth::hash_token(&secret), until, now_ms)
        .await?
    {
        let token = store::tokens::token_by_name(store.db(), name).await?;
        let overlapping = token
            .filter(|t| t.is_active(now_ms))
            .and_then(|t| t.previous_expires_ms)
            .filter(|&until| until > now_ms);
        return Err(invalid(match overlapping {
            Some(until) => format!(
                "token {name:?} was rotated already and its previous secret works until {}; \
                 rotating again now would end that at once. Rotate again after then, or revoke \
                 the token and make a new one",
                crate::format::utc_minute(until)
            ),
            None => format!(
                "no active token named {name:?} (a revoked or expired token cannot be rotated)"
            ),
        }));
    }
    let token = store::tokens::token_by_name(store.db(), name)
        .await?
        .ok_or_else(|| invalid(format!("token {name:?} disappeared")))?;
    Ok(Issued { secret, token })
}

/// When each secret of a token just rotated stops working, in words.
pub fn rotation_text(token: &TokenRow) -> String {
    let when = |ms: Option<i64>| ms.map(crate::format::utc_minute);
    format!(
        "the previous secret works until {}; the new one {}",
        when(token.previous_expires_ms).unwrap_or_else(|| "now".into()),
        when(token.expires_ms).map_or("until the token is revoked".into(), |e| format!(
            "until the token expires at {e}"
        ))
    )
}

/// What becomes of the request counts and runs' progress a token sent when it is revoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentUsage {
    /// They stay in the figures (the token was retired, not stolen).
    Keep,
    /// They are deleted with it (the token sent what it should not have).
    Remove,
}

/// Ends a token at once. A token that sent request counts or runs' progress is revoked only
/// with a word on what becomes of them (`sent`): kept in the figures or removed; answers how
/// many counts and progress reports were removed.
pub async fn revoke(
    store: &dyn Store,
    name: &str,
    sent: Option<SentUsage>,
    now_ms: i64,
) -> Result<(u64, u64), TokenAdminError> {
    let token = store::tokens::token_by_name(store.db(), name)
        .await?
        .filter(|t| t.revoked_ms.is_none())
        .ok_or_else(|| invalid(format!("no active token named {name:?}")))?;
    if sent.is_none() {
        let sources = store::usage::posted_sources(store.db(), Some(token.id)).await?;
        if !sources.is_empty() {
            let names: Vec<&str> = sources.iter().map(|s| s.source.as_str()).collect();
            return Err(invalid(format!(
                "token {name:?} sent request counts or runs' progress from {} source(s) ({}); \
                 say what becomes of them when it goes: kept in the figures (--keep-usage) or \
                 removed (--remove-usage)",
                names.len(),
                names.join(", ")
            )));
        }
    }
    if !store::tokens::revoke_token(store.db(), name, now_ms).await? {
        return Err(invalid(format!("no active token named {name:?}")));
    }
    match sent {
        Some(SentUsage::Remove) => {
            Ok(store::usage::delete_posted(store.db(), None, Some(token.id)).await?)
        }
        _ => Ok((0, 0)),
    }
}

/// Moves a host (`CLUSTER/HOSTNAME`) to another token, which must be active and have the host
/// in its scope.
pub async fn rebind(
    store: &dyn Store,
    host: &str,
    token_name: &str,
    now_ms: i64,
) -> Result<(), TokenAdminError> {
    let Some((cluster, hostname)) = host.split_once('/') else {
        return Err(invalid(format!(
            "name the host as CLUSTER/HOSTNAME, not {host:?}"
        )));
    };
    let token = store::tokens::token_by_name(store.db(), token_name)
        .await?
        .ok_or_else(|| invalid(format!("no token named {token_name:?}")))?;
    if !token.is_active(now_ms) {
        return Err(invalid(format!(
            "token {token_name:?} is revoked or expired; a host can move only to an active token"
        )));
    }
    if let Some(scope) = TokenScope::of(&token).map_err(invalid)? {
        let host_info = gpuledger_proto::HostInfo {
            cluster: cluster.to_owned(),
            hostname: hostname.to_owned(),
            ..Default::default()
        };
        if let Err(refusal) = scope.check(&host_info) {
            return Err(invalid(format!(
                "token {token_name:?} may not report {host}: {}",
                refusal.message
            )));
        }
    }
    if !store::tokens::rebind_host(store.db(), cluster, hostname, token.id).await? {
        return Err(invalid(format!("no host {host} has reported yet")));
    }
    Ok(())
}

/// An owner a token may post request counts or runs' progress for, wherever it runs: an
/// endpoint (counts) or an experiment (progress).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundRole {
    Endpoint,
    Experiment,
}

impl BoundRole {
    pub fn role(self) -> gpuledger_core::owners::Role {
        match self {
            BoundRole::Endpoint => gpuledger_core::owners::Role::Endpoint,
            BoundRole::Experiment => gpuledger_core::owners::Role::Experiment,
        }
    }

    /// From a form's or the CLI's word (`endpoint`, `experiment`).
    pub fn parse(word: &str) -> Result<BoundRole, TokenAdminError> {
        match word.trim() {
            "endpoint" => Ok(BoundRole::Endpoint),
            "experiment" => Ok(BoundRole::Experiment),
            other => Err(invalid(format!(
                "a token is bound to an endpoint or an experiment, not {other:?}"
            ))),
        }
    }
}

/// Lets a token post counts (an endpoint) or progress (an experiment) for `value` although
/// no host it reports runs it: serving code on hosts without an agent, a run's coordinator.
/// Usage posts are otherwise held to the owners of the token's hosts.
pub async fn bind_owner(
    store: &dyn Store,
    token_name: &str,
    (role, value): (BoundRole, &str),
    now_ms: i64,
) -> Result<(), TokenAdminError> {
    let value = value.trim();
    if value.is_empty() || value.chars().count() > 128 || value.chars().any(char::is_control) {
        return Err(invalid(
            "an endpoint or experiment is named in 1 to 128 characters without control \
             characters",
        ));
    }
    let token = store::tokens::token_by_name(store.db(), token_name)
        .await?
        .filter(|t| t.is_active(now_ms))
        .ok_or_else(|| invalid(format!("no active token named {token_name:?}")))?;
    store::tokens::bind_owner(store.db(), token.id, (role.role().as_str(), value), now_ms).await?;
    Ok(())
}

/// Takes a binding back: the token's posts for `value` are held to its hosts' owners again.
pub async fn unbind_owner(
    store: &dyn Store,
    token_name: &str,
    (role, value): (BoundRole, &str),
) -> Result<(), TokenAdminError> {
    let value = value.trim();
    let token = store::tokens::token_by_name(store.db(), token_name)
        .await?
        .ok_or_else(|| invalid(format!("no token named {token_name:?}")))?;
    if !store::tokens::unbind_owner(store.db(), token.id, (role.role().as_str(), value)).await? {
        return Err(invalid(format!(
            "token {token_name:?} has no binding to {} {value:?}",
            role.role().as_str()
        )));
    }
    Ok(())
}

/// Every owner bound to a token, by token name.
pub async fn owner_bindings(
    store: &dyn Store,
) -> Result<Vec<store::tokens::OwnerBinding>, StoreError> {
    store::tokens::owner_bindings(store.db()).await
}

/// A token's state in words, for listings.
pub fn state(token: &TokenRow, now_ms: i64) -> &'static str {
    match (token.revoked_ms, token.expires_ms) {
        (Some(_), _) => "revoked",
        (None, Some(e)) if e <= now_ms => "expired",
        _ => "active",
    }
}

/// A token's scope in words, for listings.
pub fn scope_text(token: &TokenRow) -> String {
    match (&token.cluster, &token.host_pattern) {
        (None, _) => "clusters it reported before (made before scopes)".to_owned(),
        (Some(c), None) => format!("cluster {c}"),
        (Some(c), Some(h)) => format!("cluster {c}, hosts {h}"),
    }
}
