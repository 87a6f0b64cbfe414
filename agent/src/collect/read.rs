//! One sample of every GPU through an NVML session: each GPU on its own, so one that fails
//! leaves the others reading.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use gpuledger_proto::{DeviceFault, MigPlacement};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::struct_wrappers::gpm::GpmMetricResult;
use nvml_wrapper::{Device, Nvml};

use super::{session_broken, xid, DeviceSample, Identity, Memory, ProcessSample, Watch, XidFault};

/// NVIDIA: GPM metrics mean something only between samples more than 100 ms apart.
const GPM_MIN_INTERVAL: Duration = Duration::from_millis(100);

/// Every GPU's sample. `Err` only when the session itself is gone (every GPU answers that the
/// driver is away): the caller initialises NVML again.
pub(super) fn all<'a>(
    nvml: &'a Nvml,
    watch: &mut Watch<'a>,
    memory: &mut Memory,
) -> Result<Vec<DeviceSample>, NvmlError> {
    let count = nvml.device_count()?;
    drain_xids(watch, memory);
    let mut out = Vec::new();
    let mut broken = None;
    for index in 0..count {
        match gpu(nvml, watch, memory, index) {
            Ok(samples) => {
                if let Some(first) = samples.first() {
                    memory.known.insert(
                        index,
                        Identity {
                            uuid: first.uuid.clone(),
                            name: first.name.clone(),
                            memory_total_bytes: first.memory_total_bytes,
                        },
                    );
                }
                out.extend(samples);
            }
            Err(e) if session_broken(&e) => broken = Some(e),
            Err(e) => match memory.known.get(&index) {
                Some(id) => {
                    out.push(id.faulted(index, device_fault(&e, memory.xids.get(&id.uuid))))
                }
                None => {
                    tracing::warn!(index, error = %e, "a GPU the agent never read answers with an error")
                }
            },
        }
    }
    match broken {
        Some(e) if out.is_empty() => Err(e),
        _ => Ok(out),
    }
}

/// What a device's error means, in the terms a report carries.
fn device_fault(e: &NvmlError, xid: Option<&XidFault>) -> DeviceFault {
    match e {
        NvmlError::GpuLost => DeviceFault {
            code: "gpu_lost".into(),
            // The XID that came with it says why (79: fallen off the bus).
            detail: xid.map_or_else(
                || {
                    "the GPU is lost (NVML answers GPU_IS_LOST): reset the GPU or reboot the host"
                        .into()
                },
                |x| format!("the GPU is lost after {}", x.fault.detail),
            ),
        },
        e => DeviceFault {
            code: "nvml_error".into(),
            detail: format!("NVML cannot read the GPU: {e}"),
        },
    }
}

/// Critical XIDs that arrived since the last sample, each GPU's on its own event set.
fn drain_xids(watch: &mut Watch<'_>, memory: &mut Memory) {
    for (uuid, set) in &watch.xid {
        for _ in 0..64 {
            match set.wait(0) {
                Ok(event) => {
                    let Some(XidError::Value(code)) = event.event_data else {
                        continue;
                    };
                    let Some(fault) = xid::fault(code) else {
                        tracing::info!(gpu = %uuid, xid = code, "application XID; the GPU stays usable");
                        continue;
                    };
                    tracing::warn!(gpu = %uuid, xid = code, detail = %fault.detail, "critical XID");
                    memory.xids.insert(
                        uuid.clone(),
                        XidFault {
                            fault,
                            pids_at: None,
                        },
                    );
                }
                // Nothing more now; a lost GPU shows when it is read.
                Err(_) => break,
            }
        }
    }
}

