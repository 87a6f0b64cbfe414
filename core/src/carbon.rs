//! Emissions from the energy NVML measured: kWh × the grid's carbon intensity where each host
//! draws its power (location-based, as the GHG Protocol's Scope 2 guidance calls it). Energy is
//! only what the GPUs' counters measured; where they measured none it is unknown, never 0, and
//! where a host's grid intensity is unknown so are its emissions: nothing is invented.

use std::collections::{BTreeMap, HashMap};

use crate::figures::Sum;
use serde::Deserialize;

/// Grams of CO2e per kWh.
pub type GramsPerKwh = f64;

/// Where a host's grid intensity comes from, most specific first.
#[derive(Debug, Clone, PartialEq)]
pub enum Basis {
    /// Configured for the host's cluster (an on-premises site, a colocation contract).
    Cluster(String),
    /// The table's figure for the host's cloud region.
    Region(String),
    /// The configured default for hosts nothing else names.
    Default,
}

/// Grid carbon intensities: per cluster (configured), per cloud region (the built-in table,
/// which the config may extend or override), and a default, where configured, for the rest.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridTable {
    /// Cluster name → g CO2e/kWh.
    #[serde(default)]
    pub clusters: BTreeMap<String, GramsPerKwh>,
    /// Cloud region (`us-east-1`, `europe-west4`, `westeurope`) → g CO2e/kWh.
    #[serde(default)]
    pub regions: BTreeMap<String, GramsPerKwh>,
    /// For hosts in no listed cluster or region; none by default (their emissions are unknown).
    #[serde(default)]
    pub default_g_per_kwh: Option<GramsPerKwh>,
}

/// Why a grid table is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct GridError {
    pub key: String,
    pub message: String,
}

impl GridTable {
    /// Every figure is a finite, non-negative number of grams per kWh, below what any grid
    /// emits (the dirtiest coal plants are about 1,200): a figure in kg or t per kWh, or a typo,
    /// is refused rather than multiplied.
    pub fn check(&self) -> Result<(), GridError> {
        let named = self
            .clusters
            .iter()
            .map(|(k, v)| (format!("clusters.{k}"), *v))
            .chain(
                self.regions
                    .iter()
                    .map(|(k, v)| (format!("regions.{k}"), *v)),
            )
            .chain(
                self.default_g_per_kwh
                    .map(|v| ("default_g_per_kwh".to_owned(), v)),
            );
        for (key, v) in named {
            if !v.is_finite() || !(0.0..=2000.0).contains(&v) {
                return Err(GridError {
                    key,
                    message: format!(
                        "{v} is not a grid intensity in g CO2e/kWh (0 to 2000; grids emit 0 to about 1,200)"
                    ),
                });
            }
        }
        Ok(())
    }

    /// `self` over `base`: its clusters and regions added to or replacing the base's, its
    /// default where it has one.
    pub fn over(&self, base: &GridTable) -> GridTable {
        let mut out = base.clone();
        out.clusters
            .extend(self.clusters.iter().map(|(k, v)| (k.clone(), *v)));
        out.regions
            .extend(self.regions.iter().map(|(k, v)| (k.clone(), *v)));
        if self.default_g_per_kwh.is_some() {
            out.default_g_per_kwh = self.default_g_per_kwh;
        }
        out
    }

    /// The intensity for a host of `cluster` in `region`, and what it is based on.
    pub fn intensity(&self, cluster: &str, region: Option<&str>) -> Option<(GramsPerKwh, Basis)> {
        if let Some(g) = self.clusters.get(cluster) {
            return Some((*g, Basis::Cluster(cluster.to_owned())));
        }
        if let Some((r, g)) = region.and_then(|r| self.regions.get_key_value(r)) {
            return Some((*g, Basis::Region(r.clone())));
        }
        self.default_g_per_kwh.map(|g| (g, Basis::Default))
    }
}

/// Each host's grid intensity, by host id: what allocation multiplies its energy by.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grid {
    by_host: HashMap<i64, GramsPerKwh>,
}

impl Grid {
    /// No intensity for any host: emissions unknown everywhere.
    pub fn unknown() -> Grid {
        Grid::default()
    }

    /// The intensities of `hosts`, given as `(id, cluster, region)`.
    pub fn of_hosts<'a>(
        table: &GridTable,
        hosts: impl IntoIterator<Item = (i64, &'a str, Option<&'a str>)>,
    ) -> Grid {
        Grid {
            by_host: hosts
                .into_iter()
                .filter_map(|(id, cluster, region)| {
                    table.intensity(cluster, region).map(|(g, _)| (id, g))
                })
                .collect(),
        }
    }

    pub fn of(&self, host_id: i64) -> Option<GramsPerKwh> {
        self.by_host.get(&host_id).copied()
    }
}

