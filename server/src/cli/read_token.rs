//! `read-token`: read-only API tokens for BI tools, made, listed and revoked.

use crate::clock::now_ms;
use crate::store::Store;

#[derive(clap::Subcommand, Debug)]
pub enum ReadTokenCommand {
    /// Make a read-only token and print its secret (shown only this once).
    Create {
        name: String,
        /// Only these teams' figures, comma-separated; every team if left out.
        #[arg(long, default_value = "")]
        teams: String,
    },
    /// List read-only tokens, their state and last use.
    List,
    /// Revoke a read-only token: it stops working at once.
    Revoke { name: String },
}

pub async fn run(store: &dyn Store, command: ReadTokenCommand) -> anyhow::Result<()> {
    match command {
        ReadTokenCommand::Create { name, teams } => {
            let secret = crate::read_tokens::create(
                store,
                &name,
                &gpuledger_core::scope::Scope::parse_list(&teams)?,
                "command line",
                now_ms(),
            )
            .await?;
            println!("{secret}");
        }
        ReadTokenCommand::List => {
            for t in crate::read_tokens::list(store).await? {
                let state = if t.revoked_ms.is_some() {
                    "revoked"
                } else {
                    "active"
                };
                let used = t
                    .last_used_ms
                    .map_or_else(|| "never used".to_owned(), gpuledger_core::time::rfc3339);
                let teams = crate::read_tokens::scope_of(&t).describe();
                println!("{}\t{state}\t{teams}\t{used}", t.name);
            }
        }
        ReadTokenCommand::Revoke { name } => {
            if !crate::read_tokens::revoke(store, &name, now_ms()).await? {
                anyhow::bail!("there is no active read-only token {name:?}");
            }
            println!("read-only token {name:?} revoked");
        }
    }
    Ok(())
}
