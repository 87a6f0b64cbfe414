//! Recommendations: inference sized for peak, GPUs that could be consolidated, and training on
//! on-demand capacity that could run on spot, each with what it would have saved over the
//! look-back.
//!
//! Right-sizing looks at each endpoint and each model over a look-back (default 7 days): its
//! peak GPU memory per process, its p95 GPU utilization, the GPU (or MIG slice) it runs on and
//! what it cost. A smaller GPU fits when peak memory plus headroom (20%) fits in it and the p95
//! utilization, scaled by the two GPUs' relative compute, stays under a target (80%); the
//! cheapest fitting one is recommended, and the saving is its cost scaled by the price ratio.
//! Prices are the rate card's, per GPU of an instance type (a MIG slice: its sevenths).
//!
//! Savings are counted once: every recommendation names its GPUs, and where two cover the same
//! GPU only the one that saves more is kept ([`disjoint`]), so the total adds up.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::activity::{BANDS, UTIL_BAND_POINTS};
use crate::attribution::Part;
use crate::owners::OwnerSchema;
use crate::ratecard::RateCard;
use crate::telemetry::UsageTotal;

pub mod catalog;

pub const HOURS_PER_MONTH: i64 = 730;
/// The ledger's pricing category of hours a commitment (savings plan, reservation) covered.
const COMMITTED: &str = "committed";

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub headroom: f64,
    pub target_util: f64,
    pub consolidation_below: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            headroom: 0.20,
            target_util: 80.0,
            consolidation_below: 50.0,
        }
    }
}

/// Each recommendation names the GPUs it covers; no two kept recommendations share a GPU, so
/// their savings add up without counting a GPU-hour twice. `cost` and `saving` are over the
/// look-back, from the ledger; a saving never exceeds the cost it comes from.
///
/// `saving` is cash: what the bill would drop by. The part of a change that falls on hours a
/// commitment (a savings plan, a reservation) covered is `frees_commitment` instead: the
/// commitment is paid for either way, so releasing or shrinking those GPUs frees commitment for
/// other work, and is cash only once other on-demand work takes it up or the commitment is
/// reduced at renewal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RightSize {
    /// The currency of `cost` and `saving`: the bill's for the GPUs it covers.
    pub currency: String,
    /// `endpoint` or `model`.
    pub by: String,
    pub key: String,
    pub current_gpu: String,
    pub gpus: Vec<String>,
    pub peak_memory_gb: f64,
    pub p95_util: f64,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub saving: Decimal,
    /// The change's part on hours a commitment covered: freed commitment, not cash.
    #[serde(with = "rust_decimal::serde::str")]
    pub frees_commitment: Decimal,
    /// Serving runs all month: the look-back's rate over a 730-hour month.
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_saving: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_frees_commitment: Decimal,
    pub recommended_gpu: String,
    pub recommended_instance_type: String,
    pub projected_p95_util: f64,
}

/// Whole GPUs of a host, each busy less than the threshold: their work could share fewer GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Consolidation {
    pub currency: String,
    pub gpus: Vec<String>,
    pub host: String,
    pub avg_util: f64,
    /// The move, in words.
    pub action: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    /// The share of its cost its work does not need at the target utilization, in cash.
    #[serde(with = "rust_decimal::serde::str")]
    pub saving: Decimal,
    /// The same share of its cost on hours a commitment covered: freed commitment, not cash.
    #[serde(with = "rust_decimal::serde::str")]
    pub frees_commitment: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_saving: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_frees_commitment: Decimal,
}

/// Training that ran on on-demand capacity and could have run on spot: what its GPU-hours
/// actually cost and what the rate card's spot prices for the same instance types would have
/// saved. A run is not assumed to recur, so there is no monthly figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SpotCandidate {
    pub currency: String,
    pub experiment: String,
    pub gpus: Vec<String>,
    pub instance_types: Vec<String>,
    pub gpu_hours: f64,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub saving: Decimal,
}

