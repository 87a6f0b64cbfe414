//! The server's command line: `Cli` (parsed by `main.rs`) and one module per command, each
//! calling the same use cases the pages and the API call; none reads or writes storage itself.

mod billing;
mod demo;
mod export;
mod read_token;
mod rollup;
mod serve;
mod token;
mod usage;
mod user;

use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::store::{self, Store};
use gpuledger_core::ratecard::RateCard;

/// gpuledger server: GPU cost observability. Ingests agent reports and shows the fleet.
///
/// Every flag can also be set through the environment variable shown beside it.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Cli {
    /// sqlite:PATH (created if missing) or postgres://USER@HOST/DB
    #[arg(
        long,
        global = true,
        env = "GPULEDGER_DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://gpuledger.db"
    )]
    database_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the API and pages.
    Serve(serve::ServeArgs),
    /// Manage agent tokens.
    Token {
        #[command(subcommand)]
        command: token::TokenCommand,
    },
    /// Manage the people who sign in.
    User {
        #[command(subcommand)]
        command: user::UserCommand,
    },
    /// Manage read-only API tokens (for BI tools: they read what a viewer reads, by GET).
    ReadToken {
        #[command(subcommand)]
        command: read_token::ReadTokenCommand,
    },
    /// Import bills.
    Billing {
        #[command(subcommand)]
        command: billing::BillingCommand,
    },
    /// Request counts and runs' progress that sources posted (`POST /api/v1/usage`).
    Usage {
        #[command(subcommand)]
        command: usage::UsageCommand,
    },
    /// Bring the hourly and daily rollups up to date now (`serve` does it every minute), after
    /// marking [--from, --to) to be attributed again (after changing the rate card, say).
    Rollup(rollup::RollupArgs),
    /// Scheduled exports to object storage (`[export]` in the config; `serve` runs them).
    Export {
        #[command(subcommand)]
        command: export::ExportCommand,
    },
    /// Start on a fresh SQLite database filled with a simulated fleet, and serve it.
    Demo(demo::DemoArgs),
}

/// Runs the command asked for.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let url = cli.database_url;
    match cli.command {
        Command::Serve(args) => {
            serve::run(serve::state_for(open(&url).await?, &args)?, &args).await
        }
        Command::Token { command } => token::run(open(&url).await?.as_ref(), command).await,
        Command::Usage { command } => usage::run(open(&url).await?.as_ref(), command).await,
        Command::ReadToken { command } => {
            read_token::run(open(&url).await?.as_ref(), command).await
        }
        Command::User { command } => user::run(open(&url).await?.as_ref(), command).await,
        Command::Export { command } => export::run(open(&url).await?.as_ref(), command).await,
        Command::Rollup(args) => rollup::run(open(&url).await?, args).await,
        Command::Billing { command } => billing::run(open(&url).await?.as_ref(), command).await,
        Command::Demo(args) => demo::run(args).await,
    }
}

/// The database at `url`, its migrations applied.
async fn open(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    store::connect(url)
        .await
        .with_context(|| format!("opening {}", store::redacted_url(url)))
}

/// The rate card at `path`, or the built-in one.
pub(crate) fn rate_card_from(path: Option<&std::path::Path>) -> anyhow::Result<RateCard> {
    Ok(match path {
        Some(path) => crate::billing::ratecard::load(path)?,
        None => RateCard::default_card(),
    })
}

/// The config file (`--config`), or the defaults without one.
pub(crate) fn config_from(path: Option<&std::path::Path>) -> anyhow::Result<crate::config::Config> {
    Ok(match path {
        Some(path) => crate::config::Config::load(path)?,
        None => Default::default(),
    })
}
