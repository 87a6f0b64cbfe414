//! Why spend changed, through the API, the CSV and the review: each owner's change in volume,
//! idle, mix and price that add up to it, and the rows to the month's change; on both backends.

use axum::http::StatusCode;
use rust_decimal::Decimal;
use scraper::{Html, Selector};

use super::tests::{apis, write_ledger, Api};
use crate::clock::now_ms;
use crate::store::telemetry::{add_billed_hosts, BilledHost};
use gpuledger_core::money::from_text;
use gpuledger_core::time::{month_label, month_start_ms, HOUR_MS};

/// `(host, team, kind, cost per hour, hours)`: that many hourly rows from the month's start.
type Use = (i64, &'static str, &'static str, &'static str, i64);

async fn month_of_rows(api: &Api, month: i64, uses: &[Use]) {
    let mut entries = Vec::new();
    for &(host, team, kind, rate, hours) in uses {
        for h in 0..hours {
            entries.push((month + h * HOUR_MS, host, team, kind, from_text(rate)));
        }
    }
    write_ledger(api, &entries).await;
}

async fn json(api: &Api, cookie: &str, query: &str) -> (StatusCode, serde_json::Value) {
    let (status, body) = api
        .get_as(&format!("/api/v1/variance?{query}"), Some(cookie))
        .await;
    (status, serde_json::from_str(&body).unwrap_or_default())
}

fn d(v: &serde_json::Value) -> Decimal {
    from_text(v.as_str().unwrap_or_default())
}

#[tokio::test]
async fn the_change_is_explained_in_parts_that_add_up() {
    let this = month_start_ms(now_ms());
    let last = month_start_ms(this - 1);
    let before = month_start_ms(last - 1);
    for (api, _db) in apis().await {
        let b = api.backend;
        let (viewer, _) = api.session("viewer").await;
        let hosts = [
            BilledHost {
                resource_key: "i-p4d".into(),
                instance_type: Some("p4d.24xlarge".into()),
            },
            BilledHost {
                resource_key: "i-g5".into(),
                instance_type: Some("g5.xlarge".into()),
            },
        ];
        add_billed_hosts(api.store.db(), &hosts).await.unwrap();
        let ids = crate::store::telemetry::hosts(api.store.db())
            .await
            .unwrap();
        let id = |key: &str| {
            ids.iter()
                .find(|h| h.instance_key.as_deref() == Some(key))
                .unwrap()
                .id
        };
        let (p4d, g5) = (id("i-p4d"), id("i-g5"));
        month_of_rows(
            &api,
            before,
            &[
                (p4d, "a", "used", "10", 10),
                (g5, "b", "used", "2", 5),
                (p4d, "", "idle", "10", 2),
            ],
        )
        .await;
        // Team a moves most of its work to the cheaper g5 and holds a p4d idle for an hour;
        // team b pays more for the same hours; team c is new; twice the idle time.
        month_of_rows(
            &api,
            last,
            &[
                (p4d, "a", "used", "10", 5),
                (g5, "a", "used", "2", 10),
                (p4d, "a", "held_idle", "10", 1),
                (g5, "b", "used", "3", 5),
                (g5, "c", "used", "2", 2),
                (p4d, "", "idle", "10", 4),
            ],
        )
        .await;

        let month = month_label(last);
        let (status, v) = json(&api, &viewer, &format!("month={month}")).await;
        assert_eq!(status, StatusCode::OK, "{b}: {v}");
        assert_eq!(v["by"], "team", "{b}");
        assert_eq!(
            v["month_to_date"], false,
            "{b}: a whole month against a whole month"
        );
        let row = |key: &str| -> [Decimal; 5] {
            let r = v["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["key"] == key)
                .unwrap_or_else(|| panic!("{b}: no {key}: {v}"));
            ["change", "volume", "idle", "mix", "price"].map(|f| d(&r[f]))
        };
        let n = |i: i64| Decimal::from(i);
        assert_eq!(row("a"), [n(-20), n(50), n(10), n(-80), n(0)], "{b}");
        assert_eq!(row("b"), [n(5), n(0), n(0), n(0), n(5)], "{b}");
        assert_eq!(row("c"), [n(4), n(4), n(0), n(0), n(0)], "{b}");
        assert_eq!(row("(idle)"), [n(20), n(0), n(20), n(0), n(0)], "{b}");
        for r in v["rows"].as_array().unwrap() {
            let [change, volume, idle, mix, price] =
                ["change", "volume", "idle", "mix", "price"].map(|f| d(&r[f]));
            assert_eq!(volume + idle + mix + price, change, "{b}: {r}");
        }
        assert_eq!(d(&v["total"]["change"]), n(9), "{b}: {v}");
        assert_eq!(d(&v["total"]["previous_cost"]), n(130), "{b}");

        // The CSV: a row per team and the whole change.
        let (status, csv) = api
            .get_as(
                &format!("/api/v1/variance?month={month}&format=csv"),
                Some(&viewer),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let lines: Vec<&str> = csv.lines().collect();
        assert!(
            lines[0].starts_with("team,currency,previous_cost,cost,change,volume"),
            "{b}"
        );
        assert_eq!(lines.len(), 6, "{b}: {csv}");
        assert!(lines[5].starts_with("(all),USD,130,139,9,"), "{b}: {csv}");

        // By instance type: team a's move shows as less p4d and more g5.
        let (_, by_type) = json(&api, &viewer, &format!("month={month}&by=instance_type")).await;
        assert_eq!(d(&by_type["total"]["change"]), n(9), "{b}: {by_type}");

        // The review shows the same, rounded to the cent, the parts adding up as shown.
        let (status, page) = api.get_as(&format!("/review/{month}"), Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let doc = Html::parse_document(&page);
        let sel = |s: &str| Selector::parse(s).unwrap();
        let cells = |tr: scraper::ElementRef| -> Vec<String> {
            tr.select(&sel("td"))
                .map(|td| td.text().collect::<String>().trim().to_owned())
                .collect()
        };
        let table = doc
            .select(&sel("table.variance"))
            .next()
            .unwrap_or_else(|| panic!("{b}: no variance table"));
        let rows: Vec<Vec<String>> = table.select(&sel("tbody tr")).map(cells).collect();
        let a = rows.iter().find(|r| r[0] == "a").unwrap();
        assert_eq!(
            a[1..].to_vec(),
            [
                "$100.00",
                "$80.00",
                "−$20.00",
                "$50.00",
                "$10.00",
                "−$80.00",
                "$0.00"
            ],
            "{b}"
        );
        let total = cells(table.select(&sel("tfoot tr")).next().unwrap());
        assert_eq!(total[3], "$9.00", "{b}: {total:?}");
        assert!(page.contains("Why spend changed, by team"), "{b}");

        // Bad input is named.
        let (status, e) = json(&api, &viewer, "month=2026-13").await;
        assert_eq!(
            (status, e["field"].as_str()),
            (StatusCode::BAD_REQUEST, Some("month")),
            "{b}"
        );
        let (status, e) = json(&api, &viewer, &format!("month={month}&by=tema")).await;
        assert_eq!(
            (status, e["field"].as_str()),
            (StatusCode::BAD_REQUEST, Some("by")),
            "{b}"
        );
        let (status, _) = api
            .get_as(&format!("/api/v1/variance?month={month}"), None)
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{b}: signed in only");
    }
}
