//! The GPUs and MIG profiles recommendations can send work to, and which of them an NVML
//! name is.

use rust_decimal::Decimal;
use serde::Serialize;

use crate::ratecard::RateCard;

pub(super) const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// A GPU (or MIG profile) one could run on: what it holds and computes, and an instance type
/// that offers it. Its price is not here: it is the rate card's price of that instance type per
/// GPU ([`CatalogGpu::price`]), so recommendations use the prices the bill is checked against.
#[derive(Debug, Clone, Serialize)]
pub struct CatalogGpu {
    pub name: &'static str,
    pub memory_gb: f64,
    /// Dense FP16 compute, for comparing utilization.
    pub tflops: f64,
    pub instance_type: &'static str,
    /// A MIG profile: its share of the GPU's compute, in sevenths (`3g.40gb` is 3).
    pub mig_sevenths: Option<u32>,
}

const fn gpu(
    name: &'static str,
    memory_gb: f64,
    tflops: f64,
    instance_type: &'static str,
) -> CatalogGpu {
    CatalogGpu {
        name,
        memory_gb,
        tflops,
        instance_type,
        mig_sevenths: None,
    }
}

const fn mig(
    name: &'static str,
    memory_gb: f64,
    full_tflops: f64,
    sevenths: u32,
    instance_type: &'static str,
) -> CatalogGpu {
    CatalogGpu {
        name,
        memory_gb,
        tflops: full_tflops * sevenths as f64 / 7.0,
        instance_type,
        mig_sevenths: Some(sevenths),
    }
}

/// GPUs and MIG profiles (NVIDIA's profile tables) with an AWS instance type offering each.
pub const CATALOG: &[CatalogGpu] = &[
    gpu("T4", 16.0, 65.0, "g4dn.xlarge"),
    gpu("L4", 24.0, 121.0, "g6.xlarge"),
    gpu("A10G", 24.0, 125.0, "g5.xlarge"),
    gpu("L40S", 48.0, 362.0, "g6e.xlarge"),
    mig("A100 40GB MIG 1g.5gb", 5.0, 312.0, 1, "p4d.24xlarge"),
    mig("A100 40GB MIG 2g.10gb", 10.0, 312.0, 2, "p4d.24xlarge"),
    mig("A100 40GB MIG 3g.20gb", 20.0, 312.0, 3, "p4d.24xlarge"),
    gpu("A100 40GB", 40.0, 312.0, "p4d.24xlarge"),
    mig("A100 80GB MIG 1g.10gb", 10.0, 312.0, 1, "p4de.24xlarge"),
    mig("A100 80GB MIG 2g.20gb", 20.0, 312.0, 2, "p4de.24xlarge"),
    mig("A100 80GB MIG 3g.40gb", 40.0, 312.0, 3, "p4de.24xlarge"),
    gpu("A100 80GB", 80.0, 312.0, "p4de.24xlarge"),
    mig("H100 MIG 1g.10gb", 10.0, 989.0, 1, "p5.48xlarge"),
    mig("H100 MIG 2g.20gb", 20.0, 989.0, 2, "p5.48xlarge"),
    mig("H100 MIG 3g.40gb", 40.0, 989.0, 3, "p5.48xlarge"),
    gpu("H100 80GB", 80.0, 989.0, "p5.48xlarge"),
    gpu("H200 141GB", 141.0, 989.0, "p5e.48xlarge"),
];

impl CatalogGpu {
    /// On-demand price per GPU-hour (a MIG profile: its sevenths of one) from the rate card's
    /// instance type; `None` where the rate card does not price that instance type.
    pub fn price(&self, card: &RateCard) -> Option<Decimal> {
        let rate = card.instance_types.get(self.instance_type)?;
        if rate.gpus == 0 {
            return None;
        }
        let per_gpu = rate.on_demand / Decimal::from(rate.gpus);
        Some(match self.mig_sevenths {
            Some(s) => per_gpu * Decimal::from(s) / Decimal::from(7),
            None => per_gpu,
        })
    }

    /// Where it runs, in words: the instance type, and MIG when it is a slice.
    pub fn offered_on(&self) -> String {
        match self.mig_sevenths {
            Some(_) => format!("{} (MIG)", self.instance_type),
            None => self.instance_type.to_owned(),
        }
    }
}

/// The catalog entry an NVML name and memory size describe: a MIG instance (NVML names it
/// `NVIDIA A100-SXM4-80GB MIG 1g.10gb`) is its profile, not the whole GPU.
pub fn identify(nvml_name: &str, memory_total_bytes: Option<i64>) -> Option<&'static CatalogGpu> {
    let n = nvml_name.to_ascii_uppercase();
    let mem_gb = memory_total_bytes.map(|b| b as f64 / GIB);
    let family = ["H200", "H100", "A100", "L40S", "A10G", "L4", "T4"]
        .into_iter()
        .find(|f| n.contains(f))?;
    if n.contains(" MIG") || n.starts_with("MIG") {
        // The profile (`1G.10GB`) and, for the A100, which of its two sizes the profile fits.
        let profile = n
            .split_whitespace()
            .find(|t| t.contains("G.") && t.ends_with("GB"))?
            .split('+')
            .next()?
            .to_owned();
        return CATALOG.iter().find(|c| {
            let upper = c.name.to_ascii_uppercase();
            upper.starts_with(family) && upper.ends_with(&format!("MIG {profile}"))
        });
    }
    CATALOG
        .iter()
        .filter(|c| c.name.starts_with(family) && c.mig_sevenths.is_none())
        .min_by(|a, b| {
            let d = |c: &CatalogGpu| mem_gb.map_or(0.0, |m| (c.memory_gb - m).abs());
            d(a).total_cmp(&d(b))
        })
}
