//! The same right figure on every view. Every page, API answer and CSV a viewer is served,
//! whatever it was served from (kept sections, kept ledger reads, stored recommendations, the
//! cost gauges' cache), must equal what the same view answers when everything is computed
//! afresh from the ledger ([`crate::sections::afresh`]): at the moments a kept copy can go
//! wrong (the first view, a later one, after the job refreshed the month under way, after a
//! roll-up of new hours, after a late bill, after the month closed), for whoever sees every
//! team and for a team's viewer, on both databases. The fleet is the demo's (commitments,
//! spot, hours after the bill's last line) and a generated one beside it (a second currency
//! with its own savings plan, MIG slices, an owned host no bill covers).
//!
//! Cross-page identities are checked at the same moments: the review's headline is the
//! allocation API's total and the reconciliation's parts, its idle figures the idle history's;
//! `/incidents`' idle dollars are the idle history's; every "a month" figure of the
//! recommendations is a month's worth of what it scales. On PostgreSQL, the same views are
//! read from a streaming standby once it has caught up, against the primary's fresh answers.
//!
//! Pages are found as a person finds them: from the month's reviews and the other pages,
//! following every link a page holds, so a figure that opens a page is checked there too.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use gpuledger_proto::{GpuWindow, HostInfo, MigPlacement, ProcessWindow, Report, Window};
use tower::ServiceExt;

use super::security_tests::{Access, ROUTES};
use super::{router, AppState};
use crate::auth::{generate_token, hash_token};
use crate::store::tokens::NewToken;
use crate::store::{self, AgentStatus, Store};
use crate::{clock, sections, test_support};
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::{month_label, month_start_ms, rfc3339, DAY_MS, HOUR_MS};

/// Sunday 22 November 2026, 10:30 UTC: three weeks into the month, October closed.
const NOW: i64 = 1_795_343_400_000;

/// Pages a crawl visits at most, per viewer and moment.
const MAX_PAGES: usize = 400;
/// Addresses of one kind a crawl visits at most (drill-downs of one dimension in one month,
/// say): every kind is checked, not every key of a fleet.
const PER_KIND: usize = 3;

/// Who views, and how they sign in.
struct Viewer {
    name: &'static str,
    cookie: String,
    /// A read-only token of the same scope, for `/metrics`.
    read_token: String,
    /// Whether the viewer is held to some teams.
    scoped: bool,
}

/// A view's answer: its status and body (a redirect's target instead of a body).
#[derive(PartialEq)]
struct Answer {
    status: StatusCode,
    body: String,
}

async fn view(app: &Router, viewer: &Viewer, path: &str, at: i64, afresh: bool) -> Answer {
    let mut req = Request::get(path);
    req = if path.starts_with("/metrics") {
        req.header("authorization", format!("Bearer {}", viewer.read_token))
    } else {
        req.header("cookie", &viewer.cookie)
    };
    // On the heap: the review's future is deep, and a test thread's stack is small.
    let call = Box::pin(app.clone().oneshot(req.body(Body::empty()).unwrap()));
    let resp = if afresh {
        Box::pin(clock::at(at, sections::afresh(call))).await
    } else {
        Box::pin(clock::at(at, call)).await
    }
    .unwrap();
    let status = resp.status();
    let location = resp
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let body = if status.is_redirection() {
        location
    } else {
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Answer { status, body }
}

/// The same-site links of a page (`href="/…"`), as a client would follow them.
fn links(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in body.split("href=\"").skip(1) {
        let Some(end) = part.find('"') else { continue };
        let href = part[..end].replace("&amp;", "&");
        let href = href.split('#').next().unwrap_or_default().to_owned();
        if href.starts_with('/') && !href.starts_with("//") && followed(&href) {
            out.push(href);
        }
    }
    out
}

/// What kind of address `href` is: its path and its query's parameter names, with the values
/// of those that choose what is shown (`by`, `step`, `format`, …) but not of those that name
/// a key or a range.
fn kind(href: &str) -> String {
    const CHOOSE: [&str; 5] = ["by", "step", "format", "month", "lookback"];
    let (path, query) = href.split_once('?').unwrap_or((href, ""));
    let mut params: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((name, _)) if !CHOOSE.contains(&name) => name,
            _ => p,
        })
        .collect();
    params.sort_unstable();
    format!("{path}?{}", params.join("&"))
}

/// Pages whose answer is a figure (or leads to one): not sign-in, assets or forms' targets.
fn followed(href: &str) -> bool {
    !["/login", "/logout", "/static/", "/api/v1/openapi.json"]
        .iter()
        .any(|p| href.starts_with(p))
}

