use super::*;

fn at(text: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap()
        .timestamp_millis()
}

#[test]
fn a_month_in_progress_is_set_against_the_same_stretch_of_the_last() {
    let (from, to) = (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"));
    let now = at("2026-11-23T14:37:00Z");
    assert_eq!(
        comparison(from, to, now),
        (at("2026-10-01T00:00:00Z"), at("2026-10-23T14:00:00Z"), true)
    );
    // A closed month: the whole previous month.
    assert_eq!(
        comparison(from, to, at("2026-12-02T00:00:00Z")),
        (
            at("2026-10-01T00:00:00Z"),
            at("2026-11-01T00:00:00Z"),
            false
        )
    );
    // The 30th of March goes past the end of February: all of February.
    let (march, april) = (at("2027-03-01T00:00:00Z"), at("2027-04-01T00:00:00Z"));
    assert_eq!(
        comparison(march, april, at("2027-03-30T10:00:00Z")),
        (at("2027-02-01T00:00:00Z"), at("2027-03-01T00:00:00Z"), true)
    );
    let caption = comparison_caption(
        at("2026-10-01T00:00:00Z"),
        at("2026-10-23T14:00:00Z"),
        true,
        "$1,000.00",
    );
    assert_eq!(
        caption,
        "month to date, against the same stretch of 2026-10 (1 Oct to 23 Oct 14:00 UTC: $1,000.00)"
    );
}
