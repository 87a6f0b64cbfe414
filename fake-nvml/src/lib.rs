//! A stand-in `libnvidia-ml.so` for tests and demos.
//!
//! It exports the NVML C symbols the agent calls, with the same ABI and return codes as the real
//! driver library, so the agent's real `nvml-wrapper` code path runs against it unchanged
//! (`Nvml::builder().lib_path(...)`). The machine it is comes from a JSON scenario file named by
//! the `FAKE_NVML_SCENARIO` environment variable (see `docs/fake-nvml.md`); what it answers about
//! each GPU comes from the GPU's model (`catalogue`), as a real driver's answers do.
//!
//! Device handles are small integers cast to pointers and never dereferenced: GPU `i` is
//! `(i + 1) << 8`, its MIG device `j` is `((i + 1) << 8) | (j + 1)`.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

mod catalogue;
mod events;
mod gpm;
mod mig;
mod scenario;

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use scenario::{Device, LibraryFaultKind, Machine, NotSupported};

pub(crate) type NvmlReturn = c_uint;
pub(crate) type DeviceHandle = *mut c_void;

pub(crate) const SUCCESS: NvmlReturn = 0;
pub(crate) const ERROR_UNINITIALIZED: NvmlReturn = 1;
pub(crate) const ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub(crate) const ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub(crate) const ERROR_NOT_FOUND: NvmlReturn = 6;
pub(crate) const ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub(crate) const ERROR_TIMEOUT: NvmlReturn = 10;
pub(crate) const ERROR_GPU_IS_LOST: NvmlReturn = 15;
const ERROR_LIB_RM_VERSION_MISMATCH: NvmlReturn = 18;
pub(crate) const ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub(crate) const ERROR_UNKNOWN: NvmlReturn = 999;

pub(crate) struct State {
    machine: Machine,
    /// nvmlInit may be called several times; nvmlShutdown undoes one call each.
    refcount: u32,
}

pub(crate) static STATE: Mutex<Option<State>> = Mutex::new(None);
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());
/// When the first nvmlInit was called: scenario times count from here, across re-inits (a
/// driver reload does not restart what the GPUs are doing).
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Seconds since the first nvmlInit.
pub(crate) fn now_s() -> f64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}

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

/// Runs `f` on the machine, or answers as the driver would when there is none: uninitialised,
/// or the driver away.
pub(crate) fn with_machine(f: impl FnOnce(&Machine, f64) -> NvmlReturn) -> NvmlReturn {
    let guard = match STATE.lock() {
        Ok(g) => g,
        Err(_) => return ERROR_UNKNOWN,
    };
    let Some(state) = guard.as_ref() else {
        return ERROR_UNINITIALIZED;
    };
    let t = now_s();
    if state.machine.library_fault(t) == Some(LibraryFaultKind::DriverUnloaded) {
        return ERROR_DRIVER_NOT_LOADED;
    }
    f(&state.machine, t)
}

/// Runs `f` on the device behind `handle`, with the seconds elapsed since the first nvmlInit.
/// A lost GPU (and each of its MIG devices) answers NVML_ERROR_GPU_IS_LOST to everything.
pub(crate) fn with_device(
    handle: DeviceHandle,
    f: impl FnOnce(&Device, f64) -> NvmlReturn,
) -> NvmlReturn {
    with_machine(
        |machine, t| match machine.device_by_handle(handle as usize) {
            Some(dev) if dev.gpu().lost_at(t) => ERROR_GPU_IS_LOST,
            Some(dev) => f(&dev, t),
            None => ERROR_INVALID_ARGUMENT,
        },
    )
}

/// Writes a supported value through `out`, or answers NOT_SUPPORTED.
pub(crate) unsafe fn answer<T>(out: *mut T, value: Result<T, NotSupported>) -> NvmlReturn {
    if out.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    match value {
        Ok(v) => {
            *out = v;
            SUCCESS
        }
        Err(NotSupported) => ERROR_NOT_SUPPORTED,
    }
}

