//! Variance explained: why each owner's spend changed from one period to the next, in four
//! parts that add up exactly to the change.
//!
//! An owner's cost is its GPU-hours times what a GPU-hour cost, over the instance types it ran
//! on. Against the previous period:
//! - **volume**: the change in working GPU-hours (used and unmonitored), at the previous period's
//!   average cost per GPU-hour, and the change in cost that carries no GPU-hours (a GPU
//!   instance no agent reports: more or fewer such machines);
//! - **idle**: the change in idle and held-idle GPU-hours, at the same average (the `(idle)` key
//!   is all idle time, so its change is mostly this);
//! - **mix**: moving GPU-hours between instance types of different cost per GPU-hour (this
//!   period's hours at the previous period's cost per GPU-hour of each type, against the same
//!   hours at the previous average);
//! - **price**: the rest, which is this period's hours times the change in cost per GPU-hour of
//!   each type (a new price, a discount, on demand moved to spot).
//!
//! Averages and costs per GPU-hour are of the cost that carries GPU-hours only.
//!
//! The first three are rounded to the nano-unit and price is what is left, so the parts sum to
//! the change exactly. A type new this period is priced at its own cost (its hours count as
//! mix, not price); an owner with no GPU-hours before puts its whole change under volume.

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::Serialize;

use crate::allocation::{key_str, GroupBy};
use crate::attribution::{Attribution, Kind, Part};

/// Decimals kept in the volume, idle and mix parts (price takes what is left).
const SCALE: u32 = 9;

/// One owner's change between two periods, explained.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VarianceRow {
    pub key: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub previous_cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    /// `cost − previous_cost` = `volume + idle + mix + price`.
    #[serde(with = "rust_decimal::serde::str")]
    pub change: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub volume: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub idle: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub mix: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub price: Decimal,
    pub previous_gpu_hours: f64,
    pub gpu_hours: f64,
}

impl VarianceRow {
    /// The parts of several rows added up (they still sum to the change), under `key`.
    pub fn sum<'a>(key: &str, rows: impl IntoIterator<Item = &'a VarianceRow>) -> VarianceRow {
        let mut t = VarianceRow {
            key: key.to_owned(),
            previous_cost: Decimal::ZERO,
            cost: Decimal::ZERO,
            change: Decimal::ZERO,
            volume: Decimal::ZERO,
            idle: Decimal::ZERO,
            mix: Decimal::ZERO,
            price: Decimal::ZERO,
            previous_gpu_hours: 0.0,
            gpu_hours: 0.0,
        };
        for r in rows {
            t.previous_cost += r.previous_cost;
            t.cost += r.cost;
            t.change += r.change;
            t.volume += r.volume;
            t.idle += r.idle;
            t.mix += r.mix;
            t.price += r.price;
            t.previous_gpu_hours += r.previous_gpu_hours;
            t.gpu_hours += r.gpu_hours;
        }
        t
    }
}

/// One owner's cost and GPU-hours on one instance type in one period.
#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    /// All of the cost, and the part of it that carries no GPU-hours.
    cost: Decimal,
    cost_without_hours: Decimal,
    hours: Decimal,
    idle_hours: Decimal,
}

impl Cell {
    /// Cost per GPU-hour, of the cost that carries GPU-hours.
    fn rate(&self) -> Option<Decimal> {
        (!self.hours.is_zero()).then(|| (self.cost - self.cost_without_hours) / self.hours)
    }
}

/// Per instance type; keys borrowed from the parts (a month of a large fleet has a part per host
/// and owner).
type Cells<'a> = BTreeMap<&'a str, Cell>;

fn hours_of(p: &Part) -> Decimal {
    Decimal::try_from(p.gpu_seconds / 3600.0)
        .unwrap_or_default()
        .round_dp(SCALE)
}

/// Each key's cells per instance type, in `currency`.
fn cells<'a>(a: &'a Attribution, by: GroupBy, currency: &str) -> BTreeMap<&'a str, Cells<'a>> {
    let mut out: BTreeMap<&str, Cells> = BTreeMap::new();
    for p in a.parts.iter().filter(|p| p.currency == currency) {
        let c = out
            .entry(key_str(p, by, a))
            .or_default()
            .entry(key_str(p, GroupBy::InstanceType, a))
            .or_default();
        let hours = hours_of(p);
        c.cost += p.cost;
        if hours.is_zero() {
            c.cost_without_hours += p.cost;
        }
        c.hours += hours;
        if matches!(p.kind, Kind::Idle | Kind::HeldIdle) {
            c.idle_hours += hours;
        }
    }
    out
}

fn total(cells: &Cells) -> Cell {
    cells.values().fold(Cell::default(), |t, c| Cell {
        cost: t.cost + c.cost,
        cost_without_hours: t.cost_without_hours + c.cost_without_hours,
        hours: t.hours + c.hours,
        idle_hours: t.idle_hours + c.idle_hours,
    })
}

