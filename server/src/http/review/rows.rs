//! The review's rows in words: training runs, endpoints, idle episodes and savings, each amount
//! in its own currency.

use rust_decimal::Decimal;

use super::super::charts;
use super::{day_label, TOP_ROWS};
use crate::allocation::GroupBy;
use crate::config::OwnerSchema;
use crate::format::money;
use crate::recommend::Recommendations;
use crate::unit_costs::{EndpointUnitCost, TrainingRun};
use gpuledger_core::owners::Role;

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

pub struct EndpointRow {
    pub endpoint: String,
    pub href: String,
    pub requests: String,
    pub cost: String,
    pub per_1k: String,
    /// What a million tokens in and out cost, where they are counted.
    pub per_1m_tokens: String,
    /// The whole cost per million generated tokens.
    pub per_1m_output: String,
    /// Who counted: "serving code", "vLLM (agent)", …
    pub counted_by: String,
    /// Counted by serving code and read from an engine too: each unit looks half its cost.
    pub counted_twice: bool,
}

/// How the pages name who counted an endpoint's work.
fn source_name(source: &str) -> &str {
    match source {
        "posted" => "serving code",
        "vllm" => "vLLM (agent)",
        "tgi" => "TGI (agent)",
        "triton" => "Triton (agent)",
        other => other,
    }
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

pub fn episode_view(e: crate::idle_history::IdleEpisode, month: &str) -> EpisodeView {
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

/// The dimension playing `role`, for links (every role is held: `core::owners`).
fn by_role(schema: &OwnerSchema, role: Role) -> GroupBy {
    GroupBy::role(schema, role).unwrap_or(GroupBy::Owner(role.as_str()))
}

pub fn runs_view(runs: &[TrainingRun], month: &str, schema: &OwnerSchema) -> Vec<RunRow> {
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

pub fn endpoint_view(e: &EndpointUnitCost, month: &str, schema: &OwnerSchema) -> EndpointRow {
    EndpointRow {
        endpoint: e.endpoint.clone(),
        href: charts::drill_href(month, by_role(schema, Role::Endpoint), &e.endpoint),
        requests: e
            .requests
            .map_or_else(|| "no counts".into(), crate::format::thousands),
        cost: money(e.cost, &e.currency),
        per_1k: e.cost_per_1k_requests.map_or_else(
            || "—".into(),
            |c| crate::format::money_precise(c, &e.currency, 4),
        ),
        per_1m_tokens: e.cost_per_1m_tokens.map_or_else(
            || "—".into(),
            |c| crate::format::money_precise(c, &e.currency, 4),
        ),
        per_1m_output: e.cost_per_1m_output_tokens.map_or_else(
            || "—".into(),
            |c| crate::format::money_precise(c, &e.currency, 4),
        ),
        counted_by: e
            .counted_by
            .iter()
            .map(|s| source_name(s))
            .collect::<Vec<_>>()
            .join(", "),
        counted_twice: e.counted_twice(),
    }
}

/// The month's recommendations as rows, those in the month's main currency first, largest
/// saving over the look-back first: each with what it saved over the look-back and, where the
/// saving recurs (serving, GPUs held all along), the same rate over a month; a training run is
/// not assumed to recur. Amounts are in the bill's currency of the GPUs they cover, and added
/// up per currency.
pub fn savings_view(
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
        super::super::recommendations::savings_text(r),
    )
}

/// One owner's change on the review, in cents that add up as shown: volume, idle and mix are
/// rounded to the cent and price is the rounded change less them.
pub struct VarianceRowView {
    pub key: String,
    pub href: Option<String>,
    pub previous: String,
    pub cost: String,
    pub change: String,
    pub volume: String,
    pub idle: String,
    pub mix: String,
    pub price: String,
}

/// The review's "why spend changed" table: the largest changes, the rest in one row, and the
/// whole change.
pub struct VarianceView {
    pub dimension: String,
    /// Month to date, against the same stretch of the month before.
    pub month_to_date: bool,
    pub rows: Vec<VarianceRowView>,
    pub total: VarianceRowView,
    pub api: String,
    pub csv: String,
}

pub fn variance_view(v: &crate::variance::Variance, month: &str) -> VarianceView {
    use crate::variance::VarianceRow;
    let cur = &v.currency;
    let view = |r: &VarianceRow, href: Option<String>| {
        let change = gpuledger_core::money::cents(r.change);
        // In cents that add up to the change, with no residue cell: a part shows a cent only
        // where it carries some.
        let parts =
            gpuledger_core::money::cents_adding_up(&[r.volume, r.idle, r.mix, r.price], r.change);
        let (volume, idle, mix, price) = (parts[0], parts[1], parts[2], parts[3]);
        VarianceRowView {
            key: r.key.clone(),
            href,
            previous: money(r.previous_cost, cur),
            cost: money(r.cost, cur),
            change: money(change, cur),
            volume: money(volume, cur),
            idle: money(idle, cur),
            mix: money(mix, cur),
            price: money(price, cur),
        }
    };
    let mut rows: Vec<VarianceRowView> = v
        .rows
        .iter()
        .take(TOP_ROWS)
        .map(|r| {
            let href =
                v.by.is_owner()
                    .then(|| charts::drill_href(month, v.by, &r.key));
            view(r, href)
        })
        .collect();
    if v.rows.len() > TOP_ROWS {
        let rest = VarianceRow::sum(
            &format!("{} others", v.rows.len() - TOP_ROWS),
            &v.rows[TOP_ROWS..],
        );
        rows.push(view(&rest, None));
    }
    let api = format!("/api/v1/variance?month={month}&by={}", v.by.as_str());
    VarianceView {
        dimension: v.by.as_str().replace('_', " "),
        month_to_date: v.month_to_date,
        rows,
        total: view(&v.total, None),
        csv: format!("{api}&format=csv"),
        api,
    }
}

/// The month's commitment discounts as the review shows them, in the page's currency.
#[derive(Default)]
pub struct CommitmentsView {
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

pub fn commitments_view(
    c: &crate::commitments::Commitments,
    currency: &str,
    month: &str,
) -> CommitmentsView {
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
    CommitmentsView {
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
        unused_on_owners: c.unused_charged_to == crate::commitments::UnusedCharge::CoveredOwners,
        api: format!("/api/v1/billing/commitments?month={month}"),
    }
}

/// Commitment a change frees, as money; "" where it frees none (the pages then say nothing).
fn freed_text(amount: Decimal, currency: &str) -> String {
    if amount.is_zero() {
        String::new()
    } else {
        money(amount, currency)
    }
}

/// The month's scale-to-zero windows as the review lists them, in the page's currency.
pub struct ScaleToZeroView {
    pub rows: Vec<ScaleToZeroRow>,
    /// In cash; and the commitment freed besides ("" where none).
    pub total: String,
    pub frees: String,
    pub api: String,
    /// Where the month so far is shorter than a window's evidence needs and none was found:
    /// how many days it has, and the month before's review, which lists its windows.
    pub too_soon: Option<(String, String)>,
}

pub struct ScaleToZeroRow {
    pub owner: String,
    pub href: String,
    pub windows: Vec<String>,
    pub hours_per_week: u32,
    /// "108 h × 4 GPUs = 432 GPU-hours at $0.85".
    pub evidence: String,
    pub saving: String,
    /// Commitment freed by turning it off in hours a commitment covered ("" where none).
    pub frees: String,
}

pub fn scale_to_zero_view(
    found: &[crate::scale_to_zero::OwnerWindows],
    currency: &str,
    month: &str,
    (from, to, now): (i64, i64, i64),
) -> ScaleToZeroView {
    let seen_ms = to.min(now) - from;
    let weeks_needed = crate::scale_to_zero::MIN_WEEKS as i64 * 7 * gpuledger_core::time::DAY_MS;
    let too_soon = (found.is_empty() && seen_ms < weeks_needed).then(|| {
        let days =
            (seen_ms.max(0) + gpuledger_core::time::DAY_MS - 1) / gpuledger_core::time::DAY_MS;
        let before =
            gpuledger_core::time::month_label(gpuledger_core::time::month_start_ms(from - 1));
        (
            match days {
                1 => "1 day".to_owned(),
                n => format!("{n} days"),
            },
            format!("/review/{before}#scale-to-zero"),
        )
    });
    let shown: Vec<&crate::scale_to_zero::OwnerWindows> = found
        .iter()
        .filter(|f| f.candidate.currency == currency)
        .collect();
    let total: Decimal = shown.iter().map(|f| f.candidate.saving).sum();
    let frees: Decimal = shown.iter().map(|f| f.candidate.frees_commitment).sum();
    let freed = |d: Decimal| freed_text(d, currency);
    ScaleToZeroView {
        rows: shown
            .iter()
            .take(TOP_ROWS)
            .map(|f| {
                let c = &f.candidate;
                let gpus = if c.quiet_hours == 0 {
                    0.0
                } else {
                    c.gpu_hours / f64::from(c.quiet_hours)
                };
                ScaleToZeroRow {
                    owner: format!("{}: {}", f.dimension.replace('_', " "), c.key),
                    href: format!(
                        "/review/{month}/{}?{}",
                        f.dimension,
                        charts::query(&[("key", &c.key)])
                    ),
                    windows: c.windows.iter().map(|w| w.label.clone()).collect(),
                    hours_per_week: c.hours_per_week,
                    evidence: format!(
                        "{} h × {} GPUs = {} GPU-hours at {}",
                        crate::format::thousands(i64::from(c.quiet_hours)),
                        (gpus * 10.0).round() / 10.0,
                        crate::format::whole(c.gpu_hours),
                        c.per_gpu_hour
                            .map_or_else(|| "—".to_owned(), |r| money(r, currency)),
                    ),
                    saving: money(c.saving, currency),
                    frees: freed(c.frees_commitment),
                }
            })
            .collect(),
        total: money(total, currency),
        frees: freed(frees),
        api: format!("/api/v1/scale-to-zero?month={month}"),
        too_soon,
    }
}

/// The month's shape per GPU instance type as the review draws it.
pub struct ShapeView {
    pub types: Vec<TypeShapeView>,
    pub api: String,
}

pub struct TypeShapeView {
    pub instance_type: String,
    /// "floor 48 · median 48 · peak 64 GPUs · 35,712 GPU-hours".
    pub summary: String,
    /// The week: (x, y, class, title) per hour.
    pub cells: Vec<(f64, f64, &'static str, String)>,
    /// Per team: (team, floor, median, peak, GPU-hours).
    pub owners: Vec<(String, String, String, String, String)>,
}

/// The week's cells: 7 rows (Monday first) of 24 hours, after a column of day names.
pub const SHAPE_CELL: f64 = 14.0;
pub const SHAPE_LABEL_WIDTH: f64 = 34.0;
const WEEKDAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// GPUs held as a share of the type's peak, in the heatmap's six shades.
fn shape_class(gpus: f64, peak: f64) -> &'static str {
    let share = if peak > 0.0 { gpus / peak * 100.0 } else { 0.0 };
    match share {
        s if s < 5.0 => "h0",
        s if s < 20.0 => "h1",
        s if s < 40.0 => "h2",
        s if s < 60.0 => "h3",
        s if s < 80.0 => "h4",
        _ => "h5",
    }
}

fn gpus(x: f64) -> String {
    let rounded = (x * 10.0).round() / 10.0;
    if rounded.fract() == 0.0 {
        crate::format::whole(rounded)
    } else {
        format!("{rounded:.1}")
    }
}

pub fn shape_view(types: &[crate::shape::TypeShape], month: &str) -> ShapeView {
    ShapeView {
        types: types
            .iter()
            .take(TOP_ROWS)
            .map(|t| {
                let s = &t.spread;
                let mut cells = Vec::with_capacity(7 * 24);
                for (d, hours) in t.week.iter().enumerate() {
                    for (h, g) in hours.iter().enumerate() {
                        cells.push((
                            SHAPE_LABEL_WIDTH + h as f64 * SHAPE_CELL,
                            d as f64 * SHAPE_CELL,
                            shape_class(*g, s.peak),
                            format!(
                                "{} {h:02}:00 UTC: {} GPUs on average",
                                WEEKDAYS.get(d).copied().unwrap_or(""),
                                gpus(*g)
                            ),
                        ));
                    }
                }
                TypeShapeView {
                    instance_type: t.instance_type.clone(),
                    summary: format!(
                        "floor {} · median {} · peak {} GPUs · {} GPU-hours",
                        gpus(s.floor),
                        gpus(s.median),
                        gpus(s.peak),
                        crate::format::whole(s.gpu_hours)
                    ),
                    cells,
                    owners: t
                        .owners
                        .iter()
                        .map(|o| {
                            (
                                o.owner.clone().unwrap_or_else(|| "(no team)".into()),
                                gpus(o.spread.floor),
                                gpus(o.spread.median),
                                gpus(o.spread.peak),
                                crate::format::whole(o.spread.gpu_hours),
                            )
                        })
                        .collect(),
                }
            })
            .collect(),
        api: format!("/api/v1/shape?month={month}"),
    }
}

/// One option of a type's purchase mix as the review lists it.
pub struct PurchaseRow {
    /// The type, on its first option's row only.
    pub instance_type: String,
    pub choice: String,
    pub cost: String,
    pub break_even: String,
    /// GPU-hours of experiments' work on spot.
    pub on_spot: String,
    pub cheapest: bool,
    /// What keeps a commitment from being priced, on the type's last row.
    pub missing: String,
}

pub fn purchase_view(mixes: &[crate::purchase::TypeMix]) -> Vec<PurchaseRow> {
    let mut rows = Vec::new();
    for m in mixes {
        if m.options.is_empty() {
            rows.push(PurchaseRow {
                instance_type: m.instance_type.clone(),
                choice: String::new(),
                cost: String::new(),
                break_even: String::new(),
                on_spot: String::new(),
                cheapest: false,
                missing: m.missing.clone().unwrap_or_default(),
            });
            continue;
        }
        let last = m.options.len().saturating_sub(1);
        for (i, o) in m.options.iter().enumerate() {
            rows.push(PurchaseRow {
                instance_type: if i == 0 {
                    format!(
                        "{} (floor {} × {} GPUs)",
                        m.instance_type, m.floor_instances, m.gpus_per_instance
                    )
                } else {
                    String::new()
                },
                choice: o.choice.clone(),
                cost: money(o.cost, &m.currency),
                break_even: o
                    .break_even_percent
                    .map_or_else(String::new, |p| format!("{p}% of hours")),
                on_spot: if o.spot_gpu_hours > 0.0 {
                    format!("{} GPU-h", crate::format::whole(o.spot_gpu_hours))
                } else {
                    String::new()
                },
                cheapest: o.choice == m.cheapest && m.options.len() > 1,
                missing: if i == last {
                    m.missing.clone().unwrap_or_default()
                } else {
                    String::new()
                },
            });
        }
    }
    rows
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
        let (rows, total) = savings_view(&r, "2026-10", "USD", &OwnerSchema::default());
        assert_eq!(total, "$3,363.48");
        // A saving in euros is its own sum, and comes after the month's main currency's.
        r.spot.push(SpotCandidate {
            currency: "EUR".into(),
            experiment: "exp-eu".into(),
            saving: Decimal::from(5_000),
            ..r.spot[0].clone()
        });
        r.sum_savings();
        let (rows_eu, total_eu) = savings_view(&r, "2026-10", "USD", &OwnerSchema::default());
        assert_eq!(total_eu, "€5,000.00 + $3,363.48");
        assert_eq!(rows_eu.last().map(|r| r.saving.as_str()), Some("€5,000.00"));
        let shown: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.saving.as_str(), r.monthly.as_str()))
            .collect();
        assert_eq!(shown, [("$3,303.48", "$14,354.87"), ("$60.00", "—")]);
    }
}
