//! What the evidence says, summed once for every kind of advice: each endpoint's and model's
//! memory and utilization per GPU model, what each owner's GPUs cost, each GPU's cost, time and
//! idleness, and the training that could run on spot.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rust_decimal::Decimal;

use super::{spot_discount, Evidence, COMMITTED};
use crate::activity::BANDS;
use crate::attribution::{Kind, Part};
use crate::owners::Role;
use crate::ratecard::RateCard;

/// A GPU model: its name and memory.
pub(super) type GpuModel<'a> = (&'a str, Option<i64>);

/// How an endpoint or a model used the GPUs of one model: peak process memory, windows per
/// utilization band, the GPUs.
#[derive(Default)]
pub(super) struct Usage<'a> {
    pub(super) peak_bytes: i64,
    pub(super) bands: [i64; BANDS],
    pub(super) gpus: BTreeSet<&'a str>,
}

/// An experiment's on-demand work on instance types with a spot price.
#[derive(Default)]
pub(super) struct Training<'a> {
    pub(super) cost: Decimal,
    pub(super) saving: Decimal,
    pub(super) gpu_seconds: f64,
    pub(super) gpus: BTreeSet<&'a str>,
    pub(super) instance_types: BTreeSet<&'a str>,
}

/// One GPU over the look-back.
#[derive(Default)]
pub(super) struct Gpu {
    pub(super) cost: Decimal,
    pub(super) util_gpu_seconds: f64,
    pub(super) util_known_seconds: f64,
    pub(super) host_id: i64,
    pub(super) in_use: bool,
    /// Of `cost`, on hours a commitment covered.
    pub(super) committed_cost: Decimal,
    /// Cost while held idle or idle with no process (and of it, on committed hours), and GPU
    /// time doing work.
    pub(super) held_cost: Decimal,
    pub(super) idle_cost: Decimal,
    pub(super) committed_held_cost: Decimal,
    pub(super) committed_idle_cost: Decimal,
    pub(super) used_seconds: f64,
    pub(super) held_owners: BTreeMap<String, BTreeSet<String>>,
}

/// Per endpoint or model and GPU: (cost, of it on hours a commitment covered).
pub(super) type OwnerGpuCost<'a> = HashMap<(&'a str, &'a str, &'a str), (Decimal, Decimal)>;

pub(super) struct Tally<'a> {
    /// Per endpoint and per model, on each GPU model it ran on. Each GPU model is sized
    /// apart: a day's load test on other GPUs neither moves the p95 of the fleet it serves
    /// from nor joins its recommendation (and so leaves those GPUs to the advice that fits
    /// them, a release say).
    pub(super) usage: BTreeMap<(&'static str, &'a str, GpuModel<'a>), Usage<'a>>,
    /// What each endpoint and model cost on each GPU, from the attribution (the bill, exactly).
    pub(super) cost: OwnerGpuCost<'a>,
    pub(super) training: BTreeMap<&'a str, Training<'a>>,
    pub(super) gpus: BTreeMap<&'a str, Gpu>,
}

impl Tally<'_> {
    /// Hosts on which some GPU (or MIG instance) worked.
    pub(super) fn hosts_that_worked(&self) -> BTreeSet<i64> {
        (self.gpus.values())
            .filter(|u| u.used_seconds > 0.0)
            .map(|u| u.host_id)
            .collect()
    }
}

pub(super) fn tally<'a>(evidence: &'a Evidence, card: &RateCard) -> Tally<'a> {
    let mut t = Tally {
        usage: usage(evidence),
        cost: HashMap::new(),
        training: BTreeMap::new(),
        gpus: BTreeMap::new(),
    };
    let schema = &evidence.owners;
    let endpoint_dimension = schema.role(Role::Endpoint);
    for part in &evidence.parts {
        if let Some(g) = &part.gpu_uuid {
            add_to_gpu(t.gpus.entry(g).or_default(), part, endpoint_dimension);
        }
        if part.kind != Kind::Used && part.kind != Kind::HeldIdle {
            continue;
        }
        let endpoint = schema.value(&part.owner, Role::Endpoint);
        let committed = if part.pricing_category == COMMITTED {
            part.cost
        } else {
            Decimal::ZERO
        };
        if let Some(g) = part.gpu_uuid.as_deref() {
            let owners = [
                ("endpoint", endpoint),
                ("model", schema.value(&part.owner, Role::Model)),
            ];
            for (by, key) in owners {
                if let Some(key) = key {
                    let c = t.cost.entry((by, key, g)).or_default();
                    c.0 += part.cost;
                    c.1 += committed;
                }
            }
        }
        add_to_training(&mut t.training, part, (evidence, card), endpoint);
    }
    t
}

