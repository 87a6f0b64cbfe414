//! `usage`: what sources posted (request counts, runs' progress), listed and deleted.

use crate::app::usage;
use crate::store::Store;

#[derive(clap::Subcommand, Debug)]
pub enum UsageCommand {
    /// List each source that posted counts or progress: the token that sent it, how much, when.
    List {
        /// Only what this agent token sent.
        #[arg(long)]
        token: Option<String>,
    },
    /// Delete what a source posted (only what `--token` sent, if given): a count a source
    /// should not have sent leaves every cost per request wrong until it goes.
    Delete {
        #[arg(long)]
        source: String,
        #[arg(long)]
        token: Option<String>,
    },
}

pub async fn run(store: &dyn Store, command: UsageCommand) -> anyhow::Result<()> {
    match command {
        UsageCommand::List { token } => {
            let when = crate::format::utc_minute;
            println!("SOURCE\tTOKEN\tCOUNTS\tREQUESTS\tPROGRESS\tFROM\tTO");
            for s in usage::posted_sources(store, token.as_deref()).await? {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    s.source,
                    s.token.as_deref().unwrap_or("(deleted)"),
                    s.counts,
                    s.requests,
                    s.progress,
                    when(s.first_ms),
                    when(s.last_ms)
                );
            }
        }
        UsageCommand::Delete { source, token } => {
            let (counts, progress) = usage::delete_posted(store, &source, token.as_deref()).await?;
            println!(
                "source {source:?}: deleted {counts} request counts and {progress} \
                 progress reports"
            );
        }
    }
    Ok(())
}
