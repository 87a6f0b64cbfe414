//! Adding an owner dimension is one line of config: attribution reads it from a process label or
//! else a bill tag, the rollups keep it, and the allocation API, the review's tables and the
//! drill-downs show it; on both storage backends.

use std::sync::Arc;

use axum::http::StatusCode;
use scraper::{Html, Selector};

use super::tests::{apis_with, report, Api};
use crate::clock::now_ms;
use crate::config::Config;
use gpuledger_core::money::from_text;
use gpuledger_core::time::{month_of, rfc3339};
use rust_decimal::Decimal;

/// The one line: a cost center from the process's environment, else the bill line's tag.
const CONFIG: &str = r#"
[owners]
cost_center = { from = ["label:cost_center", "tag:CostCenter"] }
"#;

fn month() -> String {
    chrono::DateTime::from_timestamp_millis(now_ms())
        .unwrap()
        .format("%Y-%m")
        .to_string()
}

/// `GET /api/v1/allocation` for this month with `query`: the status and the JSON.
async fn allocation(api: &Api, cookie: &str, query: &str) -> (StatusCode, serde_json::Value) {
    let (from, to) = month_of(now_ms());
    let (status, body) = api
        .get_as(
            &format!(
                "/api/v1/allocation?from={}&to={}&step=month&{query}",
                rfc3339(from),
                rfc3339(to)
            ),
            Some(cookie),
        )
        .await;
    (status, serde_json::from_str(&body).unwrap())
}

/// Cost per key of an allocation answer (all in dollars here).
fn by_key(v: &serde_json::Value) -> std::collections::BTreeMap<String, Decimal> {
    let mut out = std::collections::BTreeMap::new();
    for r in v["rows"].as_array().unwrap() {
        *out.entry(r["key"].as_str().unwrap().to_owned())
            .or_insert(Decimal::ZERO) += from_text(r["cost"].as_str().unwrap());
    }
    out
}

