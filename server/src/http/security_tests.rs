//! Access control route by route, security headers, and sign-in rate limiting, through the real
//! router on both storage backends.

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use super::tests::{apis, error_of, Api};
use crate::clock::now_ms;
use crate::store;

/// Who may use a route.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Access {
    /// Anyone: sign-in, health, metrics, the stylesheet.
    Public,
    /// Only an agent token.
    Agent,
    /// Any signed-in person; reads, and signing oneself out.
    Viewer,
    /// Signed-in admins only: everything that changes state.
    Admin,
    /// Slack, signing with the app's secret (`http/slack_app_tests.rs`); not there without an app.
    Slack,
}

/// Every route the server has. `every_route_is_in_the_access_table` fails when a route is
/// added without a line here, so a new route cannot skip these checks.
pub(super) const ROUTES: &[(&str, &str, Access)] = &[
    ("GET", "/login", Access::Public),
    ("GET", "/login/oidc", Access::Public),
    ("GET", "/login/oidc/callback", Access::Public),
    ("GET", "/healthz", Access::Public),
    ("GET", "/metrics", Access::Public),
    ("GET", "/static/app.css", Access::Public),
    ("GET", "/api/v1/openapi.json", Access::Public),
    ("POST", "/slack/commands", Access::Slack),
    ("POST", "/slack/interactions", Access::Slack),
    ("POST", "/api/v1/reports", Access::Agent),
    ("POST", "/api/v1/usage", Access::Agent),
    ("GET", "/api/v1/usage", Access::Viewer),
    ("GET", "/api/v1/runs", Access::Viewer),
    ("GET", "/review/{month}/{dimension}", Access::Viewer),
    ("GET", "/", Access::Viewer),
    ("GET", "/billing", Access::Viewer),
    ("GET", "/billing/{month}", Access::Viewer),
    ("GET", "/incidents", Access::Viewer),
    ("GET", "/incidents/{id}", Access::Viewer),
    ("GET", "/alerts", Access::Viewer),
    ("GET", "/recommendations", Access::Viewer),
    ("GET", "/review", Access::Viewer),
    ("GET", "/review/{month}", Access::Viewer),
    ("GET", "/api/v1/allocation", Access::Viewer),
    ("GET", "/api/v1/variance", Access::Viewer),
    ("GET", "/api/v1/budgets", Access::Viewer),
    ("GET", "/api/v1/anomalies", Access::Viewer),
    ("GET", "/budgets", Access::Viewer),
    ("GET", "/api/v1/billing/imports", Access::Viewer),
    ("GET", "/api/v1/billing/periods", Access::Viewer),
    ("GET", "/api/v1/billing/reconciliation", Access::Viewer),
    ("GET", "/api/v1/billing/commitments", Access::Viewer),
    ("GET", "/api/v1/scale-to-zero", Access::Viewer),
    ("GET", "/api/v1/shape", Access::Viewer),
    ("GET", "/api/v1/incidents", Access::Viewer),
    ("GET", "/api/v1/idle/history", Access::Viewer),
    ("GET", "/api/v1/recommendations", Access::Viewer),
    ("POST", "/logout", Access::Viewer),
    ("GET", "/account", Access::Viewer),
    ("POST", "/account/password", Access::Viewer),
    ("POST", "/snoozes", Access::Admin),
    ("POST", "/alerts/test", Access::Admin),
    ("POST", "/billing/import", Access::Admin),
    ("POST", "/billing/{month}/sign-off", Access::Admin),
    ("GET", "/tokens", Access::Admin),
    ("POST", "/tokens", Access::Admin),
    ("POST", "/tokens/rotate", Access::Admin),
    ("POST", "/tokens/revoke", Access::Admin),
    ("POST", "/tokens/rebind", Access::Admin),
    ("POST", "/tokens/bind", Access::Admin),
    ("POST", "/tokens/unbind", Access::Admin),
    ("POST", "/tokens/read", Access::Admin),
    ("POST", "/tokens/read/revoke", Access::Admin),
    ("POST", "/budgets", Access::Admin),
    ("POST", "/budgets/delete", Access::Admin),
    ("PUT", "/api/v1/budgets", Access::Admin),
    ("DELETE", "/api/v1/budgets", Access::Admin),
    ("POST", "/anomalies/dismiss", Access::Admin),
    ("GET", "/users", Access::Admin),
    ("POST", "/users", Access::Admin),
    ("POST", "/users/remove", Access::Admin),
    ("POST", "/users/password", Access::Admin),
    ("POST", "/users/teams", Access::Admin),
    ("POST", "/api/v1/anomalies/dismiss", Access::Admin),
];

/// A concrete address for a route pattern.
pub(super) fn concrete(path: &str) -> String {
    path.replace("{id}", "1")
        .replace("{month}", "2026-05")
        .replace("{dimension}", "model?key=llama")
}

