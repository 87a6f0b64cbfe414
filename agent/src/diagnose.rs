//! What `gpuledger-agent once` tells the person at the host besides the report: GPUs busy or
//! holding memory with no process the agent can see (and why, and what to change), and GPUs
//! that could not be read.

use gpuledger_proto::Report;

/// Utilization (%) from which a GPU with no visible process is worth a word.
const BUSY_PERCENT: f64 = 5.0;

/// One line per GPU that needs explaining.
pub fn notes(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for window in &report.windows {
        for g in &window.gpus {
            let gpu = format!("GPU #{} ({})", g.index, g.uuid);
            if let Some(fault) = &g.fault {
                out.push(format!(
                    "{gpu}: {}. Its time counts as idle, with this reason, until it reads again.",
                    fault.detail
                ));
                continue;
            }
            // A GPU in MIG mode: its MIG devices carry the processes.
            if g.mig_compute_slices.is_some() {
                continue;
            }
            let busy = g
                .util_avg
                .filter(|u| *u >= BUSY_PERCENT && g.processes.is_empty());
            if g.unseen_memory_bytes.is_none() && busy.is_none() {
                continue;
            }
            let mut what = Vec::new();
            if let Some(bytes) = g.unseen_memory_bytes {
                what.push(format!(
                    "{:.1} GiB in use",
                    bytes as f64 / (1u64 << 30) as f64
                ));
            }
            if let Some(u) = busy {
                what.push(format!("{u:.0}% busy"));
            }
            let (why, change) = match g.unseen_cause.as_deref() {
                Some("pid_namespace") => (
                    "the agent runs in a PID namespace of its own, so NVML does not show it the processes of other containers",
                    "run it in the host's PID namespace: `hostPID: true` in Kubernetes (the DaemonSet in deploy/kubernetes sets it), `--pid=host` with Docker",
                ),
                Some("no_permission") => (
                    "NVML refused to list the GPU's processes to this user",
                    "run the agent as root (deploy/gpuledger-agent.service does)",
                ),
                _ => (
                    "the agent shares the host's PID namespace, so they run where it cannot look (a container runtime's own namespace it cannot detect, or a virtual machine given this GPU)",
                    "run the agent where the GPU's processes run",
                ),
            };
            out.push(format!(
                "{gpu}: {} with no process the agent can see: {why}. Until then that use is billed to \"(unseen process)\"; to name its owner, {change}.",
                what.join(" and ")
            ));
        }
    }
    out
}

/// One line per serving engine configured: what was read from it, or why nothing could be.
pub fn serving_notes(
    status: &[(
        crate::serving::ServingTarget,
        Option<crate::serving::Status>,
    )],
) -> Vec<String> {
    use crate::serving::Status;
    status
        .iter()
        .map(|(t, s)| {
            let what = format!("serving engine for endpoint {:?} at {}", t.endpoint, t.url);
            match s {
                Some(Status::Read { engine, models }) => {
                    let names: Vec<&str> =
                        models.iter().map(|m| m.as_deref().unwrap_or("(none named)")).collect();
                    let mut note = format!(
                        "{what}: read as {}, models {}; the report counts its requests and tokens between the first and the last reading.",
                        engine.as_str(),
                        names.join(", ")
                    );
                    if t.model.is_none() && models.len() > 1 {
                        note.push_str(" Several models count each request of an ensemble once each: name the one that serves (ENDPOINT@MODEL=URL).");
                    }
                    note
                }
                Some(Status::Failed(e)) => format!(
                    "{what}: cannot be read ({e}); nothing is counted for it until it can, then its work in between is."
                ),
                None => format!("{what}: not read"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_proto::{DeviceFault, GpuWindow, HostInfo, ProcessWindow, Window};

    fn report(gpus: Vec<GpuWindow>) -> Report {
        Report {
            batch_id: "b".into(),
            agent_version: "t".into(),
            host: HostInfo::default(),
            windows: vec![Window {
                serving: Vec::new(),
                start_ms: 0,
                end_ms: 1,
                samples: 1,
                gpus,
            }],
        }
    }

    #[test]
    fn unseen_processes_are_explained_with_what_to_change() {
        let hidden = GpuWindow {
            uuid: "GPU-hidden".into(),
            util_avg: Some(65.0),
            unseen_memory_bytes: Some(9 << 30),
            unseen_cause: Some("pid_namespace".into()),
            ..Default::default()
        };
        let seen = GpuWindow {
            uuid: "GPU-seen".into(),
            index: 1,
            util_avg: Some(90.0),
            processes: vec![ProcessWindow::default()],
            ..Default::default()
        };
        let lost = GpuWindow {
            uuid: "GPU-lost".into(),
            index: 2,
            fault: Some(DeviceFault {
                code: "gpu_lost".into(),
                detail: "the GPU is lost".into(),
            }),
            ..Default::default()
        };
        let notes = notes(&report(vec![hidden, seen, lost]));
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0].starts_with("GPU #0 (GPU-hidden): 9.0 GiB in use and 65% busy"),
            "{}",
            notes[0]
        );
        assert!(notes[0].contains("hostPID: true"), "{}", notes[0]);
        assert!(notes[1].contains("the GPU is lost"), "{}", notes[1]);
    }
}
