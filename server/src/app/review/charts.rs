//! The figures the review and drill-down pages draw, built from attributed parts: headline
//! figures, tables with bars, the daily stacked spend chart, and the GPU × day utilization
//! heatmap. All are plain numbers, words and SVG coordinates for the templates (no script, no
//! inline style).

use std::collections::{BTreeMap, HashMap};

use chrono::Datelike;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use gpuledger_core::allocation::costliest;
use gpuledger_core::allocation::period_start;
use gpuledger_core::allocation::AllocationRow;
use gpuledger_core::allocation::Costliest;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::allocation::Step;

use gpuledger_core::attribution::Attribution;
use gpuledger_core::attribution::Kind;
use gpuledger_core::attribution::Part;
use gpuledger_core::carbon::Grid;
use gpuledger_core::telemetry::HostRow;

/// `key=value&…` with each value URL-encoded, for links built from label values.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

/// The drill-down page of one key.
pub fn drill_href(month: &str, by: GroupBy, key: &str) -> String {
    format!("/review/{month}/{}?{}", by.as_str(), query(&[("key", key)]))
}

/// The allocation API query a figure comes from (JSON), `filters` narrowing it like the page.
pub fn api_href(
    from: &str,
    to: &str,
    by: GroupBy,
    step: &str,
    filters: &[(GroupBy, String)],
) -> String {
    let mut pairs: Vec<(&str, &str)> = vec![
        ("from", from),
        ("to", to),
        ("by", by.as_str()),
        ("step", step),
    ];
    for (dim, value) in filters {
        pairs.push((dim.as_str(), value));
    }
    format!("/api/v1/allocation?{}", query(&pairs))
}

/// The same query as CSV, for a table's download link.
pub fn csv_href(
    from: &str,
    to: &str,
    by: GroupBy,
    step: &str,
    filters: &[(GroupBy, String)],
) -> String {
    format!("{}&format=csv", api_href(from, to, by, step, filters))
}

/// A headline figure and where it comes from.
pub struct Figure {
    pub value: String,
    pub caption: String,
    pub href: String,
}

/// The energy and emissions figures of a month or a key, from its `(energy_kwh,
/// energy_measured_share, kg_co2e)`: the figures, or why there are none (nothing measured the
/// energy, or some was drawn where the grid's intensity is unknown).
pub fn footprint_figures(
    footprint: Option<(Option<f64>, Option<f64>, Option<f64>)>,
    (energy_href, co2e_href): (String, String),
) -> [Figure; 2] {
    let (kwh, share, kg) = footprint.unwrap_or_default();
    let energy = Figure {
        value: match kwh {
            Some(_) => format!("{} kWh", energy_text(kwh, share)),
            None => "unknown".into(),
        },
        caption: match share {
            Some(m) if m >= 0.999 => "energy measured by the GPUs".into(),
            Some(m) if m > 0.0 => format!(
                "energy measured by the GPUs, on {:.0}% of the GPU-hours (the rest report none)",
                m * 100.0
            ),
            _ => "energy: no GPU here reports it".into(),
        },
        href: energy_href,
    };
    let co2e = Figure {
        value: match kg {
            Some(_) => format!("{} kg CO2e", co2e_text(kg, share)),
            None => "unknown".into(),
        },
        caption: match (kwh, kg) {
            (_, Some(_)) => "emissions of that energy, from each host's grid".into(),
            (Some(_), None) => {
                "emissions: some hosts' grid intensity is unknown ([carbon] in the config)".into()
            }
            (None, None) => "emissions: no measured energy".into(),
        },
        href: co2e_href,
    };
    [energy, co2e]
}

