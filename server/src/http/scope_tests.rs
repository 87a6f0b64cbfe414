//! Team scopes, route by route: a viewer and a read-only token of team alpha get nothing of team
//! bravo from any page, API or CSV (every route either narrows to alpha or refuses), and what
//! they do get is alpha's figures to the digit; on both backends.

use axum::http::StatusCode;

use super::budgets_tests::{billed_host, send};
use super::security_tests::{call, concrete, Access, ROUTES};
use super::tests::{apis, write_ledger, Api};
use crate::auth::{generate_token, hash_token};
use crate::clock::now_ms;
use crate::store;
use gpuledger_core::time::{month_start_ms, HOUR_MS};

/// A viewer of `teams` (a JSON array) signed in; the Cookie header.
async fn scoped_session(api: &Api, name: &str, teams: &str) -> String {
    let hash = crate::session::hash_password("correct horse battery").unwrap();
    store::accounts::create_user(api.store.db(), name, &hash, "viewer", Some(teams), now_ms())
        .await
        .unwrap();
    let user = store::accounts::user_by_name(api.store.db(), name)
        .await
        .unwrap()
        .unwrap();
    let token = generate_token();
    store::accounts::create_session(
        api.store.db(),
        &hash_token(&token),
        user.id,
        "csrf",
        now_ms(),
        now_ms() + 60_000,
    )
    .await
    .unwrap();
    format!("gpl_session={token}")
}

