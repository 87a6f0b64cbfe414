//! `/metrics` with a read-only token: the ledger's cost gauges add up to what the allocation API
//! says, per owner, state, GPU, budget and incident, and a team's token gets its team's only;
//! on both backends.

use std::collections::BTreeMap;
use std::str::FromStr;

use axum::http::StatusCode;
use rust_decimal::Decimal;

use super::budgets_tests::billed_host;
use super::scope_tests::two_teams;
use super::security_tests::call;
use super::tests::{apis, write_ledger, Api};
use crate::clock::now_ms;
use gpuledger_core::time::{hour_floor, month_start_ms, HOUR_MS};

/// One sample of the text exposition: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, Decimal);

/// The samples of `text` (label values here hold no `,`, `"` or `}`).
fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap();
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            let value = Decimal::from_str(value)
                .or_else(|_| Decimal::from_scientific(value))
                .unwrap_or_else(|e| panic!("{l}: {e}"));
            (name.to_owned(), labels, value)
        })
        .collect()
}

/// The sum of `name`'s samples whose labels include every `(label, value)` of `matching`.
fn sum(samples: &[Sample], name: &str, matching: &[(&str, &str)]) -> Decimal {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && matching
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
        .sum()
}

async fn scrape(api: &Api, token: Option<&str>) -> (StatusCode, String) {
    let (status, _, body) = call(api, "GET", "/metrics", None, token, "").await;
    (status, body)
}

async fn read_token(api: &Api, name: &str, scope: gpuledger_core::scope::Scope) -> String {
    crate::read_tokens::create(api.store.as_ref(), name, &scope, "admin-user", now_ms())
        .await
        .unwrap()
}

/// The allocation API's cost per team this month, as the admin sees it.
async fn allocation_by_team(api: &Api, admin: &str) -> BTreeMap<String, Decimal> {
    let (status, body) = api
        .get_as("/api/v1/allocation?by=team&step=month", Some(admin))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut out = BTreeMap::new();
    for r in v["rows"].as_array().unwrap() {
        *out.entry(r["key"].as_str().unwrap().to_owned())
            .or_insert(Decimal::ZERO) += Decimal::from_str(r["cost"].as_str().unwrap()).unwrap();
    }
    out
}

