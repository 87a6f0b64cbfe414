//! Budgets through the API and the page: set by admins only, refused whole when wrong, and
//! each one's spend and forecast as the core computes them from the ledger's days; on both
//! backends.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rust_decimal::Decimal;
use tower::ServiceExt;

use super::tests::{apis, write_ledger, Api};
use crate::clock::now_ms;
use crate::store::telemetry::{add_billed_hosts, BilledHost};
use gpuledger_core::money::from_text;
use gpuledger_core::time::{day_floor, month_label, month_of, DAY_MS};

/// A host known from the bill alone (a p4d.24xlarge), for ledger rows to stand on; its id.
pub(super) async fn billed_host(api: &Api, resource_key: &str) -> i64 {
    add_billed_hosts(
        api.store.db(),
        &[BilledHost {
            resource_key: resource_key.into(),
            instance_type: Some("p4d.24xlarge".into()),
        }],
    )
    .await
    .unwrap();
    crate::store::telemetry::hosts(api.store.db())
        .await
        .unwrap()
        .into_iter()
        .find(|h| h.hostname == resource_key)
        .map_or_else(|| panic!("no host for {resource_key}"), |h| h.id)
}

/// `METHOD path` with a JSON body, as `cookie`.
pub(super) async fn send(
    api: &Api,
    method: &str,
    path: &str,
    cookie: &str,
    body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .header("cookie", cookie)
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = api.app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

/// Each of the 35 days before today, and today: team a's weekly sweep (100 on Mondays, 10
/// otherwise) and team b's steady 5, one hourly row a day. Returns each team's cost per day.
async fn ledger(api: &Api) -> BTreeMap<&'static str, BTreeMap<i64, Decimal>> {
    let host = billed_host(api, "i-budget").await;
    let today = day_floor(now_ms());
    let (mut entries, mut daily) = (Vec::new(), BTreeMap::new());
    for i in 0..=35 {
        let day = today - i * DAY_MS;
        let monday =
            chrono::Datelike::weekday(&chrono::DateTime::from_timestamp_millis(day).unwrap())
                == chrono::Weekday::Mon;
        for (team, cost) in [("a", if monday { 100 } else { 10 }), ("b", 5)] {
            entries.push((day, host, team, "used", Decimal::from(cost)));
            daily
                .entry(team)
                .or_insert_with(BTreeMap::new)
                .insert(day, Decimal::from(cost));
        }
    }
    write_ledger(api, &entries).await;
    daily
}

fn d(v: &serde_json::Value) -> Decimal {
    from_text(v.as_str().unwrap_or_default())
}

