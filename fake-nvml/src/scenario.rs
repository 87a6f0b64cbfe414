//! The scenario file that drives the fake NVML: GPUs, MIG instances, and what runs on them over time.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default = "default_driver")]
    pub driver_version: String,
    pub gpus: Vec<Gpu>,
}

fn default_driver() -> String {
    "550.54.15-fake".into()
}

fn yes() -> bool {
    true
}

/// A physical GPU.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
    /// Power draw in milliwatts when a phase does not say; absent means "not supported".
    #[serde(default)]
    pub power_mw: Option<u32>,
    #[serde(default)]
    pub temperature_c: Option<u32>,
    /// Energy counter at nvmlInit in millijoules; absent means the counter is not supported.
    #[serde(default)]
    pub energy_start_mj: Option<u64>,
    #[serde(default = "yes")]
    pub process_utilization: bool,
    /// Whether the GPU supports MIG at all (A100/H100); MIG mode is on when `mig` is not empty.
    #[serde(default)]
    pub mig_capable: bool,
    #[serde(default)]
    pub mig: Vec<MigInstance>,
    /// GPU Performance Monitoring (Hopper and newer): the only source of a MIG instance's
    /// utilization, since the driver refuses utilization rates on MIG handles.
    #[serde(default)]
    pub gpm: bool,
    #[serde(default)]
    pub phases: Vec<Phase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigInstance {
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
    pub gpu_instance_id: u32,
    #[serde(default)]
    pub phases: Vec<Phase>,
}

/// What a device does from `at_s` seconds after nvmlInit until the next phase begins.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    #[serde(default)]
    pub at_s: f64,
    /// Absent means the device does not report utilization (NVML_ERROR_NOT_SUPPORTED).
    #[serde(default)]
    pub gpu_util: Option<u32>,
    #[serde(default)]
    pub mem_util: Option<u32>,
    #[serde(default)]
    pub memory_used_bytes: u64,
    #[serde(default)]
    pub power_mw: Option<u32>,
    #[serde(default)]
    pub processes: Vec<Process>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub pid: u32,
    #[serde(default)]
    pub name: Option<String>,
    pub memory_used_bytes: u64,
    #[serde(default)]
    pub sm_util: u32,
    #[serde(default)]
    pub mem_util: u32,
}

pub fn gpu_handle(index: usize) -> usize {
    (index + 1) << 8
}

impl Scenario {
    pub fn from_env() -> Result<Scenario, String> {
        let path = std::env::var("FAKE_NVML_SCENARIO")
            .map_err(|_| "FAKE_NVML_SCENARIO is not set".to_string())?;
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))
    }

    pub fn device_by_handle(&self, handle: usize) -> Option<Device<'_>> {
        let gpu_index = (handle >> 8).checked_sub(1)?;
        let gpu = self.gpus.get(gpu_index)?;
        match (handle & 0xff).checked_sub(1) {
            None => Some(Device::Gpu {
                gpu,
                index: gpu_index,
            }),
            Some(mig_index) => Some(Device::Mig {
                gpu,
                gpu_index,
                instance: gpu.mig.get(mig_index)?,
            }),
        }
    }

    /// The name of a process as the scenario gives it, looked up across every device.
    pub fn process_name(&self, pid: u32) -> Option<String> {
        let phases = self.gpus.iter().flat_map(|g| {
            g.phases
                .iter()
                .chain(g.mig.iter().flat_map(|m| m.phases.iter()))
        });
        phases
            .flat_map(|p| p.processes.iter())
            .find(|p| p.pid == pid)
            .and_then(|p| p.name.clone())
    }
}

fn phase_at(phases: &[Phase], t: f64) -> Option<&Phase> {
    phases.iter().rev().find(|p| p.at_s <= t).or(phases.first())
}

/// Energy in mJ used from 0 to `t` seconds: the integral of each phase's power over its span.
fn energy_used_mj(phases: &[Phase], base_mw: Option<u32>, t: f64) -> f64 {
    if phases.is_empty() {
        return base_mw.unwrap_or(0) as f64 * t;
    }
    let mut total = 0.0;
    for (i, phase) in phases.iter().enumerate() {
        let start = if i == 0 { 0.0 } else { phase.at_s.min(t) };
        let end = phases.get(i + 1).map_or(t, |next| next.at_s.min(t));
        let mw = phase.power_mw.or(base_mw).unwrap_or(0) as f64;
        total += mw * (end - start).max(0.0);
    }
    total
}

pub enum Device<'a> {
    Gpu {
        gpu: &'a Gpu,
        index: usize,
    },
    Mig {
        gpu: &'a Gpu,
        gpu_index: usize,
        instance: &'a MigInstance,
    },
}

