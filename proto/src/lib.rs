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

/// Memory in use on a device beyond what the processes the agent can see hold, from which on it
/// is taken for processes the agent cannot see (a CUDA context alone takes a few hundred MiB;
/// drivers and display servers stay under it).
pub const UNSEEN_MEMORY_FLOOR_BYTES: u64 = 256 << 20;

/// Why an agent cannot see some processes on a device (`GpuWindow::unseen_cause`).
pub const UNSEEN_CAUSES: [&str; 2] = [
    // The agent runs in a PID namespace of its own (a container without the host's PIDs).
    "pid_namespace",
    // NVML refused to list the device's processes.
    "no_permission",
];

/// What went wrong with a device (`DeviceFault::code`).
pub const DEVICE_FAULT_CODES: [&str; 4] = [
    // NVML answers GPU_IS_LOST: the GPU fell off the bus.
    "gpu_lost",
    // The driver reported a critical XID error: the GPU needs a reset or a reboot.
    "xid",
    // The driver is away (unloaded, reloading, or NVML cannot initialise).
    "driver_unavailable",
    // Another NVML error for this device alone.
    "nvml_error",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Unique per batch; the server acknowledges a repeat without storing it again.
    pub batch_id: String,
    pub agent_version: String,
    pub host: HostInfo,
    pub windows: Vec<Window>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Epoch milliseconds, inclusive.
    pub start_ms: i64,
    /// Epoch milliseconds, exclusive.
    pub end_ms: i64,
    /// How many samples the window aggregates.
    pub samples: u32,
    pub gpus: Vec<GpuWindow>,
    /// Work the host's serving engines counted in the window (their Prometheus counters'
    /// increase since the agent last read them), where the agent is told to read them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serving: Vec<ServingWindow>,
}

/// The serving engines the agent reads (`ServingWindow::engine`).
pub const SERVING_ENGINES: [&str; 3] = ["vllm", "tgi", "triton"];

/// Requests and tokens one endpoint (and model) served in a window, read from its engine's
/// counters. A count the engine does not expose is absent, never 0.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ServingWindow {
    /// The endpoint as the endpoint owner dimension names it (`chat-api`): the agent's
    /// configuration says which engine serves which endpoint.
    pub endpoint: String,
    /// The model the engine names in its metrics (vLLM's `model_name`, Triton's `model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// One of [`SERVING_ENGINES`].
    pub engine: String,
    /// Requests completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    /// Prompt tokens read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Tokens generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// For a MIG device: where it sits on its GPU, which the GPU's cost is shared by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigPlacement>,
    /// For a GPU in MIG mode: its compute slices (7 on A100 and H100, 4 on A30). Slices no
    /// MIG device holds are idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_compute_slices: Option<u32>,
    /// Memory in use beyond what the processes listed hold, the least any sample of the window
    /// saw (what processes the agent cannot see hold steadily), where at least 256 MiB
    /// (`UNSEEN_MEMORY_FLOOR_BYTES`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unseen_memory_bytes: Option<u64>,
    /// Why the agent cannot see some processes, where it knows (`UNSEEN_CAUSES`): `pid_namespace`
    /// or `no_permission`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unseen_cause: Option<String>,
    /// What went wrong with the device in the window, where something did: a lost GPU is still
    /// reported, with no readings, so its time is accounted for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<DeviceFault>,
}

/// Where a MIG device sits on its GPU: its GPU instance and compute instance, and the compute
/// slices of each (a `3g.40gb` instance split in a 1-slice and a 2-slice compute instance has
/// two devices with `gpu_instance_slices` 3 and `compute_instance_slices` 1 and 2).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MigPlacement {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// The profile as the driver names the device (`3g.40gb`, or `1c.3g.40gb` for part of one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    pub gpu_instance_slices: u32,
    pub compute_instance_slices: u32,
}

/// A device fault: its code (`DEVICE_FAULT_CODES`: `gpu_lost`, `xid`, `driver_unavailable` or
/// `nvml_error`) and what it means, in words.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DeviceFault {
    pub code: String,
    /// For people: `XID 79: the GPU has fallen off the bus`.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IngestAck {
    pub batch_id: String,
    /// `stored`, or `duplicate` when this batch id was stored before.
    pub status: String,
    pub windows: usize,
}

/// The server's JSON error body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiErrorBody {
    /// What went wrong, for code: `bad_request`, `unauthorized`, `forbidden`, `out_of_scope`,
    /// `not_found`, `method_not_allowed`, `conflict`, `too_large`, `invalid`, `internal` or
    /// `unavailable`.
    pub error: String,
    /// What went wrong, for people.
    pub message: String,
    /// The parameter or body field at fault, where one is (`month`, `windows[0].gpus[1].util_avg`).
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
