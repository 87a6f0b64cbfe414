//! Sending spooled batches to the server, oldest first, until each is acknowledged.
//!
//! Connection errors, timeouts, 429 and 5xx are retried with capped exponential backoff and full
//! jitter (honouring `Retry-After`). So are 401 and 403: they refuse the token (revoked, expired,
//! or not allowed this host), not the batch, and the same batch is taken once an admin gives the
//! agent a token or moves the host, so the batches wait in the spool (logged as errors) rather
//! than be set aside. Any other 4xx means the server will never take the batch, so it goes to
//! the dead-letter folder with a log line. The server is idempotent on batch id, so resending
//! after a lost acknowledgement is safe.

use std::time::Duration;

use gpuledger_proto::{REPORTS_PATH, SPOOL_DEPTH_HEADER, SPOOL_DROPPED_HEADER};
use rand::Rng;
use reqwest::StatusCode;
use tokio::sync::{watch, Notify};

use crate::spool::{Entry, Spool};

#[derive(Clone)]
pub struct DeliveryConfig {
    pub server: String,
    pub token: String,
    pub request_timeout: Duration,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

// The token is a secret: never in logs or panics.
impl std::fmt::Debug for DeliveryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryConfig")
            .field("server", &self.server)
            .field("token", &"<redacted>")
            .field("request_timeout", &self.request_timeout)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .finish()
    }
}

/// What to do with a batch after one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Acknowledged,
    /// Try again later; `Some` when the server said when.
    Retry(Option<Duration>),
    /// The server will never accept it.
    Reject(String),
}

