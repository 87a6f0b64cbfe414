//! Reading pages from a PostgreSQL read replica (`--read-database-url`), and how fresh that is.
//!
//! A poll each second asks the primary how far it has written its log and the replica how far
//! it has replayed it. The figures on the replica are as of the newest poll whose primary
//! position it has replayed: everything committed before that poll is there. That holds on an
//! idle primary too, where the time of the last replayed commit would call a current replica
//! old.
//!
//! A request reads from the replica only when it is a GET, the replica is a standby with this
//! build's schema, it is at most `max_lag` behind, and it has replayed whatever the same browser
//! last changed (the primary's position after the change, kept in a cookie, see
//! `http::reads`). Otherwise it reads from the primary: a replica that is down or far behind
//! costs the primary's load, never a wrong or failed page.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::{self, Store};

/// How often the replica's position is polled: how stale "as of" may be on an idle database.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How long a poll waits for each answer.
const POLL_WAIT: Duration = Duration::from_secs(2);

/// `query`'s answer, or an error once it has taken [`POLL_WAIT`].
async fn within<T>(
    query: impl std::future::Future<Output = Result<T, store::StoreError>>,
) -> Result<T, store::StoreError> {
    tokio::time::timeout(POLL_WAIT, query)
        .await
        .unwrap_or_else(|_| {
            Err(store::StoreError::Invalid(format!(
                "no answer within {} s",
                POLL_WAIT.as_secs()
            )))
        })
}

pub struct Replica {
    store: Arc<dyn Store>,
    primary: Arc<dyn Store>,
    max_lag_ms: i64,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// The primary's log position at each poll, oldest first, covering `max_lag`.
    primary: VecDeque<(i64, i64)>,
    /// What the last poll found, or why the replica cannot be read.
    replica: Option<Result<Position, String>>,
}

/// How far the replica has replayed, and since when everything the primary had is on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub replayed: i64,
    pub as_of_ms: i64,
}

/// Where a request reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    Primary,
    /// The replica, whose figures are as of this time.
    Replica {
        as_of_ms: i64,
    },
}

impl Replica {
    pub fn new(store: Arc<dyn Store>, primary: Arc<dyn Store>, max_lag: Duration) -> Self {
        Replica {
            store,
            primary,
            max_lag_ms: i64::try_from(max_lag.as_millis()).unwrap_or(i64::MAX),
            seen: Mutex::new(Seen::default()),
        }
    }

