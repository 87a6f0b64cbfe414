//! Slurm jobs as owners: which job a GPU process runs in (its cgroup, else `SLURM_JOB_ID` in its
//! environment) and that job's account, user, partition, QOS, name, array and comment, asked of
//! the controller with `squeue --json`.
//!
//! The controller is asked off the sampling path, on a thread of its own, once per job (a job's
//! account and name do not change while it runs). Until it answers, a process carries its job id
//! alone; a window closing before the answer takes what has arrived by then. When the controller
//! cannot answer (not installed, timed out, failed), processes carry the cause as their
//! `owner_unknown`, sampling goes on, and the cause is logged once, not per sample.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How to reach the controller.
#[derive(Debug, Clone)]
pub struct SlurmConfig {
    /// `squeue`, or its path. It reads the cluster's `slurm.conf` (`SLURM_CONF`) as any client.
    pub squeue: PathBuf,
    /// How long one question to the controller may take.
    pub timeout: Duration,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            squeue: PathBuf::from("squeue"),
            timeout: Duration::from_secs(5),
        }
    }
}

/// How long a failed question waits before it is asked again.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// A job nobody has asked about for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3_600);

/// Why a process's Slurm job facts are unknown: the `owner_unknown` it carries (a short code,
/// so the server can count them) and the log line (said once per cause).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Unknown {
    /// `squeue` is not installed (or not where configured).
    NotInstalled,
    /// The controller did not answer in time.
    TimedOut,
    /// `squeue` failed or answered something that is not its JSON.
    Failed(String),
    /// The controller does not know the job (it ended, or the id came from a stale environment).
    JobNotFound,
}

impl Unknown {
    pub fn code(&self) -> &'static str {
        match self {
            Unknown::NotInstalled => "slurm_not_installed",
            Unknown::TimedOut => "slurm_timeout",
            Unknown::Failed(_) => "slurm_error",
            Unknown::JobNotFound => "slurm_job_not_found",
        }
    }
}

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unknown::NotInstalled => write!(f, "squeue is not installed"),
            Unknown::TimedOut => write!(f, "the Slurm controller did not answer in time"),
            Unknown::Failed(why) => write!(f, "squeue failed: {why}"),
            Unknown::JobNotFound => write!(f, "the Slurm controller does not know the job"),
        }
    }
}

/// What the controller says about a job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFacts {
    pub job_id: u64,
    pub account: String,
    pub user: String,
    pub partition: String,
    pub qos: String,
    pub name: String,
    pub array_job_id: Option<u64>,
    pub array_task_id: Option<u64>,
    pub comment: String,
    /// GPUs allocated to the job (`gres/gpu=N` in its allocated TRES).
    pub gpus: Option<u64>,
    /// Which, where Slurm says (`gres_detail`: `gpu:a100:2(IDX:0-1)`).
    pub gres: String,
}

impl JobFacts {
    /// The process labels it gives (`slurm_account`, …): empty values are left out.
    pub fn labels(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("slurm_job_id", self.job_id.to_string())];
        for (key, value) in [
            ("slurm_account", &self.account),
            ("slurm_user", &self.user),
            ("slurm_partition", &self.partition),
            ("slurm_qos", &self.qos),
            ("slurm_job_name", &self.name),
            ("slurm_comment", &self.comment),
            ("slurm_gres", &self.gres),
        ] {
            if !value.is_empty() {
                out.push((key, value.clone()));
            }
        }
        if let Some(id) = self.array_job_id {
            out.push(("slurm_array_job_id", id.to_string()));
        }
        if let Some(id) = self.array_task_id {
            out.push(("slurm_array_task_id", id.to_string()));
        }
        if let Some(n) = self.gpus {
            out.push(("slurm_gpus", n.to_string()));
        }
        out
    }
}

/// The job in a process's cgroup: `…/slurm/uid_1000/job_42/step_0/…` (cgroup v1) or
/// `0::/system.slice/slurmstepd.scope/job_42/step_batch/…` (v2).
pub fn job_of_cgroup(cgroup: &str) -> Option<u64> {
    cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        if !path.contains("slurm") {
            return None;
        }
        path.split('/')
            .find_map(|part| part.strip_prefix("job_")?.parse().ok())
    })
}

/// The job named by `SLURM_JOB_ID` in a NUL-separated environment.
pub fn job_of_environ(environ: &[u8]) -> Option<u64> {
    environ
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(b"SLURM_JOB_ID="))
        .and_then(|id| std::str::from_utf8(id).ok())
        .and_then(|id| id.trim().parse().ok())
}