/// The route paths declared: the pages' in the http module's sources (`.route("…"`), the API's
/// in the OpenAPI document the router makes as it routes them (`routes!`).
fn declared_routes() -> BTreeSet<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs")
            || path.file_name().and_then(|n| n.to_str()) == Some("security_tests.rs")
        {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        // A file's own tests may build routers of their own: those are not the server's.
        let src = src
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        for piece in src.split(".route(").skip(1) {
            let piece = piece.trim_start();
            if let Some(rest) = piece.strip_prefix('"') {
                out.insert(rest.split('"').next().unwrap().to_owned());
            } else {
                panic!(
                    "a route in {} whose path this test cannot read: {piece:.40}",
                    path.display()
                );
            }
        }
    }
    out.extend(super::openapi::document().paths.paths.keys().cloned());
    out
}

#[test]
fn every_route_is_in_the_access_table() {
    let declared = declared_routes();
    let table: BTreeSet<String> = ROUTES.iter().map(|(_, p, _)| p.to_string()).collect();
    assert!(declared.len() >= 20, "the scan found routes: {declared:?}");
    assert_eq!(
        declared, table,
        "routes in the code vs routes in the access table"
    );
}

pub(super) async fn call(
    api: &Api,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    bearer: Option<&str>,
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    if let Some(t) = bearer {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    if method == "POST" {
        req = req.header("content-type", "application/x-www-form-urlencoded");
    }
    let resp = api
        .app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// Refused as a visitor who is not signed in: pages send to sign-in, the API answers 401 JSON.
fn assert_not_signed_in(method: &str, path: &str, status: StatusCode, body: &str, who: &str) {
    if path.starts_with("/api/") {
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{who}: {method} {path}");
        assert_eq!(error_of(body.as_bytes()).error, "unauthorized");
    } else {
        assert_eq!(status, StatusCode::SEE_OTHER, "{who}: {method} {path}");
    }
}

/// A BI tool's read-only token for every team, as an admin makes one.
async fn bi_token(api: &Api) -> String {
    crate::read_tokens::create(
        api.store.as_ref(),
        "bi",
        &gpuledger_core::scope::Scope::all(),
        "admin-user",
        now_ms(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn every_route_admits_exactly_its_audience() {
    for (api, _db) in apis().await {
        let (viewer, viewer_csrf) = api.session("viewer").await;
        let (admin, admin_csrf) = api.session("admin").await;
        // A BI tool's read-only token: a viewer's reads, by GET only.
        let read = bi_token(&api).await;
        for &(method, pattern, access) in ROUTES {
            let path = concrete(pattern);
            let who = api.backend;
            // Signing out is checked last (it would end the viewer's session here).
            let viewer_body = if pattern == "/logout" {
                "csrf=not-now".to_owned()
            } else {
                format!("csrf={viewer_csrf}&cluster=c1&hours=4&route=default")
            };
            match access {
                Access::Public if path.starts_with("/login/oidc") => {
                    // Without a provider set up, single sign-on is not there, for anyone.
                    let (status, _, body) = call(&api, method, &path, None, None, "").await;
                    assert_eq!(status, StatusCode::NOT_FOUND, "{who}: {method} {path}");
                    assert!(body.contains("not set up"), "{body}");
                }
                Access::Slack => {
                    // Without `[slack.app]`, not there for anyone, signed in or not.
                    for cookie in [None, Some(admin.as_str())] {
                        let (status, _, body) = call(&api, method, &path, cookie, None, "").await;
                        assert_eq!(status, StatusCode::NOT_FOUND, "{who}: {method} {path}");
                        assert!(body.contains("not set up"), "{body}");
                    }
                }
                Access::Public => {
                    let (status, _, _) = call(&api, method, &path, None, None, "").await;
                    assert_eq!(status, StatusCode::OK, "{who}: anyone may {method} {path}");
                }
                Access::Agent => {
                    // A person's session is not an agent token, nor is a read-only token.
                    let (status, _, body) =
                        call(&api, method, &path, Some(&admin), None, "{}").await;
                    assert_eq!(status, StatusCode::UNAUTHORIZED, "{who}: {method} {path}");
                    assert_eq!(error_of(body.as_bytes()).error, "unauthorized");
                    let (status, _, _) = call(&api, method, &path, None, Some(&read), "{}").await;
                    assert_eq!(status, StatusCode::UNAUTHORIZED, "{who}: read token {path}");
                    if path == gpuledger_proto::REPORTS_PATH {
                        // A rogue agent: a valid token, a valid report, another cluster.
                        let rogue = agent_token(&api, "rogue", "elsewhere", None).await;
                        let report = serde_json::to_vec(&super::tests::report("rogue")).unwrap();
                        let (status, body) = api.post(Some(&rogue), report).await;
                        assert_eq!(status, StatusCode::FORBIDDEN, "{who}: rogue agent");
                        assert_eq!(error_of(&body).field.as_deref(), Some("host.cluster"));
                    }
                }
                Access::Viewer | Access::Admin => {
                    // Not signed in, and an agent token (which may only ingest): refused.
                    let (status, _, body) =
                        call(&api, method, &path, None, None, &viewer_body).await;
                    assert_not_signed_in(method, &path, status, &body, "anonymous");
                    let (status, _, body) =
                        call(&api, method, &path, None, Some(&api.token), &viewer_body).await;
                    assert_not_signed_in(method, &path, status, &body, "agent token");
                    let (read_status, read_headers, _) =
                        call(&api, method, &path, None, Some(&read), &viewer_body).await;
                    if method != "GET" || access == Access::Admin {
                        assert_eq!(
                            read_status,
                            StatusCode::FORBIDDEN,
                            "{who}: a read-only token may not {method} {path}"
                        );
                    } else {
                        let within = read_status.is_redirection()
                            && !read_headers["location"]
                                .to_str()
                                .unwrap()
                                .starts_with("/login");
                        assert!(
                            read_status == StatusCode::OK
                                || within
                                || (pattern == "/incidents/{id}"
                                    && read_status == StatusCode::NOT_FOUND),
                            "{who}: a read-only token may {method} {path}: {read_status}"
                        );
                    }
                    let (status, headers, body) =
                        call(&api, method, &path, Some(&viewer), None, &viewer_body).await;
                    let redirected_within = status.is_redirection()
                        && !headers["location"].to_str().unwrap().starts_with("/login");
                    if access == Access::Admin {
                        assert_eq!(
                            status,
                            StatusCode::FORBIDDEN,
                            "{who}: a viewer may not {method} {path}"
                        );
                        // A page says so in words; the API in its JSON error.
                        assert!(
                            body.contains("Admins only")
                                || (path.starts_with("/api/") && body.contains("\"forbidden\"")),
                            "{body}"
                        );
                    } else if method == "GET" {
                        assert!(
                            status == StatusCode::OK
                                || redirected_within
                                || (pattern == "/incidents/{id}"
                                    && status == StatusCode::NOT_FOUND),
                            "{who}: a viewer may {method} {path}: {status}"
                        );
                    }
                }
            }
        }
        // The viewer's attempts changed nothing; the admin's session is still there.
        assert!(store::alerts::active_snoozes(api.store.db(), now_ms())
            .await
            .unwrap()
            .is_empty());
        assert!(store::alerts::slack_history(api.store.db(), 10)
            .await
            .unwrap()
            .is_empty());
        assert!(store::bills::billing_imports(api.store.db())
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            store::tokens::list_tokens(api.store.db())
                .await
                .unwrap()
                .len(),
            2,
            "the agent's and rogue"
        );
        assert!(store::telemetry::gpu_windows(api.store.db(), 0, i64::MAX)
            .await
            .unwrap()
            .is_empty());
        let (status, _, _) = call(
            &api,
            "POST",
            "/snoozes",
            Some(&admin),
            None,
            &format!("csrf={admin_csrf}&cluster=c1&hours=4"),
        )
        .await;
        assert_eq!(status, StatusCode::SEE_OTHER, "the admin may snooze");
        assert_eq!(
            store::alerts::active_snoozes(api.store.db(), now_ms())
                .await
                .unwrap()
                .len(),
            1
        );
        // Signing out is the one post a viewer makes, and it ends only their own session.
        let (status, _, _) = call(
            &api,
            "POST",
            "/logout",
            Some(&viewer),
            None,
            &format!("csrf={viewer_csrf}"),
        )
        .await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert_eq!(
            api.get_as("/", Some(&viewer)).await.0,
            StatusCode::SEE_OTHER
        );
        assert_eq!(api.get_as("/", Some(&admin)).await.0, StatusCode::OK);
        // A revoked read-only token reads nothing, at once; a made-up one never did.
        let allocation = "/api/v1/allocation";
        let (status, _, _) = call(&api, "GET", allocation, None, Some(&read), "").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            crate::read_tokens::revoke(api.store.as_ref(), "bi", now_ms())
                .await
                .unwrap()
        );
        for token in [read.clone(), format!("{}x", crate::read_tokens::PREFIX)] {
            let (status, _, _) = call(&api, "GET", allocation, None, Some(&token), "").await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{token}");
        }
        let stored = crate::read_tokens::list(api.store.as_ref()).await.unwrap();
        assert!(stored[0].last_used_ms.is_some() && stored[0].revoked_ms.is_some());
    }
}

#[tokio::test]
async fn every_response_carries_the_security_headers() {
    for (api, _db) in apis().await {
        let (viewer, _) = api.session("viewer").await;
        for path in [
            "/login",
            "/",
            "/review/2026-05",
            "/api/v1/allocation",
            "/static/app.css",
            "/no-such-page",
            "/healthz",
        ] {
            let (_, headers, _) = call(&api, "GET", path, Some(&viewer), None, "").await;
            let csp = headers
                .get("content-security-policy")
                .unwrap_or_else(|| panic!("{path} has no CSP"))
                .to_str()
                .unwrap();
            assert!(
                csp.contains("default-src 'none'")
                    && csp.contains("frame-ancestors 'none'")
                    && !csp.contains("unsafe-inline"),
                "{path}: {csp}"
            );
            assert_eq!(headers.get("x-content-type-options").unwrap(), "nosniff");
            assert_eq!(headers.get("x-frame-options").unwrap(), "DENY");
        }
    }
}

/// Nothing a signed-in person or a token reads is kept by a browser or a shared cache: every
/// `GET` route of the table, as an admin and as a read-only token, answers `no-store`; only
/// the stylesheet is cached.
#[tokio::test]
async fn nothing_read_is_kept_by_a_cache() {
    for (api, _db) in apis().await {
        let (admin, _) = api.session("admin").await;
        let read = bi_token(&api).await;
        let mut checked = 0;
        for &(method, pattern, _) in ROUTES.iter().filter(|(m, _, _)| *m == "GET") {
            let path = concrete(pattern);
            for (cookie, token) in [(Some(admin.as_str()), None), (None, Some(read.as_str()))] {
                let (status, headers, _) = call(&api, method, &path, cookie, token, "").await;
                let cache = headers
                    .get("cache-control")
                    .map(|v| v.to_str().unwrap().to_owned());
                if path.starts_with("/static/") {
                    assert_eq!(cache.as_deref(), Some("public, max-age=3600"), "{path}");
                } else {
                    assert_eq!(cache.as_deref(), Some("no-store"), "{path} ({status})");
                    checked += 1;
                }
            }
        }
        assert!(checked > 50, "{checked}");
        let csv = "/api/v1/allocation?format=csv";
        let (_, headers, _) = call(&api, "GET", csv, Some(&admin), None, "").await;
        assert_eq!(headers.get("cache-control").unwrap(), "no-store", "{csv}");
    }
}

/// The policy forbids inline script and style; a template that used either would break in
/// browsers, so none may.
#[test]
fn templates_use_no_inline_script_or_style() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates");
    let mut seen = 0;
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).unwrap() {
                paths.push(inner.unwrap().path());
            }
        } else {
            paths.push(path);
        }
    }
    for path in paths {
        let html = std::fs::read_to_string(&path).unwrap().to_lowercase();
        seen += 1;
        for forbidden in [
            "<script",
            "style=",
            "<style",
            "javascript:",
            " onclick=",
            " onload=",
        ] {
            assert!(
                !html.contains(forbidden),
                "{} contains {forbidden}",
                path.display()
            );
        }
    }
    assert!(seen >= 10);
}

