//! The agent's main loop: sample every tick, close a window on each boundary, spool it into the
//! open batch, and let the deliverer send each batch once full. On shutdown the open window is
//! flushed to the spool and the open batch sealed first.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpuledger_proto::{HostInfo, Report, Window};
use tokio::sync::{watch, Notify};

use crate::collect::GpuSource;
use crate::deliver::{Deliverer, DeliveryConfig};
use crate::host::{self, HostConfig};
use crate::kube_pods::KubeApiConfig;
use crate::kubelet::{KubeletConfig, Pods};
use crate::owners::OwnerReader;
use crate::serving::{ServingReader, ServingTarget, Status};
use crate::slurm::{SlurmConfig, SlurmJobs};
use crate::spool::Spool;
use crate::window::WindowBuilder;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub host: HostConfig,
    pub sample_interval: Duration,
    pub window: Duration,
    /// Windows sent together in one report: fewer, larger reports cost the server and the
    /// database less per window, and each window reaches the server that much later.
    pub windows_per_report: usize,
    pub spool_dir: PathBuf,
    pub spool_max_bytes: u64,
    pub delivery: DeliveryConfig,
    pub owners: OwnerSources,
    pub serving: ServingConfig,
    /// How long to keep sending after a shutdown signal before leaving the rest in the spool.
    pub shutdown_grace: Duration,
}

/// The serving engines whose requests and tokens each window carries.
#[derive(Debug, Clone, Default)]
pub struct ServingConfig {
    pub targets: Vec<ServingTarget>,
    /// How long one read may take (each window waits for the slowest).
    pub timeout: Duration,
}

/// Where a process's owner is read from, besides its own environment.
#[derive(Debug, Clone)]
pub struct OwnerSources {
    /// Where process environments, cgroups and uids are read (`/proc`, or the host's).
    pub proc_root: PathBuf,
    pub extra_label_keys: Vec<String>,
    /// Where to ask about the Slurm jobs processes run in; `None` reads no job.
    pub slurm: Option<SlurmConfig>,
    /// Where to ask which pods hold the GPUs; `None` names no pod.
    pub kubelet: Option<KubeletConfig>,
    /// What to read of the node's pods from the API server; `None` reads nothing.
    pub kube_api: Option<KubeApiConfig>,
}

impl OwnerSources {
    /// The reader of owners, with its Slurm thread and Kubernetes tasks started and asked once
    /// (so a first window names its jobs' and pods' owners).
    pub async fn start(&self) -> OwnerReader {
        let mut owners = OwnerReader::new(&self.proc_root, self.extra_label_keys.clone());
        if let Some(slurm) = self.slurm.clone() {
            owners = owners.with_slurm(SlurmJobs::start(slurm));
        }
        if let Some(kubelet) = self.kubelet.clone() {
            owners = owners.with_pods(watch_pods(kubelet).await);
        }
        if let Some(api) = self.kube_api.clone() {
            if let Some(directory) = crate::kube_pods::start(api).await {
                owners = owners.with_pod_directory(directory);
            }
        }
        owners
    }
}

/// A report of no window yet, under a new batch id.
pub fn new_batch(host: &HostInfo) -> Report {
    Report {
        batch_id: uuid::Uuid::new_v4().to_string(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        host: host.clone(),
        windows: Vec::new(),
    }
}

pub fn report(host: &HostInfo, window: Window) -> Report {
    let mut r = new_batch(host);
    r.windows.push(window);
    r
}

/// The most windows a report holds: what the server takes in one report.
pub const MAX_WINDOWS_PER_REPORT: usize = 2_000;

/// How many windows of `window` a report of `every` holds: at least one, at most
/// [`MAX_WINDOWS_PER_REPORT`].
pub fn windows_per_report(every: Duration, window: Duration) -> usize {
    let window_ms = window.as_millis().max(1);
    every
        .as_millis()
        .div_ceil(window_ms)
        .clamp(1, MAX_WINDOWS_PER_REPORT as u128) as usize
}

/// The next window boundary after `now_ms`: windows line up on wall-clock multiples.
pub fn next_boundary(now_ms: i64, window_ms: i64) -> i64 {
    (now_ms / window_ms + 1) * window_ms
}

/// Takes one sample on a blocking thread (NVML calls block) and hands the source back.
async fn sample_once(
    mut source: Box<dyn GpuSource>,
    mut builder: WindowBuilder,
) -> anyhow::Result<(Box<dyn GpuSource>, WindowBuilder)> {
    let joined = tokio::task::spawn_blocking(move || {
        let at = crate::now_ms();
        match source.sample() {
            Ok(devices) => builder.add(at, devices),
            // The source logs NVML's failures itself, once per outage rather than per tick.
            Err(e) => tracing::debug!(error = %e, "no sample"),
        }
        (source, builder)
    })
    .await?;
    Ok(joined)
}

/// Runs until `shutdown` resolves.
pub async fn run(
    config: AgentConfig,
    source: Box<dyn GpuSource>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let spool = Spool::open(&config.spool_dir, config.spool_max_bytes)?;
    let host = host::identify(&config.host).await;
    tracing::info!(hostname = %host.hostname, cluster = %host.cluster, instance = ?host.instance_id, spooled = spool.depth(), "agent started");

    let wake = Arc::new(Notify::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let deliverer = Deliverer::new(config.delivery.clone(), spool.clone())?;
    let delivery = tokio::spawn(deliverer.run(wake.clone(), stop_rx));

    let mut builder = WindowBuilder::new(config.owners.start().await);
    let mut serving = ServingReader::new(
        config.serving.targets.clone(),
        config.serving.timeout,
        Some(&config.spool_dir),
    )?;
    if !serving.is_empty() {
        // The first reading after a start with nothing kept is a baseline.
        serving.read().await;
        serving.save();
    }
    let mut source = source;
    let window_ms = config.window.as_millis().max(1) as i64;
    let mut boundary = next_boundary(crate::now_ms(), window_ms);
    let mut tick = tokio::time::interval(config.sample_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(shutdown);

    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = crate::now_ms();
                if now >= boundary {
                    if let Some(w) = builder.close(boundary) {
                        let w = with_serving(w, &mut serving).await;
                        spool_window(&spool, &host, w, config.windows_per_report, &wake);
                        serving.save();
                    }
                    builder.begin_at(boundary);
                    boundary = next_boundary(now, window_ms);
                }
                (source, builder) = sample_once(source, builder).await?;
            }
            _ = &mut shutdown => break,
        }
    }

    // Flush the open window and send the open batch, so a restart or redeploy loses nothing
    // and leaves nothing waiting.
    if let Some(w) = builder.close(crate::now_ms()) {
        let w = with_serving(w, &mut serving).await;
        spool_window(&spool, &host, w, config.windows_per_report, &wake);
        serving.save();
    }
    match spool.seal() {
        Ok(_) => wake.notify_one(),
        Err(e) => {
            tracing::error!(error = %e, "could not seal the open batch; it is sent after a restart")
        }
    }
    let deadline = tokio::time::Instant::now() + config.shutdown_grace;
    while spool.depth() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_tx.send(true);
    let _ = delivery.await;
    tracing::info!(left_in_spool = spool.depth(), "agent stopped");
    Ok(())
}

