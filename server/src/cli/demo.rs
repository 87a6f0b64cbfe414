//! `demo`: a fresh SQLite database filled with two months of a simulated fleet and its bill,
//! simulated agents reporting live from then on, served.

use std::time::Duration;

use super::serve::{self, ServeArgs};
use super::{config_from, rate_card_from};
use crate::{agent_tokens, auth, clock::now_ms, demo, session};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// Where the demo database goes; it is replaced on each start.
    #[arg(long, env = "GPULEDGER_DEMO_DB", default_value = "gpuledger-demo.db")]
    demo_db: String,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let DemoArgs {
        serve: args,
        demo_db,
    } = args;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{demo_db}{suffix}"));
    }
    let store = crate::store::connect(&format!("sqlite://{demo_db}")).await?;
    let card = rate_card_from(args.rate_card.as_deref())?;
    eprintln!("demo: simulating last month and this one (takes a few seconds)...");
    let seeded_at = now_ms();
    // The seed is attributed by the same thresholds as what the server rolls up later.
    let config = config_from(args.config.as_deref())?;
    let progress = crate::progress::Reporter::new("demo", "host-days");
    let batches = demo::seed_reporting(
        store.as_ref(),
        &card,
        &config.attribution_rules(),
        seeded_at,
        &progress,
    )
    .await?;
    progress.finish(&format!(
        "simulated this month and the last for a fleet in {demo_db} ({batches} reports, \
         with its FOCUS bill)"
    ));
    // From here the simulated agents keep reporting, a window a minute, so the Idle page
    // and Slack see a live fleet.
    let live = store.clone();
    tokio::spawn(async move {
        let mut until = seeded_at - seeded_at % 60_000;
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            let now = now_ms();
            let to = (now - now % 60_000).min(until + 3_600_000);
            match demo::report_live(live.as_ref(), until, to).await {
                Ok(_) => until = to,
                Err(e) => tracing::warn!(error = %e, "demo: live reports"),
            }
        }
    });
    let password = auth::generate_token().trim_start_matches("gpl_")[..16].to_owned();
    session::add_user(
        store.as_ref(),
        "demo",
        "admin",
        &gpuledger_core::scope::Scope::all(),
        password.clone(),
        now_ms(),
    )
    .await?;
    let sandbox = agent_tokens::create(
        store.as_ref(),
        &agent_tokens::TokenRequest {
            name: "sandbox".into(),
            cluster: "sandbox".into(),
            ..Default::default()
        },
        now_ms(),
    )
    .await?;
    // On stdout with the sign-in: both are what a person starting the demo needs.
    println!(
        "demo: agent token for trying ingest yourself (cluster \"sandbox\"): {}",
        sandbox.secret
    );
    // A team lead who sees their team's figures only.
    session::add_user(
        store.as_ref(),
        "applied-lead",
        "viewer",
        &gpuledger_core::scope::Scope::teams(["applied"])?,
        password.clone(),
        now_ms(),
    )
    .await?;
    println!("demo: a viewer of team \"applied\" only:  applied-lead / {password}");
    println!("demo: sign in as  demo / {password}");
    serve::run(serve::state_for(store, &args)?, &args).await
}
