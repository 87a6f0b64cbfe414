//! Training runs: each experiment's GPU-hours and cost (per 1,000 steps where it reports
//! them). A run shared with another team is not a scoped viewer's to read (its hours are both
//! teams').

use std::collections::HashMap;

use rust_decimal::Decimal;

use super::Section;
use crate::app::review::charts::{self, by_role, day_label};
use crate::app::review::{Ask, Month, TOP_ROWS};
use crate::format::money;
use crate::store::StoreError;
use crate::unit_costs::{self, RunHours, TrainingRun};
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;

pub struct Runs {
    /// The costliest.
    pub rows: Vec<RunRow>,
    /// How many runs there are, and what one cost on average ("—" where none ran).
    pub count: usize,
    pub average: String,
    /// Every run, as CSV.
    pub csv: String,
}

pub struct RunRow {
    pub experiment: String,
    pub href: String,
    pub model: String,
    pub team: String,
    pub started: String,
    pub hours_active: i64,
    pub gpu_hours: String,
    pub cost: String,
    /// What 1,000 of its steps cost, where it reports them.
    pub per_1k_steps: String,
}

impl Section for Runs {
    type Read = (HashMap<String, RunHours>, Vec<(String, i64, Option<i64>)>);

    async fn read(ask: &Ask<'_>) -> Result<Self::Read, StoreError> {
        let (store, from, to) = (ask.cx.store, ask.from, ask.to);
        tokio::try_join!(
            crate::ledger::experiment_hours(store, from, to),
            unit_costs::progress_totals(store, from, to),
        )
    }

    async fn build((hours, progress): Self::Read, month: &Month<'_>) -> Result<Runs, StoreError> {
        let ask = month.ask;
        let schema = ask.viewer.schema;
        let mut runs = unit_costs::training_runs_by_day(&month.shown, &hours, schema);
        unit_costs::with_progress(&mut runs, &progress);
        let held = month.held_runs();
        runs.retain(|r| held.as_ref().is_none_or(|h| h.contains(&r.experiment)));
        let total: Decimal = runs.iter().map(|r| r.cost).sum();
        Ok(Runs {
            count: runs.len(),
            average: if runs.is_empty() {
                "—".to_owned()
            } else {
                month.money(total / Decimal::from(runs.len() as i64))
            },
            rows: rows(&runs[..runs.len().min(TOP_ROWS)], &ask.month, schema),
            csv: csv_href(&ask.month, &ask.next),
        })
    }
}

/// Every run of the month, as CSV.
pub fn csv_href(month: &str, next: &str) -> String {
    format!(
        "/api/v1/runs?{}",
        charts::query(&[("from", month), ("to", next), ("format", "csv")])
    )
}

/// Runs in words, each linking to its drill-down.
pub fn rows(runs: &[TrainingRun], month: &str, schema: &OwnerSchema) -> Vec<RunRow> {
    let experiment = by_role(schema, Role::Experiment);
    runs.iter()
        .map(|r| RunRow {
            experiment: r.experiment.clone(),
            href: charts::drill_href(month, experiment, &r.experiment),
            model: r.model.clone().unwrap_or_else(|| "—".into()),
            team: r.team.clone().unwrap_or_else(|| "—".into()),
            started: day_label(&r.started),
            hours_active: r.hours_active,
            gpu_hours: crate::format::whole(r.gpu_hours),
            cost: money(r.cost, &r.currency),
            per_1k_steps: r.cost_per_1k_steps.map_or_else(
                || "—".into(),
                |c| crate::format::money_precise(c, &r.currency, 4),
            ),
        })
        .collect()
}