/// Opens the sign-in form: its cookie and token.
async fn sign_in_form(api: &Api) -> (String, String) {
    let (_, headers, html) = call(api, "GET", "/login", None, None, "").await;
    let cookie = headers
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    (cookie, csrf)
}

async fn sign_in(api: &Api, username: &str, password: &str) -> (StatusCode, axum::http::HeaderMap) {
    let (cookie, csrf) = sign_in_form(api).await;
    let body = format!("username={username}&password={password}&csrf={csrf}&next=/");
    let (status, headers, _) = call(api, "POST", "/login", Some(&cookie), None, &body).await;
    (status, headers)
}

#[tokio::test]
async fn repeated_wrong_passwords_pause_sign_in() {
    use crate::session::{FAILURE_WINDOW_MS, MAX_FAILURES_PER_CLIENT, MAX_FAILURES_PER_USER};
    for (api, _db) in apis().await {
        let hash = crate::session::hash_password("correct horse battery").unwrap();
        for name in ["ana", "bo", "cy", "dee"] {
            store::accounts::create_user(api.store.db(), name, &hash, "viewer", None, now_ms())
                .await
                .unwrap();
        }
        let right = "correct+horse+battery";
        for _ in 0..MAX_FAILURES_PER_USER {
            assert_eq!(
                sign_in(&api, "ana", "wrong-wrong").await.0,
                StatusCode::UNAUTHORIZED
            );
        }
        // Now even the right password waits: the guesser cannot tell it was right.
        let (status, headers) = sign_in(&api, "ana", right).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", api.backend);
        assert_eq!(
            headers.get("retry-after").unwrap(),
            &(FAILURE_WINDOW_MS / 1000).to_string()
        );
        // Another account is unaffected, and a success wipes that account's failures.
        for _ in 0..MAX_FAILURES_PER_USER - 1 {
            sign_in(&api, "bo", "wrong-wrong").await;
        }
        assert_eq!(sign_in(&api, "bo", right).await.0, StatusCode::SEE_OTHER);
        for _ in 0..MAX_FAILURES_PER_USER - 1 {
            sign_in(&api, "bo", "wrong-wrong").await;
        }
        assert_eq!(sign_in(&api, "bo", right).await.0, StatusCode::SEE_OTHER);
        // Failures older than the window no longer count.
        let old = now_ms() - FAILURE_WINDOW_MS - 1_000;
        for _ in 0..MAX_FAILURES_PER_USER {
            store::accounts::record_sign_in_failure(api.store.db(), "cy", "elsewhere", old, 0)
                .await
                .unwrap();
        }
        assert_eq!(sign_in(&api, "cy", right).await.0, StatusCode::SEE_OTHER);
        // Guessing across many names from one address is paused too.
        let (so_far, _) = store::accounts::sign_in_failures(
            api.store.db(),
            "ana",
            "unknown",
            now_ms() - FAILURE_WINDOW_MS,
        )
        .await
        .unwrap();
        let (_, from_client) = store::accounts::sign_in_failures(
            api.store.db(),
            "-",
            "unknown",
            now_ms() - FAILURE_WINDOW_MS,
        )
        .await
        .unwrap();
        assert_eq!(so_far, MAX_FAILURES_PER_USER);
        for i in from_client..MAX_FAILURES_PER_CLIENT {
            assert_eq!(
                sign_in(&api, &format!("guess{i}"), "wrong-wrong").await.0,
                StatusCode::UNAUTHORIZED
            );
        }
        assert_eq!(
            sign_in(&api, "dee", right).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

/// A token with its secret, made the way an admin makes one.
async fn agent_token(api: &Api, name: &str, cluster: &str, hosts: Option<&str>) -> String {
    let request = crate::agent_tokens::TokenRequest {
        name: name.into(),
        cluster: cluster.into(),
        hosts: hosts.map(str::to_owned),
        expires_in: None,
    };
    crate::agent_tokens::create(api.store.as_ref(), &request, now_ms())
        .await
        .unwrap()
        .secret
}

/// The rogue agent: tokens out of scope, or another token's host or GPU, are refused with 403
/// naming the field; a changed repeat or a window already stored is 409; nothing of any of it is
/// stored, the real agent's window is, the refusals are counted in /metrics and shown on the
/// fleet page, and an admin's move of the host lets the new token report it.
#[tokio::test]
async fn a_rogue_agent_token_cannot_rewrite_another_hosts_costs() {
    use super::tests::report;
    for (api, _db) in apis().await {
        let b = api.backend;
        // Made before any host of c1 reported: a pattern is checked against the hosts known.
        let other_hosts = agent_token(&api, "rogue-hosts", "c1", Some("rogue-*")).await;
        let real = report("real-1");
        let (status, _) = api
            .post(Some(&api.token), serde_json::to_vec(&real).unwrap())
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");

        let mut rogue_report = report("rogue-1");
        rogue_report.windows[0].gpus[0].util_avg = Some(100.0);
        rogue_report.windows[0].gpus[0].util_max = Some(100.0);
        rogue_report.windows[0].gpus[0].processes[0]
            .labels
            .insert("team".into(), "evil".into());
        let body = |r: &gpuledger_proto::Report| serde_json::to_vec(r).unwrap();
        let refused = |status: StatusCode, resp: &[u8], want: StatusCode, field: &str| {
            assert_eq!(status, want, "{b}: {}", String::from_utf8_lossy(resp));
            assert_eq!(error_of(resp).field.as_deref(), Some(field), "{b}");
        };

        let other_cluster = agent_token(&api, "scratch", "scratch", None).await;
        let (status, resp) = api.post(Some(&other_cluster), body(&rogue_report)).await;
        refused(status, &resp, StatusCode::FORBIDDEN, "host.cluster");

        let (status, resp) = api.post(Some(&other_hosts), body(&rogue_report)).await;
        refused(status, &resp, StatusCode::FORBIDDEN, "host.hostname");

        let same_cluster = agent_token(&api, "rack-2", "c1", None).await;
        let (status, resp) = api.post(Some(&same_cluster), body(&rogue_report)).await;
        refused(status, &resp, StatusCode::FORBIDDEN, "host.hostname");
        assert!(
            error_of(&resp).message.contains("token rebind"),
            "{b}: the refusal says how to move the host"
        );
        let mut stolen_gpu = rogue_report.clone();
        stolen_gpu.batch_id = "rogue-2".into();
        stolen_gpu.host.hostname = "h2".into();
        let (status, resp) = api.post(Some(&same_cluster), body(&stolen_gpu)).await;
        refused(
            status,
            &resp,
            StatusCode::FORBIDDEN,
            "windows[0].gpus[0].uuid",
        );

        // The real agent: a retry is a duplicate, a changed retry or a rewritten window is 409.
        let (status, resp) = api.post(Some(&api.token), body(&real)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(String::from_utf8_lossy(&resp).contains("duplicate"), "{b}");
        let mut changed = real.clone();
        changed.windows[0].gpus[0].util_avg = Some(40.0);
        let (status, resp) = api.post(Some(&api.token), body(&changed)).await;
        refused(status, &resp, StatusCode::CONFLICT, "batch_id");
        changed.batch_id = "real-2".into();
        let (status, resp) = api.post(Some(&api.token), body(&changed)).await;
        refused(status, &resp, StatusCode::CONFLICT, "windows[0].gpus[0]");

        let windows = store::telemetry::gpu_windows(api.store.db(), 0, i64::MAX)
            .await
            .unwrap();
        assert_eq!(windows.len(), 1, "{b}");
        assert_eq!(
            windows[0].util_avg,
            Some(33.0),
            "{b}: the real agent's window stands"
        );
        let processes = store::telemetry::process_windows(api.store.db(), 0, i64::MAX)
            .await
            .unwrap();
        assert!(
            !processes[0].labels_json.contains("evil"),
            "{b}: {}",
            processes[0].labels_json
        );
        assert_eq!(
            store::telemetry::hosts(api.store.db()).await.unwrap().len(),
            1,
            "{b}"
        );

        let (_, metrics) = api.get("/metrics").await;
        for (reason, count) in [
            ("cluster_out_of_scope", 1),
            ("host_out_of_scope", 1),
            ("host_of_another_token", 1),
            ("gpu_of_another_token", 1),
            ("batch_reused", 1),
            ("window_stored", 1),
        ] {
            let line = format!("reports_rejected_total{{reason=\"{reason}\"}} {count}");
            assert!(metrics.contains(&line), "{b}: {line} in\n{metrics}");
        }

        let (viewer, _) = api.session("viewer").await;
        let (status, fleet) = api.get_as("/", Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(fleet.contains("Refused reports"), "{b}");
        assert!(fleet.contains("rack-2") && fleet.contains("c1/h1"), "{b}");
        assert!(fleet.contains("scratch"), "{b}");

        // An admin moves h1 to rack-2: from then on rack-2 reports it.
        let (admin, csrf) = api.session("admin").await;
        let (status, _, page) = api
            .post_form(
                "/tokens/rebind",
                &admin,
                &format!("csrf={csrf}&host=c1%2Fh1&token=rack-2"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}: {page}");
        assert!(page.contains("now reports with token"), "{b}");
        let mut next = report("rack-2-1");
        next.windows[0].start_ms += 15_000;
        next.windows[0].end_ms += 15_000;
        let (status, resp) = api.post(Some(&same_cluster), body(&next)).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{b}: {}",
            String::from_utf8_lossy(&resp)
        );
        let (_, fleet) = api.get_as("/", Some(&viewer)).await;
        assert!(
            !fleet.contains("rack-2</td><td>c1/h1"),
            "{b}: the move settles rack-2's refusals for h1"
        );
    }
}

/// The tokens page: an admin creates a token (the secret shown once, never cached), is told
/// what is wrong with a scope that is no scope, rotates and revokes; nothing changes on error.
#[tokio::test]
async fn admins_manage_tokens_on_the_tokens_page() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let (admin, csrf) = api.session("admin").await;
        let (status, page) = api.get_as("/tokens", Some(&admin)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(page.contains("cluster c1"), "{b}: the scope is listed");

        let (status, headers, page) = api
            .post_form(
                "/tokens",
                &admin,
                &format!("csrf={csrf}&name=rack-9&cluster=c1&hosts=gpu-*&expires_days=90"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}: {page}");
        assert_eq!(headers["cache-control"], "no-store", "{b}");
        let secret = page
            .split("<code>")
            .filter_map(|p| p.split("</code>").next())
            .find(|c| c.starts_with("gpl_"))
            .unwrap_or_else(|| panic!("{b}: no secret shown in {page}"))
            .to_owned();
        let token = store::tokens::active_token(
            api.store.db(),
            &crate::auth::hash_token(&secret),
            now_ms(),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            (token.cluster.as_deref(), token.host_pattern.as_deref()),
            (Some("c1"), Some("gpu-*")),
            "{b}"
        );
        assert!(token.expires_ms.is_some(), "{b}");
        let (_, again) = api.get_as("/tokens", Some(&admin)).await;
        assert!(
            !again.contains(&secret),
            "{b}: the secret is shown only once"
        );

        let (status, _) = api
            .post(
                Some(&api.token),
                serde_json::to_vec(&super::tests::report("b1")).unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        for (form, says) in [
            ("name=all&cluster=*", "matches every name"),
            ("name=rack-9&cluster=c1", "already exists"),
            (
                "name=x&cluster=c1&hosts=nomatch-*",
                "matches none of the 1 hosts",
            ),
            ("name=x&cluster=c1&expires_days=0", "whole number of days"),
            ("name=x&cluster=c1&hosts=gpu-%5B1-", "not a valid pattern"),
        ] {
            let (status, _, page) = api
                .post_form("/tokens", &admin, &format!("csrf={csrf}&{form}"))
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {form}");
            assert!(
                page.contains("Nothing was changed") && page.contains(says),
                "{b}: {form}: {page}"
            );
        }
        let names: Vec<String> = store::tokens::list_tokens(api.store.db())
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["agent", "rack-9"], "{b}");

        let (status, _, page) = api
            .post_form(
                "/tokens/rotate",
                &admin,
                &format!("csrf={csrf}&name=rack-9&overlap_hours=2"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}: {page}");
        assert!(
            page.contains("the previous secret works until")
                && page.contains("the new one until the token expires at"),
            "{b}: {page}"
        );
        // A second rotation inside the overlap would cut off the agents still on the first
        // secret: refused, and both secrets keep working.
        let (status, _, page) = api
            .post_form(
                "/tokens/rotate",
                &admin,
                &format!("csrf={csrf}&name=rack-9&overlap_hours=2"),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {page}");
        assert!(
            page.contains("Nothing was changed") && page.contains("was rotated already"),
            "{b}: {page}"
        );
        let now = now_ms();
        let hash = crate::auth::hash_token(&secret);
        assert!(store::tokens::active_token(api.store.db(), &hash, now)
            .await
            .unwrap()
            .is_some());
        assert!(
            store::tokens::active_token(api.store.db(), &hash, now + 3 * 3_600_000)
                .await
                .unwrap()
                .is_none()
        );

        let (status, _, _) = api
            .post_form(
                "/tokens/revoke",
                &admin,
                &format!("csrf={csrf}&name=rack-9"),
            )
            .await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{b}");
        let (status, _, page) = api
            .post_form(
                "/tokens/revoke",
                &admin,
                &format!("csrf={csrf}&name=rack-9"),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(page.contains("no active token"), "{b}");
        let (status, _, page) = api
            .post_form(
                "/tokens/rebind",
                &admin,
                &format!("csrf={csrf}&host=c1%2Fh1&token=nobody"),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(page.contains("no token named"), "{b}");
    }
}

/// Posts a usage body with an agent token.
async fn post_usage(api: &Api, token: &str, body: serde_json::Value) -> (StatusCode, Vec<u8>) {
    let (status, _, answer) = call(
        api,
        "POST",
        "/api/v1/usage",
        None,
        Some(token),
        &body.to_string(),
    )
    .await;
    (status, answer.into_bytes())
}

/// Request counts and runs' progress are held to the owners of the token's hosts: another
/// team's endpoint or run is 403 naming the field, and nothing of the post is stored; an
/// admin's binding lets a token post for an owner its hosts do not run, until taken back.
#[tokio::test]
async fn an_agent_token_posts_usage_only_for_the_owners_of_its_hosts() {
    use super::tests::report;
    use gpuledger_core::time::rfc3339;
    for (api, _db) in apis().await {
        let b = api.backend;
        let labelled =
            |batch: &str, cluster: &str, host: &str, gpu: &str, owner: [(&str, &str); 2]| {
                let mut r = report(batch);
                r.host.cluster = cluster.into();
                r.host.hostname = host.into();
                r.windows[0].gpus[0].uuid = gpu.into();
                r.windows[0].gpus[0].processes[0].labels =
                    owner.map(|(k, v)| (k.to_owned(), v.to_owned())).into();
                serde_json::to_vec(&r).unwrap()
            };
        let applied = labelled(
            "applied-1",
            "c1",
            "h1",
            "GPU-1",
            [("endpoint", "chat-api"), ("experiment", "lr-sweep-1")],
        );
        let (status, resp) = api.post(Some(&api.token), applied).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{b}: {}",
            String::from_utf8_lossy(&resp)
        );
        let sandbox = agent_token(&api, "sandbox", "sandbox", None).await;
        let toy = labelled(
            "sandbox-1",
            "sandbox",
            "s1",
            "GPU-S1",
            [("endpoint", "toy"), ("experiment", "toy-run")],
        );
        let (status, resp) = api.post(Some(&sandbox), toy).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{b}: {}",
            String::from_utf8_lossy(&resp)
        );
        crate::test_support::roll_up(api.store.as_ref()).await;

        let now = now_ms();
        let counts = |source: &str, endpoints: &[&str], start: i64| {
            serde_json::json!({"source": source, "counts": endpoints.iter().map(|e| serde_json::json!({
                "endpoint": e,
                "start": rfc3339(start),
                "end": rfc3339(start + 60_000),
                "requests": 900_000,
            })).collect::<Vec<_>>()})
        };
        let progress = |source: &str, experiment: &str| {
            serde_json::json!({"source": source, "progress": [
                {"experiment": experiment, "at": rfc3339(now - 60_000), "step": 100}
            ]})
        };
        let refused = |(status, resp): (StatusCode, Vec<u8>), field: &str| {
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "{b}: {}",
                String::from_utf8_lossy(&resp)
            );
            let e = error_of(&resp);
            assert_eq!(e.field.as_deref(), Some(field), "{b}");
            assert!(
                e.message.contains("token bind sandbox"),
                "{b}: {}",
                e.message
            );
        };
        let stored = || async {
            store::usage::posted_sources(api.store.db(), None)
                .await
                .unwrap()
                .len()
        };

        // The sandbox token cannot add requests to applied's endpoint or steps to its run, alone
        // or behind one of its own.
        let start = now - 120_000;
        refused(
            post_usage(&api, &sandbox, counts("pod", &["chat-api"], start)).await,
            "counts[0].endpoint",
        );
        refused(
            post_usage(&api, &sandbox, counts("pod", &["toy", "chat-api"], start)).await,
            "counts[1].endpoint",
        );
        refused(
            post_usage(&api, &sandbox, progress("rank-0", "lr-sweep-1")).await,
            "progress[0].experiment",
        );
        assert_eq!(
            stored().await,
            0,
            "{b}: nothing of a refused post is stored"
        );
        let metrics = api.get_as("/metrics", None).await.1;
        assert!(
            metrics.contains("reports_rejected_total{reason=\"owner_not_of_token\"} 3"),
            "{b}: {metrics}"
        );

        // Each token posts for its own hosts' owners.
        let ok = |(status, resp): (StatusCode, Vec<u8>)| {
            assert_eq!(
                status,
                StatusCode::OK,
                "{b}: {}",
                String::from_utf8_lossy(&resp)
            );
        };
        ok(post_usage(&api, &sandbox, counts("pod", &["toy"], start)).await);
        ok(post_usage(&api, &sandbox, progress("rank-0", "toy-run")).await);
        ok(post_usage(&api, &api.token, counts("chat-0", &["chat-api"], start)).await);
        ok(post_usage(&api, &api.token, progress("rank-0", "lr-sweep-1")).await);
        // ... while they ran there: not for a period weeks before its processes did.
        let (status, resp) = post_usage(
            &api,
            &api.token,
            counts("chat-0", &["chat-api"], now - 20 * 86_400_000),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{b}: {}",
            String::from_utf8_lossy(&resp)
        );
        assert_eq!(
            error_of(&resp).field.as_deref(),
            Some("counts[0].endpoint"),
            "{b}"
        );

        // An admin binds the sandbox token to chat-api (serving code on a host with no agent):
        // its counts are taken, until the binding is taken back.
        let (admin, csrf) = api.session("admin").await;
        let (status, _, page) = api
            .post_form(
                "/tokens/bind",
                &admin,
                &format!("csrf={csrf}&token=sandbox&role=endpoint&value=chat-api"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}: {page}");
        assert!(page.contains("may post for endpoint"), "{b}");
        assert!(
            page.contains("<td>endpoint chat-api</td>"),
            "{b}: the binding is listed"
        );
        ok(post_usage(&api, &sandbox, counts("edge", &["chat-api"], start)).await);
        refused(
            post_usage(&api, &sandbox, progress("rank-0", "lr-sweep-1")).await,
            "progress[0].experiment",
        );
        for (form, want) in [
            ("token=sandbox&role=team&value=applied", "not \"team\""),
            (
                "token=nobody&role=endpoint&value=chat-api",
                "no active token",
            ),
            ("token=sandbox&role=endpoint&value=", "1 to 128 characters"),
        ] {
            let (status, _, page) = api
                .post_form("/tokens/bind", &admin, &format!("csrf={csrf}&{form}"))
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {form}");
            assert!(
                page.contains(&want.replace('"', "&#34;")),
                "{b}: {form}: {page}"
            );
        }
        let (status, _, page) = api
            .post_form(
                "/tokens/unbind",
                &admin,
                &format!("csrf={csrf}&token=sandbox&role=endpoint&value=chat-api"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}: {page}");
        refused(
            post_usage(
                &api,
                &sandbox,
                counts("edge", &["chat-api"], start - 60_000),
            )
            .await,
            "counts[0].endpoint",
        );
        // The CLI's way binds an experiment.
        crate::agent_tokens::bind_owner(
            api.store.as_ref(),
            "sandbox",
            (crate::agent_tokens::BoundRole::Experiment, "lr-sweep-1"),
            now_ms(),
        )
        .await
        .unwrap();
        ok(post_usage(&api, &sandbox, progress("coordinator", "lr-sweep-1")).await);
    }
}
