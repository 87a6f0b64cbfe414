//! What a machine's NVML answers to each call the agent makes (`gpuledger-agent probe`), as
//! JSON: a value, or the error the driver gave (`NotSupported`, `NotFound`, ...). Run on a real
//! GPU host, it is what the fake must answer when configured as that machine
//! (docs/real-gpus.md); attached to a bug report, it says what a driver does not give.

use std::ffi::c_uint;
use std::fmt::Debug;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::{Device, Nvml};
use serde_json::{json, Map, Value};

/// NVIDIA: GPM samples must be more than 100 ms apart; the probe waits a little longer.
const GPM_INTERVAL: Duration = Duration::from_millis(200);

/// Every answer: `{"system": {call: answer}, "devices": [{"index", "calls": {call: answer}}]}`,
/// a MIG device's under its GPU's `mig_devices`.
pub fn answers(nvml: &Nvml) -> Value {
    let mut system = Map::new();
    record(&mut system, "sys_driver_version", nvml.sys_driver_version());
    record(&mut system, "sys_nvml_version", nvml.sys_nvml_version());
    record(
        &mut system,
        "sys_cuda_driver_version",
        nvml.sys_cuda_driver_version(),
    );
    let count = nvml.device_count();
    let devices_found = *count.as_ref().unwrap_or(&0);
    record(&mut system, "device_count", count);
    let mut devices = Vec::new();
    for index in 0..devices_found {
        let mut calls = Map::new();
        match nvml.device_by_index(index) {
            Ok(device) => {
                probe_device(nvml, &device, &mut calls);
                probe_mig(nvml, &device, &mut calls);
            }
            Err(e) => record::<()>(&mut calls, "device_by_index", Err(e)),
        }
        devices.push(json!({ "index": index, "calls": calls }));
    }
    json!({ "system": system, "devices": devices })
}

/// A call's answer: `{"ok": value}` or `{"err": "NotSupported"}`.
fn record<T: Debug>(calls: &mut Map<String, Value>, name: &str, result: Result<T, NvmlError>) {
    let answer = match result {
        Ok(v) => json!({ "ok": format!("{v:?}") }),
        Err(e) => json!({ "err": format!("{e:?}") }),
    };
    calls.insert(name.to_owned(), answer);
}

/// The calls the agent makes on a GPU or a MIG device, and a few that explain their answers.
fn probe_device(nvml: &Nvml, device: &Device<'_>, calls: &mut Map<String, Value>) {
    record(calls, "name", device.name());
    record(calls, "uuid", device.uuid());
    record(calls, "index", device.index());
    record(calls, "architecture", device.architecture());
    record(
        calls,
        "cuda_compute_capability",
        device.cuda_compute_capability(),
    );
    record(calls, "memory_info", device.memory_info());
    record(calls, "utilization_rates", device.utilization_rates());
    record(calls, "power_usage", device.power_usage());
    record(calls, "enforced_power_limit", device.enforced_power_limit());
    record(
        calls,
        "total_energy_consumption",
        device.total_energy_consumption(),
    );
    record(
        calls,
        "temperature",
        device.temperature(TemperatureSensor::Gpu),
    );
    record(calls, "clock_info_sm", device.clock_info(Clock::SM));
    record(calls, "clock_info_memory", device.clock_info(Clock::Memory));
    record(calls, "performance_state", device.performance_state());
    record(
        calls,
        "is_in_persistent_mode",
        device.is_in_persistent_mode(),
    );
    record(calls, "compute_mode", device.compute_mode());
    record(calls, "is_ecc_enabled", device.is_ecc_enabled());
    record(calls, "encoder_utilization", device.encoder_utilization());
    record(calls, "decoder_utilization", device.decoder_utilization());
    record(
        calls,
        "is_accounting_enabled",
        device.is_accounting_enabled(),
    );
    record(
        calls,
        "supported_event_types",
        device.supported_event_types(),
    );
    record(calls, "mig_mode", device.mig_mode());
    record(calls, "mig_device_count", device.mig_device_count());
    record(calls, "attributes", device.attributes());
    let compute = device.running_compute_processes();
    if let Ok(processes) = &compute {
        let names: Vec<_> = processes
            .iter()
            .map(|p| (p.pid, nvml.sys_process_name(p.pid, 64)))
            .collect();
        record(calls, "sys_process_name", Ok::<_, NvmlError>(names));
    }
    record(calls, "running_compute_processes", compute);
    record(
        calls,
        "running_graphics_processes",
        device.running_graphics_processes(),
    );
    // The agent asks for the stats since its last sample; a second back shows recent work.
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| (d.as_micros() as u64).saturating_sub(1_000_000))
        .unwrap_or(0);
    record(
        calls,
        "process_utilization_stats",
        device.process_utilization_stats(since),
    );
    record(calls, "gpm_support", device.gpm_support());
    record(calls, "gpm_metrics", gpm_whole_device(nvml, device));
}

