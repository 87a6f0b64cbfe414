//! The fake NVML against real hardware: for every real `nvidia-smi` capture in
//! `../shared/nvml-captures/`, the fake configured as that machine answers the same, field by
//! field, through the real `nvml-wrapper` calls the agent makes: names, memory (total, reserved,
//! used, free), utilization and power (a value, or NOT_SUPPORTED where the capture shows N/A),
//! temperature, MIG mode, MIG devices (instance ids, SMs, engines, memory) and processes (compute
//! and graphics, with their instance ids). The MIG profile tables are checked against a real H100
//! `mig -lgip` listing and NVIDIA's own tables; what no capture shows (energy, GPM, faults) is
//! checked against NVIDIA's documentation.

use crate::support;

use std::ffi::c_uint;
use std::sync::Mutex;
use std::time::Duration;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use serde_json::{json, Value};
use support::captures::{self, Capture, CapturedGpu, Reading};

const MIB: u64 = 1 << 20;

/// The fake is one library with one state per process: one session at a time.
static FAKE: Mutex<()> = Mutex::new(());

/// Runs `f` against the fake NVML configured with `scenario`.
fn with_fake<T>(scenario: &Value, f: impl FnOnce(&Nvml) -> T) -> T {
    let _one = FAKE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scenario.json");
    std::fs::write(&path, scenario.to_string()).unwrap();
    std::env::set_var("FAKE_NVML_SCENARIO", &path);
    let lib = support::artifact("libfake_nvml.so");
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap_or_else(|e| panic!("fake NVML for {scenario}: {e}"));
    f(&nvml)
}

/// Each MIG profile of `model` as the fake's driver lists it: (name, memory MiB, SMs, profile
/// info), in `NVML_GPU_INSTANCE_PROFILE_*` order.
fn profiles(
    model: &str,
) -> Vec<(
    String,
    u64,
    u32,
    nvml_wrapper::struct_wrappers::device::ProfileInfo,
)> {
    let scenario = json!({"gpus": [{"model": model, "uuid": "GPU-probe", "mig_mode": true}]});
    with_fake(&scenario, |nvml| {
        let device = nvml.device_by_index(0).unwrap();
        let mut out = Vec::new();
        for constant in 0.. {
            match device.profile_info(constant) {
                Ok(info) => {
                    let (name, v2) = profile_v2(nvml, &device, constant);
                    // The versioned call answers the same figures, each at nvml.h's offset.
                    assert_eq!(
                        (
                            v2.id,
                            v2.sliceCount,
                            v2.instanceCount,
                            v2.multiprocessorCount,
                            v2.memorySizeMB
                        ),
                        (
                            info.id,
                            info.slice_count,
                            info.instance_count,
                            info.multiprocessor_count,
                            info.memory_size_mb
                        ),
                        "{model} profile {constant}"
                    );
                    out.push((name, info.memory_size_mb, info.multiprocessor_count, info))
                }
                Err(NvmlError::NotSupported) => continue,
                Err(NvmlError::InvalidArg) => break,
                Err(e) => panic!("{model} profile {constant}: {e}"),
            }
        }
        out
    })
}

/// A profile's name (`1g.10gb`) and the versioned call's answer (nvml-wrapper does not wrap it).
fn profile_v2(
    nvml: &Nvml,
    device: &Device<'_>,
    constant: c_uint,
) -> (
    String,
    nvml_wrapper_sys::bindings::nvmlGpuInstanceProfileInfo_v2_t,
) {
    use nvml_wrapper_sys::bindings::nvmlGpuInstanceProfileInfo_v2_t;
    let get = nvml
        .lib()
        .nvmlDeviceGetGpuInstanceProfileInfoV
        .as_ref()
        .expect("the fake exports nvmlDeviceGetGpuInstanceProfileInfoV");
    // SAFETY: a zeroed plain C struct with its version set, and a live handle.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as c_uint | 2 << 24;
    let rc = unsafe { get(device.handle(), constant, &mut info) };
    assert_eq!(rc, 0, "profile {constant}");
    let name: Vec<u8> = info
        .name
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    let name = String::from_utf8(name)
        .unwrap()
        .trim_start_matches("MIG ")
        .to_owned();
    (name, info)
}

