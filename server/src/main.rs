use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpuledger_server::billing::{self, ratecard::RateCard};
use gpuledger_server::{agent_tokens, auth, demo, now_ms, serve, session, store, AppState};

/// gpuledger server: GPU cost observability. Ingests agent reports and shows the fleet.
///
/// Every flag can also be set through the environment variable shown beside it.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
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
    Serve(ServeArgs),
    /// Manage agent tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Manage the people who sign in.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Manage read-only API tokens (for BI tools: they read what a viewer reads, by GET).
    ReadToken {
        #[command(subcommand)]
        command: ReadTokenCommand,
    },
    /// Import bills.
    Billing {
        #[command(subcommand)]
        command: BillingCommand,
    },
    /// Request counts and runs' progress that sources posted (`POST /api/v1/usage`).
    Usage {
        #[command(subcommand)]
        command: UsageCommand,
    },
    /// Bring the hourly and daily rollups up to date now (`serve` does it every minute), after
    /// marking [--from, --to) to be attributed again (after changing the rate card, say).
    Rollup {
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
    },
    /// Scheduled exports to object storage (`[export]` in the config; `serve` runs them).
    Export {
        #[command(subcommand)]
        command: ExportCommand,
    },
    /// Start on a fresh SQLite database filled with a simulated fleet, and serve it.
    Demo {
        #[command(flatten)]
        serve: ServeArgs,
        /// Where the demo database goes; it is replaced on each start.
        #[arg(long, env = "GPULEDGER_DEMO_DB", default_value = "gpuledger-demo.db")]
        demo_db: String,
    },
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
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
    config: Option<std::path::PathBuf>,
    /// Rate card (TOML) for hosts without a bill; the built-in one otherwise.
    #[arg(long, env = "GPULEDGER_RATE_CARD")]
    rate_card: Option<std::path::PathBuf>,
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
    aws: AwsArgs,
    /// A streaming standby of the PostgreSQL primary (postgres://...) that pages and API reads
    /// use while it is current enough; writes, sign-in and jobs stay on the primary.
    #[arg(long, env = "GPULEDGER_READ_DATABASE_URL", hide_env_values = true)]
    read_database_url: Option<String>,
    /// How far behind the primary the read replica may be and still be read; further behind
    /// (or down), pages read from the primary.
    #[arg(long, env = "GPULEDGER_MAX_REPLICA_LAG", default_value = "30s", value_parser = humantime::parse_duration)]
    max_replica_lag: Duration,
}

