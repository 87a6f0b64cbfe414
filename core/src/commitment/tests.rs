//! The FOCUS specification's commitment-discount examples (appendix "Commitment Discounts" and
//! the 1.2 flexibility examples): a $1.00/hour spend-based plan used 100 %, 0 %, 75 % and with
//! overage; a usage-based commitment split across two resources; upfront and recurring
//! purchases.

use super::*;
use crate::time::HOUR_MS;

const SP: &str = "arn:aws:savingsplans::123456789012:savingsplan/abc";
const T0: i64 = 1_672_531_200_000; // 2023-01-01 00:00 UTC

fn d(text: &str) -> Decimal {
    text.parse().unwrap()
}

/// A usage row; a `p…` instance type is a GPU instance.
fn usage(status: Option<Status>, effective: &str, instance_type: Option<&str>) -> CommitmentLine {
    CommitmentLine {
        charge_category: "Usage".into(),
        charge_frequency: Some("Usage-Based".into()),
        charge_period_start_ms: T0,
        charge_period_end_ms: T0 + HOUR_MS,
        billed_cost: Decimal::ZERO,
        effective_cost: d(effective),
        currency: "USD".into(),
        commitment_id: status.map(|_| SP.to_owned()),
        commitment_name: status.map(|_| "one-dollar-plan".to_owned()),
        commitment_type: status.map(|_| "Savings Plan".to_owned()),
        status,
        gpu: instance_type.is_some_and(|t| t.starts_with('p')),
    }
}

/// The same hour's overage or uncovered usage: a Standard row, billed as used.
fn on_demand(cost: &str, instance_type: &str) -> CommitmentLine {
    CommitmentLine {
        billed_cost: d(cost),
        ..usage(None, cost, Some(instance_type))
    }
}

fn purchase(frequency: &str, billed: &str, start: i64, end: i64) -> CommitmentLine {
    CommitmentLine {
        charge_category: "Purchase".into(),
        charge_frequency: Some(frequency.into()),
        charge_period_start_ms: start,
        charge_period_end_ms: end,
        billed_cost: d(billed),
        effective_cost: Decimal::ZERO,
        status: None,
        gpu: false,
        ..usage(Some(Status::Used), "0", None)
    }
}

fn hour(lines: &[CommitmentLine]) -> Commitments {
    summarize(lines, &[], &BTreeMap::new(), T0, T0 + HOUR_MS, T0)
}

#[test]
fn fully_used_is_100_percent_with_nothing_unused() {
    let c = hour(&[usage(Some(Status::Used), "1.00", Some("p5.48xlarge"))]);
    let sp = &c.commitments[0];
    assert_eq!(sp.id, SP);
    assert_eq!(sp.name.as_deref(), Some("one-dollar-plan"));
    assert_eq!(sp.commitment_type.as_deref(), Some("Savings Plan"));
    assert_eq!(sp.used_on_gpus, d("1.00"));
    assert_eq!(sp.utilization_percent, Some(d("100.0")));
    assert_eq!(sp.unused, Decimal::ZERO);
}

#[test]
fn an_hour_nobody_used_is_0_percent_and_its_dollar_is_unused() {
    // Scenario 2: the Unused row is on the commitment itself, with no instance type.
    let c = hour(&[usage(Some(Status::Unused), "1.00", None)]);
    let sp = &c.commitments[0];
    assert_eq!(sp.utilization_percent, Some(d("0.0")));
    assert_eq!(sp.unused, d("1.00"));
    assert_eq!(
        c.unused,
        [Unused {
            currency: "USD".into(),
            amount: d("1.00")
        }]
    );
}

#[test]
fn three_quarters_used_leaves_a_quarter_unused() {
    let c = hour(&[
        usage(Some(Status::Used), "0.75", Some("p5.48xlarge")),
        usage(Some(Status::Unused), "0.25", None),
    ]);
    assert_eq!(c.commitments[0].utilization_percent, Some(d("75.0")));
    assert_eq!(
        c.commitments[0].utilization_percent.map(|p| p.to_string()),
        Some("75.0".into()),
        "one decimal, always"
    );
    assert_eq!(c.unused[0].amount, d("0.25"));
}

#[test]
fn overage_is_on_demand_usage_the_commitment_did_not_cover() {
    // Scenario 4: the plan fully used and $0.50 more at the on-demand rate.
    let c = hour(&[
        usage(Some(Status::Used), "1.00", Some("p5.48xlarge")),
        on_demand("0.50", "p5.48xlarge"),
    ]);
    assert_eq!(c.commitments[0].utilization_percent, Some(d("100.0")));
    assert_eq!(
        c.commitments[0].used(),
        d("1.00"),
        "the overage is not the plan's"
    );
}