/// Host h1 (priced by the rate card) runs a process labelled `cost_center=cc-7`; host h-b,
/// billed $100 for the hour on a line tagged `CostCenter=cc-bill`, runs one process without
/// the label and one labelled `cc-label`.
async fn fleet(api: &Api, config: &Config) {
    let mut a = report("dim-a");
    a.host.instance_type = Some("g6.xlarge".into());
    a.windows[0].gpus[0].processes[0].labels = [
        ("model".to_string(), "llama".to_string()),
        ("cost_center".to_string(), "cc-7".to_string()),
    ]
    .into();
    let (status, _) = api
        .post(Some(&api.token), serde_json::to_vec(&a).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    let mut b = report("dim-b");
    b.host.hostname = "h-b".into();
    b.host.instance_id = Some("i-0b0b0b0b0b0b0b0b0".into());
    let gpu = &mut b.windows[0].gpus[0];
    gpu.uuid = "GPU-B".into();
    gpu.processes[0].labels = [("model".to_string(), "bert".to_string())].into();
    let mut labelled = gpu.processes[0].clone();
    labelled.pid = 2;
    labelled.labels = [
        ("model".to_string(), "bert".to_string()),
        ("cost_center".to_string(), "cc-label".to_string()),
    ]
    .into();
    gpu.processes.push(labelled);
    let (status, body) = api
        .post(Some(&api.token), serde_json::to_vec(&b).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let hour = now_ms() - now_ms().rem_euclid(3_600_000);
    let (period, _) = month_of(hour);
    let bill = format!(
        "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,ServiceProviderName,ResourceId,Tags,x_InstanceType\n\
         100.00,acct,USD,{p},Usage,{e},{s},100.00,100.00,AWS,i-0b0b0b0b0b0b0b0b0,\"{{\"\"CostCenter\"\":\"\"cc-bill\"\"}}\",\n\
         50.00,acct,USD,{p},Usage,{e},{s},50.00,50.00,AWS,i-0f0f0f0f0f0f0f0f0,\"{{\"\"CostCenter\"\":\"\"cc-ghost\"\"}}\",p4d.24xlarge\n",
        p = rfc3339(period),
        e = rfc3339(hour + 3_600_000),
        s = rfc3339(hour),
    );
    crate::billing::import_focus(
        api.store.as_ref(),
        "tagged.csv",
        bill.into_bytes(),
        now_ms(),
    )
    .await
    .unwrap();
    crate::rollup::run(
        api.store.as_ref(),
        &gpuledger_core::ratecard::RateCard::default_card(),
        &config.attribution_rules(),
        usize::MAX,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_dimension_added_by_one_config_line_reaches_the_api_the_review_and_drill_downs() {
    let config: Config = toml::from_str(CONFIG).unwrap();
    let shared = Arc::new(config.clone());
    for (api, _db) in apis_with(|s| s.config = shared.clone()).await {
        let b = api.backend;
        let (viewer, _) = api.session("viewer").await;
        fleet(&api, &config).await;

        let (status, v) = allocation(&api, &viewer, "by=cost_center").await;
        assert_eq!(status, StatusCode::OK, "{b}: {v}");
        let rows = by_key(&v);
        let total = from_text(v["totals"][0]["cost"].as_str().unwrap());
        assert_eq!(
            rows.values().copied().sum::<Decimal>(),
            total,
            "{b}: the new dimension's rows add up to the bill: {rows:?}"
        );
        for key in ["cc-7", "cc-bill", "cc-label"] {
            assert!(
                rows.get(key).is_some_and(|c| *c > Decimal::ZERO),
                "{b}: {key} has cost: {rows:?}"
            );
        }

        // Host h-b's billed hour beyond its report is nobody's work but the tagged machine's:
        // by cost center it is cc-bill's (as unmonitored cost); by team, which reads no tag, it
        // stays "(unmonitored)". So is the whole hour of the GPU instance no agent reports
        // (i-0f…, $50, tagged cc-ghost): on a host known from the bill alone.
        let unwatched = |v: &serde_json::Value, key: &str| -> Decimal {
            v["rows"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["key"] == key)
                .map(|r| from_text(r["unmonitored_cost"].as_str().unwrap()))
                .sum()
        };
        let (_, teams) = allocation(&api, &viewer, "by=team").await;
        let bucket = unwatched(&teams, "(unmonitored)");
        assert!(bucket > Decimal::from(50), "{b}: {teams}");
        assert_eq!(
            rows.get("cc-ghost"),
            Some(&Decimal::from(50)),
            "{b}: {rows:?}"
        );
        assert_eq!(unwatched(&v, "cc-ghost"), Decimal::from(50), "{b}: {v}");
        assert_eq!(
            unwatched(&v, "cc-bill") + unwatched(&v, "cc-ghost"),
            bucket,
            "{b}: {v}"
        );
        assert!(!rows.contains_key("(unmonitored)"), "{b}: {rows:?}");
        let (_, ghost) = allocation(&api, &viewer, "by=cluster&cost_center=cc-ghost").await;
        assert_eq!(
            by_key(&ghost).into_iter().collect::<Vec<_>>(),
            [("(no agent)".to_owned(), Decimal::from(50))],
            "{b}: {ghost}"
        );

        // The bill's tag priced host h-b's unlabelled work; the labelled process kept its label.
        let (_, hosts) = allocation(&api, &viewer, "by=host&cost_center=cc-bill").await;
        assert_eq!(by_key(&hosts).keys().collect::<Vec<_>>(), ["h-b"], "{b}");
        let (_, models) = allocation(&api, &viewer, "by=model&cost_center=cc-label").await;
        assert_eq!(by_key(&models).keys().collect::<Vec<_>>(), ["bert"], "{b}");
        let (_, h1) = allocation(&api, &viewer, "by=cost_center&host=h1").await;
        assert!(
            by_key(&h1).contains_key("cc-7") && !by_key(&h1).contains_key("cc-bill"),
            "{b}: no tag on a host without a bill: {h1}"
        );

        let (status, v) = allocation(&api, &viewer, "by=cost_centre").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(
            v["message"]
                .as_str()
                .unwrap_or_default()
                .contains("cost_center"),
            "{b}: the error names the dimensions there are: {v}"
        );
        let (status, _) = allocation(&api, &viewer, "by=team&cost_centre=x").await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{b}: an unknown filter is refused"
        );
        for twice in ["by=team&team=a&team=b", "by=team&by=model"] {
            let (status, v) = allocation(&api, &viewer, twice).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {twice}");
            assert!(
                v["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("more than once"),
                "{b}: {twice}: {v}"
            );
        }

        let (status, page) = api
            .get_as(&format!("/review/{}", month()), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let doc = Html::parse_document(&page);
        let table = Selector::parse("table.spend[data-by=cost_center]").unwrap();
        let title = doc.select(&table).next().map(|t| {
            t.select(&Selector::parse("td.key").unwrap())
                .map(|k| k.text().collect::<String>().trim().to_owned())
                .collect::<Vec<_>>()
        });
        let keys = title.unwrap_or_else(|| panic!("{b}: no cost center table on the review"));
        assert!(
            ["cc-7", "cc-bill", "cc-label"]
                .iter()
                .all(|k| keys.iter().any(|x| x == k)),
            "{b}: {keys:?}"
        );
        assert!(page.contains("By cost center"), "{b}");

        // The billing page lists the GPU instance no agent reports, with the cost center its
        // tag gives, as held in the ledger; the bill balances to the cent.
        let (status, billing) = api
            .get_as(&format!("/billing/{}", month()), Some(&viewer))
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let doc = Html::parse_document(&billing);
        let ghost_row = Selector::parse("#gpu-without-agent + p + table tr").unwrap();
        let ghost: Vec<String> = doc
            .select(&ghost_row)
            .map(|r| r.text().collect::<String>())
            .filter(|t| t.contains("i-0f0f0f0f0f0f0f0f0"))
            .collect();
        assert!(
            ghost.len() == 1
                && ghost[0].contains("cost center: cc-ghost")
                && ghost[0].contains("as unmonitored"),
            "{b}: {ghost:?}"
        );
        assert!(billing.contains("✓ to the cent"), "{b}");
        let (status, recs) = api
            .get_as(
                &format!("/api/v1/billing/reconciliation?month={}", month()),
                Some(&viewer),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}: {recs}");
        let recs: serde_json::Value = serde_json::from_str(&recs).unwrap();
        let r = &recs["currencies"][0];
        assert!(
            from_text(r["difference"].as_str().unwrap()).is_zero(),
            "{b}: {r}"
        );
        assert_eq!(r["gpu_without_agent"][0]["in_ledger"], true, "{b}: {r}");
        assert_eq!(
            from_text(r["bill_on_known_hosts"].as_str().unwrap()),
            Decimal::from(150),
            "{b}: {r}"
        );

        let (status, drill) = api
            .get_as(
                &format!("/review/{}/cost_center?key=cc-bill", month()),
                Some(&viewer),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        let doc = Html::parse_document(&drill);
        let model_table = Selector::parse("table.spend[data-by=model] td.key").unwrap();
        let models: Vec<String> = doc
            .select(&model_table)
            .map(|k| k.text().collect::<String>().trim().to_owned())
            .collect();
        assert!(models.iter().any(|m| m == "bert"), "{b}: {models:?}");
    }
}
