//! A month's bill against the ledger, as a finance lead checks it: every dollar the bill charges
//! for the month's hours is either attributed (used, held idle, idle, unmonitored) on a GPU host
//! gpuledger knows, or on a GPU instance no agent reports, or not a GPU host at all; and the
//! ledger's own total is that, plus what the rate card estimates for hosts no bill covers.
//!
//! The bill side is read from the bill lines themselves, classified as attribution classifies
//! them (by instance key); the ledger side from the rollups. Both are exact decimals, so every
//! check is to the cent and a difference means something is wrong or still being rolled up.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;
use serde::Serialize;

use crate::store;
use crate::store::{RollupGrain, Store, StoreError};
use gpuledger_core::attribution::hosts_by_instance_key;
use gpuledger_core::attribution::line_hours;
use gpuledger_core::attribution::Attribution;
use gpuledger_core::attribution::Kind;
use gpuledger_core::attribution::Rules;
use gpuledger_core::bill::CommitmentPart;
use gpuledger_core::bill::StoredCostLine;
use gpuledger_core::commitment::charge_unused;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::telemetry::HostRow;

/// One bill resource the month charges, with its amount in the month's hours.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ResourceCost {
    /// The bill's resource (its normalised instance key), or `(none)`.
    pub resource: String,
    pub instance_type: Option<String>,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    /// For a GPU instance no agent reports: whose the bill's tags say it is, per owner dimension
    /// that reads a tag (each value once).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub owners: BTreeMap<String, BTreeSet<String>>,
    /// For a GPU instance no agent reports: whether the ledger holds its cost, on a host known
    /// from the bill alone (as unmonitored, under the owners its tags name), or not yet (the
    /// roll-up has not met it since its bill arrived).
    pub in_ledger: bool,
}

/// Used, held idle, idle and unmonitored dollars.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ByKind {
    #[serde(with = "rust_decimal::serde::str")]
    pub used: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub held_idle: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub idle: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub unmonitored: Decimal,
}

impl ByKind {
    pub fn total(&self) -> Decimal {
        self.used + self.held_idle + self.idle + self.unmonitored
    }
    fn add(&mut self, kind: Kind, cost: Decimal) {
        match kind {
            Kind::Used => self.used += cost,
            Kind::HeldIdle => self.held_idle += cost,
            Kind::Idle => self.idle += cost,
            Kind::Unmonitored => self.unmonitored += cost,
        }
    }
}

/// One currency's reconciliation for a month.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Reconciliation {
    pub currency: String,
    /// What the bill's lines charge for the month's hours.
    #[serde(with = "rust_decimal::serde::str")]
    pub bill: Decimal,
    /// Of it: lines of the ledger's GPU hosts, those agents report and those known from the
    /// bill alone (the ledger attributes them).
    #[serde(with = "rust_decimal::serde::str")]
    pub bill_on_known_hosts: Decimal,
    /// Lines of GPU instances (by the rate card's instance types or a GPU instance family) no
    /// agent reports: in the ledger on hosts known from the bill alone, or not yet.
    pub gpu_without_agent: Vec<ResourceCost>,
    /// Commitment discounts' unused parts (FOCUS `Unused` rows), per commitment: no
    /// resource's cost, charged to the fleet, not to owners (under `[commitments] unused =
    /// "covered_owners"`, only the hours a commitment covered nothing).
    pub unused_commitments: Vec<ResourceCost>,
    /// Commitments' unused parts charged, by configuration (`[commitments] unused =
    /// "covered_owners"`), to the owners of the usage each covered in the same hour: part of
    /// `attributed`. Shares on resources the ledger does not hold (a CPU instance a compute
    /// plan covered) are counted where those resources are, and not here.
    #[serde(with = "rust_decimal::serde::str")]
    pub unused_commitments_on_owners: Decimal,
    /// Everything else on the bill: storage, network, CPU instances, support, tax…
    pub not_gpu: Vec<ResourceCost>,
    /// The ledger's attribution of the billed hosts, by kind.
    pub attributed: ByKind,
    /// The ledger's rate-card estimates for hosts and hours no bill covers: not on this bill.
    pub estimated: ByKind,
    /// What the ledger holds as not attributed (GPU instances without agent, unused
    /// commitments and not GPU).
    #[serde(with = "rust_decimal::serde::str")]
    pub ledger_unattributed: Decimal,
    /// `bill − (attributed + ledger_unattributed)`: zero when the ledger is complete.
    #[serde(with = "rust_decimal::serde::str")]
    pub difference: Decimal,
}