fn explain_key(key: String, before: &Cells, after: &Cells) -> VarianceRow {
    let (b, a) = (total(before), total(after));
    let change = a.cost - b.cost;
    let (mut volume, mut idle, mut mix) = (change, Decimal::ZERO, Decimal::ZERO);
    if let Some(average) = b.rate() {
        let round = |d: Decimal| d.round_dp(SCALE);
        let (work_before, work_after) = (b.hours - b.idle_hours, a.hours - a.idle_hours);
        volume = round(
            (work_after - work_before) * average + a.cost_without_hours - b.cost_without_hours,
        );
        idle = round((a.idle_hours - b.idle_hours) * average);
        // This period's hours at the previous period's cost per GPU-hour of each type.
        let at_old_prices: Decimal = after
            .iter()
            .map(|(t, c)| {
                let rate = before
                    .get(t)
                    .and_then(Cell::rate)
                    .or_else(|| c.rate())
                    .unwrap_or_default();
                c.hours * rate
            })
            .sum();
        mix = round(at_old_prices - a.hours * average);
    }
    let to_f64 = |d: Decimal| rust_decimal::prelude::ToPrimitive::to_f64(&d).unwrap_or(0.0);
    VarianceRow {
        key,
        previous_cost: b.cost,
        cost: a.cost,
        change,
        price: change - volume - idle - mix,
        volume,
        idle,
        mix,
        previous_gpu_hours: to_f64(b.hours),
        gpu_hours: to_f64(a.hours),
    }
}