/// GPUs of a host that did no work over the look-back: held idle (memory allocated at ~0% SM,
/// by a forgotten notebook or a stuck job), or idle with no process at all on a host where
/// nothing worked (a cluster nobody runs anything on): stop the processes or release the GPUs.
/// Moving them to cheaper or spot capacity would only make the waste cheaper.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Release {
    pub currency: String,
    pub gpus: Vec<String>,
    pub host: String,
    /// The owner labels of the processes holding them (none where no process ran).
    pub owners: BTreeMap<String, String>,
    pub action: String,
    /// What holding them idle cost over the look-back: all of it is saved, in cash
    /// (`saving`) or as freed commitment (`frees_commitment`).
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub saving: Decimal,
    /// Held on hours a commitment covered: releasing them frees commitment, not cash.
    #[serde(with = "rust_decimal::serde::str")]
    pub frees_commitment: Decimal,
    /// The saving as a month's worth: held all along, they would be held all month.
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_saving: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub monthly_frees_commitment: Decimal,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Recommendations {
    pub lookback_days: f64,
    pub right_size: Vec<RightSize>,
    pub consolidation: Vec<Consolidation>,
    pub spot: Vec<SpotCandidate>,
    pub release: Vec<Release>,
    /// The cash savings above added up over the look-back, one sum per currency (never across
    /// them): they cover separate GPUs.
    pub total_saving: Vec<CurrencyAmount>,
    /// The commitment they would free, added up the same way: not cash.
    pub total_frees_commitment: Vec<CurrencyAmount>,
}

/// An amount in one currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CurrencyAmount {
    /// ISO 4217.
    pub currency: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub amount: Decimal,
}

/// Cash and freed commitment together: a change's whole effect on its GPUs, what decides
/// which of two recommendations on the same GPU is kept and how each list is ordered.
macro_rules! whole_saving {
    ($($t:ty),*) => {$(
        impl $t {
            pub fn whole_saving(&self) -> Decimal {
                self.saving + self.frees_commitment
            }
        }
    )*};
}
whole_saving!(RightSize, Consolidation, Release);

impl Recommendations {
    /// The savings in `currency` added up; zero where none is in it.
    pub fn total_in(&self, currency: &str) -> Decimal {
        self.total_saving
            .iter()
            .filter(|t| t.currency == currency)
            .map(|t| t.amount)
            .sum()
    }

    /// The commitment freed in `currency` added up; zero where none is.
    pub fn frees_commitment_in(&self, currency: &str) -> Decimal {
        self.total_frees_commitment
            .iter()
            .filter(|t| t.currency == currency)
            .map(|t| t.amount)
            .sum()
    }

    /// Adds up the kept savings and freed commitment again, per currency (after some were
    /// filtered out).
    pub fn sum_savings(&mut self) {
        let mut cash: BTreeMap<&str, Decimal> = BTreeMap::new();
        let mut freed: BTreeMap<&str, Decimal> = BTreeMap::new();
        let savings = (self.right_size.iter())
            .map(|r| (&r.currency, r.saving, r.frees_commitment))
            .chain((self.consolidation.iter()).map(|r| (&r.currency, r.saving, r.frees_commitment)))
            .chain(
                self.spot
                    .iter()
                    .map(|r| (&r.currency, r.saving, Decimal::ZERO)),
            )
            .chain((self.release.iter()).map(|r| (&r.currency, r.saving, r.frees_commitment)));
        for (currency, saving, frees) in savings {
            *cash.entry(currency.as_str()).or_default() += saving;
            if !frees.is_zero() {
                *freed.entry(currency.as_str()).or_default() += frees;
            }
        }
        let amounts = |totals: BTreeMap<&str, Decimal>| {
            totals
                .into_iter()
                .map(|(currency, amount)| CurrencyAmount {
                    currency: currency.to_owned(),
                    amount,
                })
                .collect()
        };
        self.total_saving = amounts(cash);
        self.total_frees_commitment = amounts(freed);
    }
}

/// The 95th percentile of windows counted per band, as the top of its band (rounded up to the
/// next 5 points, so a smaller GPU is never chosen on a low reading); 0 with no windows.
fn p95_of_bands(bands: &[i64; BANDS]) -> f64 {
    let n: i64 = bands.iter().sum();
    let rank = ((n * 95 + 99) / 100).max(1);
    let mut seen = 0;
    for (band, count) in bands.iter().enumerate() {
        seen += count;
        if n > 0 && seen >= rank {
            return ((band + 1) as f64 * UTIL_BAND_POINTS).min(100.0);
        }
    }
    0.0
}

/// Scales a cost over `lookback_ms` to a 730-hour month (unrounded: round what is shown).
fn monthly(cost: Decimal, lookback_ms: i64) -> Decimal {
    cost * Decimal::from(HOURS_PER_MONTH * 3_600_000) / Decimal::from(lookback_ms.max(1))
}

