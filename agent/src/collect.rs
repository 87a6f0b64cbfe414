//! Reading the GPUs: one [`DeviceSample`] per GPU (or MIG instance) per sampling tick.
//!
//! The [`GpuSource`] trait keeps the window logic testable without a driver; [`NvmlSource`] is the
//! real reader, through `nvml-wrapper`. NVML calls block, so the agent calls `sample` on a
//! blocking thread and gets owned snapshots back.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;

use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::struct_wrappers::gpm::GpmMetricResult;
use nvml_wrapper::{Device, Nvml};

/// One reading of one device. `None` means the driver could not give the value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceSample {
    pub uuid: String,
    pub index: u32,
    pub name: String,
    /// Set on a MIG instance: its physical GPU.
    pub parent_uuid: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub gpu_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub power_mw: Option<u32>,
    pub temperature_c: Option<u32>,
    /// NVML's cumulative energy counter, in millijoules.
    pub energy_counter_mj: Option<u64>,
    pub processes: Vec<ProcessSample>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessSample {
    pub pid: u32,
    pub name: Option<String>,
    pub memory_used_bytes: Option<u64>,
    /// SM utilization in percent since the last sample; `None` where the device cannot say.
    pub sm_util: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("NVML could not be loaded or initialised: {0}")]
    Init(NvmlError),
    #[error("NVML call failed: {0}")]
    Call(#[from] NvmlError),
}

/// Anything that can read the GPUs of this host.
pub trait GpuSource: Send {
    fn sample(&mut self) -> Result<Vec<DeviceSample>, CollectError>;
}

/// The real reader, through `nvml-wrapper`.
pub struct NvmlSource {
    lib_path: Option<PathBuf>,
    nvml: Option<Nvml>,
    /// Newest process-utilization timestamp seen per device, so each sample is counted once.
    last_seen_us: HashMap<String, u64>,
}

impl NvmlSource {
    /// Loads NVML now so that a host without a driver fails at start with a clear message.
    pub fn new(lib_path: Option<PathBuf>) -> Result<Self, CollectError> {
        let mut source = NvmlSource {
            lib_path,
            nvml: None,
            last_seen_us: HashMap::new(),
        };
        source.nvml = Some(source.init()?);
        Ok(source)
    }

    fn init(&self) -> Result<Nvml, CollectError> {
        let result = match &self.lib_path {
            Some(path) => {
                let os: OsString = path.clone().into_os_string();
                Nvml::builder().lib_path(&os).init()
            }
            None => Nvml::init(),
        };
        result.map_err(CollectError::Init)
    }

    pub fn driver_version(&self) -> Option<String> {
        self.nvml.as_ref()?.sys_driver_version().ok()
    }

    fn sample_all(&mut self) -> Result<Vec<DeviceSample>, CollectError> {
        let nvml = match self.nvml.take() {
            Some(n) => n,
            None => self.init()?,
        };
        let result = read_all(&nvml, &mut self.last_seen_us);
        // Keep the handle only while it works: a lost GPU or driver reload needs a fresh init.
        if result.is_ok() {
            self.nvml = Some(nvml);
        }
        result
    }
}

impl GpuSource for NvmlSource {
    fn sample(&mut self) -> Result<Vec<DeviceSample>, CollectError> {
        self.sample_all()
    }
}

fn read_all(
    nvml: &Nvml,
    last_seen_us: &mut HashMap<String, u64>,
) -> Result<Vec<DeviceSample>, CollectError> {
    let mut out = Vec::new();
    for i in 0..nvml.device_count()? {
        let device = nvml.device_by_index(i)?;
        let mig_on = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        let mut parent = read_device(nvml, &device, None, last_seen_us, !mig_on)?;
        if mig_on {
            // The parent's utilization reads 0 under MIG: it is meaningless, so leave it absent
            // and take utilization and processes from each instance instead.
            parent.gpu_util = None;
            parent.mem_util = None;
            let instances = device.mig_device_count().unwrap_or(0);
            let mut children = Vec::new();
            let mut instance_ids = Vec::new();
            for j in 0..instances {
                // Unpopulated slots answer NotFound.
                let Ok(instance) = device.mig_device_by_index(j) else {
                    continue;
                };
                let mut child =
                    read_device(nvml, &instance, Some(&parent.uuid), last_seen_us, true)?;
                child.index = parent.index;
                instance_ids.push(gpu_instance_id(nvml, &instance));
                children.push(child);
            }
            // The driver gives no utilization rates on MIG handles: measure each instance's
            // activity through GPM (Hopper and newer) instead. Elsewhere it stays absent.
            let wanted: Vec<u32> = children
                .iter()
                .zip(&instance_ids)
                .filter(|(c, _)| c.gpu_util.is_none())
                .filter_map(|(_, id)| *id)
                .collect();
            let activity = mig_activity_gpm(nvml, &device, &wanted);
            for (child, id) in children.iter_mut().zip(&instance_ids) {
                if let Some((util, mem)) = id.and_then(|id| activity.get(&id)) {
                    child.gpu_util = child.gpu_util.or(*util);
                    child.mem_util = child.mem_util.or(*mem);
                }
            }
            out.push(parent);
            out.extend(children);
        } else {
            out.push(parent);
        }
    }
    Ok(out)
}

