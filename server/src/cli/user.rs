//! `user`: the people who sign in, added, scoped to teams, listed and removed, and their
//! passwords.

use crate::clock::now_ms;
use crate::session;
use crate::store::Store;

#[derive(clap::Subcommand, Debug)]
pub enum UserCommand {
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

pub async fn run(store: &dyn Store, command: UserCommand) -> anyhow::Result<()> {
    match command {
        UserCommand::Add {
            username,
            role,
            teams,
        } => {
            let scope = gpuledger_core::scope::Scope::parse_list(&teams)?;
            let password = read_password()?;
            session::add_user(store, &username, &role, &scope, password, now_ms()).await?;
            println!(
                "user {username:?} added as {role}, seeing {}",
                scope.describe()
            );
        }
        UserCommand::Teams { username, teams } => {
            let scope = gpuledger_core::scope::Scope::parse_list(&teams)?;
            session::set_teams(store, &username, &scope).await?;
            println!("user {username:?} now sees {}", scope.describe());
        }
        UserCommand::Remove { username } => {
            session::remove_user(store, &username, now_ms()).await?;
            println!("user {username:?} removed; their sessions ended");
        }
        UserCommand::Password { username } => {
            let password = read_password()?;
            session::set_password(store, &username, password).await?;
            println!("password of {username:?} set; their sessions ended");
        }
        UserCommand::List => {
            for u in session::list_users(store).await? {
                let teams = session::scope_of(&u.role, u.teams.as_deref()).describe();
                println!("{}\t{}\t{teams}", u.username, u.role);
            }
        }
    }
    Ok(())
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
