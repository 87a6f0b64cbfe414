//! `export`: the scheduled exports to object storage, run now and their status.

use std::time::Duration;

use super::config_from;
use crate::store::Store;

#[derive(clap::Subcommand, Debug)]
pub enum ExportCommand {
    /// Export whatever is due now (settled days, closed months), as `serve` does on schedule.
    Run {
        /// The config file with the `[export]` table.
        #[arg(long, env = "GPULEDGER_CONFIG")]
        config: std::path::PathBuf,
        /// Try failed periods again now, without waiting out their backoff.
        #[arg(long)]
        retry: bool,
        /// How long after a month ends its figures become final (as `serve` has it).
        #[arg(long, env = "GPULEDGER_CLOSE_MONTHS_AFTER", default_value = "5days", value_parser = humantime::parse_duration)]
        close_months_after: Duration,
    },
    /// The latest periods exported or failing.
    Status,
}

pub async fn run(store: &dyn Store, command: ExportCommand) -> anyhow::Result<()> {
    match command {
        ExportCommand::Run {
            config,
            retry,
            close_months_after,
        } => {
            let config = config_from(Some(&config))?;
            let Some(export) = config.export.clone() else {
                anyhow::bail!("the config has no [export] table");
            };
            let close = crate::closing::ClosePolicy::new(close_months_after.as_millis() as i64)
                .map_err(|e| anyhow::anyhow!("--close-months-after: {e}"))?;
            let target = crate::exports::Target::from_config(&export).await;
            let holder = crate::jobs::holder_name();
            let summary = crate::exports::run_due(
                store,
                &config,
                &export,
                &target,
                (close, &holder),
                None,
                retry,
            )
            .await?;
            anyhow::ensure!(
                !summary.skipped,
                "another replica is exporting now; try again when it is done"
            );
            for period in &summary.exported {
                println!("exported {period}");
            }
            for (period, why) in &summary.failed {
                eprintln!("failed {period}: {why}");
            }
            println!(
                "{} exported, {} failed",
                summary.exported.len(),
                summary.failed.len()
            );
            anyhow::ensure!(
                summary.failed.is_empty(),
                "{} period(s) not exported; they are retried later (or with --retry)",
                summary.failed.len()
            );
        }
        ExportCommand::Status => {
            println!("PERIOD\tSTATUS\tATTEMPTS\tUPDATED\tMANIFEST OR ERROR");
            for r in crate::exports::recent(store, 60).await? {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    r.period,
                    r.status,
                    r.attempts,
                    crate::format::utc_minute(r.updated_ms),
                    r.manifest_key
                        .or(r.last_error)
                        .unwrap_or_default()
                        .replace(['\n', '\t'], " "),
                );
            }
        }
    }
    Ok(())
}