/// What recommendations are drawn from: attributed cost (and GPU utilization) per GPU, owner,
/// kind and price over the look-back, and how each endpoint and model used its GPUs.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    pub parts: Vec<Part>,
    pub usage: Vec<UsageTotal>,
    /// MIG instances: never candidates for packing GPUs together.
    pub mig_instances: BTreeSet<String>,
    pub hostnames: HashMap<i64, String>,
    /// Each host's instance type, where the agent reported one (spot prices are per type).
    pub instance_types: HashMap<i64, String>,
    /// Which owner dimensions are the endpoint, the model and the experiment.
    pub owners: OwnerSchema,
}

/// The recommendations of each currency the evidence's costs are in, drawn apart: an endpoint
/// served from a dollar-billed and a euro-billed host has a saving in each, never one sum.
pub fn recommend(
    evidence: &Evidence,
    card: &RateCard,
    lookback_ms: i64,
    options: Options,
) -> Recommendations {
    let currencies: BTreeSet<&str> = evidence.parts.iter().map(|p| p.currency.as_str()).collect();
    let mut all = Recommendations {
        lookback_days: lookback_ms as f64 / crate::time::DAY_MS as f64,
        ..Recommendations::default()
    };
    let several = currencies.len() > 1;
    for currency in currencies {
        // One currency (the usual fleet): the evidence as it is, not a copy of it.
        let split;
        let one = if several {
            let parts: Vec<Part> = (evidence.parts.iter())
                .filter(|p| p.currency == currency)
                .cloned()
                .collect();
            let gpus: BTreeSet<&str> = parts.iter().filter_map(|p| p.gpu_uuid.as_deref()).collect();
            let usage = (evidence.usage.iter())
                .filter(|u| gpus.contains(u.gpu_uuid.as_str()))
                .cloned()
                .collect();
            split = Evidence {
                parts,
                usage,
                mig_instances: evidence.mig_instances.clone(),
                hostnames: evidence.hostnames.clone(),
                instance_types: evidence.instance_types.clone(),
                owners: evidence.owners.clone(),
            };
            &split
        } else {
            evidence
        };
        let mut r = recommend_in_one_currency(one, card, lookback_ms, options);
        let tag = |c: &mut String| *c = currency.to_owned();
        r.right_size.iter_mut().for_each(|x| tag(&mut x.currency));
        r.consolidation
            .iter_mut()
            .for_each(|x| tag(&mut x.currency));
        r.spot.iter_mut().for_each(|x| tag(&mut x.currency));
        r.release.iter_mut().for_each(|x| tag(&mut x.currency));
        all.right_size.extend(r.right_size);
        all.consolidation.extend(r.consolidation);
        all.spot.extend(r.spot);
        all.release.extend(r.release);
    }
    all.sum_savings();
    all
}

/// [`recommend`] over costs all in one currency (each item's `currency` left to the caller).
fn recommend_in_one_currency(
    evidence: &Evidence,
    card: &RateCard,
    lookback_ms: i64,
    options: Options,
) -> Recommendations {
    let tally = tally::tally(evidence, card);
    let right_size = right_size::right_size(&tally, card, options, lookback_ms);
    let worked = tally.hosts_that_worked();
    let release = release::release(&tally.gpus, &worked, evidence, lookback_ms);
    let context = (evidence, card);
    let consolidation = packing::consolidation(tally.gpus, &worked, context, options, lookback_ms);
    let spot = tally
        .training
        .into_iter()
        .filter(|(_, t)| t.saving > Decimal::ZERO)
        .map(|(experiment, t)| SpotCandidate {
            currency: String::new(),
            experiment: experiment.to_owned(),
            gpus: t.gpus.iter().map(|g| (*g).to_owned()).collect(),
            instance_types: t.instance_types.iter().map(|i| (*i).to_owned()).collect(),
            gpu_hours: (t.gpu_seconds / 36.0).round() / 100.0,
            cost: t.cost.round_dp(2),
            saving: t.saving.round_dp(2),
        })
        .collect();
    disjoint(Recommendations {
        lookback_days: lookback_ms as f64 / crate::time::DAY_MS as f64,
        right_size,
        consolidation,
        spot,
        release,
        total_saving: Vec::new(),
        total_frees_commitment: Vec::new(),
    })
}

/// The share of the on-demand price spot saves on an instance type, from the rate card; `None`
/// where the rate card has no spot price for it.
fn spot_discount(card: &RateCard, instance_type: &str) -> Option<Decimal> {
    let rate = card.instance_types.get(instance_type)?;
    let spot = rate.spot?;
    (!rate.on_demand.is_zero() && spot < rate.on_demand)
        .then(|| Decimal::ONE - spot / rate.on_demand)
}

