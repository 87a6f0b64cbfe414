//! Budgets and month-end forecasts: what an owner may spend in a month, what it has spent, and
//! where the month is heading.
//!
//! A budget is set for an owner key on one dimension (a team, a model, a cluster, …) from a
//! month on, and holds for later months until another is set. The forecast for the month's end
//! is what is spent so far plus, for each day still to come, what the same weekday cost over the
//! recent weeks (so a weekly sweep is expected on its day, not spread over the week), with a
//! range from the cheapest to the dearest such weekday. It is never below what is spent.

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::Serialize;

use crate::time::{weekday, DAY_MS};

/// Weeks of history the weekday pattern is read from.
pub const PATTERN_WEEKS: i64 = 4;

/// A budget as set: from its month on, until a later one for the same key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budget {
    pub dimension: String,
    pub key: String,
    /// The first month it holds for (its start, epoch ms).
    pub from_month_ms: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub amount: Decimal,
    pub currency: String,
}

/// The budgets in force in the month starting `month_ms`: per dimension and key, the one set
/// for the latest month not after it.
pub fn in_force(budgets: &[Budget], month_ms: i64) -> Vec<&Budget> {
    let mut latest: BTreeMap<(&str, &str), &Budget> = BTreeMap::new();
    for b in budgets.iter().filter(|b| b.from_month_ms <= month_ms) {
        let slot = latest.entry((&b.dimension, &b.key)).or_insert(b);
        if b.from_month_ms > slot.from_month_ms {
            *slot = b;
        }
    }
    latest.into_values().collect()
}

/// Where a month is heading for one owner.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Forecast {
    /// Spent in the month so far.
    #[serde(with = "rust_decimal::serde::str")]
    pub spent: Decimal,
    /// The month's expected total, and its range.
    #[serde(with = "rust_decimal::serde::str")]
    pub expected: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub low: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub high: Decimal,
    /// Days of history the pattern was read from (0: no basis, the forecast is what is spent).
    pub basis_days: i64,
}

/// The forecast for the month `[month_from, month_to)` at `now`, from one owner's cost per UTC
/// day (`daily`: day start → cost; days without cost may be absent). History is the
/// [`PATTERN_WEEKS`] weeks before today, but no day before `history_from` (when the ledger
/// begins: a fleet watched for a week has a week of pattern, not three weeks of zeros).
pub fn forecast(
    daily: &BTreeMap<i64, Decimal>,
    (month_from, month_to): (i64, i64),
    history_from: i64,
    now: i64,
) -> Forecast {
    let cost = |day: i64| daily.get(&day).copied().unwrap_or_default();
    let spent: Decimal = daily
        .range(month_from..month_to.min(now.max(month_from)))
        .map(|(_, c)| *c)
        .sum();
    let done = Forecast {
        spent,
        expected: spent,
        low: spent,
        high: spent,
        basis_days: 0,
    };
    // An ended month is what it spent; one not begun has spent nothing and is forecast
    // nothing (a pattern of weeks before it says nothing of a month that may never run).
    if now >= month_to || now < month_from {
        return done;
    }
    let today = crate::time::day_floor(now);
    let start = (today - PATTERN_WEEKS * 7 * DAY_MS).max(crate::time::day_floor(history_from));
    let mut by_weekday: BTreeMap<u32, Vec<Decimal>> = BTreeMap::new();
    let mut all = Vec::new();
    let mut day = start;
    while day < today {
        by_weekday.entry(weekday(day)).or_default().push(cost(day));
        all.push(cost(day));
        day += DAY_MS;
    }
    if all.is_empty() {
        return done;
    }
    let stats = |v: &[Decimal]| {
        let sum: Decimal = v.iter().sum();
        let mean = sum / Decimal::from(v.len() as i64);
        let low = v.iter().copied().min().unwrap_or_default();
        let high = v.iter().copied().max().unwrap_or_default();
        (mean, low, high)
    };
    let (mut expected, mut low, mut high) = (spent, spent, spent);
    let mut day = today.max(month_from);
    while day < month_to {
        let values = by_weekday
            .get(&weekday(day))
            .map_or(&all[..], Vec::as_slice);
        let (m, l, h) = stats(values);
        // Today has begun: only what is left of its usual cost is still to come.
        let so_far = if day == today {
            cost(day)
        } else {
            Decimal::ZERO
        };
        let rest = |v: Decimal| (v - so_far).max(Decimal::ZERO);
        expected += rest(m);
        low += rest(l);
        high += rest(h);
        day += DAY_MS;
    }
    let round = |d: Decimal| d.round_dp(6);
    Forecast {
        spent,
        expected: round(expected).max(spent),
        low: round(low).max(spent),
        high: round(high).max(spent),
        basis_days: all.len() as i64,
    }
}

