//! Attribution's own tests are the core's (`core/src/attribution/tests.rs`); here, what it
//! must agree with in the server: the reconciliation of the same random fleets.

use proptest::prelude::*;

use super::*;
use gpuledger_core::attribution::fixtures::{line, random_fleet, H};
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::time::HOUR_MS;
use rust_decimal::Decimal;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]
    /// The ledger's identities on random fleets, to the cent: the bill for the range equals
    /// used + held idle + idle + unmonitored + unattributed (GPU instances no agent reports and
    /// not-GPU lines), as the reconciliation page states it; rate-card estimates stay apart;
    /// and idle waste is exactly idle + held idle, whichever way it is summed.
    #[test]
    fn the_ledger_identities_hold_on_random_fleets(seed in any::<u64>()) {
        let (hosts, windows, procs, mut lines) = random_fleet(seed);
        let (from, to) = (H, H + 4 * HOUR_MS);
        // A GPU instance no agent reports, and a bucket.
        let mut nobody = line("i-nobody", H, H + 3 * HOUR_MS, "31.415926", "on_demand");
        nobody.instance_type = Some("p4d.24xlarge".into());
        lines.push(nobody);
        lines.push(line("bucket", H - HOUR_MS, H + 2 * HOUR_MS, "2.718281", "on_demand"));
        let card = RateCard::default_card();
        let a = attribute(hosts.clone(), &windows, &procs, &lines, &card, from, to);
        let bill: Decimal = lines
            .iter()
            .flat_map(|l| line_hours(l, from, to))
            .map(|(_, amount)| amount)
            .sum();
        let recs = crate::reconciliation::reconcile(
            &lines,
            &hosts,
            &a,
            &card,
            &gpuledger_core::owners::OwnerSchema::default(),
            from,
            to,
        );
        prop_assert_eq!(recs.len(), 1);
        let r = &recs[0];
        prop_assert_eq!(r.bill, bill);
        prop_assert_eq!(r.difference, Decimal::ZERO);
        prop_assert_eq!(
            r.bill,
            r.attributed.used + r.attributed.held_idle + r.attributed.idle
                + r.attributed.unmonitored + r.gpu_without_agent_unattributed()
                + r.not_gpu_total()
        );
        let parts: Decimal = a.parts.iter().map(|p| p.cost).sum();
        prop_assert_eq!(parts, r.attributed.total() + r.estimated.total());
        prop_assert_eq!(r.gpu_without_agent_total(), line_hours(&lines[lines.len() - 2], from, to)
            .into_iter().map(|(_, x)| x).sum::<Decimal>());
        let t = &gpuledger_core::allocation::totals(&a, &gpuledger_core::carbon::Grid::unknown())[0];
        prop_assert_eq!(t.cost, parts);
        prop_assert_eq!(
            t.idle_cost + t.held_idle_cost,
            r.attributed.idle + r.attributed.held_idle + r.estimated.idle + r.estimated.held_idle
        );
        prop_assert_eq!(
            t.unattributed_cost,
            r.gpu_without_agent_unattributed() + r.not_gpu_total()
        );
    }
}
