//! Who pays for a commitment's unused part is one config line, and the pages say which: the
//! review's commitments section and the month's reconciliation, on both storage backends.

use std::sync::Arc;

use axum::http::StatusCode;
use scraper::{Html, Selector};

use super::tests::{apis_with, Api};
use crate::clock::now_ms;
use crate::config::Config;
use gpuledger_core::time::{month_of, rfc3339, HOUR_MS};

const SP: &str = "arn:aws:savingsplans::111122223333:savingsplan/sp-pages";

/// A $1.00-an-hour plan over this month's second and third hours: $0.60 covered on one team's
/// GPU instance in the first and $0.40 unused; nothing covered in the second.
async fn bill_and_roll_up(api: &Api, config: &Config, month: i64) {
    let (s0, e0, e1) = (
        rfc3339(month + HOUR_MS),
        rfc3339(month + 2 * HOUR_MS),
        rfc3339(month + 3 * HOUR_MS),
    );
    let p = rfc3339(month);
    let bill = format!(
        "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,ServiceProviderName,ResourceId,x_InstanceType,CommitmentDiscountId,CommitmentDiscountType,CommitmentDiscountStatus,PricingCategory,Tags\n\
         2.00,acct,USD,{p},Purchase,{e1},{s0},0,2.00,AWS,{SP},,{SP},Savings Plan,,Standard,\n\
         0,acct,USD,{p},Usage,{e0},{s0},0.60,0.90,AWS,i-0a0a0a0a0a0a0a0a0,p5.48xlarge,{SP},Savings Plan,Used,Committed,\"{{\"\"team\"\":\"\"vision\"\"}}\"\n\
         0,acct,USD,{p},Usage,{e0},{s0},0.40,0.40,AWS,{SP},,{SP},Savings Plan,Unused,Committed,\n\
         0,acct,USD,{p},Usage,{e1},{e0},1.00,1.00,AWS,{SP},,{SP},Savings Plan,Unused,Committed,\n"
    );
    crate::billing::import_focus(api.store.as_ref(), "plan.csv", bill.into_bytes(), now_ms())
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

fn text(page: &str, css: &str) -> String {
    let html = Html::parse_document(page);
    let selector = Selector::parse(css).unwrap();
    html.select(&selector)
        .map(|e| e.text().collect::<String>())
        .collect::<Vec<_>>()
        .join("|")
}

#[tokio::test]
async fn the_pages_say_who_pays_for_unused_commitments() {
    let month_ms = month_of(now_ms()).0;
    let month = chrono::DateTime::from_timestamp_millis(month_ms)
        .unwrap()
        .format("%Y-%m")
        .to_string();
    for (charge, expected_review, on_owners) in [
        ("fleet", "to the fleet, not to owners", None),
        (
            "covered_owners",
            "to the owners of what each commitment covered in the same hour",
            Some("$0.40"),
        ),
    ] {
        let config: Config = toml::from_str(&format!(
            "[owners]\nteam = {{ from = [\"tag:team\"] }}\n[commitments]\nunused = \"{charge}\"\n"
        ))
        .unwrap();
        let shared = Arc::new(config.clone());
        for (api, _db) in apis_with(|s| s.config = shared.clone()).await {
            let b = api.backend;
            let (admin, _) = api.session("admin").await;
            bill_and_roll_up(&api, &config, month_ms).await;

            let (status, review) = api.get_as(&format!("/review/{month}"), Some(&admin)).await;
            assert_eq!(status, StatusCode::OK, "{b} {charge}");
            assert_eq!(
                text(&review, ".unused-charge"),
                expected_review,
                "{b} {charge}"
            );

            let (status, billing) = api.get_as(&format!("/billing/{month}"), Some(&admin)).await;
            assert_eq!(status, StatusCode::OK, "{b} {charge}");
            assert_eq!(
                text(&billing, "tfoot tr.balanced td.num"),
                "$0.00",
                "{b} {charge}: the month reconciles either way"
            );
            let owners = text(&billing, "b.unused-on-owners");
            assert_eq!(owners, on_owners.unwrap_or(""), "{b} {charge}");
            // The hours the plan covered nothing stay the fleet's in both.
            let fleet = text(&billing, "#unused-commitments ~ table td.num");
            let expected_fleet = if on_owners.is_some() {
                "$1.00"
            } else {
                "$1.40"
            };
            assert_eq!(fleet, expected_fleet, "{b} {charge}");
        }
    }
}