/// A MIG device's GPU or compute instance id (nvml-wrapper has no call for either).
fn instance_ids(nvml: &Nvml, device: &Device<'_>) -> (Option<u32>, Option<u32>) {
    let lib = nvml.lib();
    let ask = |f: Option<&unsafe extern "C" fn(_, *mut c_uint) -> _>| {
        let f = f?;
        let mut id: c_uint = 0;
        // SAFETY: a live handle and a valid out-pointer.
        let rc: u32 = unsafe { f(device.handle(), &mut id) };
        (rc == 0).then_some(id)
    };
    (
        ask(lib.nvmlDeviceGetGpuInstanceId.as_ref().ok()),
        ask(lib.nvmlDeviceGetComputeInstanceId.as_ref().ok()),
    )
}

/// Where the fake answers otherwise than the captured driver, one line each.
fn differences(capture: &Capture, nvml: &Nvml) -> Vec<String> {
    let mut out = Vec::new();
    fn check(out: &mut Vec<String>, ok: bool, what: String) {
        if !ok {
            out.push(what);
        }
    }
    check(
        &mut out,
        nvml.device_count().ok() == Some(capture.gpus.len() as u32),
        format!("device count {:?}", nvml.device_count()),
    );
    for (i, g) in capture.gpus.iter().enumerate() {
        let at = format!("GPU {i} ({})", g.name);
        let d = nvml.device_by_index(i as u32).unwrap();
        check(
            &mut out,
            d.name().ok().as_deref() == Some(g.name.as_str()),
            format!("{at}: name {:?}", d.name()),
        );
        if !g.uuid.is_empty() {
            check(
                &mut out,
                d.uuid().ok() == Some(g.uuid.clone()),
                format!("{at}: uuid {:?}", d.uuid()),
            );
        }
        let m = d.memory_info().unwrap();
        check(
            &mut out,
            m.total / MIB == g.memory_total_mib,
            format!(
                "{at}: total {} MiB, captured {}",
                m.total / MIB,
                g.memory_total_mib
            ),
        );
        if let Some(r) = g.memory_reserved_mib {
            check(
                &mut out,
                m.reserved / MIB == r,
                format!("{at}: reserved {} MiB, captured {r}", m.reserved / MIB),
            );
        }
        check(
            &mut out,
            m.used / MIB == g.memory_used_mib,
            format!(
                "{at}: used {} MiB, captured {}",
                m.used / MIB,
                g.memory_used_mib
            ),
        );
        // nvidia-smi rounds reserved, used and free down to MiB each on its own: their sum may
        // fall 2 MiB short of the total, or pass it.
        check(
            &mut out,
            (m.free / MIB).abs_diff(g.memory_free_mib) <= 2,
            format!(
                "{at}: free {} MiB, captured {}",
                m.free / MIB,
                g.memory_free_mib
            ),
        );
        let util = d.utilization_rates();
        check(
            &mut out,
            answers(&util.as_ref().map(|u| u.gpu).map_err(clone_err), g.gpu_util),
            format!("{at}: gpu utilization {util:?}, captured {:?}", g.gpu_util),
        );
        check(
            &mut out,
            answers(
                &util.as_ref().map(|u| u.memory).map_err(clone_err),
                g.memory_util,
            ),
            format!(
                "{at}: memory utilization {util:?}, captured {:?}",
                g.memory_util
            ),
        );
        let power = d.power_usage();
        let power_ok = match (&power, g.power_w) {
            (Ok(mw), Reading::Value(w)) => (f64::from(*mw) / 1000.0 - w).abs() < 0.006,
            (Err(NvmlError::NotSupported), Reading::NotAvailable) => true,
            (_, Reading::Absent) => true,
            _ => false,
        };
        check(
            &mut out,
            power_ok,
            format!("{at}: power {power:?}, captured {:?}", g.power_w),
        );
        let temp = d.temperature(nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu);
        check(
            &mut out,
            answers(&temp.map_err(clone_err_owned), g.temperature_c),
            format!("{at}: temperature, captured {:?}", g.temperature_c),
        );
        let mode = d.mig_mode();
        let mode_ok = match (&mode, g.mig_mode) {
            (Ok(mode), Reading::Value(on)) => {
                (mode.current == 1) == on && mode.pending == mode.current
            }
            (Err(NvmlError::NotSupported), Reading::NotAvailable | Reading::Absent) => true,
            _ => false,
        };
        check(
            &mut out,
            mode_ok,
            format!("{at}: MIG mode {mode:?}, captured {:?}", g.mig_mode),
        );
        if g.mig_mode == Reading::Value(true) {
            out.extend(mig_differences(nvml, &d, g, &at));
        }
        out.extend(process_differences(nvml, &d, g, &at));
    }
    out
}

