//! Agent tokens: random, shown once at creation, stored only as a SHA-256 hash, and scoped to
//! what they may report (a cluster, optionally a host-name pattern).
//!
//! A plain hash is right here (unlike passwords): tokens are 190 bits of randomness, so there is
//! nothing to brute-force, and a fast hash keeps per-request checks cheap.

use axum::http::HeaderMap;
use gpuledger_proto::HostInfo;
use rand::Rng;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::store;
use crate::store::tokens::Refusal;
use crate::store::tokens::RefusalKind;
use crate::store::tokens::TokenRow;
use crate::store::Store;

const PREFIX: &str = "gpl_";
const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

pub fn generate_token() -> String {
    generate_secret(PREFIX)
}

/// 32 random characters after `prefix`, which says what kind of secret it is.
pub fn generate_secret(prefix: &str) -> String {
    let mut rng = rand::rng();
    let body: String = (0..32)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("{prefix}{body}")
}

pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The active token presented in `Authorization: Bearer`, or 401.
pub async fn require_agent(
    store: &dyn Store,
    headers: &HeaderMap,
    now_ms: i64,
) -> Result<TokenRow, ApiError> {
    let token = bearer(headers).ok_or(ApiError::Unauthorized)?;
    store::tokens::active_token(store.db(), &hash_token(token), now_ms)
        .await?
        .ok_or(ApiError::Unauthorized)
}

/// What a token may report: clusters whose name matches `cluster` (a name, or a glob pattern
/// such as `train-*`), and of those the hosts whose name matches `hosts`, if given.
#[derive(Debug, Clone)]
pub struct TokenScope {
    cluster: glob::Pattern,
    hosts: Option<glob::Pattern>,
}

impl TokenScope {
    /// Checks a scope as an admin gives it; the error says what to change.
    pub fn parse(cluster: &str, hosts: Option<&str>) -> Result<TokenScope, String> {
        let cluster = pattern("cluster", cluster)?;
        let hosts = hosts.map(|h| pattern("host pattern", h)).transpose()?;
        Ok(TokenScope { cluster, hosts })
    }

    /// The scope of a stored token; `None` for a token made before scopes existed.
    pub fn of(token: &TokenRow) -> Result<Option<TokenScope>, String> {
        token
            .cluster
            .as_deref()
            .map(|c| TokenScope::parse(c, token.host_pattern.as_deref()))
            .transpose()
    }

    pub fn permits_cluster(&self, cluster: &str) -> bool {
        self.cluster.matches(cluster)
    }

    pub fn permits_host(&self, hostname: &str) -> bool {
        self.hosts.as_ref().is_none_or(|p| p.matches(hostname))
    }

    /// Whether a report from this host is in scope, naming the field that is not.
    pub fn check(&self, host: &HostInfo) -> Result<(), Refusal> {
        if !self.permits_cluster(&host.cluster) {
            return Err(Refusal {
                kind: RefusalKind::ClusterOutOfScope,
                field: "host.cluster".into(),
                message: format!(
                    "this token may report cluster {:?}, not {:?}",
                    self.cluster.as_str(),
                    host.cluster
                ),
            });
        }
        if !self.permits_host(&host.hostname) {
            return Err(Refusal {
                kind: RefusalKind::HostOutOfScope,
                field: "host.hostname".into(),
                message: format!(
                    "this token may report hosts matching {:?}, not {:?}",
                    self.hosts.as_ref().map(glob::Pattern::as_str).unwrap_or(""),
                    host.hostname
                ),
            });
        }
        Ok(())
    }
}

/// A name or glob pattern of a scope. A pattern that matches every name is refused: it would be
/// no scope at all.
fn pattern(what: &str, text: &str) -> Result<glob::Pattern, String> {
    if text.trim().is_empty() {
        return Err(format!("the {what} must not be empty"));
    }
    if text.trim() != text || text.chars().any(char::is_control) {
        return Err(format!(
            "the {what} {text:?} has surrounding spaces or control characters, which no name has"
        ));
    }
    let parsed = glob::Pattern::new(text)
        .map_err(|e| format!("the {what} {text:?} is not a valid pattern: {e}"))?;
    // Judged by what it matches, not how it is spelled: `?*`, `*?` and `*[!-]*` are `*` too.
    let matched = NAMES_NOBODY_GAVE
        .iter()
        .filter(|name| parsed.matches(name))
        .count();
    if matched * 2 > NAMES_NOBODY_GAVE.len() {
        return Err(format!(
            "the {what} {text:?} matches every name, or nearly ({matched} of {} names made up \
             at random); name a cluster or a pattern of some",
            NAMES_NOBODY_GAVE.len()
        ));
    }
    Ok(parsed)
}