impl Reconciliation {
    /// GPU instances no agent reports, in the ledger or not.
    pub fn gpu_without_agent_total(&self) -> Decimal {
        self.gpu_without_agent.iter().map(|r| r.cost).sum()
    }
    /// Of them, those the ledger does not hold yet.
    pub fn gpu_without_agent_unattributed(&self) -> Decimal {
        self.gpu_without_agent
            .iter()
            .filter(|r| !r.in_ledger)
            .map(|r| r.cost)
            .sum()
    }
    pub fn unused_commitments_total(&self) -> Decimal {
        self.unused_commitments.iter().map(|r| r.cost).sum()
    }
    pub fn not_gpu_total(&self) -> Decimal {
        self.not_gpu.iter().map(|r| r.cost).sum()
    }
}

/// Reconciles `[from_ms, to_ms)` from its bill lines and its (rolled-up) attribution; GPU
/// instances no agent reports carry the owners their lines' tags name under `schema`.
pub fn reconcile(
    lines: &[StoredCostLine],
    hosts: &[HostRow],
    ledger: &Attribution,
    card: &RateCard,
    schema: &OwnerSchema,
    from_ms: i64,
    to_ms: i64,
) -> Vec<Reconciliation> {
    #[derive(Default)]
    struct Acc {
        bill: Decimal,
        known: Decimal,
        gpu_without_agent: BTreeMap<(String, Option<String>), (Decimal, bool)>,
        not_gpu: BTreeMap<(String, Option<String>), Decimal>,
        unused_commitments: BTreeMap<(String, Option<String>), Decimal>,
        unused_on_owners: Decimal,
        hints: BTreeMap<(String, Option<String>), BTreeMap<String, BTreeSet<String>>>,
        attributed: ByKind,
        estimated: ByKind,
    }
    let by_key = hosts_by_instance_key(hosts);
    // A host known from the bill holds its cost only once the roll-up has attributed its hours
    // (a closed month rolled up before it existed still holds that cost as unattributed).
    let in_ledger: BTreeSet<i64> = ledger
        .parts
        .iter()
        .filter(|p| !p.estimated)
        .map(|p| p.host_id)
        .collect();
    let from_bill: BTreeSet<i64> = hosts.iter().filter(|h| h.from_bill).map(|h| h.id).collect();
    let mut acc: BTreeMap<String, Acc> = BTreeMap::new();
    for line in lines {
        let amount: Decimal = line_hours(line, from_ms, to_ms)
            .into_iter()
            .map(|(_, a)| a)
            .sum();
        if amount.is_zero() {
            continue;
        }
        let a = acc.entry(line.currency.clone()).or_default();
        a.bill += amount;
        let key = line.resource_key.as_deref();
        if line.is_unused_commitment() {
            let resource = (key.unwrap_or("(none)").to_owned(), None);
            *a.unused_commitments.entry(resource).or_default() += amount;
            continue;
        }
        let host = key
            .and_then(|k| by_key.get(k))
            .filter(|id| !from_bill.contains(*id) || in_ledger.contains(*id));
        if host.is_some() {
            a.known += amount;
            // A share on a host the ledger attributes: charged to its owners. Elsewhere (a CPU
            // instance, a GPU instance not in the ledger yet) it is listed where it lands.
            if line.commitment_part == Some(CommitmentPart::UnusedShare) {
                a.unused_on_owners += amount;
            }
        }
        let in_ledger = match host {
            Some(id) if from_bill.contains(id) => true,
            Some(_) => continue,
            None => false,
        };
        let resource = (
            key.unwrap_or("(none)").to_owned(),
            line.instance_type.clone(),
        );
        if !in_ledger && !crate::billing::gpu_instances::is_gpu_line(line, card) {
            *a.not_gpu.entry(resource).or_default() += amount;
            continue;
        }
        if schema.reads_tags() {
            let tags = gpuledger_core::bill::tags_of(&line.tags_json);
            let owner = schema.with_tags(&Default::default(), &tags, "");
            let hints = a.hints.entry(resource.clone()).or_default();
            for (dimension, value) in owner.iter() {
                hints
                    .entry(dimension.to_owned())
                    .or_default()
                    .insert(value.to_owned());
            }
        }
        let listed = a.gpu_without_agent.entry(resource).or_default();
        listed.0 += amount;
        listed.1 = in_ledger;
    }
    for p in &ledger.parts {
        let a = acc.entry(p.currency.clone()).or_default();
        if p.estimated {
            a.estimated.add(p.kind, p.cost);
        } else {
            a.attributed.add(p.kind, p.cost);
        }
    }
    for currency in ledger.unattributed.keys() {
        acc.entry(currency.clone()).or_default();
    }
    let listed = |m: BTreeMap<(String, Option<String>), (Decimal, bool)>,
                  hints: &mut BTreeMap<(String, Option<String>), _>| {
        let mut v: Vec<ResourceCost> = m
            .into_iter()
            .filter(|(_, (c, _))| !c.is_zero())
            .map(|(key, (cost, in_ledger))| ResourceCost {
                owners: hints.remove(&key).unwrap_or_default(),
                resource: key.0,
                instance_type: key.1,
                cost,
                in_ledger,
            })
            .collect();
        v.sort_by(|a, b| b.cost.cmp(&a.cost).then(a.resource.cmp(&b.resource)));
        v
    };
    acc.into_iter()
        .map(|(currency, mut a)| {
            let ledger_unattributed = ledger
                .unattributed
                .get(&currency)
                .copied()
                .unwrap_or_default();
            Reconciliation {
                difference: a.bill - a.attributed.total() - ledger_unattributed,
                currency,
                bill: a.bill,
                bill_on_known_hosts: a.known,
                gpu_without_agent: listed(a.gpu_without_agent, &mut a.hints),
                unused_commitments: listed(
                    a.unused_commitments
                        .into_iter()
                        .map(|(k, c)| (k, (c, false)))
                        .collect(),
                    &mut BTreeMap::new(),
                ),
                unused_commitments_on_owners: a.unused_on_owners,
                not_gpu: listed(
                    a.not_gpu
                        .into_iter()
                        .map(|(k, c)| (k, (c, false)))
                        .collect(),
                    &mut BTreeMap::new(),
                ),
                attributed: a.attributed,
                estimated: a.estimated,
                ledger_unattributed,
            }
        })
        .collect()
}

