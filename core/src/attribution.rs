//! Attribution: every dollar of a GPU host's bill, hour by hour, to whoever used its GPUs.
//!
//! For each host and hour:
//! 1. The cost is what the bill says for that instance in that hour (each cost line spread over
//!    the hours of its charge period), or else the rate card's estimate.
//! 2. The host's physical GPUs share it equally; that also spreads the instance's non-GPU cost
//!    (CPU, memory, network) over its GPUs.
//! 3. Each GPU splits its share over time: each reported window by its duration, and time no
//!    window covers is **unmonitored**. A GPU in MIG mode shares each window among its MIG
//!    devices by the compute slices each holds (3 of 7 for a `3g.40gb`; the compute instances
//!    of one GPU instance share its slices); slices no device holds are **idle**. (Reports of
//!    agents that predate slices split it by the devices' memory.)
//! 4. Inside a window, processes doing work share it by SM utilization (by memory where the
//!    driver gives no per-process utilization). Where nothing measures activity (a MIG device
//!    without GPM), processes holding the device use it by their presence. If none works but
//!    some hold memory, they are **held idle** and charged to their owners as such. Memory
//!    held, or work done, by processes the agent cannot see is the "(unseen process)" owner's.
//!    With no process, or a device that could not be read, it is **idle**.
//!
//! All of it becomes one list of weights per host-hour, and each cost is divided by
//! [`split_exact`], so the parts add up to the bill exactly.

use std::collections::{BTreeMap, HashMap};

use foldhash::{HashMap as FastMap, HashMapExt};

use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use crate::bill::{spread_over_hours, StoredCostLine};
use crate::idle::IdleConfig;
use crate::money::split_exact;
pub use crate::owners::Owner;
use crate::owners::OwnerSchema;
use crate::ratecard::RateCard;
use crate::telemetry::{AttributionWindow, HostRow, StoredProcessWindow};
use crate::time::{hour_floor, HOUR_MS};
use shares::{host_hour_shares, Holder};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Processes doing work.
    Used,
    /// Processes holding GPU memory at ~0% utilization.
    HeldIdle,
    /// No process on the GPU.
    Idle,
    /// No telemetry for this time: the agent was down or not installed.
    Unmonitored,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Used => "used",
            Kind::HeldIdle => "held_idle",
            Kind::Idle => "idle",
            Kind::Unmonitored => "unmonitored",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        [Kind::Used, Kind::HeldIdle, Kind::Idle, Kind::Unmonitored]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// The rules attribution follows, as configured: when a GPU counts as busy (per cluster), who
/// owns a process (the owner dimensions) and who pays for commitments' unused parts.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub busy: IdleConfig,
    pub owners: OwnerSchema,
    pub unused_commitments: crate::commitment::UnusedCharge,
}

/// One attributed part: a slice of one host-hour's cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub hour_ms: i64,
    pub host_id: i64,
    /// The GPU or MIG instance; `None` for a host-hour with no GPU telemetry at all.
    pub gpu_uuid: Option<String>,
    pub owner: Owner,
    pub kind: Kind,
    pub pricing_category: String,
    pub currency: String,
    pub cost: Decimal,
    /// From the rate card rather than a bill.
    pub estimated: bool,
    /// GPU time this part stands for, in physical-GPU seconds.
    pub gpu_seconds: f64,
    /// GPU utilization (%) × `gpu_seconds`, over the time where utilization is known.
    pub util_gpu_seconds: f64,
    /// `gpu_seconds` where utilization is known.
    pub util_known_seconds: f64,
    /// Energy this part stands for, in joules, where NVML measured it.
    pub energy_j: f64,
    /// `gpu_seconds` whose energy NVML measured: less than `gpu_seconds` where some GPUs or
    /// windows report none, so `energy_j` covers only part of the time (unknown is not 0 kWh).
    pub energy_known_seconds: f64,
}

/// What one weight stands for before the cost is divided. Borrowed and interned, not owned:
/// a host-hour has a share per window, so each allocation here was paid millions of times.
#[derive(Debug, Clone)]
struct Share<'w> {
    gpu_uuid: Option<&'w str>,
    owner: OwnerId,
    kind: Kind,
    weight: f64,
    gpu_seconds: f64,
    /// Utilization × seconds, and the seconds, where utilization is known.
    util_gpu_seconds: f64,
    util_known_seconds: f64,
    energy_j: f64,
    energy_known_seconds: f64,
}