/// Asks once per session for a GPU's critical XIDs.
fn watch_xids<'a>(watch: &mut Watch<'a>, nvml: &'a Nvml, device: &Device<'a>, uuid: &str) {
    if !watch.xid_asked.insert(uuid.to_owned()) {
        return;
    }
    let supported = device
        .supported_event_types()
        .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
    if !supported {
        return;
    }
    let registered = nvml
        .create_event_set()
        .map_err(|e| e.to_string())
        .and_then(|set| {
            device
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| e.to_string())
        });
    match registered {
        Ok(set) => {
            watch.xid.insert(uuid.to_owned(), set);
        }
        Err(e) => tracing::info!(gpu = %uuid, error = %e, "XIDs cannot be watched on this GPU"),
    }
}

/// One physical GPU: its own sample and, in MIG mode, one per MIG device.
fn gpu<'a>(
    nvml: &'a Nvml,
    watch: &mut Watch<'a>,
    memory: &mut Memory,
    index: u32,
) -> Result<Vec<DeviceSample>, NvmlError> {
    let device = nvml.device_by_index(index)?;
    let mig_on = optional(device.mig_mode())?.is_some_and(|m| m.current == 1);
    let mut parent = read_device(nvml, &device, None, memory, !mig_on)?;
    watch_xids(watch, nvml, &device, &parent.uuid);
    let mut out = vec![];
    if mig_on {
        parent.mig_compute_slices = match watch.slices.get(&parent.uuid) {
            Some(known) => Some(*known),
            None => {
                // Asked again until the driver answers; then fixed while its MIG mode is.
                let slices = compute_slices(&device);
                if let Some(s) = slices {
                    watch.slices.insert(parent.uuid.clone(), s);
                }
                slices
            }
        };
        let mut children = Vec::new();
        for j in 0..optional(device.mig_device_count())?.unwrap_or(0) {
            let instance = match device.mig_device_by_index(j) {
                Ok(instance) => instance,
                // Slots no device holds.
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(e),
            };
            let mut child = read_device(nvml, &instance, Some(&parent.uuid), memory, true)?;
            child.index = parent.index;
            child.mig = placement(nvml, &instance, &child.name);
            children.push(child);
        }
        // The driver gives no utilization on MIG: GPM measures each GPU instance (Hopper).
        let ids: BTreeSet<u32> = children
            .iter()
            .filter(|c| c.gpu_util.is_none())
            .filter_map(|c| c.mig.as_ref().map(|m| m.gpu_instance_id))
            .collect();
        let activity = gpm_activity(&device, &parent.uuid, &ids, &mut watch.gpm);
        for child in &mut children {
            let id = child.mig.as_ref().map(|m| m.gpu_instance_id);
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
    apply_xid(&mut out, memory);
    Ok(out)
}

/// Utilization (%) that shows a GPU works after an XID.
const WORKING_PERCENT: u32 = 5;

/// A critical XID stays on every sample of its GPU until it works again.
fn apply_xid(samples: &mut [DeviceSample], memory: &mut Memory) {
    let Some(uuid) = samples.first().map(|s| s.uuid.clone()) else {
        return;
    };
    let Some(xid) = memory.xids.get_mut(&uuid) else {
        return;
    };
    let pids: BTreeSet<u32> = samples
        .iter()
        .flat_map(|s| s.processes.iter().map(|p| p.pid))
        .collect();
    // Work on the GPU since: a process that was not there (a reset GPU running a new job), or
    // utilization (a long-running server, or processes the agent cannot see).
    let busy = samples
        .iter()
        .any(|s| s.gpu_util.is_some_and(|u| u >= WORKING_PERCENT));
    match &xid.pids_at {
        None if !busy => xid.pids_at = Some(pids),
        Some(before) if !busy && pids.iter().all(|p| before.contains(p)) => {}
        _ => {
            tracing::info!(gpu = %uuid, "the GPU works again after its XID; the fault is over");
            memory.xids.remove(&uuid);
            return;
        }
    }
    for s in samples {
        s.fault = Some(xid.fault.clone());
    }
}

/// The compute slices of a GPU in MIG mode: its largest GPU-instance profile's (7 on A100 and
/// H100, 4 on A30). Profiles are asked for until the driver says there are no more.
fn compute_slices(device: &Device<'_>) -> Option<u32> {
    let mut most = None;
    for profile in 0..32 {
        match device.profile_info(profile) {
            Ok(info) => most = most.max(Some(info.slice_count)),
            Err(NvmlError::InvalidArg) => break,
            Err(_) => continue,
        }
    }
    most
}

/// Where a MIG device sits: its instance ids (raw calls: nvml-wrapper has none) and slices.
fn placement(nvml: &Nvml, device: &Device<'_>, name: &str) -> Option<MigPlacement> {
    let lib = nvml.lib();
    let id = |f: Option<&unsafe extern "C" fn(_, *mut std::ffi::c_uint) -> _>| {
        let f = f?;
        let mut id: std::ffi::c_uint = 0;
        // SAFETY: the handle comes from this live `Nvml` and `id` is a valid out-pointer.
        let rc: u32 = unsafe { f(device.handle(), &mut id) };
        (rc == 0).then_some(id)
    };
    let gpu_instance_id = id(lib.nvmlDeviceGetGpuInstanceId.as_ref().ok())?;
    let compute_instance_id = id(lib.nvmlDeviceGetComputeInstanceId.as_ref().ok())?;
    let attributes = device.attributes().ok()?;
    Some(MigPlacement {
        gpu_instance_id,
        compute_instance_id,
        profile: name.rsplit_once(" MIG ").map(|(_, p)| p.to_owned()),
        gpu_instance_slices: attributes.gpu_instance_slice_count,
        compute_instance_slices: attributes.compute_instance_slice_count,
    })
}

type Activity = (Option<u32>, Option<u32>);

/// (GPU %, DRAM bandwidth %) per GPU instance id, through GPM: each instance's activity between
/// its sample of the previous tick and this one's, where they are far enough apart.
fn gpm_activity<'a>(
    parent: &Device<'a>,
    parent_uuid: &str,
    instance_ids: &BTreeSet<u32>,
    samples: &mut HashMap<(String, u32), (nvml_wrapper::GpmSample<'a>, Instant)>,
) -> HashMap<u32, Activity> {
    let mut out = HashMap::new();
    // Samples of GPU instances that are gone: one made again with the same id starts afresh.
    samples.retain(|(gpu, id), _| gpu != parent_uuid || instance_ids.contains(id));
    if instance_ids.is_empty() || !parent.gpm_support().unwrap_or(false) {
        return out;
    }
    let percent = |r: Option<&Result<GpmMetricResult, NvmlError>>| {
        r.and_then(|r| r.as_ref().ok())
            .filter(|m| m.value.is_finite())
            .map(|m| m.value.round().clamp(0.0, 100.0) as u32)
    };
    // An instance seen for the first time has no sample to measure from: take one now and
    // wait out the minimum once, so even the first window has its activity.
    let key = |id: u32| (parent_uuid.to_owned(), id);
    let fresh: Vec<u32> = instance_ids
        .iter()
        .copied()
        .filter(|id| !samples.contains_key(&key(*id)))
        .collect();
    for id in &fresh {
        if let Ok(sample) = parent.gpm_mig_sample(*id) {
            samples.insert(key(*id), (sample, Instant::now()));
        }
    }
    if !fresh.is_empty() {
        std::thread::sleep(GPM_MIN_INTERVAL + Duration::from_millis(10));
    }
    for id in instance_ids {
        let Ok(sample) = parent.gpm_mig_sample(*id) else {
            continue;
        };
        let now = Instant::now();
        let key = key(*id);
        match samples.remove(&key) {
            Some((before, at)) if now.duration_since(at) > GPM_MIN_INTERVAL => {
                let metrics = [GpmMetricId::GraphicsUtil, GpmMetricId::DramBwUtil];
                if let Ok(results) = gpm_metrics_get(parent.nvml(), &before, &sample, &metrics) {
                    out.insert(*id, (percent(results.first()), percent(results.get(1))));
                }
                samples.insert(key, (sample, now));
            }
            // Too soon after the last: keep the older sample for the next tick.
            Some(kept) => {
                samples.insert(key, kept);
            }
            None => {
                samples.insert(key, (sample, now));
            }
        }
    }
    out
}

/// Values a device cannot give are `None`; errors that mean the device (or driver) is gone
/// are errors.
fn optional<T>(result: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(
            e @ (NvmlError::GpuLost
            | NvmlError::Uninitialized
            | NvmlError::DriverNotLoaded
            | NvmlError::LibRmVersionMismatch),
        ) => Err(e),
        // "This device cannot say" (not supported, no permission, an old driver's missing
        // symbol) or a passing error: the value is unknown.
        Err(_) => Ok(None),
    }
}

fn read_device(
    nvml: &Nvml,
    device: &Device<'_>,
    parent_uuid: Option<&str>,
    memory: &mut Memory,
    leaf: bool,
) -> Result<DeviceSample, NvmlError> {
    let uuid = device.uuid()?;
    let info = optional(device.memory_info())?;
    let utilization = optional(device.utilization_rates())?;
    let mut sample = DeviceSample {
        index: optional(device.index())?.unwrap_or(0),
        name: optional(device.name())?.unwrap_or_default(),
        parent_uuid: parent_uuid.map(str::to_owned),
        memory_total_bytes: info.as_ref().map(|m| m.total),
        memory_used_bytes: info.as_ref().map(|m| m.used),
        gpu_util: utilization.as_ref().map(|u| u.gpu),
        mem_util: utilization.as_ref().map(|u| u.memory),
        power_mw: optional(device.power_usage())?,
        temperature_c: optional(device.temperature(TemperatureSensor::Gpu))?,
        energy_counter_mj: optional(device.total_energy_consumption())?,
        uuid,
        ..Default::default()
    };
    if leaf {
        let listed = list_processes(device)?;
        sample.processes = with_utilization(nvml, device, &sample.uuid, listed.compute, memory)?;
        sample.unseen_memory_bytes = sample
            .memory_used_bytes
            .zip(listed.visible_bytes)
            .map(|(used, visible)| used.saturating_sub(visible));
        sample.unseen_cause = if listed.refused {
            Some("no_permission")
        } else if memory.own_pid_namespace {
            Some("pid_namespace")
        } else {
            None
        };
    }
    Ok(sample)
}

/// A device's processes as NVML lists them.
struct Listed {
    /// Compute processes (and compute-and-graphics ones): the work on the device.
    compute: Vec<ProcessInfo>,
    /// Memory every listed process holds, graphics ones too, each process once; `None` where
    /// the driver does not give a process's.
    visible_bytes: Option<u64>,
    /// NVML refused to list them.
    refused: bool,
}

fn list_processes(device: &Device<'_>) -> Result<Listed, NvmlError> {
    let mut refused = false;
    let mut list = |r: Result<Vec<ProcessInfo>, NvmlError>| match r {
        Err(NvmlError::NoPermission) => {
            refused = true;
            Ok(Vec::new())
        }
        r => optional(r).map(Option::unwrap_or_default),
    };
    let compute = list(device.running_compute_processes())?;
    let graphics = list(device.running_graphics_processes())?;
    let mut held: HashMap<u32, u64> = HashMap::new();
    let mut unknown = false;
    for p in compute.iter().chain(&graphics) {
        match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => {
                let m = held.entry(p.pid).or_default();
                *m = (*m).max(b);
            }
            UsedGpuMemory::Unavailable => unknown = true,
        }
    }
    Ok(Listed {
        compute,
        // A process whose memory the driver does not give: what the others hold is not all the
        // seen processes hold, so nothing is taken for unseen.
        visible_bytes: (!unknown).then(|| held.values().sum()),
        refused,
    })
}

