//! Reading the GPUs: one [`DeviceSample`] per GPU (or MIG device) per sampling tick.
//!
//! The [`GpuSource`] trait keeps the window logic testable without a driver; [`NvmlSource`] is the
//! real reader, through `nvml-wrapper`. NVML calls block, so the agent calls `sample` on a
//! blocking thread and gets owned snapshots back.
//!
//! Faults stay with the device they happen to: a GPU that is lost, or reported a critical XID,
//! is still sampled (with the fault and no readings) while the others read on; when the whole
//! driver goes away every GPU known before is reported unavailable, and NVML is initialised
//! again with backoff.

mod read;
mod xid;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuledger_proto::{DeviceFault, MigPlacement};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, GpmSample, Nvml};

/// One reading of one device. `None` means the driver could not give the value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceSample {
    pub uuid: String,
    pub index: u32,
    pub name: String,
    /// Set on a MIG device: its physical GPU.
    pub parent_uuid: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub gpu_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub power_mw: Option<u32>,
    pub temperature_c: Option<u32>,
    /// NVML's cumulative energy counter, in millijoules.
    pub energy_counter_mj: Option<u64>,
    /// Compute processes (a display server's graphics work holds no GPU for anyone).
    pub processes: Vec<ProcessSample>,
    /// On a MIG device: its instances and their compute slices.
    pub mig: Option<MigPlacement>,
    /// On a GPU in MIG mode: its compute slices.
    pub mig_compute_slices: Option<u32>,
    /// Memory in use beyond what the processes NVML lists (compute and graphics) hold, on a
    /// device whose processes were asked for.
    pub unseen_memory_bytes: Option<u64>,
    /// Why processes may be hidden from the agent, where it knows.
    pub unseen_cause: Option<&'static str>,
    pub fault: Option<DeviceFault>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessSample {
    pub pid: u32,
    pub name: Option<String>,
    pub memory_used_bytes: Option<u64>,
    /// SM utilization in percent since the last sample; `None` where the device cannot say.
    pub sm_util: Option<u32>,
    /// The owner, where the source knows it (dcgm-exporter's pods); else it is read from the
    /// process's environment, cgroup and the cluster's scheduler.
    pub owner: Option<crate::owners::Owner>,
}

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("NVML could not be loaded or initialised: {0}")]
    Init(NvmlError),
    #[error("NVML call failed: {0}")]
    Call(#[from] NvmlError),
    /// Another source (dcgm-exporter) could not be read.
    #[error("{0}")]
    Source(String),
}

/// Anything that can read the GPUs of this host.
pub trait GpuSource: Send {
    fn sample(&mut self) -> Result<Vec<DeviceSample>, CollectError>;
}

/// What must live as long as one NVML session and be dropped before it: GPM samples kept from
/// one tick to the next (an instance's activity is measured between them) and the event sets
/// XIDs arrive on.
#[derive(Default)]
struct Watch<'a> {
    /// Per (GPU, GPU instance id): the last GPM sample and when it was taken.
    gpm: HashMap<(String, u32), (GpmSample<'a>, Instant)>,
    /// One event set per GPU, so a lost GPU's set never keeps another's XIDs back.
    xid: HashMap<String, EventSet<'a>>,
    /// GPUs whose events were asked for in this session (supported or not).
    xid_asked: BTreeSet<String>,
    /// Compute slices per GPU in MIG mode (fixed while its MIG mode is).
    slices: HashMap<String, u32>,
}

self_cell::self_cell!(
    /// An initialised NVML and what hangs off it.
    struct Session {
        owner: Nvml,
        #[not_covariant]
        dependent: Watch,
    }
);

/// A GPU as last read: a GPU that cannot be read any more is still reported by it.
#[derive(Debug, Clone)]
struct Identity {
    uuid: String,
    name: String,
    memory_total_bytes: Option<u64>,
}

