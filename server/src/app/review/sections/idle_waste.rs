//! The month's biggest idle waste, from the ledger: runs of idle and held-idle hours per host
//! whose dollars add up to the month's idle and held idle, for any month (live incidents need
//! raw windows, gone once a month closes).

use rust_decimal::Decimal;

use super::Section;
use crate::app::review::charts;
use crate::app::review::{Ask, Month};
use crate::idle_history::IdleEpisode;
use crate::store::StoreError;
use gpuledger_core::allocation::GroupBy;

pub struct IdleWaste {
    /// The costliest runs.
    pub episodes: Vec<EpisodeView>,
    /// How many runs there are.
    pub count: usize,
    /// The runs' dollars, and the ledger's idle + held idle: equal.
    pub total: String,
    pub ledger: String,
}

/// One idle episode as the review lists it.
pub struct EpisodeView {
    pub title: &'static str,
    pub place: String,
    pub href: String,
    pub gpus: usize,
    /// First hour and, on a second line, last hour's end with the hours in between.
    pub from: String,
    pub until: String,
    pub wasted: String,
    pub owners: String,
}

impl Section for IdleWaste {
    type Read = ();

    async fn read(_: &Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn build((): (), month: &Month<'_>) -> Result<IdleWaste, StoreError> {
        let summary = month.idle_summary();
        let in_currency = (summary.currencies.into_iter()).find(|c| c.currency == month.currency);
        let ledger =
            (month.totals.as_ref()).map_or(Decimal::ZERO, |t| t.idle_cost + t.held_idle_cost);
        Ok(IdleWaste {
            total: month.money(in_currency.as_ref().map_or(Decimal::ZERO, |c| c.cost)),
            ledger: month.money(ledger),
            count: in_currency.as_ref().map_or(0, |c| c.count),
            episodes: (in_currency.into_iter())
                .flat_map(|c| c.costliest)
                .map(|e| view(e, &month.ask.month))
                .collect(),
        })
    }
}

fn view(e: IdleEpisode, month: &str) -> EpisodeView {
    let hours = crate::format::thousands(e.hours);
    EpisodeView {
        title: if e.kind == "held_idle" {
            "Held idle"
        } else {
            "Idle"
        },
        href: charts::drill_href(month, GroupBy::Host, &e.hostname),
        place: format!("{} / {}", e.cluster, e.hostname),
        gpus: e.gpus.len(),
        from: crate::format::utc_minute(e.start_ms),
        until: format!("→ {} ({hours} h)", crate::format::utc_minute(e.end_ms)),
        wasted: format!(
            "{}{}",
            crate::format::money(e.cost, &e.currency),
            if e.estimated { "*" } else { "" }
        ),
        owners: e
            .owners
            .iter()
            .map(|(k, v)| format!("{k}={}", v.join(", ")))
            .collect::<Vec<_>>()
            .join("; "),
    }
}