impl Device<'_> {
    pub fn name(&self) -> &str {
        match self {
            Device::Gpu { gpu, .. } => &gpu.name,
            Device::Mig { instance, .. } => &instance.name,
        }
    }

    pub fn uuid(&self) -> &str {
        match self {
            Device::Gpu { gpu, .. } => &gpu.uuid,
            Device::Mig { instance, .. } => &instance.uuid,
        }
    }

    pub fn index(&self) -> usize {
        match self {
            Device::Gpu { index, .. } => *index,
            Device::Mig { gpu_index, .. } => *gpu_index,
        }
    }

    pub fn is_mig(&self) -> bool {
        matches!(self, Device::Mig { .. })
    }

    fn phases(&self) -> &[Phase] {
        match self {
            Device::Gpu { gpu, .. } => &gpu.phases,
            Device::Mig { instance, .. } => &instance.phases,
        }
    }

    fn gpu(&self) -> &Gpu {
        match self {
            Device::Gpu { gpu, .. } | Device::Mig { gpu, .. } => gpu,
        }
    }

    pub fn memory_total_bytes(&self) -> u64 {
        match self {
            Device::Gpu { gpu, .. } => gpu.memory_total_bytes,
            Device::Mig { instance, .. } => instance.memory_total_bytes,
        }
    }

    pub fn memory_used_bytes(&self, t: f64) -> u64 {
        match self {
            // A MIG-mode GPU's memory in use is what its instances hold.
            Device::Gpu { gpu, .. } if !gpu.mig.is_empty() => gpu
                .mig
                .iter()
                .filter_map(|m| phase_at(&m.phases, t))
                .map(|p| p.memory_used_bytes)
                .sum(),
            _ => phase_at(self.phases(), t).map_or(0, |p| p.memory_used_bytes),
        }
    }

    /// (gpu %, memory-controller %), as nvmlDeviceGetUtilizationRates gives it. Like the real
    /// driver: a MIG-mode parent reads 0, and a MIG instance is not supported (`None`).
    pub fn utilization(&self, t: f64) -> Option<(u32, u32)> {
        match self {
            Device::Gpu { gpu, .. } if !gpu.mig.is_empty() => Some((0, 0)),
            Device::Mig { .. } => None,
            Device::Gpu { .. } => self.activity(t),
        }
    }

    /// What the device is doing at `t`: (gpu %, memory %), the source of GPM metrics.
    pub fn activity(&self, t: f64) -> Option<(u32, u32)> {
        let phase = phase_at(self.phases(), t)?;
        Some((phase.gpu_util?, phase.mem_util.unwrap_or(0)))
    }

    pub fn gpm_supported(&self) -> bool {
        self.gpu().gpm
    }

    /// The MIG instance of this (parent) GPU with the given GPU instance id, as a handle.
    pub fn mig_handle_by_instance_id(&self, gpu_instance_id: u32) -> Option<usize> {
        let position = self
            .gpu()
            .mig
            .iter()
            .position(|m| m.gpu_instance_id == gpu_instance_id)?;
        self.mig_handle(position)
    }

    pub fn power_mw(&self, t: f64) -> Option<u32> {
        match self {
            Device::Gpu { gpu, .. } => phase_at(&gpu.phases, t)
                .and_then(|p| p.power_mw)
                .or(gpu.power_mw),
            Device::Mig { .. } => None,
        }
    }

    pub fn temperature_c(&self, _t: f64) -> Option<u32> {
        match self {
            Device::Gpu { gpu, .. } => gpu.temperature_c,
            Device::Mig { .. } => None,
        }
    }

    pub fn energy_mj(&self, t: f64) -> Option<u64> {
        match self {
            Device::Gpu { gpu, .. } => gpu
                .energy_start_mj
                .map(|start| start + energy_used_mj(&gpu.phases, gpu.power_mw, t) as u64),
            Device::Mig { .. } => None,
        }
    }

    pub fn supports_process_utilization(&self) -> bool {
        self.gpu().process_utilization
    }

    /// Processes running now; a MIG-mode parent lists those of all its instances.
    pub fn processes(&self, t: f64) -> Vec<Process> {
        match self {
            Device::Gpu { gpu, .. } if !gpu.mig.is_empty() => gpu
                .mig
                .iter()
                .filter_map(|m| phase_at(&m.phases, t))
                .flat_map(|p| p.processes.iter().cloned())
                .collect(),
            _ => phase_at(self.phases(), t).map_or_else(Vec::new, |p| p.processes.clone()),
        }
    }

    pub fn mig_enabled(&self) -> Option<bool> {
        let gpu = self.gpu();
        match self {
            Device::Gpu { .. } if gpu.mig_capable || !gpu.mig.is_empty() => {
                Some(!gpu.mig.is_empty())
            }
            _ => None,
        }
    }

    pub fn mig_instance_count(&self) -> usize {
        self.gpu().mig.len()
    }

    pub fn mig_handle(&self, mig_index: usize) -> Option<usize> {
        match self {
            Device::Gpu { gpu, index } if mig_index < gpu.mig.len() => {
                Some(gpu_handle(*index) | (mig_index + 1))
            }
            _ => None,
        }
    }

    pub fn parent_handle(&self) -> Option<usize> {
        match self {
            Device::Mig { gpu_index, .. } => Some(gpu_handle(*gpu_index)),
            Device::Gpu { .. } => None,
        }
    }

    pub fn gpu_instance_id(&self) -> Option<u32> {
        match self {
            Device::Mig { instance, .. } => Some(instance.gpu_instance_id),
            Device::Gpu { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(at_s: f64, power_mw: u32) -> Phase {
        Phase {
            at_s,
            power_mw: Some(power_mw),
            ..Default::default()
        }
    }

    #[test]
    fn energy_integrates_power_over_phases() {
        let phases = vec![phase(0.0, 100_000), phase(10.0, 300_000)];
        // 10 s at 100 W, then 5 s at 300 W = 1,000 J + 1,500 J.
        assert_eq!(energy_used_mj(&phases, None, 15.0), 2_500_000.0);
        assert_eq!(energy_used_mj(&phases, None, 5.0), 500_000.0);
    }

    #[test]
    fn the_phase_in_force_is_the_latest_started() {
        let phases = vec![phase(0.0, 1), phase(10.0, 2)];
        assert_eq!(phase_at(&phases, 9.9).and_then(|p| p.power_mw), Some(1));
        assert_eq!(phase_at(&phases, 10.0).and_then(|p| p.power_mw), Some(2));
    }
}