fn clone_err(e: &NvmlError) -> NvmlError {
    match e {
        NvmlError::NotSupported => NvmlError::NotSupported,
        _ => NvmlError::Unknown,
    }
}

fn clone_err_owned(e: NvmlError) -> NvmlError {
    clone_err(&e)
}

/// Whether NVML's answer is what the capture shows: the value, or NOT_SUPPORTED for N/A.
fn answers(answer: &Result<u32, NvmlError>, captured: Reading<u32>) -> bool {
    match (answer, captured) {
        (Ok(v), Reading::Value(c)) => *v == c,
        (Err(NvmlError::NotSupported), Reading::NotAvailable) => true,
        (_, Reading::Absent) => true,
        _ => false,
    }
}

fn mig_differences(nvml: &Nvml, d: &Device<'_>, g: &CapturedGpu, at: &str) -> Vec<String> {
    let mut out = Vec::new();
    let max = d.mig_device_count().unwrap();
    if max != 7 {
        out.push(format!("{at}: max MIG devices {max}, an A100 has 7"));
    }
    let mut devices = Vec::new();
    for j in 0..max {
        match d.mig_device_by_index(j) {
            Ok(m) => devices.push(m),
            Err(NvmlError::NotFound) => {}
            Err(e) => out.push(format!("{at}: MIG slot {j}: {e}")),
        }
    }
    if devices.len() != g.mig.len() {
        out.push(format!(
            "{at}: {} MIG devices, captured {}",
            devices.len(),
            g.mig.len()
        ));
    }
    for (m, c) in devices.iter().zip(&g.mig) {
        let at = format!("{at} MIG {}", c.index);
        let (gi, ci) = instance_ids(nvml, m);
        if (gi, ci) != (Some(c.gpu_instance_id), Some(c.compute_instance_id)) {
            out.push(format!(
                "{at}: instance ids {gi:?}/{ci:?}, captured {}/{}",
                c.gpu_instance_id, c.compute_instance_id
            ));
        }
        if m.index().ok() != Some(c.index) {
            out.push(format!("{at}: index {:?}", m.index()));
        }
        match m.attributes() {
            Ok(a) => {
                let got = (
                    a.multiprocessor_count,
                    a.shared_copy_engine_count,
                    a.shared_decoder_count,
                    a.shared_encoder_count,
                    a.shared_jpeg_count,
                    a.shared_ofa_count,
                );
                let want = (
                    c.multiprocessors,
                    c.copy_engines,
                    c.decoders,
                    c.encoders,
                    c.jpegs,
                    c.ofas,
                );
                if got != want {
                    out.push(format!("{at}: attributes {got:?}, captured {want:?}"));
                }
            }
            Err(e) => out.push(format!("{at}: attributes {e}")),
        }
        let mem = m.memory_info().unwrap();
        if (mem.total / MIB, mem.used / MIB) != (c.memory_total_mib, c.memory_used_mib) {
            out.push(format!(
                "{at}: memory {}/{} MiB, captured {}/{}",
                mem.total / MIB,
                mem.used / MIB,
                c.memory_total_mib,
                c.memory_used_mib
            ));
        }
        // nvidia-smi shows no utilization, power or temperature for a MIG device.
        for (what, answer) in [
            ("utilization", m.utilization_rates().map(|_| ())),
            ("power", m.power_usage().map(|_| ())),
            (
                "process utilization",
                m.process_utilization_stats(None).map(|_| ()),
            ),
        ] {
            if !matches!(answer, Err(NvmlError::NotSupported)) {
                out.push(format!("{at}: {what} {answer:?}, a MIG device has none"));
            }
        }
    }
    out
}