#[derive(Subcommand, Debug)]
enum BillingCommand {
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
struct AwsArgs {
    /// Another Cost Explorer endpoint (a test server, say).
    #[arg(long = "aws-endpoint-url", env = "GPULEDGER_AWS_ENDPOINT_URL")]
    endpoint_url: Option<String>,
    /// Cost-allocation tag whose value is the instance id, for days older than 14.
    #[arg(long = "aws-tag-key", env = "GPULEDGER_AWS_TAG_KEY")]
    tag_key: Option<String>,
}

impl AwsArgs {
    async fn cost_explorer(&self) -> billing::aws::CostExplorer {
        let client = billing::aws::client_from_environment(self.endpoint_url.as_deref()).await;
        billing::aws::CostExplorer::new(
            client,
            billing::aws::SyncOptions {
                tag_key: self.tag_key.clone(),
                ..Default::default()
            },
        )
    }
}

#[derive(Subcommand, Debug)]
enum UserCommand {
    /// Add a person. The password is read from GPULEDGER_PASSWORD, else asked for on the
    /// terminal, else read from the first line of standard input.
    Add {
        username: String,
        /// viewer reads everything (or only its teams'); admin also manages tokens, bills,
        /// alert routes and snoozes.
        #[arg(long, value_parser = ["viewer", "admin"])]
        role: String,
        /// Only these teams' figures, comma-separated (viewers only); every team if left out.
        #[arg(long, default_value = "")]
        teams: String,
    },
    /// Scope a viewer to teams (comma-separated), or to every team with an empty list.
    Teams { username: String, teams: String },
    /// List people and their roles.
    List,
    /// Remove a person and end their sessions (never the last admin).
    Remove { username: String },
    /// Set a person's password (read as for `add`) and end their sessions.
    Password { username: String },
}

#[derive(Subcommand, Debug)]
enum ExportCommand {
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

#[derive(Subcommand, Debug)]
enum ReadTokenCommand {
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

#[derive(Subcommand, Debug)]
enum UsageCommand {
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

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Create an agent token for a cluster and print it (it is shown only this once).
    Create {
        #[arg(long, env = "GPULEDGER_TOKEN_NAME")]
        name: String,
        /// The cluster its agents report (a name, or a pattern such as `train-*`).
        #[arg(long)]
        cluster: String,
        /// Only hosts whose name matches this pattern (`gpu-node-*`).
        #[arg(long)]
        hosts: Option<String>,
        /// Stop working after this long (`90days`); by default it works until revoked.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires_in: Option<std::time::Duration>,
    },
    /// List tokens with their scope, state and last use (never the secrets).
    List,
    /// Revoke a token by name; agents using it get 401 from then on, and its hosts are free
    /// for the next token in scope that reports them.
    Revoke {
        name: String,
        /// Keep the request counts and runs' progress it sent in the figures.
        #[arg(long, conflicts_with = "remove_usage")]
        keep_usage: bool,
        /// Delete the request counts and runs' progress it sent.
        #[arg(long)]
        remove_usage: bool,
    },
    /// Give a token a new secret and print it; the old one keeps working for `--overlap`.
    Rotate {
        name: String,
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        overlap: std::time::Duration,
    },
    /// Let a token post request counts for an endpoint, or runs' progress for an experiment,
    /// that runs on none of its hosts (serving code on hosts without an agent). Otherwise a
    /// token posts only for the owners of its hosts.
    Bind {
        name: String,
        #[command(flatten)]
        owner: BoundOwner,
    },
    /// Take a binding back.
    Unbind {
        name: String,
        #[command(flatten)]
        owner: BoundOwner,
    },
    /// Move a host (CLUSTER/HOSTNAME) to another token, after its agent's token changed.
    Rebind {
        host: String,
        #[arg(long)]
        to: String,
    },
}

/// One endpoint or one experiment, for `token bind` and `token unbind`.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
struct BoundOwner {
    /// An endpoint (the value of the dimension with the endpoint role).
    #[arg(long)]
    endpoint: Option<String>,
    /// An experiment (the value of the dimension with the experiment role).
    #[arg(long)]
    experiment: Option<String>,
}

impl BoundOwner {
    fn pair(&self) -> (agent_tokens::BoundRole, &str) {
        match (&self.endpoint, &self.experiment) {
            (Some(e), _) => (agent_tokens::BoundRole::Endpoint, e),
            (None, Some(x)) => (agent_tokens::BoundRole::Experiment, x),
            // clap requires exactly one of them.
            (None, None) => (agent_tokens::BoundRole::Endpoint, ""),
        }
    }
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

async fn run_server(state: AppState, args: &ServeArgs) -> anyhow::Result<()> {
    // Before the first report, so that on a new database it finds its day's partition made.
    gpuledger_server::jobs::make_history_partitions(
        state.store.as_ref(),
        gpuledger_server::now_ms(),
        state.limits.retention_ms,
        gpuledger_server::store::partitions::Waiting::Leave,
    )
    .await;
    gpuledger_server::jobs::spawn_waste_jobs(
        state.store.clone(),
        state.rate_card.clone(),
        state.config.clone(),
    );
    gpuledger_server::jobs::spawn_rollup_jobs(
        state.store.clone(),
        state.rate_card.clone(),
        args.rollup_interval,
        state.limits.retention_ms,
        state.close,
        state.config.clone(),
    );
    if let Some(export) = &state.config.export {
        let target = gpuledger_server::exports::Target::from_config(export).await;
        gpuledger_server::exports::spawn(
            state.store.clone(),
            state.config.clone(),
            target,
            state.close,
            state.metrics.clone(),
        );
    }
    if let Some(replica) = &state.replica {
        gpuledger_server::replica::spawn_poll(replica.clone());
    }
    if args.aws_sync_daily {
        let ce = args.aws.cost_explorer().await;
        gpuledger_server::jobs::spawn_aws_sync(state.store.clone(), ce, Duration::from_secs(3600));
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, backend = state.store.backend(), "serving");
    println!("gpuledger is serving on http://{addr}/");
    let store = state.store.clone();
    let limits = gpuledger_server::http::connections::ConnectionLimits {
        header_read: args.header_timeout,
        body_idle: args.body_timeout,
        max_connections: args.max_connections,
    }
    .within_open_file_limit();
    serve(listener, state, limits, shutdown_signal()).await?;
    // A job this process was running stops with it: its leases go now, so another replica
    // takes the job at its next tick rather than when the lease expires.
    let prefix = gpuledger_server::jobs::process_holder_prefix();
    let now = gpuledger_server::now_ms();
    match gpuledger_server::store::jobs::release_leases_of(store.db(), &prefix, now).await {
        Ok(n) if n > 0 => tracing::info!(leases = n, "job leases given up on shutdown"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "job leases not given up on shutdown"),
    }
    Ok(())
}

/// The rate card at `path`, or the built-in one.
fn rate_card_from(path: Option<&std::path::Path>) -> anyhow::Result<RateCard> {
    Ok(match path {
        Some(path) => gpuledger_server::billing::ratecard::load(path)?,
        None => RateCard::default_card(),
    })
}

fn state_for(
    store: std::sync::Arc<dyn store::Store>,
    args: &ServeArgs,
) -> anyhow::Result<AppState> {
    let mut state = AppState::new(store.clone());
    if let Some(url) = &args.read_database_url {
        let replica = store::connect_replica(url, store.clone())
            .with_context(|| format!("--read-database-url {}", store::redacted_url(url)))?;
        state.replica = Some(std::sync::Arc::new(
            gpuledger_server::replica::Replica::new(
                std::sync::Arc::new(replica),
                store,
                args.max_replica_lag,
            ),
        ));
    }
    state.limits.retention_ms = args.retention.as_millis() as i64;
    state.close =
        gpuledger_server::closing::ClosePolicy::new(args.close_months_after.as_millis() as i64)
            .map_err(|e| anyhow::anyhow!("--close-months-after: {e}"))?;
    state.limits.max_clock_skew_ms = args.max_clock_skew.as_millis() as i64;
    state.max_body_bytes = args.max_body_bytes;
    state.secure_cookies = args.secure_cookies;
    state.trust_forwarded_for = args.trust_forwarded_for;
    state.max_upload_bytes = args.max_upload_bytes;
    state.rate_card = std::sync::Arc::new(rate_card_from(args.rate_card.as_deref())?);
    state.config = std::sync::Arc::new(config_from(args.config.as_deref())?);
    Ok(state)
}

/// The config file (`--config`), or the defaults without one.
fn config_from(path: Option<&std::path::Path>) -> anyhow::Result<gpuledger_server::config::Config> {
    Ok(match path {
        Some(path) => gpuledger_server::config::Config::load(path)?,
        None => Default::default(),
    })
}

/// Tells `progress` how many hours of `[from_ms, to_ms)` the roll-up has attributed again, from
/// the hours it still has marked (read every half second, as another replica would see them).
fn watch_rollup(
    store: std::sync::Arc<dyn store::Store>,
    progress: std::sync::Arc<gpuledger_server::progress::Reporter>,
    (from_ms, to_ms): (i64, i64),
) -> tokio::task::JoinHandle<()> {
    use gpuledger_server::progress::Progress;
    let total = u64::try_from((to_ms - from_ms) / 3_600_000).unwrap_or_default();
    progress.total(total);
    tokio::spawn(async move {
        let (mut shown, mut marked) = (0, false);
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let Ok(pending) =
                gpuledger_server::closing::pending_hours(store.as_ref(), from_ms, to_ms).await
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

/// A user's new password: from the environment, a terminal prompt, or standard input.
fn read_password() -> anyhow::Result<String> {
    use std::io::IsTerminal;
    if let Ok(p) = std::env::var("GPULEDGER_PASSWORD") {
        return Ok(p);
    }
    if std::io::stdin().is_terminal() {
        return Ok(rpassword::prompt_password("Password: ")?);
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPULEDGER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let store = store::connect(&cli.database_url)
                .await
                .with_context(|| format!("opening {}", store::redacted_url(&cli.database_url)))?;
            run_server(state_for(store, &args)?, &args).await
        }
        Command::Token { command } => {
            let store = store::connect(&cli.database_url)
                .await
                .with_context(|| format!("opening {}", store::redacted_url(&cli.database_url)))?;
            match command {
                TokenCommand::Create {
                    name,
                    cluster,
                    hosts,
                    expires_in,
                } => {
                    let request = agent_tokens::TokenRequest {
                        name,
                        cluster,
                        hosts,
                        expires_in,
                    };
                    let issued = agent_tokens::create(store.as_ref(), &request, now_ms()).await?;
                    println!("{}", issued.secret);
                    eprintln!(
                        "token {:?} created for {}; it is shown only once.",
                        issued.token.name,
                        agent_tokens::scope_text(&issued.token)
                    );
                }
                TokenCommand::List => {
                    let now = now_ms();
                    let when = |ms: Option<i64>| {
                        ms.map_or_else(|| "never".to_owned(), gpuledger_server::format::utc_minute)
                    };
                    println!("NAME\tSTATE\tSCOPE\tCREATED\tEXPIRES\tLAST USED\tLAST ADDRESS");
                    for t in store::tokens::list_tokens(store.db()).await? {
                        println!(
                            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                            t.name,
                            agent_tokens::state(&t, now),
                            agent_tokens::scope_text(&t),
                            when(Some(t.created_ms)),
                            when(t.expires_ms),
                            when(t.last_used_ms),
                            t.last_address.as_deref().unwrap_or("-"),
                        );
                    }
                    let bound = agent_tokens::owner_bindings(store.as_ref()).await?;
                    if !bound.is_empty() {
                        println!("\nTOKEN\tMAY ALSO POST FOR");
                        for b in bound {
                            println!("{}\t{} {}", b.token, b.role, b.value);
                        }
                    }
                }
                TokenCommand::Revoke {
                    name,
                    keep_usage,
                    remove_usage,
                } => {
                    let sent = match (keep_usage, remove_usage) {
                        (true, _) => Some(agent_tokens::SentUsage::Keep),
                        (_, true) => Some(agent_tokens::SentUsage::Remove),
                        _ => None,
                    };
                    let (counts, progress) =
                        agent_tokens::revoke(store.as_ref(), &name, sent, now_ms()).await?;
                    println!("token {name:?} revoked");
                    if remove_usage {
                        println!(
                            "removed {counts} request counts and {progress} progress reports it sent"
                        );
                    }
                }
                TokenCommand::Rotate { name, overlap } => {
                    let issued =
                        agent_tokens::rotate(store.as_ref(), &name, overlap, now_ms()).await?;
                    println!("{}", issued.secret);
                    eprintln!(
                        "token {name:?} has a new secret, shown only once; {}.",
                        agent_tokens::rotation_text(&issued.token)
                    );
                }
                TokenCommand::Bind { name, owner } => {
                    let (role, value) = owner.pair();
                    agent_tokens::bind_owner(store.as_ref(), &name, (role, value), now_ms())
                        .await?;
                    println!(
                        "token {name:?} may post for {} {value:?} wherever it runs",
                        role.role().as_str()
                    );
                }
                TokenCommand::Unbind { name, owner } => {
                    let (role, value) = owner.pair();
                    agent_tokens::unbind_owner(store.as_ref(), &name, (role, value)).await?;
                    println!(
                        "token {name:?} posts for {} {value:?} only while its hosts run it",
                        role.role().as_str()
                    );
                }
                TokenCommand::Rebind { host, to } => {
                    agent_tokens::rebind(store.as_ref(), &host, &to, now_ms()).await?;
                    println!("host {host} now reports with token {to:?}");
                }
            }
            Ok(())
        }
        Command::Usage { command } => {
            let store = store::connect(&cli.database_url)
                .await
                .with_context(|| format!("opening {}", store::redacted_url(&cli.database_url)))?;
            let token_id = |token: Option<String>| {
                let store = store.clone();
                async move {
                    match token {
                        None => Ok::<_, anyhow::Error>(None),
                        Some(name) => Ok(Some(
                            store::tokens::token_by_name(store.db(), &name)
                                .await?
                                .with_context(|| format!("no agent token named {name:?}"))?
                                .id,
                        )),
                    }
                }
            };
            match command {
                UsageCommand::List { token } => {
                    let id = token_id(token).await?;
                    let when = gpuledger_server::format::utc_minute;
                    println!("SOURCE\tTOKEN\tCOUNTS\tREQUESTS\tPROGRESS\tFROM\tTO");
                    for s in store::usage::posted_sources(store.db(), id).await? {
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
                    let id = token_id(token).await?;
                    let (counts, progress) =
                        store::usage::delete_posted(store.db(), Some(&source), id).await?;
                    println!(
                        "source {source:?}: deleted {counts} request counts and {progress} \
                         progress reports"
                    );
                }
            }
            Ok(())
        }
        Command::ReadToken { command } => {
            let store = store::connect(&cli.database_url)
                .await
                .with_context(|| format!("opening {}", store::redacted_url(&cli.database_url)))?;
            match command {
                ReadTokenCommand::Create { name, teams } => {
                    let secret = gpuledger_server::read_tokens::create(
                        store.as_ref(),
                        &name,
                        &session::Scope::parse_list(&teams)?,
                        "command line",
                        now_ms(),
                    )
                    .await?;
                    println!("{secret}");
                }
                ReadTokenCommand::List => {
                    for t in gpuledger_server::read_tokens::list(store.as_ref()).await? {
                        let state = if t.revoked_ms.is_some() {
                            "revoked"
                        } else {
                            "active"
                        };
                        let used = t
                            .last_used_ms
                            .map_or_else(|| "never used".to_owned(), gpuledger_core::time::rfc3339);
                        let teams = gpuledger_server::read_tokens::scope_of(&t).describe();
                        println!("{}\t{state}\t{teams}\t{used}", t.name);
                    }
                }
                ReadTokenCommand::Revoke { name } => {
                    if !gpuledger_server::read_tokens::revoke(store.as_ref(), &name, now_ms())
                        .await?
                    {
                        anyhow::bail!("there is no active read-only token {name:?}");
                    }
                    println!("read-only token {name:?} revoked");
                }
            }
            Ok(())
        }
        Command::User { command } => {
            let store = store::connect(&cli.database_url)
                .await
                .with_context(|| format!("opening {}", store::redacted_url(&cli.database_url)))?;
            match command {
                UserCommand::Add {
                    username,
                    role,
                    teams,
                } => {
                    let scope = session::Scope::parse_list(&teams)?;
                    let password = read_password()?;
                    session::add_user(store.as_ref(), &username, &role, &scope, password, now_ms())
                        .await?;
                    println!(
                        "user {username:?} added as {role}, seeing {}",
                        scope.describe()
                    );
                }
                UserCommand::Teams { username, teams } => {
                    let scope = session::Scope::parse_list(&teams)?;
                    session::set_teams(store.as_ref(), &username, &scope).await?;
                    println!("user {username:?} now sees {}", scope.describe());
                }
                UserCommand::Remove { username } => {
                    session::remove_user(store.as_ref(), &username, now_ms()).await?;
                    println!("user {username:?} removed; their sessions ended");
                }
                UserCommand::Password { username } => {
                    let password = read_password()?;
                    session::set_password(store.as_ref(), &username, password).await?;
                    println!("password of {username:?} set; their sessions ended");
                }
                UserCommand::List => {
                    for u in store::accounts::list_users(store.db()).await? {
                        let teams = session::scope_of(&u.role, u.teams.as_deref()).describe();
                        println!("{}\t{}\t{teams}", u.username, u.role);
                    }
                }
            }
            Ok(())
        }
        Command::Export { command } => {
            let store = store::connect(&cli.database_url)
                .await
                .with_context(|| format!("opening {}", store::redacted_url(&cli.database_url)))?;
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
                    let close = gpuledger_server::closing::ClosePolicy::new(
                        close_months_after.as_millis() as i64,
                    )
                    .map_err(|e| anyhow::anyhow!("--close-months-after: {e}"))?;
                    let target = gpuledger_server::exports::Target::from_config(&export).await;
                    let holder = gpuledger_server::jobs::holder_name();
                    let summary = gpuledger_server::exports::run_due(
                        store.as_ref(),
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
                    for r in gpuledger_server::exports::recent(store.as_ref(), 60).await? {
                        println!(
                            "{}\t{}\t{}\t{}\t{}",
                            r.period,
                            r.status,
                            r.attempts,
                            gpuledger_server::format::utc_minute(r.updated_ms),
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
        Command::Rollup {
            from,
            to,
            rate_card,
            reopen,
            close_months_after,
            config,
        } => {
            let config = config_from(config.as_deref())?;
            let store = store::connect(&cli.database_url)
                .await
                .with_context(|| format!("opening {}", store::redacted_url(&cli.database_url)))?;
            let card = rate_card_from(rate_card.as_deref())?;
            let close =
                gpuledger_server::closing::ClosePolicy::new(close_months_after.as_millis() as i64)
                    .map_err(|e| anyhow::anyhow!("--close-months-after: {e}"))?;
            // Take turns with any running server's roll-up job.
            let holder = gpuledger_server::jobs::holder_name();
            let job = gpuledger_server::jobs::ROLLUP_JOB;
            let deadline = std::time::Instant::now() + Duration::from_secs(600);
            while !store::jobs::try_lease(store.db(), job, &holder, now_ms(), 3_600_000).await? {
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "another roll-up has held the lease for 10 minutes"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
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
                        let progress = std::sync::Arc::new(
                            gpuledger_server::progress::Reporter::new("rollup", "hours"),
                        );
                        let watch =
                            watch_rollup(store.clone(), progress.clone(), (ms(from), ms(to)));
                        let rebuilt = gpuledger_server::rollup::rebuild(
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
                    let rolled = gpuledger_server::rollup::run_open_months(
                        store.as_ref(),
                        &card,
                        &config.attribution_rules(),
                        usize::MAX,
                        open_from,
                    )
                    .await;
                    match rolled {
                        Ok(s) => gpuledger_server::rollup::attribute_new_closed_months(
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
            store::jobs::finish_lease(store.db(), job, &holder, now_ms()).await?;
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
        Command::Billing { command } => {
            let store = store::connect(&cli.database_url)
                .await
                .with_context(|| format!("opening {}", store::redacted_url(&cli.database_url)))?;
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
                    let progress = gpuledger_server::progress::Reporter::new("sync-aws", "days");
                    let s = billing::aws::sync(
                        store.as_ref(),
                        &ce,
                        (from, to),
                        today,
                        now,
                        force,
                        &progress,
                    )
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
                            let m = billing::manifest::read(m).map_err(anyhow::Error::msg)?;
                            (Some(m.delivery), m.files, m.row_counts)
                        }
                        None => {
                            let counts = vec![None; files.len()];
                            (None, files, counts)
                        }
                    };
                    let expected: std::collections::HashMap<&std::path::PathBuf, Option<u64>> =
                        files.iter().zip(row_counts).collect();
                    let bill_file = |path: &std::path::PathBuf| billing::BillFile::FocusPath {
                        name: path
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default(),
                        path: path.clone(),
                        expected_rows: expected.get(path).copied().flatten(),
                    };
                    // One transaction for a whole delivery; otherwise one per file.
                    let batches: Vec<Vec<&std::path::PathBuf>> =
                        if manifest.is_some() || whole_periods {
                            vec![files.iter().collect()]
                        } else {
                            files.iter().map(|f| vec![f]).collect()
                        };
                    let replaces = if manifest.is_some() || whole_periods {
                        store::Replaces::WholePeriods
                    } else {
                        store::Replaces::SameName
                    };
                    let progress = std::sync::Arc::new(gpuledger_server::progress::Reporter::new(
                        "billing import",
                        "rows",
                    ));
                    let (mut imported, mut unchanged, mut rows) = (0, 0, 0);
                    for batch in batches {
                        let summaries = match billing::import_files_reporting(
                            store.as_ref(),
                            replaces,
                            delivery.clone(),
                            batch.iter().map(|p| bill_file(p)).collect(),
                            now_ms(),
                            progress.clone(),
                        )
                        .await
                        {
                            Ok(s) => s,
                            Err(billing::ImportError::Focus { file, error }) => {
                                let path = batch
                                    .iter()
                                    .find(|p| {
                                        p.file_name().is_some_and(|n| n.to_string_lossy() == file)
                                    })
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
        Command::Demo {
            serve: args,
            demo_db,
        } => {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{demo_db}{suffix}"));
            }
            let store = store::connect(&format!("sqlite://{demo_db}")).await?;
            let card = rate_card_from(args.rate_card.as_deref())?;
            eprintln!("demo: simulating last month and this one (takes a few seconds)...");
            let seeded_at = now_ms();
            // The seed is attributed by the same thresholds as what the server rolls up later.
            let config = config_from(args.config.as_deref())?;
            let progress = gpuledger_server::progress::Reporter::new("demo", "host-days");
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
            store::accounts::create_user(
                store.db(),
                "demo",
                &session::hash_password(&password)?,
                "admin",
                None,
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
                &session::Scope::teams(["applied"])?,
                password.clone(),
                now_ms(),
            )
            .await?;
            println!("demo: a viewer of team \"applied\" only:  applied-lead / {password}");
            println!("demo: sign in as  demo / {password}");
            run_server(state_for(store, &args)?, &args).await
        }
    }
}