#[tokio::test]
async fn budgets_are_set_by_admins_and_forecast_from_the_ledger() {
    let now = now_ms();
    let month = month_label(now);
    let (from, to) = month_of(now);
    for (api, _db) in apis().await {
        let b = api.backend;
        let (admin, admin_csrf) = api.session("admin").await;
        let (viewer, _) = api.session("viewer").await;
        let daily = ledger(&api).await;

        let set = |key: &str, amount: &str| serde_json::json!({"dimension": "team", "key": key, "amount": amount, "from_month": month});
        let (status, a) = send(&api, "PUT", "/api/v1/budgets", &admin, set("a", "1000")).await;
        assert_eq!(status, StatusCode::OK, "{b}: {a}");
        let (status, _) = send(&api, "PUT", "/api/v1/budgets", &admin, set("b", "0.01")).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let (status, _) = send(&api, "PUT", "/api/v1/budgets", &viewer, set("a", "5")).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{b}: viewers cannot set budgets"
        );

        // Refused whole, the field named: nothing of it stored.
        for (body, field) in [
            (set("nobody", "10"), "key"),
            (set("a", "-5"), "amount"),
            (set("a", "ten"), "amount"),
            (set("a", "0.0000000000000000000000000001"), "amount"),
            (
                serde_json::json!({"dimension": "team", "key": "a", "amount": "1", "currency": "EUR"}),
                "currency",
            ),
            (
                serde_json::json!({"dimension": "squad", "key": "a", "amount": "1"}),
                "dimension",
            ),
            (
                serde_json::json!({"dimension": "team", "key": "a", "amount": "1", "from_month": "2026-13"}),
                "from_month",
            ),
            (
                serde_json::json!({"dimension": "team", "key": "a", "amount": "1", "currency": "dollars"}),
                "currency",
            ),
        ] {
            let (status, e) = send(&api, "PUT", "/api/v1/budgets", &admin, body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {body}: {e}");
            assert_eq!(e["field"], field, "{b}: {body}: {e}");
        }

        let (status, body) = api
            .get_as(&format!("/api/v1/budgets?month={month}"), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let budgets = v["budgets"].as_array().unwrap();
        assert_eq!(budgets.len(), 2, "{b}: {v}");
        // Team b, with a budget of a cent, is past it (or heading past it on the 1st): first.
        assert_eq!(budgets[0]["key"], "b", "{b}: most at risk first");
        let first_day = *daily["a"].keys().next().unwrap();
        for row in budgets {
            let team = row["key"].as_str().unwrap();
            let want =
                gpuledger_core::budget::forecast(&daily[team], (from, to), first_day, now_ms());
            assert_eq!(
                [
                    d(&row["spent"]),
                    d(&row["expected"]),
                    d(&row["low"]),
                    d(&row["high"])
                ],
                [want.spent, want.expected, want.low, want.high],
                "{b}: {team}: {row}"
            );
            assert!(d(&row["expected"]) >= d(&row["spent"]), "{b}");
            assert_eq!(row["basis_days"], 28, "{b}: four weeks of pattern");
        }
        assert_eq!(budgets[1]["standing"], "on_track", "{b}: {v}");
        assert_eq!(budgets[1]["set_by"], "admin-user", "{b}");

        // Next month, not begun: nothing spent and nothing forecast (a pattern of weeks before
        // it says nothing of a month that has not run), whatever the recent weeks cost.
        let next = month_label(to);
        let (status, later) = send(
            &api,
            "PUT",
            "/api/v1/budgets",
            &admin,
            serde_json::json!({"dimension": "team", "key": "a", "amount": "900", "from_month": next}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{b}: {later}");
        assert_eq!(
            [d(&later["spent"]), d(&later["expected"]), d(&later["high"])],
            [Decimal::ZERO; 3],
            "{b}: {later}"
        );
        assert_eq!(later["standing"], "not_begun", "{b}: {later}");
        let recent = gpuledger_core::budget::forecast(&daily["a"], (from, to), first_day, now_ms());
        assert!(
            recent.expected > Decimal::ZERO,
            "{b}: the weeks before did cost"
        );
        let (_, page) = api
            .get_as(&format!("/budgets?month={next}"), Some(&viewer))
            .await;
        assert!(page.contains("the month has not begun"), "{b}");

        // The review says how the month's budgets stand, and links here.
        let (status, review) = api.get_as(&format!("/review/{month}"), Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(
            review.contains("of 2 budgets over") && review.contains("1 on track"),
            "{b}: the review's budget line"
        );

        // The page: every budget, most at risk first; the form for admins only.
        let (status, page) = api.get_as("/budgets", Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(
            page.contains("heading over") || page.contains("over budget"),
            "{b}"
        );
        assert!(
            !page.contains("action=\"/budgets\""),
            "{b}: no form for viewers"
        );
        let (_, page) = api.get_as("/budgets", Some(&admin)).await;
        assert!(page.contains("action=\"/budgets\""), "{b}");
        let (status, _, body) = api
            .post_form(
                "/budgets",
                &admin,
                &format!("csrf={admin_csrf}&dimension=team&key=nobody&amount=5&from_month={month}"),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(body.contains("no cost was attributed to team"), "{b}");
        let (status, _, _) = api
            .post_form(
                "/budgets",
                &admin,
                &format!(
                    "csrf={admin_csrf}&dimension=team&key=a&amount=2500.50&from_month={month}"
                ),
            )
            .await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{b}");
        let (status, _, _) = api
            .post_form(
                "/budgets",
                &admin,
                &format!("csrf=forged&dimension=team&key=a&amount=1&from_month={month}"),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{b}: a forged form changes nothing"
        );
        let (_, body) = api.get_as("/api/v1/budgets", Some(&viewer)).await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let a = v["budgets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == "a")
            .unwrap()
            .clone();
        assert_eq!(d(&a["amount"]), from_text("2500.50"), "{b}: {a}");

        // A write another site's page sends is refused, whatever its cookie; this site's is not.
        for (name, value) in [
            ("origin", "https://evil.example"),
            ("sec-fetch-site", "cross-site"),
        ] {
            let req = Request::builder()
                .method("PUT")
                .uri("/api/v1/budgets")
                .header("content-type", "application/json")
                .header("cookie", &admin)
                .header("host", "gpuledger.test")
                .header(name, value)
                .body(Body::from(set("a", "1").to_string()))
                .unwrap();
            let resp = api.app.clone().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{b}: {name}: {value}");
        }
        let req = Request::builder()
            .method("PUT")
            .uri("/api/v1/budgets")
            .header("content-type", "application/json")
            .header("cookie", &admin)
            .header("host", "gpuledger.test")
            .header("origin", "https://gpuledger.test")
            .header("sec-fetch-site", "same-origin")
            .body(Body::from(set("a", "2500.50").to_string()))
            .unwrap();
        let resp = api.app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{b}: from this site");

        // Removed: 204, then 404.
        let gone = serde_json::json!({"dimension": "team", "key": "b", "from_month": month});
        let (status, _) = send(&api, "DELETE", "/api/v1/budgets", &admin, gone.clone()).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{b}");
        let (status, _) = send(&api, "DELETE", "/api/v1/budgets", &admin, gone).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{b}");
        let (_, body) = api.get_as("/api/v1/budgets", Some(&viewer)).await;
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap()["budgets"]
                .as_array()
                .unwrap()
                .len(),
            1,
            "{b}"
        );
    }
}

/// Each threshold reached is announced once per owner and month, in the owner's route: a team's
/// budget of a cent is past 80% and 100% spent and forecast (one message for each measure, about
/// the highest); team a, well within its budget, says nothing; a second run sends nothing.
#[tokio::test]
async fn budget_thresholds_reach_slack_once() {
    let config: crate::config::Config = toml::from_str(
        r#"
[slack]
default_webhook = "https://hooks.slack.com/services/T/B/default"
[[slack.routes]]
team = "b"
webhook = "https://hooks.slack.com/services/T/B/team-b"
"#,
    )
    .unwrap();
    let shared = std::sync::Arc::new(config.clone());
    let month = month_label(now_ms());
    for (api, _db) in super::tests::apis_with(|s| s.config = shared.clone()).await {
        let b = api.backend;
        let (admin, _) = api.session("admin").await;
        ledger(&api).await;
        for (key, amount) in [("a", "100000"), ("b", "0.01")] {
            let (status, v) = send(
                &api,
                "PUT",
                "/api/v1/budgets",
                &admin,
                serde_json::json!({"dimension": "team", "key": key, "amount": amount, "from_month": month}),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{b}: {v}");
        }
        let queued = crate::budgets::alert(api.store.as_ref(), &config, now_ms())
            .await
            .unwrap();
        assert_eq!(queued, 2, "{b}: spent and forecast, team b only");
        let again = crate::budgets::alert(api.store.as_ref(), &config, now_ms())
            .await
            .unwrap();
        assert_eq!(again, 0, "{b}: each threshold once per month");
        let sent = crate::store::alerts::slack_history(api.store.db(), 10)
            .await
            .unwrap();
        assert_eq!(sent.len(), 2, "{b}");
        for m in &sent {
            assert_eq!(
                (m.event.as_str(), m.route.as_str()),
                ("budget", "team:b"),
                "{b}"
            );
            assert!(
                m.payload.contains("team b") && m.payload.contains("100%"),
                "{b}: {}",
                m.payload
            );
        }
    }
}
