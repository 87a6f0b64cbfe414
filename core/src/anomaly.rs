//! Spend anomalies: a day an owner spent well above what that weekday usually costs it.
//!
//! Each day is judged against the same weekday of the [`BASELINE_WEEKS`] weeks before it (so a
//! sweep that runs every Monday is expected on Mondays): the expected cost is their median,
//! which one earlier spike does not move, and the day is anomalous when it passes the expected
//! cost by more than the larger of the usual day-to-day noise (four robust standard deviations
//! of every day's distance from its weekday's median), a share of the expected cost and an
//! amount. Consecutive anomalous days make one anomaly: a spike, or a new level once it has
//! held for [`NEW_LEVEL_DAYS`] days. Only rises are anomalies; a fall saves money.
//!
//! A day's baseline starts at the owner's first day of spend in the weeks before it: a new
//! experiment, or a sweep that runs a week under a new name, has no history of its own yet (its
//! team's spend shows the rise); nor has an owner back after four weeks without spend. On a
//! day priced (in part) from the rate card because the bill has not covered it yet, a rise in
//! cost alone is not enough: the GPU time must rise too, since the rate card is not what the
//! bill will charge.

use std::collections::BTreeMap;

use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;
use serde::Serialize;

use crate::time::{day_floor, weekday, DAY_MS};

/// Weeks of history each day is judged against.
pub const BASELINE_WEEKS: i64 = 4;
/// The fewest days of the same weekday a baseline needs.
pub const MIN_SAMPLES: usize = 2;
/// Consecutive anomalous days that make a new level rather than a spike.
pub const NEW_LEVEL_DAYS: usize = 3;
/// How far back a run of anomalous days is followed to find where it began, and forward past
/// the range asked for to see how it ends: a new level stops being anomalous once no baseline
/// from before it is left, within [`BASELINE_WEEKS`] weeks, and quiet days bridged inside it
/// are at most [`BRIDGED_DAYS`].
pub const RUN_LOOKBACK_DAYS: i64 = BASELINE_WEEKS * 7 + 7;
/// Days a new level may dip back within without ending (a weekend of a weekday workload).
pub const BRIDGED_DAYS: usize = 6;
/// Robust standard deviations of noise a day may pass its expected cost by.
const NOISE_SIGMAS: i64 = 4;

/// One owner's spend on one UTC day.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DaySpend {
    pub cost: Decimal,
    /// GPU time, in physical-GPU seconds.
    pub gpu_seconds: f64,
    /// Some of the cost is a rate-card estimate.
    pub estimated: bool,
}

/// How large a rise must be to count: at least this amount (in the bill's currency) and this
/// percent of the expected cost, besides the noise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sensitivity {
    pub min_increase: Decimal,
    pub min_increase_percent: u32,
}

/// What a day was expected to cost, and above what it is anomalous.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expected {
    pub cost: Decimal,
    pub threshold: Decimal,
    pub gpu_seconds: f64,
    pub gpu_seconds_threshold: f64,
}

/// One day of an anomaly: what it was expected to cost and what it cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnomalousDay {
    pub day_ms: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub expected: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub actual: Decimal,
    /// The day is today, judged on its cost so far against the whole day's figures.
    pub partial: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AnomalyKind {
    /// One or two days above the baseline.
    Spike,
    /// [`NEW_LEVEL_DAYS`] or more days in a row above it.
    NewLevel,
}

impl AnomalyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AnomalyKind::Spike => "spike",
            AnomalyKind::NewLevel => "new_level",
        }
    }

    pub fn parse(s: &str) -> Option<AnomalyKind> {
        [AnomalyKind::Spike, AnomalyKind::NewLevel]
            .into_iter()
            .find(|k| k.as_str() == s)
    }

    /// As people read it.
    pub fn label(self) -> &'static str {
        match self {
            AnomalyKind::Spike => "spike",
            AnomalyKind::NewLevel => "new level",
        }
    }
}