/// Classifies an HTTP status (`None` for a connection error or timeout).
pub fn classify(status: Option<StatusCode>, retry_after: Option<Duration>) -> Outcome {
    match status {
        None => Outcome::Retry(None),
        Some(s) if s.is_success() => Outcome::Acknowledged,
        Some(StatusCode::TOO_MANY_REQUESTS) => Outcome::Retry(retry_after),
        Some(s) if s.is_server_error() => Outcome::Retry(retry_after),
        // 408 is the server giving up on a slow upload: the batch itself is fine.
        Some(StatusCode::REQUEST_TIMEOUT) => Outcome::Retry(None),
        // Who sends is refused, not what: an admin's fix makes the same batch acceptable.
        Some(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => Outcome::Retry(None),
        Some(s) => Outcome::Reject(format!("server answered {s}")),
    }
}

/// Full-jitter backoff: uniform in `[0, min(max, initial * 2^attempt)]`, but never shorter than
/// what the server asked for.
pub fn backoff(
    attempt: u32,
    initial: Duration,
    max: Duration,
    asked: Option<Duration>,
    rng: &mut impl Rng,
) -> Duration {
    let ceiling = initial
        .saturating_mul(2u32.saturating_pow(attempt.min(20)))
        .min(max);
    let jittered = Duration::from_secs_f64(rng.random::<f64>() * ceiling.as_secs_f64());
    match asked {
        Some(a) => jittered.max(a.min(max)),
        None => jittered,
    }
}

pub struct Deliverer {
    client: reqwest::Client,
    config: DeliveryConfig,
    spool: Spool,
}

impl Deliverer {
    pub fn new(config: DeliveryConfig, spool: Spool) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .user_agent(concat!("gpuledger-agent/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Deliverer {
            client,
            config,
            spool,
        })
    }

    /// One attempt at one batch.
    pub async fn attempt(&self, entry: &Entry) -> Outcome {
        let body = match self.spool.read(entry) {
            Ok(b) => b,
            Err(e) => return Outcome::Reject(format!("unreadable spool file: {e}")),
        };
        let url = format!(
            "{}{}",
            self.config.server.trim_end_matches('/'),
            REPORTS_PATH
        );
        let sent = self
            .client
            .post(url)
            .bearer_auth(&self.config.token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SPOOL_DEPTH_HEADER, self.spool.depth().to_string())
            .header(SPOOL_DROPPED_HEADER, self.spool.dropped().to_string())
            .body(body)
            .send()
            .await;
        match sent {
            Err(e) => {
                tracing::debug!(error = %e, "server not reachable");
                classify(None, None)
            }
            Ok(resp) => {
                let retry_after = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let status = resp.status();
                let outcome = classify(Some(status), retry_after);
                if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
                    let text = resp.text().await.unwrap_or_default();
                    tracing::error!(
                        %status,
                        answer = %text,
                        depth = self.spool.depth(),
                        "the server refuses this agent's token for this host; batches wait in \
                         the spool until an admin fixes the token or moves the host"
                    );
                    return outcome;
                }
                if let Outcome::Reject(_) = outcome {
                    let text = resp.text().await.unwrap_or_default();
                    return Outcome::Reject(format!("server answered {status}: {text}"));
                }
                outcome
            }
        }
    }

    /// Sends until `shutdown` turns true, waking on `wake` when a new batch is spooled.
    pub async fn run(self, wake: std::sync::Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
        let mut attempt: u32 = 0;
        loop {
            if *shutdown.borrow() {
                return;
            }
            let Some(entry) = self.spool.entries().into_iter().next() else {
                attempt = 0;
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = shutdown.changed() => {}
                    // Also look again now and then, in case a wake-up was missed.
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
                continue;
            };
            match self.attempt(&entry).await {
                Outcome::Acknowledged => {
                    attempt = 0;
                    if let Err(e) = self.spool.ack(&entry) {
                        tracing::error!(error = %e, "could not remove an acknowledged batch");
                    }
                }
                Outcome::Reject(why) => {
                    attempt = 0;
                    match self.spool.dead_letter(&entry) {
                        Ok(to) => {
                            tracing::error!(batch = %to.display(), reason = %why, "batch refused by the server; moved to dead-letter")
                        }
                        Err(e) => {
                            tracing::error!(error = %e, reason = %why, "batch refused and could not be moved; removing it");
                            let _ = self.spool.ack(&entry);
                        }
                    }
                }
                Outcome::Retry(asked) => {
                    let wait = backoff(
                        attempt,
                        self.config.initial_backoff,
                        self.config.max_backoff,
                        asked,
                        &mut rand::rng(),
                    );
                    attempt = attempt.saturating_add(1);
                    tracing::info!(
                        attempt,
                        wait_ms = wait.as_millis() as u64,
                        depth = self.spool.depth(),
                        "delivery failed; will retry"
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.changed() => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn debug_never_shows_the_token() {
        let c = DeliveryConfig {
            server: "http://s".into(),
            token: "gpl_secret".into(),
            request_timeout: Duration::from_secs(1),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(1),
        };
        assert!(!format!("{c:?}").contains("gpl_secret"));
    }

    #[test]
    fn classification_follows_status_classes() {
        assert_eq!(classify(None, None), Outcome::Retry(None));
        assert_eq!(classify(Some(StatusCode::OK), None), Outcome::Acknowledged);
        assert_eq!(
            classify(
                Some(StatusCode::TOO_MANY_REQUESTS),
                Some(Duration::from_secs(3))
            ),
            Outcome::Retry(Some(Duration::from_secs(3)))
        );
        assert_eq!(
            classify(Some(StatusCode::SERVICE_UNAVAILABLE), None),
            Outcome::Retry(None)
        );
        assert!(matches!(
            classify(Some(StatusCode::UNPROCESSABLE_ENTITY), None),
            Outcome::Reject(_)
        ));
        for who in [StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN] {
            assert_eq!(classify(Some(who), None), Outcome::Retry(None), "{who}");
        }
        assert!(matches!(
            classify(Some(StatusCode::CONFLICT), None),
            Outcome::Reject(_)
        ));
    }

    #[test]
    fn backoff_is_capped_jittered_and_respects_retry_after() {
        let mut rng = StdRng::seed_from_u64(7);
        let initial = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        let mut seen_distinct = std::collections::HashSet::new();
        for attempt in 0..30 {
            let d = backoff(attempt, initial, max, None, &mut rng);
            let ceiling = (initial * 2u32.pow(attempt.min(20))).min(max);
            assert!(d <= ceiling, "attempt {attempt}: {d:?} > {ceiling:?}");
            seen_distinct.insert(d.as_micros());
        }
        assert!(seen_distinct.len() > 20, "jitter should spread the waits");
        let asked = backoff(0, initial, max, Some(Duration::from_secs(1)), &mut rng);
        assert!(asked >= Duration::from_secs(1));
        let asked_too_long = backoff(0, initial, max, Some(Duration::from_secs(600)), &mut rng);
        assert!(asked_too_long <= max);
    }
}
