//! When a GPU counts as idle: the thresholds per cluster, as the server's config file sets them
//! (`[idle]`). Attribution, incidents and recommendations all read them from here.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleConfig {
    /// A GPU under this utilization (%) is idle.
    #[serde(default = "default_threshold")]
    pub threshold_percent: f64,
    /// ... once it has stayed idle this long.
    #[serde(default = "default_duration", with = "humantime_serde")]
    pub duration: Duration,
    /// A process under this SM utilization (%) that holds memory is holding the GPU idle.
    #[serde(default = "default_held")]
    pub held_sm_percent: f64,
    /// Per-cluster overrides.
    #[serde(default)]
    pub clusters: BTreeMap<String, IdleOverride>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleOverride {
    pub threshold_percent: Option<f64>,
    #[serde(default, with = "humantime_serde::option")]
    pub duration: Option<Duration>,
}

fn default_threshold() -> f64 {
    5.0
}
fn default_duration() -> Duration {
    Duration::from_secs(30 * 60)
}
fn default_held() -> f64 {
    1.0
}

impl Default for IdleConfig {
    fn default() -> Self {
        IdleConfig {
            threshold_percent: default_threshold(),
            duration: default_duration(),
            held_sm_percent: default_held(),
            clusters: BTreeMap::new(),
        }
    }
}

impl IdleConfig {
    /// (threshold %, duration) for a cluster.
    pub fn for_cluster(&self, cluster: &str) -> (f64, Duration) {
        let o = self.clusters.get(cluster);
        (
            o.and_then(|o| o.threshold_percent)
                .unwrap_or(self.threshold_percent),
            o.and_then(|o| o.duration).unwrap_or(self.duration),
        )
    }

    /// The thresholds that decide busy, held idle and idle for a cluster's windows.
    pub fn thresholds(&self, cluster: &str) -> crate::activity::Thresholds {
        crate::activity::Thresholds {
            busy_gpu_percent: self.for_cluster(cluster).0,
            working_sm_percent: self.held_sm_percent,
        }
    }

    /// The longest idle duration any cluster needs, to know how far back to look.
    pub fn longest_duration(&self) -> Duration {
        self.clusters
            .values()
            .filter_map(|o| o.duration)
            .fold(self.duration, Duration::max)
    }
}