/// GPM over the whole device: two samples GPM_INTERVAL apart (Hopper and newer, not in MIG mode).
fn gpm_whole_device(nvml: &Nvml, device: &Device<'_>) -> Result<Vec<String>, NvmlError> {
    gpm(nvml, || device.gpm_sample())
}

/// GPM's activity between two samples `sample` takes GPM_INTERVAL apart: the agent's two metrics
/// and two more, each with the driver's names.
fn gpm<'a>(
    nvml: &'a Nvml,
    sample: impl Fn() -> Result<nvml_wrapper::GpmSample<'a>, NvmlError>,
) -> Result<Vec<String>, NvmlError> {
    let before = sample()?;
    let at = Instant::now();
    std::thread::sleep(GPM_INTERVAL);
    let after = sample()?;
    let metrics = [
        GpmMetricId::GraphicsUtil,
        GpmMetricId::SmUtil,
        GpmMetricId::AnyTensorUtil,
        GpmMetricId::DramBwUtil,
    ];
    let results = gpm_metrics_get(nvml, &before, &after, &metrics)?;
    let mut out = vec![format!("interval {:?}", at.elapsed())];
    out.extend(results.iter().map(|r| format!("{r:?}")));
    Ok(out)
}

/// A GPU's MIG profiles (the agent's compute slices: every `NVML_GPU_INSTANCE_PROFILE_*`
/// constant nvml.h defines, 0 to 15) and, in MIG mode, each MIG device's answers, where it sits
/// and its GPM activity.
fn probe_mig(nvml: &Nvml, device: &Device<'_>, calls: &mut Map<String, Value>) {
    let mut profiles = Map::new();
    for profile in 0..16 {
        let answer = device.profile_info(profile);
        let stop = matches!(answer, Err(NvmlError::InvalidArg));
        record(&mut profiles, &profile.to_string(), answer);
        if stop {
            break;
        }
    }
    calls.insert("profile_info".into(), Value::Object(profiles));
    let Ok(slots) = device.mig_device_count() else {
        return;
    };
    let mut children = Vec::new();
    for slot in 0..slots {
        let mut child = Map::new();
        match device.mig_device_by_index(slot) {
            Ok(instance) => {
                probe_device(nvml, &instance, &mut child);
                // Where it sits, with the raw calls the agent makes (nvml-wrapper has none).
                let id = |call: Result<&unsafe extern "C" fn(_, *mut c_uint) -> _, _>| {
                    let call = nvml_sym(call)?;
                    let mut id: c_uint = 0;
                    // SAFETY: the handle comes from this live `Nvml`; `id` is a valid out-pointer.
                    nvml_try(unsafe { call(instance.handle(), &mut id) })?;
                    Ok::<_, NvmlError>(id)
                };
                let lib = nvml.lib();
                let gi = id(lib.nvmlDeviceGetGpuInstanceId.as_ref());
                let ci = id(lib.nvmlDeviceGetComputeInstanceId.as_ref());
                if let Ok(gi) = &gi {
                    let metrics = gpm(nvml, || device.gpm_mig_sample(*gi));
                    record(&mut child, "gpm_mig_metrics", metrics);
                }
                record(&mut child, "gpu_instance_id", gi);
                record(&mut child, "compute_instance_id", ci);
            }
            Err(e) => record::<()>(&mut child, "mig_device_by_index", Err(e)),
        }
        children.push(json!({ "slot": slot, "calls": child }));
    }
    calls.insert("mig_devices".into(), Value::Array(children));
}