/// Names no one gave, to try a scope's pattern on: 256 made of the characters names use, 1 to
/// 24 long, from a fixed seed so that a pattern is judged the same on every replica. A pattern
/// matching most of them is no scope.
static NAMES_NOBODY_GAVE: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-._ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        // xorshift64: enough to spread names over the characters; nothing secret here.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..256)
        .map(|_| {
            let len = 1 + (next() % 24) as usize;
            (0..len)
                .map(|_| CHARS[(next() % CHARS.len() as u64) as usize] as char)
                .collect()
        })
        .collect()
});

/// Whether a token may report this host: its scope, or for a token made before scopes existed,
/// the clusters it reported before (one that never reported takes the first cluster it reports).
pub async fn authorize_report(
    store: &dyn Store,
    token: &TokenRow,
    host: &HostInfo,
) -> Result<Result<(), Refusal>, ApiError> {
    match TokenScope::of(token) {
        Ok(Some(scope)) => Ok(scope.check(host)),
        Ok(None) => {
            let clusters = store::tokens::token_clusters(store.db(), token.id).await?;
            if clusters.contains(&host.cluster) {
                return Ok(Ok(()));
            }
            if clusters.is_empty()
                && store::tokens::adopt_token_cluster(store.db(), token.id, &host.cluster).await?
            {
                return Ok(Ok(()));
            }
            Ok(Err(Refusal {
                kind: RefusalKind::ClusterOutOfScope,
                field: "host.cluster".into(),
                message: format!(
                    "this token, made before tokens had scopes, may report the clusters it \
                     reported before ({}), not {:?}; make a token for that cluster with \
                     `token create --cluster`",
                    clusters.join(", "),
                    host.cluster
                ),
            }))
        }
        // A scope stored by an older version that this one cannot read: refuse rather than
        // guess.
        Err(e) => Ok(Err(Refusal {
            kind: RefusalKind::ClusterOutOfScope,
            field: "host.cluster".into(),
            message: format!("this token's scope cannot be read ({e}); an admin must replace it"),
        })),
    }
}

/// The report's first window overlapping one its GPU already stored on that host, as a
/// refusal (409): the overlap's energy and cost would count twice.
pub async fn window_overlap(
    store: &dyn Store,
    report: &gpuledger_proto::Report,
    token_id: i64,
    now_ms: i64,
) -> Result<Option<Refusal>, store::StoreError> {
    store::tokens::window_overlap(store.db(), report, token_id, now_ms).await
}

/// Last use is written at most once a minute per token: many hosts share one token, and a write
/// per report to one row would make them queue for it.
const TOUCH_EVERY_MS: i64 = 60_000;

/// Notes that `token` was used from `address` at `now_ms` (shown on the tokens page), unless
/// that was noted less than a minute ago.
pub async fn note_use(
    store: &dyn Store,
    token: &TokenRow,
    address: &str,
    now_ms: i64,
) -> Result<(), store::StoreError> {
    if token
        .last_used_ms
        .is_none_or(|t| now_ms - t >= TOUCH_EVERY_MS)
    {
        store::tokens::touch_token(store.db(), token.id, now_ms, Some(address)).await?;
    }
    Ok(())
}

