//! Report validation: everything is checked before anything is stored, and the first problem is
//! named by its field path (`windows[0].gpus[1].util_avg`) so an integrator can fix it.

use std::collections::HashSet;

use gpuledger_proto::{GpuWindow, ProcessWindow, Report, ServingWindow, Window, SERVING_ENGINES};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    pub field: String,
    pub message: String,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How far in the future a window may end (agent clocks drift).
    pub max_clock_skew_ms: i64,
    /// Windows older than this are past retention and refused.
    pub retention_ms: i64,
    pub max_windows: usize,
    pub max_gpus_per_window: usize,
    pub max_processes_per_gpu: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_clock_skew_ms: 5 * 60 * 1000,
            retention_ms: 35 * 24 * 3600 * 1000,
            max_windows: 2_000,
            max_gpus_per_window: 1_024,
            max_processes_per_gpu: 1_024,
        }
    }
}

/// The longest window a report may hold: readers that need every window overlapping a time
/// read from this far before it.
pub const MAX_WINDOW_MS: i64 = 3600 * 1000;
const MAX_TEXT: usize = 256;
const MAX_LABELS: usize = 64;
/// Endpoints and models a host serves, at most, in one window.
const MAX_SERVING: usize = 256;

fn fail<T>(field: impl Into<String>, message: impl Into<String>) -> Result<T, ValidationError> {
    Err(ValidationError {
        field: field.into(),
        message: message.into(),
    })
}

fn text(field: &str, value: &str, required: bool) -> Result<(), ValidationError> {
    if required && value.trim().is_empty() {
        return fail(field, "must not be empty");
    }
    if value.len() > MAX_TEXT {
        return fail(field, format!("must be at most {MAX_TEXT} bytes"));
    }
    if value.chars().any(char::is_control) {
        return fail(field, "must not contain control characters");
    }
    Ok(())
}

fn opt_text(field: &str, value: &Option<String>) -> Result<(), ValidationError> {
    value.as_deref().map_or(Ok(()), |v| text(field, v, true))
}

fn percent(field: &str, value: Option<f64>) -> Result<(), ValidationError> {
    match value {
        Some(v) if !v.is_finite() => fail(field, "must be a finite number"),
        Some(v) if !(0.0..=100.0).contains(&v) => {
            fail(field, format!("must be within 0..=100, got {v}"))
        }
        _ => Ok(()),
    }
}

fn bounded(field: &str, value: Option<f64>, min: f64, max: f64) -> Result<(), ValidationError> {
    match value {
        Some(v) if !v.is_finite() => fail(field, "must be a finite number"),
        Some(v) if v < min || v > max => {
            fail(field, format!("must be within {min}..={max}, got {v}"))
        }
        _ => Ok(()),
    }
}

/// Counters and byte sizes are stored as signed 64-bit integers.
fn fits_i64(field: &str, value: Option<u64>) -> Result<(), ValidationError> {
    match value {
        Some(v) if v > i64::MAX as u64 => fail(field, "is too large"),
        _ => Ok(()),
    }
}

/// The most requests a count may carry per second of the time it covers: far above any
/// endpoint's (a whole fleet's), and low enough that no sum of a month's counts comes near a
/// 64-bit integer.
pub const MAX_REQUESTS_PER_SECOND: u64 = 10_000_000;
/// The same for tokens read or generated.
pub const MAX_TOKENS_PER_SECOND: u64 = 1_000_000_000;

/// A count over `millis` of time, within `per_second` a second of it (a second at least).
pub fn count_within(
    field: &str,
    value: Option<u64>,
    per_second: u64,
    millis: i64,
) -> Result<(), ValidationError> {
    let seconds = u64::try_from(millis.max(1_000))
        .unwrap_or(u64::MAX)
        .div_ceil(1_000);
    let most = per_second.saturating_mul(seconds);
    match value {
        Some(v) if v > most => fail(
            field,
            format!("is more than {per_second} a second over the time it covers (at most {most})"),
        ),
        _ => Ok(()),
    }
}

