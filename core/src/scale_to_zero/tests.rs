use super::*;
use crate::time::DAY_MS;

/// Monday 2026-11-02 00:00 UTC.
const MONDAY: i64 = 1_793_577_600_000;

fn hour(key: &str, at: i64, kind: Kind, cost: i64) -> OwnerHour {
    OwnerHour {
        key: key.into(),
        hour_ms: at,
        currency: "USD".into(),
        kind,
        cost: Decimal::from(cost),
        committed: Decimal::ZERO,
        gpu_seconds: 2.0 * 3600.0,
    }
}

/// `weeks` weeks of an endpoint on two GPUs at $4 an hour: working on weekdays 08:00–20:00,
/// holding its GPUs idle otherwise.
fn office_hours(key: &str, weeks: i64) -> Vec<OwnerHour> {
    (0..weeks * 7 * 24)
        .map(|h| {
            let at = MONDAY + h * HOUR_MS;
            let (day, hod) = ((h / 24) % 7, h % 24);
            let working = day < 5 && (8..20).contains(&hod);
            hour(
                key,
                at,
                if working { Kind::Used } else { Kind::HeldIdle },
                4,
            )
        })
        .collect()
}

#[test]
fn nights_and_weekends_an_endpoint_holds_idle_are_its_windows() {
    let found = find(&office_hours("rerank", 4));
    assert_eq!(found.len(), 1);
    let c = &found[0];
    let labels: Vec<&str> = c.windows.iter().map(|w| w.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "Mon 20:00 – Tue 08:00 UTC",
            "Tue 20:00 – Wed 08:00 UTC",
            "Wed 20:00 – Thu 08:00 UTC",
            "Thu 20:00 – Fri 08:00 UTC",
            "Fri 20:00 – Mon 08:00 UTC",
        ]
    );
    // Monday 00:00–08:00 belongs to the weekend's window, which wraps the week's edge.
    assert_eq!(c.windows[4].start_hour_of_week, 4 * 24 + 20);
    assert_eq!(c.windows[4].hours, 60);
    assert_eq!(c.hours_per_week, 4 * 12 + 60);
    // The evidence: every quiet hour of the four weeks, two GPUs each, at $2 a GPU-hour.
    assert_eq!(c.quiet_hours, 4 * 108);
    assert_eq!(c.gpu_hours, 2.0 * 4.0 * 108.0);
    assert_eq!(c.saving, Decimal::from(4 * 108 * 4));
    assert_eq!(c.per_gpu_hour, Some(Decimal::from(2)));
}

#[test]
fn a_bucket_is_never_a_candidate() {
    // Processes the agent cannot see hold GPUs idle at night: who to ask is unknown.
    assert!(find(&office_hours("(unseen process)", 4)).is_empty());
    assert_eq!(find(&office_hours("notebook", 4)).len(), 1);
}

#[test]
fn one_busy_week_breaks_that_hour_of_the_week() {
    let mut hours = office_hours("rerank", 4);
    // A late release on the third Wednesday: 22:00 worked.
    let late = MONDAY + 14 * DAY_MS + 2 * DAY_MS + 22 * HOUR_MS;
    hours.push(hour("rerank", late, Kind::Used, 1));
    let c = &find(&hours)[0];
    let labels: Vec<&str> = c.windows.iter().map(|w| w.label.as_str()).collect();
    // Wednesday night is 20:00–22:00 (too short to list) and 23:00–08:00.
    assert!(labels.contains(&"Wed 23:00 – Thu 08:00 UTC"), "{labels:?}");
    assert!(
        !labels.iter().any(|l| l.starts_with("Wed 20:00")),
        "{labels:?}"
    );
    assert_eq!(c.hours_per_week, 3 * 12 + 9 + 60);
}

#[test]
fn fewer_than_three_weeks_is_no_pattern() {
    assert!(find(&office_hours("rerank", 2)).is_empty());
    assert_eq!(find(&office_hours("rerank", 3)).len(), 1);
}

