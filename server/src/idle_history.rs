//! Idle history from the ledger: for any range, months long past included, each run of
//! consecutive hours in which a host carried idle (or held-idle) cost, with its GPUs, owners
//! and dollars. Live incidents are found minute by minute from raw windows, which go once a
//! month closes; these come from the hourly attribution itself, so the dollars of a month's
//! episodes add up exactly to the month's idle and held-idle dollars, and they exist for any
//! month the ledger holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::store::{self, Store, StoreError};
use gpuledger_core::attribution::Kind;
use gpuledger_core::attribution::Owner;
use gpuledger_core::money::from_nano_atto;
use gpuledger_core::telemetry::HostRow;
use gpuledger_core::time::HOUR_MS;

/// One host idle (or held idle) for a run of consecutive hours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct IdleEpisode {
    pub cluster: String,
    pub hostname: String,
    /// `idle` or `held_idle`.
    pub kind: String,
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
    /// Part of it estimated (no bill for those hours yet).
    pub estimated: bool,
}

/// Whether an idle run is the scope's teams', by the one rule every page follows for idle
/// money (the review's figures, its idle history, `/incidents`, the fleet): its cost is a
/// team's when the ledger gave it that team (the processes holding the GPUs, or for idle with
/// no process the cluster's or the bill's team). Idle time that names no team is the whole
/// fleet's, never a team's, even on a host one team used the day before.
pub fn in_scope(
    episode: &IdleEpisode,
    scope: &gpuledger_core::scope::Scope,
    schema: &gpuledger_core::owners::OwnerSchema,
) -> bool {
    if scope.is_all() {
        return true;
    }
    let teams = schema
        .role(gpuledger_core::owners::Role::Team)
        .and_then(|team| episode.owners.get(team));
    teams.is_some_and(|t| !t.is_empty() && t.iter().all(|t| scope.admits_team(t)))
}

/// What a page shows of a range's idle episodes, per currency: how many, their dollars and the
/// costliest. A closed month's review keeps this rather than every episode (a month of 10,000
/// GPUs has some 30,000).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub currencies: Vec<CurrencySummary>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrencySummary {
    pub currency: String,
    pub count: usize,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    /// The `top` costliest, costliest first.
    pub costliest: Vec<IdleEpisode>,
}

impl Summary {
    /// The summary of `episodes` (costliest first, as [`load`] gives them), keeping the `top`
    /// costliest of each currency.
    pub fn of(episodes: impl IntoIterator<Item = IdleEpisode>, top: usize) -> Self {
        let mut currencies: Vec<CurrencySummary> = Vec::new();
        for e in episodes {
            let at = match currencies.iter().position(|c| c.currency == e.currency) {
                Some(at) => at,
                None => {
                    currencies.push(CurrencySummary {
                        currency: e.currency.clone(),
                        count: 0,
                        cost: Decimal::ZERO,
                        costliest: Vec::new(),
                    });
                    currencies.len() - 1
                }
            };
            let c = &mut currencies[at];
            c.count += 1;
            c.cost += e.cost;
            if c.costliest.len() < top {
                c.costliest.push(e);
            }
        }
        Summary { currencies }
    }
}

#[derive(Default)]
struct Hour {
    cost: Decimal,
    gpus: BTreeSet<String>,
    owners: BTreeMap<String, BTreeSet<String>>,
    estimated: bool,
}

/// What a host carried in one hour for one owner, of one kind and currency: a ledger part (one
/// GPU) or the roll-up's sum over the host's GPUs.
struct HourFact {
    host_id: i64,
    kind: Kind,
    currency: String,
    hour_ms: i64,
    cost: Decimal,
    estimated: bool,
    gpus: Vec<String>,
    owner: Owner,
}

/// The episodes of `a` (hourly parts), costliest first: what [`load`] must equal, computed from
/// the ledger's parts themselves (the tests' reference).
#[cfg(test)]
pub fn episodes(a: &gpuledger_core::attribution::Attribution) -> Vec<IdleEpisode> {
    let facts = a
        .parts
        .iter()
        .filter(|p| matches!(p.kind, Kind::Idle | Kind::HeldIdle))
        .map(|p| HourFact {
            host_id: p.host_id,
            kind: p.kind,
            currency: p.currency.clone(),
            hour_ms: p.hour_ms,
            cost: p.cost,
            estimated: p.estimated,
            gpus: p.gpu_uuid.iter().cloned().collect(),
            owner: p.owner.clone(),
        });
    episodes_of(facts, &a.hosts)
}