fn process_differences(nvml: &Nvml, d: &Device<'_>, g: &CapturedGpu, at: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (kind, listed) in [
        ("C", d.running_compute_processes()),
        ("G", d.running_graphics_processes()),
    ] {
        let listed = listed.unwrap();
        let want: Vec<_> = g
            .processes
            .iter()
            .filter(|p| p.kind.contains(kind))
            .collect();
        if listed.len() != want.len() {
            out.push(format!(
                "{at}: {} {kind} processes, captured {}",
                listed.len(),
                want.len()
            ));
            continue;
        }
        for (p, c) in listed.iter().zip(want) {
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b / MIB),
                UsedGpuMemory::Unavailable => None,
            };
            let got = (p.pid, used, p.gpu_instance_id, p.compute_instance_id);
            let wanted = (c.pid, c.used_mib, c.gpu_instance_id, c.compute_instance_id);
            if got != wanted {
                out.push(format!("{at}: {kind} process {got:?}, captured {wanted:?}"));
            }
            let name = nvml.sys_process_name(p.pid, 1024).ok();
            if name.as_deref() != Some(c.name.as_str()) {
                out.push(format!(
                    "{at}: process {} named {name:?}, captured {:?}",
                    p.pid, c.name
                ));
            }
        }
    }
    out
}

#[test]
fn the_fake_answers_every_capture_as_the_real_driver_did() {
    let all = captures::all();
    assert!(all.len() >= 17, "captures found: {}", all.len());
    let mut report = Vec::new();
    let mut gpus = 0;
    for capture in &all {
        let scenario = captures::scenario(capture, |g| {
            profiles(captures::model_of(g))
                .into_iter()
                .map(|(name, mib, sms, _)| (name, mib, sms))
                .collect()
        });
        let diffs = with_fake(&scenario, |nvml| differences(capture, nvml));
        gpus += capture.gpus.len();
        for d in diffs {
            report.push(format!("{}: {d}", capture.file.display()));
        }
        for g in &capture.gpus {
            if let Some(why) = captures::total_as_captured(&capture.file, g) {
                eprintln!("{}: configured as captured: {why}", capture.file.display());
            }
        }
    }
    assert!(gpus >= 38, "GPUs in the captures: {gpus}");
    assert!(
        report.is_empty(),
        "the fake differs from real drivers:\n{}",
        report.join("\n")
    );
}

