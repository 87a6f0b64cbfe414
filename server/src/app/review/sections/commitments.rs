//! The month's commitment discounts as the review shows them, in the page's currency: what
//! each covered, its unused dollars, and coverage per GPU instance type. A commitment is the
//! whole bill's, never a team's to read: only whoever sees every team gets them.

use rust_decimal::Decimal;

use super::Section;
use crate::app::review::charts::day_label;
use crate::app::review::{Ask, Month};
use crate::format::money;
use crate::store::StoreError;

#[derive(Default)]
pub struct Commitments {
    pub rows: Vec<CommitmentRow>,
    pub coverage: Vec<CoverageRow>,
    /// Their unused dollars.
    pub unused: String,
    /// Charged, as configured, to the owners of what each commitment covered in the same
    /// hour, not to the fleet.
    pub unused_on_owners: bool,
    /// Some commitment ends within 90 days.
    pub expiring: usize,
    pub api: String,
}

pub struct CommitmentRow {
    pub id: String,
    pub name: String,
    pub kind: String,
    pub used_on_gpus: String,
    pub used_elsewhere: String,
    pub unused: String,
    pub utilization: String,
    pub ends: String,
    pub expiring: bool,
}

pub struct CoverageRow {
    pub instance_type: String,
    pub usage: String,
    pub covered: String,
    pub coverage: String,
}

impl Section for Commitments {
    type Read = ();

    async fn read(_: &Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    /// Read once the month's cost per type is known (kept with the month).
    async fn build((): (), month: &Month<'_>) -> Result<Commitments, StoreError> {
        let ask = month.ask;
        if !ask.viewer.sees_everything() {
            return Ok(Commitments::default());
        }
        let c = crate::commitments::for_range(
            ask.cx.store,
            ask.cx.rate_card,
            ask.cx.config,
            &month.kept.type_costs,
            (ask.from, ask.to),
            ask.cx.now,
        );
        let c = crate::app::review::timed("commitments", c).await?;
        Ok(view(&c, &month.currency, &ask.month))
    }
}

fn view(c: &gpuledger_core::commitment::Commitments, currency: &str, month: &str) -> Commitments {
    let percent = |p: Option<Decimal>| p.map_or_else(|| "unknown".to_owned(), |p| format!("{p}%"));
    let rows: Vec<CommitmentRow> = c
        .commitments
        .iter()
        .filter(|x| x.currency == currency)
        .map(|x| CommitmentRow {
            // The name where the bill gives one, else the id's last part (an ARN's plan id).
            name: x
                .name
                .clone()
                .unwrap_or_else(|| x.id.rsplit(['/', ':']).next().unwrap_or(&x.id).to_owned()),
            id: x.id.clone(),
            kind: x.commitment_type.clone().unwrap_or_default(),
            used_on_gpus: money(x.used_on_gpus, currency),
            used_elsewhere: money(x.used_elsewhere, currency),
            unused: money(x.unused, currency),
            utilization: percent(x.utilization_percent),
            ends: x.ends_ms.map_or_else(
                || "not on the bill".to_owned(),
                |e| day_label(&gpuledger_core::time::rfc3339(e - 1)),
            ),
            expiring: x.expiring,
        })
        .collect();
    Commitments {
        expiring: rows.iter().filter(|r| r.expiring).count(),
        rows,
        coverage: c
            .coverage
            .iter()
            .filter(|t| t.currency == currency)
            .map(|t| CoverageRow {
                instance_type: t.instance_type.clone(),
                usage: money(t.usage, currency),
                covered: money(t.covered, currency),
                coverage: percent(t.coverage_percent),
            })
            .collect(),
        unused: money(
            c.unused
                .iter()
                .filter(|u| u.currency == currency)
                .map(|u| u.amount)
                .sum(),
            currency,
        ),
        unused_on_owners: c.unused_charged_to
            == gpuledger_core::commitment::UnusedCharge::CoveredOwners,
        api: format!("/api/v1/billing/commitments?month={month}"),
    }
}
