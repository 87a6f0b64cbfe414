//! A stand-in `libnvidia-ml.so` for tests and demos.
//!
//! It exports the NVML C symbols the agent calls, with the same ABI and return codes as the real
//! driver library, so the agent's real `nvml-wrapper` code path runs against it unchanged
//! (`Nvml::builder().lib_path(...)`). What it reports comes from a JSON scenario file named by
//! the `FAKE_NVML_SCENARIO` environment variable (see `docs/fake-nvml.md`).
//!
//! Device handles are small integers cast to pointers and never dereferenced: GPU `i` is
//! `(i + 1) << 8`, its MIG instance `j` is `((i + 1) << 8) | (j + 1)`.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

mod gpm;
mod scenario;

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::sync::Mutex;
use std::time::Instant;

use scenario::{Device, Scenario};

pub(crate) type NvmlReturn = c_uint;
pub(crate) type DeviceHandle = *mut c_void;

pub(crate) const SUCCESS: NvmlReturn = 0;
pub(crate) const ERROR_UNINITIALIZED: NvmlReturn = 1;
pub(crate) const ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub(crate) const ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub(crate) const ERROR_NOT_FOUND: NvmlReturn = 6;
const ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub(crate) const ERROR_UNKNOWN: NvmlReturn = 999;

pub(crate) struct State {
    scenario: Scenario,
    pub(crate) started: Instant,
    /// nvmlInit may be called several times; nvmlShutdown undoes one call each.
    refcount: u32,
}

pub(crate) static STATE: Mutex<Option<State>> = Mutex::new(None);
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

#[repr(C)]
pub struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[repr(C)]
pub struct ProcessUtilizationSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// Runs `f` on the device behind `handle`, with the seconds elapsed since nvmlInit.
pub(crate) fn with_device(
    handle: DeviceHandle,
    f: impl FnOnce(&Device, f64) -> NvmlReturn,
) -> NvmlReturn {
    let guard = match STATE.lock() {
        Ok(g) => g,
        Err(_) => return ERROR_UNKNOWN,
    };
    let Some(state) = guard.as_ref() else {
        return ERROR_UNINITIALIZED;
    };
    match state.scenario.device_by_handle(handle as usize) {
        Some(dev) => f(&dev, state.started.elapsed().as_secs_f64()),
        None => ERROR_INVALID_ARGUMENT,
    }
}

unsafe fn write_str(text: &str, buf: *mut c_char, len: c_uint) -> NvmlReturn {
    if buf.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
    *buf.add(bytes.len()) = 0;
    SUCCESS
}

