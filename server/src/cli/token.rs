//! `token`: agent tokens, made, listed, revoked, rotated, bound to owners, and hosts moved.

use crate::agent_tokens;
use crate::clock::now_ms;
use crate::store::Store;

#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
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
pub struct BoundOwner {
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

pub async fn run(store: &dyn Store, command: TokenCommand) -> anyhow::Result<()> {
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
            let issued = agent_tokens::create(store, &request, now_ms()).await?;
            println!("{}", issued.secret);
            eprintln!(
                "token {:?} created for {}; it is shown only once.",
                issued.token.name,
                agent_tokens::scope_text(&issued.token)
            );
        }
        TokenCommand::List => {
            let now = now_ms();
            let when =
                |ms: Option<i64>| ms.map_or_else(|| "never".to_owned(), crate::format::utc_minute);
            println!("NAME\tSTATE\tSCOPE\tCREATED\tEXPIRES\tLAST USED\tLAST ADDRESS");
            for t in agent_tokens::list(store).await? {
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
            let bound = agent_tokens::owner_bindings(store).await?;
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
            let (counts, progress) = agent_tokens::revoke(store, &name, sent, now_ms()).await?;
            println!("token {name:?} revoked");
            if remove_usage {
                println!("removed {counts} request counts and {progress} progress reports it sent");
            }
        }
        TokenCommand::Rotate { name, overlap } => {
            let issued = agent_tokens::rotate(store, &name, overlap, now_ms()).await?;
            println!("{}", issued.secret);
            eprintln!(
                "token {name:?} has a new secret, shown only once; {}.",
                agent_tokens::rotation_text(&issued.token)
            );
        }
        TokenCommand::Bind { name, owner } => {
            let (role, value) = owner.pair();
            agent_tokens::bind_owner(store, &name, (role, value), now_ms()).await?;
            println!(
                "token {name:?} may post for {} {value:?} wherever it runs",
                role.role().as_str()
            );
        }
        TokenCommand::Unbind { name, owner } => {
            let (role, value) = owner.pair();
            agent_tokens::unbind_owner(store, &name, (role, value)).await?;
            println!(
                "token {name:?} posts for {} {value:?} only while its hosts run it",
                role.role().as_str()
            );
        }
        TokenCommand::Rebind { host, to } => {
            agent_tokens::rebind(store, &host, &to, now_ms()).await?;
            println!("host {host} now reports with token {to:?}");
        }
    }
    Ok(())
}
