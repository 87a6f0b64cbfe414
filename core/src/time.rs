//! Time as gpuledger counts it: epoch milliseconds, UTC. The ledger is hourly; months are
//! calendar months.

use chrono::{DateTime, Datelike, NaiveDate, Utc};

pub const HOUR_MS: i64 = 3_600_000;
pub const DAY_MS: i64 = 24 * HOUR_MS;

/// The start of the hour `ms` falls in.
pub fn hour_floor(ms: i64) -> i64 {
    ms.div_euclid(HOUR_MS) * HOUR_MS
}

/// The start of the UTC day `ms` falls in.
pub fn day_floor(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS) * DAY_MS
}

/// The UTC weekday of `ms`, Monday 0 to Sunday 6 (1970-01-01 was a Thursday).
pub fn weekday(ms: i64) -> u32 {
    (ms.div_euclid(DAY_MS) + 3).rem_euclid(7) as u32
}

/// The first instant of the month `ms` falls in.
pub fn month_start_ms(ms: i64) -> i64 {
    DateTime::from_timestamp_millis(ms)
        .and_then(|d| d.date_naive().with_day(1))
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(ms, |d| d.and_utc().timestamp_millis())
}

/// The first instant of the month after the one `ms` falls in.
pub fn next_month_start(ms: i64) -> i64 {
    let start = month_start_ms(ms);
    DateTime::<Utc>::from_timestamp_millis(start)
        .and_then(|d| {
            let (y, m) = if d.month() == 12 {
                (d.year() + 1, 1)
            } else {
                (d.year(), d.month() + 1)
            };
            NaiveDate::from_ymd_opt(y, m, 1)
        })
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(start + 31 * DAY_MS, |d| d.and_utc().timestamp_millis())
}

/// `[start, end)` of the calendar month `ms` falls in.
pub fn month_of(ms: i64) -> (i64, i64) {
    (month_start_ms(ms), next_month_start(ms))
}

/// `YYYY-MM` of the month containing `ms`.
pub fn month_label(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms).map_or_else(String::new, |d| d.format("%Y-%m").to_string())
}

/// `ms` as RFC 3339 to the second, UTC (`2026-11-01T00:00:00Z`).
pub fn rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn months_and_their_ends() {
        // 2026-11-23T20:31:24Z
        let t = 1_795_465_884_000;
        assert_eq!(rfc3339(month_start_ms(t)), "2026-11-01T00:00:00Z");
        assert_eq!(rfc3339(next_month_start(t)), "2026-12-01T00:00:00Z");
        // December rolls over the year.
        let december = next_month_start(t) + 5 * DAY_MS;
        assert_eq!(rfc3339(next_month_start(december)), "2027-01-01T00:00:00Z");
        assert_eq!(month_label(t), "2026-11");
        assert_eq!(rfc3339(hour_floor(t)), "2026-11-23T20:00:00Z");
        assert_eq!(rfc3339(day_floor(t)), "2026-11-23T00:00:00Z");
    }

    proptest! {
        /// Every instant lies in exactly one month, which starts on the 1st at midnight and
        /// ends where the next begins; floors never move forward.
        #[test]
        fn an_instant_lies_in_its_month(ms in 0i64..4_102_444_800_000) {
            let (start, end) = month_of(ms);
            prop_assert!(start <= ms && ms < end);
            prop_assert_eq!(month_start_ms(end), end);
            prop_assert!((28 * DAY_MS..=31 * DAY_MS).contains(&(end - start)));
            prop_assert!(hour_floor(ms) <= ms && ms - hour_floor(ms) < HOUR_MS);
            prop_assert!(day_floor(ms) <= hour_floor(ms));
        }
    }
}