pub fn validate(report: &Report, now_ms: i64, limits: &Limits) -> Result<(), ValidationError> {
    let id = &report.batch_id;
    if id.is_empty() || id.len() > 128 {
        return fail("batch_id", "must be 1 to 128 characters");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return fail(
            "batch_id",
            "may contain only letters, digits, '-', '_' and '.'",
        );
    }
    text("agent_version", &report.agent_version, false)?;
    let h = &report.host;
    text("host.hostname", &h.hostname, true)?;
    text("host.cluster", &h.cluster, true)?;
    opt_text("host.provider", &h.provider)?;
    opt_text("host.instance_id", &h.instance_id)?;
    opt_text("host.instance_type", &h.instance_type)?;
    opt_text("host.region", &h.region)?;
    if let Some(l) = &h.lifecycle {
        if l != "on_demand" && l != "spot" {
            return fail("host.lifecycle", "must be on_demand or spot");
        }
    }
    if report.windows.is_empty() {
        return fail("windows", "must hold at least one window");
    }
    if report.windows.len() > limits.max_windows {
        return fail(
            "windows",
            format!("at most {} windows per report", limits.max_windows),
        );
    }
    let mut starts = HashSet::new();
    for (i, w) in report.windows.iter().enumerate() {
        let at = format!("windows[{i}]");
        window(&at, w, now_ms, limits)?;
        if !starts.insert(w.start_ms) {
            return fail(
                format!("{at}.start_ms"),
                "two windows start at the same time",
            );
        }
    }
    // A host's windows follow one another: two that overlap would count the overlap's energy
    // and cost twice.
    let mut by_start: Vec<(usize, &Window)> = report.windows.iter().enumerate().collect();
    by_start.sort_by_key(|(_, w)| w.start_ms);
    for pair in by_start.windows(2) {
        let ((i, earlier), (j, later)) = (pair[0], pair[1]);
        if earlier.end_ms > later.start_ms {
            return fail(
                format!("windows[{j}].start_ms"),
                format!("overlaps windows[{i}], which ends at {}", earlier.end_ms),
            );
        }
    }
    Ok(())
}

fn window(at: &str, w: &Window, now_ms: i64, limits: &Limits) -> Result<(), ValidationError> {
    if w.end_ms <= w.start_ms {
        return fail(format!("{at}.end_ms"), "must be after start_ms");
    }
    if w.end_ms - w.start_ms > MAX_WINDOW_MS {
        return fail(format!("{at}.end_ms"), "a window may span at most one hour");
    }
    if w.end_ms > now_ms + limits.max_clock_skew_ms {
        return fail(
            format!("{at}.end_ms"),
            "is in the future beyond the allowed clock skew; check the agent's clock",
        );
    }
    if w.start_ms < now_ms - limits.retention_ms {
        return fail(
            format!("{at}.start_ms"),
            "is older than the retention period",
        );
    }
    if w.samples == 0 {
        return fail(format!("{at}.samples"), "must be at least 1");
    }
    if w.gpus.len() > limits.max_gpus_per_window {
        return fail(format!("{at}.gpus"), "too many GPUs in one window");
    }
    let mut uuids = HashSet::new();
    for (j, g) in w.gpus.iter().enumerate() {
        let at = format!("{at}.gpus[{j}]");
        gpu(&at, g, limits, w.end_ms - w.start_ms)?;
        util_histogram(
            &format!("{at}.util_histogram"),
            &g.util_histogram,
            w.samples,
        )?;
        if !uuids.insert(g.uuid.as_str()) {
            return fail(format!("{at}.uuid"), "appears twice in the window");
        }
    }
    if w.serving.len() > MAX_SERVING {
        return fail(
            format!("{at}.serving"),
            format!("at most {MAX_SERVING} serving counts in one window"),
        );
    }
    let mut served = HashSet::new();
    for (j, s) in w.serving.iter().enumerate() {
        let at = format!("{at}.serving[{j}]");
        serving(&at, s, w.end_ms - w.start_ms)?;
        if !served.insert((s.endpoint.as_str(), s.model.as_deref())) {
            return fail(at, "the same endpoint and model appear twice in the window");
        }
    }
    // A MIG instance must name a physical GPU of the same report window.
    for (j, g) in w.gpus.iter().enumerate() {
        if let Some(parent) = &g.parent_uuid {
            if parent == &g.uuid || !uuids.contains(parent.as_str()) {
                return fail(
                    format!("{at}.gpus[{j}].parent_uuid"),
                    "must name another GPU of the same window",
                );
            }
        }
    }
    Ok(())
}