/// Consecutive anomalous days of one owner.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Anomaly {
    pub kind: AnomalyKind,
    /// Its first day: with the owner, what names it.
    pub start_ms: i64,
    pub days: Vec<AnomalousDay>,
    /// Summed over its days.
    #[serde(with = "rust_decimal::serde::str")]
    pub expected: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub actual: Decimal,
}

impl Anomaly {
    /// What it cost beyond what was expected.
    pub fn excess(&self) -> Decimal {
        self.actual - self.expected
    }

    pub fn last_day_ms(&self) -> i64 {
        self.days.last().map_or(self.start_ms, |d| d.day_ms)
    }

    /// The day furthest above its expectation: where its drivers are looked for.
    pub fn peak_day_ms(&self) -> i64 {
        self.days
            .iter()
            .max_by_key(|d| d.actual - d.expected)
            .map_or(self.start_ms, |d| d.day_ms)
    }
}

/// Where an anomaly's money went: one host on its peak day, what it cost the owner that day
/// against the same weekday's average, on which GPUs, and what ran on them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Driver {
    pub cluster: String,
    pub host: String,
    /// The owner's GPUs (and MIG instances) on it that day, by UUID; none without GPU data.
    pub gpus: Vec<String>,
    #[serde(with = "rust_decimal::serde::str")]
    pub expected: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub actual: Decimal,
    /// The processes seen on those GPUs that day, most often seen first.
    pub processes: Vec<ProcessSeen>,
}