/// An idle incident on `host`'s GPU, open for the last hour; its id.
pub(super) async fn incident_on(api: &Api, host: i64, team: &str) -> i64 {
    let now = now_ms();
    store::alerts::insert_incident(
        api.store.db(),
        &crate::store::alerts::IncidentUpdate {
            incident_key: format!("held:c/{host}/{team}"),
            kind: "held_idle".into(),
            cluster: "c".into(),
            hostname: Some(format!("host-of-{team}")),
            gpus_json: format!(r#"["GPU-{host}"]"#),
            owners_json: format!(r#"{{"team":"{team}"}}"#),
            devices_json: "[]".into(),
            started_ms: now - 3_600_000,
            last_seen_ms: now,
            cost_per_hour: "1".into(),
            currency: "USD".into(),
            estimated: false,
            wasted: "1".into(),
        },
    )
    .await
    .unwrap()
}

/// Alpha's and bravo's work on a host each, this month and the last, a budget each, an
/// incident each, and requests to a bravo endpoint.
pub(super) async fn two_teams(api: &Api, admin: &str) -> (i64, i64) {
    let this = month_start_ms(now_ms());
    let last = month_start_ms(this - 1);
    let alpha = billed_host(api, "i-alpha").await;
    let bravo = billed_host(api, "i-bravo").await;
    let mut entries = Vec::new();
    for month in [last, this] {
        for h in 0..4 {
            let hour = month + h * HOUR_MS;
            entries.push((hour, alpha, "alpha", "used", "10".parse().unwrap()));
            entries.push((hour, bravo, "bravo", "used", "7".parse().unwrap()));
            entries.push((hour, bravo, "bravo", "held_idle", "1".parse().unwrap()));
        }
    }
    write_ledger(api, &entries).await;
    for (team, amount) in [("alpha", "1000"), ("bravo", "500")] {
        let body = serde_json::json!({"dimension": "team", "key": team, "amount": amount,
            "currency": "USD"});
        let (status, v) = send(api, "PUT", "/api/v1/budgets", admin, body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    // The ledger is written here, not by agents: the token is bound to the endpoint.
    crate::agent_tokens::bind_owner(
        api.store.as_ref(),
        "agent",
        (crate::agent_tokens::BoundRole::Endpoint, "bravo-chat"),
        now_ms(),
    )
    .await
    .unwrap();
    let hour = gpuledger_core::time::hour_floor(now_ms()) - HOUR_MS;
    let usage = serde_json::json!({"source": "pod-1", "counts": [{"endpoint": "bravo-chat",
        "start": gpuledger_core::time::rfc3339(hour),
        "end": gpuledger_core::time::rfc3339(hour + HOUR_MS), "requests": 1200}]});
    let req = axum::http::Request::post("/api/v1/usage")
        .header("authorization", format!("Bearer {}", api.token))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(usage.to_string()))
        .unwrap();
    let resp = tower::ServiceExt::oneshot(api.app.clone(), req)
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    // The fleet now: alpha's host runs an alpha job and a bravo one; bravo's host, bravo's.
    for (host, teams) in [
        ("i-alpha", &["alpha", "bravo"][..]),
        ("i-bravo", &["bravo"][..]),
    ] {
        let mut r = super::tests::report(host);
        r.host.hostname = host.into();
        r.windows[0].gpus[0].uuid = format!("GPU-now-{host}");
        r.windows[0].gpus[0].processes = teams
            .iter()
            .enumerate()
            .map(|(i, team)| gpuledger_proto::ProcessWindow {
                pid: i as u32 + 1,
                name: Some(format!("{team}-job")),
                labels: [("team".to_owned(), team.to_string())].into(),
                ..Default::default()
            })
            .collect();
        let (status, body) = api
            .post(Some(&api.token), serde_json::to_vec(&r).unwrap())
            .await;
        assert!(
            status.is_success(),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    // A bravo process just began holding alpha's GPU: the ledger does not know it yet.
    incident_on(api, alpha, "bravo").await;
    (
        incident_on(api, alpha, "alpha").await,
        incident_on(api, bravo, "bravo").await,
    )
}

/// What a scoped reader may get of a route: alpha's figures (200, or a redirect within), a
/// refusal that says why (403), or nothing there (404); never a word of bravo.
fn assert_nothing_of_bravo(who: &str, path: &str, status: StatusCode, body: &str) {
    assert!(
        !body.to_lowercase().contains("bravo"),
        "{who}: GET {path} ({status}) shows bravo: {body:.600}"
    );
    match status {
        StatusCode::OK | StatusCode::NOT_FOUND | StatusCode::SEE_OTHER => {}
        StatusCode::FORBIDDEN if path.starts_with("/api/") => {
            assert!(body.contains("\"out_of_scope\""), "{who}: {path}: {body}");
        }
        StatusCode::FORBIDDEN => assert!(body.contains("Every team"), "{who}: {path}: {body}"),
        other => panic!("{who}: GET {path}: {other}"),
    }
}

#[tokio::test]
async fn a_team_scoped_viewer_and_token_get_nothing_of_another_team() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let (admin, admin_csrf) = api.session("admin").await;
        let (alpha_incident, bravo_incident) = two_teams(&api, &admin).await;
        let viewer = scoped_session(&api, "alice", r#"["alpha"]"#).await;
        let token = crate::read_tokens::create(
            api.store.as_ref(),
            "alpha-bi",
            &gpuledger_core::scope::Scope::teams(["alpha"]).unwrap(),
            "admin-user",
            now_ms(),
        )
        .await
        .unwrap();
        let alpha_page = format!("/incidents/{alpha_incident}");
        let bravo_page = format!("/incidents/{bravo_incident}");
        let extra = [
            alpha_page.as_str(),
            bravo_page.as_str(),
            "/review/2026-05/host?key=i-bravo",
            "/review/2026-05/team?key=bravo",
            "/api/v1/allocation?by=host",
            "/api/v1/allocation?by=cluster&step=hour",
            "/api/v1/allocation?by=team&format=csv",
            "/api/v1/allocation?team=bravo",
            "/api/v1/allocation?format=focus",
            "/api/v1/variance?by=host&format=csv",
            "/budgets?month=2026-05",
        ];
        let routes = ROUTES
            .iter()
            .filter(|(m, _, a)| *m == "GET" && *a == Access::Viewer)
            .map(|(_, p, _)| concrete(p))
            .chain(extra.iter().map(|p| p.to_string()));
        let mut answered = Vec::new();
        for path in routes {
            let (status, _, body) = call(&api, "GET", &path, Some(&viewer), None, "").await;
            assert_nothing_of_bravo(&format!("{b} viewer"), &path, status, &body);
            let (t_status, _, body) = call(&api, "GET", &path, None, Some(&token), "").await;
            assert_nothing_of_bravo(&format!("{b} token"), &path, t_status, &body);
            assert_eq!(
                status, t_status,
                "{b}: {path}: the token reads as the viewer"
            );
            if status == StatusCode::OK {
                answered.push(path);
            }
        }
        // What is narrowed is shown, not refused.
        let this_month = gpuledger_core::time::month_label(now_ms());
        let review = format!("/review/{this_month}");
        let drill = format!("/review/{this_month}/host?key=i-alpha");
        for path in [
            "/api/v1/allocation",
            "/api/v1/variance",
            "/api/v1/budgets",
            "/api/v1/anomalies",
            "/api/v1/usage",
            "/api/v1/runs",
            "/api/v1/incidents",
            "/api/v1/idle/history",
            "/api/v1/recommendations",
            "/budgets",
            "/incidents",
            "/recommendations",
            "/account",
            alpha_page.as_str(),
        ] {
            assert!(
                answered.iter().any(|a| a == path),
                "{b}: {path}: {answered:?}"
            );
        }
        for path in [&review, &drill] {
            let (status, _, body) = call(&api, "GET", path, Some(&viewer), None, "").await;
            assert_nothing_of_bravo(b, path, status, &body);
            assert_eq!(status, StatusCode::OK, "{b}: {path}");
            assert!(body.contains("$40.00"), "{b}: {path}: alpha's month");
        }
        let (status, _) = api.get_as(&bravo_page, Some(&viewer)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{b}: bravo's incident");

        // Alpha's figures are alpha's, to the digit.
        let json = |cookie: String, path: &'static str| {
            let api = &api;
            async move {
                let (status, body) = api.get_as(path, Some(&cookie)).await;
                assert_eq!(status, StatusCode::OK, "{path}: {body}");
                serde_json::from_str::<serde_json::Value>(&body).unwrap()
            }
        };
        let keys = |v: &serde_json::Value| -> Vec<(String, String)> {
            v["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    let key = r["key"].as_str().unwrap().to_owned();
                    (key, r["cost"].as_str().unwrap_or_default().to_owned())
                })
                .collect()
        };
        let q = "/api/v1/allocation?by=team&step=month";
        let everyone = keys(&json(admin.clone(), q).await);
        let alpha = keys(&json(viewer.clone(), q).await);
        assert_eq!(everyone.len(), 2, "{b}: {everyone:?}");
        assert_eq!(
            alpha,
            everyone
                .iter()
                .filter(|(k, _)| k == "alpha")
                .cloned()
                .collect::<Vec<_>>(),
            "{b}"
        );
        assert_eq!(alpha, vec![("alpha".to_owned(), "40".to_owned())], "{b}");
        let variance = json(viewer.clone(), "/api/v1/variance").await;
        assert_eq!(
            variance["rows"].as_array().unwrap().len(),
            1,
            "{b}: {variance}"
        );
        assert_eq!(variance["total"]["cost"], "40", "{b}: {variance}");
        let budgets = json(viewer.clone(), "/api/v1/budgets").await;
        let shown: Vec<&str> = budgets["budgets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["key"].as_str().unwrap())
            .collect();
        assert_eq!(shown, vec!["alpha"], "{b}");
        let incidents = json(viewer.clone(), "/api/v1/incidents").await;
        assert_eq!(
            incidents.as_array().map(Vec::len),
            Some(1),
            "{b}: {incidents}"
        );

        // Admins cannot be scoped; a viewer's scope changes at their next request.
        let (status, _, body) = api
            .post_form(
                "/users/teams",
                &admin,
                &format!("csrf={admin_csrf}&username=admin-user&teams=alpha"),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(body.contains("admins see every team"), "{b}: {body:.300}");
        let (status, _, _) = api
            .post_form(
                "/users/teams",
                &admin,
                &format!("csrf={admin_csrf}&username=alice&teams=alpha%2C+bravo"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let both = keys(&json(viewer.clone(), q).await);
        assert_eq!(both, everyone, "{b}: alice now sees both teams");
        let (_, users) = api.get_as("/users", Some(&admin)).await;
        assert!(users.contains("value=\"alpha, bravo\""), "{b}");
        let (status, _, _) = api
            .post_form(
                "/users/teams",
                &admin,
                &format!("csrf={admin_csrf}&username=alice&teams="),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let (status, _) = api.get_as("/billing", Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{b}: every team again");

        // The fleet, from the hosts the last week of the ledger says are alpha's: alpha's
        // host with alpha's job; the bravo job beside it is not shown, nor bravo's host.
        // The agents' hosts (cluster c1), not the bill's of the same names.
        let hosts = store::telemetry::hosts(api.store.db()).await.unwrap();
        let agent_host = |name: &str| {
            hosts
                .iter()
                .find(|h| h.cluster == "c1" && h.hostname == name)
                .map(|h| h.id)
                .unwrap()
        };
        let (alpha, bravo) = (agent_host("i-alpha"), agent_host("i-bravo"));
        let hour = gpuledger_core::time::hour_floor(now_ms()) - 2 * HOUR_MS;
        write_ledger(
            &api,
            &[
                (hour, alpha, "alpha", "used", "1".parse().unwrap()),
                (hour, bravo, "bravo", "used", "1".parse().unwrap()),
            ],
        )
        .await;
        let viewer = scoped_session(&api, "alec", r#"["alpha"]"#).await;
        // The fleet: alpha's host with alpha's job; the bravo job beside it is not shown.
        let (status, fleet) = api.get_as("/", Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(
            fleet.contains("i-alpha") && fleet.contains("alpha-job"),
            "{b}"
        );
        assert!(!fleet.contains("bravo"), "{b}");
        let (_, everything) = api.get_as("/", Some(&admin)).await;
        assert!(
            everything.contains("bravo-job") && everything.contains("i-bravo"),
            "{b}"
        );
    }
}

#[tokio::test]
async fn scoped_tokens_are_made_listed_and_refused_when_malformed() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let (admin, csrf) = api.session("admin").await;
        let (status, _, body) = api
            .post_form(
                "/tokens/read",
                &admin,
                &format!("csrf={csrf}&name=serving-bi&teams=serving%2C+research"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(body.contains("it reads research, serving"), "{b}");
        let token = crate::read_tokens::list(api.store.as_ref())
            .await
            .unwrap()
            .into_iter()
            .find(|t| t.name == "serving-bi")
            .unwrap();
        assert_eq!(
            crate::read_tokens::scope_of(&token).describe(),
            "research, serving"
        );
        let (status, _, body) = api
            .post_form(
                "/tokens/read",
                &admin,
                &format!("csrf={csrf}&name=bad-bi&teams=ok%2C%07"),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(body.contains("is not a team name"), "{b}: {body:.300}");
        assert!(
            !crate::read_tokens::list(api.store.as_ref())
                .await
                .unwrap()
                .iter()
                .any(|t| t.name == "bad-bi"),
            "{b}: nothing stored"
        );
    }
}

/// One rule for idle money on every page: idle time is a team's when the ledger gave it that
/// team. A host alpha ran a job on two hours ago, idle since with no process on a cluster no
/// team owns, is the whole fleet's idle: alpha's viewer sees it on no page (the fleet, the
/// incidents, the idle history, the review), as alpha's review counts none of its idle
/// dollars; the admin sees it everywhere.
#[tokio::test]
async fn idle_that_names_no_team_is_on_no_teams_page() {
    use gpuledger_proto::{GpuWindow, ProcessWindow, Window};
    for (api, _db) in apis().await {
        let b = api.backend;
        let now = now_ms();
        let window = |start: i64, busy: bool| Window {
            start_ms: start,
            end_ms: start + 15 * 60_000,
            samples: 15,
            serving: Vec::new(),
            gpus: vec![GpuWindow {
                uuid: "GPU-scratch".into(),
                name: "NVIDIA L4".into(),
                memory_total_bytes: Some(24_000_000_000),
                memory_used_max_bytes: Some(if busy { 8_000_000_000 } else { 0 }),
                util_avg: Some(if busy { 90.0 } else { 0.0 }),
                util_max: Some(if busy { 95.0 } else { 0.0 }),
                processes: if busy {
                    vec![ProcessWindow {
                        pid: 7,
                        name: Some("load-test".into()),
                        memory_used_max_bytes: Some(8_000_000_000),
                        sm_util_avg: Some(90.0),
                        labels: [("team".to_owned(), "alpha".to_owned())].into(),
                        ..Default::default()
                    }]
                } else {
                    Vec::new()
                },
                ..Default::default()
            }],
        };
        let mut r = super::tests::report("scratch-1");
        r.host.hostname = "scratch-node".into();
        let start = gpuledger_core::time::hour_floor(now) - 2 * HOUR_MS;
        r.windows = (0..4)
            .map(|i| window(start + i * 15 * 60_000, true))
            .collect();
        r.windows
            .extend((4..8).map(|i| window(start + i * 15 * 60_000, false)));
        let (status, body) = api
            .post(Some(&api.token), serde_json::to_vec(&r).unwrap())
            .await;
        assert!(
            status.is_success(),
            "{b}: {}",
            String::from_utf8_lossy(&body)
        );
        crate::test_support::roll_up(api.store.as_ref()).await;
        let (admin, _) = api.session("admin").await;
        let alpha = scoped_session(&api, "alice", r#"["alpha"]"#).await;
        // The run's hours, which early on the 1st are last month's (the default is this one).
        let history = &format!(
            "/api/v1/idle/history?from={}&to={}",
            gpuledger_core::time::rfc3339(start),
            gpuledger_core::time::rfc3339(start + 3 * HOUR_MS)
        );
        let (_, all) = api.get_as(history, Some(&admin)).await;
        assert!(
            all.contains("scratch-node"),
            "{b}: the admin sees the idle run: {all}"
        );
        let (_, fleet) = api.get_as("/", Some(&admin)).await;
        assert!(fleet.contains("scratch-node"), "{b}");

        let (_, theirs) = api.get_as(history, Some(&alpha)).await;
        let runs: serde_json::Value = serde_json::from_str(&theirs).unwrap();
        assert_eq!(runs["episodes"], serde_json::json!([]), "{b}: {theirs}");
        for page in ["/", "/incidents"] {
            let (status, body) = api.get_as(page, Some(&alpha)).await;
            assert_eq!(status, StatusCode::OK, "{b}: {page}");
            assert!(
                !body.contains("scratch-node"),
                "{b}: {page} shows the fleet's idle host"
            );
        }
        // Alpha's review: its load test's dollars, and no idle.
        let month = gpuledger_core::time::month_label(start);
        let (_, review) = api.get_as(&format!("/review/{month}"), Some(&alpha)).await;
        let doc = scraper::Html::parse_document(&review);
        let sel = scraper::Selector::parse("section.headline a.big").unwrap();
        let figures: Vec<String> = doc.select(&sel).map(|a| a.text().collect()).collect();
        assert_ne!(figures[0], "$0.00", "{b}: alpha's work is its own");
        assert_eq!(figures[2], "$0.00", "{b}: the idle after it is not alpha's");
    }
}
