//! Wire types shared by the gpuledger agent and server.
//!
//! A [`Report`] is one batch: the agent writes it to its spool before sending, and the server
//! stores it at most once, keyed by `batch_id`. Every measured value is an `Option`: a value the
//! driver could not give is absent, never a misleading 0.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Path the agent posts reports to.
pub const REPORTS_PATH: &str = "/api/v1/reports";
/// Header with the number of batches waiting in the agent's spool when this one was sent.
pub const SPOOL_DEPTH_HEADER: &str = "x-gpuledger-spool-depth";
/// Header with the number of batches the agent has dropped because its spool was full.
pub const SPOOL_DROPPED_HEADER: &str = "x-gpuledger-spool-dropped";

/// Well-known owner label keys; the agent reads them from `GPULEDGER_<KEY>` in a process's environment.
pub const OWNER_KEYS: [&str; 4] = ["model", "experiment", "endpoint", "team"];

/// The causes an agent gives in `ProcessWindow::owner_unknown` (docs/owners.md says each one's
/// meaning). The server counts any other text as `other`, so a report cannot add series.
pub const OWNER_UNKNOWN_CAUSES: [&str; 12] = [
    "cgroup_unreadable",
    "kube_api_error",
    "kube_api_stale",
    "kube_pod_unknown",
    "kubelet_no_socket",
    "kubelet_timeout",
    "kubelet_error",
    "k8s_gpu_shared",
    "slurm_not_installed",
    "slurm_timeout",
    "slurm_error",
    "slurm_job_not_found",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Unique per batch; the server acknowledges a repeat without storing it again.
    pub batch_id: String,
    pub agent_version: String,
    pub host: HostInfo,
    pub windows: Vec<Window>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostInfo {
    pub hostname: String,
    pub cluster: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// How the instance is bought: `on_demand` or `spot`; prices hosts that have no bill yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<String>,
}

/// One aggregation window (default 15 s) over the samples taken inside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Epoch milliseconds, inclusive.
    pub start_ms: i64,
    /// Epoch milliseconds, exclusive.
    pub end_ms: i64,
    /// How many samples the window aggregates.
    pub samples: u32,
    pub gpus: Vec<GpuWindow>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuWindow {
    /// NVML UUID (`GPU-…`, or `MIG-…` for a MIG instance).
    pub uuid: String,
    pub index: u32,
    pub name: String,
    /// For a MIG instance, the UUID of its physical GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_max_bytes: Option<u64>,
    /// GPU utilization in percent, 0..=100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub util_avg: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub util_max: Option<f64>,
    /// How many of the window's samples read each GPU utilization percent, as `[percent, count]`
    /// pairs in rising percent order (only the percents seen). The server splits a partly busy
    /// window by it, at each cluster's own threshold. Empty when not measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub util_histogram: Vec<(u32, u32)>,
    /// Memory-controller utilization in percent, 0..=100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_util_avg: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_avg_watts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_max_c: Option<f64>,
    /// Energy used inside the window, in millijoules, from NVML's energy counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_mj: Option<u64>,
    #[serde(default)]
    pub processes: Vec<ProcessWindow>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessWindow {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_max_bytes: Option<u64>,
    /// Average SM utilization in percent over the samples NVML gave in this window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_util_avg: Option<f64>,
    /// Owner labels: `model`, `experiment`, `endpoint`, `team`, plus extra keys from config.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The Unix account running the process (its real uid's name, or `uid 1234` when the agent
    /// cannot resolve it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Why part of the owner could not be read (e.g. `slurm_timeout`: the process is in a Slurm
    /// job the controller did not describe in time); absent when nothing was missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_unknown: Option<String>,
}

/// What the server answers to an accepted report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IngestAck {
    pub batch_id: String,
    /// `stored`, or `duplicate` when this batch id was stored before.
    pub status: String,
    pub windows: usize,
}

/// The server's JSON error body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiErrorBody {
    pub error: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_values_are_omitted_not_zero() {
        let gpu = GpuWindow {
            uuid: "GPU-1".into(),
            name: "T4".into(),
            util_avg: Some(12.5),
            ..Default::default()
        };
        let json = serde_json::to_value(&gpu).unwrap();
        assert_eq!(json["util_avg"], 12.5);
        assert!(json.get("power_avg_watts").is_none());
        let back: GpuWindow = serde_json::from_value(json).unwrap();
        assert_eq!(back, gpu);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_json::from_str::<HostInfo>(r#"{"hostname":"h","cluster":"c","bogus":1}"#)
            .unwrap_err();
        assert!(err.to_string().contains("bogus"));
    }
}
