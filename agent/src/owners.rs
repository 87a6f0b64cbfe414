//! Who owns a GPU process: labels from its environment, its container and pod from its cgroup,
//! its Slurm job's account, name and more (see [`crate::slurm`]), and the Unix account running it (its real uid, named by the `etc/passwd` beside the proc root:
//! `/etc/passwd` for `/proc`, `/host/etc/passwd` for a host mounted at `/host`).
//!
//! Serving and training code declares ownership with `GPULEDGER_MODEL`, `GPULEDGER_EXPERIMENT`,
//! `GPULEDGER_ENDPOINT` and `GPULEDGER_TEAM`; extra keys named in config (e.g. `MLFLOW_RUN_ID`) are
//! kept under their lower-cased names. NVML reports host PIDs, so in Kubernetes the agent needs
//! `hostPID: true` to see them under `/proc`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gpuledger_proto::OWNER_KEYS;

use crate::kube_pods::PodDirectory;
use crate::kubelet::Pods;
use crate::slurm::SlurmJobs;

/// The longest label value the server takes (its limit on any text).
const MAX_LABEL_BYTES: usize = 256;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Owner {
    pub labels: BTreeMap<String, String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// The account name, or `uid 1234` where the passwd file does not name the uid.
    pub user: Option<String>,
    /// Why part of the owner is unknown (`slurm_timeout`, `cgroup_unreadable`, …).
    pub unknown: Option<String>,
    /// The Slurm job whose facts were still being asked for when this was read.
    pub slurm_job_pending: Option<u64>,
}

#[derive(Clone)]
pub struct OwnerReader {
    proc_root: PathBuf,
    passwd: PathBuf,
    extra_keys: Vec<String>,
    slurm: Option<SlurmJobs>,
    pods: Option<Pods>,
    pod_directory: Option<PodDirectory>,
    /// Unreadable cgroups are logged once, not per sample.
    cgroup_warned: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl OwnerReader {
    pub fn new(proc_root: impl Into<PathBuf>, extra_keys: Vec<String>) -> Self {
        let proc_root: PathBuf = proc_root.into();
        let passwd = proc_root
            .parent()
            .unwrap_or(std::path::Path::new("/"))
            .join("etc/passwd");
        OwnerReader {
            proc_root,
            passwd,
            extra_keys,
            slurm: None,
            pods: None,
            pod_directory: None,
            cgroup_warned: Default::default(),
        }
    }

    /// Also reads each process's Slurm job from the controller.
    pub fn with_slurm(mut self, slurm: SlurmJobs) -> Self {
        self.slurm = Some(slurm);
        self
    }

    /// Also names the pod each process in a pod runs in, from the kubelet's answer.
    pub fn with_pods(mut self, pods: Pods) -> Self {
        self.pods = Some(pods);
        self
    }

    /// Also names each process's pod, its labels and workload from the API server's watch.
    pub fn with_pod_directory(mut self, directory: PodDirectory) -> Self {
        self.pod_directory = Some(directory);
        self
    }

    /// For a process in a pod: its pod's facts from the API server (by the pod UID in its
    /// cgroup), else the namespace, pod and container the kubelet says `device` (or its `parent`
    /// GPU) is allocated to; marks why, where neither can say for sure. A label the process set
    /// itself stays.
    pub fn add_pod_facts(&self, owner: &mut Owner, device: &str, parent: Option<&str>) {
        let Some(uid) = owner.pod_uid.clone() else {
            return;
        };
        let (mut known, mut api_cause) = (false, None);
        if let Some(directory) = &self.pod_directory {
            (known, api_cause) = crate::kube_pods::add_pod_facts(
                directory,
                &uid,
                owner.container_id.as_deref(),
                &mut owner.labels,
            );
        }
        let kubelet_cause = self.pods.as_ref().and_then(|pods| {
            crate::kubelet::add_pod_labels(pods, device, parent, &mut owner.labels)
        });
        // A pod known by its UID is the process's own, shared GPU or not.
        let cause = if known {
            api_cause
        } else {
            kubelet_cause.or(api_cause)
        };
        for value in owner.labels.values_mut() {
            *value = clean_label(value);
        }
        if let Some(cause) = cause {
            owner.unknown.get_or_insert_with(|| cause.to_owned());
        }
    }

    /// Waits up to `timeout` for the Slurm questions out (see [`SlurmJobs::settle`]).
    pub fn settle(&self, timeout: std::time::Duration) {
        if let Some(s) = &self.slurm {
            s.settle(timeout);
        }
    }

    /// Reads what can be read; a process that is gone or unreadable has no labels, not an error.
    pub fn read(&self, pid: u32) -> Owner {
        let dir = self.proc_root.join(pid.to_string());
        let mut owner = Owner::default();
        let environ = std::fs::read(dir.join("environ")).ok();
        if let Some(environ) = &environ {
            owner.labels = labels_from_environ(environ, &self.extra_keys);
        }
        let mut slurm_job = None;
        match std::fs::read_to_string(dir.join("cgroup")) {
            Ok(cgroup) => {
                owner.container_id = container_id(&cgroup);
                owner.pod_uid = pod_uid(&cgroup);
                slurm_job = crate::slurm::job_of_cgroup(&cgroup);
            }
            // Gone since NVML listed it: nothing to say.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                owner.unknown = Some("cgroup_unreadable".into());
                if !self
                    .cgroup_warned
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!(error = %e, proc_root = %self.proc_root.display(), "cannot read processes' cgroups: their containers, pods and Slurm jobs are unknown (said once)");
                }
            }
        }
        let slurm_job =
            slurm_job.or_else(|| environ.as_deref().and_then(crate::slurm::job_of_environ));
        if let (Some(job), Some(_)) = (slurm_job, &self.slurm) {
            owner.labels.insert("slurm_job_id".into(), job.to_string());
            owner.slurm_job_pending = Some(job);
            self.add_slurm_facts(&mut owner);
        }
        for value in owner.labels.values_mut() {
            *value = clean_label(value);
        }
        if let Some(uid) = std::fs::read_to_string(dir.join("status"))
            .ok()
            .and_then(|s| real_uid(&s))
        {
            let named = std::fs::read_to_string(&self.passwd)
                .ok()
                .and_then(|p| account_name(&p, uid));
            owner.user = Some(named.unwrap_or_else(|| format!("uid {uid}")));
        }
        owner
    }

    /// Adds the facts of `owner`'s Slurm job if the controller has answered, else leaves it
    /// pending (or marks why it is unknown). A label the process set itself stays.
    pub fn add_slurm_facts(&self, owner: &mut Owner) {
        let (Some(job), Some(slurm)) = (owner.slurm_job_pending, &self.slurm) else {
            return;
        };
        match slurm.facts(job) {
            Ok(Some(facts)) => {
                for (key, value) in facts.labels() {
                    owner
                        .labels
                        .entry(key.to_owned())
                        .or_insert_with(|| clean_label(&value));
                }
                owner.slurm_job_pending = None;
            }
            Ok(None) => {}
            Err(why) => {
                owner.unknown = Some(why.code().to_owned());
                owner.slurm_job_pending = None;
            }
        }
    }

    pub fn process_name(&self, pid: u32) -> Option<String> {
        let comm =
            std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("comm")).ok()?;
        let name = comm.trim();
        (!name.is_empty()).then(|| name.to_owned())
    }
}

