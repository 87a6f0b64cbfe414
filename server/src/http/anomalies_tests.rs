//! Anomalies through the API and the review: found from the ledger for everyone signed in,
//! dismissed by admins only (recorded with who and why, once), writes from other sites refused,
//! bad input answered with the field at fault; on both backends.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rust_decimal::Decimal;
use tower::ServiceExt;

use super::budgets_tests::{billed_host, send};
use super::tests::{apis, write_ledger};
use crate::clock::now_ms;
use gpuledger_core::time::{day_floor, month_label, rfc3339, DAY_MS};

#[tokio::test]
async fn anomalies_are_listed_for_all_and_dismissed_by_admins_once() {
    let today = day_floor(now_ms());
    let yesterday = today - DAY_MS;
    let month = month_label(yesterday);
    let start = rfc3339(yesterday)[..10].to_owned();
    for (api, _db) in apis().await {
        let b = api.backend;
        let host = billed_host(&api, "i-anomaly").await;
        // Five weeks of team a at 100 a day and team b at 10; yesterday team a spent 1000.
        let mut entries = Vec::new();
        for i in 1..=35 {
            let day = today - i * DAY_MS;
            let a = if day == yesterday { 1000 } else { 100 };
            entries.push((day, host, "a", "used", Decimal::from(a)));
            entries.push((day, host, "b", "used", Decimal::from(10)));
        }
        write_ledger(&api, &entries).await;
        let (viewer, _) = api.session("viewer").await;
        let (admin, _) = api.session("admin").await;

        let (status, body) = api
            .get_as(&format!("/api/v1/anomalies?month={month}"), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{b}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let found = v["anomalies"].as_array().unwrap();
        assert_eq!(found.len(), 1, "{b}: {v}");
        let a = &found[0];
        assert_eq!(
            (&a["dimension"], &a["key"], &a["kind"], &a["start_ms"]),
            (
                &serde_json::json!("team"),
                &serde_json::json!("a"),
                &serde_json::json!("spike"),
                &serde_json::json!(yesterday)
            ),
            "{b}: {a}"
        );
        assert_eq!(
            (&a["expected"], &a["actual"]),
            (&serde_json::json!("100"), &serde_json::json!("1000")),
            "{b}"
        );
        assert_eq!(
            a["drivers"][0]["gpus"][0],
            format!("GPU-{host}"),
            "{b}: {a}"
        );
        assert_eq!(a["dismissed"], serde_json::Value::Null, "{b}");

        let (status, body) = api
            .get_as("/api/v1/anomalies?month=2026-13", Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {body}");
        assert!(body.contains("\"field\":\"month\""), "{b}: {body}");

        let ask = |start: &str| {
            serde_json::json!({"dimension": "team", "key": "a", "currency": "USD", "start": start,
                               "reason": "the quarterly eval, planned"})
        };
        // Viewers may not; another site's page may not, whatever its cookie.
        let (status, _) = send(
            &api,
            "POST",
            "/api/v1/anomalies/dismiss",
            &viewer,
            ask(&start),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{b}");
        let req = Request::builder()
            .method("POST")
            .uri("/api/v1/anomalies/dismiss")
            .header("content-type", "application/json")
            .header("cookie", &admin)
            .header("host", "gpuledger.test")
            .header("sec-fetch-site", "cross-site")
            .body(Body::from(ask(&start).to_string()))
            .unwrap();
        let resp = api.app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{b}: cross-site");
        // Bad input: the field at fault, nothing recorded.
        let with = |field: &str, value: &str| {
            let mut body = ask(&start);
            body[field] = serde_json::json!(value);
            body
        };
        for (body, field) in [
            (ask("yesterday"), "start"),
            (with("dimension", "gpu"), "dimension"),
            (with("key", " "), "key"),
            (with("currency", "dollars"), "currency"),
            (
                serde_json::json!({"dimension": "team", "key": "a", "currency": "USD",
                                   "start": start, "reason": "x".repeat(501)}),
                "reason",
            ),
        ] {
            let (status, v) = send(&api, "POST", "/api/v1/anomalies/dismiss", &admin, body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {v}");
            assert_eq!(v["field"], field, "{b}: {v}");
        }
        let (status, v) = send(
            &api,
            "POST",
            "/api/v1/anomalies/dismiss",
            &admin,
            ask(&rfc3339(today - 3 * DAY_MS)[..10]),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{b}: {v}");
        let (status, v) = send(
            &api,
            "POST",
            "/api/v1/anomalies/dismiss",
            &admin,
            serde_json::json!({"dimension": 3}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {v}");

        let (status, v) = send(
            &api,
            "POST",
            "/api/v1/anomalies/dismiss",
            &admin,
            ask(&start),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{b}: {v}");
        assert_eq!(v["dismissed_by"], "admin-user", "{b}: {v}");
        let (status, v) = send(
            &api,
            "POST",
            "/api/v1/anomalies/dismiss",
            &admin,
            ask(&start),
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{b}: {v}");
        assert!(
            v["message"].as_str().unwrap().contains("admin-user"),
            "{b}: {v}"
        );

        let (_, body) = api
            .get_as(&format!("/api/v1/anomalies?month={month}"), Some(&viewer))
            .await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["anomalies"][0]["dismissed"]["by"], "admin-user",
            "{b}: {v}"
        );
        assert_eq!(
            v["anomalies"][0]["dismissed"]["reason"], "the quarterly eval, planned",
            "{b}"
        );

        // The review lists it, dismissed, with its driver.
        let (status, page) = api.get_as(&format!("/review/{month}"), Some(&admin)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(page.contains("id=\"anomalies\""), "{b}");
        assert!(
            page.contains("team a") && page.contains("dismissed by admin-user"),
            "{b}"
        );
        assert!(page.contains(&format!("GPU-{host}")), "{b}");
    }
}