/// A critical XID the driver reported for a GPU. It stands while the GPU runs no new work: a
/// process that was not there when the XID came means the GPU was reset and works again.
#[derive(Debug, Clone)]
struct XidFault {
    fault: DeviceFault,
    /// The processes on the GPU at the first read after the XID.
    pids_at: Option<BTreeSet<u32>>,
}

/// When to try NVML again after it failed: 1 s, doubling to a minute.
#[derive(Debug)]
struct Backoff {
    next: Instant,
    delay: Duration,
    failures: u32,
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(60);

    fn new() -> Self {
        Backoff {
            next: Instant::now(),
            delay: Self::FIRST,
            failures: 0,
        }
    }

    fn failed(&mut self) {
        self.failures += 1;
        self.next = Instant::now() + self.delay;
        self.delay = (self.delay * 2).min(Self::MAX);
    }

    fn reset(&mut self) {
        *self = Backoff::new();
    }
}

/// State kept from one sample to the next, outside the NVML session.
struct Memory {
    /// Newest process-utilization timestamp seen per device, so each sample is counted once.
    last_seen_us: HashMap<String, u64>,
    known: BTreeMap<u32, Identity>,
    xids: HashMap<String, XidFault>,
    /// Whether this agent runs in a PID namespace of its own (a container without hostPID).
    own_pid_namespace: bool,
}

/// The real reader, through `nvml-wrapper`.
pub struct NvmlSource {
    lib_path: Option<PathBuf>,
    session: Option<Session>,
    memory: Memory,
    reinit: Backoff,
}

impl NvmlSource {
    /// Loads NVML now so that a host without a driver fails at start with a clear message.
    pub fn new(lib_path: Option<PathBuf>) -> Result<Self, CollectError> {
        let mut source = NvmlSource::retrying(lib_path);
        source.session = Some(source.open()?);
        Ok(source)
    }

    /// A reader that has not initialised NVML yet and tries at its first sample, then with
    /// backoff: a daemon that starts while the driver loads (or reloads) waits for it.
    pub fn retrying(lib_path: Option<PathBuf>) -> Self {
        NvmlSource {
            lib_path,
            session: None,
            memory: Memory {
                last_seen_us: HashMap::new(),
                known: BTreeMap::new(),
                xids: HashMap::new(),
                own_pid_namespace: own_pid_namespace(
                    Path::new("/proc/self/status"),
                    Path::new("/proc/self/ns/pid"),
                ),
            },
            reinit: Backoff::new(),
        }
    }

    fn open(&self) -> Result<Session, CollectError> {
        let nvml = match &self.lib_path {
            Some(path) => {
                let os: OsString = path.clone().into_os_string();
                Nvml::builder().lib_path(&os).init()
            }
            None => Nvml::init(),
        }
        .map_err(CollectError::Init)?;
        Ok(Session::new(nvml, |_| Watch::default()))
    }

    pub fn driver_version(&self) -> Option<String> {
        self.session
            .as_ref()?
            .borrow_owner()
            .sys_driver_version()
            .ok()
    }

    /// Every GPU known before, each with the same fault: what a sample is while NVML is away.
    fn unavailable(&self, detail: String) -> Result<Vec<DeviceSample>, CollectError> {
        if self.memory.known.is_empty() {
            return Err(CollectError::Init(NvmlError::DriverNotLoaded));
        }
        Ok(self
            .memory
            .known
            .iter()
            .map(|(index, id)| {
                id.faulted(
                    *index,
                    DeviceFault {
                        code: "driver_unavailable".into(),
                        detail: detail.clone(),
                    },
                )
            })
            .collect())
    }
}

impl Identity {
    fn faulted(&self, index: u32, fault: DeviceFault) -> DeviceSample {
        DeviceSample {
            uuid: self.uuid.clone(),
            index,
            name: self.name.clone(),
            memory_total_bytes: self.memory_total_bytes,
            fault: Some(fault),
            ..Default::default()
        }
    }
}

