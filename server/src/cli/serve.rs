//! `serve`: the API and pages, and every periodic job (roll-ups, idle findings, Slack,
//! exports, retention, the daily AWS sync), until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::{config_from, rate_card_from};
use crate::http::AppState;
use crate::store::{self, Store};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "GPULEDGER_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Raw windows older than this are refused at ingest and deleted (their cost stays in the
    /// hourly and daily rollups).
    #[arg(long, env = "GPULEDGER_RETENTION", default_value = "35days", value_parser = humantime::parse_duration)]
    retention: Duration,
    /// How long after a month ends its figures become final: from then on only an explicit
    /// restatement (`rollup --reopen`) changes them, and its raw windows may be deleted.
    #[arg(long, env = "GPULEDGER_CLOSE_MONTHS_AFTER", default_value = "5days", value_parser = humantime::parse_duration)]
    close_months_after: Duration,
    /// How often new reports and bills are rolled up into what pages and the API read.
    #[arg(long, env = "GPULEDGER_ROLLUP_INTERVAL", default_value = "1m", value_parser = humantime::parse_duration)]
    rollup_interval: Duration,
    /// How far in the future an agent's clock may run.
    #[arg(long, env = "GPULEDGER_MAX_CLOCK_SKEW", default_value = "5m", value_parser = humantime::parse_duration)]
    max_clock_skew: Duration,
    /// Largest report body accepted, in bytes.
    #[arg(long, env = "GPULEDGER_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    max_body_bytes: usize,
    /// How long a client may take to send a request's headers; a connection idle this long
    /// (before its first request or between two) is closed.
    #[arg(long, env = "GPULEDGER_HEADER_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    header_timeout: Duration,
    /// How long a request body may send nothing before it is dropped.
    #[arg(long, env = "GPULEDGER_BODY_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    body_timeout: Duration,
    /// Connections open at once; more wait until one closes. Lowered to what the open-file
    /// limit holds (the limit is raised to its hard limit first).
    #[arg(long, env = "GPULEDGER_MAX_CONNECTIONS", default_value_t = 4_096)]
    max_connections: usize,
    /// Config file (TOML): idle thresholds per cluster and Slack routes. See docs/alerts.md.
    #[arg(long, env = "GPULEDGER_CONFIG")]
    pub(super) config: Option<std::path::PathBuf>,
    /// Rate card (TOML) for hosts without a bill; the built-in one otherwise.
    #[arg(long, env = "GPULEDGER_RATE_CARD")]
    pub(super) rate_card: Option<std::path::PathBuf>,
    /// Mark session cookies Secure: set this when users reach the server over HTTPS.
    #[arg(long, env = "GPULEDGER_SECURE_COOKIES")]
    secure_cookies: bool,
    /// Behind a proxy or load balancer: count failed sign-ins, and record where agent tokens
    /// are used from, per the client address it appends to X-Forwarded-For instead of per
    /// connection (the balancer's address).
    #[arg(long, env = "GPULEDGER_TRUST_FORWARDED_FOR")]
    trust_forwarded_for: bool,
    /// Largest upload the billing form accepts (all its files together), in bytes.
    #[arg(long, env = "GPULEDGER_MAX_UPLOAD_BYTES", default_value_t = 512 * 1024 * 1024)]
    max_upload_bytes: usize,
    /// Sync AWS Cost Explorer once a day (one replica at a time).
    #[arg(long, env = "GPULEDGER_AWS_SYNC_DAILY")]
    aws_sync_daily: bool,
    #[command(flatten)]
    aws: super::billing::AwsArgs,
    /// A streaming standby of the PostgreSQL primary (postgres://...) that pages and API reads
    /// use while it is current enough; writes, sign-in and jobs stay on the primary.
    #[arg(long, env = "GPULEDGER_READ_DATABASE_URL", hide_env_values = true)]
    read_database_url: Option<String>,
    /// How far behind the primary the read replica may be and still be read; further behind
    /// (or down), pages read from the primary.
    #[arg(long, env = "GPULEDGER_MAX_REPLICA_LAG", default_value = "30s", value_parser = humantime::parse_duration)]
    max_replica_lag: Duration,
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub async fn run(state: AppState, args: &ServeArgs) -> anyhow::Result<()> {
    // Before the first report, so that on a new database it finds its day's partition made.
    crate::jobs::make_history_partitions_before_serving(
        state.store.as_ref(),
        crate::clock::now_ms(),
        state.limits.retention_ms,
    )
    .await;
    crate::jobs::spawn_waste_jobs(
        state.store.clone(),
        state.rate_card.clone(),
        state.config.clone(),
    );
    crate::jobs::spawn_rollup_jobs(
        state.store.clone(),
        state.rate_card.clone(),
        args.rollup_interval,
        state.limits.retention_ms,
        state.close,
        state.config.clone(),
    );
    if let Some(export) = &state.config.export {
        let target = crate::exports::Target::from_config(export).await;
        crate::exports::spawn(
            state.store.clone(),
            state.config.clone(),
            target,
            state.close,
            state.metrics.clone(),
        );
    }
    if let Some(replica) = &state.replica {
        crate::replica::spawn_poll(replica.clone());
    }
    if args.aws_sync_daily {
        let ce = args.aws.cost_explorer().await;
        crate::jobs::spawn_aws_sync(state.store.clone(), ce, Duration::from_secs(3600));
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, backend = state.store.backend(), "serving");
    println!("gpuledger is serving on http://{addr}/");
    let store = state.store.clone();
    let limits = crate::http::connections::ConnectionLimits {
        header_read: args.header_timeout,
        body_idle: args.body_timeout,
        max_connections: args.max_connections,
    }
    .within_open_file_limit();
    crate::serve(listener, state, limits, shutdown_signal()).await?;
    // A job this process was running stops with it: its leases go now, so another replica
    // takes the job at its next tick rather than when the lease expires.
    match crate::jobs::release_this_process_leases(store.as_ref(), crate::clock::now_ms()).await {
        Ok(n) if n > 0 => tracing::info!(leases = n, "job leases given up on shutdown"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "job leases not given up on shutdown"),
    }
    Ok(())
}

pub fn state_for(store: Arc<dyn Store>, args: &ServeArgs) -> anyhow::Result<AppState> {
    let mut state = AppState::new(store.clone());
    if let Some(url) = &args.read_database_url {
        let replica = crate::store::replica::ReplicaStore::connect(url, store.clone())
            .with_context(|| format!("--read-database-url {}", store::redacted_url(url)))?;
        state.replica = Some(Arc::new(crate::replica::Replica::new(
            Arc::new(replica),
            store,
            args.max_replica_lag,
        )));
    }
    state.limits.retention_ms = args.retention.as_millis() as i64;
    state.close = crate::closing::ClosePolicy::new(args.close_months_after.as_millis() as i64)
        .map_err(|e| anyhow::anyhow!("--close-months-after: {e}"))?;
    state.limits.max_clock_skew_ms = args.max_clock_skew.as_millis() as i64;
    state.max_body_bytes = args.max_body_bytes;
    state.secure_cookies = args.secure_cookies;
    state.trust_forwarded_for = args.trust_forwarded_for;
    state.max_upload_bytes = args.max_upload_bytes;
    state.rate_card = Arc::new(rate_card_from(args.rate_card.as_deref())?);
    state.config = Arc::new(config_from(args.config.as_deref())?);
    Ok(state)
}
