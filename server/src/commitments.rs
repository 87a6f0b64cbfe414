//! A period's commitment discounts read from the bill lines in force: each commitment's
//! utilization and unused dollars, and commitments ending soon; each GPU instance type's
//! coverage from the ledger. The rules are the core's ([`gpuledger_core::commitment`]); this
//! reads the lines, tells GPU instances from the rest as reconciliation does, and adds the
//! configured ends.

use std::collections::BTreeMap;

use gpuledger_core::commitment::*;

use crate::config::Config;
use crate::store::bills::CommitmentRow;
use crate::store::{self, Store, StoreError};
use gpuledger_core::attribution::hosts_by_instance_key;
use gpuledger_core::ratecard::RateCard;

/// The commitments of `[from_ms, to_ms)` as of `now_ms`, with the coverage of each type in
/// `costs` (the ledger's cost per type and pricing category over the same range:
/// [`store::ledger::cost_by_type`]).
pub async fn for_range(
    store: &dyn Store,
    card: &RateCard,
    config: &Config,
    costs: &[TypeCost],
    (from_ms, to_ms): (i64, i64),
    now_ms: i64,
) -> Result<Commitments, StoreError> {
    let rows = store::bills::commitment_lines(store.db(), from_ms, to_ms).await?;
    let purchases = store::bills::commitment_purchases(store.db()).await?;
    let hosts = store::telemetry::hosts(store.db()).await?;
    let gpu_hosts = hosts_by_instance_key(&hosts);
    let line = |r: &CommitmentRow| {
        let gpu = r
            .resource_key
            .as_deref()
            .is_some_and(|k| gpu_hosts.contains_key(k))
            || r.instance_type.as_deref().is_some_and(|t| {
                card.instance_types.get(t).is_some_and(|rate| rate.gpus > 0)
                    || crate::billing::gpu_instances::is_gpu_instance_type(t)
            });
        of_row(r, gpu)
    };
    let lines: Vec<CommitmentLine> = rows.iter().map(line).collect();
    let purchases: Vec<CommitmentLine> = purchases.iter().map(|r| of_row(r, false)).collect();
    let mut found = summarize(
        &lines,
        &purchases,
        &config.commitments.ends_ms(),
        from_ms,
        to_ms,
        now_ms,
    );
    found.coverage = coverage(costs);
    found.unused_charged_to = config.commitments.unused;
    Ok(found)
}

