//! MIG: modes, device handles, instance ids, attributes and GPU-instance profiles, answered from
//! the model's profile table as a real driver answers them.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_ulonglong};

use crate::catalogue::{GiProfile, GI_PROFILE_COUNT};
use crate::scenario::{Device, NotSupported};
use crate::{answer, with_device, DeviceHandle, NvmlReturn};
use crate::{
    ERROR_ARGUMENT_VERSION_MISMATCH, ERROR_INVALID_ARGUMENT, ERROR_NOT_FOUND, ERROR_NOT_SUPPORTED,
    SUCCESS,
};

#[repr(C)]
pub struct DeviceAttributes {
    multiprocessor_count: c_uint,
    shared_copy_engine_count: c_uint,
    shared_decoder_count: c_uint,
    shared_encoder_count: c_uint,
    shared_jpeg_count: c_uint,
    shared_ofa_count: c_uint,
    gpu_instance_slice_count: c_uint,
    compute_instance_slice_count: c_uint,
    memory_size_mb: c_ulonglong,
}

#[repr(C)]
pub struct GpuInstanceProfileInfo {
    id: c_uint,
    is_p2p_supported: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    copy_engine_count: c_uint,
    decoder_count: c_uint,
    encoder_count: c_uint,
    jpeg_count: c_uint,
    ofa_count: c_uint,
    memory_size_mb: c_ulonglong,
}

/// `nvmlGpuInstanceProfileInfo_v2_t`: the version, then the first version's fields laid out
/// flat (not as a nested struct, whose alignment would move them), then the name.
#[repr(C)]
pub struct GpuInstanceProfileInfoV2 {
    version: c_uint,
    id: c_uint,
    is_p2p_supported: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    copy_engine_count: c_uint,
    decoder_count: c_uint,
    encoder_count: c_uint,
    jpeg_count: c_uint,
    ofa_count: c_uint,
    memory_size_mb: c_ulonglong,
    name: [c_char; 96],
}

/// `nvmlGpuInstanceProfileInfo_v2`: the struct's size (152 bytes, as nvml.h has it) with the
/// version in the top byte.
const PROFILE_INFO_V2: c_uint =
    (std::mem::size_of::<GpuInstanceProfileInfoV2>() as c_uint) | 2 << 24;

fn info(p: &GiProfile) -> GpuInstanceProfileInfo {
    GpuInstanceProfileInfo {
        id: p.id,
        is_p2p_supported: 0,
        slice_count: p.slices,
        instance_count: p.instances,
        multiprocessor_count: p.multiprocessors,
        copy_engine_count: p.copy_engines,
        decoder_count: p.decoders,
        encoder_count: p.encoders,
        jpeg_count: p.jpegs,
        ofa_count: p.ofas,
        memory_size_mb: p.memory_mib,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: DeviceHandle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| match d.mig_mode() {
        _ if current.is_null() || pending.is_null() => ERROR_INVALID_ARGUMENT,
        Ok(on) => {
            *current = c_uint::from(on);
            *pending = c_uint::from(on);
            SUCCESS
        }
        Err(NotSupported) => ERROR_NOT_SUPPORTED,
    })
}

/// The most MIG devices the GPU can have (its compute slices) in MIG mode, else 0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: DeviceHandle,
    count: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| answer(count, Ok(d.max_mig_devices())))
}