    /// How far behind the replica may be and still be read.
    pub fn max_lag(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.max_lag_ms).unwrap_or_default())
    }

    /// The replica's store (reads from it; what is kept from them goes to the primary).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Asks the primary and then the replica how far each is, at `now_ms`. The primary first:
    /// a replica that has replayed the primary's position has everything committed before it.
    /// Each answer is waited for at most [`POLL_WAIT`]: a replica that hangs is not read.
    pub async fn poll(&self, now_ms: i64) {
        let written = within(store::replica::wal_position(self.primary.db())).await;
        let standby = within(store::replica::standby_state(self.store.db())).await;
        let same_cluster = self.same_cluster().await;
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(Some(at)) = written {
            seen.primary.push_back((now_ms, at));
        }
        // Older polls than max_lag would only name a replica too far behind to read anyway.
        while seen
            .primary
            .front()
            .is_some_and(|&(t, _)| now_ms - t > self.max_lag_ms)
            && seen.primary.len() > 1
        {
            seen.primary.pop_front();
        }
        let position = match (written, standby) {
            (Err(e), _) => Err(format!("the primary's log position could not be read: {e}")),
            (Ok(None), _) => Err("the primary has no log to replicate".to_owned()),
            (_, Err(e)) => Err(format!("the replica did not answer: {e}")),
            (_, Ok(s)) if s.replayed.is_none() => {
                Err("the replica is not a standby (it replays no log)".to_owned())
            }
            _ if !same_cluster => {
                Err("the replica is a standby of another database cluster".to_owned())
            }
            (_, Ok(s)) if !s.schema_current() => Err(format!(
                "the replica's schema (migration {}) is older than this server's",
                s.schema
            )),
            (Ok(Some(_)), Ok(s)) => {
                let replayed = s.replayed.unwrap_or_default();
                seen.primary
                    .iter()
                    .rev()
                    .find(|&&(_, at)| at <= replayed)
                    .map(|&(t, _)| Position {
                        replayed,
                        as_of_ms: t,
                    })
                    .ok_or_else(|| {
                        format!(
                            "the replica is more than {} s behind the primary",
                            self.max_lag_ms / 1000
                        )
                    })
            }
        };
        Self::note(&mut seen, position);
    }

    /// Whether the replica is a standby of the primary's own cluster (a standby of staging's
    /// database, say, is not), where both say which they are.
    async fn same_cluster(&self) -> bool {
        let primary = within(store::replica::cluster_identity(self.primary.db())).await;
        let replica = within(store::replica::cluster_identity(self.store.db())).await;
        match (primary, replica) {
            (Ok(Some(p)), Ok(Some(r))) => p == r,
            _ => true,
        }
    }

    /// Takes the replica as current at `now_ms` without asking it (a test's replica that is
    /// down, to see a failed read fall back).
    #[cfg(test)]
    pub fn assume_current(&self, now_ms: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.replica = Some(Ok(Position {
            replayed: i64::MAX,
            as_of_ms: now_ms,
        }));
    }

    /// A read from the replica failed (it went down, or cancelled the statement): requests
    /// read the primary until the next poll finds it readable again.
    pub fn failed(&self, why: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        Self::note(
            &mut seen,
            Err(format!("a read from the replica failed: {why}")),
        );
    }

    fn note(seen: &mut Seen, position: Result<Position, String>) {
        if let Err(why) = &position {
            // Said once when it changes, not every second.
            if !matches!(&seen.replica, Some(Err(before)) if before == why) {
                tracing::warn!(reason = %why, "pages read from the primary");
            }
        } else if matches!(seen.replica, Some(Err(_))) {
            tracing::info!("pages read from the read replica again");
        }
        seen.replica = Some(position);
    }

    /// Where a GET reads from at `now_ms`, for a browser that last changed something when the
    /// primary's log was at `written` (none: it changed nothing lately).
    pub fn read_from(&self, written: Option<i64>, now_ms: i64) -> ReadFrom {
        match self.readable(now_ms) {
            Some(p) if written.is_none_or(|w| w <= p.replayed) => ReadFrom::Replica {
                as_of_ms: p.as_of_ms,
            },
            _ => ReadFrom::Primary,
        }
    }

    /// Where the replica was at the last poll, if it can be read at `now_ms`: a standby of
    /// this schema at most `max_lag` behind.
    fn readable(&self, now_ms: i64) -> Option<Position> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.replica {
            Some(Ok(p)) if now_ms - p.as_of_ms <= self.max_lag_ms => Some(p),
            _ => None,
        }
    }

    /// How far the primary has written its log now: what a change is followed by (see
    /// [`Replica::read_from`]'s `written`).
    pub async fn primary_position(&self) -> Result<Option<i64>, store::StoreError> {
        store::replica::wal_position(self.primary.db()).await
    }

    /// Its gauges in the Prometheus text format: whether pages can read it, and how far behind
    /// the primary its figures are now, from the last poll (absent while it cannot be read).
    pub fn exposition(&self, now_ms: i64) -> String {
        let lag = self
            .readable(now_ms)
            .map(|p| (now_ms - p.as_of_ms).max(0) as f64 / 1000.0);
        let mut text = String::from(
            "# HELP gpuledger_read_replica_up Whether pages read from the read replica (0: it is \
             down, far behind or not a current standby, and they read the primary)\n\
             # TYPE gpuledger_read_replica_up gauge\n",
        );
        text.push_str(&format!(
            "gpuledger_read_replica_up {}\n",
            u8::from(lag.is_some())
        ));
        if let Some(lag) = lag {
            text.push_str(
                "# HELP gpuledger_read_replica_lag_seconds How far behind the primary the read \
                 replica's figures were at its last poll\n\
                 # TYPE gpuledger_read_replica_lag_seconds gauge\n",
            );
            text.push_str(&format!("gpuledger_read_replica_lag_seconds {lag:.3}\n"));
        }
        text
    }
}

/// Polls the replica every [`POLL_INTERVAL`] for as long as the server runs.
pub fn spawn_poll(replica: Arc<Replica>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            replica.poll(crate::clock::now_ms()).await;
        }
    });
}