/// One cost to divide over a host-hour.
#[derive(Debug, Clone)]
struct CostItem {
    amount: Decimal,
    currency: String,
    pricing_category: String,
    estimated: bool,
    /// The line's tags, where an owner dimension reads them.
    tags: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Attribution {
    pub parts: Vec<Part>,
    /// Cost inside the range on lines that match no known GPU host, per currency: counted in
    /// totals, not attributed.
    pub unattributed: BTreeMap<String, Decimal>,
    /// The same per (hour, currency), for the rollups.
    pub unattributed_hours: BTreeMap<(i64, String), Decimal>,
    pub hosts: HashMap<i64, HostRow>,
}

/// Spreads each cost line over the hours of its charge period in `[from_ms, to_ms)`, exactly.
pub fn line_hours(line: &StoredCostLine, from_ms: i64, to_ms: i64) -> Vec<(i64, Decimal)> {
    spread_over_hours(
        line.effective_cost,
        line.charge_period_start_ms,
        line.charge_period_end_ms,
        from_ms,
        to_ms,
    )
}

/// Which host a bill line belongs to, by normalised instance id. Where an agent reports an
/// instance that was known from the bill alone, the agent's host takes its lines (and of two
/// agents' hosts, the newer): each line has one host, so an hour attributed again moves whole,
/// never counted on both.
pub fn hosts_by_instance_key(hosts: &[HostRow]) -> HashMap<&str, i64> {
    let mut by_key: HashMap<&str, &HostRow> = HashMap::new();
    for h in hosts {
        let Some(key) = h.instance_key.as_deref() else {
            continue;
        };
        let preferred = by_key
            .get(key)
            .is_none_or(|held| (h.from_bill, -h.id) < (held.from_bill, -held.id));
        if preferred {
            by_key.insert(key, h);
        }
    }
    by_key.into_iter().map(|(k, h)| (k, h.id)).collect()
}

/// An owner interned by [`Owners`]: equal owners have the same id, so shares are merged by
/// comparing ids rather than owners' dimension maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct OwnerId(u32);

/// Owners by the schema: a process's from its labels on its host's cluster (each distinct label
/// set read once), nobody's (idle, unmonitored) from the cluster alone, and the processes the
/// agent cannot see as "(unseen process)". Each distinct owner is kept once, under its id.
struct Owners<'a> {
    schema: &'a OwnerSchema,
    cluster: &'a str,
    nobody: OwnerId,
    unseen: OwnerId,
    by_cluster: FastMap<&'a str, (OwnerId, OwnerId)>,
    by_labels: FastMap<(&'a str, &'a str), OwnerId>,
    ids: FastMap<Owner, OwnerId>,
    owners: Vec<Owner>,
}

impl<'a> Owners<'a> {
    fn new(schema: &'a OwnerSchema) -> Self {
        let mut owners = Owners {
            schema,
            cluster: "",
            nobody: OwnerId(0),
            unseen: OwnerId(0),
            by_cluster: FastMap::new(),
            by_labels: FastMap::new(),
            ids: FastMap::new(),
            owners: Vec::new(),
        };
        owners.nobody = owners.intern(schema.owner_of(&BTreeMap::new(), ""));
        owners.unseen = owners.intern(schema.unseen_owner(""));
        owners
    }

    fn intern(&mut self, owner: Owner) -> OwnerId {
        if let Some(id) = self.ids.get(&owner) {
            return *id;
        }
        let id = OwnerId(self.owners.len() as u32);
        self.owners.push(owner.clone());
        self.ids.insert(owner, id);
        id
    }

    fn get(&self, id: OwnerId) -> &Owner {
        &self.owners[id.0 as usize]
    }

    /// Owners on a host of `cluster` from now on.
    fn on_cluster(&mut self, cluster: &'a str) {
        if self.cluster == cluster {
            return;
        }
        self.cluster = cluster;
        let (nobody, unseen) = match self.by_cluster.get(cluster) {
            Some(ids) => *ids,
            None => {
                let nobody = self.intern(self.schema.owner_of(&BTreeMap::new(), cluster));
                let unseen = self.intern(self.schema.unseen_owner(cluster));
                self.by_cluster.insert(cluster, (nobody, unseen));
                (nobody, unseen)
            }
        };
        self.nobody = nobody;
        self.unseen = unseen;
    }

