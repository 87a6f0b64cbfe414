//! Commitment discounts (savings plans, reserved instances, committed-use discounts) as the
//! bill states them: how much of each one the month used, the dollars it left unused and when
//! it ends; and, from the ledger, how much of each GPU instance type's cost they covered.
//!
//! FOCUS keeps a commitment's money on two axes that must never be added together: its
//! purchase rows carry the invoice (`BilledCost` > 0, `EffectiveCost` 0) and its usage rows the
//! amortized cost (`BilledCost` 0, `EffectiveCost` > 0), `Used` on the resource it covered and
//! `Unused` on the commitment itself. Utilization and unused dollars are read from the usage
//! rows' effective cost, so they reconcile with the ledger; the purchase rows say what was
//! invoiced and, for an upfront purchase, when the term ends.

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::Serialize;

use crate::bill::spread_over_hours;
use crate::time::DAY_MS;

/// How far ahead an ending commitment is worth a decision (renew, replace or let lapse).
pub const EXPIRING_WITHIN_DAYS: i64 = 90;

/// Whether a usage row's commitment covered it or is the commitment's unused part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Used,
    Unused,
}

impl Status {
    /// FOCUS's `CommitmentDiscountStatus`, whatever its case.
    pub fn parse(text: &str) -> Option<Status> {
        match text.trim().to_ascii_lowercase().as_str() {
            "used" => Some(Status::Used),
            "unused" => Some(Status::Unused),
            _ => None,
        }
    }
}

/// One bill line naming a commitment, as commitments read it.
#[derive(Debug, Clone, PartialEq)]
pub struct CommitmentLine {
    /// FOCUS `ChargeCategory`: `Usage`, `Purchase`, …
    pub charge_category: String,
    /// FOCUS `ChargeFrequency`: `One-Time`, `Recurring` or `Usage-Based`, where given.
    pub charge_frequency: Option<String>,
    pub charge_period_start_ms: i64,
    /// Exclusive.
    pub charge_period_end_ms: i64,
    pub billed_cost: Decimal,
    pub effective_cost: Decimal,
    pub currency: String,
    pub commitment_id: Option<String>,
    pub commitment_name: Option<String>,
    /// FOCUS `CommitmentDiscountType`, as the provider words it ("Savings Plan", …).
    pub commitment_type: Option<String>,
    pub status: Option<Status>,
    /// Whether the line is a GPU instance's (a GPU host's or of a GPU instance type).
    pub gpu: bool,
}

impl CommitmentLine {
    fn is_usage(&self) -> bool {
        self.charge_category.eq_ignore_ascii_case("usage")
    }
    fn is_purchase(&self) -> bool {
        self.charge_category.eq_ignore_ascii_case("purchase")
    }
    /// The amount on `axis` that falls in `[from_ms, to_ms)`, spread by hour as attribution
    /// spreads it, so a month's figure is the month's share of a longer charge.
    fn in_range(&self, amount: Decimal, from_ms: i64, to_ms: i64) -> Decimal {
        spread_over_hours(
            amount,
            self.charge_period_start_ms,
            self.charge_period_end_ms,
            from_ms,
            to_ms,
        )
        .into_iter()
        .map(|(_, a)| a)
        .sum()
    }
}

/// One commitment over a period.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommitmentUse {
    pub id: String,
    pub name: Option<String>,
    /// As the provider words it: "Savings Plan", "Reserved Instance", …
    #[serde(rename = "type")]
    pub commitment_type: Option<String>,
    pub currency: String,
    /// Amortized cost of the usage it covered on GPU instances.
    #[serde(with = "rust_decimal::serde::str")]
    pub used_on_gpus: Decimal,
    /// Amortized cost of the usage it covered elsewhere (a compute savings plan also covers
    /// CPU instances).
    #[serde(with = "rust_decimal::serde::str")]
    pub used_elsewhere: Decimal,
    /// What it cost and nothing used: charged to the fleet, not to any owner.
    #[serde(with = "rust_decimal::serde::str")]
    pub unused: Decimal,
    /// Used ÷ (used + unused), in percent to one decimal; `null` when the bill has no usage
    /// row of it in the period (it cannot be judged, which is not 0 %).
    #[serde(with = "rust_decimal::serde::str_option")]
    pub utilization_percent: Option<Decimal>,
    /// What its purchase rows invoice in the period (upfront and recurring fees).
    #[serde(with = "rust_decimal::serde::str")]
    pub invoiced: Decimal,
    /// When its term ends (exclusive): from an upfront purchase row's charge period, or the
    /// configuration; `null` when neither says.
    pub ends_ms: Option<i64>,
    /// Ends within [`EXPIRING_WITHIN_DAYS`] of now (and has not ended).
    pub expiring: bool,
}