/// Per endpoint and per model, on each GPU model it ran on: peak process memory, windows per
/// utilization band, GPUs.
fn usage(evidence: &Evidence) -> BTreeMap<(&'static str, &str, GpuModel<'_>), Usage<'_>> {
    let mut usage: BTreeMap<(&'static str, &str, GpuModel), Usage> = BTreeMap::new();
    for u in &evidence.usage {
        let by = match u.owner_by.as_str() {
            "endpoint" => "endpoint",
            "model" => "model",
            _ => continue,
        };
        let model = (u.gpu_name.as_deref().unwrap_or(""), u.memory_total_bytes);
        let e = usage.entry((by, u.owner_key.as_str(), model)).or_default();
        e.peak_bytes = e.peak_bytes.max(u.peak_memory_bytes);
        if let Ok(band) = usize::try_from(u.util_band) {
            e.bands[band.min(BANDS - 1)] += u.windows;
        }
        e.gpus.insert(&u.gpu_uuid);
    }
    usage
}

/// A part's cost, time and idleness, on its GPU (`endpoint_dimension`: the schema's endpoint
/// dimension, whose value is not who to ask to release a held GPU).
fn add_to_gpu(e: &mut Gpu, part: &Part, endpoint_dimension: Option<&str>) {
    let committed = part.pricing_category == COMMITTED;
    e.cost += part.cost;
    if committed {
        e.committed_cost += part.cost;
    }
    e.util_gpu_seconds += part.util_gpu_seconds;
    e.util_known_seconds += part.util_known_seconds;
    e.host_id = part.host_id;
    e.in_use |= matches!(part.kind, Kind::Used | Kind::HeldIdle);
    match part.kind {
        Kind::Used => e.used_seconds += part.gpu_seconds,
        Kind::Idle => {
            e.idle_cost += part.cost;
            if committed {
                e.committed_idle_cost += part.cost;
            }
        }
        Kind::HeldIdle => {
            e.held_cost += part.cost;
            if committed {
                e.committed_held_cost += part.cost;
            }
            // Who to ask to release it: every owner value but the endpoint's.
            for (k, v) in part
                .owner
                .iter()
                .filter(|(k, _)| Some(*k) != endpoint_dimension)
            {
                e.held_owners
                    .entry(k.to_owned())
                    .or_default()
                    .insert(v.to_owned());
            }
        }
        _ => {}
    }
}

/// Training on spot: an experiment that serves no endpoint, working (held-idle GPUs are to be
/// released, not moved), on on-demand capacity (committed capacity is paid for either way), on
/// an instance type the rate card has a spot price for.
fn add_to_training<'a>(
    training: &mut BTreeMap<&'a str, Training<'a>>,
    part: &'a Part,
    (evidence, card): (&'a Evidence, &RateCard),
    endpoint: Option<&str>,
) {
    let (Some(experiment), None, Kind::Used) = (
        evidence.owners.value(&part.owner, Role::Experiment),
        endpoint,
        part.kind,
    ) else {
        return;
    };
    if part.pricing_category != "on_demand" {
        return;
    }
    let Some((instance_type, discount)) = evidence
        .instance_types
        .get(&part.host_id)
        .and_then(|t| Some((t.as_str(), spot_discount(card, t)?)))
    else {
        return;
    };
    let t = training.entry(experiment).or_default();
    t.cost += part.cost;
    t.saving += part.cost * discount;
    t.gpu_seconds += part.gpu_seconds;
    t.instance_types.insert(instance_type);
    if let Some(g) = &part.gpu_uuid {
        t.gpus.insert(g);
    }
}