/// A number as `squeue --json` writes one: bare (Slurm 22.05 and before), or `{"set": true,
/// "number": 42}` (23.02 and later; `"set": false` means none).
fn number(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64(),
        Value::Object(o) => {
            if o.get("set").and_then(Value::as_bool) == Some(false) {
                return None;
            }
            o.get("number").and_then(Value::as_u64)
        }
        _ => None,
    }
}

/// `gres/gpu=N` in a TRES string (`cpu=8,mem=64G,node=1,billing=8,gres/gpu=2,gres/gpu:a100=2`).
fn gpus_of_tres(tres: &str) -> Option<u64> {
    tres.split(',')
        .find_map(|t| t.strip_prefix("gres/gpu="))
        .and_then(|n| n.trim().parse().ok())
}

fn string(v: Option<&Value>) -> String {
    v.and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// The jobs in `squeue --json`'s answer.
pub fn parse_squeue(json: &str) -> Result<Vec<JobFacts>, String> {
    let doc: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let jobs = doc
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or("no \"jobs\" list in the answer")?;
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        let Some(job_id) = number(job.get("job_id")) else {
            return Err("a job without a job_id".into());
        };
        // An array's tasks name their array; a plain job's array_job_id is 0 (or unset).
        let array_job_id = number(job.get("array_job_id")).filter(|id| *id != 0);
        out.push(JobFacts {
            job_id,
            account: string(job.get("account")),
            user: string(job.get("user_name")),
            partition: string(job.get("partition")),
            qos: string(job.get("qos")),
            name: string(job.get("name")),
            array_job_id,
            array_task_id: array_job_id.and(number(job.get("array_task_id"))),
            comment: string(job.get("comment")),
            gpus: gpus_of_tres(&string(job.get("tres_alloc_str"))),
            gres: job
                .get("gres_detail")
                .and_then(Value::as_array)
                .map(|d| {
                    d.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default(),
        });
    }
    Ok(out)
}

enum Lookup {
    Known(JobFacts, Instant),
    Failed(Unknown, Instant),
}

#[derive(Default)]
struct State {
    jobs: HashMap<u64, Lookup>,
    /// Asked for and not answered yet.
    pending: HashSet<u64>,
    /// The controller's last question failed (said once, until it answers again).
    controller_failing: bool,
}

/// The agent's view of the controller: answers from its cache at once and asks the controller
/// for the rest on its own thread.
#[derive(Clone)]
pub struct SlurmJobs {
    state: Arc<(Mutex<State>, Condvar)>,
    ask: Sender<u64>,
}

impl SlurmJobs {
    /// Starts the thread that asks the controller.
    pub fn start(config: SlurmConfig) -> SlurmJobs {
        let state = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let (ask, questions) = std::sync::mpsc::channel();
        let worker_state = state.clone();
        let spawned = std::thread::Builder::new()
            .name("slurm-jobs".into())
            .spawn(move || ask_controller(config, questions, worker_state));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the Slurm thread; jobs stay unknown");
        }
        SlurmJobs { state, ask }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The job's facts if known, the cause if the controller could not say, `Ok(None)` while
    /// the question is out (asked here if it was not).
    pub fn facts(&self, job_id: u64) -> Result<Option<JobFacts>, Unknown> {
        let now = Instant::now();
        let mut state = self.lock();
        match state.jobs.get_mut(&job_id) {
            Some(Lookup::Known(facts, used)) => {
                *used = now;
                return Ok(Some(facts.clone()));
            }
            Some(Lookup::Failed(why, at)) if now.duration_since(*at) < RETRY_AFTER => {
                return Err(why.clone());
            }
            _ => {}
        }
        if state.pending.insert(job_id) && self.ask.send(job_id).is_err() {
            state.pending.remove(&job_id);
            return Err(Unknown::Failed("the Slurm thread is not running".into()));
        }
        match state.jobs.get(&job_id) {
            // Asked again after a failure: the old cause stands until the answer.
            Some(Lookup::Failed(why, _)) => Err(why.clone()),
            _ => Ok(None),
        }
    }

    /// Waits up to `timeout` for the questions out to be answered (for `once`, which prints a
    /// single window).
    pub fn settle(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        while !state.pending.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            state = match self.state.1.wait_timeout(state, left) {
                Ok((s, _)) => s,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

fn ask_controller(
    config: SlurmConfig,
    questions: Receiver<u64>,
    state: Arc<(Mutex<State>, Condvar)>,
) {
    loop {
        let first = match questions.recv_timeout(FORGET_AFTER) {
            Ok(id) => id,
            Err(RecvTimeoutError::Timeout) => {
                forget_unused(&state);
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        // One question for every job asked about meanwhile.
        let mut ids: Vec<u64> = vec![first];
        ids.extend(questions.try_iter());
        ids.sort_unstable();
        ids.dedup();
        let answer = squeue(&config, &ids);
        let now = Instant::now();
        let (lock, answered) = &*state;
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        match answer {
            Ok(jobs) => {
                let mut found: HashMap<u64, JobFacts> =
                    jobs.into_iter().map(|j| (j.job_id, j)).collect();
                for id in &ids {
                    let lookup = match found.remove(id) {
                        Some(facts) => Lookup::Known(facts, now),
                        None => Lookup::Failed(Unknown::JobNotFound, now),
                    };
                    s.jobs.insert(*id, lookup);
                }
                if std::mem::take(&mut s.controller_failing) {
                    tracing::info!("the Slurm controller answers again");
                }
            }
            Err(why) => {
                if !std::mem::replace(&mut s.controller_failing, true) {
                    tracing::warn!(cause = %why, "Slurm jobs' owners unknown until the controller answers (retried every 30 s; said once)");
                }
                for id in &ids {
                    s.jobs.insert(*id, Lookup::Failed(why.clone(), now));
                }
            }
        }
        for id in &ids {
            s.pending.remove(id);
        }
        answered.notify_all();
    }
}

fn forget_unused(state: &Arc<(Mutex<State>, Condvar)>) {
    let mut s = state.0.lock().unwrap_or_else(|e| e.into_inner());
    s.jobs.retain(|_, l| match l {
        Lookup::Known(_, used) | Lookup::Failed(_, used) => used.elapsed() < FORGET_AFTER,
    });
}

/// Runs `squeue --json --jobs=…` with the configured timeout.
fn squeue(config: &SlurmConfig, ids: &[u64]) -> Result<Vec<JobFacts>, Unknown> {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    let mut child = Command::new(&config.squeue)
        .arg("--json")
        .arg(format!("--jobs={}", list.join(",")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Unknown::NotInstalled,
            _ => Unknown::Failed(e.to_string()),
        })?;
    // Read both pipes on their own threads, so a large answer cannot fill a pipe and stall.
    let stdout = child.stdout.take().map(read_all);
    let stderr = child.stderr.take().map(read_all);
    let deadline = Instant::now() + config.timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Unknown::TimedOut);
            }
            Err(e) => return Err(Unknown::Failed(e.to_string())),
        }
    };
    let out = stdout.and_then(|h| h.join().ok()).unwrap_or_default();
    let err = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
    let err = String::from_utf8_lossy(&err);
    // squeue refuses an id it does not know ("Invalid job id specified") rather than list nothing.
    if !status.success() && err.contains("Invalid job id") {
        return Ok(Vec::new());
    }
    if !status.success() {
        let first = err.lines().next().unwrap_or("no message").trim().to_owned();
        return Err(Unknown::Failed(format!("{status}: {first}")));
    }
    parse_squeue(&String::from_utf8_lossy(&out)).map_err(Unknown::Failed)
}

fn read_all(mut r: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_found_in_either_cgroup_layout() {
        // cgroup v1, as slurmd's proctrack/cgroup and task/cgroup lay it out.
        let v1 = "12:memory:/slurm/uid_1000/job_4242/step_0/task_0\n\
                  11:devices:/slurm/uid_1000/job_4242/step_0\n\
                  1:name=systemd:/system.slice/slurmd.service\n";
        assert_eq!(job_of_cgroup(v1), Some(4242));
        // cgroup v2 (Slurm 22.05 and later).
        let v2 = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n";
        assert_eq!(job_of_cgroup(v2), Some(77));
        // A node running several slurmd (multiple-slurmd): `slurm_<node>`.
        let multi = "4:cpuset:/slurm_node07/uid_0/job_9/step_extern\n";
        assert_eq!(job_of_cgroup(multi), Some(9));
        // Not Slurm's: a `job_` elsewhere is nobody's job.
        assert_eq!(job_of_cgroup("0::/user.slice/job_5.scope\n"), None);
        assert_eq!(job_of_cgroup("0::/kubepods/pod1234/abc\n"), None);
        assert_eq!(job_of_cgroup("garbage without colons"), None);
    }

    #[test]
    fn a_job_is_found_in_the_environment() {
        let env = b"PATH=/usr/bin\0SLURM_JOB_ID=123\0SLURM_JOB_ACCOUNT=vision\0";
        assert_eq!(job_of_environ(env), Some(123));
        assert_eq!(job_of_environ(b"SLURM_JOB_ID=abc\0"), None);
        assert_eq!(job_of_environ(b"MY_SLURM_JOB_ID=1\0"), None);
    }

    #[test]
    fn both_shapes_of_squeue_json_read_alike() {
        // Slurm 22.05 (openapi v0.0.38): bare numbers.
        let old = r#"{"meta":{},"errors":[],"jobs":[{"job_id":2,"account":"vision","user_name":"alice",
            "partition":"gpu","qos":"normal","name":"resnet-sweep","array_job_id":1,"array_task_id":1,
            "comment":"model=resnet50","tres_alloc_str":"cpu=8,mem=64G,node=1,billing=8,gres/gpu=2,gres/gpu:a100=2",
            "gres_detail":["gpu:a100:2(IDX:0-1)"]},{"job_id":5,"account":"nlp","user_name":"bob","partition":"gpu",
            "qos":"","name":"train","array_job_id":0,"array_task_id":null,"comment":""}]}"#;
        // Slurm 23.02 and later: numbers as {"set","infinite","number"}.
        let new = r#"{"jobs":[{"job_id":2,"account":"vision","user_name":"alice","partition":"gpu",
            "qos":"normal","name":"resnet-sweep","array_job_id":{"set":true,"infinite":false,"number":1},
            "array_task_id":{"set":true,"infinite":false,"number":1},"comment":"model=resnet50",
            "tres_alloc_str":"cpu=8,mem=64G,node=1,billing=8,gres/gpu=2,gres/gpu:a100=2",
            "gres_detail":["gpu:a100:2(IDX:0-1)"]},
            {"job_id":5,"account":"nlp","user_name":"bob","partition":"gpu","qos":"","name":"train",
            "array_job_id":{"set":true,"infinite":false,"number":0},
            "array_task_id":{"set":false,"infinite":false,"number":0},"comment":""}]}"#;
        for doc in [old, new] {
            let jobs = parse_squeue(doc).unwrap();
            assert_eq!(jobs.len(), 2);
            assert_eq!(jobs[0].account, "vision");
            assert_eq!(jobs[0].user, "alice");
            assert_eq!(
                (jobs[0].array_job_id, jobs[0].array_task_id),
                (Some(1), Some(1))
            );
            assert_eq!((jobs[1].array_job_id, jobs[1].array_task_id), (None, None));
            assert_eq!(jobs[0].gpus, Some(2));
            assert!(jobs[0]
                .labels()
                .contains(&("slurm_gres", "gpu:a100:2(IDX:0-1)".into())));
            assert_eq!(jobs[1].gpus, None, "a job with no GPU has no count");
            let labels = jobs[1].labels();
            assert!(labels.contains(&("slurm_account", "nlp".into())));
            assert!(
                !labels.iter().any(|(k, _)| *k == "slurm_qos"),
                "empty is left out"
            );
        }
        assert!(parse_squeue("<html>").unwrap_err().contains("not JSON"));
        assert!(parse_squeue(r#"{"errors":[]}"#)
            .unwrap_err()
            .contains("jobs"));
    }

    fn fake_squeue(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn a_controller_that_hangs_or_is_absent_leaves_a_cause_not_a_wait() {
        let dir = tempfile::tempdir().unwrap();
        let hangs = SlurmJobs::start(SlurmConfig {
            squeue: fake_squeue(dir.path(), "hangs", "sleep 30"),
            timeout: Duration::from_millis(300),
        });
        let asked = Instant::now();
        assert_eq!(hangs.facts(7), Ok(None), "asked, not waited for");
        assert!(asked.elapsed() < Duration::from_millis(100));
        hangs.settle(Duration::from_secs(5));
        assert_eq!(hangs.facts(7), Err(Unknown::TimedOut));

        let absent = SlurmJobs::start(SlurmConfig {
            squeue: dir.path().join("no-such-squeue"),
            timeout: Duration::from_secs(1),
        });
        let _ = absent.facts(7);
        absent.settle(Duration::from_secs(5));
        assert_eq!(absent.facts(7), Err(Unknown::NotInstalled));

        let garbage = SlurmJobs::start(SlurmConfig {
            squeue: fake_squeue(dir.path(), "garbage", "echo '<html>proxy error</html>'"),
            timeout: Duration::from_secs(1),
        });
        let _ = garbage.facts(7);
        garbage.settle(Duration::from_secs(5));
        assert!(matches!(garbage.facts(7), Err(Unknown::Failed(why)) if why.contains("not JSON")));
    }

    #[test]
    fn every_cause_is_one_the_server_counts() {
        for why in [
            Unknown::NotInstalled,
            Unknown::TimedOut,
            Unknown::Failed(String::new()),
            Unknown::JobNotFound,
        ] {
            assert!(gpuledger_proto::OWNER_UNKNOWN_CAUSES.contains(&why.code()));
        }
    }
}
