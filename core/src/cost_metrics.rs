//! The ledger as Prometheus gauges: what each cluster and owner cost this month and in the
//! latest hour the ledger holds, by state (used, held idle, idle, unwatched), what each GPU cost
//! that hour, and how many GPUs sat in each state. Pure: the server loads the ledger, narrows it
//! to the reader's teams and renders these.
//!
//! Series are bounded: owners beyond the largest `max_series` (by month-to-date cost) fold
//! into one `(other)` series per cluster, state and currency, so every dollar is still counted
//! once and the sum of the series is the ledger's total on GPU hosts.

use std::collections::BTreeMap;

use rust_decimal::Decimal;

use crate::attribution::{Attribution, Kind, Part};
use crate::time::HOUR_MS;

/// The label value an owner folded into the remainder gets under every dimension.
pub const OTHER: &str = "(other)";

/// One cluster × owner × state × currency.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OwnerLabels {
    pub cluster: String,
    /// One value per configured dimension, in order; empty where the owner names none.
    pub values: Vec<String>,
    pub state: Kind,
    pub currency: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OwnerCost {
    pub labels: OwnerLabels,
    pub month_to_date: Decimal,
    /// Its cost in the latest hour the ledger holds (zero if it had none then).
    pub last_hour: Decimal,
}

/// What one GPU (or MIG instance) cost in the latest hour, with dcgm-exporter's labels.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuCost {
    pub uuid: String,
    pub hostname: String,
    pub cluster: String,
    pub currency: String,
    pub last_hour: Decimal,
}

/// GPUs in one state over the latest hour, as GPU-seconds / 3600 (a GPU idle half the hour
/// counts 0.5).
#[derive(Debug, Clone, PartialEq)]
pub struct GpusInState {
    pub cluster: String,
    /// The owner's team ("" where none is named).
    pub team: String,
    pub state: Kind,
    pub gpus: f64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct CostGauges {
    pub owners: Vec<OwnerCost>,
    pub gpus: Vec<GpuCost>,
    pub gpu_states: Vec<GpusInState>,
    /// Bill lines this month on no GPU host, per currency: counted in the bill, owned by none.
    pub outside_gpu_hosts: BTreeMap<String, Decimal>,
    /// The start of the latest hour the ledger holds, if it holds one in `recent`.
    pub last_hour_ms: Option<i64>,
}

/// What to expose: the owner dimensions that become labels, and how many owner series at most.
#[derive(Debug, Clone)]
pub struct Shape<'a> {
    pub dimensions: &'a [String],
    pub team_dimension: Option<&'a str>,
    pub max_series: usize,
}

/// The latest hour `recent` holds: "now" for the gauges. Taken from the whole ledger, before
/// it is narrowed to a reader's teams, so that a team idle of late reads 0 for the hour rather
/// than an older hour of its own.
pub fn latest_hour(recent: &Attribution) -> Option<i64> {
    recent.parts.iter().map(|p| p.hour_ms).max()
}

/// The gauges of `month` (the month so far) and of the hour `last_hour_ms` in `recent` (the
/// last few complete hours at hourly grain).
pub fn gauges(
    month: &Attribution,
    (recent, last_hour_ms): (&Attribution, Option<i64>),
    shape: &Shape,
) -> CostGauges {
    let in_last_hour = |p: &&Part| Some(p.hour_ms) == last_hour_ms;

    let cluster_of = |a: &Attribution, p: &Part| {
        a.hosts
            .get(&p.host_id)
            .map_or_else(String::new, |h| h.cluster.clone())
    };
    let labels_of = |a: &Attribution, p: &Part| OwnerLabels {
        cluster: cluster_of(a, p),
        values: shape
            .dimensions
            .iter()
            .map(|d| p.owner.get(d).unwrap_or_default().to_owned())
            .collect(),
        state: p.kind,
        currency: p.currency.clone(),
    };

    let mut owners: BTreeMap<OwnerLabels, (Decimal, Decimal)> = BTreeMap::new();
    for p in &month.parts {
        owners.entry(labels_of(month, p)).or_default().0 += p.cost;
    }
    for p in recent.parts.iter().filter(in_last_hour) {
        owners.entry(labels_of(recent, p)).or_default().1 += p.cost;
    }

    let mut gpus: BTreeMap<(String, String, String, String), Decimal> = BTreeMap::new();
    let mut states: BTreeMap<(String, String, Kind), f64> = BTreeMap::new();
    for p in recent.parts.iter().filter(in_last_hour) {
        let host = recent.hosts.get(&p.host_id);
        let cluster = cluster_of(recent, p);
        if let Some(uuid) = &p.gpu_uuid {
            let hostname = host.map_or_else(String::new, |h| h.hostname.clone());
            *gpus
                .entry((uuid.clone(), hostname, cluster.clone(), p.currency.clone()))
                .or_default() += p.cost;
        }
        let team = shape
            .team_dimension
            .and_then(|t| p.owner.get(t))
            .unwrap_or_default()
            .to_owned();
        *states.entry((cluster, team, p.kind)).or_default() +=
            p.gpu_seconds / (HOUR_MS as f64 / 1000.0);
    }

    CostGauges {
        owners: bounded(owners, shape),
        gpus: gpus
            .into_iter()
            .map(|((uuid, hostname, cluster, currency), last_hour)| GpuCost {
                uuid,
                hostname,
                cluster,
                currency,
                last_hour,
            })
            .collect(),
        gpu_states: states
            .into_iter()
            .map(|((cluster, team, state), gpus)| GpusInState {
                cluster,
                team,
                state,
                gpus,
            })
            .collect(),
        outside_gpu_hosts: month.unattributed.clone(),
        last_hour_ms,
    }
}