impl CommitmentUse {
    pub fn used(&self) -> Decimal {
        self.used_on_gpus + self.used_elsewhere
    }
}

/// How much of one GPU instance type's usage commitments covered over a period.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TypeCoverage {
    pub instance_type: String,
    pub currency: String,
    /// The type's usage, amortized: covered or not.
    #[serde(with = "rust_decimal::serde::str")]
    pub usage: Decimal,
    /// Of it, what commitments covered.
    #[serde(with = "rust_decimal::serde::str")]
    pub covered: Decimal,
    /// Covered ÷ usage in percent to one decimal; `null` when the type cost nothing.
    #[serde(with = "rust_decimal::serde::str_option")]
    pub coverage_percent: Option<Decimal>,
}

/// Every commitment and GPU instance type of a period.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Commitments {
    /// Each commitment the period's bill names, by id.
    pub commitments: Vec<CommitmentUse>,
    /// Each GPU instance type with usage in the period, by type.
    pub coverage: Vec<TypeCoverage>,
    /// Unused commitment dollars per currency, as the bill states them.
    pub unused: Vec<Unused>,
    /// Who the unused dollars are charged to: the fleet (their own line, nobody's) or, as
    /// configured, the owners of what each commitment covered in the same hour (the hours it
    /// covered nothing stay the fleet's).
    pub unused_charged_to: UnusedCharge,
}

/// Unused commitment dollars of one currency.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Unused {
    pub currency: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub amount: Decimal,
}

/// Percent to one decimal, `None` for a zero denominator.
fn percent(part: Decimal, whole: Decimal) -> Option<Decimal> {
    (!whole.is_zero()).then(|| {
        let mut p = (part * Decimal::ONE_HUNDRED / whole).round_dp(1);
        p.rescale(1);
        p
    })
}

/// One instance type's cost in the ledger under one pricing category.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct TypeCost {
    pub instance_type: String,
    pub currency: String,
    /// `committed`, `on_demand`, `spot` or `other`, as attribution keeps it.
    pub pricing_category: String,
    pub cost: Decimal,
    pub gpu_seconds: f64,
}

/// How much of each GPU instance type's cost commitments covered: its committed cost ÷ all of
/// it, from the ledger (which holds GPU hosts alone, at the cost the bill charged), by type.
pub fn coverage(costs: &[TypeCost]) -> Vec<TypeCoverage> {
    let mut by_type: BTreeMap<(&str, &str), (Decimal, Decimal)> = BTreeMap::new();
    // A commitment's unused part charged to owners is nobody's usage: not in either figure.
    for c in costs
        .iter()
        .filter(|c| c.pricing_category != crate::bill::UNUSED_COMMITMENT_CATEGORY)
    {
        let t = by_type
            .entry((c.instance_type.as_str(), c.currency.as_str()))
            .or_default();
        t.0 += c.cost;
        if c.pricing_category == "committed" {
            t.1 += c.cost;
        }
    }
    by_type
        .into_iter()
        .map(
            |((instance_type, currency), (usage, covered))| TypeCoverage {
                coverage_percent: percent(covered, usage),
                instance_type: instance_type.to_owned(),
                currency: currency.to_owned(),
                usage,
                covered,
            },
        )
        .collect()
}