/// The window with what the serving engines counted since their last reading. Read only for a
/// window that is sent: a reading whose counts went nowhere would lose them.
async fn with_serving(mut window: Window, serving: &mut ServingReader) -> Window {
    if !serving.is_empty() {
        window.serving = serving.read().await;
    }
    window
}

/// Asks the kubelet once (so the first window names its pods), then keeps asking on a task of
/// its own.
pub async fn watch_pods(config: KubeletConfig) -> Pods {
    let pods = Pods::default();
    pods.refresh(&config).await;
    tokio::spawn(pods.clone().keep_fresh(config));
    pods
}

fn spool_window(spool: &Spool, host: &HostInfo, window: Window, per_report: usize, wake: &Notify) {
    let start_ms = window.start_ms;
    match spool.add_window(host, window, per_report, || new_batch(host)) {
        Ok(true) => wake.notify_one(),
        Ok(false) => {}
        Err(e) => tracing::error!(error = %e, start_ms, "could not spool a window"),
    }
}

/// Samples for `duration` and returns one report, for people debugging a host, with how each
/// serving engine's reading went. Questions to the Slurm controller still out at the end are
/// waited for (up to `settle`), so the report shows what the daemon would send; the engines are
/// read at the start and the end, so it counts their work in between.
pub async fn once(
    host_config: &HostConfig,
    source: Box<dyn GpuSource>,
    owners: OwnerReader,
    serving: &ServingConfig,
    sample_interval: Duration,
    duration: Duration,
) -> anyhow::Result<(Report, Vec<(ServingTarget, Option<Status>)>)> {
    let host = host::identify(host_config).await;
    let mut engines = ServingReader::new(serving.targets.clone(), serving.timeout, None)?;
    engines.read().await;
    let settle = owners.clone();
    let mut builder = WindowBuilder::new(owners);
    let mut source = source;
    let until = tokio::time::Instant::now() + duration;
    loop {
        (source, builder) = sample_once(source, builder).await?;
        if tokio::time::Instant::now() + sample_interval > until {
            break;
        }
        tokio::time::sleep(sample_interval).await;
    }
    tokio::task::spawn_blocking(move || settle.settle(Duration::from_secs(30))).await?;
    let window = builder
        .close(crate::now_ms())
        .ok_or_else(|| anyhow::anyhow!("no sample could be taken"))?;
    let window = with_serving(window, &mut engines).await;
    let status = engines
        .status()
        .into_iter()
        .map(|(t, s)| (t.clone(), s.cloned()))
        .collect();
    Ok((report(&host, window), status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_holds_the_windows_of_its_period() {
        let s = Duration::from_secs;
        assert_eq!(windows_per_report(s(60), s(15)), 4);
        assert_eq!(windows_per_report(s(15), s(15)), 1);
        assert_eq!(
            windows_per_report(s(50), s(15)),
            4,
            "a part window rounds up"
        );
        assert_eq!(windows_per_report(s(1), s(15)), 1, "never fewer than one");
        assert_eq!(windows_per_report(Duration::ZERO, s(15)), 1);
        assert_eq!(
            windows_per_report(s(86_400), Duration::from_millis(100)),
            MAX_WINDOWS_PER_REPORT,
            "never more than the server takes"
        );
    }

    #[test]
    fn boundaries_are_wall_clock_multiples() {
        assert_eq!(next_boundary(0, 15_000), 15_000);
        assert_eq!(next_boundary(14_999, 15_000), 15_000);
        assert_eq!(next_boundary(15_000, 15_000), 30_000);
    }
}