/// The compute processes with their SM utilization since the last sample, where the device
/// gives it.
fn with_utilization(
    nvml: &Nvml,
    device: &Device<'_>,
    uuid: &str,
    running: Vec<ProcessInfo>,
    memory: &mut Memory,
) -> Result<Vec<ProcessSample>, NvmlError> {
    if running.is_empty() {
        return Ok(Vec::new());
    }
    let since = memory.last_seen_us.get(uuid).copied();
    // NotFound means "no samples newer than `since`": every process was idle (0%).
    let utilization: Option<HashMap<u32, u32>> = match device.process_utilization_stats(since) {
        Ok(samples) => {
            let mut by_pid: HashMap<u32, (u64, u32)> = HashMap::new();
            for s in samples {
                let newest = memory.last_seen_us.entry(uuid.to_owned()).or_insert(0);
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
            owner: None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::ProcessSample;
    use std::collections::BTreeMap;

    fn memory() -> Memory {
        Memory {
            last_seen_us: HashMap::new(),
            known: BTreeMap::new(),
            xids: HashMap::new(),
            own_pid_namespace: false,
        }
    }

    fn gpu(pids: &[u32]) -> Vec<DeviceSample> {
        vec![DeviceSample {
            uuid: "GPU-a".into(),
            processes: pids
                .iter()
                .map(|pid| ProcessSample {
                    pid: *pid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }]
    }

    /// A critical XID marks its GPU's samples until a process that was not there when it came
    /// runs: the GPU was reset and works again.
    #[test]
    fn an_xid_stands_until_new_work_runs() {
        let mut m = memory();
        m.xids.insert(
            "GPU-a".into(),
            XidFault {
                fault: xid::fault(48).unwrap(),
                pids_at: None,
            },
        );
        for pids in [&[7][..], &[7], &[]] {
            let mut s = gpu(pids);
            apply_xid(&mut s, &mut m);
            assert_eq!(s[0].fault.as_ref().map(|f| f.code.as_str()), Some("xid"));
        }
        let mut s = gpu(&[8]);
        apply_xid(&mut s, &mut m);
        assert_eq!(s[0].fault, None);
        assert!(m.xids.is_empty());
        // A long-running server keeps its pid: its GPU at work again ends the fault too.
        m.xids.insert(
            "GPU-a".into(),
            XidFault {
                fault: xid::fault(48).unwrap(),
                pids_at: None,
            },
        );
        let mut s = gpu(&[7]);
        apply_xid(&mut s, &mut m);
        assert!(s[0].fault.is_some());
        let mut s = gpu(&[7]);
        s[0].gpu_util = Some(80);
        apply_xid(&mut s, &mut m);
        assert_eq!(s[0].fault, None);
    }

    /// Every code the agent writes is one the wire format lists (the server and pages read them).
    #[test]
    fn the_agents_codes_are_the_wire_formats() {
        for e in [NvmlError::GpuLost, NvmlError::Unknown] {
            let code = device_fault(&e, None).code;
            assert!(
                gpuledger_proto::DEVICE_FAULT_CODES.contains(&code.as_str()),
                "{code}"
            );
        }
        assert!(gpuledger_proto::DEVICE_FAULT_CODES.contains(&"driver_unavailable"));
        for cause in ["no_permission", "pid_namespace"] {
            assert!(gpuledger_proto::UNSEEN_CAUSES.contains(&cause), "{cause}");
        }
    }

    #[test]
    fn a_lost_gpu_says_which_xid_took_it() {
        let x = XidFault {
            fault: xid::fault(79).unwrap(),
            pids_at: None,
        };
        let f = device_fault(&NvmlError::GpuLost, Some(&x));
        assert_eq!(f.code, "gpu_lost");
        assert!(
            f.detail.contains("XID 79: the GPU has fallen off the bus"),
            "{}",
            f.detail
        );
        assert_eq!(device_fault(&NvmlError::Unknown, None).code, "nvml_error");
    }
}
