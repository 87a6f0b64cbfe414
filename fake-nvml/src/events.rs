//! NVML events: critical XID errors delivered to event sets waiting on a GPU, as the scenario's
//! `xid` faults say. As on Linux, each XID is delivered once to each set; a set waiting on a GPU
//! that fell off the bus delivers the XIDs that came before and then answers
//! NVML_ERROR_GPU_IS_LOST.

#![allow(clippy::missing_safety_doc)]

use std::collections::BTreeSet;
use std::ffi::{c_uint, c_ulonglong, c_void};
use std::time::{Duration, Instant};

use crate::catalogue::Arch;
use crate::scenario::{Device, GpuFaultKind};
use crate::{with_device, with_machine, DeviceHandle, NvmlReturn};
use crate::{
    ERROR_GPU_IS_LOST, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED, ERROR_TIMEOUT, SUCCESS,
};

/// `nvmlEventTypeXidCriticalError`.
const XID_CRITICAL_ERROR: c_ulonglong = 0x8;
/// Single- and double-bit ECC errors: registrable, never raised here.
const ECC_ERRORS: c_ulonglong = 0x1 | 0x2;
/// What else a real H200 (driver 580) answers it supports: P-state, clock and power-source
/// changes and MIG configuration changes (docs/real-gpus.md). Registrable, never raised here.
const HOPPER_OTHERS: c_ulonglong = 0x4 | 0x10 | 0x80 | 0x100;

#[repr(C)]
pub struct EventData {
    device: DeviceHandle,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[derive(Default)]
struct EventSet {
    /// GPU indexes waited on, with the event types asked for and when (only what happens
    /// after is delivered).
    devices: Vec<(usize, c_ulonglong, f64)>,
    /// (GPU index, fault index) already delivered.
    delivered: BTreeSet<(usize, usize)>,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut c_void) -> NvmlReturn {
    if set.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    with_machine(|_, _| {
        *set = Box::into_raw(Box::<EventSet>::default()) as *mut c_void;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: *mut c_void) -> NvmlReturn {
    if set.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    drop(Box::from_raw(set as *mut EventSet));
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: DeviceHandle,
    types: *mut c_ulonglong,
) -> NvmlReturn {
    with_device(device, |d, _| match d {
        Device::Mig { .. } => ERROR_NOT_SUPPORTED,
        Device::Gpu { gpu, .. } => {
            // Older models as seen on none: the events the agent waits for.
            let others = if gpu.model.arch >= Arch::Hopper {
                HOPPER_OTHERS
            } else {
                0
            };
            crate::answer(types, Ok(XID_CRITICAL_ERROR | ECC_ERRORS | others))
        }
    })
}

/// Events are waited on per GPU: MIG device handles cannot be registered.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: DeviceHandle,
    types: c_ulonglong,
    set: *mut c_void,
) -> NvmlReturn {
    if set.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d, t| match d {
        Device::Mig { .. } => ERROR_NOT_SUPPORTED,
        Device::Gpu { index, .. } => {
            let set = &mut *(set as *mut EventSet);
            set.devices.push((*index, types, t));
            SUCCESS
        }
    })
}

/// The next event for `set` now: an XID not yet delivered, or GPU_IS_LOST.
unsafe fn next_event(set: &mut EventSet, data: *mut EventData) -> Option<NvmlReturn> {
    let mut found = None;
    with_machine(|machine, t| {
        for &(index, types, since) in &set.devices {
            let Some(gpu) = machine.gpus.get(index) else {
                continue;
            };
            let lost = gpu.lost_at(t);
            if types & XID_CRITICAL_ERROR == 0 {
                if lost {
                    found = Some(ERROR_GPU_IS_LOST);
                    return SUCCESS;
                }
                continue;
            }
            let due = gpu.faults.iter().enumerate().find(|(i, f)| {
                f.kind == GpuFaultKind::Xid
                    && f.at_s <= t
                    && f.at_s >= since
                    && !set.delivered.contains(&(index, *i))
            });
            if let Some((i, fault)) = due {
                set.delivered.insert((index, i));
                *data = EventData {
                    device: crate::scenario::gpu_handle(index) as DeviceHandle,
                    event_type: XID_CRITICAL_ERROR,
                    event_data: fault.xid.unwrap_or(999),
                    gpu_instance_id: u32::MAX,
                    compute_instance_id: u32::MAX,
                };
                found = Some(SUCCESS);
                return SUCCESS;
            }
            // The XIDs that came with it (79: fallen off the bus) first, then the loss.
            if lost {
                found = Some(ERROR_GPU_IS_LOST);
                return SUCCESS;
            }
        }
        SUCCESS
    });
    found
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut c_void,
    data: *mut EventData,
    timeout_ms: c_uint,
) -> NvmlReturn {
    if set.is_null() || data.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let set = &mut *(set as *mut EventSet);
    let until = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        if let Some(rc) = next_event(set, data) {
            return rc;
        }
        let now = Instant::now();
        if now >= until {
            return ERROR_TIMEOUT;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(10)));
    }
}
