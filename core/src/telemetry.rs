//! Telemetry as attribution, incidents and recommendations read it: hosts, GPU windows and
//! process windows. Storage fills them; nothing here reads a database.

/// A GPU window with its host, for attribution.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AttributionWindow {
    pub host_id: i64,
    pub gpu_uuid: String,
    pub parent_uuid: Option<String>,
    pub gpu_name: Option<String>,
    pub start_ms: i64,
    pub end_ms: i64,
    pub memory_total_bytes: Option<i64>,
    pub util_avg: Option<f64>,
    /// Samples per utilization percent (`[[percent, samples], …]` JSON), where measured: splits
    /// a partly busy window ([`crate::activity::Thresholds::split`]).
    pub util_histogram: Option<String>,
    /// Energy inside the window (NVML's counter, physical GPUs only).
    pub energy_mj: Option<i64>,
    /// MIG, where the agent reported it: a GPU in MIG mode has its compute slices; a MIG device
    /// its GPU instance (id and compute slices) and the slices of it its compute instance has.
    pub mig: MigFacts,
    /// Memory held by processes the agent cannot see (another PID namespace's), where reported.
    pub unseen_memory_bytes: Option<i64>,
    /// Why the agent cannot see them, where it knows (`pid_namespace`, `no_permission`).
    pub unseen_cause: Option<String>,
    /// What went wrong with the device, where something did: a code of
    /// `gpuledger_proto::DEVICE_FAULT_CODES` and its meaning in words.
    pub fault: Option<Fault>,
}

/// A window's MIG facts (all `None` outside MIG, and in reports of agents that predate them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MigFacts {
    /// On a GPU in MIG mode: its compute slices (7 on A100 and H100, 4 on A30).
    pub gpu_slices: Option<i64>,
    /// On a MIG device: its GPU instance's id and compute slices.
    pub gpu_instance_id: Option<i64>,
    pub instance_slices: Option<i64>,
    /// On a MIG device: the compute slices its compute instance has of its GPU instance.
    pub compute_slices: Option<i64>,
}

/// A device fault as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub code: String,
    pub detail: String,
}

/// A process's window on a GPU, with its owner labels.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredProcessWindow {
    pub gpu_uuid: String,
    pub start_ms: i64,
    pub pid: i64,
    pub process_name: Option<String>,
    pub memory_used_max_bytes: Option<i64>,
    pub sm_util_avg: Option<f64>,
    /// Every label the agent read from the process's environment, as a JSON object: owner
    /// dimensions read theirs from it (`core::owners`).
    pub labels_json: String,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// The Unix account running the process, where the agent reported it.
    pub user_name: Option<String>,
}

/// A GPU host as its agent describes it, or as the bill names it where no agent reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostRow {
    pub id: i64,
    pub cluster: String,
    pub hostname: String,
    pub provider: Option<String>,
    pub instance_id: Option<String>,
    pub instance_key: Option<String>,
    pub instance_type: Option<String>,
    /// on_demand or spot, where the agent knows.
    pub lifecycle: Option<String>,
    /// The cloud region its agent reports (`us-east-1`), where it knows: whose grid it draws on.
    pub region: Option<String>,
    /// Known from the bill alone: a GPU instance the bill charges and no agent has reported
    /// (its cluster is [`BILLED_ONLY_CLUSTER`], its name the bill's resource id).
    pub from_bill: bool,
}

/// The cluster of hosts known from the bill alone: what a page groups them under.
pub const BILLED_ONLY_CLUSTER: &str = "(no agent)";

/// A GPU's usage rollups (windows per owner and utilization band) summed over a range, with
/// the GPU's model from its latest report.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageTotal {
    pub host_id: i64,
    pub gpu_uuid: String,
    pub owner_by: String,
    pub owner_key: String,
    pub util_band: i64,
    pub windows: i64,
    pub peak_memory_bytes: i64,
    pub gpu_name: Option<String>,
    pub memory_total_bytes: Option<i64>,
    /// Set for a MIG instance.
    pub parent_uuid: Option<String>,
}

/// A GPU as people name it on its host: its NVML index (`#3`); a MIG instance also by the end
/// of its UUID (`#3 MIG …a1b2c3`, the index is its GPU's); the end of its UUID where the index
/// is unknown.
pub fn gpu_label(index: Option<i64>, uuid: &str, mig: bool) -> String {
    let tail = |n: usize| {
        let t: String = uuid.chars().rev().take(n).collect();
        t.chars().rev().collect::<String>()
    };
    match (index, mig) {
        (Some(i), false) => format!("#{i}"),
        (Some(i), true) => format!("#{i} MIG …{}", tail(6)),
        (None, _) => format!("…{}", tail(8)),
    }
}