/// A label value the server takes: control characters (a newline in a job's comment) become
/// spaces and it is cut to the server's limit, on a character boundary.
pub fn clean_label(value: &str) -> String {
    let mut out: String = value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > MAX_LABEL_BYTES {
        let mut end = MAX_LABEL_BYTES;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

/// The real uid from `/proc/<pid>/status` (`Uid:\treal\teffective\tsaved\tfs`).
pub fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|real| real.parse().ok())
}

/// The account a uid belongs to in a passwd file (`name:password:uid:gid:…`).
pub fn account_name(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id: u32 = fields.nth(1)?.parse().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_owned())
    })
}

/// `/proc/<pid>/environ` is NUL-separated `KEY=VALUE` pairs.
pub fn labels_from_environ(environ: &[u8], extra_keys: &[String]) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for entry in environ.split(|b| *b == 0) {
        let Ok(entry) = std::str::from_utf8(entry) else {
            continue;
        };
        let Some((key, value)) = entry.split_once('=') else {
            continue;
        };
        if value.is_empty() {
            continue;
        }
        let owner_key = key
            .strip_prefix("GPULEDGER_")
            .map(str::to_ascii_lowercase)
            .filter(|k| OWNER_KEYS.contains(&k.as_str()));
        if let Some(k) = owner_key {
            labels.insert(k, value.to_owned());
        } else if extra_keys.iter().any(|x| x == key) {
            labels.insert(key.to_ascii_lowercase(), value.to_owned());
        }
    }
    labels
}

/// The Kubernetes pod UID from a cgroup path: `pod<uid>`, where systemd drivers write `_` for `-`.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        line.split('/').find_map(|part| {
            // A uid is hex, so the last "pod" in the component is the one before it.
            let rest = &part[part.rfind("pod")? + 3..];
            let uid = rest.trim_end_matches(".slice").replace('_', "-");
            is_uuid(&uid).then_some(uid)
        })
    })
}

/// A container id is 64 hex digits, as the last cgroup component (`docker-<id>.scope`,
/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, or bare).
pub fn container_id(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let last = line.rsplit('/').next()?;
        let last = last.trim_end_matches(".scope");
        let id = last.rsplit('-').next().unwrap_or(last);
        let id = id.rsplit(':').next().unwrap_or(id);
        (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_owned())
    })
}

fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && [8, 4, 4, 4, 12]
            .iter()
            .zip(&parts)
            .all(|(n, p)| p.len() == *n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn owner_labels_and_extra_keys_come_from_the_environment() {
        let env = b"PATH=/bin\0GPULEDGER_MODEL=llama-70b\0GPULEDGER_TEAM=search\0MLFLOW_RUN_ID=r42\0GPULEDGER_OTHER=x\0GPULEDGER_ENDPOINT=\0";
        let labels = labels_from_environ(env, &["MLFLOW_RUN_ID".to_string()]);
        assert_eq!(labels.get("model").map(String::as_str), Some("llama-70b"));
        assert_eq!(labels.get("team").map(String::as_str), Some("search"));
        assert_eq!(labels.get("mlflow_run_id").map(String::as_str), Some("r42"));
        assert!(
            !labels.contains_key("other"),
            "unknown GPULEDGER_ keys are ignored"
        );
        assert!(
            !labels.contains_key("endpoint"),
            "empty values are no label"
        );
    }

    #[test]
    fn pod_uid_from_systemd_and_cgroupfs_drivers() {
        let systemd = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_aaaa_bbbb_cccc_111122223333.slice/cri-containerd-{CID}.scope\n");
        assert_eq!(
            pod_uid(&systemd).as_deref(),
            Some("1f2e3d4c-aaaa-bbbb-cccc-111122223333")
        );
        assert_eq!(container_id(&systemd).as_deref(), Some(CID));
        let cgroupfs = format!(
            "12:devices:/kubepods/besteffort/pod1f2e3d4c-aaaa-bbbb-cccc-111122223333/{CID}\n"
        );
        assert_eq!(
            pod_uid(&cgroupfs).as_deref(),
            Some("1f2e3d4c-aaaa-bbbb-cccc-111122223333")
        );
        assert_eq!(container_id(&cgroupfs).as_deref(), Some(CID));
    }

    #[test]
    fn a_plain_host_process_has_no_container_or_pod() {
        let cg = "0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(pod_uid(cg), None);
        assert_eq!(container_id(cg), None);
    }

    #[test]
    fn the_account_comes_from_the_real_uid() {
        let status = "Name:\tpython3\nUmask:\t0022\nUid:\t1001\t0\t1001\t1001\nGid:\t1001\n";
        assert_eq!(real_uid(status), Some(1001));
        assert_eq!(real_uid("Name:\tx\n"), None);
        let passwd =
            "root:x:0:0:root:/root:/bin/bash\n# comment\nana:x:1001:1001:Ana:/home/ana:/bin/bash\n";
        assert_eq!(account_name(passwd, 1001).as_deref(), Some("ana"));
        assert_eq!(account_name(passwd, 0).as_deref(), Some("root"));
        assert_eq!(account_name(passwd, 4242), None);
    }

    #[test]
    fn reads_a_proc_tree() {
        let host = tempfile::tempdir().unwrap();
        let root = host.path().join("proc");
        std::fs::create_dir_all(host.path().join("etc")).unwrap();
        std::fs::write(
            host.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\nana:x:1001:1001::/home/ana:/bin/sh\n",
        )
        .unwrap();
        let dir = root.join("4242");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("environ"), b"GPULEDGER_EXPERIMENT=exp-7\0").unwrap();
        std::fs::write(
            dir.join("cgroup"),
            format!("0::/system.slice/docker-{CID}.scope\n"),
        )
        .unwrap();
        std::fs::write(dir.join("comm"), "python3\n").unwrap();
        std::fs::write(
            dir.join("status"),
            "Name:\tpython3\nUid:\t1001\t1001\t1001\t1001\n",
        )
        .unwrap();
        let other = root.join("4343");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("status"), "Uid:\t2002\t2002\t2002\t2002\n").unwrap();
        let reader = OwnerReader::new(&root, vec![]);
        assert_eq!(reader.read(4242).user.as_deref(), Some("ana"));
        assert_eq!(reader.read(4343).user.as_deref(), Some("uid 2002"));
        let owner = reader.read(4242);
        assert_eq!(
            owner.labels.get("experiment").map(String::as_str),
            Some("exp-7")
        );
        assert_eq!(owner.container_id.as_deref(), Some(CID));
        assert_eq!(reader.process_name(4242).as_deref(), Some("python3"));
        assert_eq!(reader.read(9999), Owner::default());

        // A cgroup that cannot be read (here a directory where the file should be): the owner
        // says why, and the rest is still read.
        let odd = root.join("4444");
        std::fs::create_dir_all(odd.join("cgroup")).unwrap();
        std::fs::write(odd.join("environ"), b"GPULEDGER_TEAM=ads\0").unwrap();
        let owner = reader.read(4444);
        assert_eq!(owner.unknown.as_deref(), Some("cgroup_unreadable"));
        assert_eq!(owner.labels.get("team").map(String::as_str), Some("ads"));
    }

    #[test]
    fn label_values_are_made_fit_for_the_server() {
        assert_eq!(clean_label("sweep 1\nlr=3e-4\t"), "sweep 1 lr=3e-4 ");
        let long = "é".repeat(200);
        let cut = clean_label(&long);
        assert!(cut.len() <= MAX_LABEL_BYTES && cut.chars().all(|c| c == 'é'));
    }
}