fn serving(at: &str, s: &ServingWindow, window_ms: i64) -> Result<(), ValidationError> {
    text(&format!("{at}.endpoint"), &s.endpoint, true)?;
    opt_text(&format!("{at}.model"), &s.model)?;
    if !SERVING_ENGINES.contains(&s.engine.as_str()) {
        return fail(
            format!("{at}.engine"),
            format!("must be one of {}", SERVING_ENGINES.join(", ")),
        );
    }
    let field = |name: &str| format!("{at}.{name}");
    count_within(
        &field("requests"),
        s.requests,
        MAX_REQUESTS_PER_SECOND,
        window_ms,
    )?;
    count_within(
        &field("input_tokens"),
        s.input_tokens,
        MAX_TOKENS_PER_SECOND,
        window_ms,
    )?;
    count_within(
        &field("output_tokens"),
        s.output_tokens,
        MAX_TOKENS_PER_SECOND,
        window_ms,
    )
}

/// `[percent, samples]` pairs: percents 0–100 in rising order, each seen at least once, no more
/// samples in all than the window has.
fn util_histogram(at: &str, pairs: &[(u32, u32)], samples: u32) -> Result<(), ValidationError> {
    let mut total = 0u64;
    let mut previous: Option<u32> = None;
    for (k, &(percent, count)) in pairs.iter().enumerate() {
        if percent > 100 {
            return fail(
                format!("{at}[{k}]"),
                format!("percent {percent} is over 100"),
            );
        }
        if previous.is_some_and(|p| p >= percent) {
            return fail(format!("{at}[{k}]"), "percents must rise, each once");
        }
        if count == 0 {
            return fail(format!("{at}[{k}]"), "a percent no sample read is left out");
        }
        previous = Some(percent);
        total += u64::from(count);
    }
    if total > u64::from(samples) {
        return fail(
            at.to_owned(),
            format!("counts {total} samples, more than the window's {samples}"),
        );
    }
    Ok(())
}

/// The most power a GPU window may report, in watts (the largest boards draw about 1,200).
const MAX_POWER_WATTS: f64 = 10_000.0;

fn gpu(at: &str, g: &GpuWindow, limits: &Limits, window_ms: i64) -> Result<(), ValidationError> {
    text(&format!("{at}.uuid"), &g.uuid, true)?;
    text(&format!("{at}.name"), &g.name, false)?;
    opt_text(&format!("{at}.parent_uuid"), &g.parent_uuid)?;
    fits_i64(&format!("{at}.memory_total_bytes"), g.memory_total_bytes)?;
    fits_i64(
        &format!("{at}.memory_used_max_bytes"),
        g.memory_used_max_bytes,
    )?;
    fits_i64(&format!("{at}.energy_mj"), g.energy_mj)?;
    // Watts times milliseconds is millijoules: no more energy than the most power allowed
    // drawn for the whole window.
    let most_energy_mj = (MAX_POWER_WATTS as u64).saturating_mul(window_ms.max(0) as u64);
    if let Some(energy) = g.energy_mj.filter(|&e| e > most_energy_mj) {
        return fail(
            format!("{at}.energy_mj"),
            format!(
                "{energy} mJ is more than {MAX_POWER_WATTS} W over the window's {window_ms} ms \
                 (at most {most_energy_mj})"
            ),
        );
    }
    if let (Some(used), Some(total)) = (g.memory_used_max_bytes, g.memory_total_bytes) {
        if used > total {
            return fail(
                format!("{at}.memory_used_max_bytes"),
                format!("{used} is more than memory_total_bytes {total}"),
            );
        }
    }
    percent(&format!("{at}.util_avg"), g.util_avg)?;
    percent(&format!("{at}.util_max"), g.util_max)?;
    percent(&format!("{at}.mem_util_avg"), g.mem_util_avg)?;
    if let (Some(avg), Some(max)) = (g.util_avg, g.util_max) {
        if avg > max + 1e-9 {
            return fail(format!("{at}.util_avg"), "is more than util_max");
        }
    }
    bounded(
        &format!("{at}.power_avg_watts"),
        g.power_avg_watts,
        0.0,
        MAX_POWER_WATTS,
    )?;
    bounded(
        &format!("{at}.temperature_max_c"),
        g.temperature_max_c,
        -50.0,
        200.0,
    )?;
    mig(at, g)?;
    fits_i64(&format!("{at}.unseen_memory_bytes"), g.unseen_memory_bytes)?;
    if let (Some(unseen), Some(total)) = (g.unseen_memory_bytes, g.memory_total_bytes) {
        if unseen > total {
            return fail(
                format!("{at}.unseen_memory_bytes"),
                format!("{unseen} is more than memory_total_bytes {total}"),
            );
        }
    }
    opt_text(&format!("{at}.unseen_cause"), &g.unseen_cause)?;
    if let Some(f) = &g.fault {
        text(&format!("{at}.fault.code"), &f.code, true)?;
        text(&format!("{at}.fault.detail"), &f.detail, false)?;
    }
    if g.processes.len() > limits.max_processes_per_gpu {
        return fail(format!("{at}.processes"), "too many processes on one GPU");
    }
    let mut pids = HashSet::new();
    for (k, p) in g.processes.iter().enumerate() {
        let at = format!("{at}.processes[{k}]");
        process(&at, p, g.memory_total_bytes)?;
        if !pids.insert(p.pid) {
            return fail(format!("{at}.pid"), "appears twice on the GPU");
        }
    }
    Ok(())
}

