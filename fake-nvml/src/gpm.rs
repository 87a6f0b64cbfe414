//! GPU Performance Monitoring: samples and metrics computed between two samples.
//!
//! GPM is Hopper and newer. A sample remembers which device (or GPU instance) it was taken on and
//! when; the metrics are what that device was doing at the second sample's time. NVIDIA documents
//! that samples must be more than 100 ms apart (the driver refreshes them no faster) and not what
//! happens otherwise: here each metric then answers NVML_ERROR_INVALID_ARGUMENT.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_void, CStr};

use crate::{now_s, with_device, DeviceHandle, NvmlReturn};
use crate::{
    ERROR_ARGUMENT_VERSION_MISMATCH, ERROR_INVALID_ARGUMENT, ERROR_NOT_FOUND, ERROR_NOT_SUPPORTED,
    SUCCESS,
};

const METRIC_GRAPHICS_UTIL: c_uint = 1;
const METRIC_SM_UTIL: c_uint = 2;
const METRIC_DRAM_BW_UTIL: c_uint = 10;

/// The shortest interval between two samples whose metrics mean anything.
const MIN_INTERVAL_S: f64 = 0.1;

struct Sample {
    handle: usize,
    /// Set for a sample of one GPU instance (`nvmlGpmMigSampleGet`).
    gpu_instance_id: Option<c_uint>,
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

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: DeviceHandle,
    support: *mut GpmSupport,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if support.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        if (*support).version != 1 {
            return ERROR_ARGUMENT_VERSION_MISMATCH;
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
        gpu_instance_id: None,
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

unsafe fn fill(sample: *mut c_void, handle: usize, gpu_instance_id: Option<c_uint>) -> NvmlReturn {
    let s = sample as *mut Sample;
    (*s).handle = handle;
    (*s).gpu_instance_id = gpu_instance_id;
    (*s).at_s = now_s();
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
    fill(sample, device as usize, None)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: DeviceHandle,
    gpu_instance_id: c_uint,
    sample: *mut c_void,
) -> NvmlReturn {
    let found = with_device(device, |d, _| {
        if !d.gpm_supported() {
            return ERROR_NOT_SUPPORTED;
        }
        match d.mig_handle_by_instance_id(gpu_instance_id) {
            Some(_) => SUCCESS,
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
    fill(sample, device as usize, Some(gpu_instance_id))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut GpmMetricsGet) -> NvmlReturn {
    if request.is_null() || (*request).sample1.is_null() || (*request).sample2.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let first = &*((*request).sample1 as *const Sample);
    let second = &*((*request).sample2 as *const Sample);
    if (first.handle, first.gpu_instance_id) != (second.handle, second.gpu_instance_id) {
        return ERROR_INVALID_ARGUMENT;
    }
    let too_close = second.at_s - first.at_s <= MIN_INTERVAL_S;
    let metrics = std::ptr::addr_of_mut!((*request).metrics) as *mut GpmMetric;
    let count = (*request).num_metrics as usize;
    with_device(second.handle as DeviceHandle, |d, _| {
        let activity = match second.gpu_instance_id {
            Some(gi) => d.instance_activity(gi, second.at_s),
            None => Some(d.activity(second.at_s)),
        };
        for i in 0..count {
            let m = &mut *metrics.add(i);
            // Names as a real H200's driver gives them.
            let (value, short, long): (Option<u32>, &'static CStr, &'static CStr) =
                match m.metric_id {
                    METRIC_GRAPHICS_UTIL => (activity.map(|a| a.0), c"gract", c"GRAPHICS_UTIL"),
                    METRIC_SM_UTIL => (activity.map(|a| a.0), c"smutil", c"SM_UTIL"),
                    METRIC_DRAM_BW_UTIL => (activity.map(|a| a.1), c"dram", c"DRAM_BW_UTIL"),
                    _ => (None, c"UNSUPPORTED", c"UNSUPPORTED"),
                };
            m.info = MetricInfo {
                short_name: short.as_ptr(),
                long_name: long.as_ptr(),
                unit: c"%".as_ptr(),
            };
            m.value = 0.0;
            m.nvml_return = match value {
                _ if too_close => ERROR_INVALID_ARGUMENT,
                Some(v) => {
                    m.value = f64::from(v);
                    SUCCESS
                }
                None => ERROR_NOT_SUPPORTED,
            };
        }
        SUCCESS
    })
}
