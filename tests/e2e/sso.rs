//! Single sign-on with the real server binary and a real OpenID Connect provider (panva's
//! certified oidc-provider, run by Node.js from `tests/oidc-provider`): the authorization code
//! flow with PKCE over real HTTP, the provider's groups mapped to a role and teams at every
//! sign-in. A provider that is down, or that signs with a key it does not publish, signs nobody
//! in and stores nothing, and local users still sign in with their passwords. On both databases.

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::{Client, StatusCode, Url};
use support::*;

struct Provider {
    _proc: Proc,
    url: String,
}

/// How the provider answers.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Groups in the ID token, signed with the key it publishes.
    Usual,
    /// Signed with a key it does not publish.
    BadSignature,
    /// Groups only at the user-info endpoint.
    GroupsAtUserInfo,
}

/// The provider on `port`, its users and their claims as `users` (JSON), signing with the key
/// in `key_file`, answering as `mode` says.
fn start_provider(
    port: u16,
    redirect: &str,
    users: &serde_json::Value,
    key_file: &Path,
    mode: Mode,
) -> Provider {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oidc-provider");
    assert!(
        dir.join("node_modules/oidc-provider").exists(),
        "the test provider is not installed: run scripts/setup"
    );
    let mut child = Command::new("node")
        .arg(dir.join("provider.mjs"))
        .env("OP_PORT", port.to_string())
        .env("OP_REDIRECT_URI", redirect)
        .env("OP_USERS", users.to_string())
        .env("OP_KEY_FILE", key_file)
        .env(
            "OP_BAD_SIGNATURE",
            if mode == Mode::BadSignature { "1" } else { "0" },
        )
        .env(
            "OP_GROUPS_AT_USERINFO",
            if mode == Mode::GroupsAtUserInfo {
                "1"
            } else {
                "0"
            },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("node runs the provider");
    let stdout = child.stdout.take().unwrap();
    let proc = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("ready ") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the provider started");
    Provider {
        _proc: proc,
        url: format!("http://127.0.0.1:{port}"),
    }
}

fn browser() -> Client {
    Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn location(resp: &reqwest::Response, base: &str) -> String {
    let to = resp
        .headers()
        .get("location")
        .unwrap_or_else(|| panic!("{} without a location", resp.status()))
        .to_str()
        .unwrap();
    Url::parse(base).unwrap().join(to).unwrap().to_string()
}

/// A browser signs in as `login` at the provider, from the server's single sign-on button to
/// the callback's answer, which is returned.
async fn sign_in(c: &Client, server: &str, provider: &str, login: &str) -> reqwest::Response {
    let start = c
        .get(format!("{server}/login/oidc?next=/budgets"))
        .send()
        .await
        .unwrap();
    assert_eq!(start.status(), StatusCode::SEE_OTHER, "to the provider");
    let authorize = location(&start, server);
    assert!(
        authorize.starts_with(&format!("{provider}/auth?")),
        "{authorize}"
    );
    assert!(authorize.contains("code_challenge_method=S256"), "PKCE");
    let resp = c.get(&authorize).send().await.unwrap();
    let interaction = location(&resp, provider);
    // The provider's login form.
    let resp = c
        .post(&interaction)
        .form(&[
            ("prompt", "login"),
            ("login", login),
            ("password", "anything"),
        ])
        .send()
        .await
        .unwrap();
    let resume = location(&resp, provider);
    let resp = c.get(&resume).send().await.unwrap();
    let callback = location(&resp, provider);
    assert!(
        callback.starts_with(&format!("{server}/login/oidc/callback?")),
        "{callback}"
    );
    c.get(&callback).send().await.unwrap()
}

async fn page(c: &Client, url: String) -> (StatusCode, String) {
    let resp = c.get(url).send().await.unwrap();
    (resp.status(), resp.text().await.unwrap())
}

async fn single_sign_on(db: TestDb) {
    let label = db.backend;
    let dir = tempfile::tempdir().unwrap();
    let (op_port, rp_port) = (free_port(), free_port());
    let server_url = format!("http://127.0.0.1:{rp_port}");
    let redirect = format!("{server_url}/login/oidc/callback");
    let key = dir.path().join("provider-key.json");
    let users = serde_json::json!({
        "ana": {"groups": ["gpl-admins", "team-serving"], "email": "ana@example.test"},
        "sam": {"groups": ["team-serving", "everyone"]},
        "eve": {"groups": ["everyone"]},
        "lee": {"groups": ["gpl-admins"]},
    });
    let provider = start_provider(op_port, &redirect, &users, &key, Mode::Usual);
    let config = dir.path().join("gpuledger.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[oidc]
issuer = "{}"
client_id = "gpuledger"
client_secret = "test-secret"
redirect_url = "{redirect}"
name = "Example SSO"
admin_groups = ["gpl-admins"]
team_groups = {{ team-serving = "serving" }}
"#,
            provider.url
        ),
    )
    .unwrap();
    let server = start_server_with(&db.url, rp_port, Some(&config)).await;
    let (_, login_page) = page(&browser(), format!("{server_url}/login")).await;
    assert!(login_page.contains("Sign in with Example SSO"), "{label}");

    // An admin group makes an admin; back where the sign-in began.
    let ana = browser();
    let resp = sign_in(&ana, &server_url, &provider.url, "ana").await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{label}");
    assert_eq!(
        location(&resp, &server_url),
        format!("{server_url}/budgets")
    );
    let (status, _) = page(&ana, format!("{server_url}/users")).await;
    assert_eq!(status, StatusCode::OK, "{label}: ana is an admin");

    // A team group makes a viewer of that team alone.
    let sam = browser();
    let resp = sign_in(&sam, &server_url, &provider.url, "sam").await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{label}");
    let (status, account) = page(&sam, format!("{server_url}/account")).await;
    assert_eq!(status, StatusCode::OK, "{label}");
    assert!(account.contains("seeing the figures of serving"), "{label}");
    let (status, _) = page(&sam, format!("{server_url}/billing")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{label}: the whole bill");
    let list = server_run(&db.url, &["user", "list"]);
    assert!(list.contains("ana\tadmin\tevery team"), "{label}: {list}");
    assert!(list.contains("sam\tviewer\tserving"), "{label}: {list}");

    // The same answer twice signs nobody in the second time, even with the state's cookie; nor
    // does an answer brought to a browser that did not start the sign-in.
    let replay = browser();
    let resp = sign_in(&replay, &server_url, &provider.url, "sam").await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{label}");
    let callback = resp.url().clone();
    let state = callback
        .query_pairs()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())
        .unwrap();
    let again = Client::new()
        .get(callback.clone())
        .header("cookie", format!("gpl_oidc={state}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        again.status(),
        StatusCode::BAD_REQUEST,
        "{label}: used once"
    );
    assert!(
        again
            .text()
            .await
            .unwrap()
            .contains("expired or did not start in this browser"),
        "{label}"
    );
    let (status, _) = page(&Client::new(), callback.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{label}: another browser");

    // In no group that gives access: refused, and not added.
    let eve = browser();
    let resp = sign_in(&eve, &server_url, &provider.url, "eve").await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{label}");
    let body = resp.text().await.unwrap();
    assert!(
        body.contains("is in none of the provider"),
        "{label}: {body}"
    );
    assert!(
        !server_run(&db.url, &["user", "list"])
            .lines()
            .any(|l| l.starts_with("eve\t")),
        "{label}"
    );

    // A local user's name is never taken over by the provider's account of that name.
    let out = server_cmd(&db.url)
        .args(["user", "add", "lee", "--role", "viewer"])
        .env("GPULEDGER_PASSWORD", TEST_PASSWORD)
        .output()
        .unwrap();
    assert!(out.status.success());
    let lee = browser();
    let resp = sign_in(&lee, &server_url, &provider.url, "lee").await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{label}");
    assert!(resp.text().await.unwrap().contains("local user"), "{label}");
    assert!(
        server_run(&db.url, &["user", "list"]).contains("lee\tviewer\tevery team"),
        "{label}: lee is still the local viewer"
    );

    // A provider that signs with a key it does not publish: the ID token does not verify.
    drop(provider);
    let provider = start_provider(op_port, &redirect, &users, &key, Mode::BadSignature);
    let zed = browser();
    let resp = sign_in(&zed, &server_url, &provider.url, "ana").await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "{label}");
    let body = resp.text().await.unwrap();
    assert!(body.contains("does not verify"), "{label}: {body}");
    let (status, _) = page(&zed, format!("{server_url}/account")).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{label}: not signed in");

    // A provider that is down: single sign-on says so; passwords still work.
    drop(provider);
    let resp = browser()
        .get(format!("{server_url}/login/oidc"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{label}");
    assert!(
        resp.text().await.unwrap().contains("unavailable"),
        "{label}"
    );
    let local = signed_in(&server, "viewer").await;
    let (status, _) = page(&local, format!("{server_url}/account")).await;
    assert_eq!(status, StatusCode::OK, "{label}: local sign-in");

    // Groups are read at every sign-in: sam, made an admin at the provider, is one.
    let mut promoted = users.clone();
    promoted["sam"]["groups"] = serde_json::json!(["gpl-admins"]);
    let provider = start_provider(op_port, &redirect, &promoted, &key, Mode::Usual);
    let sam_again = browser();
    let resp = sign_in(&sam_again, &server_url, &provider.url, "sam").await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{label}");
    let (status, _) = page(&sam_again, format!("{server_url}/users")).await;
    assert_eq!(status, StatusCode::OK, "{label}: sam is an admin now");
    assert!(
        server_run(&db.url, &["user", "list"]).contains("sam\tadmin\tevery team"),
        "{label}"
    );

    // A provider that keeps groups out of the ID token: they are read at its user-info endpoint.
    drop(provider);
    let provider = start_provider(op_port, &redirect, &users, &key, Mode::GroupsAtUserInfo);
    let sam_later = browser();
    let resp = sign_in(&sam_later, &server_url, &provider.url, "sam").await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{label}");
    let (status, account) = page(&sam_later, format!("{server_url}/account")).await;
    assert_eq!(status, StatusCode::OK, "{label}");
    assert!(
        account.contains("seeing the figures of serving"),
        "{label}: from user info"
    );

    // Taken out of every group at the provider: refused at the next sign-in, and the sessions
    // already open end then too.
    drop(provider);
    let mut removed = users.clone();
    removed["sam"]["groups"] = serde_json::json!([]);
    let provider = start_provider(op_port, &redirect, &removed, &key, Mode::Usual);
    let resp = sign_in(&browser(), &server_url, &provider.url, "sam").await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{label}");
    drop(provider);
    let (status, _) = page(&sam_later, format!("{server_url}/account")).await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "{label}: sam's open session ended"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn single_sign_on_sqlite() {
    single_sign_on(test_support::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn single_sign_on_postgres() {
    single_sign_on(test_support::postgres().await).await;
}
