//! What every section of a month's review reads from: the month asked for ([`Ask`]), and the
//! month's ledger as the viewer sees it ([`Month`]), read once for all of them.

use std::collections::BTreeSet;

use rust_decimal::Decimal;

use crate::app::{ReadContext, Viewer};
use gpuledger_core::allocation::InCurrency;

use crate::idle_history::Summary;
use crate::ledger;
use crate::review_sections::{IdleWaste, Sections as Kept};
use crate::store::{RollupGrain, StoreError};
use gpuledger_core::allocation::Totals;
use gpuledger_core::attribution::Attribution;
use gpuledger_core::attribution::Part;
use gpuledger_core::carbon::Grid;
use gpuledger_core::time::month_label;

/// A month's review as asked for, before anything is read: the month, the one it is set
/// against, who asks and as of when.
pub struct Ask<'a> {
    pub cx: ReadContext<'a>,
    pub viewer: Viewer<'a>,
    /// The month, [from, to) in epoch ms.
    pub from: i64,
    pub to: i64,
    /// `YYYY-MM` of the month and of the next.
    pub month: String,
    pub next: String,
    /// What the month is set against: the month before, whole, or (`partial`, for a month to
    /// date) the same stretch of it.
    pub prev_from: i64,
    pub prev_to: i64,
    pub partial: bool,
    /// The ledger's past days are read as kept after the first view; today's live.
    pub keep: ledger::Keep,
}

impl<'a> Ask<'a> {
    pub fn new(cx: ReadContext<'a>, viewer: Viewer<'a>, (from, to): (i64, i64)) -> Ask<'a> {
        let (prev_from, prev_to, partial) = crate::variance::comparison(from, to, cx.now);
        Ask {
            cx,
            viewer,
            from,
            to,
            month: month_label(from),
            next: month_label(to),
            prev_from,
            prev_to,
            partial,
            keep: ledger::Keep::past_days(cx.now),
        }
    }
}

/// The month's ledger as read, before it is narrowed to the viewer.
pub struct MonthRead {
    whole: Attribution,
    previous: Attribution,
    kept: Kept,
    heat_parts: Vec<Part>,
}

/// The month as every section sees it.
pub struct Month<'a> {
    pub ask: &'a Ask<'a>,
    /// The viewer's part of the month, in every currency.
    pub all: Attribution,
    /// The whole fleet's month where the viewer sees only some teams (what is wholly theirs
    /// is judged on it); where it sees every team, `all` is the whole.
    every_team: Option<Attribution>,
    /// The viewer's part of what the month is set against.
    pub previous: Attribution,
    /// The viewer's part in the page's currency (the one carrying most of the month), and what
    /// the others carry.
    pub shown: Attribution,
    pub currency: String,
    pub others: Vec<(String, Decimal)>,
    /// Each host's grid intensity, for emissions.
    pub grid: Grid,
    /// The month's totals in the page's currency (none for an empty month).
    pub totals: Option<Totals>,
    /// The heaviest sections, kept as first computed (`review_sections`).
    pub kept: Kept,
    /// The days of the heatmap's GPUs (the fleet's costliest).
    pub heat_parts: Vec<Part>,
}

impl Month<'_> {
    /// Reads the month's ledger, the month it is set against and the kept sections, side by
    /// side.
    pub async fn read(ask: &Ask<'_>) -> Result<MonthRead, StoreError> {
        let store = ask.cx.store;
        let (from, to, keep) = (ask.from, ask.to, ask.keep);
        // Per host, summed over the month: the review shows no single GPU except in the
        // heatmap, and no day except in its chart. Whoever sees every team needs no host by
        // name either (a team's reader needs its hosts, to keep to them): hosts alike are
        // summed together.
        let summed = if ask.viewer.sees_everything() {
            RollupGrain::HostGroupRange
        } else {
            RollupGrain::HostRange
        };
        // The heaviest sections, kept (the month under way's refreshed by a job); then the
        // heatmap's GPUs' days, a few thousand rows, read on each view.
        let kept = async {
            let viewer = (ask.viewer.schema, ask.viewer.scope);
            let kept = crate::review_sections::read(store, viewer, (from, to), (ask.cx.now, false))
                .await?;
            let heat = ledger::gpu_days(store, from, to, &kept.heatmap_gpus.0).await?;
            Ok((kept, heat))
        };
        // A month to date is compared with the same stretch of the month before, whose kept
        // days grow by one a day.
        let previous_keep = if ask.partial { keep.growing() } else { keep };
        let (whole, previous, (kept, heat)) = tokio::try_join!(
            super::timed("month", ledger::load_kept(store, from, to, summed, keep)),
            super::timed(
                "month before",
                ledger::load_kept(store, ask.prev_from, ask.prev_to, summed, previous_keep)
            ),
            super::timed("kept sections", Box::pin(kept)),
        )?;
        Ok(MonthRead {
            whole,
            previous,
            kept,
            heat_parts: heat,
        })
    }

    /// The month narrowed to the viewer, in the page's currency.
    pub fn of<'a>(read: MonthRead, ask: &'a Ask<'a>) -> Month<'a> {
        let Viewer { schema, scope } = ask.viewer;
        let grid = crate::carbon::grid(&read.whole, &ask.cx.config.carbon);
        let (all, every_team) = if scope.is_all() {
            (read.whole, None)
        } else {
            (scope.restrict(read.whole.clone(), schema), Some(read.whole))
        };
        let previous = scope.restrict(read.previous, schema);
        // One currency on the page; what the bill carries in others is listed apart.
        let InCurrency {
            currency,
            attribution: shown,
            others,
        } = gpuledger_core::allocation::in_main_currency(&all);
        let totals = gpuledger_core::allocation::totals(&shown, &grid)
            .into_iter()
            .next();
        Month {
            ask,
            all,
            every_team,
            previous,
            shown,
            currency,
            others,
            grid,
            totals,
            kept: read.kept,
            heat_parts: read.heat_parts,
        }
    }

    /// The whole fleet's month, every team's.
    pub fn whole(&self) -> &Attribution {
        self.every_team.as_ref().unwrap_or(&self.all)
    }

    /// Money in the page's currency, as people read it.
    pub fn money(&self, amount: Decimal) -> String {
        crate::format::money(amount, &self.currency)
    }

    /// The month's total in the page's currency.
    pub fn total(&self) -> Decimal {
        self.totals.as_ref().map_or(Decimal::ZERO, |t| t.cost)
    }

    /// What the month before (or its same stretch) cost in the page's currency.
    pub fn previous_total(&self) -> Decimal {
        (self.previous.parts.iter())
            .filter(|p| p.currency == self.currency)
            .map(|p| p.cost)
            .sum()
    }

    /// The experiments (training runs) wholly the viewer's; `None` where it sees every team.
    pub fn held_runs(&self) -> Option<BTreeSet<String>> {
        let Viewer { schema, scope } = self.ask.viewer;
        gpuledger_core::allocation::GroupBy::role(schema, gpuledger_core::owners::Role::Experiment)
            .and_then(|by| scope.held_keys(self.whole(), by, schema))
    }

    /// The month's idle history as the viewer sees it.
    pub fn idle_summary(&self) -> Summary {
        let Viewer { schema, scope } = self.ask.viewer;
        match &self.kept.idle {
            IdleWaste::Summary(summary) => summary.clone(),
            IdleWaste::Episodes(episodes) => Summary::of(
                (episodes.iter())
                    .filter(|e| crate::idle_history::in_scope(e, scope, schema))
                    .cloned(),
                crate::review_sections::TOP_ROWS,
            ),
        }
    }
}