/// The GPU instance id of a MIG device handle. nvml-wrapper has no safe call for
/// `nvmlDeviceGetGpuInstanceId`, so this calls the loaded symbol, if the library has it.
fn gpu_instance_id(nvml: &Nvml, device: &Device<'_>) -> Option<u32> {
    let get = nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref().ok()?;
    let mut id: std::ffi::c_uint = 0;
    // SAFETY: the handle comes from this live `Nvml` and `id` is a valid out-pointer.
    let rc = unsafe { get(device.handle(), &mut id) };
    (rc == 0).then_some(id)
}

/// How long GPM measures between its two samples.
const GPM_INTERVAL: Duration = Duration::from_millis(100);

type Activity = (Option<u32>, Option<u32>);

/// (GPU %, DRAM bandwidth %) per GPU instance id, from two GPM samples `GPM_INTERVAL` apart.
fn mig_activity_gpm(
    nvml: &Nvml,
    parent: &Device<'_>,
    instance_ids: &[u32],
) -> HashMap<u32, Activity> {
    let mut out = HashMap::new();
    if instance_ids.is_empty() || !parent.gpm_support().unwrap_or(false) {
        return out;
    }
    let first: Vec<_> = instance_ids
        .iter()
        .filter_map(|id| parent.gpm_mig_sample(*id).ok().map(|s| (*id, s)))
        .collect();
    if first.is_empty() {
        return out;
    }
    std::thread::sleep(GPM_INTERVAL);
    let percent = |r: Option<&Result<GpmMetricResult, NvmlError>>| {
        r.and_then(|r| r.as_ref().ok())
            .filter(|m| m.value.is_finite())
            .map(|m| m.value.round().clamp(0.0, 100.0) as u32)
    };
    for (id, s1) in first {
        let Ok(s2) = parent.gpm_mig_sample(id) else {
            continue;
        };
        let metrics = [GpmMetricId::GraphicsUtil, GpmMetricId::DramBwUtil];
        if let Ok(results) = gpm_metrics_get(nvml, &s1, &s2, &metrics) {
            out.insert(id, (percent(results.first()), percent(results.get(1))));
        }
    }
    out
}

fn optional<T>(result: Result<T, NvmlError>) -> Result<Option<T>, CollectError> {
    match result {
        Ok(v) => Ok(Some(v)),
        // These mean "this device cannot say", not "the device is broken".
        Err(NvmlError::NotSupported)
        | Err(NvmlError::NoPermission)
        | Err(NvmlError::FailedToLoadSymbol(_))
        | Err(NvmlError::NotFound) => Ok(None),
        Err(e @ (NvmlError::GpuLost | NvmlError::Uninitialized | NvmlError::DriverNotLoaded)) => {
            Err(CollectError::Call(e))
        }
        Err(_) => Ok(None),
    }
}

fn read_device(
    nvml: &Nvml,
    device: &Device<'_>,
    parent_uuid: Option<&str>,
    last_seen_us: &mut HashMap<String, u64>,
    with_processes: bool,
) -> Result<DeviceSample, CollectError> {
    let uuid = device.uuid()?;
    let memory = optional(device.memory_info())?;
    let utilization = optional(device.utilization_rates())?;
    let mut sample = DeviceSample {
        index: optional(device.index())?.unwrap_or(0),
        name: optional(device.name())?.unwrap_or_default(),
        parent_uuid: parent_uuid.map(str::to_owned),
        memory_total_bytes: memory.as_ref().map(|m| m.total),
        memory_used_bytes: memory.as_ref().map(|m| m.used),
        gpu_util: utilization.as_ref().map(|u| u.gpu),
        mem_util: utilization.as_ref().map(|u| u.memory),
        power_mw: optional(device.power_usage())?,
        temperature_c: optional(device.temperature(TemperatureSensor::Gpu))?,
        energy_counter_mj: optional(device.total_energy_consumption())?,
        processes: Vec::new(),
        uuid,
    };
    if with_processes {
        sample.processes = read_processes(nvml, device, &sample.uuid, last_seen_us)?;
    }
    Ok(sample)
}

fn read_processes(
    nvml: &Nvml,
    device: &Device<'_>,
    uuid: &str,
    last_seen_us: &mut HashMap<String, u64>,
) -> Result<Vec<ProcessSample>, CollectError> {
    let running = optional(device.running_compute_processes())?.unwrap_or_default();
    if running.is_empty() {
        return Ok(Vec::new());
    }
    let since = last_seen_us.get(uuid).copied();
    // NotFound means "no samples newer than `since`": every process was idle (0%).
    let utilization: Option<HashMap<u32, u32>> = match device.process_utilization_stats(since) {
        Ok(samples) => {
            let mut by_pid: HashMap<u32, (u64, u32)> = HashMap::new();
            for s in samples {
                let newest = last_seen_us.entry(uuid.to_owned()).or_insert(0);
                *newest = (*newest).max(s.timestamp);
                let entry = by_pid.entry(s.pid).or_insert((0, 0));
                entry.0 += u64::from(s.sm_util);
                entry.1 += 1;
            }
            Some(
                by_pid
                    .into_iter()
                    .map(|(pid, (sum, n))| (pid, (sum / u64::from(n.max(1))) as u32))
                    .collect(),
            )
        }
        Err(NvmlError::NotFound) => Some(HashMap::new()),
        Err(e) => optional::<()>(Err(e)).map(|_| None)?,
    };
    Ok(running
        .into_iter()
        .map(|p| ProcessSample {
            pid: p.pid,
            name: nvml.sys_process_name(p.pid, 64).ok(),
            memory_used_bytes: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            },
            sm_util: utilization
                .as_ref()
                .map(|u| u.get(&p.pid).copied().unwrap_or(0)),
        })
        .collect())
}
