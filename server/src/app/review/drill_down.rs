//! One key of one dimension in a month (a model, a team, a host, a GPU…): its figures, its
//! spend by the dimensions that narrow it down, per day and per GPU, its endpoint's unit costs
//! and its training runs.

use rust_decimal::Decimal;

use super::charts::{self, Chart, Figure, Heatmap, Tables};
use super::sections::endpoints::{self, Counts, EndpointRow};
use super::sections::{heatmap, runs};
use super::{Ask, TOP_ROWS};
use crate::app::{ReadContext, Viewer};
use crate::store::{RollupGrain, StoreError};
use gpuledger_core::allocation::calendar_month;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::allocation::InCurrency;
use gpuledger_core::allocation::Step;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;
use gpuledger_core::time::{month_label, month_of};

/// GPUs a drill-down's heatmap shows (the costliest); the CSV has all.
const DRILL_HEATMAP_GPUS: usize = 200;

pub struct DrillDown {
    /// `YYYY-MM`, and the months before and after.
    pub month: String,
    pub previous: String,
    pub next: String,
    /// The next month has begun: a link to it leads somewhere.
    pub next_begun: bool,
    pub dimension: &'static str,
    pub key: String,
    /// The month's review, and this key's drill-down in the months before and after.
    pub review_href: String,
    pub previous_href: String,
    pub next_href: String,
    pub figures: Vec<Figure>,
    pub tables: Tables,
    pub chart: Chart,
    pub heatmap: Heatmap,
    /// The endpoint's unit costs, where the key is an endpoint.
    pub endpoint: Option<EndpointRow>,
    pub runs: DrillRuns,
    /// Nothing was attributed to the key in the month.
    pub empty: bool,
    /// What this key spent in currencies other than the page's, in words ("" when none).
    pub other_currencies: String,
}

/// The key's training runs: the costliest, and how many there are where more than those.
pub struct DrillRuns {
    pub rows: Vec<runs::RunRow>,
    /// "54,980" where more than `rows` ran.
    pub more: Option<String>,
    pub csv: String,
}

