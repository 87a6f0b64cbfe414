//! The scenario file that drives the fake NVML: which machine it is (each GPU a model from the
//! catalogue, MIG instances by profile), what runs on it over time, and the faults it suffers.
//!
//! A scenario names *what happens*; what NVML answers about it (which calls are supported, the
//! memory sizes, MIG ids and profile details) comes from the model, as on real hardware.

use serde::Deserialize;

use crate::catalogue::{self, GiProfile, MigTable, Model};

const MIB: u64 = 1 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    #[serde(default = "default_driver")]
    driver_version: String,
    /// Faults of the whole driver (it is unloaded for a while, or NVML cannot initialise).
    #[serde(default)]
    faults: Vec<LibraryFault>,
    gpus: Vec<GpuSpec>,
}

fn default_driver() -> String {
    "550.54.15".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuSpec {
    /// A model of the catalogue, by the name its driver gives it (`NVIDIA H100 80GB HBM3`).
    model: String,
    uuid: String,
    /// The name an older driver gives the board, where it differs from the model's.
    #[serde(default)]
    name: Option<String>,
    /// The total a driver that counts otherwise reports (older drivers left reserved memory
    /// out of an A100's 40,960 MiB, say).
    #[serde(default)]
    memory_total_bytes: Option<u64>,
    /// Memory the driver keeps for itself: it varies with driver version and ECC mode.
    #[serde(default)]
    memory_reserved_bytes: Option<u64>,
    /// Power draw when a phase does not say, on boards with a power sensor.
    #[serde(default)]
    power_mw: Option<u32>,
    #[serde(default)]
    temperature_c: Option<u32>,
    /// The energy counter at the start, on Volta and newer.
    #[serde(default)]
    energy_start_mj: Option<u64>,
    /// MIG mode; on when any instance is given.
    #[serde(default)]
    mig_mode: Option<bool>,
    #[serde(default)]
    mig: Vec<GpuInstanceSpec>,
    #[serde(default)]
    phases: Vec<Phase>,
    #[serde(default)]
    faults: Vec<GpuFault>,
}

/// A MIG GPU instance, by profile name (`3g.40gb`), with one compute instance spanning it
/// unless `compute_instances` splits it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuInstanceSpec {
    profile: String,
    gpu_instance_id: u32,
    /// The MIG device's UUID where one compute instance spans the GPU instance.
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default)]
    phases: Vec<Phase>,
    #[serde(default)]
    compute_instances: Vec<ComputeInstanceSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComputeInstanceSpec {
    compute_instance_id: u32,
    /// Compute slices of its GPU instance it takes (`1` of a `3g`).
    slices: u32,
    uuid: String,
    #[serde(default)]
    phases: Vec<Phase>,
}

/// What a device does from `at_s` seconds after the first `nvmlInit` until the next phase.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    #[serde(default)]
    pub at_s: f64,
    /// GPU activity in percent (what utilization rates, and GPM where the GPU has it, read);
    /// 0 when absent.
    #[serde(default)]
    pub gpu_util: Option<u32>,
    #[serde(default)]
    pub mem_util: Option<u32>,
    /// Memory in use on the device; by default what its processes hold. Processes NVML does not
    /// list (another PID namespace's) show only here.
    #[serde(default)]
    pub memory_used_bytes: Option<u64>,
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
    /// `C` (compute, the default), `G` (graphics) or `C+G`, as nvidia-smi lists them.
    #[serde(default, rename = "type")]
    pub kind: ProcessKind,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProcessKind {
    #[default]
    #[serde(rename = "C")]
    Compute,
    #[serde(rename = "G")]
    Graphics,
    #[serde(rename = "C+G")]
    Both,
}

impl ProcessKind {
    pub fn compute(self) -> bool {
        self != ProcessKind::Graphics
    }

    pub fn graphics(self) -> bool {
        self != ProcessKind::Compute
    }
}

