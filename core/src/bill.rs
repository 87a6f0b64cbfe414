//! Bill lines: what one resource cost over one charge period, as every bill source (FOCUS
//! exports, Cost Explorer, the rate card) produces them, and the errors that refuse a bill file.

use rust_decimal::Decimal;

use crate::money::split_exact;
use crate::time::{hour_floor, HOUR_MS};

/// The hours (UTC starts) a charge over `[start, end)` touches: every hour it overlaps, and for
/// a point-in-time charge (`end <= start`) its own hour. The one answer to "which hours does this
/// bill line touch", for spreading its amount and for marking the hours to roll up again.
pub fn charge_hours(start: i64, end: i64) -> impl Iterator<Item = i64> {
    let end = end.max(start + 1);
    let first = hour_floor(start);
    (0..)
        .map(move |i| first + i * HOUR_MS)
        .take_while(move |h| *h < end)
}

/// One line of a bill: what one resource cost over one charge period.
#[derive(Debug, Clone, PartialEq)]
pub struct CostLine {
    /// Where it came from in its file (header = line 1), or its position in an API answer.
    pub line_no: u64,
    pub provider: String,
    pub billing_account_id: String,
    pub billing_period_start_ms: i64,
    pub charge_period_start_ms: i64,
    /// Exclusive.
    pub charge_period_end_ms: i64,
    /// Usage, Purchase, Tax, Credit or Adjustment.
    pub charge_category: String,
    pub resource_id: Option<String>,
    /// `resource_id` normalised for joining with hosts' instance ids.
    pub resource_key: Option<String>,
    /// What the invoice says.
    pub billed_cost: Decimal,
    /// Amortized after discounts: what chargeback uses.
    pub effective_cost: Decimal,
    pub list_cost: Decimal,
    pub currency: String,
    /// on_demand, spot, committed or other.
    pub pricing_category: String,
    pub commitment_discount_id: Option<String>,
    pub commitment_discount_status: Option<String>,
    pub service_name: Option<String>,
    pub sku_id: Option<String>,
    pub region: Option<String>,
    pub instance_type: Option<String>,
    pub tags_json: String,
    /// Provider (`x_`) columns and other details kept as they came.
    pub extra_json: String,
}

/// A line's tags as text values (a number or boolean tag written as it reads; `null` and
/// nested values left out), from its `tags_json`.
pub fn tags_of(tags_json: &str) -> std::collections::BTreeMap<String, String> {
    let parsed: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_str(tags_json).unwrap_or_default();
    parsed
        .into_iter()
        .filter_map(|(k, v)| match v {
            serde_json::Value::String(s) => Some((k, s)),
            serde_json::Value::Number(n) => Some((k, n.to_string())),
            serde_json::Value::Bool(b) => Some((k, b.to_string())),
            _ => None,
        })
        .collect()
}

/// The key a resource joins on: an ARN's resource id (`arn:…:instance/i-0abc` → `i-0abc`), the
/// last segment of a path-like id (Azure, GCP), lower-cased since Azure ids ignore case.
pub fn normalize_resource_id(id: &str) -> String {
    let id = id.trim();
    let last = if id.starts_with("arn:") {
        id.rsplit(['/', ':']).next().unwrap_or(id)
    } else if id.contains('/') {
        id.trim_end_matches('/').rsplit('/').next().unwrap_or(id)
    } else {
        id
    };
    last.to_ascii_lowercase()
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FocusError {
    #[error("line {line}, column {column}: {message}")]
    Field {
        line: u64,
        column: String,
        message: String,
    },
    #[error("line {line}: {message}")]
    Line { line: u64, message: String },
    #[error("line 1: the file has no {0} column: is it a FOCUS cost-and-usage export?")]
    MissingColumn(String),
    #[error("line 1: this is a FOCUS {0} file, not a cost-and-usage export: import the cost-and-usage dataset")]
    OtherDataset(String),
    #[error("the file holds no rows")]
    Empty,
    #[error(
        "{repeated} of its first {sampled} lines are already in force from {other}: it looks like \
         a new export of the same billing period, not another part of it, and importing it as \
         a part would count the period twice. To replace the period, import it with \
         --whole-periods (on the billing page: \"the whole of its billing periods\"), or under \
         the name of the file it corrects"
    )]
    RepeatsFile {
        other: String,
        repeated: u64,
        sampled: u64,
    },
    #[error("reading the file: {0}")]
    Io(String),
    #[error(
        "the export's manifest says this file holds {expected} rows, but it has {found}: it was \
         probably cut short in transfer; download it again"
    )]
    RowCount { expected: u64, found: u64 },
}

