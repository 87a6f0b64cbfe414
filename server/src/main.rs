//! The server's binary: parses the command line and runs the command (`gpuledger_server::cli`).

use clap::Parser;
use gpuledger_server::cli::{self, Cli};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPULEDGER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    cli::run(Cli::parse()).await
}
