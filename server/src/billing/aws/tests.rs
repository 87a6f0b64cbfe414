use super::*;

#[test]
fn purchase_types() {
    assert_eq!(
        pricing_from_purchase_type("On Demand Instances"),
        "on_demand"
    );
    assert_eq!(pricing_from_purchase_type("Spot Instances"), "spot");
    assert_eq!(pricing_from_purchase_type("Savings Plans"), "committed");
    assert_eq!(
        pricing_from_purchase_type("Standard Reserved Instances"),
        "committed"
    );
    assert_eq!(pricing_from_purchase_type("Dedicated Usage"), "other");
    assert_eq!(
        commitment_of_purchase_type("Standard Reserved Instances"),
        Some(RESERVED_INSTANCES)
    );
    assert_eq!(commitment_of_purchase_type("On Demand Instances"), None);
}

/// A day's fees as Cost Explorer groups them by record type and service: an EC2
/// reservation's recurring fee with $2.50 of it unused in the amortized view, a compute
/// Savings Plan's upfront fee (amortized into usage, so no unused part); an RDS
/// reservation's and a SageMaker plan's fees (nothing the usage lines cover) and a record
/// that is not a fee are left out.
#[test]
fn fees_are_invoiced_purchases_and_their_unused_part() {
    use aws_sdk_costexplorer::types::{Group, MetricValue};
    let money = |a: &str| MetricValue::builder().amount(a).unit("USD").build();
    let group = |keys: &[&str], amortized: &str, unblended: &str| {
        Group::builder()
            .set_keys(Some(keys.iter().map(|k| k.to_string()).collect()))
            .metrics("AmortizedCost", money(amortized))
            .metrics("UnblendedCost", money(unblended))
            .build()
    };
    let result = ResultByTime::builder()
        .time_period(interval("2026-10-01", "2026-10-02").unwrap())
        .groups(group(&["RIFee", EC2_COMPUTE], "2.5", "10"))
        .groups(group(
            &["RIFee", "Amazon Relational Database Service"],
            "1",
            "4",
        ))
        .groups(group(
            &[
                "SavingsPlanUpfrontFee",
                "Savings Plans for AWS Compute usage",
            ],
            "0",
            "8760",
        ))
        .groups(group(
            &["SavingsPlanRecurringFee", "Amazon SageMaker"],
            "1",
            "2",
        ))
        .groups(group(&["Tax", EC2_COMPUTE], "1", "1"))
        .build();
    let mut out = Vec::new();
    fee_lines(&result, &mut out).unwrap();
    // Category, status, billed, effective, commitment.
    type Seen<'a> = (&'a str, Option<&'a str>, String, String, Option<&'a str>);
    let seen: Vec<Seen> = out
        .iter()
        .map(|l| {
            (
                l.charge_category.as_str(),
                l.commitment_discount_status.as_deref(),
                l.billed_cost.to_string(),
                l.effective_cost.to_string(),
                l.commitment_discount_id.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "Purchase",
                None,
                "10".into(),
                "0".into(),
                Some(RESERVED_INSTANCES.id)
            ),
            (
                "Usage",
                Some("Unused"),
                "0".into(),
                "2.5".into(),
                Some(RESERVED_INSTANCES.id)
            ),
            (
                "Purchase",
                None,
                "8760".into(),
                "0".into(),
                Some(SAVINGS_PLANS.id)
            ),
        ]
    );
    // Commitments read the name, type and frequency back from the extra columns.
    let extra: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&out[2].extra_json).unwrap();
    assert_eq!(extra["CommitmentDiscountType"], "Savings Plan");
    // An upfront fee's day is not its term: no end is read from it.
    assert!(!extra.contains_key("ChargeFrequency"));
    assert_eq!(
        out[0].charge_period_end_ms - out[0].charge_period_start_ms,
        86_400_000
    );
}