/// A fault of one GPU from `at_s` (until `until_s`, if it recovers).
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct GpuFault {
    pub at_s: f64,
    #[serde(default)]
    pub until_s: Option<f64>,
    pub kind: GpuFaultKind,
    /// For `xid`: the XID the driver reports (79: fallen off the bus, 48: double-bit ECC…).
    #[serde(default)]
    pub xid: Option<u64>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GpuFaultKind {
    /// Every call on the GPU answers NVML_ERROR_GPU_IS_LOST (it fell off the bus).
    Lost,
    /// A critical XID event is delivered to event sets waiting on the GPU; the GPU still answers.
    Xid,
}

/// A fault of the whole driver from `at_s` (until `until_s`).
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct LibraryFault {
    pub at_s: f64,
    #[serde(default)]
    pub until_s: Option<f64>,
    pub kind: LibraryFaultKind,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LibraryFaultKind {
    /// The kernel driver is away (being reloaded): nvmlInit and every call answer
    /// NVML_ERROR_DRIVER_NOT_LOADED.
    DriverUnloaded,
    /// nvmlInit answers NVML_ERROR_LIB_RM_VERSION_MISMATCH (a driver upgraded under a running
    /// library); a session opened before keeps working.
    InitFails,
}

fn active(at_s: f64, until_s: Option<f64>, t: f64) -> bool {
    t >= at_s && until_s.is_none_or(|u| t < u)
}

impl LibraryFault {
    pub fn active(&self, t: f64) -> bool {
        active(self.at_s, self.until_s, t)
    }
}

impl GpuFault {
    pub fn active(&self, t: f64) -> bool {
        active(self.at_s, self.until_s, t)
    }
}

/// The machine a scenario describes, checked against the catalogue.
#[derive(Debug)]
pub struct Machine {
    pub driver_version: String,
    pub faults: Vec<LibraryFault>,
    pub gpus: Vec<Gpu>,
}

#[derive(Debug)]
pub struct Gpu {
    pub uuid: String,
    pub name: String,
    pub model: &'static Model,
    pub memory_total_bytes: u64,
    pub memory_reserved_bytes: u64,
    power_mw: u32,
    temperature_c: u32,
    energy_start_mj: u64,
    pub mig_enabled: bool,
    /// MIG devices (one per compute instance), in the order NVML indexes them.
    pub mig: Vec<MigDevice>,
    phases: Vec<Phase>,
    pub faults: Vec<GpuFault>,
}

/// One MIG device: a compute instance of a GPU instance.
#[derive(Debug)]
pub struct MigDevice {
    pub uuid: String,
    pub name: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub profile: &'static GiProfile,
    /// Compute slices of the GPU instance this compute instance has.
    pub compute_slices: u32,
    phases: Vec<Phase>,
}

impl MigDevice {
    /// SMs of this compute instance: the GPU instance's, or its share of them.
    pub fn multiprocessors(&self) -> u32 {
        self.profile.multiprocessors * self.compute_slices / self.profile.slices
    }
}

pub fn gpu_handle(index: usize) -> usize {
    (index + 1) << 8
}

impl Machine {
    pub fn from_env() -> Result<Machine, String> {
        let path = std::env::var("FAKE_NVML_SCENARIO")
            .map_err(|_| "FAKE_NVML_SCENARIO is not set".to_string())?;
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        Machine::parse(&text).map_err(|e| format!("{path}: {e}"))
    }

    pub fn parse(text: &str) -> Result<Machine, String> {
        let file: ScenarioFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let gpus = file
            .gpus
            .into_iter()
            .enumerate()
            .map(|(i, g)| Gpu::build(g).map_err(|e| format!("gpus[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Machine {
            driver_version: file.driver_version,
            faults: file.faults,
            gpus,
        })
    }

    pub fn library_fault(&self, t: f64) -> Option<LibraryFaultKind> {
        self.faults.iter().find(|f| f.active(t)).map(|f| f.kind)
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
                mig_index,
                device: gpu.mig.get(mig_index)?,
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

impl Gpu {
    fn build(spec: GpuSpec) -> Result<Gpu, String> {
        let model = catalogue::model_named(&spec.model).ok_or_else(|| {
            let known: Vec<&str> = catalogue::MODELS.iter().map(|m| m.name).collect();
            format!(
                "model {:?} is not in the catalogue; known: {}",
                spec.model,
                known.join(", ")
            )
        })?;
        let mig_enabled = spec.mig_mode.unwrap_or(!spec.mig.is_empty());
        let mig = match (model.mig, mig_enabled) {
            (Some(table), true) => mig_devices(model, table, spec.mig)?,
            (None, true) => return Err(format!("{} has no MIG", model.name)),
            (_, false) if !spec.mig.is_empty() => {
                return Err("MIG instances on a GPU with mig_mode false".into())
            }
            (_, false) => Vec::new(),
        };
        Ok(Gpu {
            name: spec.name.unwrap_or_else(|| model.name.to_owned()),
            memory_total_bytes: spec
                .memory_total_bytes
                .unwrap_or(model.memory_total_mib * MIB),
            memory_reserved_bytes: spec
                .memory_reserved_bytes
                .unwrap_or(model.memory_reserved_mib * MIB),
            power_mw: spec.power_mw.unwrap_or(50_000),
            temperature_c: spec.temperature_c.unwrap_or(40),
            energy_start_mj: spec.energy_start_mj.unwrap_or(0),
            uuid: spec.uuid,
            model,
            mig_enabled,
            mig,
            phases: spec.phases,
            faults: spec.faults,
        })
    }

    pub fn lost_at(&self, t: f64) -> bool {
        self.faults
            .iter()
            .any(|f| f.kind == GpuFaultKind::Lost && f.active(t))
    }

    pub fn mig_table(&self) -> Option<&'static MigTable> {
        self.model.mig
    }
}

/// A GPU's MIG devices from the scenario's instances, checked against its profiles: every
/// profile known, ids unique, and the instances fit the GPU's compute and memory slices.
fn mig_devices(
    model: &Model,
    table: &'static MigTable,
    instances: Vec<GpuInstanceSpec>,
) -> Result<Vec<MigDevice>, String> {
    let (mut compute, mut memory) = (0, 0);
    let mut ids = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (i, gi) in instances.into_iter().enumerate() {
        let at = format!("mig[{i}]");
        let profile = table.profile_named(&gi.profile).ok_or_else(|| {
            let names: Vec<&str> = table.profiles.iter().map(|p| p.name).collect();
            format!(
                "{at}: {} has no profile {:?}; it has {}",
                model.name,
                gi.profile,
                names.join(", ")
            )
        })?;
        if !ids.insert(gi.gpu_instance_id) {
            return Err(format!(
                "{at}: GPU instance id {} twice",
                gi.gpu_instance_id
            ));
        }
        compute += profile.slices;
        memory += profile.memory_slices;
        if compute > table.compute_slices || memory > table.memory_slices {
            return Err(format!(
                "{at}: the instances need {compute} compute and {memory} memory slices; {} has {} and {}",
                model.name, table.compute_slices, table.memory_slices
            ));
        }
        let base = model.name;
        if gi.compute_instances.is_empty() {
            let uuid = gi.uuid.ok_or_else(|| {
                format!("{at}: a GPU instance without compute_instances needs a uuid")
            })?;
            out.push(MigDevice {
                uuid,
                name: format!("{base} MIG {}", profile.name),
                gpu_instance_id: gi.gpu_instance_id,
                compute_instance_id: 0,
                profile,
                compute_slices: profile.slices,
                phases: gi.phases,
            });
            continue;
        }
        if gi.uuid.is_some() || !gi.phases.is_empty() {
            return Err(format!(
                "{at}: a split GPU instance's uuid and phases belong to its compute instances"
            ));
        }
        let taken: u32 = gi.compute_instances.iter().map(|c| c.slices).sum();
        if taken > profile.slices || gi.compute_instances.iter().any(|c| c.slices == 0) {
            return Err(format!(
                "{at}: compute instances take {taken} slices of a {}",
                profile.name
            ));
        }
        for ci in gi.compute_instances {
            let name = if ci.slices == profile.slices {
                format!("{base} MIG {}", profile.name)
            } else {
                format!("{base} MIG {}c.{}", ci.slices, profile.name)
            };
            out.push(MigDevice {
                uuid: ci.uuid,
                name,
                gpu_instance_id: gi.gpu_instance_id,
                compute_instance_id: ci.compute_instance_id,
                profile,
                compute_slices: ci.slices,
                phases: ci.phases,
            });
        }
    }
    Ok(out)
}

fn phase_at(phases: &[Phase], t: f64) -> Option<&Phase> {
    phases.iter().rev().find(|p| p.at_s <= t).or(phases.first())
}

/// Energy in mJ used from 0 to `t` seconds: the integral of each phase's power over its span.
fn energy_used_mj(phases: &[Phase], base_mw: u32, t: f64) -> f64 {
    if phases.is_empty() {
        return base_mw as f64 * t;
    }
    let mut total = 0.0;
    for (i, phase) in phases.iter().enumerate() {
        let start = if i == 0 { 0.0 } else { phase.at_s.min(t) };
        let end = phases.get(i + 1).map_or(t, |next| next.at_s.min(t));
        let mw = phase.power_mw.unwrap_or(base_mw) as f64;
        total += mw * (end - start).max(0.0);
    }
    total
}

fn phase_memory(phase: Option<&Phase>) -> u64 {
    phase.map_or(0, |p| {
        p.memory_used_bytes
            .unwrap_or_else(|| p.processes.iter().map(|q| q.memory_used_bytes).sum())
    })
}

/// What NVML answers "not supported" with; anything else a call answers is a value.
pub struct NotSupported;

/// A process as the device lists it, with the MIG instance it runs in.
pub struct Listed {
    pub process: Process,
    /// GPU and compute instance ids; `u32::MAX` outside MIG, as the driver writes.
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

pub enum Device<'a> {
    Gpu {
        gpu: &'a Gpu,
        index: usize,
    },
    Mig {
        gpu: &'a Gpu,
        gpu_index: usize,
        mig_index: usize,
        device: &'a MigDevice,
    },
}

impl Device<'_> {
    pub fn gpu(&self) -> &Gpu {
        match self {
            Device::Gpu { gpu, .. } | Device::Mig { gpu, .. } => gpu,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Device::Gpu { gpu, .. } => &gpu.name,
            Device::Mig { device, .. } => &device.name,
        }
    }

    pub fn uuid(&self) -> &str {
        match self {
            Device::Gpu { gpu, .. } => &gpu.uuid,
            Device::Mig { device, .. } => &device.uuid,
        }
    }

    /// A GPU's index; a MIG device's own index on its GPU (what
    /// `nvmlDeviceGetMigDeviceHandleByIndex` takes), not its GPU's.
    pub fn index(&self) -> usize {
        match self {
            Device::Gpu { index, .. } => *index,
            Device::Mig { mig_index, .. } => *mig_index,
        }
    }

    pub fn mig_device(&self) -> Option<&MigDevice> {
        match self {
            Device::Mig { device, .. } => Some(device),
            Device::Gpu { .. } => None,
        }
    }

    /// A GPU in MIG mode, or one of its MIG devices: where the driver refuses utilization.
    fn under_mig(&self) -> bool {
        self.gpu().mig_enabled
    }

    fn phases(&self) -> &[Phase] {
        match self {
            Device::Gpu { gpu, .. } => &gpu.phases,
            Device::Mig { device, .. } => &device.phases,
        }
    }

    /// (total, reserved, used) bytes, as `nvmlMemory_v2_t` has them (used excludes reserved).
    pub fn memory(&self, t: f64) -> (u64, u64, u64) {
        match self {
            Device::Gpu { gpu, .. } => {
                let own = phase_memory(phase_at(&gpu.phases, t));
                // A MIG-mode GPU's memory in use is what its instances hold, and a little more.
                let instances: u64 = gpu
                    .mig
                    .iter()
                    .map(|m| phase_memory(phase_at(&m.phases, t)))
                    .sum();
                let used = (own + instances).min(
                    gpu.memory_total_bytes
                        .saturating_sub(gpu.memory_reserved_bytes),
                );
                (gpu.memory_total_bytes, gpu.memory_reserved_bytes, used)
            }
            Device::Mig { device, .. } => {
                let total = device.profile.memory_mib * MIB;
                let used = phase_memory(phase_at(&device.phases, t)).min(total);
                (total, 0, used)
            }
        }
    }

    /// (gpu %, memory-controller %): refused under MIG, on the GPU and its instances alike.
    pub fn utilization(&self, t: f64) -> Result<(u32, u32), NotSupported> {
        if self.under_mig() {
            return Err(NotSupported);
        }
        Ok(self.activity(t))
    }

    /// What the device is doing at `t`: (gpu %, memory %), the source of GPM metrics too.
    pub fn activity(&self, t: f64) -> (u32, u32) {
        phase_at(self.phases(), t).map_or((0, 0), |p| {
            (p.gpu_util.unwrap_or(0), p.mem_util.unwrap_or(0))
        })
    }

    /// A GPU instance's activity: its compute instances' by their slices.
    pub fn instance_activity(&self, gpu_instance_id: u32, t: f64) -> Option<(u32, u32)> {
        let gpu = self.gpu();
        let parts: Vec<(&MigDevice, (u32, u32))> = gpu
            .mig
            .iter()
            .filter(|m| m.gpu_instance_id == gpu_instance_id)
            .map(|m| {
                let a = phase_at(&m.phases, t).map_or((0, 0), |p| {
                    (p.gpu_util.unwrap_or(0), p.mem_util.unwrap_or(0))
                });
                (m, a)
            })
            .collect();
        let first = parts.first()?;
        let slices = first.0.profile.slices;
        let weighted = |pick: fn((u32, u32)) -> u32| {
            let sum: u32 = parts.iter().map(|(m, a)| pick(*a) * m.compute_slices).sum();
            sum / slices
        };
        Some((weighted(|a| a.0), weighted(|a| a.1)))
    }

    /// Board sensors (power, temperature, energy) belong to the GPU, not its MIG devices.
    fn board(&self) -> Result<&Gpu, NotSupported> {
        match self {
            Device::Gpu { gpu, .. } => Ok(gpu),
            Device::Mig { .. } => Err(NotSupported),
        }
    }

    pub fn power_mw(&self, t: f64) -> Result<u32, NotSupported> {
        let gpu = self.board()?;
        if !gpu.model.power {
            return Err(NotSupported);
        }
        Ok(phase_at(&gpu.phases, t)
            .and_then(|p| p.power_mw)
            .unwrap_or(gpu.power_mw))
    }

    pub fn temperature_c(&self) -> Result<u32, NotSupported> {
        Ok(self.board()?.temperature_c)
    }

    pub fn energy_mj(&self, t: f64) -> Result<u64, NotSupported> {
        let gpu = self.board()?;
        if !gpu.model.energy() {
            return Err(NotSupported);
        }
        let used = if gpu.model.power {
            energy_used_mj(&gpu.phases, gpu.power_mw, t) as u64
        } else {
            0
        };
        Ok(gpu.energy_start_mj + used)
    }

    /// Processes running now, as NVML lists them: a MIG-mode GPU lists those of all its
    /// instances with their instance ids (as for a privileged caller), a MIG device its own.
    pub fn processes(&self, t: f64) -> Vec<Listed> {
        let of_device = |m: &MigDevice| {
            phase_at(&m.phases, t)
                .into_iter()
                .flat_map(|p| p.processes.iter())
                .map(|p| Listed {
                    process: p.clone(),
                    gpu_instance_id: m.gpu_instance_id,
                    compute_instance_id: m.compute_instance_id,
                })
                .collect::<Vec<_>>()
        };
        match self {
            Device::Gpu { gpu, .. } if gpu.mig_enabled => {
                gpu.mig.iter().flat_map(of_device).collect()
            }
            Device::Gpu { gpu, .. } => phase_at(&gpu.phases, t)
                .into_iter()
                .flat_map(|p| p.processes.iter())
                .map(|p| Listed {
                    process: p.clone(),
                    gpu_instance_id: u32::MAX,
                    compute_instance_id: u32::MAX,
                })
                .collect(),
            Device::Mig { device, .. } => of_device(device),
        }
    }

    /// Per-process SM utilization: refused under MIG, like utilization rates.
    pub fn process_utilization(&self, t: f64) -> Result<Vec<Process>, NotSupported> {
        if self.under_mig() {
            return Err(NotSupported);
        }
        Ok(self
            .processes(t)
            .into_iter()
            .map(|l| l.process)
            .filter(|p| p.kind.compute())
            .collect())
    }

    /// MIG mode (current = pending) of a MIG-capable GPU.
    pub fn mig_mode(&self) -> Result<bool, NotSupported> {
        match self {
            Device::Gpu { gpu, .. } if gpu.model.mig.is_some() => Ok(gpu.mig_enabled),
            _ => Err(NotSupported),
        }
    }

    /// The most MIG devices the GPU can have (its compute slices) in MIG mode; else 0.
    pub fn max_mig_devices(&self) -> u32 {
        match (self, self.gpu().mig_table()) {
            (Device::Gpu { gpu, .. }, Some(table)) if gpu.mig_enabled => table.compute_slices,
            _ => 0,
        }
    }

    pub fn gpm_supported(&self) -> bool {
        self.gpu().model.gpm()
    }

    pub fn mig_handle(&self, mig_index: usize) -> Option<usize> {
        match self {
            Device::Gpu { gpu, index } if mig_index < gpu.mig.len() => {
                Some(gpu_handle(*index) | (mig_index + 1))
            }
            _ => None,
        }
    }

    /// The MIG device handle of this (parent) GPU's GPU instance with the given id.
    pub fn mig_handle_by_instance_id(&self, gpu_instance_id: u32) -> Option<usize> {
        let position = self
            .gpu()
            .mig
            .iter()
            .position(|m| m.gpu_instance_id == gpu_instance_id)?;
        self.mig_handle(position)
    }

    pub fn parent_handle(&self) -> Option<usize> {
        match self {
            Device::Mig { gpu_index, .. } => Some(gpu_handle(*gpu_index)),
            Device::Gpu { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests;
