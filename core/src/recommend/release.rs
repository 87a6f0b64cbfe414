//! Releases: GPUs that did no work, held idle by a process or with none at all, per host. The
//! biggest waste is often a whole cluster nobody runs anything on.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;

use super::tally::Gpu;
use super::{monthly, Evidence, Release};

/// A host's GPUs to release, what they cost (of it, on committed hours), whether a process
/// holds them, and whose processes those are.
#[derive(Default)]
struct Held {
    gpus: Vec<String>,
    cost: Decimal,
    committed: Decimal,
    held: bool,
    owners: BTreeMap<String, BTreeSet<String>>,
}

/// The GPUs to release of `gpus`, one recommendation per host. On a host where some GPU worked
/// (`worked`), idle GPUs with no process are not released one by one (a cloud instance goes
/// whole, and a MIG GPU's free slices sit beside working ones); packing and right-sizing speak
/// for them. A GPU a process holds idle is released anywhere, by stopping the process.
pub(super) fn release(
    gpus: &BTreeMap<&str, Gpu>,
    worked: &BTreeSet<i64>,
    evidence: &Evidence,
    lookback_ms: i64,
) -> Vec<Release> {
    let mut release_by_host: BTreeMap<i64, Held> = BTreeMap::new();
    for (g, u) in gpus {
        let (idle, committed_idle) = if worked.contains(&u.host_id) {
            (Decimal::ZERO, Decimal::ZERO)
        } else {
            (u.idle_cost, u.committed_idle_cost)
        };
        let unused = u.held_cost + idle;
        if u.used_seconds == 0.0 && unused > Decimal::ZERO {
            let e = release_by_host.entry(u.host_id).or_default();
            e.gpus.push((*g).to_owned());
            e.cost += unused;
            e.committed += u.committed_held_cost + committed_idle;
            e.held |= u.held_cost > Decimal::ZERO;
            for (k, v) in &u.held_owners {
                e.owners
                    .entry(k.clone())
                    .or_default()
                    .extend(v.iter().cloned());
            }
        }
    }
    release_by_host
        .into_iter()
        .map(
            |(
                host_id,
                Held {
                    gpus,
                    cost,
                    committed,
                    held,
                    owners,
                },
            )| Release {
                currency: String::new(),
                action: {
                    let them = if gpus.len() == 1 {
                        "GPU".to_owned()
                    } else {
                        format!("{} GPUs", gpus.len())
                    };
                    if held {
                        format!(
                            "stop the idle processes or release the {them}: they hold memory \
                             at ~0% and did no work"
                        )
                    } else {
                        format!("release the {them}: no process ran on them")
                    }
                },
                gpus,
                host: evidence
                    .hostnames
                    .get(&host_id)
                    .cloned()
                    .unwrap_or_default(),
                owners: owners
                    .into_iter()
                    .map(|(k, v)| (k, v.into_iter().collect::<Vec<_>>().join(", ")))
                    .collect(),
                cost: cost.round_dp(2),
                saving: (cost - committed).round_dp(2),
                frees_commitment: committed.round_dp(2),
                monthly_saving: monthly(cost - committed, lookback_ms).round_dp(2),
                monthly_frees_commitment: monthly(committed, lookback_ms).round_dp(2),
            },
        )
        .collect()
}
