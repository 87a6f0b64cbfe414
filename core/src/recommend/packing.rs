//! Packing: whole GPUs busy less than the threshold, with work on them, packed together per
//! host (a GPU that only sat held idle is to release, not to pack); and a host whose working
//! GPUs are too busy to pack, beside GPUs that ran nothing, sized down where the rate card
//! allows.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::prelude::*;
use rust_decimal::Decimal;

use super::smaller::{smaller_instance, HostGpus, HostOn, IdleGpu};
use super::tally::Gpu;
use super::{monthly, Consolidation, Evidence, Options};
use crate::ratecard::RateCard;

/// GPUs of a host: each with its average utilization and what it cost and did.
type OnHost<'a> = Vec<(&'a str, f64, Gpu)>;

/// The GPUs of `gpus` sorted for packing: per host, those to pack and those that ran nothing
/// beside working ones (`worked`: hosts on which some GPU worked), and each host's whole GPUs.
struct Sorted<'a> {
    packable: BTreeMap<i64, OnHost<'a>>,
    spare: BTreeMap<i64, OnHost<'a>>,
    hosts: BTreeMap<i64, HostGpus<'a>>,
}

pub(super) fn consolidation(
    gpus: BTreeMap<&str, Gpu>,
    worked: &BTreeSet<i64>,
    (evidence, card): (&Evidence, &RateCard),
    options: Options,
    lookback_ms: i64,
) -> Vec<Consolidation> {
    // One recommendation per host: eight GPUs of a host each a few percent busy are one move,
    // not eight. GPUs of such a host that ran nothing at all go with them: packing its work
    // onto fewer GPUs releases those first.
    let Sorted {
        mut packable,
        mut spare,
        hosts,
    } = sorted(gpus, worked, evidence, options);
    for (host_id, on_host) in packable.iter_mut() {
        on_host.extend(spare.remove(host_id).unwrap_or_default());
    }
    let mut consolidation: Vec<Consolidation> = packable
        .into_iter()
        .map(|(host_id, on_host)| pack(host_id, &on_host, evidence, options, lookback_ms))
        .collect();
    // Hosts whose working GPUs are too busy to pack, beside GPUs that ran nothing: the
    // instance is too big for its work.
    for (host_id, idle) in spare {
        let Some(host) = hosts.get(&host_id).filter(|h| !h.mig) else {
            continue;
        };
        let on = HostOn {
            hostname: evidence
                .hostnames
                .get(&host_id)
                .cloned()
                .unwrap_or_default(),
            instance_type: evidence.instance_types.get(&host_id).map(String::as_str),
        };
        let idle: Vec<IdleGpu> = idle
            .iter()
            .map(|(gpu, _, u)| IdleGpu {
                gpu,
                cost: u.idle_cost,
                committed_cost: u.committed_idle_cost,
            })
            .collect();
        consolidation.push(smaller_instance(&on, host, &idle, card, lookback_ms));
    }
    consolidation
}

fn sorted<'a>(
    gpus: BTreeMap<&'a str, Gpu>,
    worked: &BTreeSet<i64>,
    evidence: &Evidence,
    options: Options,
) -> Sorted<'a> {
    let mut packable: BTreeMap<i64, Vec<(&str, f64, Gpu)>> = BTreeMap::new();
    let mut spare: BTreeMap<i64, Vec<(&str, f64, Gpu)>> = BTreeMap::new();
    let mut hosts: BTreeMap<i64, HostGpus> = BTreeMap::new();
    for (g, u) in gpus {
        let host = hosts.entry(u.host_id).or_default();
        if evidence.mig_instances.contains(g) {
            host.mig = true;
            continue;
        }
        host.gpus.push(g);
        host.busy += usize::from(u.used_seconds > 0.0);
        host.cost += u.cost;
        host.committed_cost += u.committed_cost;
        host.util_gpu_seconds += u.util_gpu_seconds;
        host.util_known_seconds += u.util_known_seconds;
        if !u.in_use && u.used_seconds == 0.0 && u.idle_cost > Decimal::ZERO {
            if worked.contains(&u.host_id) {
                spare.entry(u.host_id).or_default().push((g, 0.0, u));
            }
            continue;
        }
        if !(u.in_use && u.used_seconds > 0.0 && u.util_known_seconds > 0.0) {
            continue;
        }
        let avg = u.util_gpu_seconds / u.util_known_seconds;
        if avg < options.consolidation_below {
            packable.entry(u.host_id).or_default().push((g, avg, u));
        }
    }
    Sorted {
        packable,
        spare,
        hosts,
    }
}

/// One host's GPUs packed onto as few as their work needs at the target utilization: what that
/// saves in cash and frees of commitment.
fn pack(
    host_id: i64,
    on_host: &[(&str, f64, Gpu)],
    evidence: &Evidence,
    options: Options,
    lookback_ms: i64,
) -> Consolidation {
    let (mut cost, mut cash_saving, mut freed) = (Decimal::ZERO, Decimal::ZERO, Decimal::ZERO);
    let (mut util, mut known, mut needed) = (0.0, 0.0, 0.0);
    for (_, avg, u) in on_host {
        // The share of this GPU its work does not need at the target utilization.
        let need = (avg / options.target_util).clamp(0.0, 1.0);
        let spare = Decimal::from_f64(1.0 - need).unwrap_or_default();
        cost += u.cost;
        cash_saving += (u.cost - u.committed_cost) * spare;
        freed += u.committed_cost * spare;
        util += u.util_gpu_seconds;
        known += u.util_known_seconds;
        needed += need;
    }
    let avg = if known > 0.0 { util / known } else { 0.0 };
    let action = match on_host.len() {
        1 => format!(
            "move its work onto a GPU with room: it needs about {:.0}% of one kept \
             {:.0}% busy, then release this one",
            needed * 100.0,
            options.target_util
        ),
        n if needed < 1.0 => format!(
            "pack the work of its {n} GPUs onto one with room: together they need \
             about {:.0}% of one kept {:.0}% busy, then release them",
            needed * 100.0,
            options.target_util
        ),
        n => format!(
            "pack the work of its {n} GPUs together: they need about {needed:.1} GPUs \
             kept {:.0}% busy between them, then release the rest",
            options.target_util
        ),
    };
    Consolidation {
        currency: String::new(),
        gpus: on_host.iter().map(|(g, _, _)| (*g).to_owned()).collect(),
        action,
        host: evidence
            .hostnames
            .get(&host_id)
            .cloned()
            .unwrap_or_default(),
        avg_util: (avg * 10.0).round() / 10.0,
        cost: cost.round_dp(2),
        saving: cash_saving.round_dp(2),
        frees_commitment: freed.round_dp(2),
        monthly_cost: monthly(cost, lookback_ms).round_dp(2),
        monthly_saving: monthly(cash_saving, lookback_ms).round_dp(2),
        monthly_frees_commitment: monthly(freed, lookback_ms).round_dp(2),
    }
}