#[test]
fn hours_it_was_not_running_neither_count_nor_break_a_window() {
    // Already off on weekends: only the weeknights are windows, and nothing is saved twice.
    let hours: Vec<OwnerHour> = office_hours("rerank", 4)
        .into_iter()
        .filter(|h| weekday(h.hour_ms) < 5 || h.kind == Kind::Used)
        .filter(|h| !(weekday(h.hour_ms) == 0 && h.hour_ms.rem_euclid(DAY_MS) < 8 * HOUR_MS))
        .collect();
    let c = &find(&hours)[0];
    assert_eq!(c.windows.len(), 5, "{:?}", c.windows);
    assert_eq!(c.windows[4].label, "Fri 20:00 – Sat 00:00 UTC");
    assert_eq!(c.hours_per_week, 4 * 12 + 4);
}

#[test]
fn a_notebook_held_idle_all_along_is_quiet_all_week_and_a_busy_service_never() {
    let mut hours: Vec<OwnerHour> = (0..4 * 7 * 24)
        .map(|h| hour("notebook", MONDAY + h * HOUR_MS, Kind::HeldIdle, 3))
        .collect();
    hours.extend((0..4 * 7 * 24).map(|h| hour("chat", MONDAY + h * HOUR_MS, Kind::Used, 9)));
    let found = find(&hours);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].key, "notebook");
    assert_eq!(found[0].windows[0].label, "all week");
    assert_eq!(found[0].hours_per_week, 168);
    assert_eq!(found[0].saving, Decimal::from(4 * 168 * 3));
}

#[test]
fn a_quiet_hour_shared_with_work_on_another_gpu_is_not_quiet() {
    // The same hour, one GPU working and another held: the owner worked then.
    let mut hours = office_hours("rerank", 4);
    for week in 0..4 {
        hours.push(hour(
            "rerank",
            MONDAY + week * 7 * DAY_MS + 2 * HOUR_MS,
            Kind::Used,
            1,
        ));
    }
    let c = &find(&hours)[0];
    let weekend = c
        .windows
        .iter()
        .find(|w| w.label.starts_with("Fri"))
        .unwrap();
    assert_eq!(weekend.label, "Fri 20:00 – Mon 02:00 UTC");
}

/// Quiet hours a savings plan covered free commitment, not cash: the weekend's hours here
/// (committed), the weeknights' on demand. The two add up to what the hours cost, and the
/// candidates are ranked by that whole.
#[test]
fn quiet_hours_on_commitment_free_commitment_not_cash() {
    let committed_weekends = |key: &str, rate: i64| -> Vec<OwnerHour> {
        office_hours(key, 4)
            .into_iter()
            .map(|mut h| {
                h.cost = Decimal::from(rate);
                let weekend = (h.hour_ms - MONDAY).div_euclid(DAY_MS) % 7 >= 5;
                if weekend {
                    h.committed = h.cost;
                }
                h
            })
            .collect()
    };
    let mut hours = committed_weekends("rerank", 4);
    // Another endpoint, all on demand, cheaper by the hour than rerank is in all.
    hours.extend(office_hours("embed", 4).into_iter().map(|mut h| {
        h.cost = Decimal::from(3);
        h
    }));
    let found = find(&hours);
    let c = found.iter().find(|c| c.key == "rerank").unwrap();
    // Saturday and Sunday: 48 hours a week, four weeks, at $4.
    assert_eq!(c.frees_commitment, Decimal::from(4 * 48 * 4));
    assert_eq!(c.saving, Decimal::from(4 * (108 - 48) * 4));
    assert_eq!(c.saving + c.frees_commitment, Decimal::from(4 * 108 * 4));
    let e = found.iter().find(|c| c.key == "embed").unwrap();
    assert_eq!(e.frees_commitment, Decimal::ZERO);
    assert_eq!(e.saving, Decimal::from(4 * 108 * 3));
    // rerank's cash saving is below embed's, its whole above: ranked first.
    assert!(c.saving < e.saving);
    assert_eq!(found[0].key, "rerank");
}