    fn of_holder(&mut self, h: Holder<'a>) -> OwnerId {
        match h {
            Holder::Seen(p) => self.of(p),
            Holder::Unseen(_) => self.unseen,
        }
    }

    fn of(&mut self, p: &'a StoredProcessWindow) -> OwnerId {
        let key = (p.labels_json.as_str(), self.cluster);
        if let Some(id) = self.by_labels.get(&key) {
            return *id;
        }
        let labels: BTreeMap<String, String> =
            serde_json::from_str(&p.labels_json).unwrap_or_default();
        let id = self.intern(self.schema.owner_of(&labels, self.cluster));
        self.by_labels.insert(key, id);
        id
    }
}

/// [`attribute_by`] with the default thresholds and owner dimensions.
pub fn attribute(
    hosts: Vec<HostRow>,
    windows: &[AttributionWindow],
    processes: &[StoredProcessWindow],
    lines: &[StoredCostLine],
    card: &RateCard,
    from_ms: i64,
    to_ms: i64,
) -> Attribution {
    attribute_by(
        hosts,
        windows,
        processes,
        lines,
        card,
        &IdleConfig::default(),
        &OwnerSchema::default(),
        from_ms,
        to_ms,
    )
}

/// Attributes `[from_ms, to_ms)` (whole hours) from already-loaded data; whether a window was
/// busy, held idle or idle by each host's cluster's thresholds in `busy`; who owned it by the
/// owner dimensions in `schema`.
///
/// `lines` are the bill's lines overlapping the range and, for the hours after the bill's last
/// line, each host's newest lines ending before it: an hour a host reported and no line covers
/// is estimated at what the bill last charged that host for an hour (its commitments and
/// negotiated rates included), within [`crate::bill::LAST_BILLED_LOOKBACK_MS`]; only a host
/// the bill has not charged in that time is priced from the rate card.
#[allow(clippy::too_many_arguments)]
pub fn attribute_by(
    hosts: Vec<HostRow>,
    windows: &[AttributionWindow],
    processes: &[StoredProcessWindow],
    lines: &[StoredCostLine],
    card: &RateCard,
    busy: &IdleConfig,
    schema: &OwnerSchema,
    from_ms: i64,
    to_ms: i64,
) -> Attribution {
    let by_key = hosts_by_instance_key(&hosts);
    let reads_tags = schema.reads_tags();
    let (mut billed, unattributed_hours) =
        billed_items(lines, (&by_key, reads_tags), (from_ms, to_ms));
    let mut last_billed = last_billed_before(lines, &by_key, reads_tags, from_ms);
    let mut host_windows: BTreeMap<(i64, i64), Vec<&AttributionWindow>> = BTreeMap::new();
    for w in windows {
        host_windows
            .entry((w.host_id, hour_floor(w.start_ms)))
            .or_default()
            .push(w);
    }
    let mut procs: FastMap<(&str, i64), Vec<&StoredProcessWindow>> = FastMap::new();
    for p in processes {
        procs
            .entry((p.gpu_uuid.as_str(), p.start_ms))
            .or_default()
            .push(p);
    }
    let hosts: HashMap<i64, HostRow> = hosts.into_iter().map(|h| (h.id, h)).collect();
    let mut owners = Owners::new(schema);

    let mut keys: Vec<(i64, i64)> = billed.keys().chain(host_windows.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    let mut parts = Vec::new();
    for (host_id, hour) in keys {
        let ws = host_windows
            .get(&(host_id, hour))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        // Keys come by host, then hour: the last billed hour is known for every hour after.
        let items = match billed.remove(&(host_id, hour)) {
            Some(items) => {
                last_billed.insert(host_id, (hour, items.clone()));
                items
            }
            None => estimate(
                hosts.get(&host_id),
                ws,
                hour,
                (card, last_billed.get(&host_id)),
            ),
        };
        if items.is_empty() {
            continue;
        }
        let cluster = hosts.get(&host_id).map_or("", |h| h.cluster.as_str());
        let rules = busy.thresholds(cluster);
        owners.on_cluster(cluster);
        let shares = host_hour_shares(hour, ws, &procs, &mut owners, rules);
        let place = HostHour {
            host_id,
            hour,
            cluster,
        };
        split_items(
            place,
            items,
            &shares,
            (&owners, schema, reads_tags),
            &mut parts,
        );
    }
    let mut unattributed: BTreeMap<String, Decimal> = BTreeMap::new();
    for ((_, currency), amount) in &unattributed_hours {
        *unattributed.entry(currency.clone()).or_default() += amount;
    }
    Attribution {
        parts,
        unattributed,
        unattributed_hours,
        hosts,
    }
}

/// Bill items per (host, hour).
type Billed = BTreeMap<(i64, i64), Vec<CostItem>>;

/// The bill's items per (host, hour) in `[from_ms, to_ms)`, each line spread over its hours;
/// and per (hour, currency) what is on no known host. A line's tags are kept where the owner
/// schema reads them (`reads_tags`).
fn billed_items(
    lines: &[StoredCostLine],
    (by_key, reads_tags): (&HashMap<&str, i64>, bool),
    (from_ms, to_ms): (i64, i64),
) -> (Billed, BTreeMap<(i64, String), Decimal>) {
    let mut billed: Billed = BTreeMap::new();
    let mut unattributed_hours: BTreeMap<(i64, String), Decimal> = BTreeMap::new();
    for line in lines {
        // A commitment's unused part is nobody's, even where the bill names a resource on it
        // (as FOCUS 1.2's flexibility examples do): it stays unattributed, for the fleet.
        let host = line
            .resource_key
            .as_deref()
            .filter(|_| !line.is_unused_commitment())
            .and_then(|k| by_key.get(k));
        let tags: Option<BTreeMap<String, String>> = (reads_tags && host.is_some())
            .then(|| crate::bill::tags_of(&line.tags_json))
            .filter(|t| !t.is_empty());
        for (hour, amount) in line_hours(line, from_ms, to_ms) {
            match host {
                Some(host_id) => billed.entry((*host_id, hour)).or_default().push(CostItem {
                    amount,
                    currency: line.currency.clone(),
                    pricing_category: line.pricing_category.clone(),
                    estimated: false,
                    tags: tags.clone(),
                }),
                None => {
                    *unattributed_hours
                        .entry((hour, line.currency.clone()))
                        .or_default() += amount
                }
            }
        }
    }
    (billed, unattributed_hours)
}

/// A host-hour, and the cluster its host is in.
#[derive(Clone, Copy)]
struct HostHour<'a> {
    host_id: i64,
    hour: i64,
    cluster: &'a str,
}