pub(crate) unsafe fn write_str(text: &str, buf: *mut c_char, len: c_uint) -> NvmlReturn {
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
    let t = now_s();
    let mut guard = match STATE.lock() {
        Ok(g) => g,
        Err(_) => return ERROR_UNKNOWN,
    };
    if let Some(state) = guard.as_mut() {
        state.refcount += 1;
        return SUCCESS;
    }
    let machine = match Machine::from_env() {
        Ok(machine) => machine,
        Err(message) => {
            set_error(message);
            return ERROR_UNKNOWN;
        }
    };
    match machine.library_fault(t) {
        Some(LibraryFaultKind::DriverUnloaded) => ERROR_DRIVER_NOT_LOADED,
        Some(LibraryFaultKind::InitFails) => ERROR_LIB_RM_VERSION_MISMATCH,
        None => {
            *guard = Some(State {
                machine,
                refcount: 1,
            });
            SUCCESS
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
        ERROR_DRIVER_NOT_LOADED => b"Driver Not Loaded\0",
        ERROR_TIMEOUT => b"Timeout\0",
        ERROR_GPU_IS_LOST => b"GPU is lost\0",
        ERROR_LIB_RM_VERSION_MISMATCH => b"Driver/library version mismatch\0",
        ERROR_ARGUMENT_VERSION_MISMATCH => b"Argument version mismatch\0",
        _ => b"Unknown Error (fake NVML: see FAKE_NVML_SCENARIO)\0",
    };
    text.as_ptr() as *const c_char
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> NvmlReturn {
    with_machine(|m, _| write_str(&m.driver_version, buf, len))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    buf: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    with_machine(|m, _| match m.process_name(pid) {
        Some(name) => write_str(&name, buf, len),
        None => ERROR_NOT_FOUND,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    with_machine(|m, _| answer(count, Ok(m.gpus.len() as c_uint)))
}

/// A lost GPU has no handle: the driver answers NVML_ERROR_GPU_IS_LOST for its index.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut DeviceHandle,
) -> NvmlReturn {
    with_machine(|m, t| match m.gpus.get(index as usize) {
        _ if device.is_null() => ERROR_INVALID_ARGUMENT,
        None => ERROR_INVALID_ARGUMENT,
        Some(gpu) if gpu.lost_at(t) => ERROR_GPU_IS_LOST,
        Some(_) => {
            *device = scenario::gpu_handle(index as usize) as DeviceHandle;
            SUCCESS
        }
    })
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
    with_device(device, |d, _| answer(index, Ok(d.index() as c_uint)))
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
        let (total, reserved, used) = d.memory(t);
        (*memory).total = total;
        (*memory).reserved = reserved;
        (*memory).used = used;
        (*memory).free = total.saturating_sub(reserved + used);
        SUCCESS
    })
}

/// The first version: `used` is reserved and allocated together.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: DeviceHandle,
    memory: *mut Memory,
) -> NvmlReturn {
    with_device(device, |d, t| {
        if memory.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let (total, reserved, used) = d.memory(t);
        (*memory).total = total;
        (*memory).used = (reserved + used).min(total);
        (*memory).free = total.saturating_sub(reserved + used);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: DeviceHandle,
    utilization: *mut Utilization,
) -> NvmlReturn {
    with_device(device, |d, t| {
        let rates = d
            .utilization(t)
            .map(|(gpu, memory)| Utilization { gpu, memory });
        answer(utilization, rates)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: DeviceHandle,
    mw: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, t| answer(mw, d.power_mw(t)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: DeviceHandle,
    _sensor: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| answer(temp, d.temperature_c()))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: DeviceHandle,
    mj: *mut c_ulonglong,
) -> NvmlReturn {
    with_device(device, |d, t| answer(mj, d.energy_mj(t)))
}

/// The driver's protocol for process lists: with too small a buffer (the caller first asks with
/// 0 to learn the count) it answers INSUFFICIENT_SIZE and the count; with none running, SUCCESS.
unsafe fn list_processes(
    device: DeviceHandle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
    wanted: impl Fn(scenario::ProcessKind) -> bool,
) -> NvmlReturn {
    with_device(device, |d, t| {
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let procs: Vec<_> = d
            .processes(t)
            .into_iter()
            .filter(|l| wanted(l.process.kind))
            .collect();
        let capacity = *count as usize;
        *count = procs.len() as c_uint;
        if procs.is_empty() {
            return SUCCESS;
        }
        if infos.is_null() || capacity < procs.len() {
            return ERROR_INSUFFICIENT_SIZE;
        }
        for (i, l) in procs.iter().enumerate() {
            *infos.add(i) = ProcessInfo {
                pid: l.process.pid,
                used_gpu_memory: l.process.memory_used_bytes,
                gpu_instance_id: l.gpu_instance_id,
                compute_instance_id: l.compute_instance_id,
            };
        }
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: DeviceHandle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    list_processes(device, count, infos, scenario::ProcessKind::compute)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: DeviceHandle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    list_processes(device, count, infos, scenario::ProcessKind::graphics)
}

/// MPS is not simulated: no MPS clients.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: DeviceHandle,
    count: *mut c_uint,
    _infos: *mut ProcessInfo,
) -> NvmlReturn {
    with_device(device, |_, _| answer(count, Ok(0)))
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
        let Ok(procs) = d.process_utilization(t) else {
            return ERROR_NOT_SUPPORTED;
        };
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        // Like the driver: only processes with non-zero activity, only samples newer than asked.
        let active: Vec<_> = if now_us > last_seen_us {
            procs.into_iter().filter(|p| p.sm_util > 0).collect()
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