/// `text` with the value after each `field: ` replaced by `_` (up to the next `,` or ` }`).
fn masked(text: &str, field: &str) -> String {
    let needle = format!("{field}: ");
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(&needle) {
        let start = at + needle.len();
        out.push_str(&rest[..start]);
        out.push('_');
        let tail = &rest[start..];
        let end = tail.find([',', ' ']).unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// What the agent's probe read on a real H200 (docs/real-gpus/), idle and under load: the fake
/// configured as that machine answers each call the agent makes the same. Readings that change
/// by the second (power, temperature, energy, GPM's percentages, sample times) are compared by
/// whether they answered, and what error; the rest value for value.
#[test]
fn the_fake_answers_as_a_real_h200_did() {
    let real = |file: &str| -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs/real-gpus")
            .join(file);
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    };
    let gpu = |phase: Value| {
        json!({"driver_version": "580.159.04", "gpus": [{
            "model": "NVIDIA H200", "uuid": "GPU-REDACTED",
            // The machine's own, to the byte (the catalogue's is whole MiB).
            "memory_reserved_bytes": 644_939_776_u64,
            "power_mw": 80443, "temperature_c": 44, "phases": [phase]
        }]})
    };
    let idle = gpu(json!({"at_s": 0, "gpu_util": 0, "mem_util": 0, "memory_used_bytes": 0}));
    let busy = gpu(json!({
        "at_s": 0, "gpu_util": 100, "mem_util": 25, "memory_used_bytes": 1_194_131_456_u64,
        "processes": [{"pid": 570, "name": "/venv/bin/python3",
                       "memory_used_bytes": 1_184_890_880_u64, "sm_util": 99, "mem_util": 24}]
    }));
    let agents_calls = [
        "name",
        "uuid",
        "index",
        "memory_info",
        "utilization_rates",
        "mig_mode",
        "mig_device_count",
        "attributes",
        "running_compute_processes",
        "running_graphics_processes",
        "sys_process_name",
        "gpm_support",
        "profile_info",
        "supported_event_types",
    ];
    // The agent reads these too; their values are the moment's.
    let readings = ["power_usage", "temperature", "total_energy_consumption"];
    let mut report = Vec::new();
    for (file, scenario) in [
        ("h200-probe-idle.json", idle),
        ("h200-probe-busy.json", busy),
    ] {
        let real = real(file);
        let fake = with_fake(&scenario, gpuledger_agent::probe::answers);
        let answered = |v: &Value, call: &str| v["devices"][0]["calls"][call].clone();
        let mut differs = |call: &str, r: Value, f: Value| {
            if r != f {
                report.push(format!("{file} {call}: real {r}, fake {f}"));
            }
        };
        for call in agents_calls {
            differs(call, answered(&real, call), answered(&fake, call));
        }
        let kind = |v: Value| match v.get("ok") {
            Some(_) => json!("ok"),
            None => v,
        };
        for call in readings {
            differs(
                call,
                kind(answered(&real, call)),
                kind(answered(&fake, call)),
            );
        }
        // Per-process utilization: the same samples, at the fake's own time.
        let samples = |v: &Value| {
            let answer = answered(v, "process_utilization_stats");
            match answer["ok"].as_str() {
                Some(ok) => json!({"ok": masked(ok, "timestamp")}),
                None => answer,
            }
        };
        differs("process_utilization_stats", samples(&real), samples(&fake));
        // GPM: the agent's metrics and the driver's names for them, at the moment's values.
        let gpm = |v: &Value| -> Vec<String> {
            let answer = answered(v, "gpm_metrics");
            let list: Vec<String> = serde_json::from_str(answer["ok"].as_str().unwrap()).unwrap();
            list.iter()
                .filter(|m| {
                    ["GraphicsUtil", "SmUtil", "DramBwUtil"]
                        .iter()
                        .any(|id| m.contains(id))
                })
                .map(|m| masked(m, "value"))
                .collect()
        };
        differs("gpm_metrics", json!(gpm(&real)), json!(gpm(&fake)));
        let driver = |v: &Value| v["system"]["sys_driver_version"].clone();
        assert_eq!(driver(&real), driver(&fake), "{file}");
        // `gpuledger-agent probe` prints the same answers.
        let _one = FAKE.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scenario.json");
        std::fs::write(&path, scenario.to_string()).unwrap();
        let out = std::process::Command::new(support::artifact("gpuledger-agent"))
            .args(["probe", "--nvml-lib"])
            .arg(support::artifact("libfake_nvml.so"))
            .env("FAKE_NVML_SCENARIO", &path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        for call in agents_calls {
            assert_eq!(answered(&printed, call), answered(&fake, call), "{call}");
        }
    }
    assert_eq!(masked("a: 1, b: 2 }", "b"), "a: 1, b: _ }");
    assert!(
        report.is_empty(),
        "the fake differs from the real H200:\n{}",
        report.join("\n")
    );
}

/// On a GPU in MIG mode the probe makes the agent's MIG calls: each MIG device's instance ids
/// (raw calls) and its GPU instance's GPM activity.
#[test]
fn the_probe_reads_mig_devices_as_the_agent_does() {
    let scenario = json!({"gpus": [{
        "model": "NVIDIA H100 80GB HBM3", "uuid": "GPU-mig",
        "mig": [{
            "profile": "3g.40gb", "gpu_instance_id": 2, "uuid": "MIG-one",
            "phases": [{"at_s": 0, "gpu_util": 35, "mem_util": 12,
                        "memory_used_bytes": 1_073_741_824_u64,
                        "processes": [{"pid": 7, "name": "vllm",
                                       "memory_used_bytes": 1_073_741_824_u64}]}]
        }]
    }]});
    let answers = with_fake(&scenario, gpuledger_agent::probe::answers);
    let gpu = &answers["devices"][0]["calls"];
    assert_eq!(
        gpu["mig_mode"]["ok"], "MigMode { current: 1, pending: 1 }",
        "{gpu}"
    );
    let slots = gpu["mig_devices"].as_array().unwrap();
    assert_eq!(slots.len(), 7, "the H100's seven slots: {gpu}");
    let one = &slots[0]["calls"];
    assert_eq!(one["uuid"]["ok"], "\"MIG-one\"", "{one}");
    assert_eq!(one["gpu_instance_id"]["ok"], "2", "{one}");
    assert_eq!(one["compute_instance_id"]["ok"], "0", "{one}");
    // MIG devices give no utilization; GPM measures their GPU instance.
    assert_eq!(one["utilization_rates"]["err"], "NotSupported", "{one}");
    let gpm = one["gpm_mig_metrics"]["ok"].as_str().unwrap();
    assert!(gpm.contains("GraphicsUtil, value: 35.0"), "{gpm}");
    // Slots no device holds.
    assert_eq!(
        slots[1]["calls"]["mig_device_by_index"]["err"], "NotFound",
        "{gpu}"
    );
}

#[test]
fn the_h100_profiles_are_a_real_h100s() {
    let text = std::fs::read_to_string(
        captures::dir().join("awsome-inference/h100-p5.48xlarge-mig-lgip.txt"),
    )
    .unwrap();
    let rows: Vec<_> = captures::lgip(&text)
        .into_iter()
        .filter(|r| r.gpu == 0)
        .collect();
    assert_eq!(rows.len(), 7, "{rows:?}");
    let fake = profiles("NVIDIA H100 80GB HBM3");
    assert_eq!(fake.len(), rows.len());
    for row in rows {
        let (name, mib, sms, info) = fake
            .iter()
            .find(|(name, ..)| *name == row.name)
            .unwrap_or_else(|| panic!("no fake profile {}", row.name));
        let slices: u32 = name.split('g').next().unwrap().parse().unwrap();
        assert_eq!(
            (info.id, info.slice_count, info.instance_count, *sms),
            (row.id, slices, row.instances_total, row.multiprocessors),
            "{name}: id, slices, instances, SMs"
        );
        assert_eq!(
            (
                info.copy_engine_count,
                info.decoder_count,
                info.encoder_count,
                info.jpeg_count,
                info.ofa_count
            ),
            (
                row.copy_engines,
                row.decoders,
                row.encoders,
                row.jpegs,
                row.ofas
            ),
            "{name}: CE, DEC, ENC, JPEG, OFA"
        );
        let gib = (*mib as f64 / 1024.0 * 100.0).round() / 100.0;
        assert_eq!(gib, row.memory_gib, "{name}: memory");
    }
}

/// NVIDIA's go-nvml mock tables match real A100s and A30s in slices, instance counts and SMs
/// (their ids are the NVML constants, not the driver's, and their H100 numbers are not real).
#[test]
fn the_a100_and_a30_profiles_match_nvidias_tables() {
    let text = std::fs::read_to_string(
        captures::dir().join("mig-profiles/go-nvml-mock-mig-profiles.json"),
    )
    .unwrap();
    let tables: Value = serde_json::from_str(&text).unwrap();
    let constants = [
        ("GPU_INSTANCE_PROFILE_1_SLICE", 0),
        ("GPU_INSTANCE_PROFILE_2_SLICE", 1),
        ("GPU_INSTANCE_PROFILE_3_SLICE", 2),
        ("GPU_INSTANCE_PROFILE_4_SLICE", 3),
        ("GPU_INSTANCE_PROFILE_7_SLICE", 4),
        ("GPU_INSTANCE_PROFILE_1_SLICE_REV1", 7),
        ("GPU_INSTANCE_PROFILE_2_SLICE_REV1", 8),
        ("GPU_INSTANCE_PROFILE_1_SLICE_REV2", 9),
    ];
    for (mock, model) in [
        ("A100_SXM4_40GB", "NVIDIA A100-SXM4-40GB"),
        ("A100_PCIE_40GB", "NVIDIA A100-PCIE-40GB"),
        ("A100_SXM4_80GB", "NVIDIA A100-SXM4-80GB"),
        ("A100_PCIE_80GB", "NVIDIA A100 80GB PCIe"),
        ("A30_PCIE_24GB", "NVIDIA A30"),
    ] {
        let table = tables["gpus"][mock]["gpu_instance_profiles"]
            .as_object()
            .unwrap();
        let fake = profiles(model);
        assert_eq!(fake.len(), table.len(), "{model}");
        for (constant_name, p) in table {
            let constant = constants
                .iter()
                .find(|(n, _)| n == constant_name)
                .unwrap()
                .1;
            let scenario = json!({"gpus": [{"model": model, "uuid": "GPU-x", "mig_mode": true}]});
            let info = with_fake(&scenario, |nvml| {
                nvml.device_by_index(0)
                    .unwrap()
                    .profile_info(constant)
                    .unwrap()
            });
            assert_eq!(
                (
                    info.slice_count,
                    info.instance_count,
                    info.multiprocessor_count,
                    info.copy_engine_count
                ),
                (
                    p["SliceCount"].as_u64().unwrap() as u32,
                    p["InstanceCount"].as_u64().unwrap() as u32,
                    p["MultiprocessorCount"].as_u64().unwrap() as u32,
                    p["CopyEngineCount"].as_u64().unwrap() as u32,
                ),
                "{model} {constant_name}"
            );
        }
    }
}

/// What no capture shows, as NVIDIA documents it: the energy counter is Volta and newer, GPM
/// Hopper and newer and only between samples more than 100 ms apart, no per-process
/// utilization under MIG, and a MIG GPU has as many device slots as compute slices.
#[test]
fn what_the_captures_do_not_show_follows_nvidias_documentation() {
    let scenario = json!({"gpus": [
        {"model": "Quadro P2000", "uuid": "GPU-pascal"},
        {"model": "Tesla T4", "uuid": "GPU-turing", "phases": [{"processes": [{"pid": 4242, "memory_used_bytes": 1 << 30, "sm_util": 30}]}]},
        {"model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-a100", "mig": [
            {"profile": "3g.40gb", "gpu_instance_id": 1, "compute_instances": [
                {"compute_instance_id": 0, "slices": 1, "uuid": "MIG-a100-ci0", "phases": [{"processes": [{"pid": 4343, "memory_used_bytes": 1 << 30}]}]},
                {"compute_instance_id": 1, "slices": 2, "uuid": "MIG-a100-ci1"}]}]},
        {"model": "NVIDIA H100 80GB HBM3", "uuid": "GPU-h100", "mig": [
            {"profile": "1g.10gb", "gpu_instance_id": 9, "uuid": "MIG-h100-1", "phases": [{"gpu_util": 64}]}]},
        {"model": "NVIDIA A30", "uuid": "GPU-a30", "mig_mode": true},
    ]});
    with_fake(&scenario, |nvml| {
        let dev = |i| nvml.device_by_index(i).unwrap();
        assert!(
            matches!(
                dev(0).total_energy_consumption(),
                Err(NvmlError::NotSupported)
            ),
            "Pascal has no energy counter"
        );
        assert!(dev(1).total_energy_consumption().is_ok(), "Turing has one");
        assert_eq!(
            dev(1).process_utilization_stats(None).unwrap()[0].sm_util,
            30
        );
        // MIG: no per-process utilization on the GPU or its devices, a slot per compute slice.
        let a100 = dev(2);
        assert!(matches!(
            a100.process_utilization_stats(None),
            Err(NvmlError::NotSupported)
        ));
        assert_eq!(a100.mig_device_count().unwrap(), 7);
        assert_eq!(
            dev(4).mig_device_count().unwrap(),
            4,
            "an A30 has four compute slices"
        );
        assert!(matches!(
            a100.mig_device_by_index(2),
            Err(NvmlError::NotFound)
        ));
        // One GPU instance split in two compute instances: two devices, one instance id.
        let (ci0, ci1) = (
            a100.mig_device_by_index(0).unwrap(),
            a100.mig_device_by_index(1).unwrap(),
        );
        assert_eq!(instance_ids(nvml, &ci0), (Some(1), Some(0)));
        assert_eq!(instance_ids(nvml, &ci1), (Some(1), Some(1)));
        let (a0, a1) = (ci0.attributes().unwrap(), ci1.attributes().unwrap());
        assert_eq!(
            (
                a0.gpu_instance_slice_count,
                a0.compute_instance_slice_count,
                a0.multiprocessor_count
            ),
            (3, 1, 14)
        );
        assert_eq!(
            (a1.compute_instance_slice_count, a1.multiprocessor_count),
            (2, 28)
        );
        assert_eq!(ci0.name().unwrap(), "NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb");
        // The parent lists its instances' processes with their ids.
        let listed = a100.running_compute_processes().unwrap();
        assert_eq!(
            (
                listed[0].pid,
                listed[0].gpu_instance_id,
                listed[0].compute_instance_id
            ),
            (4343, Some(1), Some(0))
        );
        assert!(!a100.gpm_support().unwrap(), "no GPM before Hopper");
        // GPM on Hopper: an instance's activity, only between samples over 100 ms apart.
        let h100 = dev(3);
        assert!(h100.gpm_support().unwrap());
        let s1 = h100.gpm_mig_sample(9).unwrap();
        let s2 = h100.gpm_mig_sample(9).unwrap();
        let close =
            nvml_wrapper::gpm::gpm_metrics_get(nvml, &s1, &s2, &[GpmMetricId::GraphicsUtil])
                .unwrap();
        assert!(
            close[0].is_err(),
            "samples under 100 ms apart mean nothing: {close:?}"
        );
        std::thread::sleep(Duration::from_millis(150));
        let s3 = h100.gpm_mig_sample(9).unwrap();
        let apart =
            nvml_wrapper::gpm::gpm_metrics_get(nvml, &s1, &s3, &[GpmMetricId::GraphicsUtil])
                .unwrap();
        assert_eq!(apart[0].as_ref().unwrap().value, 64.0);
    });
}