/// Energy and emissions summed over parts (in any order: [`Sum`]): what a row of allocation
/// says about them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Footprint {
    /// Joules measured.
    pub energy_j: Sum,
    /// GPU-seconds whose energy was measured, and all GPU-seconds.
    pub measured_seconds: Sum,
    pub gpu_seconds: Sum,
    /// Grams of CO2e of the measured energy whose grid intensity is known, and that energy.
    pub co2e_g: Sum,
    pub co2e_energy_j: Sum,
}

impl Footprint {
    pub fn add(
        &mut self,
        energy_j: f64,
        measured_seconds: f64,
        gpu_seconds: f64,
        grid: Option<GramsPerKwh>,
    ) {
        self.energy_j += energy_j;
        self.measured_seconds += measured_seconds;
        self.gpu_seconds += gpu_seconds;
        if let Some(g) = grid {
            self.co2e_g += energy_j / 3.6e6 * g;
            self.co2e_energy_j += energy_j;
        }
    }

    /// Adds another sum's figures to this one.
    pub fn merge(&mut self, other: &Footprint) {
        self.energy_j += other.energy_j;
        self.measured_seconds += other.measured_seconds;
        self.gpu_seconds += other.gpu_seconds;
        self.co2e_g += other.co2e_g;
        self.co2e_energy_j += other.co2e_energy_j;
    }

    /// kWh measured; `None` where none of the GPU time was (unknown, not 0).
    pub fn energy_kwh(&self) -> Option<f64> {
        (self.measured_seconds.get() > 0.0).then(|| self.energy_j.get() / 3.6e6)
    }

    /// The share of the GPU time the energy covers (0..=1): below 1, the kWh are a floor.
    pub fn measured_share(&self) -> Option<f64> {
        (self.gpu_seconds.get() > 0.0)
            .then(|| (self.measured_seconds.get() / self.gpu_seconds.get()).min(1.0))
    }

    /// kg CO2e of the measured energy; `None` where no energy was measured, or some of it was
    /// drawn where the grid's intensity is unknown (a partial sum would read as the whole).
    pub fn kg_co2e(&self) -> Option<f64> {
        let all_known = self.co2e_energy_j.get() >= self.energy_j.get() * (1.0 - 1e-9);
        (self.measured_seconds.get() > 0.0 && all_known).then(|| self.co2e_g.get() / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> GridTable {
        GridTable {
            clusters: BTreeMap::from([("onprem".to_owned(), 50.0)]),
            regions: BTreeMap::from([("us-east-1".to_owned(), 379.1)]),
            default_g_per_kwh: None,
        }
    }

    #[test]
    fn a_cluster_beats_its_region_and_nothing_is_guessed() {
        let t = table();
        assert_eq!(
            t.intensity("onprem", Some("us-east-1")),
            Some((50.0, Basis::Cluster("onprem".into())))
        );
        assert_eq!(
            t.intensity("train", Some("us-east-1")),
            Some((379.1, Basis::Region("us-east-1".into())))
        );
        assert_eq!(t.intensity("train", Some("mars-north-1")), None);
        assert_eq!(t.intensity("train", None), None);
        let with_default = GridTable {
            default_g_per_kwh: Some(400.0),
            ..GridTable::default()
        }
        .over(&t);
        assert_eq!(
            with_default.intensity("train", None),
            Some((400.0, Basis::Default))
        );
        assert_eq!(with_default.regions.len(), 1);
    }

    #[test]
    fn figures_out_of_any_grids_range_are_refused() {
        let mut t = table();
        assert_eq!(t.check(), Ok(()));
        t.regions.insert("eu-west-1".into(), 0.000_278_6);
        assert_eq!(t.check(), Ok(()), "small but a number of grams");
        t.regions.insert("eu-west-2".into(), 278_600.0);
        assert_eq!(t.check().unwrap_err().key, "regions.eu-west-2");
        t.regions.remove("eu-west-2");
        t.default_g_per_kwh = Some(f64::NAN);
        assert_eq!(t.check().unwrap_err().key, "default_g_per_kwh");
    }

    #[test]
    fn unknown_energy_is_unknown_and_partial_intensity_gives_no_total() {
        let mut f = Footprint::default();
        f.add(0.0, 0.0, 3600.0, Some(400.0));
        assert_eq!(f.energy_kwh(), None, "no GPU measured: unknown, not 0 kWh");
        assert_eq!(f.kg_co2e(), None);
        assert_eq!(f.measured_share(), Some(0.0));
        // One hour measured at 1 kWh on a 400 g grid, one not measured.
        f.add(3.6e6, 3600.0, 3600.0, Some(400.0));
        assert_eq!(f.energy_kwh(), Some(1.0));
        assert_eq!(f.measured_share(), Some(0.5));
        assert_eq!(f.kg_co2e(), Some(0.4));
        // Another kWh where the grid is unknown: no total that leaves it out.
        f.add(3.6e6, 3600.0, 3600.0, None);
        assert_eq!(f.energy_kwh(), Some(2.0));
        assert_eq!(f.kg_co2e(), None);
    }
}
