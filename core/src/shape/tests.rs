use super::*;
use crate::time::DAY_MS;

/// Monday 2026-11-02 00:00 UTC.
const MONDAY: i64 = 1_793_577_600_000;

fn at(hour: i64, instance_type: &str, owner: Option<&str>, gpus: f64) -> TypeHour {
    TypeHour {
        interruptible_seconds: 0.0,
        hour_ms: MONDAY + hour * HOUR_MS,
        instance_type: instance_type.into(),
        owner: owner.map(str::to_owned),
        gpu_seconds: gpus * 3600.0,
    }
}

/// Two weeks of an H100 type: training holds 16 GPUs all the time, serving 8 more on weekdays
/// 08:00–20:00; an A10G type holds 4 GPUs on the first Monday only.
fn fleet() -> Vec<TypeHour> {
    let mut hours = Vec::new();
    for h in 0..14 * 24 {
        hours.push(at(h, "p5.48xlarge", Some("training"), 16.0));
        let (day, hod) = ((h / 24) % 7, h % 24);
        if day < 5 && (8..20).contains(&hod) {
            hours.push(at(h, "p5.48xlarge", Some("serving"), 8.0));
        }
    }
    hours.extend((0..24).map(|h| at(h, "g5.12xlarge", None, 4.0)));
    hours
}

#[test]
fn the_floor_is_what_every_hour_held_and_the_peak_the_busiest() {
    let s = shapes(&fleet(), MONDAY, MONDAY + 14 * DAY_MS);
    assert_eq!(s[0].instance_type, "p5.48xlarge", "largest first");
    let h100 = &s[0].spread;
    assert_eq!((h100.floor, h100.median, h100.peak), (16.0, 16.0, 24.0));
    assert_eq!(h100.gpu_hours, 16.0 * 336.0 + 8.0 * 120.0);
    // Per owner: training's floor is its peak; serving's floor is 0, most hours it holds none.
    let owners: Vec<(Option<&str>, f64, f64)> = s[0]
        .owners
        .iter()
        .map(|o| (o.owner.as_deref(), o.spread.floor, o.spread.peak))
        .collect();
    assert_eq!(
        owners,
        [(Some("training"), 16.0, 16.0), (Some("serving"), 0.0, 8.0)]
    );
}

#[test]
fn the_week_averages_each_hour_over_the_weeks_and_hours_without_gpus_count_as_zero() {
    let s = shapes(&fleet(), MONDAY, MONDAY + 14 * DAY_MS);
    let h100 = &s[0];
    assert_eq!(h100.hours, 336);
    assert_eq!(h100.week.len(), 7);
    assert_eq!(h100.week[0][9], 24.0, "Monday 09:00");
    assert_eq!(h100.week[0][3], 16.0, "Monday 03:00");
    assert_eq!(h100.week[6][12], 16.0, "Sunday noon");
    // The A10G held 4 GPUs on one of the two Mondays: 2 on average, and a floor of 0.
    let a10g = &s[1];
    assert_eq!(a10g.week[0][5], 2.0);
    assert_eq!(a10g.week[1][5], 0.0);
    assert_eq!((a10g.spread.floor, a10g.spread.peak), (0.0, 4.0));
    assert_eq!(a10g.owners[0].owner, None);
}

#[test]
fn hours_outside_the_range_are_left_out() {
    let s = shapes(&fleet(), MONDAY + 7 * DAY_MS, MONDAY + 14 * DAY_MS);
    assert_eq!(s.len(), 1, "the A10G's Monday is before the range");
    assert_eq!(s[0].hours, 168);
    assert!(shapes(&fleet(), MONDAY, MONDAY).is_empty());
}