impl GpuSource for NvmlSource {
    fn sample(&mut self) -> Result<Vec<DeviceSample>, CollectError> {
        if self.session.is_none() {
            if Instant::now() < self.reinit.next {
                return self.unavailable("NVML is not initialised; the agent tries again".into());
            }
            match self.open() {
                Ok(session) => {
                    if self.reinit.failures > 0 {
                        tracing::info!(failures = self.reinit.failures, "NVML initialised again");
                    }
                    self.reinit.reset();
                    // A driver reload resets the GPUs: XIDs from before are history.
                    self.memory.xids.clear();
                    self.session = Some(session);
                }
                Err(e) => {
                    if self.reinit.failures == 0 {
                        tracing::warn!(error = %e, "NVML cannot initialise; trying again with backoff");
                    }
                    self.reinit.failed();
                    return self.unavailable(format!("NVML cannot initialise: {e}"));
                }
            }
        }
        let Some(session) = self.session.as_mut() else {
            return self.unavailable("NVML is not initialised".into());
        };
        let memory = &mut self.memory;
        match session.with_dependent_mut(|nvml, watch| read::all(nvml, watch, memory)) {
            Ok(samples) => Ok(samples),
            Err(e) => {
                tracing::warn!(error = %e, "NVML stopped answering (driver reloaded?); initialising it again");
                // Dropping the session frees its GPM samples and event sets before NVML itself.
                self.session = None;
                self.reinit.reset();
                self.unavailable(format!("the NVIDIA driver stopped answering: {e}"))
            }
        }
    }
}

/// Whether NVML's answer means the whole session is gone (driver unloaded or reloaded), not
/// one device.
fn session_broken(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::Uninitialized | NvmlError::DriverNotLoaded | NvmlError::LibRmVersionMismatch
    )
}

/// The inode of the host's (initial) PID namespace: the kernel's `PROC_PID_INIT_INO`.
const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Whether this process runs in a PID namespace of its own: its `pid` namespace link (a
/// `/proc/self/ns/pid`) is not the host's, or its `NSpid` line (a `/proc/self/status`) lists
/// one pid per namespace level, more than one where the host's `/proc` is mounted. Inside a
/// container with its own `/proc`, the link alone tells.
pub fn own_pid_namespace(status: &Path, namespace: &Path) -> bool {
    let nested = std::fs::read_to_string(status).ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .map(|pids| pids.split_whitespace().count() > 1)
    });
    let elsewhere = std::fs::read_link(namespace)
        .ok()
        .map(|link| link.as_os_str() != INITIAL_PID_NAMESPACE);
    nested == Some(true) || elsewhere == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_namespace_of_its_own_shows_in_nspid_or_the_namespace_link() {
        let dir = tempfile::tempdir().unwrap();
        let status = dir.path().join("status");
        let host = dir.path().join("host-ns");
        std::os::unix::fs::symlink(INITIAL_PID_NAMESPACE, &host).unwrap();
        let other = dir.path().join("other-ns");
        std::os::unix::fs::symlink("pid:[4026532179]", &other).unwrap();
        std::fs::write(&status, "Name:\tagent\nNSpid:\t4242\t1\n").unwrap();
        assert!(
            own_pid_namespace(&status, &host),
            "the host's /proc shows both pids"
        );
        std::fs::write(&status, "Name:\tagent\nNSpid:\t1\n").unwrap();
        assert!(
            own_pid_namespace(&status, &other),
            "a container's own /proc: the link tells"
        );
        assert!(!own_pid_namespace(&status, &host));
        let missing = dir.path().join("missing");
        assert!(!own_pid_namespace(&missing, &missing));
    }

    #[test]
    fn backoff_doubles_to_a_minute() {
        let mut b = Backoff::new();
        for _ in 0..10 {
            b.failed();
        }
        assert_eq!(b.delay, Backoff::MAX);
        assert_eq!(b.failures, 10);
        b.reset();
        assert_eq!((b.delay, b.failures), (Backoff::FIRST, 0));
    }
}
