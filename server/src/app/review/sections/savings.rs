//! What to change: the month's recommendations as rows, those in the month's main currency
//! first, largest saving over the look-back first, each with what it saved over the look-back
//! and, where the saving recurs (serving, GPUs held all along), the same rate over a month; a
//! training run is not assumed to recur. Amounts are in the bill's currency of the GPUs they
//! cover, and added up per currency.

use rust_decimal::Decimal;

use super::Section;
use crate::app::review::charts::{self, by_role, freed_text};
use crate::app::review::{Ask, Month, TOP_ROWS};
use crate::format::money;
use crate::recommend::snapshots;
use crate::store::StoreError;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;
use gpuledger_core::recommend::Recommendations;

pub struct Savings {
    pub rows: Vec<SavingRow>,
    /// The cash savings added up per currency.
    pub total: String,
    /// Commitment the recommendations free (not cash); "" where none.
    pub frees: String,
    /// The days the recommendations looked at, in words.
    pub days: String,
}

pub struct SavingRow {
    pub what: String,
    pub href: String,
    pub change: String,
    /// Saved over the look-back.
    pub saving: String,
    /// The same rate over a month, or "—" where the saving does not recur.
    pub monthly: String,
    /// Commitment the change frees over the look-back and a month ("" where none): paid for
    /// either way, so not in `saving`.
    pub frees: String,
    pub monthly_frees: String,
}

impl Section for Savings {
    type Read = Recommendations;

    /// The month's recommendations, kept once drawn; what is wholly the viewer's.
    async fn read(ask: &Ask<'_>) -> Result<Recommendations, StoreError> {
        let Some(range) = snapshots::review_range(ask.from, ask.to, ask.cx.now) else {
            return Ok(Recommendations::default());
        };
        let (store, schema) = (ask.cx.store, ask.viewer.schema);
        let all = snapshots::get(store, ask.cx.rate_card, schema, range, ask.cx.now).await?;
        crate::recommend::for_scope(store, all, range, (ask.viewer.scope, schema)).await
    }

    async fn build(recs: Recommendations, month: &Month<'_>) -> Result<Savings, StoreError> {
        let ask = month.ask;
        let (rows, total) = view(&recs, &ask.month, &month.currency, ask.viewer.schema);
        Ok(Savings {
            rows,
            total,
            frees: crate::recommend::frees_text(&recs),
            days: crate::format::days_and_hours(recs.lookback_days),
        })
    }
}

/// The rows (at most [`TOP_ROWS`]) and the cash savings added up.
fn view(
    r: &Recommendations,
    month: &str,
    main_currency: &str,
    schema: &OwnerSchema,
) -> (Vec<SavingRow>, String) {
    let row = |what: String,
               href: String,
               change: String,
               (currency, saving, frees): (&str, Decimal, Decimal),
               monthly: Option<(Decimal, Decimal)>| {
        let freed = |d: Decimal| freed_text(d, currency);
        (
            (currency != main_currency, std::cmp::Reverse(saving + frees)),
            SavingRow {
                what,
                href,
                change,
                saving: money(saving, currency),
                monthly: monthly.map_or_else(|| "—".to_owned(), |m| money(m.0, currency)),
                frees: freed(frees),
                monthly_frees: monthly.map_or_else(String::new, |m| freed(m.1)),
            },
        )
    };
    let mut rows: Vec<((bool, std::cmp::Reverse<Decimal>), SavingRow)> = Vec::new();
    for x in &r.right_size {
        let by = if x.by == "endpoint" {
            by_role(schema, Role::Endpoint)
        } else {
            by_role(schema, Role::Model)
        };
        rows.push(row(
            format!("{} {}", x.by, x.key),
            charts::drill_href(month, by, &x.key),
            format!(
                "{} GPU{} {} → {} ({})",
                x.gpus.len(),
                if x.gpus.len() == 1 { "" } else { "s" },
                x.current_gpu,
                x.recommended_gpu,
                x.recommended_instance_type
            ),
            (&x.currency, x.saving, x.frees_commitment),
            Some((x.monthly_saving, x.monthly_frees_commitment)),
        ));
    }
    for c in &r.consolidation {
        rows.push(row(
            if c.gpus.len() == 1 {
                format!("GPU on {}", c.host)
            } else {
                format!("{} GPUs on {}", c.gpus.len(), c.host)
            },
            charts::drill_href(month, GroupBy::Host, &c.host),
            c.action.clone(),
            (&c.currency, c.saving, c.frees_commitment),
            Some((c.monthly_saving, c.monthly_frees_commitment)),
        ));
    }
    for x in &r.release {
        rows.push(row(
            format!("GPUs doing no work on {}", x.host),
            charts::drill_href(month, GroupBy::Host, &x.host),
            x.action.clone(),
            (&x.currency, x.saving, x.frees_commitment),
            Some((x.monthly_saving, x.monthly_frees_commitment)),
        ));
    }
    for s in &r.spot {
        rows.push(row(
            format!("experiment {}", s.experiment),
            charts::drill_href(month, by_role(schema, Role::Experiment), &s.experiment),
            "on-demand → spot".into(),
            (&s.currency, s.saving, Decimal::ZERO),
            None,
        ));
    }
    rows.sort_by_key(|r| r.0);
    (
        rows.into_iter().map(|(_, r)| r).take(TOP_ROWS).collect(),
        crate::recommend::savings_text(r),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_core::recommend::{Release, SpotCandidate};

    /// Each saving says its period, and a month at its rate where it recurs: a GPU held idle
    /// all week is held all month; a training run is not assumed to recur.
    #[test]
    fn savings_show_their_look_back_and_a_month_at_that_rate() {
        let r = Recommendations {
            lookback_days: 7.0,
            release: vec![Release {
                currency: "USD".into(),
                gpus: vec!["GPU-1".into()],
                host: "train-east-06".into(),
                owners: Default::default(),
                action: "release the GPU".into(),
                cost: Decimal::new(330_348, 2),
                saving: Decimal::new(330_348, 2),
                frees_commitment: Decimal::ZERO,
                monthly_saving: Decimal::new(1_435_487, 2),
                monthly_frees_commitment: Decimal::ZERO,
            }],
            spot: vec![SpotCandidate {
                currency: "USD".into(),
                experiment: "exp-9".into(),
                gpus: vec!["GPU-2".into()],
                instance_types: vec!["p4d.24xlarge".into()],
                gpu_hours: 10.0,
                cost: Decimal::from(100),
                saving: Decimal::from(60),
            }],
            ..Default::default()
        };
        let mut r = r;
        r.sum_savings();
        let (rows, total) = view(&r, "2026-10", "USD", &OwnerSchema::default());
        assert_eq!(total, "$3,363.48");
        // A saving in euros is its own sum, and comes after the month's main currency's.
        r.spot.push(SpotCandidate {
            currency: "EUR".into(),
            experiment: "exp-eu".into(),
            saving: Decimal::from(5_000),
            ..r.spot[0].clone()
        });
        r.sum_savings();
        let (rows_eu, total_eu) = view(&r, "2026-10", "USD", &OwnerSchema::default());
        assert_eq!(total_eu, "€5,000.00 + $3,363.48");
        assert_eq!(rows_eu.last().map(|r| r.saving.as_str()), Some("€5,000.00"));
        let shown: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.saving.as_str(), r.monthly.as_str()))
            .collect();
        assert_eq!(shown, [("$3,303.48", "$14,354.87"), ("$60.00", "—")]);
    }
}