#[tokio::test]
async fn cost_gauges_add_up_to_the_ledger_and_keep_to_the_tokens_teams() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let (admin, _) = api.session("admin").await;
        two_teams(&api, &admin).await;
        // The last complete hour: alpha's work on one GPU, another GPU of the host idle; and
        // the hour under way, which the gauges leave until it is complete.
        let now_host = billed_host(&api, "i-alpha-now").await;
        let hour = hour_floor(now_ms()) - HOUR_MS;
        write_ledger(
            &api,
            &[(
                hour + HOUR_MS,
                now_host,
                "alpha",
                "used",
                "99".parse().unwrap(),
            )],
        )
        .await;
        // The two teams' first hours of the month, where the last hour may be one of them.
        let crowded = hour < month_start_ms(now_ms()) + 4 * HOUR_MS;
        write_ledger(
            &api,
            &[
                (hour, now_host, "alpha", "used", "2.5".parse().unwrap()),
                (hour, now_host, "", "idle", "0.75".parse().unwrap()),
            ],
        )
        .await;

        // Without a token: this replica's counters, no money.
        let (status, public) = scrape(&api, None).await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(public.contains("gpuledger_reports_accepted_total"), "{b}");
        assert!(!public.contains("gpuledger_cost_"), "{b}: {public}");
        // A token that is no token: refused, in JSON.
        let (status, refused) = scrape(&api, Some("gpr_not-a-token")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{b}: {refused}");
        assert!(refused.contains("\"unauthorized\""), "{b}: {refused}");

        // Every team: the month adds up to the allocation API's, owner by owner.
        let all = read_token(&api, "grafana", gpuledger_core::scope::Scope::all()).await;
        let (status, text) = scrape(&api, Some(&all)).await;
        assert_eq!(status, StatusCode::OK, "{b}: {text}");
        let s = samples(&text);
        let by_team = allocation_by_team(&api, &admin).await;
        let month = "gpuledger_cost_month_to_date";
        assert_eq!(
            sum(&s, month, &[("team", "alpha")]),
            by_team["alpha"],
            "{b}: {text}"
        );
        assert_eq!(
            sum(&s, month, &[("team", "bravo")]),
            by_team["bravo"],
            "{b}"
        );
        assert_eq!(
            sum(&s, month, &[("team", "bravo"), ("state", "held_idle")]),
            Decimal::from(4),
            "{b}"
        );
        assert_eq!(
            sum(&s, month, &[]) + sum(&s, "gpuledger_bill_outside_gpu_hosts_month_to_date", &[]),
            by_team.values().copied().sum::<Decimal>(),
            "{b}: every dollar once"
        );
        // The last complete hour, per owner and per GPU, and the GPUs idle in it.
        let per_hour = "gpuledger_cost_per_hour";
        if !crowded {
            assert_eq!(
                sum(&s, per_hour, &[("team", "alpha"), ("state", "used")]),
                Decimal::from_str("2.5").unwrap(),
                "{b}"
            );
            assert_eq!(
                sum(&s, per_hour, &[]),
                Decimal::from_str("3.25").unwrap(),
                "{b}"
            );
            assert_eq!(
                sum(&s, "gpuledger_gpus", &[("state", "idle")]),
                Decimal::ONE,
                "{b}"
            );
        }
        let gpu = format!("GPU-{now_host}");
        assert_eq!(
            sum(
                &s,
                "gpuledger_gpu_cost_per_hour",
                &[("UUID", &gpu), ("Hostname", "i-alpha-now")]
            ),
            Decimal::from_str("3.25").unwrap(),
            "{b}"
        );
        let latest = sum(&s, "gpuledger_ledger_latest_hour_timestamp_seconds", &[]);
        assert_eq!(latest, Decimal::from(hour / 1000), "{b}");
        // Budgets and the three open incidents.
        assert_eq!(
            sum(
                &s,
                "gpuledger_budget",
                &[("dimension", "team"), ("owner", "alpha")]
            ),
            Decimal::from(1000),
            "{b}"
        );
        assert_eq!(
            sum(&s, "gpuledger_budget_spent", &[("owner", "alpha")]),
            by_team["alpha"],
            "{b}"
        );
        assert_eq!(
            sum(&s, "gpuledger_incidents_open", &[]),
            Decimal::from(3),
            "{b}"
        );

        // Team alpha's token: alpha's figures to the digit, not a word of bravo, and no line
        // of the bill that is every team's.
        let alpha = read_token(
            &api,
            "alpha-grafana",
            gpuledger_core::scope::Scope::teams(["alpha"]).unwrap(),
        )
        .await;
        let (status, text) = scrape(&api, Some(&alpha)).await;
        assert_eq!(status, StatusCode::OK, "{b}: {text}");
        let s = samples(&text);
        let process = [
            "gpuledger_agent_",
            "gpuledger_reports_",
            "gpuledger_windows_",
            "gpuledger_ingest_",
        ];
        for (name, labels, _) in &s {
            if !process.iter().any(|p| name.starts_with(p)) {
                assert!(
                    !labels.values().any(|v| v.contains("bravo")),
                    "{b}: {name} {labels:?}"
                );
            }
        }
        assert_eq!(sum(&s, month, &[]), by_team["alpha"], "{b}: {text}");
        if !crowded {
            assert_eq!(
                sum(&s, per_hour, &[]),
                Decimal::from_str("2.5").unwrap(),
                "{b}"
            );
        }
        assert!(!text.contains("gpuledger_bill_outside_gpu_hosts"), "{b}");
        assert_eq!(
            sum(&s, "gpuledger_incidents_open", &[]),
            Decimal::ONE,
            "{b}: alpha's incident only"
        );
        assert_eq!(sum(&s, "gpuledger_budget", &[]), Decimal::from(1000), "{b}");
        // A scrape again within seconds reads the same rendering.
        assert_eq!(scrape(&api, Some(&alpha)).await.1, text, "{b}");
    }
}