/// Slots past the devices that exist (up to the maximum) answer NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: DeviceHandle,
    index: c_uint,
    mig: *mut DeviceHandle,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if mig.is_null() || d.mig_device().is_some() {
            return ERROR_INVALID_ARGUMENT;
        }
        if d.mig_mode().is_err() {
            return ERROR_NOT_SUPPORTED;
        }
        match d.mig_handle(index as usize) {
            Some(h) => {
                *mig = h as DeviceHandle;
                SUCCESS
            }
            None if index < d.max_mig_devices() => ERROR_NOT_FOUND,
            None => ERROR_INVALID_ARGUMENT,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: DeviceHandle,
    is_mig: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| {
        answer(is_mig, Ok(c_uint::from(d.mig_device().is_some())))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    device: DeviceHandle,
    parent: *mut DeviceHandle,
) -> NvmlReturn {
    with_device(device, |d, _| match d.parent_handle() {
        Some(h) => answer(parent, Ok(h as DeviceHandle)),
        None => ERROR_INVALID_ARGUMENT,
    })
}

fn mig_value<T>(
    d: &Device,
    f: impl Fn(&crate::scenario::MigDevice) -> T,
) -> Result<T, NotSupported> {
    d.mig_device().map(f).ok_or(NotSupported)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: DeviceHandle,
    id: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| {
        answer(id, mig_value(d, |m| m.gpu_instance_id))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: DeviceHandle,
    id: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |d, _| {
        answer(id, mig_value(d, |m| m.compute_instance_id))
    })
}

/// Only MIG device handles have attributes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: DeviceHandle,
    attributes: *mut DeviceAttributes,
) -> NvmlReturn {
    with_device(device, |d, _| {
        let value = mig_value(d, |m| DeviceAttributes {
            multiprocessor_count: m.multiprocessors(),
            shared_copy_engine_count: m.profile.copy_engines,
            shared_decoder_count: m.profile.decoders,
            shared_encoder_count: m.profile.encoders,
            shared_jpeg_count: m.profile.jpegs,
            shared_ofa_count: m.profile.ofas,
            gpu_instance_slice_count: m.profile.slices,
            compute_instance_slice_count: m.compute_slices,
            memory_size_mb: m.profile.memory_mib,
        });
        answer(attributes, value)
    })
}

/// A GPU-instance profile of a MIG-capable GPU, by `NVML_GPU_INSTANCE_PROFILE_*` constant:
/// constants past the known ones are INVALID_ARGUMENT (where callers stop), known ones the GPU
/// lacks NOT_SUPPORTED.
fn profile_of(d: &Device, constant: c_uint) -> Result<&'static GiProfile, NvmlReturn> {
    if d.mig_device().is_some() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let table = d.gpu().mig_table().ok_or(ERROR_NOT_SUPPORTED)?;
    if constant >= GI_PROFILE_COUNT {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    table
        .profile_by_constant(constant)
        .ok_or(ERROR_NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: DeviceHandle,
    profile: c_uint,
    out: *mut GpuInstanceProfileInfo,
) -> NvmlReturn {
    with_device(device, |d, _| match profile_of(d, profile) {
        Ok(p) => answer(out, Ok(info(p))),
        Err(rc) => rc,
    })
}

/// The versioned call, with the profile's name; it needs MIG mode on.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: DeviceHandle,
    profile: c_uint,
    out: *mut GpuInstanceProfileInfoV2,
) -> NvmlReturn {
    with_device(device, |d, _| {
        if out.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        if (*out).version != PROFILE_INFO_V2 {
            return ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        if !matches!(d.mig_mode(), Ok(true)) {
            return ERROR_NOT_SUPPORTED;
        }
        match profile_of(d, profile) {
            Ok(p) => {
                let i = info(p);
                let o = &mut *out;
                o.id = i.id;
                o.is_p2p_supported = i.is_p2p_supported;
                o.slice_count = i.slice_count;
                o.instance_count = i.instance_count;
                o.multiprocessor_count = i.multiprocessor_count;
                o.copy_engine_count = i.copy_engine_count;
                o.decoder_count = i.decoder_count;
                o.encoder_count = i.encoder_count;
                o.jpeg_count = i.jpeg_count;
                o.ofa_count = i.ofa_count;
                o.memory_size_mb = i.memory_size_mb;
                o.name = [0; 96];
                crate::write_str(&format!("MIG {}", p.name), (*out).name.as_mut_ptr(), 96)
            }
            Err(rc) => rc,
        }
    })
}