fn set_error(message: String) {
    if let Ok(mut e) = LAST_ERROR.lock() {
        *e = message;
    }
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    let mut guard = match STATE.lock() {
        Ok(g) => g,
        Err(_) => return ERROR_UNKNOWN,
    };
    if let Some(state) = guard.as_mut() {
        state.refcount += 1;
        return SUCCESS;
    }
    match Scenario::from_env() {
        Ok(scenario) => {
            *guard = Some(State {
                scenario,
                started: Instant::now(),
                refcount: 1,
            });
            SUCCESS
        }
        Err(message) => {
            set_error(message);
            ERROR_UNKNOWN
        }
    }
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    let mut guard = match STATE.lock() {
        Ok(g) => g,
        Err(_) => return ERROR_UNKNOWN,
    };
    match guard.as_mut() {
        None => ERROR_UNINITIALIZED,
        Some(state) if state.refcount > 1 => {
            state.refcount -= 1;
            SUCCESS
        }
        Some(_) => {
            *guard = None;
            SUCCESS
        }
    }
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let text: &'static [u8] = match result {
        SUCCESS => b"Success\0",
        ERROR_UNINITIALIZED => b"Uninitialized\0",
        ERROR_INVALID_ARGUMENT => b"Invalid Argument\0",
        ERROR_NOT_SUPPORTED => b"Not Supported\0",
        ERROR_NOT_FOUND => b"Not Found\0",
        ERROR_INSUFFICIENT_SIZE => b"Insufficient Size\0",
        _ => b"Unknown Error (fake NVML: see FAKE_NVML_SCENARIO)\0",
    };
    text.as_ptr() as *const c_char
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> NvmlReturn {
    let guard = match STATE.lock() {
        Ok(g) => g,
        Err(_) => return ERROR_UNKNOWN,
    };
    match guard.as_ref() {
        Some(state) => write_str(&state.scenario.driver_version, buf, len),
        None => ERROR_UNINITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    buf: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    let guard = match STATE.lock() {
        Ok(g) => g,
        Err(_) => return ERROR_UNKNOWN,
    };
    let Some(state) = guard.as_ref() else {
        return ERROR_UNINITIALIZED;
    };
    match state.scenario.process_name(pid) {
        Some(name) => write_str(&name, buf, len),
        None => ERROR_NOT_FOUND,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    let guard = match STATE.lock() {
        Ok(g) => g,
        Err(_) => return ERROR_UNKNOWN,
    };
    match (guard.as_ref(), count.is_null()) {
        (None, _) => ERROR_UNINITIALIZED,
        (_, true) => ERROR_INVALID_ARGUMENT,
        (Some(state), false) => {
            *count = state.scenario.gpus.len() as c_uint;
            SUCCESS
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut DeviceHandle,
) -> NvmlReturn {
    let guard = match STATE.lock() {
        Ok(g) => g,
        Err(_) => return ERROR_UNKNOWN,
    };
    let Some(state) = guard.as_ref() else {
        return ERROR_UNINITIALIZED;
    };
    if device.is_null() || index as usize >= state.scenario.gpus.len() {
        return ERROR_INVALID_ARGUMENT;
    }
    *device = scenario::gpu_handle(index as usize) as DeviceHandle;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: DeviceHandle,
    buf: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| write_str(d.name(), buf, len))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: DeviceHandle,
    buf: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| write_str(d.uuid(), buf, len))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: DeviceHandle,
    index: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if index.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        *index = d.index() as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: DeviceHandle,
    memory: *mut MemoryV2,
) -> NvmlReturn {
    with_device(device, |d, t| {
        if memory.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let total = d.memory_total_bytes();
        let used = d.memory_used_bytes(t).min(total);
        (*memory).total = total;
        (*memory).reserved = 0;
        (*memory).used = used;
        (*memory).free = total - used;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: DeviceHandle,
    memory: *mut Memory,
) -> NvmlReturn {
    with_device(device, |d, t| {
        if memory.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let total = d.memory_total_bytes();
        let used = d.memory_used_bytes(t).min(total);
        (*memory).total = total;
        (*memory).used = used;
        (*memory).free = total - used;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: DeviceHandle,
    utilization: *mut Utilization,
) -> NvmlReturn {
    with_device(device, |d, t| {
        if utilization.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        match d.utilization(t) {
            Some((gpu, memory)) => {
                (*utilization).gpu = gpu;
                (*utilization).memory = memory;
                SUCCESS
            }
            None => ERROR_NOT_SUPPORTED,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: DeviceHandle,
    mw: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, t| match (d.power_mw(t), mw.is_null()) {
        (_, true) => ERROR_INVALID_ARGUMENT,
        (Some(p), false) => {
            *mw = p;
            SUCCESS
        }
        (None, false) => ERROR_NOT_SUPPORTED,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: DeviceHandle,
    _sensor: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, t| match (d.temperature_c(t), temp.is_null()) {
        (_, true) => ERROR_INVALID_ARGUMENT,
        (Some(c), false) => {
            *temp = c;
            SUCCESS
        }
        (None, false) => ERROR_NOT_SUPPORTED,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: DeviceHandle,
    mj: *mut c_ulonglong,
) -> NvmlReturn {
    with_device(device, |d, t| match (d.energy_mj(t), mj.is_null()) {
        (_, true) => ERROR_INVALID_ARGUMENT,
        (Some(e), false) => {
            *mj = e;
            SUCCESS
        }
        (None, false) => ERROR_NOT_SUPPORTED,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: DeviceHandle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    with_device(device, |d, t| {
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let procs = d.processes(t);
        let capacity = *count as usize;
        *count = procs.len() as c_uint;
        if procs.is_empty() {
            return SUCCESS;
        }
        if infos.is_null() || capacity < procs.len() {
            return ERROR_INSUFFICIENT_SIZE;
        }
        for (i, p) in procs.iter().enumerate() {
            *infos.add(i) = ProcessInfo {
                pid: p.pid,
                used_gpu_memory: p.memory_used_bytes,
                gpu_instance_id: d.gpu_instance_id().unwrap_or(u32::MAX),
                compute_instance_id: d.gpu_instance_id().map(|_| 0).unwrap_or(u32::MAX),
            };
        }
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: DeviceHandle,
    samples: *mut ProcessUtilizationSample,
    count: *mut c_uint,
    last_seen_us: c_ulonglong,
) -> NvmlReturn {
    with_device(device, |d, t| {
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        if !d.supports_process_utilization() {
            return ERROR_NOT_SUPPORTED;
        }
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        // Like the driver: only processes with non-zero activity, only samples newer than asked.
        let active: Vec<_> = if now_us > last_seen_us {
            d.processes(t)
                .into_iter()
                .filter(|p| p.sm_util > 0)
                .collect()
        } else {
            Vec::new()
        };
        if active.is_empty() {
            *count = 0;
            return ERROR_NOT_FOUND;
        }
        let capacity = *count as usize;
        *count = active.len() as c_uint;
        if samples.is_null() || capacity < active.len() {
            return ERROR_INSUFFICIENT_SIZE;
        }
        for (i, p) in active.iter().enumerate() {
            *samples.add(i) = ProcessUtilizationSample {
                pid: p.pid,
                time_stamp: now_us,
                sm_util: p.sm_util,
                mem_util: p.mem_util,
                enc_util: 0,
                dec_util: 0,
            };
        }
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: DeviceHandle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if current.is_null() || pending.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        match d.mig_enabled() {
            Some(on) => {
                *current = on as c_uint;
                *pending = on as c_uint;
                SUCCESS
            }
            None => ERROR_NOT_SUPPORTED,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: DeviceHandle,
    count: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        match d.mig_enabled() {
            Some(_) => {
                *count = d.mig_instance_count() as c_uint;
                SUCCESS
            }
            None => ERROR_NOT_SUPPORTED,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: DeviceHandle,
    index: c_uint,
    mig: *mut DeviceHandle,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if mig.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        match d.mig_handle(index as usize) {
            Some(h) => {
                *mig = h as DeviceHandle;
                SUCCESS
            }
            None => ERROR_NOT_FOUND,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: DeviceHandle,
    is_mig: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if is_mig.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        *is_mig = d.is_mig() as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    device: DeviceHandle,
    parent: *mut DeviceHandle,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if parent.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        match d.parent_handle() {
            Some(h) => {
                *parent = h as DeviceHandle;
                SUCCESS
            }
            None => ERROR_INVALID_ARGUMENT,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: DeviceHandle,
    id: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| match (d.gpu_instance_id(), id.is_null()) {
        (_, true) => ERROR_INVALID_ARGUMENT,
        (Some(gi), false) => {
            *id = gi;
            SUCCESS
        }
        (None, false) => ERROR_NOT_SUPPORTED,
    })
}
