//! Which instance types carry GPUs, beyond the ones the rate card prices: a catalogue of the
//! providers' GPU instance families (`gpu_instances.toml`), so a bill's GPU host that no agent
//! reports is told from storage, network and CPU hosts whatever the rate card lists.

use std::collections::{BTreeMap, HashSet};
use std::sync::OnceLock;

use serde::Deserialize;

use crate::store::telemetry::BilledHost;
use gpuledger_core::ratecard::RateCard;

use gpuledger_core::bill::StoredCostLine;
use gpuledger_core::telemetry::HostRow;

const CATALOGUE: &str = include_str!("gpu_instances.toml");

#[derive(Deserialize)]
struct Catalogue {
    patterns: Vec<String>,
}

fn patterns() -> &'static [glob::Pattern] {
    static PATTERNS: OnceLock<Vec<glob::Pattern>> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        // The shipped file is tested below; a bad pattern is a build defect, left out.
        toml::from_str::<Catalogue>(CATALOGUE)
            .map(|c| {
                c.patterns
                    .iter()
                    .filter_map(|p| glob::Pattern::new(p).ok())
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Whether `instance_type` belongs to a GPU instance family of AWS, Azure, Google Cloud or OCI.
pub fn is_gpu_instance_type(instance_type: &str) -> bool {
    let options = glob::MatchOptions {
        case_sensitive: false,
        ..Default::default()
    };
    patterns()
        .iter()
        .any(|p| p.matches_with(instance_type, options))
}

/// Whether a bill line is for a GPU instance: its instance type is one the rate card prices
/// with GPUs, or of a provider's GPU instance family.
pub fn is_gpu_line(line: &StoredCostLine, card: &RateCard) -> bool {
    line.instance_type.as_deref().is_some_and(|t| {
        card.instance_types.get(t).is_some_and(|r| r.gpus > 0) || is_gpu_instance_type(t)
    })
}

/// The GPU instances `lines` charge that no host has (by instance key): each gets a host known
/// from the bill alone, so its cost is attributed rather than left aside. Each once, in key
/// order, with the first instance type its lines name.
///
/// Not one of a type that an agent's host without an instance id runs (its metadata could not
/// be read): that host is priced from the rate card and may be this very instance, so its bill
/// stays unattributed rather than counted twice.
pub fn without_host(
    lines: &[StoredCostLine],
    hosts: &[HostRow],
    card: &RateCard,
) -> Vec<BilledHost> {
    let known: HashSet<&str> = hosts
        .iter()
        .filter_map(|h| h.instance_key.as_deref())
        .collect();
    let unmatched_types: HashSet<&str> = hosts
        .iter()
        .filter(|h| !h.from_bill && h.instance_key.is_none())
        .filter_map(|h| h.instance_type.as_deref())
        .collect();
    let mut missing: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for line in lines {
        let Some(key) = line.resource_key.as_deref() else {
            continue;
        };
        let unmatched = line
            .instance_type
            .as_deref()
            .is_some_and(|t| unmatched_types.contains(t));
        if !known.contains(key) && !unmatched && is_gpu_line(line, card) {
            missing.entry(key).or_insert(line.instance_type.as_deref());
        }
    }
    missing
        .into_iter()
        .map(|(key, instance_type)| BilledHost {
            resource_key: key.to_owned(),
            instance_type: instance_type.map(str::to_owned),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only GPU instances (by the rate card or a GPU family) that no host has get a host from
    /// the bill: each once, with the instance type of its first line; none of a type that an
    /// agent's host without an instance id runs (it may be that instance).
    #[test]
    fn gpu_instances_without_a_host_are_listed_once() {
        let line = |key: Option<&str>, instance_type: Option<&str>| StoredCostLine {
            tags_json: "{}".into(),
            commitment_id: None,
            commitment_part: None,
            resource_key: key.map(str::to_owned),
            charge_period_start_ms: 0,
            charge_period_end_ms: 3_600_000,
            charge_category: "Usage".into(),
            billed_cost: rust_decimal::Decimal::ONE,
            effective_cost: rust_decimal::Decimal::ONE,
            currency: "USD".into(),
            pricing_category: "on_demand".into(),
            instance_type: instance_type.map(str::to_owned),
        };
        let lines = [
            line(Some("i-ghost"), Some("p4d.24xlarge")),
            line(Some("i-ghost"), None),
            line(Some("i-known"), Some("p4d.24xlarge")),
            line(Some("i-cpu"), Some("m5.large")),
            line(None, Some("g5.xlarge")),
            line(Some("vm-nc"), Some("Standard_NC24ads_A100_v4")),
            line(Some("bucket"), None),
        ];
        let known = HostRow {
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
        };
        let no_id = HostRow {
            id: 2,
            hostname: "h2".into(),
            instance_key: None,
            instance_type: Some("g5.2xlarge".into()),
            ..known.clone()
        };
        let lines = [
            lines.as_slice(),
            &[line(Some("i-maybe-h2"), Some("g5.2xlarge"))],
        ]
        .concat();
        let missing = without_host(&lines, &[known, no_id], &RateCard::default_card());
        assert_eq!(
            missing,
            [
                BilledHost {
                    resource_key: "i-ghost".into(),
                    instance_type: Some("p4d.24xlarge".into()),
                },
                BilledHost {
                    resource_key: "vm-nc".into(),
                    instance_type: Some("Standard_NC24ads_A100_v4".into()),
                },
            ]
        );
    }

    #[test]
    fn the_catalogue_reads_whole() {
        let c: Catalogue = toml::from_str(CATALOGUE).unwrap();
        for p in &c.patterns {
            glob::Pattern::new(p).unwrap();
        }
        assert_eq!(patterns().len(), c.patterns.len());
    }

    #[test]
    fn gpu_families_of_each_provider_and_nothing_else() {
        for gpu in [
            "g5.4xlarge",
            "p4d.24xlarge",
            "p5.48xlarge",
            "p6-b200.48xlarge",
            "g4dn.xlarge",
            "Standard_NC24ads_A100_v4",
            "standard_nd96isr_h100_v5",
            "Standard_NV36ads_A10_v5",
            "a2-highgpu-8g",
            "a3-megagpu-8g",
            "g2-standard-4",
            "BM.GPU.H100.8",
            "VM.GPU.A10.1",
        ] {
            assert!(is_gpu_instance_type(gpu), "{gpu}");
        }
        for other in [
            "m5.large",
            "inf2.xlarge",
            "trn1.32xlarge",
            "gp3",
            "Standard_D11_v2",
            "n2-standard-8",
            "VM.Standard.E5.Flex",
            "",
        ] {
            assert!(!is_gpu_instance_type(other), "{other}");
        }
    }
}