/// What the bill carries in currencies other than the page's, in words ("" when none).
pub fn other_currencies(others: &[(String, Decimal)]) -> String {
    others
        .iter()
        .map(|(c, d)| crate::format::money(*d, c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The dimension that plays `role` in `schema` (the role's default name where none does).
pub fn by_role(
    schema: &gpuledger_core::owners::OwnerSchema,
    role: gpuledger_core::owners::Role,
) -> GroupBy {
    GroupBy::role(schema, role).unwrap_or(GroupBy::Owner(role.as_str()))
}

/// Commitment a change frees, as money; "" where it frees none (the pages then say nothing).
pub fn freed_text(amount: Decimal, currency: &str) -> String {
    if amount.is_zero() {
        String::new()
    } else {
        crate::format::money(amount, currency)
    }
}

/// The date of an RFC 3339 time.
pub fn day_label(rfc: &str) -> String {
    rfc.get(..10).unwrap_or(rfc).to_owned()
}

pub struct Bar {
    pub key: String,
    pub href: String,
    pub cost: String,
    pub share: String,
    /// Bar length in SVG units (0..=[`BAR_WIDTH`]).
    pub width: f64,
    pub held_idle: String,
    pub gpu_hours: String,
    pub avg_util: String,
    pub energy_kwh: String,
    pub co2e_kg: String,
    /// Used GPU-hours measured by presence, in words, where there are any.
    pub presence: Option<String>,
    /// The keys past a table's first rows, summed (`key` says how many; `href` is the CSV).
    pub rest: bool,
}

/// The longest share bar in a spend table: narrow enough that two tables sit side by side at
/// 1280 px with every column (energy and emissions included) on one line.
pub const BAR_WIDTH: f64 = 44.0;

pub struct Table {
    pub title: String,
    pub by: &'static str,
    /// The key column's heading: "Model", "Pricing", …
    pub column: String,
    pub csv: String,
    pub rows: Vec<Bar>,
}

/// A page's spend tables, one per dimension.
pub struct Tables {
    pub list: Vec<Table>,
}

impl Tables {
    /// Whether any row carries used-by-presence hours (the page explains the mark once).
    pub fn presence_note(&self) -> bool {
        (self.list.iter()).any(|t| t.rows.iter().any(|r| r.presence.is_some()))
    }
}

/// A dimension's column heading: an owner dimension's name as words (`cost_center` → "Cost
/// center").
pub fn column_of(by: GroupBy) -> String {
    match by {
        GroupBy::Owner(name) => {
            let words = name.replace('_', " ");
            let mut chars = words.chars();
            chars.next().map_or_else(String::new, |c| {
                c.to_uppercase().chain(chars).collect::<String>()
            })
        }
        GroupBy::Cluster => "Cluster".into(),
        GroupBy::Host => "Host".into(),
        GroupBy::Gpu => "GPU".into(),
        GroupBy::InstanceType => "Instance type".into(),
        GroupBy::PricingCategory => "Pricing".into(),
    }
}

pub fn title_of(by: GroupBy) -> String {
    let column = column_of(by);
    match by {
        GroupBy::Gpu => "By GPU".into(),
        _ => format!("By {}", column.to_lowercase()),
    }
}

/// Rows a page's table shows before the rest are summed into one: a month of a large fleet has
/// tens of thousands of experiments, more than anyone reads (or a browser draws quickly); the
/// table's CSV lists every one.
pub const TABLE_ROWS: usize = 20;

/// One month's spend in `currency` by `by`: its [`TABLE_ROWS`] costliest keys with bars and
/// shares of `total`, each linking to its drill-down, and the others summed into one row; the
/// whole table links to the allocation API's CSV of the same query, every key in it. Emissions
/// from each host's intensity in `grid`.
pub fn table(
    (a, grid): (&Attribution, &Grid),
    by: GroupBy,
    (month, next_month): (&str, &str),
    filters: &[(GroupBy, String)],
    total: Decimal,
    (currency, others): (&str, &[(String, Decimal)]),
) -> Table {
    let Costliest { rows, rest } = costliest(a, by, currency, grid, TABLE_ROWS);
    let csv = csv_href(month, next_month, by, "month", filters);
    // Bars are to the longest row's scale; the rest's, often most of the spend, is cut to it.
    let max = rows
        .iter()
        .map(|r| r.cost)
        .max()
        .unwrap_or(Decimal::ONE)
        .max(Decimal::new(1, 6));
    let bar = |r: AllocationRow, key: String, href: String, rest: bool| Bar {
        width: (r.cost / max).to_f64().unwrap_or(0.0).clamp(0.0, 1.0) * BAR_WIDTH,
        share: if total.is_zero() {
            "—".into()
        } else {
            format!("{}%", (r.cost / total * Decimal::from(100)).round_dp(1))
        },
        cost: crate::format::money(r.cost, currency),
        held_idle: crate::format::money(r.held_idle_cost, currency),
        gpu_hours: crate::format::whole(r.gpu_hours),
        avg_util: r
            .avg_util
            .map_or_else(|| "—".into(), |u| format!("{u:.0}%")),
        energy_kwh: energy_text(r.energy_kwh, r.energy_measured_share),
        co2e_kg: co2e_text(r.kg_co2e, r.energy_measured_share),
        presence: presence_text(r.presence_gpu_hours, r.gpu_hours),
        href,
        key,
        rest,
    };
    let mut bars: Vec<Bar> = rows
        .into_iter()
        .map(|mut r| {
            let href = drill_href(month, by, &r.key);
            let key = std::mem::take(&mut r.key);
            bar(r, key, href, false)
        })
        .collect();
    if let Some((n, r)) = rest {
        // The count is of this currency's keys; where the month is billed in others too (`a` holds
        // the shown currency's parts alone, so the caller names the others), the CSV also lists
        // theirs, so the row says which it counts.
        let key = if !others.is_empty() {
            format!("{} more in {currency}", crate::format::thousands(n as i64))
        } else {
            format!("{} more", crate::format::thousands(n as i64))
        };
        bars.push(bar(r, key, csv.clone(), true));
    }
    Table {
        title: title_of(by),
        by: by.as_str(),
        column: column_of(by),
        csv,
        rows: bars,
    }
}

/// Measured energy in kWh as people read it: `unknown` where no GPU measured any (not 0), and
/// `≥ 1,234` where only part of the GPU time was measured (the rest used energy too).
pub fn energy_text(kwh: Option<f64>, measured_share: Option<f64>) -> String {
    at_least(kwh, measured_share)
}

/// kg CO2e of the measured energy, read as [`energy_text`]: `unknown` where the energy or a
/// host's grid intensity is.
pub fn co2e_text(kg: Option<f64>, measured_share: Option<f64>) -> String {
    at_least(kg, measured_share)
}

fn at_least(x: Option<f64>, measured_share: Option<f64>) -> String {
    match x {
        None => "unknown".into(),
        Some(x) if measured_share.is_some_and(|m| m < 0.999) => {
            format!("≥ {}", crate::format::whole(x))
        }
        Some(x) => crate::format::whole(x),
    }
}

/// `12 of 40 GPU-h used by presence`, where a row's used time includes any: GPUs whose activity
/// nothing measures (an A100's MIG devices), held by a process.
pub fn presence_text(presence_gpu_hours: f64, gpu_hours: f64) -> Option<String> {
    let hours = |h: f64| {
        if h < 0.5 {
            "under 1".to_owned()
        } else {
            crate::format::whole(h)
        }
    };
    (presence_gpu_hours > 0.0).then(|| {
        format!(
            "{} of {} GPU-h used by presence: on MIG devices that cannot measure their activity, \
             a process holding one counts as using it",
            hours(presence_gpu_hours),
            hours(gpu_hours)
        )
    })
}

/// A labelled line across the daily chart: its height in SVG units and the dollars it marks.
pub struct Tick {
    pub y: f64,
    pub label: String,
}

/// Room left of the daily chart's bars for its dollar axis.
pub const AXIS_WIDTH: f64 = 64.0;

pub struct DayBar {
    pub label: String,
    pub href: String,
    pub x: f64,
    pub used_y: f64,
    pub used_h: f64,
    pub held_y: f64,
    pub held_h: f64,
    pub idle_y: f64,
    pub idle_h: f64,
    pub total: String,
    /// Part of the day is estimated: no bill covers it yet.
    pub estimated: bool,
}

/// The daily stacked spend chart: its bars, width and dollar axis.
pub struct Chart {
    pub days: Vec<DayBar>,
    pub width: f64,
    pub ticks: Vec<Tick>,
    /// Some day is estimated: no bill covers it yet (the chart marks it).
    pub estimated: bool,
}

fn day_text(ms: i64, format: &str) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(String::new, |d| d.format(format).to_string())
}

/// Daily stacked spend in `currency` (used / held idle / idle and unmonitored); each day links
/// to the allocation API's rows for that day.
pub fn days(
    a: &Attribution,
    from: i64,
    to: i64,
    filters: &[(GroupBy, String)],
    currency: &str,
) -> Chart {
    let mut per_day: BTreeMap<i64, (Decimal, Decimal, Decimal)> = BTreeMap::new();
    let mut estimated: std::collections::BTreeSet<i64> = std::collections::BTreeSet::new();
    let mut d = from;
    while d < to {
        per_day.insert(d, Default::default());
        d += gpuledger_core::time::DAY_MS;
    }
    for p in a.parts.iter().filter(|p| p.currency == currency) {
        let day = period_start(p.hour_ms, Step::Day);
        if p.estimated {
            estimated.insert(day);
        }
        let e = per_day.entry(day).or_default();
        match p.kind {
            Kind::Used => e.0 += p.cost,
            Kind::HeldIdle => e.1 += p.cost,
            Kind::Idle | Kind::Unmonitored => e.2 += p.cost,
        }
    }
    let max = per_day
        .values()
        .map(|(u, h, i)| *u + *h + *i)
        .max()
        .unwrap_or(Decimal::ONE)
        .max(Decimal::new(1, 6));
    const HEIGHT: f64 = 160.0;
    const STEP: f64 = 22.0;
    // Lines at 0, half and the tallest day.
    let ticks = [0i64, 1, 2]
        .into_iter()
        .map(|i| Tick {
            y: HEIGHT - HEIGHT * i as f64 / 2.0,
            label: crate::format::money(max * Decimal::from(i) / Decimal::from(2), currency),
        })
        .collect();
    let scale = |v: Decimal| (v / max).to_f64().unwrap_or(0.0).max(0.0) * HEIGHT;
    let bars = per_day
        .into_iter()
        .enumerate()
        .map(|(i, (day, (u, h, idle)))| {
            let (uh, hh, ih) = (scale(u), scale(h), scale(idle));
            let day_from = day_text(day, "%Y-%m-%d");
            let day_to = day_text(day + gpuledger_core::time::DAY_MS, "%Y-%m-%d");
            DayBar {
                label: chrono::DateTime::from_timestamp_millis(day)
                    .map_or_else(String::new, |d| d.day().to_string()),
                href: api_href(&day_from, &day_to, GroupBy::TEAM, "day", filters),
                x: AXIS_WIDTH + i as f64 * STEP,
                idle_y: HEIGHT - ih,
                idle_h: ih,
                held_y: HEIGHT - ih - hh,
                held_h: hh,
                used_y: HEIGHT - ih - hh - uh,
                used_h: uh,
                total: crate::format::money(u + h + idle, currency),
                estimated: estimated.contains(&day),
            }
        })
        .collect::<Vec<_>>();
    Chart {
        width: AXIS_WIDTH + bars.len() as f64 * STEP,
        estimated: bars.iter().any(|d| d.estimated),
        days: bars,
        ticks,
    }
}

pub struct HeatCell {
    pub x: f64,
    /// `h0` (idle) … `h5` (busy), or `none` where no utilization was reported.
    pub class: &'static str,
    pub title: String,
}

pub struct HeatRow {
    pub y: f64,
    pub label: String,
    /// Host, index and UUID, in the row's tooltip.
    pub full: String,
    pub href: String,
    pub cells: Vec<HeatCell>,
}

pub struct Heatmap {
    pub rows: Vec<HeatRow>,
    pub day_labels: Vec<(f64, String)>,
    pub width: f64,
    pub height: f64,
    /// GPUs in the range; `rows` shows the costliest of them.
    pub total_gpus: usize,
    pub csv: String,
}

/// Per GPU: its cost, its host, and per day (utilization × seconds, seconds known).
type GpuDays = (Decimal, i64, BTreeMap<i64, (f64, f64)>);

pub const HEAT_CELL: f64 = 14.0;
pub const HEAT_LABEL_WIDTH: f64 = 230.0;

fn heat_class(util: Option<f64>) -> &'static str {
    match util {
        None => "none",
        Some(u) if u < 5.0 => "h0",
        Some(u) if u < 20.0 => "h1",
        Some(u) if u < 40.0 => "h2",
        Some(u) if u < 60.0 => "h3",
        Some(u) if u < 80.0 => "h4",
        Some(_) => "h5",
    }
}

/// GPU × day utilization for the `limit` costliest GPUs in `parts` (on `hosts`): each cell is
/// the GPU's average utilization that day over the time it reported.
#[allow(clippy::too_many_arguments)]
pub fn heatmap(
    (parts, hosts): (&[Part], &HashMap<i64, HostRow>),
    from: i64,
    to: i64,
    month: &str,
    next_month: &str,
    filters: &[(GroupBy, String)],
    limit: usize,
    labels: &HashMap<String, String>,
) -> Heatmap {
    // Per GPU: cost, and per day (util × seconds, seconds known).
    let mut gpus: HashMap<&str, GpuDays> = HashMap::new();
    for p in parts {
        let Some(uuid) = p.gpu_uuid.as_deref() else {
            continue;
        };
        let g = gpus
            .entry(uuid)
            .or_insert((Decimal::ZERO, p.host_id, BTreeMap::new()));
        g.0 += p.cost;
        let d = g.2.entry(period_start(p.hour_ms, Step::Day)).or_default();
        d.0 += p.util_gpu_seconds;
        d.1 += p.util_known_seconds;
    }
    let total_gpus = gpus.len();
    let mut order: Vec<(&str, GpuDays)> = gpus.into_iter().collect();
    order.sort_by(|(ua, a), (ub, b)| b.0.cmp(&a.0).then(ua.cmp(ub)));
    order.truncate(limit);
    let day_count = ((to - from) / (gpuledger_core::time::DAY_MS)).max(0) as usize;
    let rows = order
        .into_iter()
        .enumerate()
        .map(|(i, (uuid, (_, host_id, per_day)))| {
            let host = hosts.get(&host_id).map_or("?", |h| h.hostname.as_str());
            // Not in the fleet any more: the end of its UUID tells it from its neighbours.
            let gpu = labels
                .get(uuid)
                .cloned()
                .unwrap_or_else(|| gpuledger_core::telemetry::gpu_label(None, uuid, false));
            HeatRow {
                y: i as f64 * HEAT_CELL,
                label: format!("{} · {gpu}", crate::format::clip(host, 24)),
                full: format!("{host} · {gpu} · {uuid}"),
                href: drill_href(month, GroupBy::Gpu, uuid),
                cells: (0..day_count)
                    .map(|d| {
                        let day = from + d as i64 * gpuledger_core::time::DAY_MS;
                        let util = per_day
                            .get(&day)
                            .filter(|(_, known)| *known > 0.0)
                            .map(|(u, known)| u / known);
                        HeatCell {
                            x: HEAT_LABEL_WIDTH + d as f64 * HEAT_CELL,
                            class: heat_class(util),
                            title: format!(
                                "{host} {uuid} on {}: {}",
                                day_text(day, "%Y-%m-%d"),
                                util.map_or_else(|| "no data".into(), |u| format!("{u:.0}% busy"))
                            ),
                        }
                    })
                    .collect(),
            }
        })
        .collect::<Vec<_>>();
    let day_labels = (0..day_count)
        .filter(|d| d % 5 == 0)
        .map(|d| {
            (
                HEAT_LABEL_WIDTH + d as f64 * HEAT_CELL,
                day_text(from + d as i64 * gpuledger_core::time::DAY_MS, "%-d"),
            )
        })
        .collect();
    Heatmap {
        height: rows.len() as f64 * HEAT_CELL + 16.0,
        rows,
        day_labels,
        width: HEAT_LABEL_WIDTH + day_count as f64 * HEAT_CELL,
        total_gpus,
        csv: csv_href(month, next_month, GroupBy::Gpu, "day", filters),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(team: &str, cost: i64, currency: &str) -> Part {
        Part {
            hour_ms: 1_777_593_600_000,
            host_id: 1,
            gpu_uuid: Some("GPU-1".into()),
            owner: [("team", team)].into_iter().collect(),
            kind: Kind::Used,
            pricing_category: "on_demand".into(),
            currency: currency.into(),
            cost: Decimal::from(cost),
            estimated: false,
            gpu_seconds: 3600.0,
            util_gpu_seconds: 0.0,
            util_known_seconds: 0.0,
            energy_j: 0.0,
            energy_known_seconds: 0.0,
        }
    }

    /// The summed row counts the table's currency's keys; where the month is billed in other
    /// currencies too (the CSV lists theirs as well), it says which currency it counts.
    #[test]
    fn the_rest_row_says_which_currency_it_counts() {
        let parts: Vec<Part> = (0..TABLE_ROWS as i64 + 2)
            .map(|i| part(&format!("team-{i:02}"), 100 + i, "USD"))
            .collect();
        // As the review and the drill-downs call it: the page's currency taken apart first.
        let rest_key = |parts: Vec<Part>| {
            let all = Attribution {
                parts,
                unattributed: Default::default(),
                unattributed_hours: Default::default(),
                hosts: Default::default(),
            };
            let shown = gpuledger_core::allocation::in_main_currency(&all);
            let grid = crate::carbon::grid(&shown.attribution, &Default::default());
            let t = table(
                (&shown.attribution, &grid),
                GroupBy::TEAM,
                ("2026-10", "2026-11"),
                &[],
                Decimal::from(1),
                (&shown.currency, &shown.others),
            );
            t.rows.last().map(|r| r.key.clone()).unwrap_or_default()
        };
        assert_eq!(rest_key(parts.clone()), "2 more");
        let mut both = parts;
        both.extend((0..5).map(|i| part(&format!("eu-{i}"), 10, "EUR")));
        assert_eq!(rest_key(both), "2 more in USD");
    }
}
