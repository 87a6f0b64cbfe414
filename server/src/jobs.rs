//! Periodic jobs inside `serve`. Several replicas may share one PostgreSQL database, so each run
//! first takes the job's lease in the database: one replica runs it, the others skip.

use std::sync::Arc;
use std::time::Duration;

use chrono::{Datelike, Duration as ChronoDuration, NaiveDate};

use crate::billing::aws::{self, CostExplorer, SyncSummary};
use crate::store;
use crate::store::{Store, StoreError};

pub const AWS_SYNC_JOB: &str = "aws-cost-explorer-daily";
use gpuledger_core::time::DAY_MS;
/// Long enough for a sync to finish; a replica that dies mid-run frees the job after this.
const LEASE_MS: i64 = 3_600_000;

/// A name for this replica in lease rows: host, process and a random part.
pub fn holder_name() -> String {
    format!("{}{:08x}", process_holder_prefix(), rand::random::<u32>())
}

/// How every lease holder of this process begins: host and process.
pub fn process_holder_prefix() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "server".into());
    format!("{host}:{}:", std::process::id())
}

fn today(now_ms: i64) -> NaiveDate {
    chrono::DateTime::from_timestamp_millis(now_ms)
        .map(|d| d.date_naive())
        .unwrap_or_default()
}

/// What the daily sync covers: the month so far and at least the per-resource window.
pub fn daily_range(now_ms: i64) -> (NaiveDate, NaiveDate) {
    let today = today(now_ms);
    let month_start = today.with_day(1).unwrap_or(today);
    let from = month_start.min(today - ChronoDuration::days(aws::RESOURCE_DAYS));
    (from, today + ChronoDuration::days(1))
}

/// Runs the daily sync if it is due and this replica gets the lease. `None` when skipped.
pub async fn aws_sync_if_due(
    store: &dyn Store,
    ce: &CostExplorer,
    holder: &str,
    now_ms: i64,
) -> Result<Option<SyncSummary>, aws::SyncError> {
    if store::jobs::job_last_run(store.db(), AWS_SYNC_JOB)
        .await?
        .is_some_and(|last| now_ms - last < DAY_MS)
    {
        return Ok(None);
    }
    if !store::jobs::try_lease(store.db(), AWS_SYNC_JOB, holder, now_ms, LEASE_MS).await? {
        return Ok(None);
    }
    let (from, to) = daily_range(now_ms);
    let result = aws::sync(
        store,
        ce,
        (from, to),
        today(now_ms),
        now_ms,
        false,
        &crate::progress::Silent,
    )
    .await;
    // Finished or failed, give the lease up; a failure retries at the next check.
    if result.is_ok() {
        store::jobs::finish_lease(store.db(), AWS_SYNC_JOB, holder, crate::clock::now_ms()).await?;
    } else {
        store::jobs::try_lease(store.db(), AWS_SYNC_JOB, holder, now_ms, 0).await?;
    }
    result.map(Some)
}

/// Checks every `every` whether the daily sync is due, for as long as the server runs.
pub fn spawn_aws_sync(
    store: Arc<dyn Store>,
    ce: CostExplorer,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let holder = holder_name();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            match aws_sync_if_due(store.as_ref(), &ce, &holder, crate::clock::now_ms()).await {
                Ok(Some(s)) => tracing::info!(
                    fetched_days = s.fetched_days,
                    skipped_days = s.skipped_days,
                    rows = s.import.map(|i| i.rows).unwrap_or(0),
                    "Cost Explorer sync done"
                ),
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "Cost Explorer sync failed; will retry"),
            }
        }
    })
}

pub const IDLE_JOB: &str = "idle-evaluation";
pub const SLACK_JOB: &str = "slack-sender";
pub const BUDGET_JOB: &str = "budget-alerts";
pub const ANOMALY_JOB: &str = "anomaly-alerts";