/// Why each key's spend in `currency` (keys `by` one dimension) changed from `previous` to
/// `current`: largest change first (by size), then by key.
pub fn explain(
    previous: &Attribution,
    current: &Attribution,
    by: GroupBy,
    currency: &str,
) -> Vec<VarianceRow> {
    let (mut before, mut after) = (cells(previous, by, currency), cells(current, by, currency));
    let keys: std::collections::BTreeSet<&str> =
        before.keys().chain(after.keys()).copied().collect();
    let mut rows: Vec<VarianceRow> = keys
        .into_iter()
        .map(|k| {
            let b = before.remove(k).unwrap_or_default();
            let a = after.remove(k).unwrap_or_default();
            explain_key(k.to_owned(), &b, &a)
        })
        .collect();
    rows.sort_by(|x, y| {
        y.change
            .abs()
            .cmp(&x.change.abs())
            .then_with(|| x.key.cmp(&y.key))
    });
    rows
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::telemetry::HostRow;

    fn host(id: i64, instance_type: &str) -> HostRow {
        HostRow {
            id,
            cluster: "c".into(),
            hostname: format!("h{id}"),
            provider: None,
            instance_id: None,
            instance_key: None,
            instance_type: Some(instance_type.into()),
            lifecycle: None,
            region: None,
            from_bill: false,
        }
    }

    /// A part of `hours` GPU-hours on host `host` (1: p4d, 2: g5) for `team`.
    fn part(host_id: i64, team: &str, kind: Kind, cost: &str, hours: f64) -> Part {
        Part {
            hour_ms: 0,
            host_id,
            gpu_uuid: Some(format!("GPU-{host_id}")),
            owner: [("team", team)].into_iter().collect(),
            kind,
            pricing_category: "on_demand".into(),
            currency: "USD".into(),
            cost: cost.parse().unwrap(),
            estimated: false,
            gpu_seconds: hours * 3600.0,
            util_gpu_seconds: 0.0,
            util_known_seconds: 0.0,
            energy_j: 0.0,
            energy_known_seconds: 0.0,
        }
    }

    fn month(parts: Vec<Part>) -> Attribution {
        Attribution {
            parts,
            unattributed: BTreeMap::new(),
            unattributed_hours: BTreeMap::new(),
            hosts: HashMap::from([(1, host(1, "p4d.24xlarge")), (2, host(2, "g5.xlarge"))]),
        }
    }

    fn one(before: Vec<Part>, after: Vec<Part>) -> VarianceRow {
        let rows = explain(&month(before), &month(after), GroupBy::TEAM, "USD");
        assert_eq!(rows.len(), 1, "{rows:?}");
        rows.into_iter().next().unwrap()
    }

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    fn parts(r: &VarianceRow) -> [Decimal; 4] {
        [r.volume, r.idle, r.mix, r.price]
    }

    #[test]
    fn twice_the_hours_at_the_same_price_is_volume() {
        let r = one(
            vec![part(1, "a", Kind::Used, "100", 10.0)],
            vec![part(1, "a", Kind::Used, "200", 20.0)],
        );
        assert_eq!(r.change, d("100"));
        assert_eq!(parts(&r), [d("100"), d("0"), d("0"), d("0")]);
    }

    #[test]
    fn the_same_hours_at_a_new_price_is_price() {
        let r = one(
            vec![part(1, "a", Kind::Used, "100", 10.0)],
            vec![part(1, "a", Kind::Used, "70", 10.0)],
        );
        assert_eq!(parts(&r), [d("0"), d("0"), d("0"), d("-30")]);
    }

    #[test]
    fn more_hours_held_idle_is_idle() {
        let r = one(
            vec![part(1, "a", Kind::Used, "100", 10.0)],
            vec![
                part(1, "a", Kind::Used, "100", 10.0),
                part(1, "a", Kind::HeldIdle, "40", 4.0),
            ],
        );
        assert_eq!(parts(&r), [d("0"), d("40"), d("0"), d("0")]);
    }

    #[test]
    fn moving_hours_to_a_cheaper_type_is_mix() {
        // 10 h at $10 on p4d, then 5 h there and 5 h on g5 at $2, prices unchanged.
        let r = one(
            vec![
                part(1, "a", Kind::Used, "100", 10.0),
                part(2, "a", Kind::Used, "10", 5.0),
            ],
            vec![
                part(1, "a", Kind::Used, "50", 5.0),
                part(2, "a", Kind::Used, "20", 10.0),
            ],
        );
        assert_eq!(r.change, d("-40"));
        assert_eq!(r.volume, d("0"));
        assert_eq!(r.price, d("0"));
        assert_eq!(r.mix, d("-40"));
    }

    #[test]
    fn a_new_owner_is_all_volume_and_a_gone_one_takes_its_cost_back() {
        let rows = explain(
            &month(vec![part(1, "old", Kind::Used, "90", 9.0)]),
            &month(vec![part(2, "new", Kind::Used, "12.5", 5.0)]),
            GroupBy::TEAM,
            "USD",
        );
        let by: BTreeMap<&str, &VarianceRow> = rows.iter().map(|r| (r.key.as_str(), r)).collect();
        assert_eq!(parts(by["new"]), [d("12.5"), d("0"), d("0"), d("0")]);
        assert_eq!(parts(by["old"]), [d("-90"), d("0"), d("0"), d("0")]);
        assert_eq!(rows[0].key, "old", "largest change first");
    }

    /// On uneven figures every row's parts add up to its change to the last decimal, and the
    /// rows to the total change.
    #[test]
    fn the_parts_add_up_exactly() {
        let before = vec![
            part(1, "a", Kind::Used, "1234.567890123456789", 37.3),
            part(2, "a", Kind::HeldIdle, "12.000000000000001", 3.7),
            part(1, "b", Kind::Unmonitored, "99.99", 0.0),
            part(2, "b", Kind::Idle, "7.7", 1.1),
        ];
        let after = vec![
            part(1, "a", Kind::Used, "999.1", 29.9),
            part(2, "a", Kind::Used, "333.333333333333333", 51.2),
            part(2, "a", Kind::HeldIdle, "0.01", 0.001),
            part(1, "b", Kind::Used, "3.14159", 0.7),
            part(2, "c", Kind::Idle, "42", 6.6),
        ];
        let (b, a) = (month(before), month(after));
        let rows = explain(&b, &a, GroupBy::TEAM, "USD");
        for r in &rows {
            assert_eq!(r.volume + r.idle + r.mix + r.price, r.change, "{r:?}");
            assert_eq!(r.cost - r.previous_cost, r.change, "{r:?}");
        }
        let t = VarianceRow::sum("all", &rows);
        let spent = |m: &Attribution| m.parts.iter().map(|p| p.cost).sum::<Decimal>();
        assert_eq!(t.change, spent(&a) - spent(&b));
        assert_eq!(t.volume + t.idle + t.mix + t.price, t.change);
        // Idle cost stays under (idle): its change is idle time.
        let idle = rows.iter().find(|r| r.key == "(idle)").unwrap();
        assert!(
            idle.idle > Decimal::ZERO && idle.volume.is_zero(),
            "{idle:?}"
        );
    }

    /// A GPU instance no agent reports costs the same in both months but carries no GPU-hours:
    /// twice the watched hours at the same price is all volume, nothing of mix or price.
    #[test]
    fn cost_without_gpu_hours_does_not_skew_the_rates() {
        let r = one(
            vec![
                part(1, "a", Kind::Used, "1000", 100.0),
                part(2, "a", Kind::Unmonitored, "750", 0.0),
            ],
            vec![
                part(1, "a", Kind::Used, "2000", 200.0),
                part(2, "a", Kind::Unmonitored, "750", 0.0),
            ],
        );
        assert_eq!(parts(&r), [d("1000"), d("0"), d("0"), d("0")]);
        // More such machines is volume too.
        let r = one(
            vec![
                part(2, "a", Kind::Unmonitored, "750", 0.0),
                part(1, "a", Kind::Used, "10", 1.0),
            ],
            vec![
                part(2, "a", Kind::Unmonitored, "1500", 0.0),
                part(1, "a", Kind::Used, "10", 1.0),
            ],
        );
        assert_eq!(parts(&r), [d("750"), d("0"), d("0"), d("0")]);
    }

    #[test]
    fn another_currency_is_left_out() {
        let mut eur = part(1, "a", Kind::Used, "500", 5.0);
        eur.currency = "EUR".into();
        let rows = explain(
            &month(vec![part(1, "a", Kind::Used, "100", 10.0)]),
            &month(vec![part(1, "a", Kind::Used, "100", 10.0), eur]),
            GroupBy::TEAM,
            "USD",
        );
        assert_eq!(rows[0].change, Decimal::ZERO);
    }
}
