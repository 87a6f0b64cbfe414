//! People from the command line, with the real binaries: a password set there ends the
//! person's browser session at once; a user removed there is gone; the last admin stays.

use crate::support;

use std::io::Write;
use std::process::Stdio;

use support::*;

/// Runs `gpuledger-server user ARGS`, the password (if any) on standard input as a script
/// would send it; the exit status and what it printed.
fn user(db_url: &str, args: &[&str], password: Option<&str>) -> (bool, String) {
    let mut child = server_cmd(db_url)
        .arg("user")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run user command");
    if let Some(p) = password {
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{p}").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn the_command_line_sets_passwords_and_removes_people() {
    let db = test_support::sqlite();
    let server = start_server(&db.url, free_port()).await;
    let viewer = signed_in(&server, "viewer").await;
    let home = |c: &reqwest::Client| {
        let url = format!("{}/account", server.url);
        let c = c.clone();
        async move { c.get(url).send().await.unwrap().status() }
    };
    assert_eq!(home(&viewer).await, reqwest::StatusCode::OK);
    let (_, list) = user(&db.url, &["list"], None);
    let name = list
        .lines()
        .find_map(|l| l.strip_suffix("\tviewer\tevery team"))
        .expect("the viewer is listed")
        .to_owned();

    // Scoped to a team, the open session sees that team's figures only, at once.
    let status = |path: &'static str| {
        let url = format!("{}{path}", server.url);
        let c = viewer.clone();
        async move { c.get(url).send().await.unwrap().status() }
    };
    assert_eq!(status("/billing").await, reqwest::StatusCode::OK);
    let (ok, out) = user(&db.url, &["teams", &name, "serving, research"], None);
    assert!(ok && out.contains("now sees research, serving"), "{out}");
    let (_, list) = user(&db.url, &["list"], None);
    assert!(
        list.contains(&format!("{name}\tviewer\tresearch, serving")),
        "{list}"
    );
    assert_eq!(status("/billing").await, reqwest::StatusCode::FORBIDDEN);
    assert_eq!(status("/budgets").await, reqwest::StatusCode::OK);
    let (ok, out) = user(&db.url, &["teams", &name, "bad\u{7}"], None);
    assert!(!ok && out.contains("not a team name"), "{out}");
    let (ok, _) = user(&db.url, &["teams", &name, ""], None);
    assert!(ok);
    assert_eq!(status("/billing").await, reqwest::StatusCode::OK);
    let (ok, out) = user(
        &db.url,
        &["add", "lead", "--role", "admin", "--teams", "serving"],
        Some("lead long password"),
    );
    assert!(!ok && out.contains("admins see every team"), "{out}");

    let (ok, out) = user(&db.url, &["password", &name], Some("short"));
    assert!(!ok && out.contains("at least 10"), "{out}");
    assert_eq!(
        home(&viewer).await,
        reqwest::StatusCode::OK,
        "nothing changed"
    );
    let (ok, out) = user(&db.url, &["password", &name], Some("a new long password"));
    assert!(ok, "{out}");
    assert!(
        home(&viewer).await.is_redirection(),
        "the session ended: back to sign-in"
    );

    let (ok, out) = user(&db.url, &["remove", &name], None);
    assert!(ok, "{out}");
    let (_, list) = user(&db.url, &["list"], None);
    assert!(!list.contains(&name), "{list}");
    let (ok, out) = user(&db.url, &["remove", &name], None);
    assert!(!ok && out.contains("no user"), "{out}");

    let (ok, out) = user(
        &db.url,
        &["add", "root", "--role", "admin"],
        Some("root long password"),
    );
    assert!(ok, "{out}");
    let (ok, out) = user(&db.url, &["remove", "root"], None);
    assert!(!ok && out.contains("last admin"), "{out}");
}

/// A BI tool's read-only token, made on the command line: it reads the API and its CSVs over
/// real HTTP, writes nothing, and stops the moment it is revoked.
#[tokio::test]
async fn a_read_only_token_reads_until_revoked() {
    let db = test_support::sqlite();
    let server = start_server(&db.url, free_port()).await;
    let secret = server_run(&db.url, &["read-token", "create", "finance-bi"])
        .trim()
        .to_owned();
    assert!(secret.starts_with("gpr_"), "{secret}");
    let client = reqwest::Client::new();
    let get = |path: &str| {
        client
            .get(format!("{}{path}", server.url))
            .bearer_auth(&secret)
            .send()
    };
    let csv = get("/api/v1/allocation?by=team&format=csv").await.unwrap();
    assert_eq!(csv.status(), reqwest::StatusCode::OK);
    assert!(csv.text().await.unwrap().contains("period_start"));
    let put = client
        .put(format!("{}/api/v1/budgets", server.url))
        .bearer_auth(&secret)
        .json(&serde_json::json!({"dimension": "team", "key": "a", "amount": "1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), reqwest::StatusCode::FORBIDDEN);
    assert!(server_run(&db.url, &["read-token", "list"]).contains("finance-bi\tactive"));

    server_run(&db.url, &["read-token", "revoke", "finance-bi"]);
    let after = get("/api/v1/allocation?by=team").await.unwrap();
    assert_eq!(after.status(), reqwest::StatusCode::UNAUTHORIZED);
    let list = server_run(&db.url, &["read-token", "list"]);
    assert!(list.contains("finance-bi\trevoked"), "{list}");
}