impl Driver {
    /// As people read it, amounts written by `money`:
    /// `scratch-00, 8 GPUs: $1,320.96 (usually $0.00) · python3 (svc-serve; team=applied)`.
    pub fn label(&self, money: impl Fn(Decimal) -> String) -> String {
        let gpus = match self.gpus.as_slice() {
            [] => "no GPU data".to_owned(),
            [one] => one.clone(),
            many => format!("{} GPUs", many.len()),
        };
        let processes: Vec<String> = self.processes.iter().map(ProcessSeen::label).collect();
        format!(
            "{}, {gpus}: {} (usually {}){}",
            self.host,
            money(self.actual),
            money(self.expected),
            if processes.is_empty() {
                String::new()
            } else {
                format!(" · {}", processes.join(", "))
            }
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessSeen {
    pub name: String,
    pub user: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl ProcessSeen {
    /// As people read it: `python3 (svc-train; model=llama)`.
    pub fn label(&self) -> String {
        let mut extra: Vec<String> = self.user.iter().cloned().collect();
        extra.extend(self.labels.iter().map(|(k, v)| format!("{k}={v}")));
        if extra.is_empty() {
            self.name.clone()
        } else {
            format!("{} ({})", self.name, extra.join("; "))
        }
    }
}

fn median(mut v: Vec<Decimal>) -> Decimal {
    if v.is_empty() {
        return Decimal::ZERO;
    }
    v.sort_unstable();
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / Decimal::TWO
    }
}

/// The median and the noise (1.4826 × the median distance of each day from its weekday's
/// median: a standard deviation that outliers do not inflate) of one figure over the baseline.
fn baseline_of(
    samples: &BTreeMap<u32, Vec<Decimal>>,
    day_weekday: u32,
) -> Option<(Decimal, Decimal)> {
    let own = samples.get(&day_weekday)?;
    if own.len() < MIN_SAMPLES {
        return None;
    }
    let mut distances = Vec::new();
    for values in samples.values().filter(|v| v.len() >= MIN_SAMPLES) {
        let m = median(values.clone());
        distances.extend(values.iter().map(|v| (*v - m).abs()));
    }
    let sigma = median(distances) * Decimal::new(14826, 4);
    Some((median(own.clone()), sigma))
}

/// What `day` is expected to cost the owner whose spend per day is `daily`, judged from the
/// same weekday of the [`BASELINE_WEEKS`] weeks before it, within `[history_from, until)` (from
/// the owner's first day of spend or when the ledger begins, until the day or the start of the
/// anomaly it may continue). `None` where there are fewer than [`MIN_SAMPLES`] such days.
pub fn expected_on(
    daily: &BTreeMap<i64, DaySpend>,
    day: i64,
    (history_from, until): (i64, i64),
    sensitivity: &Sensitivity,
) -> Option<Expected> {
    let day = day_floor(day);
    let start = (day - BASELINE_WEEKS * 7 * DAY_MS).max(day_floor(history_from));
    let mut costs: BTreeMap<u32, Vec<Decimal>> = BTreeMap::new();
    let mut seconds: BTreeMap<u32, Vec<Decimal>> = BTreeMap::new();
    let end = day.min(until);
    if start >= end {
        return None;
    }
    // From the owner's first day of spend in the window: days before it are not its history.
    let mut d = daily
        .range(start..end)
        .find(|(_, s)| !s.cost.is_zero())
        .map(|(d, _)| *d)?;
    while d < end {
        let spend = daily.get(&d).copied().unwrap_or_default();
        costs.entry(weekday(d)).or_default().push(spend.cost);
        seconds
            .entry(weekday(d))
            .or_default()
            .push(Decimal::from_f64_retain(spend.gpu_seconds).unwrap_or_default());
        d += DAY_MS;
    }
    let (cost, noise) = baseline_of(&costs, weekday(day))?;
    let (gs, gs_noise) = baseline_of(&seconds, weekday(day))?;
    let percent = Decimal::from(sensitivity.min_increase_percent);
    let margin = (noise * Decimal::from(NOISE_SIGMAS))
        .max(cost * percent / Decimal::ONE_HUNDRED)
        .max(sensitivity.min_increase);
    let gs_margin =
        (gs_noise * Decimal::from(NOISE_SIGMAS)).max(gs * percent / Decimal::ONE_HUNDRED);
    let to_f64 = |d: Decimal| d.to_f64().unwrap_or(0.0);
    // In cents: an expectation is shown, summed and subtracted as people read money.
    let cost = crate::money::cents(cost);
    Some(Expected {
        cost,
        threshold: (cost + margin).round_dp(6),
        gpu_seconds: to_f64(gs),
        gpu_seconds_threshold: to_f64(gs + gs_margin),
    })
}

/// Whether `spend` is above `e`: past its threshold (`share` 1) or past that share of its
/// margin; on an estimated day, in GPU time as well as in cost.
fn above(spend: &DaySpend, e: &Expected, share: Decimal) -> bool {
    let cost_line = e.cost + (e.threshold - e.cost) * share;
    let share = share.to_f64().unwrap_or(1.0);
    let gs_line = e.gpu_seconds + (e.gpu_seconds_threshold - e.gpu_seconds) * share;
    spend.cost > cost_line && (!spend.estimated || spend.gpu_seconds > gs_line)
}

/// The anomalies of one owner that have a day in `[from, to)` (UTC days), at `now`: today is
/// judged on what it has cost so far, and counts only once that passes the whole day's
/// threshold. A run of anomalous days is followed back before `from` (up to
/// [`RUN_LOOKBACK_DAYS`]) so an anomaly is named by the day it really began, whatever range is
/// asked for. `daily` must hold the owner's spend from [`RUN_LOOKBACK_DAYS`] and
/// [`BASELINE_WEEKS`] weeks before `from`; `history_from` is when the ledger begins. Runs are
/// followed past `to` (as far as `daily` goes, up to `now`) to see how they end, so an anomaly
/// has the same days and kind whichever range is asked for.
///
/// Once started, a run goes on while each day stays above half of the margin of the baseline
/// from before the run began (a level that rose by a fixed amount is a smaller share of a
/// dearer weekday, and must not split into one anomaly a week; nor may the days of the run
/// itself drag the baseline up under it). A new level bridges up to [`BRIDGED_DAYS`] quiet days
/// (a weekend) when it goes on after them. A new level that holds until no baseline from before
/// it is left is the owner's normal from then on: its history restarts where the level began.
pub fn find(
    daily: &BTreeMap<i64, DaySpend>,
    (from, to): (i64, i64),
    history_from: i64,
    now: i64,
    sensitivity: &Sensitivity,
) -> Vec<Anomaly> {
    let Some((&last_known, _)) = daily.iter().next_back() else {
        return Vec::new();
    };
    let mut history_from = day_floor(history_from);
    let today = day_floor(now);
    let until = (last_known + DAY_MS).max(to).min(today + DAY_MS);
    let mut out: Vec<Anomaly> = Vec::new();
    let mut run: Option<Anomaly> = None;
    // Quiet days inside a new level, kept until it goes on (then they are its days) or ends.
    let mut quiet: Vec<AnomalousDay> = Vec::new();
    let mut day = day_floor(from) - RUN_LOOKBACK_DAYS * DAY_MS;
    while day < until {
        let spend = daily.get(&day).copied().unwrap_or_default();
        let day_of = |e: Expected| AnomalousDay {
            day_ms: day,
            expected: e.cost,
            actual: spend.cost,
            partial: day == today,
        };
        if let Some(r) = run.as_mut() {
            let before_run = (history_from, r.start_ms);
            match expected_on(daily, day, before_run, sensitivity) {
                Some(e) if above(&spend, &e, Decimal::new(5, 1)) => {
                    for d in quiet.drain(..).chain([day_of(e)]) {
                        r.days.push(d);
                        r.expected += d.expected;
                        r.actual += d.actual;
                    }
                    day += DAY_MS;
                    continue;
                }
                // Today not (yet) above it ends nothing: the day is not over.
                Some(_) if day == today => {
                    day += DAY_MS;
                    continue;
                }
                Some(e) if r.days.len() >= NEW_LEVEL_DAYS && quiet.len() < BRIDGED_DAYS => {
                    quiet.push(day_of(e));
                    day += DAY_MS;
                    continue;
                }
                Some(_) => {
                    quiet.clear();
                    out.extend(run.take());
                }
                None => {
                    quiet.clear();
                    if r.days.len() >= NEW_LEVEL_DAYS {
                        history_from = r.start_ms;
                    }
                    out.extend(run.take());
                }
            }
        }
        if let Some(e) = expected_on(daily, day, (history_from, day), sensitivity) {
            if above(&spend, &e, Decimal::ONE) {
                run = Some(Anomaly {
                    kind: AnomalyKind::Spike,
                    start_ms: day,
                    days: vec![day_of(e)],
                    expected: e.cost,
                    actual: spend.cost,
                });
            }
        }
        day += DAY_MS;
    }
    out.extend(run.take());
    for a in &mut out {
        if a.days.len() >= NEW_LEVEL_DAYS {
            a.kind = AnomalyKind::NewLevel;
        }
    }
    out.retain(|a| a.last_day_ms() >= day_floor(from) && a.start_ms < to);
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

    const HOUR: i64 = crate::time::HOUR_MS;

    const SENSITIVITY: Sensitivity = Sensitivity {
        min_increase: Decimal::from_parts(10, 0, 0, false, 0),
        min_increase_percent: 30,
    };

    /// A fleet that runs a sweep every Monday (1000) and serves otherwise (200 ± a little),
    /// GPU time following cost; from 2026-09-01 to the day before `to`.
    fn weekly_sweeps(to: &str) -> BTreeMap<i64, DaySpend> {
        let mut out = BTreeMap::new();
        let mut day = at("2026-09-01T00:00:00Z");
        let mut i = 0;
        while day < at(to) {
            let cost = if weekday(day) == 0 {
                d(1000)
            } else {
                d(200 + (i * 7) % 13)
            };
            out.insert(
                day,
                DaySpend {
                    cost,
                    gpu_seconds: cost.to_string().parse::<f64>().unwrap() * 36.0,
                    estimated: false,
                },
            );
            day += DAY_MS;
            i += 1;
        }
        out
    }

    /// The anomalies of November, seen from its end, the ledger beginning on 1 September.
    fn in_november(daily: &BTreeMap<i64, DaySpend>) -> Vec<Anomaly> {
        find(
            daily,
            november(),
            at("2026-09-01T00:00:00Z"),
            at("2026-12-01T00:00:00Z"),
            &SENSITIVITY,
        )
    }

    fn november() -> (i64, i64) {
        (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"))
    }

    fn set(daily: &mut BTreeMap<i64, DaySpend>, day: &str, cost: i64) {
        let s = daily.entry(at(day)).or_default();
        s.cost = d(cost);
        s.gpu_seconds = cost as f64 * 36.0;
    }

    #[test]
    fn weekday_sweeps_and_noise_are_not_anomalies() {
        let daily = weekly_sweeps("2026-12-01T00:00:00Z");
        let found = in_november(&daily);
        assert_eq!(found, vec![]);
    }

    #[test]
    fn a_spike_is_found_with_what_was_expected() {
        let mut daily = weekly_sweeps("2026-12-01T00:00:00Z");
        // Wednesday the 11th: 900 instead of about 200.
        set(&mut daily, "2026-11-11T00:00:00Z", 900);
        // A Monday sweep twice its size.
        set(&mut daily, "2026-11-23T00:00:00Z", 2000);
        let found = in_november(&daily);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert_eq!(found[0].kind, AnomalyKind::Spike);
        assert_eq!(found[0].start_ms, at("2026-11-11T00:00:00Z"));
        assert_eq!(found[0].actual, d(900));
        assert!(found[0].expected > d(195) && found[0].expected < d(215));
        assert_eq!(found[1].start_ms, at("2026-11-23T00:00:00Z"));
        assert_eq!(found[1].expected, d(1000), "a Monday is expected to sweep");
        assert_eq!(found[1].excess(), d(1000));
    }

    #[test]
    fn a_new_level_is_one_anomaly_until_the_baseline_takes_it_in() {
        let mut daily = weekly_sweeps("2027-01-01T00:00:00Z");
        // From Tuesday the 10th, serving costs 200 a day more, Monday sweeps included.
        let mut day = at("2026-11-10T00:00:00Z");
        while day < at("2027-01-01T00:00:00Z") {
            let s = daily.get_mut(&day).unwrap();
            s.cost += d(200);
            s.gpu_seconds += 200.0 * 36.0;
            day += DAY_MS;
        }
        let end = at("2027-01-01T00:00:00Z");
        let found = find(
            &daily,
            november(),
            at("2026-09-01T00:00:00Z"),
            end,
            &SENSITIVITY,
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        let a = &found[0];
        assert_eq!(a.kind, AnomalyKind::NewLevel);
        assert_eq!(a.start_ms, at("2026-11-10T00:00:00Z"));
        // Every day while a baseline from before it is left (three weeks): a Monday 20% dearer
        // than its sweep does not split it in two.
        assert_eq!(a.days.len(), 21);
        // About 200 a day more (the serving days wobble around their median).
        assert!(
            (a.excess() - d(200 * 21)).abs() < d(21 * 7),
            "{}",
            a.excess()
        );
        // Asked from the 17th on, it is the same anomaly, named by its first day.
        let later = (at("2026-11-17T00:00:00Z"), at("2026-12-01T00:00:00Z"));
        assert_eq!(
            find(&daily, later, at("2026-09-01T00:00:00Z"), end, &SENSITIVITY),
            found
        );
        // Then the new level is the owner's normal.
        let december = (at("2026-12-01T00:00:00Z"), end);
        assert_eq!(
            find(
                &daily,
                december,
                at("2026-09-01T00:00:00Z"),
                end,
                &SENSITIVITY
            ),
            vec![]
        );
    }

    #[test]
    fn a_range_that_starts_inside_a_run_names_it_by_its_first_day() {
        let mut daily = weekly_sweeps("2026-12-01T00:00:00Z");
        for day in [
            "2026-10-28",
            "2026-10-29",
            "2026-10-30",
            "2026-10-31",
            "2026-11-01",
        ] {
            set(&mut daily, &format!("{day}T00:00:00Z"), 800);
        }
        let found = in_november(&daily);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].start_ms, at("2026-10-28T00:00:00Z"));
        assert_eq!(found[0].days.len(), 5);
    }

    #[test]
    fn today_counts_once_it_has_passed_the_whole_days_threshold() {
        let mut daily = weekly_sweeps("2026-11-18T00:00:00Z");
        let now = at("2026-11-18T09:00:00Z");
        set(&mut daily, "2026-11-18T00:00:00Z", 150);
        let quiet = find(
            &daily,
            november(),
            at("2026-09-01T00:00:00Z"),
            now,
            &SENSITIVITY,
        );
        assert_eq!(quiet, vec![], "150 by 9am is a day under way, not a spike");
        set(&mut daily, "2026-11-18T00:00:00Z", 700);
        let found = find(
            &daily,
            november(),
            at("2026-09-01T00:00:00Z"),
            now,
            &SENSITIVITY,
        );
        assert_eq!(found.len(), 1);
        assert!(found[0].days[0].partial);
    }

    #[test]
    fn a_new_owner_and_a_week_long_sweep_have_no_baseline() {
        // An experiment that ran one week, then a new one: nothing to judge them by.
        let mut daily = BTreeMap::new();
        let mut day = at("2026-11-05T00:00:00Z");
        while day < at("2026-11-12T00:00:00Z") {
            set(&mut daily, &crate::time::rfc3339(day), 5000);
            day += DAY_MS;
        }
        let found = in_november(&daily);
        assert_eq!(found, vec![]);
    }

    #[test]
    fn an_estimated_day_needs_more_gpu_time_as_well() {
        let mut daily = weekly_sweeps("2026-12-01T00:00:00Z");
        // The rate card prices Thursday 60% above the bill: same GPU time.
        let s = daily.get_mut(&at("2026-11-19T00:00:00Z")).unwrap();
        s.cost = d(330);
        s.estimated = true;
        // Friday is estimated too, and twice the GPU time ran.
        let f = daily.get_mut(&at("2026-11-20T00:00:00Z")).unwrap();
        f.cost = d(700);
        f.gpu_seconds *= 2.0;
        f.estimated = true;
        let found = in_november(&daily);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].start_ms, at("2026-11-20T00:00:00Z"));
    }

    #[test]
    fn small_rises_are_below_the_floors() {
        let mut daily = BTreeMap::new();
        let mut day = at("2026-09-01T00:00:00Z");
        while day < at("2026-12-01T00:00:00Z") {
            set(&mut daily, &crate::time::rfc3339(day), 10);
            day += DAY_MS;
        }
        // 19 is 90% more but under the floor of 10 more; 25 passes it.
        set(&mut daily, "2026-11-11T00:00:00Z", 19);
        set(&mut daily, "2026-11-13T00:00:00Z", 25);
        let found = in_november(&daily);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].start_ms, at("2026-11-13T00:00:00Z"));
    }

    #[test]
    fn a_weekday_workload_rising_is_one_new_level_across_its_weekends() {
        // Weekdays 300, weekends nothing; from Tuesday the 10th weekdays cost 600.
        let mut daily = BTreeMap::new();
        let mut day = at("2026-09-01T00:00:00Z");
        while day < at("2026-12-01T00:00:00Z") {
            let cost = match (weekday(day) >= 5, day >= at("2026-11-10T00:00:00Z")) {
                (true, _) => 0,
                (false, false) => 300,
                (false, true) => 600,
            };
            set(&mut daily, &crate::time::rfc3339(day), cost);
            day += DAY_MS;
        }
        let end = at("2026-12-01T00:00:00Z");
        let found = find(
            &daily,
            november(),
            at("2026-09-01T00:00:00Z"),
            end,
            &SENSITIVITY,
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].kind, AnomalyKind::NewLevel);
        assert_eq!(found[0].start_ms, at("2026-11-10T00:00:00Z"));
        assert!(found[0].days.len() > 7, "{:#?}", found[0].days);
    }

    #[test]
    fn any_range_that_holds_an_anomaly_sees_it_the_same() {
        let mut daily = weekly_sweeps("2027-01-01T00:00:00Z");
        // From Saturday the 28th, 300 a day more: it runs into December.
        let mut day = at("2026-11-28T00:00:00Z");
        while day < at("2027-01-01T00:00:00Z") {
            let s = daily.get_mut(&day).unwrap();
            s.cost += d(300);
            s.gpu_seconds += 300.0 * 36.0;
            day += DAY_MS;
        }
        let end = at("2027-01-01T00:00:00Z");
        let from = at("2026-09-01T00:00:00Z");
        let in_november = find(&daily, november(), from, end, &SENSITIVITY);
        let december = (at("2026-12-01T00:00:00Z"), end);
        let in_december = find(&daily, december, from, end, &SENSITIVITY);
        let one_day = (at("2026-12-05T00:00:00Z"), at("2026-12-06T00:00:00Z"));
        let on_a_day = find(&daily, one_day, from, end, &SENSITIVITY);
        assert_eq!(in_november.len(), 1, "{in_november:#?}");
        assert_eq!(in_november[0].kind, AnomalyKind::NewLevel);
        assert_eq!(in_november, in_december);
        assert_eq!(in_november, on_a_day);
    }

    #[test]
    fn an_owner_back_after_weeks_without_spend_has_no_baseline_in_any_range() {
        let mut daily = weekly_sweeps("2026-10-01T00:00:00Z");
        set(&mut daily, "2026-11-15T00:00:00Z", 500);
        set(&mut daily, "2026-11-16T00:00:00Z", 500);
        let end = at("2026-12-01T00:00:00Z");
        let from = at("2026-09-01T00:00:00Z");
        for range in [
            november(),
            (at("2026-11-15T00:00:00Z"), at("2026-11-16T00:00:00Z")),
        ] {
            assert_eq!(find(&daily, range, from, end, &SENSITIVITY), vec![]);
        }
    }

    proptest::proptest! {
        /// Whatever the history and the range: no panic, every anomaly starts above its
        /// threshold and has a day in the range, and its sums are its days'.
        #[test]
        fn anomalies_are_consistent_for_any_history(
            costs in proptest::collection::vec(0i64..2000, 1..150),
            history_offset in -10i64..160,
            range_offset in 0i64..150,
            range_days in 1i64..40,
        ) {
            let first = at("2026-07-01T00:00:00Z");
            let mut daily = BTreeMap::new();
            for (i, c) in costs.iter().enumerate() {
                daily.insert(first + i as i64 * DAY_MS, DaySpend {
                    cost: d(*c),
                    gpu_seconds: *c as f64,
                    estimated: i % 5 == 0,
                });
            }
            let from = first + range_offset * DAY_MS;
            let to = from + range_days * DAY_MS;
            let now = first + costs.len() as i64 * DAY_MS - HOUR;
            let found = find(&daily, (from, to), first + history_offset * DAY_MS, now, &SENSITIVITY);
            for a in &found {
                proptest::prop_assert!(a.start_ms < to && a.last_day_ms() >= from);
                proptest::prop_assert!(a.days[0].actual > a.days[0].expected);
                let sum: Decimal = a.days.iter().map(|x| x.actual).sum();
                proptest::prop_assert_eq!(sum, a.actual);
                proptest::prop_assert_eq!(a.kind == AnomalyKind::NewLevel, a.days.len() >= NEW_LEVEL_DAYS);
            }
        }
    }
}
