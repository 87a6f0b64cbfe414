//! `billing`: FOCUS exports imported (files or an export run's manifest), and AWS Cost
//! Explorer synced.

use anyhow::Context;

use crate::clock::now_ms;
use crate::store::Store;

#[derive(clap::Subcommand, Debug)]
pub enum BillingCommand {
    /// Import FOCUS cost-and-usage exports (CSV, CSV.gz or Parquet). Importing the same file
    /// again changes nothing. A file replaces an earlier file of the same name in the billing
    /// periods it covers (the same part delivered again) and adds to them otherwise (part 2 of
    /// a multi-part export).
    ImportFocus {
        #[arg(required_unless_present = "manifest")]
        files: Vec<std::path::PathBuf>,
        /// The files given are the whole of the billing periods they cover: every earlier file
        /// of those periods is replaced, all in one transaction.
        #[arg(long)]
        whole_periods: bool,
        /// An export run's manifest (AWS Data Exports `…-Manifest.json`, AWS CUR, Azure
        /// `manifest.json`): the files it lists are imported as the whole of their periods, in
        /// one transaction.
        #[arg(long, conflicts_with_all = ["files", "whole_periods"])]
        manifest: Option<std::path::PathBuf>,
    },
    /// Fetch EC2 costs from AWS Cost Explorer for [--from, --to): per instance for the last
    /// 14 days, by instance type and --tag-key before that. Credentials come from the
    /// standard AWS chain. Days that are final and already synced are skipped unless --force.
    SyncAws {
        /// First day, YYYY-MM-DD.
        #[arg(long)]
        from: chrono::NaiveDate,
        /// Day after the last, YYYY-MM-DD.
        #[arg(long)]
        to: chrono::NaiveDate,
        #[command(flatten)]
        aws: AwsArgs,
        /// Fetch final days again even if synced before (each request costs $0.01).
        #[arg(long)]
        force: bool,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct AwsArgs {
    /// Another Cost Explorer endpoint (a test server, say).
    #[arg(long = "aws-endpoint-url", env = "GPULEDGER_AWS_ENDPOINT_URL")]
    endpoint_url: Option<String>,
    /// Cost-allocation tag whose value is the instance id, for days older than 14.
    #[arg(long = "aws-tag-key", env = "GPULEDGER_AWS_TAG_KEY")]
    tag_key: Option<String>,
}

impl AwsArgs {
    pub async fn cost_explorer(&self) -> crate::billing::aws::CostExplorer {
        let client =
            crate::billing::aws::client_from_environment(self.endpoint_url.as_deref()).await;
        crate::billing::aws::CostExplorer::new(
            client,
            crate::billing::aws::SyncOptions {
                tag_key: self.tag_key.clone(),
                ..Default::default()
            },
        )
    }
}

pub async fn run(store: &dyn Store, command: BillingCommand) -> anyhow::Result<()> {
    match command {
        BillingCommand::SyncAws {
            from,
            to,
            aws,
            force,
        } => {
            let ce = aws.cost_explorer().await;
            let now = now_ms();
            let today = chrono::Utc::now().date_naive();
            let progress = crate::progress::Reporter::new("sync-aws", "days");
            let s = crate::billing::aws::sync(store, &ce, (from, to), today, now, force, &progress)
                .await?;
            progress.finish(&format!(
                "{} days fetched, {} final days skipped",
                s.fetched_days, s.skipped_days
            ));
            match s.import {
                Some(i) if i.new => println!(
                    "Cost Explorer {from}..{to}: {} days fetched, {} final days skipped; {} lines ({}), replaced {} older lines",
                    s.fetched_days, s.skipped_days, i.rows, i.totals_text(), i.replaced_lines
                ),
                Some(_) => println!("Cost Explorer {from}..{to}: {} days fetched; nothing changed since the last sync", s.fetched_days),
                None => println!("Cost Explorer {from}..{to}: {} days fetched, {} final days skipped; no EC2 cost", s.fetched_days, s.skipped_days),
            }
        }
        BillingCommand::ImportFocus {
            files,
            whole_periods,
            manifest,
        } => {
            let (delivery, files, row_counts) = match &manifest {
                Some(m) => {
                    let m = crate::billing::manifest::read(m).map_err(anyhow::Error::msg)?;
                    (Some(m.delivery), m.files, m.row_counts)
                }
                None => {
                    let counts = vec![None; files.len()];
                    (None, files, counts)
                }
            };
            let expected: std::collections::HashMap<&std::path::PathBuf, Option<u64>> =
                files.iter().zip(row_counts).collect();
            let bill_file = |path: &std::path::PathBuf| crate::billing::BillFile::FocusPath {
                name: path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                path: path.clone(),
                expected_rows: expected.get(path).copied().flatten(),
            };
            // One transaction for a whole delivery; otherwise one per file.
            let batches: Vec<Vec<&std::path::PathBuf>> = if manifest.is_some() || whole_periods {
                vec![files.iter().collect()]
            } else {
                files.iter().map(|f| vec![f]).collect()
            };
            let replaces = if manifest.is_some() || whole_periods {
                crate::store::Replaces::WholePeriods
            } else {
                crate::store::Replaces::SameName
            };
            let progress =
                std::sync::Arc::new(crate::progress::Reporter::new("billing import", "rows"));
            let (mut imported, mut unchanged, mut rows) = (0, 0, 0);
            for batch in batches {
                let summaries = match crate::billing::import_files_reporting(
                    store,
                    replaces,
                    delivery.clone(),
                    batch.iter().map(|p| bill_file(p)).collect(),
                    now_ms(),
                    progress.clone(),
                )
                .await
                {
                    Ok(s) => s,
                    Err(crate::billing::ImportError::Focus { file, error }) => {
                        let path = batch
                            .iter()
                            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == file))
                            .map_or(file.clone(), |p| p.display().to_string());
                        let what = if batch.len() > 1 {
                            "none of the files given together was imported"
                        } else {
                            "it was not imported; nothing of it was stored"
                        };
                        anyhow::bail!("{path}: {error}\n{what}")
                    }
                    Err(e) => return Err(e).context("nothing of the import was stored"),
                };
                for (path, summary) in batch.iter().zip(summaries) {
                    if summary.new {
                        imported += 1;
                        rows += summary.rows;
                        println!(
                            "{}: imported {} rows ({}); replaced {} older rows",
                            path.display(),
                            summary.rows,
                            summary.totals_text(),
                            summary.replaced_lines
                        );
                    } else {
                        unchanged += 1;
                        println!(
                            "{}: already imported (import {}); nothing changed",
                            path.display(),
                            summary.import_id
                        );
                    }
                }
            }
            progress.finish(&format!(
                "{imported} file(s) imported ({rows} rows), {unchanged} unchanged"
            ));
        }
    }
    Ok(())
}