/// The largest `max_series` owner series as they are, the rest summed per cluster, state and
/// currency under [`OTHER`].
fn bounded(owners: BTreeMap<OwnerLabels, (Decimal, Decimal)>, shape: &Shape) -> Vec<OwnerCost> {
    let mut all: Vec<(OwnerLabels, (Decimal, Decimal))> = owners.into_iter().collect();
    if all.len() > shape.max_series {
        // Largest month first, then the latest hour; ties by labels, so the same ledger always
        // keeps the same series.
        all.sort_by(|(la, (ma, ha)), (lb, (mb, hb))| {
            mb.abs()
                .cmp(&ma.abs())
                .then_with(|| hb.abs().cmp(&ha.abs()))
                .then_with(|| la.cmp(lb))
        });
        // Leave room for the remainder series among the bound.
        let clusters_states: usize = {
            let mut seen: Vec<(&str, Kind, &str)> = all
                .iter()
                .map(|(l, _)| (l.cluster.as_str(), l.state, l.currency.as_str()))
                .collect();
            seen.sort();
            seen.dedup();
            seen.len()
        };
        let keep = shape.max_series.saturating_sub(clusters_states);
        let rest = all.split_off(keep.min(all.len()));
        let mut folded: BTreeMap<OwnerLabels, (Decimal, Decimal)> = BTreeMap::new();
        for (l, (m, h)) in rest {
            let key = OwnerLabels {
                values: vec![OTHER.to_owned(); l.values.len()],
                ..l
            };
            let e = folded.entry(key).or_default();
            e.0 += m;
            e.1 += h;
        }
        all.extend(folded);
        all.sort_by(|(a, _), (b, _)| a.cmp(b));
    }
    all.into_iter()
        .map(|(labels, (month_to_date, last_hour))| OwnerCost {
            labels,
            month_to_date,
            last_hour,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owners::Owner;
    use crate::telemetry::HostRow;
    use std::collections::HashMap;

    fn host(id: i64, cluster: &str, hostname: &str) -> (i64, HostRow) {
        (
            id,
            HostRow {
                id,
                cluster: cluster.into(),
                hostname: hostname.into(),
                ..HostRow::default()
            },
        )
    }

    fn part(hour: i64, host_id: i64, gpu: &str, team: &str, kind: Kind, cost: i64) -> Part {
        let owner = if team.is_empty() {
            Owner::default()
        } else {
            Owner::from_key(&format!(r#"{{"model":"m-{team}","team":"{team}"}}"#))
        };
        Part {
            hour_ms: hour * HOUR_MS,
            host_id,
            gpu_uuid: Some(gpu.into()),
            owner,
            kind,
            pricing_category: "OnDemand".into(),
            currency: "USD".into(),
            cost: Decimal::new(cost, 2),
            estimated: false,
            gpu_seconds: 1800.0,
            util_gpu_seconds: 0.0,
            util_known_seconds: 0.0,
            energy_j: 0.0,
            energy_known_seconds: 0.0,
        }
    }

    fn ledger(parts: Vec<Part>) -> Attribution {
        Attribution {
            parts,
            unattributed: BTreeMap::from([("USD".to_owned(), Decimal::new(700, 2))]),
            unattributed_hours: BTreeMap::new(),
            hosts: HashMap::from([host(1, "train", "a1"), host(2, "serve", "b1")]),
        }
    }

    fn dims() -> Vec<String> {
        vec!["team".to_owned()]
    }

    #[test]
    fn month_and_last_hour_per_owner_and_state() {
        let month = ledger(vec![
            part(0, 1, "GPU-1", "alpha", Kind::Used, 1000),
            part(1, 1, "GPU-1", "alpha", Kind::Used, 500),
            part(1, 1, "GPU-2", "", Kind::Idle, 300),
            part(1, 2, "GPU-3", "bravo", Kind::HeldIdle, 200),
        ]);
        let recent = ledger(month.parts[1..].to_vec());
        let d = dims();
        let g = gauges(
            &month,
            (&recent, latest_hour(&recent)),
            &Shape {
                dimensions: &d,
                team_dimension: Some("team"),
                max_series: 100,
            },
        );
        assert_eq!(g.last_hour_ms, Some(HOUR_MS));
        let alpha = g
            .owners
            .iter()
            .find(|o| o.labels.values == ["alpha"])
            .unwrap();
        assert_eq!(alpha.labels.cluster, "train");
        assert_eq!(alpha.month_to_date, Decimal::new(1500, 2));
        assert_eq!(alpha.last_hour, Decimal::new(500, 2));
        let idle = g
            .owners
            .iter()
            .find(|o| o.labels.state == Kind::Idle)
            .unwrap();
        assert_eq!(idle.labels.values, [""]);
        assert_eq!(g.owners.len(), 3);
        // Every dollar once: the series add up to the ledger on GPU hosts.
        let sum: Decimal = g.owners.iter().map(|o| o.month_to_date).sum();
        assert_eq!(sum, Decimal::new(2000, 2));
        assert_eq!(g.outside_gpu_hosts["USD"], Decimal::new(700, 2));
        // GPUs in the last hour, with their host names, and GPU-equivalents per state.
        assert_eq!(g.gpus.len(), 3);
        assert!(g
            .gpus
            .iter()
            .any(|x| x.uuid == "GPU-3" && x.hostname == "b1" && x.cluster == "serve"));
        let held = g
            .gpu_states
            .iter()
            .find(|s| s.state == Kind::HeldIdle)
            .unwrap();
        assert_eq!((held.team.as_str(), held.gpus), ("bravo", 0.5));
    }

    #[test]
    fn a_team_without_work_in_the_latest_hour_reads_nothing_for_it() {
        let recent = ledger(vec![
            part(1, 1, "GPU-1", "alpha", Kind::Used, 500),
            part(2, 2, "GPU-3", "bravo", Kind::Used, 200),
        ]);
        let latest = latest_hour(&recent);
        // Alpha's view of the ledger: its own hour 1 only.
        let alpha = ledger(vec![recent.parts[0].clone()]);
        let d = dims();
        let g = gauges(
            &alpha,
            (&alpha, latest),
            &Shape {
                dimensions: &d,
                team_dimension: Some("team"),
                max_series: 100,
            },
        );
        assert_eq!(g.last_hour_ms, Some(2 * HOUR_MS));
        assert!(g.owners.iter().all(|o| o.last_hour.is_zero()));
        assert!(g.gpus.is_empty() && g.gpu_states.is_empty());
        assert_eq!(g.owners[0].month_to_date, Decimal::new(500, 2));
    }

    #[test]
    fn owners_beyond_the_bound_fold_into_other_and_still_add_up() {
        let parts: Vec<Part> = (0..20)
            .map(|i| part(0, 1, "GPU-1", &format!("t{i:02}"), Kind::Used, 100 + i))
            .collect();
        let month = ledger(parts);
        let d = dims();
        let g = gauges(
            &month,
            (&month, latest_hour(&month)),
            &Shape {
                dimensions: &d,
                team_dimension: Some("team"),
                max_series: 5,
            },
        );
        assert_eq!(g.owners.len(), 5);
        // The four largest stay; the sixteen others are one series.
        assert!(g.owners.iter().any(|o| o.labels.values == ["t19"]));
        assert!(!g.owners.iter().any(|o| o.labels.values == ["t00"]));
        let other = g
            .owners
            .iter()
            .find(|o| o.labels.values == [OTHER])
            .unwrap();
        let expected: i64 = (0..16).map(|i| 100 + i).sum();
        assert_eq!(other.month_to_date, Decimal::new(expected, 2));
        let sum: Decimal = g.owners.iter().map(|o| o.month_to_date).sum();
        let all: Decimal = month.parts.iter().map(|p| p.cost).sum();
        assert_eq!(sum, all);
        assert_eq!(sum, g.owners.iter().map(|o| o.last_hour).sum());
    }

    #[test]
    fn an_empty_ledger_has_no_series_and_no_hour() {
        let empty = Attribution {
            parts: Vec::new(),
            unattributed: BTreeMap::new(),
            unattributed_hours: BTreeMap::new(),
            hosts: HashMap::new(),
        };
        let d = dims();
        let g = gauges(
            &empty,
            (&empty, latest_hour(&empty)),
            &Shape {
                dimensions: &d,
                team_dimension: None,
                max_series: 10,
            },
        );
        assert_eq!(g, CostGauges::default());
    }
}