/// Why there is no drill-down to show.
#[derive(Debug, thiserror::Error)]
pub enum DrillDownError {
    #[error("months are written YYYY-MM")]
    NoSuchMonth,
    /// Not a dimension of the schema; the ones there are.
    #[error("drill-downs are by {}", .0.join(", "))]
    NoSuchBreakdown(Vec<String>),
    #[error("no key given")]
    NoKey,
    #[error("the month has not begun")]
    NotBegun { from: i64, now: i64 },
    /// A scoped viewer asked for a key with nothing of its teams (its name is not repeated
    /// back).
    #[error("this {dimension} has no spend of {teams} in {month}")]
    NothingOfYourTeams {
        dimension: String,
        teams: String,
        month: String,
    },
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

/// Which tables a drill-down of `by` shows: the fleet dimensions that narrow it down and every
/// other owner dimension of the schema.
fn related(by: GroupBy, schema: &OwnerSchema) -> Vec<GroupBy> {
    use GroupBy::*;
    let owners = GroupBy::all(schema)
        .into_iter()
        .filter(|g| g.is_owner() && *g != by);
    let (before, after): (&[GroupBy], &[GroupBy]) = match by {
        Owner(_) => (&[], &[Cluster, Host, Gpu, PricingCategory]),
        Cluster => (&[Host], &[Gpu, PricingCategory]),
        Host => (&[Gpu], &[]),
        Gpu => (&[], &[]),
        InstanceType => (&[Cluster, Host], &[]),
        PricingCategory => (&[Cluster], &[]),
    };
    before
        .iter()
        .copied()
        .chain(owners)
        .chain(after.iter().copied())
        .collect()
}

impl DrillDown {
    /// `key` of `dimension` in `month` (`YYYY-MM`). A team-scoped viewer sees its teams' part
    /// of the key.
    pub async fn load(
        cx: ReadContext<'_>,
        viewer: Viewer<'_>,
        (month, dimension): (&str, &str),
        key: Option<String>,
    ) -> Result<DrillDown, DrillDownError> {
        let (from, to) = calendar_month(month).ok_or(DrillDownError::NoSuchMonth)?;
        let Viewer { schema, scope } = viewer;
        let by = GroupBy::parse(dimension, schema).ok_or_else(|| {
            let names = GroupBy::all(schema)
                .iter()
                .map(|g| g.as_str().to_owned())
                .collect();
            DrillDownError::NoSuchBreakdown(names)
        })?;
        let key = key.filter(|k| !k.is_empty()).ok_or(DrillDownError::NoKey)?;
        if from > cx.now {
            return Err(DrillDownError::NotBegun { from, now: cx.now });
        }
        let ask = Ask::new(cx, viewer, (from, to));
        let (whole, run_hours, counts) = tokio::try_join!(
            crate::ledger::load(cx.store, from, to, RollupGrain::Day),
            crate::ledger::experiment_hours(cx.store, from, to),
            Counts::read(&ask),
        )?;
        let grid = crate::carbon::grid(&whole, &cx.config.carbon);
        let held_runs = GroupBy::role(schema, Role::Experiment)
            .and_then(|by| scope.held_keys(&whole, by, schema));
        let (all, every_team) = if scope.is_all() {
            (whole, None)
        } else {
            (scope.restrict(whole.clone(), schema), Some(whole))
        };
        let whole = every_team.as_ref().unwrap_or(&all);
        let (month, next) = (ask.month.clone(), ask.next.clone());
        let filters = vec![(by, key.clone())];
        let mine = gpuledger_core::allocation::filtered(&all, &filters);
        if !scope.is_all() && mine.parts.is_empty() {
            return Err(DrillDownError::NothingOfYourTeams {
                dimension: by.as_str().to_owned(),
                teams: scope.describe(),
                month,
            });
        }
        // In the currency that carries most of this key's spend; the rest listed apart.
        let InCurrency {
            currency: cur,
            attribution: a,
            others,
        } = gpuledger_core::allocation::in_main_currency(&mine);
        let row = gpuledger_core::allocation::group(&a, by, Step::Month, &grid);
        let row = row.iter().find(|r| r.key == key);
        let month_total: Decimal = gpuledger_core::allocation::totals(&all, &grid)
            .iter()
            .find(|t| t.currency == cur)
            .map_or(Decimal::ZERO, |t| t.cost);
        let cost = row.map_or(Decimal::ZERO, |r| r.cost);
        let api = charts::api_href(&month, &next, by, "month", &filters);
        let figures = figures((row, cost, month_total), (by, scope.is_all()), &cur, api);
        let tables = Tables {
            list: related(by, schema)
                .into_iter()
                .map(|other| {
                    charts::table(
                        (&a, &grid),
                        other,
                        (&month, &next),
                        &filters,
                        cost,
                        (&cur, &others),
                    )
                })
                .collect(),
        };
        let chart = charts::days(&a, from, to, &filters, &cur);
        let labels = heatmap::labels(cx.store, &a.parts).await;
        let heatmap = charts::heatmap(
            (&a.parts, &a.hosts),
            from,
            to,
            &month,
            &next,
            &filters,
            DRILL_HEATMAP_GPUS,
            &labels,
        );
        let endpoint_by = GroupBy::role(schema, Role::Endpoint);
        let endpoint = (Some(by) == endpoint_by)
            .then(|| {
                let rows = counts.unit_costs((&all, whole), viewer);
                rows.into_iter().find(|e| e.endpoint == key)
            })
            .flatten()
            .map(|e| endpoints::row(&e, &month, schema));
        // Training runs of an owner (but an endpoint, which serves) or of a cluster.
        let runs = if (by.is_owner() && Some(by) != endpoint_by) || by == GroupBy::Cluster {
            let mut runs = crate::unit_costs::training_runs_by_day(&mine, &run_hours, schema);
            runs.retain(|r| held_runs.as_ref().is_none_or(|h| h.contains(&r.experiment)));
            runs
        } else {
            Vec::new()
        };
        let (prev_from, _) = month_of(from - 1);
        let drill = |m: &str| charts::drill_href(m, by, &key);
        Ok(DrillDown {
            empty: a.parts.is_empty(),
            review_href: format!("/review/{month}"),
            previous_href: drill(&month_label(prev_from)),
            next_href: drill(&next),
            next_begun: to <= cx.now,
            previous: month_label(prev_from),
            dimension: by.as_str(),
            figures,
            tables,
            chart,
            heatmap,
            endpoint,
            runs: DrillRuns {
                // The costliest, as on the review: a large cluster runs tens of thousands a
                // month.
                more: (runs.len() > TOP_ROWS).then(|| crate::format::thousands(runs.len() as i64)),
                // No cost per step here: a run's part on one host or cluster is not what its
                // steps cost.
                rows: runs::rows(&runs[..runs.len().min(TOP_ROWS)], &month, schema),
                csv: runs::csv_href(&month, &next),
            },
            other_currencies: charts::other_currencies(&others),
            key,
            month,
            next,
        })
    }
}

/// The key's headline: its cost and share of the month, GPU-hours, utilization, held idle,
/// energy and emissions, each linking to the allocation API's rows.
fn figures(
    (row, cost, month_total): (
        Option<&gpuledger_core::allocation::AllocationRow>,
        Decimal,
        Decimal,
    ),
    (by, sees_everything): (GroupBy, bool),
    currency: &str,
    api: String,
) -> Vec<Figure> {
    let shown = |d: Decimal| crate::format::money(d, currency);
    let mut figures = vec![
        Figure {
            value: shown(cost),
            caption: if month_total.is_zero() {
                format!("{} spend", by.as_str())
            } else {
                format!(
                    "{}% of {} GPU spend",
                    (cost / month_total * Decimal::from(100)).round_dp(1),
                    if sees_everything {
                        "the month's"
                    } else {
                        "your teams'"
                    }
                )
            },
            href: api.clone(),
        },
        Figure {
            value: crate::format::whole(row.map_or(0.0, |r| r.gpu_hours)),
            caption: "GPU-hours".into(),
            href: api.clone(),
        },
        Figure {
            value: row
                .and_then(|r| r.avg_util)
                .map_or_else(|| "—".into(), |u| format!("{u:.0}%")),
            caption: "average GPU utilization".into(),
            href: api.clone(),
        },
        Figure {
            value: shown(row.map_or(Decimal::ZERO, |r| r.held_idle_cost)),
            caption: "held idle".into(),
            href: api.clone(),
        },
    ];
    figures.extend(charts::footprint_figures(
        row.map(|r| (r.energy_kwh, r.energy_measured_share, r.kg_co2e)),
        (api.clone(), api),
    ));
    figures
}
