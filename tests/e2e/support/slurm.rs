//! A real Slurm cluster of one node on this machine, for as long as a test holds it: munged,
//! slurmctld and slurmd from Debian's packages (scripts/setup installs them), each in the
//! foreground as a child of the test, with their state in a temporary directory and ports of
//! their own, so it stops with the test and leaves nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, Proc};

pub struct SlurmCluster {
    pub dir: tempfile::TempDir,
    /// The cluster's slurm.conf: clients find it through `SLURM_CONF`.
    pub conf: PathBuf,
    /// The node's name, as slurmd registers it.
    pub node: String,
    /// The jobs' processes, killed on drop: stopping slurmd leaves them running.
    job_pids: std::sync::Mutex<Vec<u32>>,
    // Dropped in this order: the node, the controller, then munge.
    _slurmd: Proc,
    slurmctld: Option<Proc>,
    _munged: Proc,
}

fn daemon(path: &str) -> Command {
    let mut cmd = Command::new(path);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

fn installed(path: &str) {
    assert!(
        Path::new(path).exists(),
        "{path} is missing: Slurm and munge (Debian packages slurmctld, slurmd, slurm-client, \
         munge) must be installed; scripts/setup (run by scripts/test) installs them"
    );
}

impl SlurmCluster {
    pub fn start() -> SlurmCluster {
        for bin in [
            "/usr/sbin/munged",
            "/usr/sbin/slurmctld",
            "/usr/sbin/slurmd",
            "/usr/bin/sbatch",
        ] {
            installed(bin);
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // The node claims 16 CPUs whatever this machine has (config_overrides), so a test's
        // jobs all run at once.
        for sub in ["munge", "state", "spool", "log"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        let key = d.join("munge/munge.key");
        let mut bytes = vec![0u8; 1024];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").unwrap(),
            &mut bytes,
        )
        .unwrap();
        std::fs::write(&key, bytes).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        std::fs::set_permissions(d.join("munge"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let socket = d.join("munge/munge.socket");
        let munged = Proc(
            daemon("/usr/sbin/munged")
                .arg("--foreground")
                .arg("--force")
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!(
                    "--pid-file={}",
                    d.join("munge/munged.pid").display()
                ))
                .arg(format!(
                    "--log-file={}",
                    d.join("munge/munged.log").display()
                ))
                .arg(format!(
                    "--seed-file={}",
                    d.join("munge/munged.seed").display()
                ))
                .spawn()
                .expect("start munged"),
        );
        assert!(
            wait_until(|| socket.exists()),
            "munged never opened its socket"
        );

        let node = hostname();
        let conf = d.join("slurm.conf");
        let p = |sub: &str| d.join(sub).display().to_string();
        std::fs::write(
            &conf,
            format!(
                "ClusterName=gpuledgertest\n\
                 SlurmctldHost={node}(127.0.0.1)\n\
                 SlurmUser={user}\n\
                 SlurmdUser={user}\n\
                 SlurmctldPort={ctld_port}\n\
                 SlurmdPort={slurmd_port}\n\
                 AuthType=auth/munge\n\
                 AuthInfo=socket={socket}\n\
                 CredType=cred/munge\n\
                 StateSaveLocation={state}\n\
                 SlurmdSpoolDir={spool}\n\
                 SlurmctldPidFile={ctld_pid}\n\
                 SlurmdPidFile={slurmd_pid}\n\
                 SlurmctldLogFile={ctld_log}\n\
                 SlurmdLogFile={slurmd_log}\n\
                 ProctrackType=proctrack/linuxproc\n\
                 TaskPlugin=task/none\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 SelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_Core\n\
                 ReturnToService=2\n\
                 SlurmdParameters=config_overrides\n\
                 NodeName={node} NodeAddr=127.0.0.1 CPUs=16 State=UNKNOWN\n\
                 PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
                user = user_name(),
                ctld_port = free_port(),
                slurmd_port = free_port(),
                socket = socket.display(),
                state = p("state"),
                spool = p("spool"),
                ctld_pid = p("slurmctld.pid"),
                slurmd_pid = p("slurmd.pid"),
                ctld_log = p("log/slurmctld.log"),
                slurmd_log = p("log/slurmd.log"),
            ),
        )
        .unwrap();
        let slurmctld = Proc(
            daemon("/usr/sbin/slurmctld")
                .arg("-D")
                .arg("-i")
                .arg("-f")
                .arg(&conf)
                .env("SLURM_CONF", &conf)
                .spawn()
                .expect("start slurmctld"),
        );
        let slurmd = Proc(
            daemon("/usr/sbin/slurmd")
                .arg("-D")
                .arg("-N")
                .arg(&node)
                .arg("-f")
                .arg(&conf)
                .env("SLURM_CONF", &conf)
                .spawn()
                .expect("start slurmd"),
        );
        let cluster = SlurmCluster {
            conf,
            node,
            job_pids: Default::default(),
            _slurmd: slurmd,
            slurmctld: Some(slurmctld),
            _munged: munged,
            dir,
        };
        let idle = wait_until(|| {
            let out = cluster
                .client("sinfo")
                .args(["-h", "-o", "%t"])
                .output()
                .ok();
            out.is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        let log = |name: &str| {
            std::fs::read_to_string(cluster.dir.path().join("log").join(name)).unwrap_or_default()
        };
        assert!(
            idle,
            "the Slurm node never became idle.\nslurmctld said:\n{}\nslurmd said:\n{}",
            log("slurmctld.log"),
            log("slurmd.log")
        );
        cluster
    }

    /// A Slurm client command (`sbatch`, `squeue`, …) pointed at this cluster.
    pub fn client(&self, name: &str) -> Command {
        let mut cmd = Command::new(name);
        cmd.env("SLURM_CONF", &self.conf).stdin(Stdio::null());
        cmd
    }

    /// Submits a batch job (`sbatch` with `args`) whose one process writes its pid and then
    /// sleeps, with no variable of ours in its environment (`--export=NONE`); its job id and
    /// the pid once it runs.
    pub fn run_job(&self, args: &[&str]) -> (u64, u32) {
        let pid_file = self.dir.path().join(format!("job-{}.pid", free_port()));
        let out = self
            .client("sbatch")
            .arg("--parsable")
            .arg("--export=NONE")
            .arg("--output=/dev/null")
            .args(args)
            .arg(format!(
                "--wrap=echo $$ > {}; exec sleep 300",
                pid_file.display()
            ))
            .output()
            .expect("run sbatch");
        assert!(
            out.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let job: u64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .expect("sbatch --parsable prints the job id");
        let mut pid = None;
        let started = wait_until(|| {
            pid = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            pid.is_some()
        });
        assert!(started, "job {job} never started");
        let pid = pid.unwrap_or_default();
        self.job_pids.lock().unwrap().push(pid);
        (job, pid)
    }

    /// Stops the controller, as an outage would: jobs keep running on the node.
    pub fn stop_controller(&mut self) {
        if let Some(mut ctld) = self.slurmctld.take() {
            ctld.terminate(Duration::from_secs(10));
        }
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        for pid in self.job_pids.lock().map(|p| p.clone()).unwrap_or_default() {
            // SAFETY: kill(2) on a pid this cluster's job wrote; at worst it is gone already.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }
}

/// Who runs the test: the daemons run as that user, and so do the jobs.
pub fn user_name() -> String {
    let out = Command::new("id").arg("-un").output().expect("run id");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn hostname() -> String {
    let out = Command::new("hostname").output().expect("run hostname");
    let name = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    // slurmd registers under the short name.
    name.split('.').next().unwrap_or(&name).to_owned()
}

/// Whether `ready` came true within a minute.
fn wait_until(mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}