/// The ledger's billed cost and GPU time per instance type and pricing category over
/// `[from_ms, to_ms)`: each type's coverage here, and the committed rate the purchase mix weighs.
pub async fn type_costs(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<TypeCost>, StoreError> {
    store::ledger::cost_by_type(store.db(), from_ms, to_ms).await
}

fn of_row(r: &CommitmentRow, gpu: bool) -> CommitmentLine {
    // The columns the line model does not name are kept as text in `extra_json`.
    let extra: BTreeMap<String, String> = serde_json::from_str(&r.extra_json).unwrap_or_default();
    let text = |name: &str| extra.get(name).filter(|v| !v.is_empty()).cloned();
    let amount = gpuledger_core::money::from_text;
    CommitmentLine {
        charge_category: r.charge_category.clone(),
        charge_frequency: text("ChargeFrequency"),
        charge_period_start_ms: r.charge_period_start_ms,
        charge_period_end_ms: r.charge_period_end_ms,
        billed_cost: amount(&r.billed_cost),
        effective_cost: amount(&r.effective_cost),
        currency: r.currency.clone(),
        commitment_id: r.commitment_discount_id.clone().filter(|id| !id.is_empty()),
        commitment_name: text("CommitmentDiscountName"),
        commitment_type: text("CommitmentDiscountType"),
        status: r
            .commitment_discount_status
            .as_deref()
            .and_then(Status::parse),
        gpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support;
    use gpuledger_core::time::{rfc3339, DAY_MS, HOUR_MS};
    use rust_decimal::Decimal;

    /// 2026-10-10 00:00 UTC.
    const T: i64 = 1_791_590_400_000;
    const SP: &str = "arn:aws:savingsplans::111122223333:savingsplan/sp-a";
    const RI: &str = "arn:aws:ec2:us-east-1:111122223333:reserved-instances/ri-b";

    fn d(text: &str) -> Decimal {
        text.parse().unwrap()
    }

    /// A FOCUS 1.2 file with the specification's commitment rows: a $1.00/hour savings plan
    /// used 75 % on a GPU instance (its recurring purchase, the used and the unused row), a
    /// reservation bought all upfront ten months ago covering a CPU instance, and on-demand
    /// usage of the same GPU type that nothing covered.
    fn bill() -> String {
        let month = gpuledger_core::time::month_start_ms(T);
        let bought = T - 300 * DAY_MS;
        let header = "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,\
            ChargeCategory,ChargeFrequency,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,\
            ListCost,ServiceProviderName,ResourceId,x_InstanceType,CommitmentDiscountId,\
            CommitmentDiscountName,CommitmentDiscountType,CommitmentDiscountStatus,\
            PricingCategory";
        let (s, e) = (rfc3339(T), rfc3339(T + HOUR_MS));
        let p = rfc3339(month);
        let lines = [
            format!("1.00,acct,USD,{p},Purchase,Recurring,{e},{s},0,1.00,AWS,{SP},,{SP},gpu-plan,Savings Plan,,Standard"),
            format!("0,acct,USD,{p},Usage,Usage-Based,{e},{s},0.75,1.20,AWS,i-0gpu,p5.48xlarge,{SP},gpu-plan,Savings Plan,Used,Committed"),
            format!("0,acct,USD,{p},Usage,Usage-Based,{e},{s},0.25,0.25,AWS,{SP},,{SP},gpu-plan,Savings Plan,Unused,Committed"),
            format!("0.50,acct,USD,{p},Usage,Usage-Based,{e},{s},0.50,0.50,AWS,i-0gpu2,p5.48xlarge,,,,,Standard"),
            format!(
                "8760.00,acct,USD,{},Purchase,One-Time,{},{},0,8760.00,AWS,{RI},,{RI},,Reserved Instance,,Standard",
                rfc3339(gpuledger_core::time::month_start_ms(bought)),
                rfc3339(T + 65 * DAY_MS),
                rfc3339(bought),
            ),
            format!("0,acct,USD,{p},Usage,Usage-Based,{e},{s},1.00,1.50,AWS,i-0cpu,m7i.large,{RI},,Reserved Instance,Used,Committed"),
        ];
        format!("{header}\n{}\n", lines.join("\n"))
    }

    #[tokio::test]
    async fn a_months_commitments_from_an_imported_bill_on_both_databases() {
        for db in test_support::both().await {
            let store = db.open().await;
            let b = db.backend;
            crate::billing::import_focus(store.as_ref(), "commitments.csv", bill().into_bytes(), T)
                .await
                .unwrap();
            let (from, to) = gpuledger_core::time::month_of(T);
            let card = RateCard::default_card();
            // The GPU instances no agent reports are in the ledger once rolled up: coverage is
            // read from it.
            test_support::roll_up(store.as_ref()).await;
            let costs = store::ledger::cost_by_type(store.db(), from, to)
                .await
                .unwrap();
            // Whole days are read from the days summed per host, the hours at the edges of
            // a range from the hours: the bill's hour alone, and the month less its first
            // hour, read the same.
            for (f, t) in [(T, T + HOUR_MS), (from + HOUR_MS, to)] {
                let edges = store::ledger::cost_by_type(store.db(), f, t).await.unwrap();
                assert_eq!(edges, costs, "{b}: [{f}, {t})");
            }
            let c = for_range(
                store.as_ref(),
                &card,
                &Config::default(),
                &costs,
                (from, to),
                T,
            )
            .await
            .unwrap();
            let ids: Vec<&str> = c.commitments.iter().map(|x| x.id.as_str()).collect();
            assert_eq!(ids, [RI, SP], "{b}");
            let (ri, sp) = (&c.commitments[0], &c.commitments[1]);
            assert_eq!(sp.name.as_deref(), Some("gpu-plan"), "{b}");
            assert_eq!(sp.commitment_type.as_deref(), Some("Savings Plan"), "{b}");
            assert_eq!((sp.used_on_gpus, sp.unused), (d("0.75"), d("0.25")), "{b}");
            assert_eq!(sp.utilization_percent, Some(d("75.0")), "{b}");
            assert_eq!(sp.invoiced, d("1.00"), "{b}");
            assert_eq!(sp.ends_ms, None, "{b}: a recurring fee says no end");
            // Bought ten months ago, all upfront: invoiced then, not this month; its purchase
            // row says when it ends, within 90 days.
            assert_eq!(
                (ri.used_on_gpus, ri.used_elsewhere),
                (Decimal::ZERO, d("1.00")),
                "{b}"
            );
            assert_eq!(ri.invoiced, Decimal::ZERO, "{b}");
            assert_eq!(ri.ends_ms, Some(T + 65 * DAY_MS), "{b}");
            assert!(ri.expiring, "{b}");
            // Only the GPU type (the ledger holds GPU hosts alone): $0.75 covered of $1.25.
            assert_eq!(c.coverage.len(), 1, "{b}: {:?}", c.coverage);
            let t = &c.coverage[0];
            assert_eq!(t.instance_type, "p5.48xlarge");
            assert_eq!((t.usage, t.covered), (d("1.25"), d("0.75")), "{b}");
            assert_eq!(t.coverage_percent, Some(d("60.0")), "{b}");
            assert_eq!(c.unused[0].amount, d("0.25"), "{b}");
            // The configured end wins.
            let mut config = Config::default();
            config
                .commitments
                .ends
                .insert(RI.into(), "2027-06-30".into());
            let c = for_range(store.as_ref(), &card, &config, &costs, (from, to), T)
                .await
                .unwrap();
            assert!(!c.commitments[0].expiring, "{b}");
            // The reconciliation lists the unused part on its own line, apart from not-GPU
            // resources, and still balances against the ledger.
            let r = crate::reconciliation::for_range(
                store.as_ref(),
                &card,
                &Default::default(),
                from,
                to,
            )
            .await
            .unwrap();
            assert_eq!(r[0].unused_commitments_total(), d("0.25"), "{b}");
            assert!(
                r[0].not_gpu.iter().all(|x| x.resource != "sp-a"),
                "{b}: {:?}",
                r[0].not_gpu
            );
            assert_eq!(r[0].difference, Decimal::ZERO, "{b}: {:?}", r[0]);
        }
    }

    /// A plan of $1.00 an hour for two hours: in the first it covers $0.60 on one team's GPU
    /// instance and $0.20 on another's ($0.20 unused), in the second nothing ($1.00 unused).
    /// Configured `unused = "covered_owners"`, the first hour's unused part goes to the two
    /// teams 3:1 with their usage; the second hour's stays the fleet's. The plan still reads
    /// 40 % used, the GPU type's coverage is still 80 % (with $0.20 on demand), and the month
    /// still reconciles to the cent.
    #[tokio::test]
    async fn unused_dollars_go_to_the_owners_the_plan_covered_when_configured() {
        let config: Config = toml::from_str(
            r#"
            [owners]
            team = { from = ["tag:team"] }
            [commitments]
            unused = "covered_owners"
            "#,
        )
        .unwrap();
        let rules = config.attribution_rules();
        let month = gpuledger_core::time::month_start_ms(T);
        let p = rfc3339(month);
        let hour = |h: i64| (rfc3339(T + h * HOUR_MS), rfc3339(T + (h + 1) * HOUR_MS));
        let ((s0, e0), (s1, e1)) = (hour(0), hour(1));
        let tags = |team: &str| format!("\"{{\"\"team\"\":\"\"{team}\"\"}}\"");
        let csv = [
            "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,\
             ChargeFrequency,ChargePeriodEnd,ChargePeriodStart,EffectiveCost,ListCost,\
             ServiceProviderName,ResourceId,x_InstanceType,CommitmentDiscountId,\
             CommitmentDiscountName,CommitmentDiscountType,CommitmentDiscountStatus,\
             PricingCategory,Tags"
                .to_owned(),
            format!("2.00,acct,USD,{p},Purchase,Recurring,{e1},{s0},0,2.00,AWS,{SP},,{SP},gpu-plan,Savings Plan,,Standard,"),
            format!("0,acct,USD,{p},Usage,Usage-Based,{e0},{s0},0.60,0.90,AWS,i-0gpu,p5.48xlarge,{SP},gpu-plan,Savings Plan,Used,Committed,{}", tags("vision")),
            format!("0,acct,USD,{p},Usage,Usage-Based,{e0},{s0},0.20,0.30,AWS,i-0gpu2,p5.48xlarge,{SP},gpu-plan,Savings Plan,Used,Committed,{}", tags("search")),
            format!("0,acct,USD,{p},Usage,Usage-Based,{e0},{s0},0.20,0.20,AWS,{SP},,{SP},gpu-plan,Savings Plan,Unused,Committed,"),
            format!("0.20,acct,USD,{p},Usage,Usage-Based,{e0},{s0},0.20,0.20,AWS,i-0gpu3,p5.48xlarge,,,,,Standard,"),
            format!("0,acct,USD,{p},Usage,Usage-Based,{e1},{s1},1.00,1.00,AWS,{SP},,{SP},gpu-plan,Savings Plan,Unused,Committed,"),
        ]
        .join("\n");
        let (from, to) = gpuledger_core::time::month_of(T);
        let card = RateCard::default_card();
        for db in test_support::both().await {
            let store = db.open().await;
            let b = db.backend;
            let s = store.as_ref();
            crate::billing::import_focus(s, "plan.csv", format!("{csv}\n").into_bytes(), T)
                .await
                .unwrap();
            crate::rollup::run(s, &card, &rules, usize::MAX)
                .await
                .unwrap();
            // Each team pays its usage and its share of that hour's unused part.
            let ledger = crate::ledger::load(s, from, to, store::RollupGrain::Day)
                .await
                .unwrap();
            let team = |name: &str| -> Decimal {
                ledger
                    .parts
                    .iter()
                    .filter(|x| x.owner.get("team") == Some(name))
                    .map(|x| x.cost)
                    .sum()
            };
            assert_eq!(
                (team("vision"), team("search")),
                (d("0.75"), d("0.25")),
                "{b}"
            );
            assert_eq!(ledger.unattributed.get("USD"), Some(&d("1.00")), "{b}");
            let r = crate::reconciliation::for_range(s, &card, &rules, from, to)
                .await
                .unwrap();
            let r = &r[0];
            assert_eq!(r.unused_commitments_on_owners, d("0.20"), "{b}: {r:?}");
            assert_eq!(
                r.unused_commitments_total(),
                d("1.00"),
                "{b}: the empty hour"
            );
            assert_eq!(r.attributed.total(), d("1.20"), "{b}");
            assert_eq!(r.difference, Decimal::ZERO, "{b}: {r:?}");
            // The plan is what the bill says it is, whoever pays for its slack.
            let costs = type_costs(s, from, to).await.unwrap();
            let c = for_range(s, &card, &config, &costs, (from, to), T)
                .await
                .unwrap();
            let sp = &c.commitments[0];
            assert_eq!((sp.used_on_gpus, sp.unused), (d("0.80"), d("1.20")), "{b}");
            assert_eq!(sp.utilization_percent, Some(d("40.0")), "{b}");
            assert_eq!(c.unused_charged_to, UnusedCharge::CoveredOwners, "{b}");
            // Coverage is of usage: the shares are nobody's usage, so $0.80 of $1.00 either way.
            let t = &c.coverage[0];
            assert_eq!((t.usage, t.covered), (d("1.00"), d("0.80")), "{b}: {t:?}");

            // By default the same bill leaves all of it to the fleet.
            let fleet = gpuledger_core::attribution::Rules {
                owners: rules.owners.clone(),
                ..Default::default()
            };
            crate::rollup::rebuild(
                s,
                &card,
                &fleet,
                from,
                to,
                crate::closing::ClosePolicy::default(),
                None,
                T,
            )
            .await
            .unwrap();
            let ledger = crate::ledger::load(s, from, to, store::RollupGrain::Day)
                .await
                .unwrap();
            let vision: Decimal = ledger
                .parts
                .iter()
                .filter(|x| x.owner.get("team") == Some("vision"))
                .map(|x| x.cost)
                .sum();
            assert_eq!(vision, d("0.60"), "{b}");
            assert_eq!(ledger.unattributed.get("USD"), Some(&d("1.20")), "{b}");
            let r = crate::reconciliation::for_range(s, &card, &fleet, from, to)
                .await
                .unwrap();
            assert_eq!(r[0].unused_commitments_on_owners, Decimal::ZERO, "{b}");
            assert_eq!(r[0].difference, Decimal::ZERO, "{b}");
        }
    }

    /// The FOCUS project's real sample (read in place): two AWS savings plans, each with one
    /// `Used` row whose amounts the sample rounds to 0. Both are found with their type; with
    /// nothing used or unused to judge by, utilization is unknown, not 0 % or 100 %.
    #[tokio::test]
    async fn the_focus_projects_real_sample_names_its_two_savings_plans() {
        let path = crate::billing::focus::tests::shared_sample_path();
        for db in test_support::both().await {
            let store = db.open().await;
            let b = db.backend;
            crate::billing::import_focus_file(store.as_ref(), &path, "sample.csv", T)
                .await
                .unwrap();
            // September 2024, the sample's month.
            let (from, to) = gpuledger_core::time::month_of(1_725_148_800_000);
            let c = for_range(
                store.as_ref(),
                &RateCard::default_card(),
                &Config::default(),
                &[],
                (from, to),
                T,
            )
            .await
            .unwrap();
            let found: Vec<(&str, Option<&str>, Option<Decimal>)> = c
                .commitments
                .iter()
                .map(|x| {
                    (
                        x.id.rsplit('/').next().unwrap_or(""),
                        x.commitment_type.as_deref(),
                        x.utilization_percent,
                    )
                })
                .collect();
            assert_eq!(
                found,
                [
                    (
                        "37985e61-4fcb-4023-9dd7-e524c80342a2",
                        Some("Savings Plan"),
                        None
                    ),
                    (
                        "493f5705-db1c-4867-8e5c-ee9a66fa6d3f",
                        Some("Savings Plan"),
                        None
                    ),
                ],
                "{b}"
            );
            assert!(c
                .commitments
                .iter()
                .all(|x| x.unused.is_zero() && x.ends_ms.is_none()));
        }
    }
}