/// The idle episodes of `[from_ms, to_ms)` (whole hours), costliest first, from the range's
/// hourly ledger summed per host and owner by the roll-up (a month of 1,000 GPUs is some
/// 170,000 idle GPU-hours, and some 21,000 host-hours).
pub async fn load(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<IdleEpisode>, StoreError> {
    let (rows, hosts) = tokio::try_join!(
        store::idle::idle_hours(store.db(), from_ms, to_ms),
        store::telemetry::hosts(store.db()),
    )?;
    let hosts: HashMap<i64, HostRow> = hosts.into_iter().map(|h| (h.id, h)).collect();
    let mut known: HashMap<String, Owner> = HashMap::new();
    let mut facts = Vec::with_capacity(rows.len());
    for r in rows {
        let Some(kind) = Kind::parse(&r.kind) else {
            continue;
        };
        let owner = known
            .entry(r.owner)
            .or_insert_with_key(|t| Owner::from_key(t))
            .clone();
        facts.push(HourFact {
            host_id: r.host_id,
            kind,
            currency: r.currency,
            hour_ms: r.hour_ms,
            cost: from_nano_atto(r.cost_nano, r.cost_atto),
            estimated: r.estimated != 0,
            gpus: json_texts(&r.gpus)?
                .into_iter()
                .filter(|g| !g.is_empty())
                .collect(),
            owner,
        });
    }
    Ok(episodes_of(facts, &hosts))
}

/// A JSON array of texts, as the database gathered it.
fn json_texts(json: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(json)
        .map_err(|e| StoreError::Invalid(format!("idle hours' list {json:?}: {e}")))
}

fn episodes_of(
    facts: impl IntoIterator<Item = HourFact>,
    hosts: &HashMap<i64, HostRow>,
) -> Vec<IdleEpisode> {
    // (host, kind, currency) -> hour -> what it carried.
    let mut by_host: BTreeMap<(i64, Kind, String), BTreeMap<i64, Hour>> = BTreeMap::new();
    for f in facts {
        let h = by_host
            .entry((f.host_id, f.kind, f.currency))
            .or_default()
            .entry(f.hour_ms)
            .or_default();
        h.cost += f.cost;
        h.estimated |= f.estimated;
        h.gpus.extend(f.gpus);
        for (k, v) in f.owner.iter() {
            h.owners
                .entry(k.to_owned())
                .or_default()
                .insert(v.to_owned());
        }
    }
    let mut out = Vec::new();
    for ((host_id, kind, currency), hours) in by_host {
        let (cluster, hostname) = hosts.get(&host_id).map_or_else(
            || (String::new(), format!("host {host_id}")),
            |h| (h.cluster.clone(), h.hostname.clone()),
        );
        let mut run: Option<(i64, i64, Hour)> = None;
        let flush = |run: Option<(i64, i64, Hour)>, out: &mut Vec<IdleEpisode>| {
            if let Some((start, end, h)) = run {
                out.push(IdleEpisode {
                    cluster: cluster.clone(),
                    hostname: hostname.clone(),
                    kind: kind.as_str().to_owned(),
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
    use gpuledger_core::attribution::Attribution;
    use gpuledger_core::attribution::Part;
    use gpuledger_core::telemetry::HostRow;

    /// A summary keeps each currency's count and dollars whole and its costliest first.
    #[test]
    fn a_summary_counts_and_sums_every_episode_and_keeps_the_costliest() {
        let episode = |host: &str, currency: &str, cost: &str| IdleEpisode {
            cluster: "c".into(),
            hostname: host.into(),
            kind: "idle".into(),
            start_ms: 0,
            end_ms: HOUR_MS,
            hours: 1,
            gpus: vec![],
            owners: BTreeMap::new(),
            currency: currency.into(),
            cost: cost.parse().unwrap(),
            estimated: false,
        };
        let all = vec![
            episode("a", "USD", "9.50"),
            episode("b", "EUR", "7"),
            episode("c", "USD", "3.25"),
            episode("d", "USD", "0.000001"),
        ];
        let s = Summary::of(all, 2);
        let usd = s.currencies.iter().find(|c| c.currency == "USD").unwrap();
        assert_eq!((usd.count, usd.cost), (3, "12.750001".parse().unwrap()));
        let hosts: Vec<&str> = usd.costliest.iter().map(|e| e.hostname.as_str()).collect();
        assert_eq!(hosts, ["a", "c"]);
        let eur = s.currencies.iter().find(|c| c.currency == "EUR").unwrap();
        assert_eq!((eur.count, eur.costliest.len()), (1, 1));
        let back: Summary = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s, "kept and read back as it was");
    }

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
            energy_known_seconds: 0.0,
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
            region: None,
            from_bill: false,
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
                    x.kind.as_str(),
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

    /// The database's sums per host-hour (JSON sets of GPUs and owners, money in nano and atto
    /// parts) give exactly the episodes of the hourly ledger itself, on both backends.
    #[tokio::test]
    async fn episodes_summed_by_the_database_equal_those_of_the_hourly_ledger() {
        use crate::store::rollups::DirtyMark;
        use crate::store::{RollupGrain, RollupRow};
        const H: i64 = 1_800_000_000_000 - 1_800_000_000_000 % HOUR_MS;
        for db in crate::test_support::both().await {
            let b = db.backend;
            let store = db.open().await;
            let s = store.as_ref();
            let row =
                |hour: i64, host: i64, gpu: &str, owner: &[(&str, &str)], kind: &str| RollupRow {
                    period_ms: H + hour * HOUR_MS,
                    host_id: host,
                    gpu_uuid: gpu.into(),
                    owner: owner.iter().copied().collect::<Owner>().key(),
                    kind: kind.into(),
                    pricing_category: "on_demand".into(),
                    currency: if host == 2 { "EUR" } else { "USD" }.into(),
                    estimated: i64::from(gpu == "GPU-2"),
                    cost_nano: 1_000_000_000 + hour,
                    cost_atto: 999_999_999,
                    gpu_seconds: 3600.0,
                    util_gpu_seconds: 0.0,
                    util_known_seconds: 3600.0,
                    energy_j: 0.0,
                    energy_known_seconds: 0.0,
                };
            let rows = [
                row(0, 1, "GPU-1", &[("team", "c-team")], "idle"),
                row(0, 1, "GPU-2", &[("team", "c-team")], "idle"),
                row(0, 1, "GPU-3", &[("team", "a"), ("model", "m")], "held_idle"),
                row(0, 1, "GPU-4", &[("team", "b")], "held_idle"),
                row(0, 1, "GPU-5", &[("team", "a")], "used"),
                row(1, 1, "GPU-1", &[("team", "c-team")], "idle"),
                row(1, 1, "", &[], "idle"),
                row(1, 2, "GPU-9", &[], "idle"),
                row(3, 1, "GPU-1", &[("team", "c-team")], "idle"),
            ];
            let hours: Vec<i64> = (0..4).map(|h| H + h * HOUR_MS).collect();
            crate::store::rollups::mark_dirty_hours(s.db(), &hours)
                .await
                .unwrap();
            let marks: Vec<DirtyMark> = crate::store::rollups::dirty_marks(s.db(), 100)
                .await
                .unwrap();
            crate::rollup::write(
                s,
                &marks,
                crate::rollup::Written {
                    rows: &rows,
                    unattributed: &[],
                    usage: &[],
                },
                None,
            )
            .await
            .unwrap();
            let (from, to) = (H, H + 4 * HOUR_MS);
            let summed = load(s, from, to).await.unwrap();
            let hourly = crate::ledger::load(s, from, to, RollupGrain::Hour)
                .await
                .unwrap();
            let want = episodes(&hourly);
            assert_eq!(want.len(), 4, "{b}: {want:?}");
            assert_eq!(summed, want, "{b}");
            let first = &summed[0];
            assert_eq!(
                (
                    first.kind.as_str(),
                    first.hours,
                    first.gpus.len(),
                    first.estimated
                ),
                ("idle", 2, 2, true),
                "{b}: {first:?}"
            );
        }
    }
}
