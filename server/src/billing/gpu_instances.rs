//! Which instance types carry GPUs, beyond the ones the rate card prices: a catalogue of the
//! providers' GPU instance families (`gpu_instances.toml`), so a bill's GPU host that no agent
//! reports is told from storage, network and CPU hosts whatever the rate card lists.

use std::sync::OnceLock;

use serde::Deserialize;

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

#[cfg(test)]
mod tests {
    use super::*;

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
