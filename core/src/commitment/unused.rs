//! Who pays for a commitment's unused part. By default the fleet: an hour nothing the
//! commitment covers ran is nobody's usage. A company that wants the teams who use a
//! commitment to carry its slack configures `[commitments] unused = "covered_owners"`: each
//! hour's unused part is then divided over the resources the same commitment covered in that
//! hour, in proportion to what it covered on each, and attributed with their usage. An hour in
//! which the commitment covered nothing stays the fleet's either way.

use std::collections::HashMap;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::bill::{spread_over_hours, CommitmentPart, StoredCostLine, UNUSED_COMMITMENT_CATEGORY};
use crate::money::split_exact;
use crate::time::HOUR_MS;

/// Per hour, the lines a commitment covered (by index) and the amount on each.
type CoveredHours = HashMap<i64, Vec<(usize, Decimal)>>;

/// Who a commitment's unused part is charged to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum UnusedCharge {
    /// Nobody's: the fleet's own line, never an owner's.
    #[default]
    Fleet,
    /// The owners of the usage the commitment covered in the same hour, in proportion.
    CoveredOwners,
}

/// `lines` as attribution reads them over `[from_ms, to_ms)` under `charge`: with
/// [`UnusedCharge::CoveredOwners`], every unused line of a commitment that covered something in
/// one of its hours is cut into hours, each hour's amount divided exactly over that hour's
/// `Used` lines of the same commitment and currency (as [`CommitmentPart::UnusedShare`] lines on
/// their resources), and the hours it covered nothing left unused. Amounts outside the range
/// are dropped from the lines cut, so read the result over the same range.
pub fn charge_unused(
    lines: Vec<StoredCostLine>,
    charge: UnusedCharge,
    from_ms: i64,
    to_ms: i64,
) -> Vec<StoredCostLine> {
    if charge == UnusedCharge::Fleet {
        return lines;
    }
    let key = |l: &StoredCostLine| {
        l.commitment_id
            .as_deref()
            .filter(|id| !id.is_empty())
            .map(|id| (id.to_owned(), l.currency.clone()))
    };
    let hourly = |l: &StoredCostLine| {
        spread_over_hours(
            l.effective_cost,
            l.charge_period_start_ms,
            l.charge_period_end_ms,
            from_ms,
            to_ms,
        )
    };
    // What each commitment (by id and currency) covered per hour, and on which line.
    let mut covered: HashMap<(String, String), CoveredHours> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        if l.commitment_part != Some(CommitmentPart::Used) {
            continue;
        }
        let Some(k) = key(l) else { continue };
        let hours = covered.entry(k).or_default();
        for (hour, amount) in hourly(l) {
            if amount > Decimal::ZERO {
                hours.entry(hour).or_default().push((i, amount));
            }
        }
    }
    let mut out = Vec::with_capacity(lines.len());
    for l in &lines {
        let users = match key(l) {
            Some(k) if l.is_unused_commitment() => covered.get(&k),
            _ => None,
        };
        let Some(users) = users else {
            out.push(l.clone());
            continue;
        };
        let hours = hourly(l);
        if !hours.iter().any(|(h, _)| users.contains_key(h)) {
            out.push(l.clone());
            continue;
        }
        for (hour, amount) in hours {
            let piece = |resource: &StoredCostLine, part, cost| StoredCostLine {
                resource_key: resource.resource_key.clone(),
                instance_type: resource.instance_type.clone(),
                tags_json: resource.tags_json.clone(),
                pricing_category: if part == CommitmentPart::UnusedShare {
                    UNUSED_COMMITMENT_CATEGORY.to_owned()
                } else {
                    resource.pricing_category.clone()
                },
                charge_period_start_ms: hour,
                charge_period_end_ms: hour + HOUR_MS,
                billed_cost: Decimal::ZERO,
                effective_cost: cost,
                commitment_part: Some(part),
                ..l.clone()
            };
            match users.get(&hour) {
                None => out.push(piece(l, CommitmentPart::Unused, amount)),
                Some(on) => {
                    // Weights in the covered amounts' own unit; the split itself is exact.
                    let weights: Vec<f64> = on
                        .iter()
                        .map(|(_, a)| rust_decimal::prelude::ToPrimitive::to_f64(a).unwrap_or(0.0))
                        .collect();
                    for ((i, _), share) in on.iter().zip(split_exact(amount, &weights)) {
                        out.push(piece(&lines[*i], CommitmentPart::UnusedShare, share));
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = HOUR_MS;

    fn line(
        resource: &str,
        part: Option<CommitmentPart>,
        cost: &str,
        (start, end): (i64, i64),
    ) -> StoredCostLine {
        StoredCostLine {
            resource_key: Some(resource.into()),
            charge_period_start_ms: start,
            charge_period_end_ms: end,
            charge_category: "Usage".into(),
            billed_cost: Decimal::ZERO,
            effective_cost: cost.parse().unwrap(),
            currency: "USD".into(),
            pricing_category: if part.is_some() {
                "Committed"
            } else {
                "Standard"
            }
            .into(),
            instance_type: None,
            tags_json: format!("{{\"team\":\"{resource}\"}}"),
            commitment_id: part.map(|_| "sp-1".into()),
            commitment_part: part,
        }
    }

    fn total(lines: &[StoredCostLine], from: i64, to: i64) -> Decimal {
        lines
            .iter()
            .flat_map(|l| {
                spread_over_hours(
                    l.effective_cost,
                    l.charge_period_start_ms,
                    l.charge_period_end_ms,
                    from,
                    to,
                )
            })
            .map(|(_, a)| a)
            .sum()
    }

    /// A plan covering two instances 3:1 in its first hour and nothing in its second: the first
    /// hour's unused part goes to them 3:1, the second's stays the fleet's, to the cent.
    #[test]
    fn an_hours_unused_part_follows_what_the_plan_covered_in_that_hour() {
        let used = Some(CommitmentPart::Used);
        let lines = vec![
            line("i-a", used, "0.60", (0, H)),
            line("i-b", used, "0.20", (0, H)),
            line("i-c", None, "5.00", (0, 2 * H)),
            line("sp-1", Some(CommitmentPart::Unused), "1.21", (0, 2 * H)),
        ];
        let fleet = charge_unused(lines.clone(), UnusedCharge::Fleet, 0, 2 * H);
        assert_eq!(fleet, lines, "the fleet's by default: nothing changes");
        let out = charge_unused(lines.clone(), UnusedCharge::CoveredOwners, 0, 2 * H);
        assert_eq!(total(&out, 0, 2 * H), total(&lines, 0, 2 * H));
        let shares: Vec<(&str, Option<CommitmentPart>, i64, String)> = out
            .iter()
            .filter(|l| l.commitment_part != Some(CommitmentPart::Used))
            .filter(|l| l.resource_key.as_deref() != Some("i-c"))
            .map(|l| {
                (
                    l.resource_key.as_deref().unwrap_or(""),
                    l.commitment_part,
                    l.charge_period_start_ms,
                    l.effective_cost.to_string(),
                )
            })
            .collect();
        // 1.21 over two hours: 0.605 each; the first hour's 3:1.
        assert_eq!(
            shares,
            [
                (
                    "i-a",
                    Some(CommitmentPart::UnusedShare),
                    0,
                    "0.45375".into()
                ),
                (
                    "i-b",
                    Some(CommitmentPart::UnusedShare),
                    0,
                    "0.15125".into()
                ),
                ("sp-1", Some(CommitmentPart::Unused), H, "0.605".into()),
            ]
        );
        let a = out
            .iter()
            .find(|l| l.commitment_part == Some(CommitmentPart::UnusedShare))
            .unwrap();
        assert_eq!(
            (a.tags_json.as_str(), a.pricing_category.as_str()),
            ("{\"team\":\"i-a\"}", UNUSED_COMMITMENT_CATEGORY),
            "a share carries its resource's tags, so it is attributed with it, and is priced as \
             what it is: not usage the plan covered"
        );
    }

    /// Another commitment's or currency's usage takes none of it, nor does a usage row the
    /// bill rounds to 0; and read over part of its period, the part is what is divided.
    #[test]
    fn only_the_same_commitments_usage_in_the_range_takes_a_share() {
        let mut other = line("i-x", Some(CommitmentPart::Used), "1.00", (0, H));
        other.commitment_id = Some("sp-2".into());
        let mut euro = line("i-y", Some(CommitmentPart::Used), "1.00", (0, H));
        euro.currency = "EUR".into();
        let zero = line("i-z", Some(CommitmentPart::Used), "0", (0, H));
        let unused = line("sp-1", Some(CommitmentPart::Unused), "2.00", (0, H));
        let lines = vec![other, euro, zero, unused];
        let out = charge_unused(lines.clone(), UnusedCharge::CoveredOwners, 0, H);
        assert_eq!(out, lines, "nothing of sp-1 in USD was used: the fleet's");

        let day = vec![
            line("i-a", Some(CommitmentPart::Used), "24", (0, 24 * H)),
            line("sp-1", Some(CommitmentPart::Unused), "48", (0, 24 * H)),
        ];
        let out = charge_unused(day, UnusedCharge::CoveredOwners, 6 * H, 8 * H);
        let shared: Decimal = out
            .iter()
            .filter(|l| l.commitment_part == Some(CommitmentPart::UnusedShare))
            .map(|l| l.effective_cost)
            .sum();
        assert_eq!(shared, Decimal::from(4), "two hours of a $48 day");
        assert!(!out.iter().any(|l| l.is_unused_commitment()));
    }
}