/// Evaluates idle incidents every minute, budget thresholds and spend anomalies every five
/// minutes, and drains the Slack outbox every few seconds, each under its own lease so that with
/// several replicas one does each.
pub fn spawn_waste_jobs(
    store: Arc<dyn Store>,
    card: Arc<gpuledger_core::ratecard::RateCard>,
    config: Arc<crate::config::Config>,
) {
    let holder = holder_name();
    {
        let (store, config, holder) = (store.clone(), config.clone(), holder.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                let now = crate::clock::now_ms();
                match store::jobs::try_lease(store.db(), IDLE_JOB, &holder, now, 120_000).await {
                    Ok(true) => {
                        match crate::incidents::evaluate(store.as_ref(), &card, &config, now).await
                        {
                            Ok(s) if s.opened + s.resolved + s.reminders > 0 => {
                                tracing::info!(
                                    opened = s.opened,
                                    resolved = s.resolved,
                                    reminders = s.reminders,
                                    open = s.open,
                                    "idle incidents"
                                )
                            }
                            Ok(_) => {}
                            Err(e) => tracing::error!(error = %e, "idle evaluation failed"),
                        }
                    }
                    Ok(false) => {}
                    Err(e) => tracing::error!(error = %e, "idle evaluation: lease"),
                }
            }
        });
    }
    // Budgets move with the ledger, which the roll-up refreshes every few minutes.
    announce_every_five_minutes(
        (store.clone(), config.clone(), holder.clone()),
        BUDGET_JOB,
        |store, config, now| async move { crate::budgets::alert(store.as_ref(), &config, now).await },
    );
    announce_every_five_minutes(
        (store.clone(), config.clone(), holder.clone()),
        ANOMALY_JOB,
        |store, config, now| async move { crate::anomalies::alert(store.as_ref(), &config, now).await },
    );
    tokio::spawn(async move {
        let client = crate::slack::client();
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            let now = crate::clock::now_ms();
            match store::jobs::try_lease(store.db(), SLACK_JOB, &holder, now, 60_000).await {
                Ok(true) => {
                    if let Err(e) =
                        crate::slack::deliver_due(store.as_ref(), &config, &client, now).await
                    {
                        tracing::error!(error = %e, "Slack delivery failed");
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "Slack delivery: lease"),
            }
        }
    });
}

pub const ROLLUP_JOB: &str = "rollup";
/// The lease of the job that refreshes the review's heaviest sections of the months still open.
pub const SECTIONS_JOB: &str = "review-sections";
pub const RETENTION_JOB: &str = "raw-retention";

/// Rolls up marked hours of the months still open every `every`, and once an hour makes
/// PostgreSQL's history partitions ahead and deletes raw windows past `retention_ms` (of closed
/// months only), each under its own lease so that with several replicas one does each.
pub fn spawn_rollup_jobs(
    store: Arc<dyn Store>,
    card: Arc<gpuledger_core::ratecard::RateCard>,
    every: Duration,
    retention_ms: i64,
    close: crate::closing::ClosePolicy,
    config: Arc<crate::config::Config>,
) {
    let holder = holder_name();
    let rules = config.attribution_rules();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        let mut last_retention: Option<i64> = None;
        loop {
            tick.tick().await;
            let now = crate::clock::now_ms();
            roll_up_and_refresh(
                store.as_ref(),
                &card,
                &rules,
                &config.owners,
                &close,
                &holder,
            )
            .await;
            if last_retention.is_some_and(|last| now - last < 3_600_000) {
                continue;
            }
            last_retention = Some(now);
            match store::jobs::try_lease(store.db(), RETENTION_JOB, &holder, now, 30 * 60_000).await
            {
                Ok(true) => {
                    make_history_partitions(
                        store.as_ref(),
                        now,
                        retention_ms,
                        store::partitions::Waiting::Move,
                    )
                    .await;
                    let open_from = open_from(store.as_ref(), &close, now).await;
                    match crate::rollup::enforce_retention(
                        store.as_ref(),
                        now,
                        retention_ms,
                        open_from,
                    )
                    .await
                    {
                        Ok(n) if n > 0 => {
                            tracing::info!(rows = n, "raw windows past retention deleted")
                        }
                        Ok(_) => {}
                        Err(e) => tracing::error!(error = %e, "retention failed; will retry"),
                    }
                    match crate::sections::prune(store.as_ref(), now).await {
                        Ok(n) if n > 0 => tracing::info!(rows = n, "old kept sections deleted"),
                        Ok(_) => {}
                        Err(e) => tracing::error!(error = %e, "pruning kept sections failed"),
                    }
                    if let Err(e) =
                        store::jobs::finish_lease(store.db(), RETENTION_JOB, &holder, now).await
                    {
                        tracing::error!(error = %e, "retention: lease");
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "retention: lease"),
            }
        }
    });
}