/// Keeps, of recommendations that cover the same GPU, the one that saves most, in cash and
/// freed commitment together (ties: right-size before packing before spot before release, then
/// by name), so the total counts no GPU twice; each list is then ordered the same way.
fn disjoint(mut r: Recommendations) -> Recommendations {
    let mut candidates: Vec<(Decimal, u8, String, usize, &[String])> = Vec::new();
    for (i, x) in r.right_size.iter().enumerate() {
        // An endpoint before the model it serves: the endpoint is what one resizes.
        let rank = if x.by == "endpoint" { 0 } else { 1 };
        candidates.push((x.whole_saving(), rank, x.key.clone(), i, &x.gpus));
    }
    for (i, x) in r.consolidation.iter().enumerate() {
        candidates.push((x.whole_saving(), 2, x.host.clone(), i, &x.gpus));
    }
    for (i, x) in r.spot.iter().enumerate() {
        candidates.push((x.saving, 3, x.experiment.clone(), i, &x.gpus));
    }
    for (i, x) in r.release.iter().enumerate() {
        candidates.push((x.whole_saving(), 4, x.host.clone(), i, &x.gpus));
    }
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut taken: BTreeSet<&str> = BTreeSet::new();
    let mut keep: BTreeSet<(u8, usize)> = BTreeSet::new();
    for (saving, rank, _, i, gpus) in &candidates {
        if saving.is_zero() || gpus.iter().any(|g| taken.contains(g.as_str())) {
            continue;
        }
        taken.extend(gpus.iter().map(String::as_str));
        keep.insert((*rank, *i));
    }
    let kept = |rank: u8, i: usize| keep.contains(&(rank, i));
    r.right_size = std::mem::take(&mut r.right_size)
        .into_iter()
        .enumerate()
        .filter(|(i, x)| kept(if x.by == "endpoint" { 0 } else { 1 }, *i))
        .map(|(_, x)| x)
        .collect();
    r.consolidation = std::mem::take(&mut r.consolidation)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| kept(2, *i))
        .map(|(_, x)| x)
        .collect();
    r.spot = std::mem::take(&mut r.spot)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| kept(3, *i))
        .map(|(_, x)| x)
        .collect();
    r.release = std::mem::take(&mut r.release)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| kept(4, *i))
        .map(|(_, x)| x)
        .collect();
    r.release
        .sort_by(|a, b| (b.whole_saving().cmp(&a.whole_saving())).then(a.host.cmp(&b.host)));
    r.right_size
        .sort_by(|a, b| (b.whole_saving().cmp(&a.whole_saving())).then(a.key.cmp(&b.key)));
    r.consolidation
        .sort_by(|a, b| (b.whole_saving().cmp(&a.whole_saving())).then(a.gpus.cmp(&b.gpus)));
    r.spot.sort_by(|a, b| {
        b.saving
            .cmp(&a.saving)
            .then(a.experiment.cmp(&b.experiment))
    });
    r.sum_savings();
    r
}

mod packing;
mod release;
mod right_size;
mod smaller;
mod tally;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::util_band;

    #[test]
    fn p95_of_bands_is_the_top_of_the_band_holding_the_95th_percentile() {
        let mut bands = [0; BANDS];
        // 100 windows at 1..=100%: the 95th is 95% (band 19), read as its top, 100.
        for u in 1..=100 {
            bands[util_band(f64::from(u)) as usize] += 1;
        }
        assert_eq!(p95_of_bands(&bands), 100.0);
        let mut bands = [0; BANDS];
        bands[util_band(7.0) as usize] = 1;
        assert_eq!(p95_of_bands(&bands), 10.0);
        // 95 windows at 12%, 5 at 90%: the 95th window is still at 12%.
        let mut bands = [0; BANDS];
        bands[util_band(12.0) as usize] = 95;
        bands[util_band(90.0) as usize] = 5;
        assert_eq!(p95_of_bands(&bands), 15.0);
        bands[util_band(12.0) as usize] = 94;
        bands[util_band(90.0) as usize] = 6;
        assert_eq!(p95_of_bands(&bands), 95.0);
        assert_eq!(p95_of_bands(&[0; BANDS]), 0.0);
        assert_eq!(
            (util_band(-3.0), util_band(100.0), util_band(140.0)),
            (0, 20, 20)
        );
    }
}