/// How far back an hour after the bill's last line looks for the rate the bill last charged its
/// host: bills lag the hours they cover by a day or two (longer at a month's start), and a host
/// the bill has not charged for a month is priced from the rate card again.
pub const LAST_BILLED_LOOKBACK_MS: i64 = 31 * 24 * HOUR_MS;

/// Spreads an amount charged over `[start, end)` across its hours by overlap, exactly, and keeps
/// the hours in `[from_ms, to_ms)`. The same split whatever the range asked for, so a line's
/// hours add up to the line.
pub fn spread_over_hours(
    amount: Decimal,
    start: i64,
    end: i64,
    from_ms: i64,
    to_ms: i64,
) -> Vec<(i64, Decimal)> {
    if end <= start {
        // A point-in-time charge: all of it in its hour.
        return if (from_ms..to_ms).contains(&start) {
            vec![(hour_floor(start), amount)]
        } else {
            Vec::new()
        };
    }
    let hours: Vec<i64> = charge_hours(start, end).collect();
    let weights: Vec<f64> = hours
        .iter()
        .map(|&h| ((h + HOUR_MS).min(end) - h.max(start)) as f64)
        .collect();
    split_exact(amount, &weights)
        .into_iter()
        .zip(hours)
        .filter(|(_, h)| *h >= hour_floor(from_ms) && *h < to_ms)
        .map(|(a, h)| (h, a))
        .collect()
}

/// A stored cost line, as attribution reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCostLine {
    pub resource_key: Option<String>,
    pub charge_period_start_ms: i64,
    pub charge_period_end_ms: i64,
    pub charge_category: String,
    pub billed_cost: Decimal,
    pub effective_cost: Decimal,
    pub currency: String,
    pub pricing_category: String,
    pub instance_type: Option<String>,
    /// The line's tags as JSON (`{}` for none): owner dimensions may read them.
    pub tags_json: String,
    /// The commitment discount the line names (FOCUS `CommitmentDiscountId`), if any.
    pub commitment_id: Option<String>,
    /// What the line is to that commitment, where the bill says.
    pub commitment_part: Option<CommitmentPart>,
}

impl StoredCostLine {
    /// A commitment's unused part left to the fleet: no resource's cost, even where the bill
    /// names one (as FOCUS 1.2's flexibility examples do).
    pub fn is_unused_commitment(&self) -> bool {
        self.commitment_part == Some(CommitmentPart::Unused)
    }
}

/// The pricing category of an unused commitment's share charged to an owner: committed
/// pricing, but not usage a commitment covered (coverage and the committed rate leave it out).
pub const UNUSED_COMMITMENT_CATEGORY: &str = "committed_unused";

/// What a cost line is to a commitment discount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitmentPart {
    /// Usage the commitment covered (FOCUS `CommitmentDiscountStatus` `Used`).
    Used,
    /// The commitment's unused part (`Unused`): nobody's usage, charged to the fleet.
    Unused,
    /// A share of an hour's unused part charged to a resource the commitment covered in that
    /// hour (`[commitments] unused = "covered_owners"`): attributed as that resource's cost.
    UnusedShare,
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = HOUR_MS;

    #[test]
    fn a_charge_touches_every_hour_it_overlaps_and_a_point_its_own() {
        let hours = |s, e| charge_hours(s, e).collect::<Vec<_>>();
        assert_eq!(hours(10 * H, 12 * H), [10 * H, 11 * H]);
        assert_eq!(hours(10 * H + 1, 11 * H + 1), [10 * H, 11 * H]);
        assert_eq!(hours(10 * H + 5, 10 * H + 5), [10 * H], "a point in time");
        assert_eq!(
            hours(10 * H + 5, 9 * H),
            [10 * H],
            "an end before the start"
        );
    }

    #[test]
    fn a_spread_adds_up_to_the_charge_whatever_range_is_asked() {
        let amount = Decimal::new(1000, 2);
        let whole = spread_over_hours(amount, 10 * H + H / 2, 13 * H, 0, 100 * H);
        assert_eq!(whole.iter().map(|(_, a)| *a).sum::<Decimal>(), amount);
        assert_eq!(
            whole[0],
            (10 * H, Decimal::new(200, 2)),
            "half an hour of 2.5"
        );
        let part = spread_over_hours(amount, 10 * H + H / 2, 13 * H, 11 * H, 12 * H);
        assert_eq!(
            part,
            [(11 * H, whole[1].1)],
            "the same split, one hour of it"
        );
    }
}