/// Each cost item of a host-hour split over its shares, exactly, as parts. GPU time is shared
/// among the items (say, committed and on-demand lines for the same hour) in proportion to
/// their amounts, so it is counted once in total.
fn split_items(
    at: HostHour<'_>,
    items: Vec<CostItem>,
    shares: &[Share<'_>],
    (owners, schema, reads_tags): (&Owners<'_>, &OwnerSchema, bool),
    parts: &mut Vec<Part>,
) {
    let no_tags = BTreeMap::new();
    let billed_weights: Vec<f64> = shares.iter().map(|s| s.weight).collect();
    // An estimate already covers only the time the host was seen: none of it is unmonitored.
    let estimate_weights: Vec<f64> = shares
        .iter()
        .map(|s| {
            if s.kind == Kind::Unmonitored {
                0.0
            } else {
                s.weight
            }
        })
        .collect();
    let magnitude: Decimal = items.iter().map(|i| i.amount.abs()).sum();
    let count = items.len() as f64;
    for item in items {
        let time_fraction = if magnitude.is_zero() {
            1.0 / count
        } else {
            (item.amount.abs() / magnitude).to_f64().unwrap_or(0.0)
        };
        let weights = if item.estimated {
            &estimate_weights
        } else {
            &billed_weights
        };
        for ((share, cost), weight) in shares
            .iter()
            .zip(split_exact(item.amount, weights))
            .zip(weights)
        {
            if cost.is_zero()
                && (*weight == 0.0 || item.estimated && share.kind == Kind::Unmonitored)
            {
                continue;
            }
            // A dimension no process label gave may come from the line's tags.
            let owner = if reads_tags {
                let tags = item.tags.as_ref().unwrap_or(&no_tags);
                schema.with_tags(owners.get(share.owner), tags, at.cluster)
            } else {
                owners.get(share.owner).clone()
            };
            parts.push(Part {
                hour_ms: at.hour,
                host_id: at.host_id,
                gpu_uuid: share.gpu_uuid.map(str::to_owned),
                owner,
                kind: share.kind,
                pricing_category: item.pricing_category.clone(),
                currency: item.currency.clone(),
                cost,
                estimated: item.estimated,
                gpu_seconds: share.gpu_seconds * time_fraction,
                util_gpu_seconds: share.util_gpu_seconds * time_fraction,
                util_known_seconds: share.util_known_seconds * time_fraction,
                energy_j: share.energy_j * time_fraction,
                energy_known_seconds: share.energy_known_seconds * time_fraction,
            });
        }
    }
}

/// Each host's newest billed hour before `from_ms` and what the bill charged for it: from the
/// lines that end by then (a commitment's unused part is not what the host costs).
fn last_billed_before(
    lines: &[StoredCostLine],
    by_key: &HashMap<&str, i64>,
    reads_tags: bool,
    from_ms: i64,
) -> HashMap<i64, (i64, Vec<CostItem>)> {
    let before: Vec<(i64, &StoredCostLine)> = lines
        .iter()
        .filter(|l| l.charge_period_end_ms <= from_ms && !l.is_unused_commitment())
        .filter_map(|l| {
            let host = *by_key.get(l.resource_key.as_deref()?)?;
            Some((host, l))
        })
        .collect();
    let last_hour = |l: &StoredCostLine| {
        hour_floor(l.charge_period_end_ms.max(l.charge_period_start_ms + 1) - 1)
    };
    let mut newest: HashMap<i64, i64> = HashMap::new();
    for (host, l) in &before {
        let hour = newest.entry(*host).or_insert(i64::MIN);
        *hour = (*hour).max(last_hour(l));
    }
    let mut out: HashMap<i64, (i64, Vec<CostItem>)> = HashMap::new();
    for (host, l) in before {
        let hour = newest[&host];
        for (_, amount) in line_hours(l, hour, hour + HOUR_MS) {
            out.entry(host)
                .or_insert_with(|| (hour, Vec::new()))
                .1
                .push(CostItem {
                    amount,
                    currency: l.currency.clone(),
                    pricing_category: l.pricing_category.clone(),
                    estimated: false,
                    tags: reads_tags
                        .then(|| crate::bill::tags_of(&l.tags_json))
                        .filter(|t| !t.is_empty()),
                });
        }
    }
    out
}

/// The estimate for a host-hour with telemetry and no bill, for the time the host was seen
/// reporting in that hour: at what the bill charged the host for its last billed hour, where
/// that is within [`crate::bill::LAST_BILLED_LOOKBACK_MS`], else at the rate card's price.
fn estimate(
    host: Option<&HostRow>,
    ws: &[&AttributionWindow],
    hour: i64,
    (card, last_billed): (&RateCard, Option<&(i64, Vec<CostItem>)>),
) -> Vec<CostItem> {
    let (Some(first), Some(last)) = (
        ws.iter().map(|w| w.start_ms).min(),
        ws.iter().map(|w| w.end_ms).max(),
    ) else {
        return Vec::new();
    };
    let seen = (last.min(hour + HOUR_MS) - first.max(hour)).max(0);
    let for_seen = |hourly: Decimal| {
        (hourly * Decimal::from(seen) / Decimal::from(HOUR_MS)).round_dp(crate::money::MAX_SCALE)
    };
    if let Some((_, items)) =
        last_billed.filter(|(at, _)| hour - at <= crate::bill::LAST_BILLED_LOOKBACK_MS)
    {
        return items
            .iter()
            .map(|i| CostItem {
                amount: for_seen(i.amount),
                estimated: true,
                ..i.clone()
            })
            .collect();
    }
    let mut physical: BTreeMap<&str, &str> = BTreeMap::new();
    for w in ws.iter().filter(|w| w.parent_uuid.is_none()) {
        physical.insert(&w.gpu_uuid, w.gpu_name.as_deref().unwrap_or(""));
    }
    let names: Vec<&str> = physical.values().copied().collect();
    let spot = host.and_then(|h| h.lifecycle.as_deref()) == Some("spot");
    let Some((hourly, category)) =
        card.host_price(host.and_then(|h| h.instance_type.as_deref()), &names, spot)
    else {
        return Vec::new();
    };
    vec![CostItem {
        amount: for_seen(hourly),
        currency: card.currency.clone(),
        pricing_category: category.into(),
        estimated: true,
        tags: None,
    }]
}

#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;
pub(crate) mod shares;

#[cfg(test)]
mod tests;
