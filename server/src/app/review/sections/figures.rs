//! The review's headline: what the month cost, how it changed, its idle, held-idle and
//! unmonitored dollars, GPU-hours, energy and emissions, each linking to where it comes from;
//! and what the bill carries besides (other currencies, lines not attributed, estimates).

use rust_decimal::Decimal;

use super::Section;
use crate::app::review::charts::{self, Figure};
use crate::app::review::{Ask, Month};
use crate::store::StoreError;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::attribution::Attribution;
use gpuledger_core::time::month_label;

pub struct Figures {
    pub list: Vec<Figure>,
    /// What the bill carries that no owner was given (not GPU hosts, or not yet attributed).
    pub unattributed: String,
    /// What the bill carries in currencies other than the page's, in words ("" when none).
    pub other_currencies: String,
    /// How much of the month is estimated (hours after the bill's last line), in words; ""
    /// when none is.
    pub estimated: String,
}

impl Section for Figures {
    type Read = ();

    async fn read(_: &Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn build((): (), month: &Month<'_>) -> Result<Figures, StoreError> {
        let ask = month.ask;
        let t = month.totals.as_ref();
        let total = month.total();
        let previous_total = month.previous_total();
        let change = if previous_total.is_zero() {
            "no spend the month before".to_owned()
        } else {
            let diff = total - previous_total;
            let pct = (diff / previous_total * Decimal::from(100)).round_dp(1);
            // One sign, written once for both figures.
            let sign = if diff.is_sign_negative() { "−" } else { "+" };
            format!("{sign}{} ({sign}{}%)", month.money(diff.abs()), pct.abs())
        };
        let api = |by: GroupBy| api_href(ask, by);
        let of = |f: fn(&gpuledger_core::allocation::Totals) -> Decimal| {
            month.money(t.map_or(Decimal::ZERO, f))
        };
        let mut list = vec![
            Figure {
                value: month.money(total),
                caption: "GPU spend, attributed to the cent".into(),
                href: api(GroupBy::Cluster),
            },
            Figure {
                value: change,
                caption: comparison_caption(
                    (ask.prev_from, ask.prev_to, ask.partial),
                    &month.money(previous_total),
                ),
                href: format!("/review/{}", month_label(ask.prev_from)),
            },
            Figure {
                value: of(|t| t.idle_cost),
                caption: "idle (no process)".into(),
                href: charts::drill_href(
                    &ask.month,
                    GroupBy::TEAM,
                    gpuledger_core::allocation::IDLE_KEY,
                ),
            },
            Figure {
                value: of(|t| t.held_idle_cost),
                caption: "held idle (memory held at ~0%)".into(),
                href: api(GroupBy::TEAM),
            },
            Figure {
                value: of(|t| t.unmonitored_cost),
                caption: "unmonitored (no agent data)".into(),
                // Where bill tags or the cluster map name owners of unwatched time, the cost is
                // spread over teams: the API lists it per team, as for held idle.
                href: if (ask.cx.config.owners).names_unwatched_owners(GroupBy::TEAM.as_str()) {
                    api(GroupBy::TEAM)
                } else {
                    charts::drill_href(
                        &ask.month,
                        GroupBy::TEAM,
                        gpuledger_core::allocation::UNMONITORED_KEY,
                    )
                },
            },
            Figure {
                value: crate::format::whole(t.map_or(0.0, |t| t.gpu_hours)),
                caption: "GPU-hours".into(),
                href: api(GroupBy::Cluster),
            },
        ];
        list.extend(charts::footprint_figures(
            t.map(|t| (t.energy_kwh, t.energy_measured_share, t.kg_co2e)),
            (api(GroupBy::MODEL), api(GroupBy::TEAM)),
        ));
        Ok(Figures {
            list,
            unattributed: of(|t| t.unattributed_cost),
            other_currencies: charts::other_currencies(&month.others),
            estimated: estimated_share(&month.shown, total, &month.currency),
        })
    }
}

/// The allocation API's JSON for the month, `by` one dimension.
fn api_href(ask: &Ask<'_>, by: GroupBy) -> String {
    charts::api_href(&ask.month, &ask.next, by, "month", &[])
}

/// How the comparison is named on the page.
fn comparison_caption((prev_from, prev_to, partial): (i64, i64, bool), total: &str) -> String {
    let at = |ms: i64, f: &str| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map_or_else(String::new, |d| d.format(f).to_string())
    };
    if partial {
        format!(
            "month to date, against the same stretch of {} ({} to {} UTC: {total})",
            month_label(prev_from),
            at(prev_from, "%-d %b"),
            at(prev_to, "%-d %b %H:%M"),
        )
    } else {
        format!(
            "against {}, the whole month ({total})",
            month_label(prev_from)
        )
    }
}

/// How much of a month's `total` (in `currency`) is estimated, in words: the hours after the
/// bill's last line, each priced at what the bill last charged its host (the rate card for a
/// host it never charged); "" when the bill covers it all.
fn estimated_share(a: &Attribution, total: Decimal, currency: &str) -> String {
    let (cost, seconds) = a
        .parts
        .iter()
        .filter(|p| p.estimated)
        .fold((Decimal::ZERO, 0.0), |(c, s), p| {
            (c + p.cost, s + p.gpu_seconds)
        });
    if cost.is_zero() && seconds == 0.0 {
        return String::new();
    }
    let pct = if total.is_zero() {
        Decimal::ZERO
    } else {
        (cost / total * Decimal::from(100)).round_dp(1)
    };
    format!(
        "{} of these figures ({pct:.1}%, {} GPU-hours) is estimated: hours the bill does not \
         cover yet, each priced at what the bill last charged its host (the rate card's price \
         for a host no bill has charged).",
        crate::format::money(cost, currency),
        crate::format::whole(seconds / 3600.0)
    )
}

#[cfg(test)]
mod tests {
    use super::comparison_caption;
    use crate::variance::comparison;

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
            (at("2026-10-01T00:00:00Z"), at("2026-10-23T14:00:00Z"), true),
            "$1,000.00",
        );
        assert_eq!(
            caption,
            "month to date, against the same stretch of 2026-10 (1 Oct to 23 Oct 14:00 UTC: $1,000.00)"
        );
    }
}
