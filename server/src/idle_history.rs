//! Idle history from the ledger: for any range, months long past included, each run of
//! consecutive hours in which a host carried idle (or held-idle) cost, with its GPUs, owners
//! and dollars. Live incidents are found minute by minute from raw windows, which go once a
//! month closes; these come from the hourly attribution itself, so the dollars of a month's
//! episodes add up exactly to the month's idle and held-idle dollars, and they exist for any
//! month the ledger holds.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;
use serde::Serialize;

use crate::attribution::{Attribution, Kind};
use gpuledger_core::time::HOUR_MS;

/// One host idle (or held idle) for a run of consecutive hours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdleEpisode {
    pub cluster: String,
    pub hostname: String,
    /// `idle` or `held_idle`.
    pub kind: &'static str,
    /// The first hour's start and the last hour's end.
    pub start_ms: i64,
    pub end_ms: i64,
    pub hours: i64,
    /// The GPUs (or MIG instances) that carried the cost.
    pub gpus: Vec<String>,
    /// Owner labels of held-idle work, each value once.
    pub owners: BTreeMap<String, Vec<String>>,
    pub currency: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    /// Part of it priced from the rate card (no bill for those hours yet).
    pub estimated: bool,
}

#[derive(Default)]
struct Hour {
    cost: Decimal,
    gpus: BTreeSet<String>,
    owners: BTreeMap<String, BTreeSet<String>>,
    estimated: bool,
}

/// The episodes of `a` (hourly parts), costliest first.
pub fn episodes(a: &Attribution) -> Vec<IdleEpisode> {
    // (host, kind, currency) -> hour -> what it carried.
    let mut by_host: BTreeMap<(i64, Kind, String), BTreeMap<i64, Hour>> = BTreeMap::new();
    for p in &a.parts {
        if !matches!(p.kind, Kind::Idle | Kind::HeldIdle) {
            continue;
        }
        let h = by_host
            .entry((p.host_id, p.kind, p.currency.clone()))
            .or_default()
            .entry(p.hour_ms)
            .or_default();
        h.cost += p.cost;
        h.estimated |= p.estimated;
        if let Some(g) = &p.gpu_uuid {
            h.gpus.insert(g.clone());
        }
        for (k, v) in p.owner.iter() {
            h.owners
                .entry(k.to_owned())
                .or_default()
                .insert(v.to_owned());
        }
    }
    let mut out = Vec::new();
    for ((host_id, kind, currency), hours) in by_host {
        let (cluster, hostname) = a.hosts.get(&host_id).map_or_else(
            || (String::new(), format!("host {host_id}")),
            |h| (h.cluster.clone(), h.hostname.clone()),
        );
        let mut run: Option<(i64, i64, Hour)> = None;
        let flush = |run: Option<(i64, i64, Hour)>, out: &mut Vec<IdleEpisode>| {
            if let Some((start, end, h)) = run {
                out.push(IdleEpisode {
                    cluster: cluster.clone(),
                    hostname: hostname.clone(),
                    kind: kind.as_str(),
                    start_ms: start,
                    end_ms: end,
                    hours: (end - start) / HOUR_MS,
                    gpus: h.gpus.into_iter().collect(),
                    owners: h
                        .owners
                        .into_iter()
                        .map(|(k, v)| (k, v.into_iter().collect()))
                        .collect(),
                    currency: currency.clone(),
                    cost: h.cost,
                    estimated: h.estimated,
                });
            }
        };
        for (hour, h) in hours {
            run = match run {
                Some((start, end, mut acc)) if end == hour => {
                    acc.cost += h.cost;
                    acc.estimated |= h.estimated;
                    acc.gpus.extend(h.gpus);
                    for (k, v) in h.owners {
                        acc.owners.entry(k).or_default().extend(v);
                    }
                    Some((start, hour + HOUR_MS, acc))
                }
                previous => {
                    flush(previous, &mut out);
                    Some((hour, hour + HOUR_MS, h))
                }
            };
        }
        flush(run, &mut out);
    }
    out.sort_by(|a, b| {
        b.cost
            .cmp(&a.cost)
            .then(a.start_ms.cmp(&b.start_ms))
            .then(a.hostname.cmp(&b.hostname))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::Part;
    use crate::store::HostRow;

    fn part(host_id: i64, hour: i64, kind: Kind, cost: i64, team: Option<&str>) -> Part {
        Part {
            hour_ms: hour * HOUR_MS,
            host_id,
            gpu_uuid: Some(format!("GPU-{host_id}")),
            owner: team.map(|t| ("team", t)).into_iter().collect(),
            kind,
            pricing_category: "on_demand".into(),
            currency: "USD".into(),
            cost: Decimal::from(cost),
            estimated: false,
            gpu_seconds: 3600.0,
            util_gpu_seconds: 0.0,
            util_known_seconds: 3600.0,
            energy_j: 0.0,
        }
    }

    #[test]
    fn consecutive_hours_make_one_episode_and_the_dollars_add_up() {
        let host = |id: i64| HostRow {
            id,
            cluster: "c".into(),
            hostname: format!("h{id}"),
            provider: None,
            instance_id: None,
            instance_key: None,
            instance_type: None,
            lifecycle: None,
        };
        let a = Attribution {
            parts: vec![
                part(1, 0, Kind::Idle, 3, None),
                part(1, 1, Kind::Idle, 3, None),
                part(1, 2, Kind::Used, 9, Some("a")),
                part(1, 3, Kind::Idle, 3, None),
                part(2, 0, Kind::HeldIdle, 5, Some("research")),
                part(2, 1, Kind::HeldIdle, 5, Some("research")),
                part(2, 1, Kind::Idle, 1, None),
            ],
            unattributed: Default::default(),
            unattributed_hours: Default::default(),
            hosts: [(1, host(1)), (2, host(2))].into(),
        };
        let e = episodes(&a);
        let summary: Vec<(&str, &str, i64, i64, Decimal)> = e
            .iter()
            .map(|x| {
                (
                    x.hostname.as_str(),
                    x.kind,
                    x.start_ms / HOUR_MS,
                    x.hours,
                    x.cost,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("h2", "held_idle", 0, 2, Decimal::from(10)),
                ("h1", "idle", 0, 2, Decimal::from(6)),
                ("h1", "idle", 3, 1, Decimal::from(3)),
                ("h2", "idle", 1, 1, Decimal::from(1)),
            ]
        );
        assert_eq!(e[0].owners["team"], ["research"]);
        let idle: Decimal = a
            .parts
            .iter()
            .filter(|p| matches!(p.kind, Kind::Idle | Kind::HeldIdle))
            .map(|p| p.cost)
            .sum();
        assert_eq!(e.iter().map(|x| x.cost).sum::<Decimal>(), idle);
    }
}
