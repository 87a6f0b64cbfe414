//! gpuledger agent: samples the GPUs of one host through NVML, folds the samples into windows,
//! spools each window to disk and delivers it to the server.

pub mod collect;
pub mod dcgm;
pub mod deliver;
pub mod diagnose;
pub mod exposition;
pub mod host;
pub mod kube_pods;
pub mod kubelet;
pub mod owners;
pub mod probe;
pub mod run;
pub mod serving;
pub mod slurm;
pub mod spool;
pub mod window;

/// Wall-clock time in epoch milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