/// The start of the oldest month still open at `now`, with the sign-offs in the database.
async fn open_from(store: &dyn Store, close: &crate::closing::ClosePolicy, now: i64) -> i64 {
    match close.current(store).await {
        Ok(c) => c.open_from(now),
        // Without the sign-offs the policy alone is the safe side: it keeps more open, never
        // less.
        Err(e) => {
            tracing::warn!(error = %e, "reading month sign-offs");
            close.open_from(now)
        }
    }
}

/// One tick of the roll-up job, as every replica runs it each minute: the marked hours of the
/// months still open rolled up and closed months' first bills attributed (under the roll-up's
/// lease), then the recommendations and the review's kept sections refreshed where their
/// period is up (each under its own lease).
pub async fn roll_up_and_refresh(
    store: &dyn Store,
    card: &gpuledger_core::ratecard::RateCard,
    rules: &gpuledger_core::attribution::Rules,
    owners: &gpuledger_core::owners::OwnerSchema,
    close: &crate::closing::ClosePolicy,
    holder: &str,
) {
    let now = crate::clock::now_ms();
    match store::jobs::try_lease(store.db(), ROLLUP_JOB, holder, now, 10 * 60_000).await {
        Ok(true) => {
            // A bounded slice per tick: a month of re-marked hours catches up over a
            // few ticks instead of holding the lease for long.
            let open_from = open_from(store, close, now).await;
            match crate::rollup::run_open_months(store, card, rules, 24 * 7, open_from).await {
                Ok(s) if s.hours > 0 => {
                    tracing::debug!(hours = s.hours, rows = s.rows, "rolled up")
                }
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "roll-up failed; will retry"),
            }
            match crate::rollup::attribute_new_closed_months(store, card, rules, open_from, now)
                .await
            {
                Ok(months) => {
                    for m in months {
                        tracing::info!(
                            month = %gpuledger_core::time::month_label(m.month_ms),
                            "a closed month's late bill attributed for the first time"
                        );
                    }
                }
                Err(e) => tracing::error!(error = %e, "roll-up of late bills failed"),
            }
            if let Err(e) = store::jobs::finish_lease(store.db(), ROLLUP_JOB, holder, now).await {
                tracing::error!(error = %e, "roll-up: lease");
            }
        }
        Ok(false) => {}
        Err(e) => tracing::error!(error = %e, "roll-up: lease"),
    }
    // Each tick asks; the lease says whether the period is up on any replica, so the
    // refreshes run once per period whatever the number of replicas.
    refresh_recommendations(store, card, owners, holder).await;
    refresh_review_sections(store, owners, close, holder).await;
}

/// Makes PostgreSQL's history partitions of the coming days and months before their rows arrive
/// (store::partitions): `serve` before taking reports, leaving rows that wait in a default
/// partition, then the retention job once an hour, moving those in. A failure is logged: rows
/// still land in the default partition, and the next run tries again.
pub async fn make_history_partitions(
    store: &dyn Store,
    now: i64,
    retention_ms: i64,
    waiting: store::partitions::Waiting,
) {
    match store::partitions::make_ahead(store.db(), now, now - retention_ms, waiting).await {
        Ok(work) => {
            if !work.partitions.is_empty() {
                tracing::info!(partitions = ?work.partitions, rows_moved = work.rows_moved, "history partitions made");
            }
            if !work.left_for_later.is_empty() {
                tracing::warn!(partitions = ?work.left_for_later, "history partitions not made: a lock was not had in time, or another replica made them; the next run tries again");
            }
        }
        Err(e) => tracing::error!(error = %e, "making history partitions failed; will retry"),
    }
}

/// What `serve` does before its first report: the history partitions of the coming days made,
/// rows waiting in the default partition left to the hourly job.
pub async fn make_history_partitions_before_serving(
    store: &dyn Store,
    now: i64,
    retention_ms: i64,
) {
    make_history_partitions(store, now, retention_ms, store::partitions::Waiting::Leave).await
}

/// Gives up the leases of every job this process holds (on shutdown), so another replica takes
/// each at its next tick rather than when the lease expires: how many there were.
pub async fn release_this_process_leases(store: &dyn Store, now: i64) -> Result<u64, StoreError> {
    store::jobs::release_leases_of(store.db(), &process_holder_prefix(), now).await
}

