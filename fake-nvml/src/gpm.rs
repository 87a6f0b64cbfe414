//! GPU Performance Monitoring: samples and metrics computed between two samples.
//!
//! A sample remembers which device (or MIG instance) it was taken on and when; the metrics are
//! what that device was doing at the second sample's time.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_void, CStr};

use crate::{with_device, DeviceHandle, NvmlReturn, STATE};
use crate::{
    ERROR_INVALID_ARGUMENT, ERROR_NOT_FOUND, ERROR_NOT_SUPPORTED, ERROR_UNINITIALIZED,
    ERROR_UNKNOWN, SUCCESS,
};

const METRIC_GRAPHICS_UTIL: c_uint = 1;
const METRIC_SM_UTIL: c_uint = 2;
const METRIC_DRAM_BW_UTIL: c_uint = 10;

struct Sample {
    handle: usize,
    at_s: f64,
}

#[repr(C)]
pub struct GpmSupport {
    version: c_uint,
    is_supported_device: c_uint,
}

#[repr(C)]
pub struct MetricInfo {
    short_name: *const c_char,
    long_name: *const c_char,
    unit: *const c_char,
}

#[repr(C)]
pub struct GpmMetric {
    metric_id: c_uint,
    nvml_return: NvmlReturn,
    value: f64,
    info: MetricInfo,
}

/// Only the header is declared: the metrics array that follows is as long as the caller's
/// NVML headers say, and only the first `num_metrics` entries are touched.
#[repr(C)]
pub struct GpmMetricsGet {
    version: c_uint,
    num_metrics: c_uint,
    sample1: *mut c_void,
    sample2: *mut c_void,
    metrics: [GpmMetric; 1],
}

fn elapsed() -> Option<f64> {
    let guard = STATE.lock().ok()?;
    guard.as_ref().map(|s| s.started.elapsed().as_secs_f64())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: DeviceHandle,
    support: *mut GpmSupport,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if support.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        (*support).is_supported_device = d.gpm_supported() as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut *mut c_void) -> NvmlReturn {
    if sample.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    *sample = Box::into_raw(Box::new(Sample {
        handle: 0,
        at_s: 0.0,
    })) as *mut c_void;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: *mut c_void) -> NvmlReturn {
    if sample.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    drop(Box::from_raw(sample as *mut Sample));
    SUCCESS
}

unsafe fn fill(sample: *mut c_void, handle: usize) -> NvmlReturn {
    let Some(at_s) = elapsed() else {
        return ERROR_UNINITIALIZED;
    };
    let s = sample as *mut Sample;
    (*s).handle = handle;
    (*s).at_s = at_s;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(device: DeviceHandle, sample: *mut c_void) -> NvmlReturn {
    let ok = with_device(device, |d, _| {
        if d.gpm_supported() {
            SUCCESS
        } else {
            ERROR_NOT_SUPPORTED
        }
    });
    if ok != SUCCESS || sample.is_null() {
        return if sample.is_null() {
            ERROR_INVALID_ARGUMENT
        } else {
            ok
        };
    }
    fill(sample, device as usize)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: DeviceHandle,
    gpu_instance_id: c_uint,
    sample: *mut c_void,
) -> NvmlReturn {
    let mut instance = 0usize;
    let found = with_device(device, |d, _| {
        if !d.gpm_supported() {
            return ERROR_NOT_SUPPORTED;
        }
        match d.mig_handle_by_instance_id(gpu_instance_id) {
            Some(h) => {
                instance = h;
                SUCCESS
            }
            None => ERROR_NOT_FOUND,
        }
    });
    if found != SUCCESS || sample.is_null() {
        return if sample.is_null() {
            ERROR_INVALID_ARGUMENT
        } else {
            found
        };
    }
    fill(sample, instance)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut GpmMetricsGet) -> NvmlReturn {
    if request.is_null() || (*request).sample1.is_null() || (*request).sample2.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let second = &*((*request).sample2 as *const Sample);
    let metrics = std::ptr::addr_of_mut!((*request).metrics) as *mut GpmMetric;
    let count = (*request).num_metrics as usize;
    let status = with_device(second.handle as DeviceHandle, |d, _| {
        let activity = d.activity(second.at_s);
        for i in 0..count {
            let m = &mut *metrics.add(i);
            let (value, name): (Option<u32>, &'static CStr) = match m.metric_id {
                METRIC_GRAPHICS_UTIL => (activity.map(|a| a.0), c"GR_UTIL"),
                METRIC_SM_UTIL => (activity.map(|a| a.0), c"SM_UTIL"),
                METRIC_DRAM_BW_UTIL => (activity.map(|a| a.1), c"DRAM_BW_UTIL"),
                _ => (None, c"UNSUPPORTED"),
            };
            m.info = MetricInfo {
                short_name: name.as_ptr(),
                long_name: name.as_ptr(),
                unit: c"%".as_ptr(),
            };
            match value {
                Some(v) => {
                    m.value = f64::from(v);
                    m.nvml_return = SUCCESS;
                }
                None => {
                    m.value = 0.0;
                    m.nvml_return = ERROR_NOT_SUPPORTED;
                }
            }
        }
        SUCCESS
    });
    if status == ERROR_INVALID_ARGUMENT {
        return ERROR_UNKNOWN;
    }
    status
}