/// Where the two answers first differ, in words: the text around the first difference.
fn difference(path: &str, served: &Answer, fresh: &Answer) -> String {
    if served.status != fresh.status {
        return format!(
            "{path}: served {} where afresh {}",
            served.status, fresh.status
        );
    }
    let (a, b) = (served.body.as_bytes(), fresh.body.as_bytes());
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let around = |text: &str| {
        let start = text.floor_char_boundary(at.saturating_sub(160));
        let end = text.ceil_char_boundary((at + 160).min(text.len()));
        text[start..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "{path}, at byte {at}:\n    served: …{}…\n    afresh: …{}…",
        around(&served.body),
        around(&fresh.body)
    )
}

/// Whether `href` stays within `months` (`YYYY-MM` anywhere in it): the crawl follows no
/// month navigation beyond the data's.
fn within(href: &str, months: &[String]) -> bool {
    let bytes = href.as_bytes();
    (0..bytes.len().saturating_sub(6)).all(|i| {
        let candidate = &href[i..i + 7];
        let is_month = candidate.bytes().enumerate().all(|(j, c)| {
            if j == 4 {
                c == b'-'
            } else {
                c.is_ascii_digit()
            }
        }) && (i == 0 || !bytes[i - 1].is_ascii_digit());
        !is_month || months.iter().any(|m| m == candidate)
    })
}

/// Every page reachable from `seeds` as `viewer` sees them at `at`, through links within
/// `months`, each viewed as served and then afresh; the differences, and the pages visited.
async fn crawl(
    (app, afresh): (&Router, &Router),
    viewer: &Viewer,
    (seeds, months): (&[String], &[String]),
    at: i64,
) -> (Vec<String>, BTreeSet<String>) {
    let mut queue: VecDeque<String> = seeds.iter().cloned().collect();
    let mut seen: BTreeSet<String> = queue.iter().cloned().collect();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut differences = Vec::new();
    while let Some(path) = queue.pop_front() {
        let served = Box::pin(view(app, viewer, &path, at, false)).await;
        let fresh = Box::pin(view(afresh, viewer, &path, at, true)).await;
        // A page read from the replica says so, and as of when: the only words it may add.
        let served = Answer {
            body: without_replica_words(&served.body),
            ..served
        };
        assert!(
            served.status != StatusCode::INTERNAL_SERVER_ERROR
                && served.status != StatusCode::SERVICE_UNAVAILABLE,
            "{} at {}: {path} answered {}: {}",
            viewer.name,
            rfc3339(at),
            served.status,
            served.body.chars().take(400).collect::<String>()
        );
        if served != fresh {
            differences.push(difference(&path, &served, &fresh));
        }
        if path.starts_with("/api/") && served.status == StatusCode::OK {
            if let Ok(json) = serde_json::from_str::<serde_json::Value>(&served.body) {
                let mut unnamed = Vec::new();
                money_without_currency(&json, "", false, &mut unnamed);
                if !unnamed.is_empty() {
                    differences.push(format!(
                        "{path}: money that names no currency (the fleet bills in two): {}",
                        unnamed.join(", ")
                    ));
                }
            }
        }
        for link in links(&served.body) {
            if seen.len() >= MAX_PAGES || seen.contains(&link) || !within(&link, months) {
                continue;
            }
            let of_kind = kinds.entry(kind(&link)).or_default();
            if *of_kind < PER_KIND {
                *of_kind += 1;
                seen.insert(link.clone());
                queue.push_back(link);
            }
        }
    }
    (differences, seen)
}

/// What a view read from the replica adds to the same view read from the primary: the
/// page's "Figures as of … (read replica)" (under the heading and in the printed footer) and
/// `/metrics`' replica gauges. Everything else must be the same.
fn without_replica_words(body: &str) -> String {
    const MARK: &str = " (read replica)";
    let mut out = body.to_owned();
    while let Some(end) = out.find(MARK) {
        let Some(start) = out[..end].rfind("Figures as of ") else {
            break;
        };
        let words = out[start..end + MARK.len()].to_owned();
        out = out
            .replace(&format!("<p class=\"freshness\">{words}</p>"), "")
            .replace(&format!(" ({words})"), "")
            .replace(&words, "");
    }
    if out.contains("gpuledger_read_replica_") {
        out = out
            .split_inclusive('\n')
            .filter(|line| !line.contains("gpuledger_read_replica_"))
            .collect();
    }
    out
}

/// The app reading from the PostgreSQL standby `scripts/with-postgres` starts beside the
/// primary, once the standby has replayed all the primary wrote (polled as the server polls
/// it, at the views' moment `at`); `None` on SQLite.
async fn replica_app(
    db: &test_support::TestDb,
    store: &Arc<dyn Store>,
    state: &AppState,
    at: i64,
) -> Option<Router> {
    if db.backend != "postgres" {
        return None;
    }
    let standby = std::env::var("GPULEDGER_TEST_PG_STANDBY_URL").unwrap_or_else(|_| {
        panic!("GPULEDGER_TEST_PG_STANDBY_URL is not set: run the tests through scripts/test, which starts a streaming standby")
    });
    let name = db.url.rsplit('/').next().unwrap_or_default();
    let base = standby
        .rsplit_once('/')
        .map_or(standby.as_str(), |(b, _)| b);
    let url = format!("{base}/{name}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let read = loop {
        match crate::store::replica::ReplicaStore::connect(&url, store.clone()) {
            Ok(r) if store::replica::standby_state(r.db()).await.is_ok() => break r,
            _ if std::time::Instant::now() > deadline => panic!("the standby never had {name}"),
            _ => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    };
    let replica = Arc::new(crate::replica::Replica::new(
        Arc::new(read),
        store.clone(),
        std::time::Duration::from_secs(30),
    ));
    let mut state = state.clone();
    state.replica = Some(replica.clone());
    // Current once a poll finds it has replayed a position an earlier poll found the primary at.
    loop {
        replica.poll(at).await;
        if matches!(
            replica.read_from(None, at),
            crate::replica::ReadFrom::Replica { .. }
        ) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the standby never caught up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    Some(router(state))
}

/// A cross-page identity: the 30 days of idle dollars `/incidents` shows are the idle
/// history's for the same hours, to the cent, for this viewer. `None` when they agree.
async fn incidents_disagree_with_idle_history(
    app: &Router,
    viewer: &Viewer,
    at: i64,
) -> Option<String> {
    let page = Box::pin(view(app, viewer, "/incidents", at, false)).await;
    let (href, shown) = {
        let doc = scraper::Html::parse_document(&page.body);
        let sel = scraper::Selector::parse("p.summary a").ok()?;
        let Some(a) = doc.select(&sel).next() else {
            return Some(format!(
                "/incidents has no link to its idle dollars: {}",
                page.body
            ));
        };
        (
            a.value().attr("href").unwrap_or_default().to_owned(),
            a.text().collect::<String>(),
        )
    };
    let history = Box::pin(view(app, viewer, &href, at, false)).await;
    let json: serde_json::Value = serde_json::from_str(&history.body).ok()?;
    let mut sums: BTreeMap<String, rust_decimal::Decimal> = BTreeMap::new();
    for e in json["episodes"].as_array().into_iter().flatten() {
        let cost = gpuledger_core::money::from_text(e["cost"].as_str().unwrap_or("0"));
        *sums
            .entry(e["currency"].as_str().unwrap_or_default().to_owned())
            .or_default() += cost;
    }
    let expected = crate::format::money_sums(&sums);
    (shown != expected).then(|| {
        format!("/incidents shows {shown} idle over the last 30 days, {href} adds up to {expected}")
    })
}

/// A cross-page identity: the month's review, the allocation API its "GPU spend" links to and
/// (for whoever may read it) the reconciliation with the bill are one ledger: the headline is
/// the allocation's total in its currency, and each currency's allocation totals are the
/// reconciliation's attributed and estimated parts by kind, and its unattributed part, to the
/// micro-unit; the headline's idle and held-idle figures are the idle history's runs of the
/// month, for a team's viewer too. The differences, in words.
async fn review_allocation_and_bill_disagree(
    app: &Router,
    viewer: &Viewer,
    at: i64,
    (month, next): (&str, &str),
) -> Vec<String> {
    let mut out = Vec::new();
    let page = Box::pin(view(app, viewer, &format!("/review/{month}"), at, false)).await;
    // The headline: spend (linking to the allocation), change, idle, held idle, …
    let figures: Vec<(String, String)> = {
        let doc = scraper::Html::parse_document(&page.body);
        let Ok(sel) = scraper::Selector::parse("section.headline a.big") else {
            return vec!["bad selector".into()];
        };
        doc.select(&sel)
            .map(|a| {
                (
                    (a.value().attr("href").unwrap_or_default()).replace("&amp;", "&"),
                    a.text().collect::<String>(),
                )
            })
            .collect()
    };
    let Some((href, shown)) = figures.first().cloned() else {
        return vec![format!("/review/{month} has no headline")];
    };
    let allocation = Box::pin(view(app, viewer, &href, at, false)).await;
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&allocation.body) else {
        return vec![format!("{href} is not JSON: {}", allocation.body)];
    };
    let decimal =
        |v: &serde_json::Value| gpuledger_core::money::from_text(v.as_str().unwrap_or("0"));
    let totals: Vec<&serde_json::Value> = json["totals"].as_array().into_iter().flatten().collect();
    let matching = totals.iter().find(|t| {
        crate::format::money(
            decimal(&t["cost"]),
            t["currency"].as_str().unwrap_or_default(),
        ) == shown
    });
    let spent = totals.iter().any(|t| !decimal(&t["cost"]).is_zero());
    if matching.is_none()
        && (spent || shown != crate::format::money(rust_decimal::Decimal::ZERO, "USD"))
    {
        out.push(format!(
            "/review/{month} shows {shown} of GPU spend, {href} totals {}",
            json["totals"]
        ));
    }
    // Its idle and held-idle figures are the idle history's runs of the month, to the cent,
    // for this viewer: one rule says whose idle money is whose on every page.
    if let (Some(t), Some((_, idle)), Some((_, held))) = (matching, figures.get(2), figures.get(3))
    {
        let currency = t["currency"].as_str().unwrap_or_default();
        let history = Box::pin(view(
            app,
            viewer,
            &format!("/api/v1/idle/history?from={month}&to={next}"),
            at,
            false,
        ))
        .await;
        let runs: serde_json::Value = serde_json::from_str(&history.body).unwrap_or_default();
        let sum = |kind: &str| -> rust_decimal::Decimal {
            (runs["episodes"].as_array().into_iter().flatten())
                .filter(|e| e["kind"] == kind && e["currency"] == currency)
                .map(|e| decimal(&e["cost"]))
                .sum()
        };
        for (what, shown, kind) in [("idle", idle, "idle"), ("held idle", held, "held_idle")] {
            let history = crate::format::money(sum(kind), currency);
            if *shown != history {
                out.push(format!(
                    "/review/{month} shows {shown} {what}, its idle history {history}"
                ));
            }
        }
    }
    let reconciliation = Box::pin(view(
        app,
        viewer,
        &format!("/api/v1/billing/reconciliation?month={month}"),
        at,
        false,
    ))
    .await;
    // A team's reader may not read the whole bill (403); whoever sees every team must.
    if viewer.scoped {
        if reconciliation.status != StatusCode::FORBIDDEN {
            out.push(format!(
                "a team's reader got {} for the reconciliation",
                reconciliation.status
            ));
        }
        return out;
    }
    let Ok(bill) = serde_json::from_str::<serde_json::Value>(&reconciliation.body) else {
        out.push(format!(
            "the reconciliation of {month} is not JSON: {}",
            reconciliation.body
        ));
        return out;
    };
    let kinds = ["used", "held_idle", "idle", "unmonitored"];
    for t in totals {
        let currency = t["currency"].as_str().unwrap_or_default();
        let Some(r) = bill["currencies"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["currency"] == currency)
        else {
            if !decimal(&t["cost"]).is_zero() {
                out.push(format!(
                    "{month}: {currency} is in the allocation, not the reconciliation"
                ));
            }
            continue;
        };
        let part = |kind: &str| decimal(&r["attributed"][kind]) + decimal(&r["estimated"][kind]);
        let sides = [
            (
                "cost",
                decimal(&t["cost"]),
                kinds.iter().map(|k| part(k)).sum(),
            ),
            ("idle_cost", decimal(&t["idle_cost"]), part("idle")),
            (
                "held_idle_cost",
                decimal(&t["held_idle_cost"]),
                part("held_idle"),
            ),
            (
                "unmonitored_cost",
                decimal(&t["unmonitored_cost"]),
                part("unmonitored"),
            ),
            (
                "unattributed_cost",
                decimal(&t["unattributed_cost"]),
                decimal(&r["ledger_unattributed"]),
            ),
        ];
        for (field, allocated, reconciled) in sides {
            if allocated != reconciled {
                out.push(format!(
                    "{month} {currency}: the allocation's {field} is {allocated}, the \
                     reconciliation's {reconciled}"
                ));
            }
        }
    }
    out
}

/// A cross-page identity: every figure the recommendations call a month's is a month's worth
/// of the figure it scales, 730 hours at the rate of the days it was drawn from (to the cent
/// each is rounded to), for the month's review range and the default look-back: in the API's
/// JSON, in its CSV, and in the review's "What to change" table. The differences, in words.
async fn monthly_figures_are_not_a_months_worth(
    app: &Router,
    viewer: &Viewer,
    at: i64,
    month: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for path in [
        format!("/api/v1/recommendations?month={month}"),
        "/api/v1/recommendations".to_owned(),
    ] {
        let answer = Box::pin(view(app, viewer, &path, at, false)).await;
        if answer.status == StatusCode::OK {
            out.extend(json_months_worth(&path, &answer.body));
        }
        let path = format!(
            "{path}{}format=csv",
            if path.contains('?') { '&' } else { '?' }
        );
        let answer = Box::pin(view(app, viewer, &path, at, false)).await;
        if answer.status == StatusCode::OK {
            out.extend(csv_months_worth(&path, &answer.body));
        }
    }
    let path = format!("/review/{month}");
    let answer = Box::pin(view(app, viewer, &path, at, false)).await;
    if answer.status == StatusCode::OK {
        out.extend(review_months_worth(&path, &answer.body));
    }
    out
}

/// Whether `month_of` is a month's worth of `of` drawn over `days`: 730 hours at the same rate,
/// each rounded to the cent from its unrounded amount (half a cent of the look-back's figure,
/// scaled, and half a cent of the month's). The difference in words where it is not.
fn not_a_months_worth(
    (of, month_of): (rust_decimal::Decimal, rust_decimal::Decimal),
    days: f64,
) -> Option<String> {
    let scale = rust_decimal::Decimal::from_f64_retain(730.0 / (days * 24.0)).unwrap_or_default();
    let slack = rust_decimal::Decimal::new(5, 3) * (scale + rust_decimal::Decimal::ONE);
    ((of * scale - month_of).abs() > slack).then(|| {
        format!(
            "{month_of} is not a month of {of} over {days} days, {}",
            (of * scale).round_dp(2)
        )
    })
}

/// [`monthly_figures_are_not_a_months_worth`] on the recommendations' JSON.
fn json_months_worth(path: &str, body: &str) -> Vec<String> {
    let Ok(r) = serde_json::from_str::<serde_json::Value>(body) else {
        return vec![format!("{path} is not JSON")];
    };
    let days = r["lookback_days"].as_f64().unwrap_or_default();
    if days <= 0.0 {
        return Vec::new();
    }
    let decimal =
        |v: &serde_json::Value| gpuledger_core::money::from_text(v.as_str().unwrap_or("0"));
    let mut out = Vec::new();
    for kind in ["right_size", "consolidation", "release"] {
        for (i, item) in r[kind].as_array().into_iter().flatten().enumerate() {
            for field in ["cost", "saving", "frees_commitment"] {
                let monthly = &item[format!("monthly_{field}")];
                if monthly.is_null() {
                    continue;
                }
                if let Some(d) = not_a_months_worth((decimal(&item[field]), decimal(monthly)), days)
                {
                    out.push(format!("{path}: {kind}[{i}].monthly_{field}: {d}"));
                }
            }
        }
    }
    out
}

/// [`monthly_figures_are_not_a_months_worth`] on the recommendations' CSV: each row's
/// `monthly_*` columns against their figures over its `lookback_days` (an empty cell is a
/// figure with no monthly rate, a spot move's).
fn csv_months_worth(path: &str, body: &str) -> Vec<String> {
    let mut reader = csv::Reader::from_reader(body.as_bytes());
    let Ok(header) = reader.headers().cloned() else {
        return vec![format!("{path} has no CSV header")];
    };
    let column = |name: &str| header.iter().position(|h| h == name);
    let mut out = Vec::new();
    for (line, record) in reader.records().enumerate() {
        let Ok(record) = record else {
            out.push(format!("{path}: row {} is not CSV", line + 1));
            continue;
        };
        let cell = |name: &str| column(name).and_then(|i| record.get(i)).unwrap_or("");
        let days: f64 = cell("lookback_days").parse().unwrap_or_default();
        if days <= 0.0 {
            continue;
        }
        for field in ["cost", "saving", "frees_commitment"] {
            let monthly = cell(&format!("monthly_{field}"));
            if monthly.is_empty() {
                continue;
            }
            let of = gpuledger_core::money::from_text(cell(field));
            let month_of = gpuledger_core::money::from_text(monthly);
            if let Some(d) = not_a_months_worth((of, month_of), days) {
                out.push(format!(
                    "{path}: row {} ({} {}) monthly_{field}: {d}",
                    line + 1,
                    cell("kind"),
                    cell("key")
                ));
            }
        }
    }
    out
}

/// An amount as a page shows it (`$1,234.56`, `1,234.56 CHF`, `−$3.00`), as a decimal.
fn shown_money(text: &str) -> Option<rust_decimal::Decimal> {
    let negative = text.contains('−') || text.contains('-');
    let digits: String = text
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let d: rust_decimal::Decimal = digits.parse().ok()?;
    Some(if negative { -d } else { d })
}

/// A look-back as a page labels it (`7 days`, `6 days 11 hours`, `5 hours`), in days.
fn shown_days(text: &str) -> Option<f64> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut days = 0.0;
    for pair in words.chunks(2) {
        let [n, unit] = pair else { return None };
        let n: f64 = n.parse().ok()?;
        days += match unit.trim_end_matches('s') {
            "day" => n,
            "hour" => n / 24.0,
            _ => return None,
        };
    }
    (!words.is_empty()).then_some(days)
}

/// [`monthly_figures_are_not_a_months_worth`] on the review's "What to change" table: each
/// row's "A month at that rate" (and its commitment freed) against what it saved over the days
/// its header names.
fn review_months_worth(path: &str, html: &str) -> Vec<String> {
    let doc = scraper::Html::parse_document(html);
    let select = |s: &str| scraper::Selector::parse(s).ok();
    let (Some(th), Some(tr), Some(saving), Some(monthly), Some(frees)) = (
        select("table.savings thead th"),
        select("table.savings tbody tr"),
        select("td.saving"),
        select("td.monthly"),
        select("span.frees"),
    ) else {
        return vec!["a selector does not parse".into()];
    };
    let Some(days) = doc
        .select(&th)
        .map(|h| h.text().collect::<String>())
        .find_map(|h| shown_days(h.strip_prefix("Saved over ")?))
    else {
        return Vec::new();
    };
    // The cell's own amount is its first text; the commitment it frees is in its span.
    let amounts = |cell: scraper::ElementRef| {
        let own = cell.text().next().and_then(shown_money);
        let freed = cell
            .select(&frees)
            .next()
            .and_then(|s| shown_money(&s.text().collect::<String>()));
        (own, freed)
    };
    let mut out = Vec::new();
    for (i, row) in doc.select(&tr).enumerate() {
        let (Some(s), Some(m)) = (row.select(&saving).next(), row.select(&monthly).next()) else {
            continue;
        };
        let ((saved, saved_frees), (month, month_frees)) = (amounts(s), amounts(m));
        let what: String = row.text().take(1).collect();
        for (field, of, month_of) in [
            ("saving", saved, month),
            ("commitment freed", saved_frees, month_frees),
        ] {
            // "—" is a row with no monthly rate (a spot move's).
            let (Some(of), Some(month_of)) = (of, month_of) else {
                continue;
            };
            if let Some(d) = not_a_months_worth((of, month_of), days) {
                out.push(format!(
                    "{path}: What to change row {i} ({what}), {field}: {d}"
                ));
            }
        }
    }
    out
}

/// Whether a field holds money: costs, savings, totals, amounts.
fn is_money(key: &str) -> bool {
    [
        "cost",
        "saving",
        "amount",
        "billed",
        "effective",
        "spend",
        "budget",
        "forecast",
    ]
    .iter()
    .any(|word| {
        key == *word || key.ends_with(&format!("_{word}")) || key.starts_with(&format!("{word}_"))
    }) || key.ends_with("_total")
}

/// The money fields of a JSON answer (as paths) with no `currency` beside them or around
/// them: on a fleet billed in two currencies, such a figure cannot be read, or was added
/// across currencies.
fn money_without_currency(value: &serde_json::Value, at: &str, named: bool, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(fields) => {
            let named = named || fields.get("currency").is_some_and(|c| c.is_string());
            for (key, v) in fields {
                let here = format!("{at}.{key}");
                if is_money(key) && (v.is_string() || v.is_number()) && !named {
                    out.push(here.clone());
                }
                money_without_currency(v, &here, named, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate().take(3) {
                money_without_currency(v, &format!("{at}[{i}]"), named, out);
            }
        }
        _ => {}
    }
}

/// A route pattern's paths among `visited` (`{month}` and the like match one segment).
fn visits(pattern: &str, visited: &BTreeSet<String>) -> bool {
    let want: Vec<&str> = pattern.split('/').collect();
    visited.iter().any(|path| {
        let path = path.split('?').next().unwrap_or_default();
        let got: Vec<&str> = path.split('/').collect();
        got.len() == want.len()
            && want
                .iter()
                .zip(&got)
                .all(|(w, g)| (w.starts_with('{') && !g.is_empty()) || w == g)
    })
}

/// A signed-in person of `role` seeing `teams` (a JSON array, or every team), with a read
/// token of the same scope; sessions last through every moment viewed.
async fn viewer(store: &dyn Store, name: &'static str, role: &str, teams: Option<&str>) -> Viewer {
    let hash = crate::session::hash_password("correct horse battery").unwrap();
    store::accounts::create_user(store.db(), name, &hash, role, teams, NOW)
        .await
        .unwrap();
    let user = store::accounts::user_by_name(store.db(), name)
        .await
        .unwrap()
        .unwrap();
    let token = generate_token();
    store::accounts::create_session(
        store.db(),
        &hash_token(&token),
        user.id,
        "csrf",
        NOW,
        NOW + 60 * DAY_MS,
    )
    .await
    .unwrap();
    let scope = Scope::from_stored(teams);
    let read_token = crate::read_tokens::create(store, &format!("{name}-reads"), &scope, name, NOW)
        .await
        .unwrap();
    Viewer {
        name,
        cookie: format!("gpl_session={token}"),
        read_token,
        scoped: teams.is_some(),
    }
}

/// The generated fleet beside the demo's: `eu-mig`, an A100 in MIG mode billed in euros (a
/// 3g.40gb slice serving, a 2g.20gb one held by a notebook, two slices no instance holds), and
/// `onprem`, an L4 host no bill covers (priced from the rate card), training; each reporting
/// hourly from the start of last month. The euro bill stops three days before `now`.
async fn generated_fleet(store: &dyn Store, now: i64) {
    let start = month_start_ms(month_start_ms(now) - 1);
    let end = now - now.rem_euclid(HOUR_MS);
    for (cluster, host) in [("eu-mig", "mig-eu-00"), ("onprem", "owned-00")] {
        let name = format!("gen-{cluster}");
        store::tokens::create_token(
            store.db(),
            &NewToken::for_cluster(&name, &hash_token(&generate_token()), cluster),
            start,
        )
        .await
        .unwrap();
        let token = store::tokens::token_by_name(store.db(), &name)
            .await
            .unwrap()
            .unwrap()
            .id;
        let info = HostInfo {
            hostname: host.into(),
            cluster: cluster.into(),
            provider: Some(if cluster == "onprem" { "onprem" } else { "aws" }.into()),
            instance_id: (cluster == "eu-mig").then(|| "i-0e0e0e0e0e0e0e0e1".into()),
            instance_type: Some(
                if cluster == "onprem" {
                    "g6.xlarge"
                } else {
                    "p4d.24xlarge"
                }
                .into(),
            ),
            region: Some(
                if cluster == "onprem" {
                    "dc-1"
                } else {
                    "eu-west-1"
                }
                .into(),
            ),
            lifecycle: Some("on_demand".into()),
        };
        let mut t = start;
        while t < end {
            let day_end = (t + DAY_MS).min(end);
            let mut windows = Vec::new();
            while t < day_end {
                let gpus = if cluster == "eu-mig" {
                    mig_gpus(t)
                } else {
                    vec![training_l4(t)]
                };
                windows.push(Window {
                    serving: Vec::new(),
                    start_ms: t,
                    end_ms: t + HOUR_MS,
                    samples: 3600,
                    gpus,
                });
                t += HOUR_MS;
            }
            let report = Report {
                batch_id: format!("gen-{host}-{t}"),
                agent_version: "test".into(),
                host: info.clone(),
                windows,
            };
            let outcome = store
                .ingest(&report, token, AgentStatus::default(), now)
                .await
                .unwrap();
            assert_eq!(outcome, store::IngestOutcome::Stored, "{}", report.batch_id);
        }
    }
    let bill = euro_bill(start, now - 3 * DAY_MS, ("25.40", i64::MAX, ""));
    crate::billing::import_focus(store, "gen-eu-bill.csv", bill.into_bytes(), now)
        .await
        .unwrap();
}

/// One physical A100 in MIG mode and its two instances at hour `t`.
fn mig_gpus(t: i64) -> Vec<GpuWindow> {
    let busy = 40.0 + (t / HOUR_MS % 24) as f64 * 2.0;
    let instance =
        |uuid: &str, slices: u32, profile: &str, labels: &[(&str, &str)], util: f64| GpuWindow {
            uuid: uuid.into(),
            index: 0,
            name: "NVIDIA A100-SXM4-80GB".into(),
            parent_uuid: Some("GPU-gen-a100".into()),
            memory_total_bytes: Some((u64::from(slices) * 10) << 30),
            memory_used_max_bytes: Some(8 << 30),
            util_avg: Some(util),
            util_max: Some(util),
            mig: Some(MigPlacement {
                gpu_instance_id: slices,
                compute_instance_id: 0,
                profile: Some(profile.into()),
                gpu_instance_slices: slices,
                compute_instance_slices: slices,
            }),
            processes: vec![ProcessWindow {
                pid: 100 + slices,
                name: Some("python3".into()),
                memory_used_max_bytes: Some(8 << 30),
                sm_util_avg: Some(util),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
    vec![
        GpuWindow {
            uuid: "GPU-gen-a100".into(),
            index: 0,
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_total_bytes: Some(80 << 30),
            mig_compute_slices: Some(7),
            power_avg_watts: Some(180.0),
            energy_mj: Some(180 * 3_600_000),
            ..Default::default()
        },
        instance(
            "MIG-gen-a",
            3,
            "3g.40gb",
            &[
                ("endpoint", "vision-api"),
                ("model", "detector"),
                ("team", "vision"),
            ],
            busy,
        ),
        instance(
            "MIG-gen-b",
            2,
            "2g.20gb",
            &[("experiment", "notebook-eu"), ("team", "research")],
            0.0,
        ),
    ]
}

/// An L4 training all day and idle at night.
fn training_l4(t: i64) -> GpuWindow {
    let working = (6..22).contains(&(t / HOUR_MS % 24));
    GpuWindow {
        uuid: "GPU-gen-owned-l4".into(),
        index: 0,
        name: "NVIDIA L4".into(),
        memory_total_bytes: Some(24 << 30),
        memory_used_max_bytes: Some(if working { 20 << 30 } else { 0 }),
        util_avg: Some(if working { 90.0 } else { 0.0 }),
        util_max: Some(if working { 95.0 } else { 0.0 }),
        processes: if working {
            vec![ProcessWindow {
                pid: 7,
                name: Some("python3".into()),
                memory_used_max_bytes: Some(20 << 30),
                sm_util_avg: Some(88.0),
                labels: [
                    ("experiment", "owned-sweep"),
                    ("model", "llama-8b"),
                    ("team", "research"),
                ]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
                ..Default::default()
            }]
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

const FOCUS_HEADER: &str = "ProviderName,BillingAccountId,BillingPeriodStart,ChargePeriodStart,ChargePeriodEnd,ChargeCategory,BilledCost,EffectiveCost,ListCost,BillingCurrency,PricingCategory,CommitmentDiscountStatus,ServiceName,SkuId,SkuPriceDetails,ResourceId,RegionId,CommitmentDiscountId,Tags";

/// The euro savings plan that covers the MIG host: its hourly fee, and its id.
const EURO_PLAN: (&str, &str) = (
    "28.00",
    "arn:aws:savingsplans::2:savingsplan/0e0e0e0e-eu-plan",
);

/// The MIG host's bill in euros: each hour of `[from, until)` covered by a savings plan at an
/// effective `hourly` (`later` from `changed_at` on: a restated bill), the plan's recurring fee
/// and the part of it the host left unused.
fn euro_bill(from: i64, until: i64, (rate, changed_at, later): (&str, i64, &str)) -> String {
    let (fee, plan) = EURO_PLAN;
    let mut csv = String::from(FOCUS_HEADER);
    let mut t = from;
    while t + HOUR_MS <= until {
        let hourly = if t >= changed_at { later } else { rate };
        let unused = gpuledger_core::money::to_text(
            gpuledger_core::money::from_text(fee) - gpuledger_core::money::from_text(hourly),
        );
        let (period, start, end) = (rfc3339(month_start_ms(t)), rfc3339(t), rfc3339(t + HOUR_MS));
        let head = format!("\nAWS,2,{period},{start},{end}");
        csv.push_str(&format!(
            "{head},Usage,0,{hourly},32.77,EUR,Committed,Used,Amazon Elastic Compute Cloud,p4d,,arn:aws:ec2:eu-west-1:2:instance/i-0e0e0e0e0e0e0e0e1,eu-west-1,{plan},\
             {head},Purchase,{fee},0,{fee},EUR,Standard,,Savings Plans for AWS Compute usage,sp,,{plan},,{plan},\
             {head},Usage,0,{unused},{unused},EUR,Committed,Unused,Savings Plans for AWS Compute usage,sp,,{plan},,{plan},"
        ));
        t += HOUR_MS;
    }
    csv
}

/// What a step between two views does to the data.
enum Step {
    /// Nothing: the same data viewed again.
    Nothing,
    /// The jobs' tick: the roll-up, then the recommendations and kept sections refreshed.
    Job,
    /// The demo fleet's next hour reported, then the jobs' tick.
    NewHours(i64, i64),
    /// A late bill: the euro host's export delivered again, its hours from `from` at another
    /// rate, then the jobs' tick.
    LateBill(i64),
}

/// Every page each viewer can reach is served as a fresh computation answers it, at every
/// moment a kept copy could go wrong; and every route that serves figures was among them. On
/// SQLite.
#[tokio::test]
async fn every_view_serves_what_a_fresh_computation_answers_on_sqlite() {
    Box::pin(every_view_serves_what_a_fresh_computation_answers(
        test_support::sqlite(),
    ))
    .await;
}

/// The same on PostgreSQL, and read from its streaming standby. Apart from SQLite's, so that
/// the two run side by side: each is minutes of the test loop.
#[tokio::test]
async fn every_view_serves_what_a_fresh_computation_answers_on_postgres() {
    Box::pin(every_view_serves_what_a_fresh_computation_answers(
        test_support::postgres().await,
    ))
    .await;
}

async fn every_view_serves_what_a_fresh_computation_answers(db: test_support::TestDb) {
    {
        let store = db.open().await;
        let s = store.as_ref();
        let card = RateCard::default_card();
        let config = crate::config::Config::default();
        let rules = config.attribution_rules();
        Box::pin(crate::demo::seed(s, &card, &rules, NOW))
            .await
            .unwrap();
        Box::pin(generated_fleet(s, NOW)).await;
        Box::pin(clock::at(NOW, test_support::roll_up(s))).await;
        // What is idle now, as the idle job finds it every minute.
        Box::pin(crate::incidents::evaluate(s, &card, &config, NOW))
            .await
            .unwrap();
        let admin = viewer(s, "finance-lead", "admin", None).await;
        let team = viewer(s, "foundation-lead", "viewer", Some(r#"["foundation"]"#)).await;
        let mut state = AppState::new(store.clone());
        state.rate_card = std::sync::Arc::new(card.clone());
        let app = router(state.clone());

        let this = month_start_ms(NOW);
        let last = month_start_ms(this - 1);
        let months = [month_start_ms(last - 1), last, this, this + 40 * DAY_MS];
        let labels: Vec<String> = months.iter().map(|m| month_label(*m)).collect();
        let seeds: Vec<String> = months
            .iter()
            .map(|m| format!("/review/{}", month_label(*m)))
            .chain(
                [
                    "/",
                    "/incidents",
                    "/recommendations",
                    "/budgets",
                    "/billing",
                    "/alerts",
                    "/metrics",
                    "/api/v1/recommendations",
                    "/api/v1/incidents",
                    "/api/v1/budgets",
                    "/api/v1/billing/imports",
                    "/api/v1/billing/periods",
                    "/api/v1/idle/history",
                    "/api/v1/usage",
                    "/api/v1/runs",
                ]
                .map(String::from),
            )
            .chain([last, this].iter().flat_map(|m| {
                let month = month_label(*m);
                [
                    format!("/api/v1/anomalies?month={month}"),
                    format!("/api/v1/billing/reconciliation?month={month}"),
                    format!("/api/v1/billing/commitments?month={month}"),
                    format!("/api/v1/variance?month={month}&by=team"),
                    format!("/api/v1/shape?month={month}"),
                    format!("/api/v1/scale-to-zero?month={month}"),
                ]
            }))
            .collect();

        let euro_late_from = last + 20 * DAY_MS;
        let close_after = crate::closing::DEFAULT_CLOSE_AFTER_MS;
        let moments = [
            ("the first view", NOW, Step::Nothing),
            ("a later view", NOW + 60_000, Step::Nothing),
            (
                "after the job refreshed the month",
                NOW + 6 * 60_000,
                Step::Job,
            ),
            (
                "after a roll-up of new hours",
                NOW + 75 * 60_000,
                Step::NewHours(NOW, NOW + HOUR_MS),
            ),
            (
                "after a late bill",
                NOW + 90 * 60_000,
                Step::LateBill(euro_late_from),
            ),
            (
                "after the month closed",
                this + 31 * DAY_MS + close_after + HOUR_MS,
                Step::Job,
            ),
        ];
        let mut failures = Vec::new();
        let mut visited = BTreeSet::new();
        for (moment, at, step) in moments {
            match step {
                Step::Nothing => {}
                Step::Job => {}
                Step::NewHours(from, to) => {
                    Box::pin(crate::demo::report_live(s, from, to))
                        .await
                        .unwrap();
                }
                Step::LateBill(from) => {
                    // The month's export delivered again, its later hours restated.
                    let bill = euro_bill(last, NOW - 3 * DAY_MS, ("25.40", from, "22.90"));
                    Box::pin(crate::billing::import_focus(
                        s,
                        "gen-eu-bill.csv",
                        bill.into_bytes(),
                        at,
                    ))
                    .await
                    .unwrap();
                }
            }
            if !matches!(step, Step::Nothing) {
                let close = state.close;
                Box::pin(clock::at(
                    at,
                    crate::jobs::roll_up_and_refresh(
                        s,
                        &card,
                        &rules,
                        &config.owners,
                        &close,
                        "test",
                    ),
                ))
                .await;
                Box::pin(crate::incidents::evaluate(s, &card, &config, at))
                    .await
                    .unwrap();
            }
            for who in [&admin, &team] {
                if let Some(d) = incidents_disagree_with_idle_history(&app, who, at).await {
                    failures.push(format!("{} ({}), {moment}: {d}", who.name, db.backend));
                }
                for month in &labels[..3] {
                    for d in monthly_figures_are_not_a_months_worth(&app, who, at, month).await {
                        failures.push(format!("{} ({}), {moment}: {d}", who.name, db.backend));
                    }
                }
                for m in labels.windows(2) {
                    let months = (m[0].as_str(), m[1].as_str());
                    for d in review_allocation_and_bill_disagree(&app, who, at, months).await {
                        failures.push(format!("{} ({}), {moment}: {d}", who.name, db.backend));
                    }
                }
                let apps = (&app, &app);
                let (differences, seen) = Box::pin(crawl(apps, who, (&seeds, &labels), at)).await;
                let count = seen.len();
                visited.extend(seen);
                for d in differences {
                    failures.push(format!("{} ({}), {moment}: {d}", who.name, db.backend));
                }
                eprintln!("{}: {moment}, {}: {count} pages", db.backend, who.name);
            }
        }
        // Read from the replica: once it has replayed what the primary wrote (the last moment's
        // roll-up included), every view it serves is the primary's fresh computation.
        let at = this + 31 * DAY_MS + close_after + HOUR_MS;
        if let Some(replica) = Box::pin(replica_app(&db, &store, &state, at)).await {
            // Read from the replica indeed: the review says so.
            let review = format!("/review/{}", labels[1]);
            let page = Box::pin(view(&replica, &admin, &review, at, false)).await;
            assert!(
                page.body.contains("(read replica)"),
                "{review} was not read from the replica"
            );
            for who in [&admin, &team] {
                let apps = (&replica, &app);
                let (differences, seen) = Box::pin(crawl(apps, who, (&seeds, &labels), at)).await;
                for d in differences {
                    failures.push(format!("{} (read replica), {d}", who.name));
                }
                eprintln!(
                    "{}: read from the replica, {}: {} pages",
                    db.backend,
                    who.name,
                    seen.len()
                );
            }
        }
        // All of them in the test's output; the first dozen in its failure.
        for f in &failures {
            eprintln!("difference: {f}");
        }
        assert!(
            failures.is_empty(),
            "{} views served other figures than a fresh computation:\n{}",
            failures.len(),
            failures
                .iter()
                .take(12)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
        // Every route that answers figures to a viewer was checked.
        let unchecked: Vec<&str> = ROUTES
            .iter()
            .filter(|(method, path, access)| {
                *method == "GET"
                    && matches!(access, Access::Viewer)
                    && !visits(path, &visited)
                    && !["/review", "/account"].contains(path)
            })
            .map(|(_, path, _)| *path)
            .collect();
        assert!(
            unchecked.is_empty(),
            "routes no view reached: {unchecked:?}"
        );
        let by_kind: BTreeMap<&str, usize> = visited.iter().fold(BTreeMap::new(), |mut m, p| {
            *m.entry(p.split(['?', '/']).nth(1).unwrap_or_default())
                .or_default() += 1;
            m
        });
        eprintln!("{}: pages checked by kind: {by_kind:?}", db.backend);
    }
}

/// The walk finds money that names no currency, as the imports and recommendations answered it
/// before they were per currency, and passes money beside or under a `currency`.
#[test]
fn money_that_names_no_currency_is_found() {
    let found = |json: serde_json::Value| {
        let mut out = Vec::new();
        money_without_currency(&json, "", false, &mut out);
        out
    };
    assert_eq!(
        found(
            serde_json::json!([{"id": 1, "rows": 3, "billed_total": "1.25", "effective_total": "1.2"}])
        ),
        ["[0].billed_total", "[0].effective_total"]
    );
    assert_eq!(
        found(
            serde_json::json!({"release": [{"saving": "3", "monthly_saving": "4", "gpus": ["GPU-1"]}], "total_saving": "3"})
        ),
        [
            ".release[0].monthly_saving",
            ".release[0].saving",
            ".total_saving"
        ]
    );
    assert!(found(
        serde_json::json!({"currency": "EUR", "rows": [{"cost": "1", "gpu_hours": 2.0}]})
    )
    .is_empty());
    assert!(
        found(serde_json::json!({"totals": [{"currency": "USD", "billed_total": "1"}]})).is_empty()
    );
}

/// The month's-worth identity reads each place a monthly rate is shown: it passes a month of
/// the figure over the look-back and finds a week's called a month, in the JSON, the CSV and
/// the review's table.
#[test]
fn a_weeks_saving_called_a_month_is_found_in_json_csv_and_the_review() {
    // Over 7 days, a month at the same rate is 730 / 168 of it: 100 → 434.52.
    let json = |monthly: &str| {
        serde_json::json!({"lookback_days": 7.0, "release": [
            {"currency": "USD", "cost": "100", "saving": "100", "monthly_saving": monthly}
        ]})
        .to_string()
    };
    assert!(json_months_worth("j", &json("434.52")).is_empty());
    assert_eq!(json_months_worth("j", &json("100")).len(), 1);

    let csv = |monthly: &str| {
        format!(
            "kind,key,lookback_days,cost,saving,monthly_cost,monthly_saving,frees_commitment,monthly_frees_commitment\n\
             release,h1,7,100,100,,{monthly},0,0\nspot,exp,7,50,20,,,0,\n"
        )
    };
    assert!(csv_months_worth("c", &csv("434.52")).is_empty());
    let found = csv_months_worth("c", &csv("100.00"));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("release h1"), "{found:?}");

    let review = |monthly: &str, freed: &str| {
        format!(
            "<table class=\"incidents savings\"><thead><tr><th>What</th><th>Change</th>\
             <th class=\"num\">Saved over 7 days</th><th class=\"num\">A month at that rate</th></tr></thead><tbody>\
             <tr><td><a href=\"/x\">GPUs doing no work on h1</a></td><td>stop</td>\
             <td class=\"num saving\">$1,000.00<br><span class=\"muted frees\">+ $10.00 commitment freed</span></td>\
             <td class=\"num monthly\">{monthly}<br><span class=\"muted frees\">+ {freed} commitment freed</span></td></tr>\
             <tr><td>experiment e</td><td>spot</td><td class=\"num saving\">€5.00</td><td class=\"num monthly\">—</td></tr>\
             </tbody></table>"
        )
    };
    assert!(review_months_worth("r", &review("$4,345.24", "$43.45")).is_empty());
    assert_eq!(shown_days("6 days 12 hours"), Some(6.5));
    assert_eq!(shown_days("1 day 1 hour"), Some(25.0 / 24.0));
    assert_eq!(shown_days("5 hours"), Some(5.0 / 24.0));
    assert_eq!(shown_days("6.5"), None);
    assert_eq!(
        review_months_worth("r", &review("$1,000.00", "$43.45")).len(),
        1
    );
    assert_eq!(
        review_months_worth("r", &review("$4,345.24", "$10.00")).len(),
        1
    );
}