/// Counts a refused report per token, host and reason, for the fleet page.
pub async fn record_refusal(
    store: &dyn Store,
    token_id: i64,
    cluster: &str,
    hostname: &str,
    refusal: &Refusal,
    now_ms: i64,
) -> Result<(), store::StoreError> {
    store::tokens::record_refusal(store.db(), token_id, cluster, hostname, refusal, now_ms).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_hashes_stable() {
        let a = generate_token();
        let b = generate_token();
        assert_ne!(a, b);
        assert!(a.starts_with(PREFIX) && a.len() == PREFIX.len() + 32);
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_ne!(hash_token(&a), hash_token(&b));
        assert_eq!(hash_token(&a).len(), 64);
    }

    fn host(cluster: &str, hostname: &str) -> HostInfo {
        HostInfo {
            hostname: hostname.into(),
            cluster: cluster.into(),
            ..HostInfo::default()
        }
    }

    #[test]
    fn a_scope_names_the_field_a_report_breaks() {
        let scope = TokenScope::parse("train", Some("gpu-node-*")).unwrap();
        assert_eq!(scope.check(&host("train", "gpu-node-7")), Ok(()));
        let wrong_cluster = scope.check(&host("infer", "gpu-node-7")).unwrap_err();
        assert_eq!(wrong_cluster.kind, RefusalKind::ClusterOutOfScope);
        assert_eq!(wrong_cluster.field, "host.cluster");
        let wrong_host = scope.check(&host("train", "login-1")).unwrap_err();
        assert_eq!(wrong_host.kind, RefusalKind::HostOutOfScope);
        assert_eq!(wrong_host.field, "host.hostname");
        assert!(
            wrong_host.message.contains("gpu-node-*"),
            "{}",
            wrong_host.message
        );

        let clusters = TokenScope::parse("train-*", None).unwrap();
        assert!(clusters.permits_cluster("train-a") && !clusters.permits_cluster("infer"));
        assert!(clusters.permits_host("anything"));
    }

    #[test]
    fn scopes_that_are_no_scope_are_refused() {
        for (cluster, hosts, says) in [
            ("", None, "must not be empty"),
            ("*", None, "matches every name"),
            ("train", Some("**"), "matches every name"),
            ("train", Some(" gpu-*"), "surrounding spaces"),
            ("train", Some("gpu-[1-"), "not a valid pattern"),
        ] {
            let err = TokenScope::parse(cluster, hosts).unwrap_err();
            assert!(err.contains(says), "{cluster:?} {hosts:?}: {err}");
        }
    }

    /// Every pattern that matches every one of many names is refused, however it is spelled;
    /// patterns that pick some names out are kept. The names here are not the guard's own.
    #[test]
    fn a_pattern_that_matches_every_name_is_refused_by_what_it_matches() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(56);
        let alphabet: Vec<char> = "abcdefghijklmnopqrstuvwxyz0123456789-._ABCXYZ"
            .chars()
            .collect();
        let names: Vec<String> = (0..5_000)
            .map(|_| {
                let len = rng.random_range(1..=40);
                (0..len)
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect()
            })
            .chain(["-", "a", "0", "train-east", "gpu-node-17"].map(String::from))
            .collect();
        let every = [
            "*", "**", "?*", "*?", "*?*", "*?*?", "*[!-]*", "*[!-]", "[!-]*", "*[!@]*", "*[!a]*",
            "?*?*", "[!.]*", "*[!~]", "[!~]*",
        ];
        let some = [
            "train",
            "train-*",
            "*-east",
            "gpu-node-?",
            "gpu-node-[0-9]*",
            "*gpu*",
            "[a-c]*",
            "infer-?",
        ];
        for text in every.iter().chain(&some) {
            let matches_all = glob::Pattern::new(text)
                .map(|p| {
                    names
                        .iter()
                        .filter(|n| !n.contains('~'))
                        .all(|n| p.matches(n))
                })
                .unwrap_or(false);
            let refused = TokenScope::parse(text, None).is_err();
            let hosts_refused = TokenScope::parse("train", Some(text)).is_err();
            if matches_all {
                assert!(
                    refused && hosts_refused,
                    "{text:?} matches every name and was kept"
                );
            }
        }
        for text in every {
            let err = TokenScope::parse(text, None).unwrap_err();
            assert!(err.contains("matches every name"), "{text}: {err}");
        }
        for text in some {
            assert!(TokenScope::parse(text, None).is_ok(), "{text}");
            assert!(TokenScope::parse("train", Some(text)).is_ok(), "{text}");
        }
    }

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert("authorization", "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert("authorization", "bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }
}