/// How a budget stands: spent past it, heading past it, or within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    Over,
    AtRisk,
    OnTrack,
    /// The month has not begun: nothing spent, nothing forecast.
    NotBegun,
}

impl Standing {
    /// How a budget of a month that has begun stands.
    pub fn of(budget: Decimal, f: &Forecast) -> Standing {
        if f.spent > budget {
            Standing::Over
        } else if f.expected > budget {
            Standing::AtRisk
        } else {
            Standing::OnTrack
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Over => "over budget",
            Standing::AtRisk => "heading over",
            Standing::OnTrack => "on track",
            Standing::NotBegun => "not begun",
        }
    }
}

/// What a budget alert measures against the budget: what is spent, or the month-end forecast.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    Spent,
    Forecast,
}

impl Basis {
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Spent => "spent",
            Basis::Forecast => "forecast",
        }
    }
}

/// The thresholds (percent of the budget) the month has reached: by what is spent, and by the
/// forecast where there is a pattern to forecast from. A budget of nothing is reached by any
/// spend.
pub fn crossed(
    amount: Decimal,
    f: &Forecast,
    spent_at: &[u32],
    forecast_at: &[u32],
) -> Vec<(Basis, u32)> {
    let reached = |value: Decimal, percent: u32| {
        if amount.is_zero() {
            value > Decimal::ZERO
        } else {
            value * Decimal::from(100) >= amount * Decimal::from(percent)
        }
    };
    let mut out: Vec<(Basis, u32)> = spent_at
        .iter()
        .filter(|p| reached(f.spent, **p))
        .map(|p| (Basis::Spent, *p))
        .collect();
    if f.basis_days > 0 {
        out.extend(
            forecast_at
                .iter()
                .filter(|p| reached(f.expected, **p))
                .map(|p| (Basis::Forecast, *p)),
        );
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .timestamp_millis()
    }

    fn d(i: i64) -> Decimal {
        Decimal::from(i)
    }

    /// November 2026 starts on a Sunday. A weekly sweep costs 100 on Mondays, other days 10.
    fn sweeps(from: &str, to: &str) -> BTreeMap<i64, Decimal> {
        let mut out = BTreeMap::new();
        let mut day = at(from);
        while day < at(to) {
            out.insert(day, if weekday(day) == 0 { d(100) } else { d(10) });
            day += DAY_MS;
        }
        out
    }

    #[test]
    fn the_weekly_pattern_is_expected_on_its_days() {
        let month = (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"));
        // Seen from 2026-10-01; now is the start of 2026-11-15 (a Sunday): 14 days spent.
        let daily = sweeps("2026-10-01T00:00:00Z", "2026-11-15T00:00:00Z");
        let now = at("2026-11-15T00:00:00Z");
        let f = forecast(&daily, month, at("2026-10-01T00:00:00Z"), now);
        // Spent: 2 Mondays (100) + 12 other days (10) = 320; to come: 16 days from the 15th,
        // of which Mondays the 16th, 23rd and 30th: 3 × 100 + 13 × 10 = 430.
        assert_eq!(f.spent, d(320));
        assert_eq!(f.expected, d(750));
        assert_eq!(
            (f.low, f.high),
            (d(750), d(750)),
            "a steady pattern has no range"
        );
        assert_eq!(f.basis_days, 28);
    }

    #[test]
    fn never_below_what_is_spent_and_today_counts_what_is_left() {
        let month = (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"));
        let mut daily = sweeps("2026-10-01T00:00:00Z", "2026-11-16T00:00:00Z");
        // Monday the 16th, noon: a spike already spent 500 today.
        let now = at("2026-11-16T12:00:00Z");
        daily.insert(at("2026-11-16T00:00:00Z"), d(500));
        let f = forecast(&daily, month, at("2026-10-01T00:00:00Z"), now);
        assert_eq!(f.spent, d(830));
        // Nothing more expected today (500 > a Monday's 100); then 14 days: 2 Mondays, 12 others.
        assert_eq!(f.expected, d(830 + 200 + 120));
        assert!(f.low >= f.spent && f.high >= f.expected);
    }

    #[test]
    fn a_varying_history_gives_a_range_and_no_history_gives_what_is_spent() {
        let month = (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"));
        let mut daily = BTreeMap::new();
        let mut day = at("2026-10-18T00:00:00Z");
        let mut i = 0;
        while day < at("2026-11-15T00:00:00Z") {
            daily.insert(day, d(10 + 10 * (i % 2)));
            day += DAY_MS;
            i += 1;
        }
        let now = at("2026-11-15T00:00:00Z");
        let f = forecast(&daily, month, at("2026-10-18T00:00:00Z"), now);
        assert!(f.low < f.expected && f.expected < f.high, "{f:?}");
        // Only a week of ledger: that week is the pattern.
        let f = forecast(&daily, month, at("2026-11-08T00:00:00Z"), now);
        assert_eq!(f.basis_days, 7);
        let none = forecast(&BTreeMap::new(), month, now, now);
        assert_eq!(
            (none.spent, none.expected, none.basis_days),
            (d(0), d(0), 0)
        );
        // A month that has ended is what it spent.
        let ended = forecast(
            &daily,
            month,
            at("2026-10-18T00:00:00Z"),
            at("2026-12-03T00:00:00Z"),
        );
        assert_eq!(ended.expected, ended.spent);
    }

    #[test]
    fn the_latest_budget_not_after_the_month_holds() {
        let b = |key: &str, month: &str, amount: i64| Budget {
            dimension: "team".into(),
            key: key.into(),
            from_month_ms: at(month),
            amount: d(amount),
            currency: "USD".into(),
        };
        let all = [
            b("search", "2026-09-01T00:00:00Z", 1000),
            b("search", "2026-11-01T00:00:00Z", 1500),
            b("search", "2027-01-01T00:00:00Z", 2000),
            b("ads", "2026-12-01T00:00:00Z", 50),
        ];
        let nov: Vec<(String, Decimal)> = in_force(&all, at("2026-11-01T00:00:00Z"))
            .into_iter()
            .map(|b| (b.key.clone(), b.amount))
            .collect();
        assert_eq!(nov, [("search".to_owned(), d(1500))]);
        let oct = in_force(&all, at("2026-10-01T00:00:00Z"));
        assert_eq!(oct[0].amount, d(1000));
        assert_eq!(in_force(&all, at("2027-02-01T00:00:00Z")).len(), 2);
    }

    #[test]
    fn thresholds_reached_by_spend_and_by_forecast() {
        let f = Forecast {
            spent: d(80),
            expected: d(130),
            low: d(100),
            high: d(160),
            basis_days: 28,
        };
        assert_eq!(
            crossed(d(100), &f, &[50, 80, 100], &[100, 150]),
            [
                (Basis::Spent, 50),
                (Basis::Spent, 80),
                (Basis::Forecast, 100)
            ]
        );
        // No pattern yet: no forecast alert.
        let unknown = Forecast { basis_days: 0, ..f };
        assert_eq!(crossed(d(100), &unknown, &[100], &[100]), []);
        assert_eq!(crossed(d(0), &f, &[100], &[]), [(Basis::Spent, 100)]);
    }

    #[test]
    fn standing() {
        let f = Forecast {
            spent: d(50),
            expected: d(120),
            low: d(90),
            high: d(150),
            basis_days: 28,
        };
        assert_eq!(Standing::of(d(40), &f), Standing::Over);
        assert_eq!(Standing::of(d(100), &f), Standing::AtRisk);
        assert_eq!(Standing::of(d(200), &f), Standing::OnTrack);
    }
}