/// A month's reconciliation, read from the store: its bill lines and its rollups.
pub async fn for_range(
    store: &dyn Store,
    card: &RateCard,
    rules: &Rules,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<Reconciliation>, StoreError> {
    let lines = store::bills::cost_lines(store.db(), from_ms, to_ms).await?;
    // Classified as the roll-up attributed them: unused parts where the config charges them.
    let lines = charge_unused(lines, rules.unused_commitments, from_ms, to_ms);
    let hosts = store::telemetry::hosts(store.db()).await?;
    let ledger = crate::ledger::load(store, from_ms, to_ms, RollupGrain::HostDay).await?;
    Ok(reconcile(
        &lines,
        &hosts,
        &ledger,
        card,
        &rules.owners,
        from_ms,
        to_ms,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use gpuledger_core::attribution::Owner;
    use gpuledger_core::attribution::Part;
    use gpuledger_core::time::HOUR_MS;

    fn line(key: Option<&str>, instance_type: Option<&str>, cost: &str) -> StoredCostLine {
        StoredCostLine {
            tags_json: "{}".into(),
            commitment_id: None,
            commitment_part: None,
            resource_key: key.map(str::to_owned),
            charge_period_start_ms: 0,
            charge_period_end_ms: 2 * HOUR_MS,
            charge_category: "Usage".into(),
            billed_cost: gpuledger_core::money::from_text(cost),
            effective_cost: gpuledger_core::money::from_text(cost),
            currency: "USD".into(),
            pricing_category: "on_demand".into(),
            instance_type: instance_type.map(str::to_owned),
        }
    }

    fn part(kind: Kind, cost: &str, estimated: bool) -> Part {
        Part {
            hour_ms: 0,
            host_id: 1,
            gpu_uuid: Some("GPU-1".into()),
            owner: Owner::default(),
            kind,
            pricing_category: "on_demand".into(),
            currency: "USD".into(),
            cost: gpuledger_core::money::from_text(cost),
            estimated,
            gpu_seconds: 0.0,
            util_gpu_seconds: 0.0,
            util_known_seconds: 0.0,
            energy_j: 0.0,
            energy_known_seconds: 0.0,
        }
    }

    #[test]
    fn every_line_lands_in_one_place_and_a_gap_shows() {
        let hosts = [HostRow {
            id: 1,
            cluster: "c".into(),
            hostname: "h".into(),
            provider: None,
            instance_id: None,
            instance_key: Some("i-known".into()),
            instance_type: None,
            lifecycle: None,
            region: None,
            from_bill: false,
        }];
        // Two-hour lines, read for the first hour only: half of each counts.
        let lines = [
            line(Some("i-known"), Some("p4d.24xlarge"), "20"),
            line(Some("i-nobody"), Some("p4d.24xlarge"), "8"),
            line(Some("bucket"), None, "4"),
            line(None, Some("t3.micro"), "2"),
            // A savings plan's unused part, and one written on the resource it could have
            // covered (FOCUS 1.2's flexibility example): both the fleet's, neither the host's.
            StoredCostLine {
                commitment_id: None,
                commitment_part: Some(gpuledger_core::bill::CommitmentPart::Unused),
                ..line(Some("sp-1"), None, "6")
            },
            StoredCostLine {
                commitment_id: None,
                commitment_part: Some(gpuledger_core::bill::CommitmentPart::Unused),
                ..line(Some("i-known"), Some("p4d.24xlarge"), "2")
            },
        ];
        let mut ledger = Attribution {
            parts: vec![
                part(Kind::Used, "6", false),
                part(Kind::Idle, "4", false),
                part(Kind::Used, "3.5", true),
            ],
            unattributed: [("USD".to_owned(), Decimal::from(11))].into(),
            unattributed_hours: Default::default(),
            hosts: Default::default(),
        };
        let card = RateCard::default_card();
        let first_hour = |ledger: &Attribution| {
            reconcile(
                &lines,
                &hosts,
                ledger,
                &card,
                &OwnerSchema::default(),
                0,
                HOUR_MS,
            )
            .remove(0)
        };
        let r = &first_hour(&ledger);
        assert_eq!(r.bill, Decimal::from(21));
        assert_eq!(r.bill_on_known_hosts, Decimal::from(10));
        assert_eq!(r.unused_commitments_total(), Decimal::from(4));
        let unused: Vec<&str> = r
            .unused_commitments
            .iter()
            .map(|c| c.resource.as_str())
            .collect();
        assert_eq!(unused, ["sp-1", "i-known"]);
        assert_eq!(r.attributed.total(), Decimal::from(10));
        assert_eq!(
            r.estimated.used,
            Decimal::new(35, 1),
            "estimates are kept apart"
        );
        assert_eq!(r.gpu_without_agent_total(), Decimal::from(4));
        assert_eq!(r.gpu_without_agent[0].resource, "i-nobody");
        // Not GPU: the bucket and the CPU instance, largest first.
        let not_gpu: Vec<&str> = r.not_gpu.iter().map(|c| c.resource.as_str()).collect();
        assert_eq!(not_gpu, ["bucket", "(none)"]);
        assert_eq!(r.difference, Decimal::ZERO);
        // A ledger that lost an hour of idle shows the gap, to the cent.
        ledger.parts.remove(1);
        assert_eq!(first_hour(&ledger).difference, Decimal::from(4));
    }

    /// A GPU instance on a host known from the bill alone is in the ledger: its lines count with
    /// the known hosts' and it is still listed as without agent, marked in the ledger; once an
    /// agent's host has the same instance, it is that host's and no longer listed.
    #[test]
    fn a_host_known_from_the_bill_is_in_the_ledger_and_listed_until_an_agent_reports() {
        let billed = HostRow {
            id: 2,
            cluster: gpuledger_core::telemetry::BILLED_ONLY_CLUSTER.into(),
            hostname: "i-ghost".into(),
            provider: None,
            instance_id: Some("i-ghost".into()),
            instance_key: Some("i-ghost".into()),
            instance_type: Some("p4d.24xlarge".into()),
            lifecycle: None,
            region: None,
            from_bill: true,
        };
        let lines = [
            line(Some("i-ghost"), Some("p4d.24xlarge"), "8"),
            line(Some("i-nobody"), Some("g5.xlarge"), "6"),
        ];
        let mut unmonitored = part(Kind::Unmonitored, "4", false);
        unmonitored.host_id = 2;
        let ledger = Attribution {
            parts: vec![unmonitored],
            unattributed: [("USD".to_owned(), Decimal::from(3))].into(),
            unattributed_hours: Default::default(),
            hosts: Default::default(),
        };
        let card = RateCard::default_card();
        let schema = OwnerSchema::default();
        let r = &reconcile(
            &lines,
            std::slice::from_ref(&billed),
            &ledger,
            &card,
            &schema,
            0,
            HOUR_MS,
        )[0];
        // Before the roll-up attributed its hours, the bill's host holds nothing yet.
        let empty = Attribution {
            parts: Vec::new(),
            ..ledger.clone()
        };
        let before = &reconcile(
            &lines,
            std::slice::from_ref(&billed),
            &empty,
            &card,
            &schema,
            0,
            HOUR_MS,
        )[0];
        assert_eq!(before.bill_on_known_hosts, Decimal::ZERO);
        assert!(before.gpu_without_agent.iter().all(|c| !c.in_ledger));
        assert_eq!(r.bill_on_known_hosts, Decimal::from(4));
        let listed: Vec<(&str, bool)> = r
            .gpu_without_agent
            .iter()
            .map(|c| (c.resource.as_str(), c.in_ledger))
            .collect();
        assert_eq!(listed, [("i-ghost", true), ("i-nobody", false)]);
        assert_eq!(r.gpu_without_agent_total(), Decimal::from(7));
        assert_eq!(r.gpu_without_agent_unattributed(), Decimal::from(3));
        assert_eq!(r.difference, Decimal::ZERO);
        let agent = HostRow {
            id: 3,
            cluster: "c".into(),
            hostname: "gpu-7".into(),
            from_bill: false,
            ..billed.clone()
        };
        let r = &reconcile(
            &lines,
            &[billed, agent],
            &ledger,
            &card,
            &schema,
            0,
            HOUR_MS,
        )[0];
        assert_eq!(r.bill_on_known_hosts, Decimal::from(4));
        let listed: Vec<&str> = r
            .gpu_without_agent
            .iter()
            .map(|c| c.resource.as_str())
            .collect();
        assert_eq!(listed, ["i-nobody"]);
    }

    /// A GPU instance no agent reports carries the owners its lines' tags name (each value once,
    /// over the month's lines), under the dimensions that read a tag; its cost stays where it
    /// was, and a CPU instance gets no hint.
    #[test]
    fn a_gpu_instance_without_agent_names_its_owners_from_its_tags() {
        let schema: OwnerSchema = toml::from_str(
            r#"team = { from = ["label:team", "tag:Team"] }
cost_center = { from = ["tag:CostCenter"] }"#,
        )
        .unwrap();
        let tagged = |key: &str, instance_type: &str, tags: &str| {
            let mut l = line(Some(key), Some(instance_type), "2");
            l.tags_json = tags.into();
            l
        };
        let lines = [
            tagged(
                "i-ghost",
                "p4d.24xlarge",
                r#"{"Team":"search","CostCenter":"cc-1"}"#,
            ),
            tagged("i-ghost", "p4d.24xlarge", r#"{"Team":"ads"}"#),
            tagged("i-untagged", "g5.xlarge", "{}"),
            tagged("i-cpu", "m5.large", r#"{"Team":"search"}"#),
        ];
        let ledger = Attribution {
            parts: Vec::new(),
            unattributed: Default::default(),
            unattributed_hours: Default::default(),
            hosts: Default::default(),
        };
        let card = RateCard::default_card();
        let r = &reconcile(&lines, &[], &ledger, &card, &schema, 0, HOUR_MS)[0];
        let ghost = r
            .gpu_without_agent
            .iter()
            .find(|c| c.resource == "i-ghost")
            .unwrap();
        assert_eq!(
            ghost.cost,
            Decimal::from(2),
            "two lines, half of each in the hour"
        );
        let owners: Vec<(&str, Vec<&str>)> = ghost
            .owners
            .iter()
            .map(|(k, v)| (k.as_str(), v.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            owners,
            [
                ("cost_center", vec!["cc-1"]),
                ("team", vec!["ads", "search"])
            ]
        );
        let untagged = r
            .gpu_without_agent
            .iter()
            .find(|c| c.resource == "i-untagged")
            .unwrap();
        assert!(untagged.owners.is_empty());
        assert!(r.not_gpu.iter().all(|c| c.owners.is_empty()));
        // Without a tag source, no hints at all.
        let plain = &reconcile(
            &lines,
            &[],
            &ledger,
            &card,
            &OwnerSchema::default(),
            0,
            HOUR_MS,
        )[0];
        assert!(plain.gpu_without_agent.iter().all(|c| c.owners.is_empty()));
    }
}
