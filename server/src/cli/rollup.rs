//! `rollup`: bring the hourly and daily rollups up to date now, or attribute a range again
//! (after a rate card changed, say), restating closed months only when asked to, with a reason.

use std::sync::Arc;
use std::time::Duration;

use super::{config_from, rate_card_from};
use crate::clock::now_ms;
use crate::store::Store;

#[derive(clap::Args, Debug)]
pub struct RollupArgs {
    /// First day to attribute again, YYYY-MM-DD.
    #[arg(long, requires = "to")]
    from: Option<chrono::NaiveDate>,
    /// Day after the last, YYYY-MM-DD.
    #[arg(long, requires = "from")]
    to: Option<chrono::NaiveDate>,
    /// Rate card (TOML) for hosts without a bill; the built-in one otherwise.
    #[arg(long, env = "GPULEDGER_RATE_CARD")]
    rate_card: Option<std::path::PathBuf>,
    /// Restate closed months in the range, for this reason (kept and shown on the review).
    #[arg(long, requires = "from", value_name = "REASON")]
    reopen: Option<String>,
    /// How long after a month ends its figures become final (as `serve` has it).
    #[arg(long, env = "GPULEDGER_CLOSE_MONTHS_AFTER", default_value = "5days", value_parser = humantime::parse_duration)]
    close_months_after: Duration,
    /// The config file `serve` reads: its idle thresholds decide which windows were busy.
    #[arg(long, env = "GPULEDGER_CONFIG")]
    config: Option<std::path::PathBuf>,
}

pub async fn run(store: Arc<dyn Store>, args: RollupArgs) -> anyhow::Result<()> {
    let RollupArgs {
        from,
        to,
        rate_card,
        reopen,
        close_months_after,
        config,
    } = args;
    let config = config_from(config.as_deref())?;
    let card = rate_card_from(rate_card.as_deref())?;
    let close = crate::closing::ClosePolicy::new(close_months_after.as_millis() as i64)
        .map_err(|e| anyhow::anyhow!("--close-months-after: {e}"))?;
    // Take turns with any running server's roll-up job.
    let holder = crate::jobs::holder_name();
    let job = crate::jobs::ROLLUP_JOB;
    let patience = Duration::from_secs(600);
    anyhow::ensure!(
        crate::jobs::wait_for_lease(store.as_ref(), (job, &holder), 3_600_000, patience).await?,
        "another roll-up has held the lease for 10 minutes"
    );
    let result = match (from, to) {
        (Some(from), Some(to)) => {
            let ms = |d: chrono::NaiveDate| {
                d.and_time(chrono::NaiveTime::MIN)
                    .and_utc()
                    .timestamp_millis()
            };
            if from >= to {
                Err(anyhow::anyhow!("--from must be before --to"))
            } else {
                let progress =
                    std::sync::Arc::new(crate::progress::Reporter::new("rollup", "hours"));
                let watch = watch_rollup(store.clone(), progress.clone(), (ms(from), ms(to)));
                let rebuilt = crate::rollup::rebuild(
                    store.as_ref(),
                    &card,
                    &config.attribution_rules(),
                    ms(from),
                    ms(to),
                    close,
                    reopen.as_deref(),
                    now_ms(),
                )
                .await
                .map_err(anyhow::Error::from);
                watch.abort();
                if let Ok((s, _)) = &rebuilt {
                    progress.finish(&format!(
                        "attributed {} hours again ({} rows)",
                        s.hours, s.rows
                    ));
                }
                rebuilt
            }
        }
        _ => {
            let open_from = close.current(store.as_ref()).await?.open_from(now_ms());
            let rolled = crate::rollup::run_open_months(
                store.as_ref(),
                &card,
                &config.attribution_rules(),
                usize::MAX,
                open_from,
            )
            .await;
            match rolled {
                Ok(s) => crate::rollup::attribute_new_closed_months(
                    store.as_ref(),
                    &card,
                    &config.attribution_rules(),
                    open_from,
                    now_ms(),
                )
                .await
                .map(|first| (s, first))
                .map_err(anyhow::Error::from),
                Err(e) => Err(anyhow::Error::from(e)),
            }
        }
    };
    crate::jobs::finish_lease(store.as_ref(), job, &holder).await?;
    let (s, restated) = result?;
    println!("rolled up {} hours ({} rows)", s.hours, s.rows);
    for r in restated {
        let month = chrono::DateTime::from_timestamp_millis(r.month_ms)
            .map(|d| d.format("%Y-%m").to_string())
            .unwrap_or_default();
        println!(
            "restated {month}: before {}, after {}",
            r.before_json, r.after_json
        );
    }
    Ok(())
}

/// Tells `progress` how many hours of `[from_ms, to_ms)` the roll-up has attributed again, from
/// the hours it still has marked (read every half second, as another replica would see them).
fn watch_rollup(
    store: Arc<dyn Store>,
    progress: Arc<crate::progress::Reporter>,
    (from_ms, to_ms): (i64, i64),
) -> tokio::task::JoinHandle<()> {
    use crate::progress::Progress;
    let total = u64::try_from((to_ms - from_ms) / 3_600_000).unwrap_or_default();
    progress.total(total);
    tokio::spawn(async move {
        let (mut shown, mut marked) = (0, false);
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let Ok(pending) = crate::closing::pending_hours(store.as_ref(), from_ms, to_ms).await
            else {
                continue;
            };
            // Before the range is marked, nothing is pending and nothing is done either.
            marked |= pending > 0;
            let done = total.saturating_sub(u64::try_from(pending).unwrap_or_default());
            if marked && done > shown {
                progress.advance(done - shown);
                shown = done;
            }
        }
    })
}
