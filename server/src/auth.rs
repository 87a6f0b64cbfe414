//! Agent tokens: random, shown once at creation, stored only as a SHA-256 hash.
//!
//! A plain hash is right here (unlike passwords): tokens are 190 bits of randomness, so there is
//! nothing to brute-force, and a fast hash keeps per-request checks cheap.

use axum::http::HeaderMap;
use rand::Rng;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::store::{Store, TokenRow};

const PREFIX: &str = "gpl_";
const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

pub fn generate_token() -> String {
    let mut rng = rand::rng();
    let body: String = (0..32)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("{PREFIX}{body}")
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
pub async fn require_agent(store: &dyn Store, headers: &HeaderMap) -> Result<TokenRow, ApiError> {
    let token = bearer(headers).ok_or(ApiError::Unauthorized)?;
    store
        .active_token(&hash_token(token))
        .await?
        .ok_or(ApiError::Unauthorized)
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