/// The most compute slices a GPU has (7 on A100 and H100; room for one more).
const MAX_MIG_SLICES: u32 = 8;

/// MIG facts: a MIG device's slices (its compute instance's within its GPU instance's), on a
/// device with a parent; a MIG-mode GPU's compute slices on a GPU without one.
fn mig(at: &str, g: &GpuWindow) -> Result<(), ValidationError> {
    let slices = |field: &str, n: u32| {
        if (1..=MAX_MIG_SLICES).contains(&n) {
            Ok(())
        } else {
            fail(
                format!("{at}.{field}"),
                format!("must be 1 to {MAX_MIG_SLICES} compute slices, got {n}"),
            )
        }
    };
    if let Some(n) = g.mig_compute_slices {
        if g.parent_uuid.is_some() {
            return fail(
                format!("{at}.mig_compute_slices"),
                "belongs on a GPU in MIG mode, not on a MIG device",
            );
        }
        slices("mig_compute_slices", n)?;
    }
    if let Some(m) = &g.mig {
        if g.parent_uuid.is_none() {
            return fail(
                format!("{at}.mig"),
                "belongs on a MIG device (with parent_uuid)",
            );
        }
        opt_text(&format!("{at}.mig.profile"), &m.profile)?;
        slices("mig.gpu_instance_slices", m.gpu_instance_slices)?;
        slices("mig.compute_instance_slices", m.compute_instance_slices)?;
        if m.compute_instance_slices > m.gpu_instance_slices {
            return fail(
                format!("{at}.mig.compute_instance_slices"),
                "is more than its GPU instance's gpu_instance_slices",
            );
        }
    }
    Ok(())
}