/// The commitments of `[from_ms, to_ms)` from its bill lines naming one. `ends` gives each
/// commitment's end where the configuration states it; an upfront (`One-Time`) purchase row in
/// `purchases` (any period: it is invoiced once, when bought) states it otherwise.
pub fn summarize(
    lines: &[CommitmentLine],
    purchases: &[CommitmentLine],
    ends: &BTreeMap<String, i64>,
    from_ms: i64,
    to_ms: i64,
    now_ms: i64,
) -> Commitments {
    let mut by_id: BTreeMap<(String, String), CommitmentUse> = BTreeMap::new();
    let mut usage_seen: BTreeMap<(String, String), bool> = BTreeMap::new();
    for line in lines {
        let effective = line.in_range(line.effective_cost, from_ms, to_ms);
        let Some(id) = line.commitment_id.as_deref().filter(|id| !id.is_empty()) else {
            continue;
        };
        let key = (id.to_owned(), line.currency.clone());
        let entry = by_id.entry(key.clone()).or_insert_with(|| CommitmentUse {
            id: id.to_owned(),
            name: None,
            commitment_type: None,
            currency: line.currency.clone(),
            used_on_gpus: Decimal::ZERO,
            used_elsewhere: Decimal::ZERO,
            unused: Decimal::ZERO,
            utilization_percent: None,
            invoiced: Decimal::ZERO,
            ends_ms: None,
            expiring: false,
        });
        if entry.name.is_none() {
            entry.name.clone_from(&line.commitment_name);
        }
        if entry.commitment_type.is_none() {
            entry.commitment_type.clone_from(&line.commitment_type);
        }
        if line.is_purchase() {
            // Invoiced when its charge begins: an upfront fee whole in the month it was bought
            // (its charge period is the term), a recurring fee in each period it is for.
            if (from_ms..to_ms).contains(&line.charge_period_start_ms) {
                entry.invoiced += line.billed_cost;
            }
        } else if line.is_usage() {
            match line.status {
                Some(Status::Used) if line.gpu => entry.used_on_gpus += effective,
                Some(Status::Used) => entry.used_elsewhere += effective,
                Some(Status::Unused) => entry.unused += effective,
                None => continue,
            }
            usage_seen.insert(key, true);
        }
    }
    // Upfront purchases state the term: the latest end any of a commitment's says.
    let mut bought_until: BTreeMap<&str, i64> = BTreeMap::new();
    for p in purchases.iter().chain(lines).filter(|p| {
        p.is_purchase()
            && p.charge_frequency
                .as_deref()
                .is_some_and(|f| f.eq_ignore_ascii_case("one-time"))
            && p.charge_period_end_ms > p.charge_period_start_ms
    }) {
        if let Some(id) = p.commitment_id.as_deref() {
            let end = bought_until.entry(id).or_insert(p.charge_period_end_ms);
            *end = (*end).max(p.charge_period_end_ms);
        }
    }
    let mut unused: BTreeMap<String, Decimal> = BTreeMap::new();
    let commitments = by_id
        .into_iter()
        .map(|(key, mut c)| {
            if usage_seen.contains_key(&key) {
                c.utilization_percent = percent(c.used(), c.used() + c.unused);
            }
            c.ends_ms = ends
                .get(&c.id)
                .copied()
                .or_else(|| bought_until.get(c.id.as_str()).copied());
            c.expiring = c
                .ends_ms
                .is_some_and(|end| end > now_ms && end - now_ms <= EXPIRING_WITHIN_DAYS * DAY_MS);
            *unused.entry(c.currency.clone()).or_default() += c.unused;
            c
        })
        .collect();
    Commitments {
        commitments,
        coverage: Vec::new(),
        unused: unused
            .into_iter()
            .map(|(currency, amount)| Unused { currency, amount })
            .collect(),
        unused_charged_to: UnusedCharge::Fleet,
    }
}

mod unused;
pub use unused::{charge_unused, UnusedCharge};

#[cfg(test)]
mod tests;