#[test]
fn coverage_is_each_types_committed_cost_over_all_of_it_per_currency() {
    let cost = |t: &str, currency: &str, category: &str, amount: &str| TypeCost {
        instance_type: t.into(),
        currency: currency.into(),
        pricing_category: category.into(),
        cost: d(amount),
        gpu_seconds: 3600.0,
    };
    let cov = coverage(&[
        cost("p5.48xlarge", "USD", "committed", "1.00"),
        cost("p5.48xlarge", "USD", "on_demand", "0.50"),
        cost("g6.xlarge", "USD", "spot", "0.30"),
        cost("p5.48xlarge", "EUR", "committed", "2.00"),
    ]);
    let rows: Vec<(&str, &str, Option<String>)> = cov
        .iter()
        .map(|t| {
            (
                t.instance_type.as_str(),
                t.currency.as_str(),
                t.coverage_percent.map(|p| p.to_string()),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("g6.xlarge", "USD", Some("0.0".into())),
            ("p5.48xlarge", "EUR", Some("100.0".into())),
            ("p5.48xlarge", "USD", Some("66.7".into())),
        ]
    );
    assert_eq!((cov[2].usage, cov[2].covered), (d("1.50"), d("1.00")));
    assert!(coverage(&[cost("p5.48xlarge", "USD", "committed", "0")])[0]
        .coverage_percent
        .is_none());
}

#[test]
fn a_commitment_split_across_two_resources_counts_each_once() {
    // The 1.2 flexibility example: one commitment covering two VMs at $1.00 each, one a GPU
    // instance and one not.
    let c = hour(&[
        usage(Some(Status::Used), "1.00", Some("p4d.24xlarge")),
        usage(Some(Status::Used), "1.00", Some("m7i.large")),
    ]);
    let sp = &c.commitments[0];
    assert_eq!((sp.used_on_gpus, sp.used_elsewhere), (d("1.00"), d("1.00")));
    assert_eq!(sp.used(), d("2.00"));
    assert_eq!(sp.utilization_percent, Some(d("100.0")));
}

#[test]
fn purchases_are_invoiced_not_usage_and_never_change_utilization() {
    // No upfront: a $1.00 recurring purchase row per hour beside its usage rows; the invoice
    // and the amortized cost are separate axes.
    let c = hour(&[
        purchase("Recurring", "1.00", T0, T0 + HOUR_MS),
        usage(Some(Status::Used), "0.75", Some("p5.48xlarge")),
        usage(Some(Status::Unused), "0.25", None),
    ]);
    let sp = &c.commitments[0];
    assert_eq!(sp.invoiced, d("1.00"));
    assert_eq!(
        sp.used() + sp.unused,
        sp.invoiced,
        "the balance FOCUS 1.2 requires"
    );
    assert_eq!(sp.utilization_percent, Some(d("75.0")));
    assert_eq!(
        sp.ends_ms, None,
        "a recurring fee does not say when the term ends"
    );
}

#[test]
fn only_purchase_rows_leave_utilization_unknown_not_zero() {
    let c = hour(&[purchase("Recurring", "1.00", T0, T0 + HOUR_MS)]);
    assert_eq!(c.commitments[0].utilization_percent, None);
    assert_eq!(c.commitments[0].unused, Decimal::ZERO);
}

#[test]
fn an_upfront_purchase_states_the_end_and_is_invoiced_once() {
    // All upfront: one One-Time row of $8,760 whose charge period is the year's term.
    let year_end = T0 + 365 * DAY_MS;
    let upfront = purchase("One-Time", "8760.00", T0, year_end);
    let month = summarize(
        std::slice::from_ref(&upfront),
        &[],
        &BTreeMap::new(),
        T0,
        T0 + 31 * DAY_MS,
        T0,
    );
    assert_eq!(month.commitments[0].invoiced, d("8760.00"));
    assert_eq!(month.commitments[0].ends_ms, Some(year_end));
    assert!(!month.commitments[0].expiring, "a year away");
    // A later month's bill has no purchase row: the end comes from the purchase imported
    // earlier, and within 90 days of it the commitment is expiring.
    let later = year_end - 60 * DAY_MS;
    let usage_row = CommitmentLine {
        charge_period_start_ms: later,
        charge_period_end_ms: later + HOUR_MS,
        ..usage(Some(Status::Used), "1.00", Some("p5.48xlarge"))
    };
    let c = summarize(
        std::slice::from_ref(&usage_row),
        std::slice::from_ref(&upfront),
        &BTreeMap::new(),
        later,
        later + HOUR_MS,
        later,
    );
    assert_eq!(c.commitments[0].invoiced, Decimal::ZERO);
    assert_eq!(c.commitments[0].ends_ms, Some(year_end));
    assert!(c.commitments[0].expiring);
    // Not once it has ended, nor 91 days before.
    let after = summarize(
        std::slice::from_ref(&usage_row),
        std::slice::from_ref(&upfront),
        &BTreeMap::new(),
        later,
        later + HOUR_MS,
        year_end,
    );
    assert!(!after.commitments[0].expiring);
    let early = summarize(
        &[usage_row],
        &[upfront],
        &BTreeMap::new(),
        later,
        later + HOUR_MS,
        year_end - 91 * DAY_MS,
    );
    assert!(!early.commitments[0].expiring);
}

#[test]
fn the_configured_end_wins_over_a_purchase_row() {
    let configured = T0 + 30 * DAY_MS;
    let c = summarize(
        &[usage(Some(Status::Used), "1.00", Some("p5.48xlarge"))],
        &[purchase("One-Time", "8760.00", T0, T0 + 365 * DAY_MS)],
        &BTreeMap::from([(SP.to_owned(), configured)]),
        T0,
        T0 + HOUR_MS,
        T0,
    );
    assert_eq!(c.commitments[0].ends_ms, Some(configured));
    assert!(c.commitments[0].expiring);
}

#[test]
fn a_longer_charge_counts_only_the_periods_share() {
    // A day-long unused row: a month's range holds all of it, an hour's one 24th.
    let day = CommitmentLine {
        charge_period_end_ms: T0 + DAY_MS,
        ..usage(Some(Status::Unused), "24.00", None)
    };
    assert_eq!(
        hour(std::slice::from_ref(&day)).commitments[0].unused,
        d("1.00")
    );
}