/// Takes `job`'s lease for `holder` for `lease_ms`, waiting while another holds it (a running
/// server's roll-up, say) for up to `patience`: whether it was had.
pub async fn wait_for_lease(
    store: &dyn Store,
    (job, holder): (&str, &str),
    lease_ms: i64,
    patience: Duration,
) -> Result<bool, StoreError> {
    let deadline = std::time::Instant::now() + patience;
    loop {
        if store::jobs::try_lease(store.db(), job, holder, crate::clock::now_ms(), lease_ms).await?
        {
            return Ok(true);
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Gives `job`'s lease up, its work done.
pub async fn finish_lease(store: &dyn Store, job: &str, holder: &str) -> Result<(), StoreError> {
    store::jobs::finish_lease(store.db(), job, holder, crate::clock::now_ms()).await
}

/// Recomputes the recommendations pages ask for now, under its own lease, once every
/// `REFRESH_EVERY_MS` on whichever replica asks first.
async fn refresh_recommendations(
    store: &dyn Store,
    card: &gpuledger_core::ratecard::RateCard,
    owners: &gpuledger_core::owners::OwnerSchema,
    holder: &str,
) {
    let now = crate::clock::now_ms();
    use crate::recommend::snapshots::{refresh, REFRESH_JOB};
    let due = (10 * 60_000, crate::recommend::snapshots::REFRESH_EVERY_MS);
    match store::jobs::try_lease_due(store.db(), REFRESH_JOB, holder, now, due).await {
        Ok(true) => {
            if let Err(e) = refresh(store, card, owners, now).await {
                tracing::error!(error = %e, "recommendations refresh failed; will retry");
            }
            if let Err(e) = store::jobs::finish_lease(store.db(), REFRESH_JOB, holder, now).await {
                tracing::error!(error = %e, "recommendations: lease");
            }
        }
        Ok(false) => {}
        Err(e) => tracing::error!(error = %e, "recommendations: lease"),
    }
}

/// Computes the review's heaviest sections of the months still open again, under its own lease,
/// once every `sections::REFRESH_EVERY_MS` on whichever replica asks first, so that views of the
/// month under way read them kept.
async fn refresh_review_sections(
    store: &dyn Store,
    owners: &gpuledger_core::owners::OwnerSchema,
    close: &crate::closing::ClosePolicy,
    holder: &str,
) {
    let now = crate::clock::now_ms();
    let due = (10 * 60_000, crate::sections::REFRESH_EVERY_MS);
    match store::jobs::try_lease_due(store.db(), SECTIONS_JOB, holder, now, due).await {
        Ok(true) => {
            let open_from = open_from(store, close, now).await;
            if let Err(e) = crate::review_sections::refresh(store, owners, open_from, now).await {
                tracing::error!(error = %e, "review sections refresh failed; views compute them");
            }
            if let Err(e) = store::jobs::finish_lease(store.db(), SECTIONS_JOB, holder, now).await {
                tracing::error!(error = %e, "review sections: lease");
            }
        }
        Ok(false) => {}
        Err(e) => tracing::error!(error = %e, "review sections: lease"),
    }
}

/// Runs `announce` (which queues Slack messages and says how many) every five minutes under the
/// lease `job`, so that with several replicas one does it.
fn announce_every_five_minutes<F, Fut>(
    (store, config, holder): (Arc<dyn Store>, Arc<crate::config::Config>, String),
    job: &'static str,
    announce: F,
) where
    F: Fn(Arc<dyn Store>, Arc<crate::config::Config>, i64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<usize, store::StoreError>> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(300));
        loop {
            tick.tick().await;
            let now = crate::clock::now_ms();
            match store::jobs::try_lease(store.db(), job, &holder, now, 240_000).await {
                Ok(true) => match announce(store.clone(), config.clone(), now).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(job, messages = n, "announced in Slack"),
                    Err(e) => tracing::error!(job, error = %e, "failed"),
                },
                Ok(false) => {}
                Err(e) => tracing::error!(job, error = %e, "lease"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daily_range_covers_the_month_and_fourteen_days() {
        // 2026-05-20: the month so far (from May 1st) already covers 14 days back.
        let may20 = 1_777_593_600_000 + 19 * DAY_MS;
        assert_eq!(
            daily_range(may20),
            (
                NaiveDate::from_ymd_opt(2026, 5, 1).unwrap(),
                NaiveDate::from_ymd_opt(2026, 5, 21).unwrap()
            )
        );
        // 2026-05-03: fourteen days back reach into April.
        let may3 = 1_777_593_600_000 + 2 * DAY_MS;
        assert_eq!(
            daily_range(may3).0,
            NaiveDate::from_ymd_opt(2026, 4, 19).unwrap()
        );
    }
}