fn process(at: &str, p: &ProcessWindow, gpu_total: Option<u64>) -> Result<(), ValidationError> {
    opt_text(&format!("{at}.name"), &p.name)?;
    opt_text(&format!("{at}.container_id"), &p.container_id)?;
    opt_text(&format!("{at}.pod_uid"), &p.pod_uid)?;
    opt_text(&format!("{at}.owner_unknown"), &p.owner_unknown)?;
    opt_text(&format!("{at}.user"), &p.user)?;
    fits_i64(
        &format!("{at}.memory_used_max_bytes"),
        p.memory_used_max_bytes,
    )?;
    if let (Some(used), Some(total)) = (p.memory_used_max_bytes, gpu_total) {
        if used > total {
            return fail(
                format!("{at}.memory_used_max_bytes"),
                "is more than the GPU's memory_total_bytes",
            );
        }
    }
    percent(&format!("{at}.sm_util_avg"), p.sm_util_avg)?;
    if p.labels.len() > MAX_LABELS {
        return fail(
            format!("{at}.labels"),
            format!("at most {MAX_LABELS} labels"),
        );
    }
    for (k, v) in &p.labels {
        text(&format!("{at}.labels"), k, true)?;
        text(&format!("{at}.labels.{k}"), v, false)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_proto::HostInfo;

    const NOW: i64 = 1_800_000_000_000;

    fn good() -> Report {
        Report {
            batch_id: "b-1".into(),
            agent_version: "0.1.0".into(),
            host: HostInfo {
                hostname: "h1".into(),
                cluster: "c1".into(),
                ..Default::default()
            },
            windows: vec![Window {
                serving: Vec::new(),
                start_ms: NOW - 15_000,
                end_ms: NOW,
                samples: 15,
                gpus: vec![GpuWindow {
                    uuid: "GPU-1".into(),
                    name: "H100".into(),
                    memory_total_bytes: Some(80),
                    memory_used_max_bytes: Some(40),
                    util_avg: Some(50.0),
                    util_max: Some(90.0),
                    processes: vec![ProcessWindow {
                        pid: 7,
                        memory_used_max_bytes: Some(40),
                        sm_util_avg: Some(45.0),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            }],
        }
    }

    fn field_of(mut f: impl FnMut(&mut Report)) -> String {
        let mut r = good();
        f(&mut r);
        validate(&r, NOW, &Limits::default()).unwrap_err().field
    }

    #[test]
    fn a_good_report_passes() {
        validate(&good(), NOW, &Limits::default()).unwrap();
    }

    /// MIG facts where they belong and within a GPU's slices; unseen memory within the GPU; a
    /// fault with a code: each wrong one named by its field.
    #[test]
    fn mig_slices_unseen_memory_and_faults_are_checked() {
        use gpuledger_proto::{DeviceFault, MigPlacement};
        let placement = MigPlacement {
            gpu_instance_id: 1,
            compute_instance_id: 0,
            profile: Some("3g.40gb".into()),
            gpu_instance_slices: 3,
            compute_instance_slices: 3,
        };
        let with_device = |r: &mut Report, m: MigPlacement| {
            let mut d = r.windows[0].gpus[0].clone();
            d.uuid = "MIG-1".into();
            d.parent_uuid = Some("GPU-1".into());
            d.mig = Some(m);
            r.windows[0].gpus[0].mig_compute_slices = Some(7);
            r.windows[0].gpus.push(d);
        };
        let mut r = good();
        with_device(&mut r, placement.clone());
        validate(&r, NOW, &Limits::default()).unwrap();
        let bad = |m: MigPlacement| field_of(|r| with_device(r, m.clone()));
        assert_eq!(
            bad(MigPlacement {
                compute_instance_slices: 4,
                ..placement.clone()
            }),
            "windows[0].gpus[1].mig.compute_instance_slices"
        );
        assert_eq!(
            bad(MigPlacement {
                gpu_instance_slices: 0,
                ..placement.clone()
            }),
            "windows[0].gpus[1].mig.gpu_instance_slices"
        );
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].mig = Some(placement.clone())),
            "windows[0].gpus[0].mig"
        );
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].mig_compute_slices = Some(9)),
            "windows[0].gpus[0].mig_compute_slices"
        );
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].unseen_memory_bytes = Some(81)),
            "windows[0].gpus[0].unseen_memory_bytes"
        );
        assert_eq!(
            field_of(|r| {
                r.windows[0].gpus[0].fault = Some(DeviceFault {
                    code: String::new(),
                    detail: "lost".into(),
                })
            }),
            "windows[0].gpus[0].fault.code"
        );
    }

    /// Serving counts: a known engine, a named endpoint, counts that fit, each endpoint and
    /// model once a window.
    #[test]
    fn serving_counts_are_checked() {
        let chat = ServingWindow {
            endpoint: "chat-api".into(),
            model: Some("meta-llama/Llama-3.1-8B-Instruct".into()),
            engine: "vllm".into(),
            requests: Some(3),
            input_tokens: Some(1_200),
            output_tokens: Some(400),
        };
        let mut r = good();
        r.windows[0].serving = vec![chat.clone()];
        validate(&r, NOW, &Limits::default()).unwrap();
        let with = |s: ServingWindow| field_of(|r| r.windows[0].serving = vec![s.clone()]);
        assert_eq!(
            with(ServingWindow {
                engine: "ollama".into(),
                ..chat.clone()
            }),
            "windows[0].serving[0].engine"
        );
        assert_eq!(
            with(ServingWindow {
                endpoint: " ".into(),
                ..chat.clone()
            }),
            "windows[0].serving[0].endpoint"
        );
        assert_eq!(
            with(ServingWindow {
                output_tokens: Some(u64::MAX),
                ..chat.clone()
            }),
            "windows[0].serving[0].output_tokens"
        );
        assert_eq!(
            field_of(|r| r.windows[0].serving = vec![chat.clone(), chat.clone()]),
            "windows[0].serving[1]"
        );
        // Another model of the same endpoint is another count.
        let mut r = good();
        r.windows[0].serving = vec![
            chat.clone(),
            ServingWindow {
                model: None,
                ..chat.clone()
            },
        ];
        validate(&r, NOW, &Limits::default()).unwrap();
    }

    /// Energy is bounded by the most power over the window's length, as power is; a host's
    /// windows may not overlap one another.
    #[test]
    fn energy_is_bounded_by_power_and_windows_do_not_overlap() {
        // 15 s at 700 W is 10,500 J: 10,500,000 mJ; the most, 10 kW for 15 s, 150,000,000.
        let mut r = good();
        r.windows[0].gpus[0].energy_mj = Some(10_500_000);
        validate(&r, NOW, &Limits::default()).unwrap();
        for energy in [150_000_001, i64::MAX as u64] {
            assert_eq!(
                field_of(|r| r.windows[0].gpus[0].energy_mj = Some(energy)),
                "windows[0].gpus[0].energy_mj",
                "{energy}"
            );
        }
        let mut r = good();
        r.windows[0].gpus[0].energy_mj = Some(150_000_000);
        validate(&r, NOW, &Limits::default()).unwrap();

        let second = |r: &mut Report, start: i64, end: i64| {
            let mut w = r.windows[0].clone();
            (w.start_ms, w.end_ms) = (start, end);
            r.windows.insert(0, w);
        };
        let mut r = good();
        second(&mut r, NOW - 30_000, NOW - 15_000);
        validate(&r, NOW, &Limits::default()).unwrap();
        assert_eq!(
            field_of(|r| second(r, NOW - 20_000, NOW - 10_000)),
            "windows[1].start_ms"
        );
        let mut r = good();
        second(&mut r, NOW - 10_000, NOW - 5_000);
        let err = validate(&r, NOW, &Limits::default()).unwrap_err();
        assert_eq!(err.field, "windows[0].start_ms", "{}", err.message);
        assert!(
            err.message.contains("overlaps windows[1]"),
            "{}",
            err.message
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        let mut r = good();
        r.windows[0].gpus[0].util_histogram = vec![(0, 5), (90, 10)];
        validate(&r, NOW, &Limits::default()).unwrap();
        for bad in [
            vec![(101, 1)],
            vec![(90, 1), (0, 1)],
            vec![(5, 1), (5, 1)],
            vec![(5, 0)],
        ] {
            let field = field_of(|r| r.windows[0].gpus[0].util_histogram = bad.clone());
            assert!(
                field.starts_with("windows[0].gpus[0].util_histogram["),
                "{bad:?}: {field}"
            );
        }
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].util_histogram = vec![(0, 999)]),
            "windows[0].gpus[0].util_histogram"
        );
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].util_avg = Some(101.0)),
            "windows[0].gpus[0].util_avg"
        );
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].util_max = Some(f64::NAN)),
            "windows[0].gpus[0].util_max"
        );
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].memory_used_max_bytes = Some(81)),
            "windows[0].gpus[0].memory_used_max_bytes"
        );
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].processes[0].sm_util_avg = Some(-1.0)),
            "windows[0].gpus[0].processes[0].sm_util_avg"
        );
        assert_eq!(
            field_of(|r| r.windows[0].end_ms = NOW + 3_600_000),
            "windows[0].end_ms"
        );
        assert_eq!(
            field_of(|r| r.windows[0].start_ms = NOW - 40 * 24 * 3_600_000),
            "windows[0].end_ms" // the span check comes first: such a window is also too long
        );
        assert_eq!(field_of(|r| r.host.hostname.clear()), "host.hostname");
        assert_eq!(field_of(|r| r.batch_id = "a b".into()), "batch_id");
        assert_eq!(field_of(|r| r.windows.clear()), "windows");
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].parent_uuid = Some("GPU-missing".into())),
            "windows[0].gpus[0].parent_uuid"
        );
        assert_eq!(
            field_of(|r| r.windows[0].gpus[0].memory_total_bytes = Some(u64::MAX)),
            "windows[0].gpus[0].memory_total_bytes"
        );
    }

    #[test]
    fn old_windows_are_past_retention() {
        let mut r = good();
        r.windows[0].start_ms = NOW - 36 * 24 * 3_600_000;
        r.windows[0].end_ms = r.windows[0].start_ms + 15_000;
        assert_eq!(
            validate(&r, NOW, &Limits::default()).unwrap_err().field,
            "windows[0].start_ms"
        );
    }
}
