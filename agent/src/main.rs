use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use gpuledger_agent::collect::{GpuSource, NvmlSource};
use gpuledger_agent::dcgm::DcgmSource;
use gpuledger_agent::deliver::DeliveryConfig;
use gpuledger_agent::host::HostConfig;
use gpuledger_agent::kube_pods::KubeApiConfig;
use gpuledger_agent::kubelet::KubeletConfig;
use gpuledger_agent::run::{self, AgentConfig, OwnerSources, ServingConfig};
use gpuledger_agent::serving::ServingTarget;
use gpuledger_agent::slurm::SlurmConfig;

/// gpuledger agent: reads the GPUs of this host through NVML and reports who used them.
///
/// Every flag can also be set through the environment variable shown beside it.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Sample continuously and deliver reports to the server (the daemon).
    Run(RunArgs),
    /// Sample briefly and print one report as JSON; sends nothing.
    Once(OnceArgs),
    /// Print, as JSON, what this host's NVML answers to each call the agent makes: a value or
    /// the driver's error (NotSupported, ...). For bug reports and checking the fake against a
    /// real GPU.
    Probe(ProbeArgs),
}

#[derive(Args, Debug)]
struct ProbeArgs {
    /// Path of libnvidia-ml.so; by default the system's.
    #[arg(long, env = "GPULEDGER_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct SourceArgs {
    /// Where GPU readings come from: `nvml`, the driver through NVML; `dcgm`, an NVIDIA
    /// dcgm-exporter already running on the host (`--dcgm-url`), whose pods are the owners.
    #[arg(long, env = "GPULEDGER_SOURCE", default_value = "nvml", value_parser = ["nvml", "dcgm"])]
    source: String,
    /// dcgm-exporter's metrics endpoint, read each sample with `--source dcgm`.
    #[arg(
        long,
        env = "GPULEDGER_DCGM_URL",
        default_value = "http://127.0.0.1:9400/metrics"
    )]
    dcgm_url: String,
    /// How long one read of dcgm-exporter may take.
    #[arg(long, env = "GPULEDGER_DCGM_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    dcgm_timeout: Duration,
    /// Path of libnvidia-ml.so; by default the system's.
    #[arg(long, env = "GPULEDGER_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
    /// Cluster this host belongs to.
    #[arg(long, env = "GPULEDGER_CLUSTER", default_value = "default")]
    cluster: String,
    /// Host name to report; by default the system's.
    #[arg(long, env = "GPULEDGER_HOSTNAME")]
    hostname: Option<String>,
    /// Cloud provider (e.g. aws, azure, gcp, onprem); found through instance metadata on EC2.
    #[arg(long, env = "GPULEDGER_PROVIDER")]
    provider: Option<String>,
    /// Cloud instance id the bill names; found through instance metadata on EC2.
    #[arg(long, env = "GPULEDGER_INSTANCE_ID")]
    instance_id: Option<String>,
    #[arg(long, env = "GPULEDGER_INSTANCE_TYPE")]
    instance_type: Option<String>,
    #[arg(long, env = "GPULEDGER_REGION")]
    region: Option<String>,
    /// on-demand or spot: prices this host from the rate card until its bill arrives. Found
    /// through instance metadata on EC2.
    #[arg(long, env = "GPULEDGER_LIFECYCLE")]
    lifecycle: Option<String>,
    /// Base URL of the EC2 instance metadata service, or "off".
    #[arg(
        long,
        env = "GPULEDGER_IMDS_ENDPOINT",
        default_value = "http://169.254.169.254"
    )]
    imds_endpoint: String,
    /// How long to wait for the metadata service before deciding this host is not on EC2.
    #[arg(long, env = "GPULEDGER_IMDS_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    imds_timeout: Duration,
    /// Extra environment variables to keep as owner labels, comma separated (e.g. MLFLOW_RUN_ID).
    #[arg(long, env = "GPULEDGER_LABEL_ENV_KEYS", value_delimiter = ',')]
    label_env_keys: Vec<String>,
    /// Where process environments, cgroups and owners' uids are read; in a container, the
    /// host's /proc. Account names come from the `etc/passwd` beside it (`/host/etc/passwd`
    /// for `/host/proc`).
    #[arg(long, env = "GPULEDGER_PROC_ROOT", default_value = "/proc")]
    proc_root: PathBuf,
    /// How often to sample.
    #[arg(long, env = "GPULEDGER_SAMPLE_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    sample_interval: Duration,
    /// Slurm jobs as owners: `auto` asks the controller (with `squeue --json`) about the job a
    /// GPU process runs in, found by its cgroup or SLURM_JOB_ID; `off` never asks.
    #[arg(long, env = "GPULEDGER_SLURM", default_value = "auto", value_parser = ["auto", "off"])]
    slurm: String,
    /// Kubernetes pods as owners: `auto` asks the kubelet's PodResources API which pod and
    /// container each GPU is allocated to, for processes in pods; `off` never asks.
    #[arg(long, env = "GPULEDGER_KUBERNETES", default_value = "auto", value_parser = ["auto", "off"])]
    kubernetes: String,
    /// The kubelet's pod-resources socket (in a DaemonSet, mounted from the node).
    #[arg(
        long,
        env = "GPULEDGER_KUBELET_SOCKET",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    kubelet_socket: PathBuf,
    /// How often to ask the kubelet again (pods come and go).
    #[arg(long, env = "GPULEDGER_KUBELET_REFRESH", default_value = "15s", value_parser = humantime::parse_duration)]
    kubelet_refresh: Duration,
    /// Pod labels to keep as process labels `k8s_label.KEY` (comma separated), read from the
    /// API server where the agent has a cluster (its service account, or KUBECONFIG).
    #[arg(
        long,
        env = "GPULEDGER_K8S_POD_LABELS",
        value_delimiter = ',',
        default_value = "app.kubernetes.io/name,app.kubernetes.io/instance"
    )]
    k8s_pod_labels: Vec<String>,
    /// Pod annotations to keep as process labels `k8s_annotation.KEY` (comma separated);
    /// `gpuledger.io/model`, `…/experiment`, `…/endpoint` and `…/team` are always read.
    #[arg(long, env = "GPULEDGER_K8S_POD_ANNOTATIONS", value_delimiter = ',')]
    k8s_pod_annotations: Vec<String>,
    /// How long one question to the kubelet may take.
    #[arg(long, env = "GPULEDGER_KUBELET_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    kubelet_timeout: Duration,
    /// The squeue to run; it reads the cluster's slurm.conf as any Slurm client (SLURM_CONF).
    #[arg(long, env = "GPULEDGER_SLURM_SQUEUE", default_value = "squeue")]
    slurm_squeue: PathBuf,
    /// How long one question to the Slurm controller may take.
    #[arg(long, env = "GPULEDGER_SLURM_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    slurm_timeout: Duration,
    /// LLM serving engines (vLLM, TGI, Triton) to read requests and tokens from each window,
    /// comma separated: `ENDPOINT=URL`, or `ENDPOINT@MODEL=URL` for one model's series only
    /// (a Triton ensemble: the model that runs the LLM), e.g.
    /// `chat-api=http://127.0.0.1:8000/metrics`. ENDPOINT is the endpoint owner label's value.
    #[arg(long, env = "GPULEDGER_SERVING_METRICS", value_delimiter = ',')]
    serving_metrics: Vec<ServingTarget>,
    /// How long one read of a serving engine's metrics may take.
    #[arg(long, env = "GPULEDGER_SERVING_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    serving_timeout: Duration,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Server base URL, e.g. https://gpuledger.example.com
    #[arg(long, env = "GPULEDGER_SERVER")]
    server: String,
    /// Agent token from `gpuledger-server token create`.
    #[arg(long, env = "GPULEDGER_TOKEN", hide_env_values = true)]
    token: String,
    /// Length of one aggregation window.
    #[arg(long, env = "GPULEDGER_WINDOW", default_value = "15s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// How often to send: a report holds the windows of this long (rounded up to whole
    /// windows, at least one). Each window is on disk as it closes either way.
    #[arg(long, env = "GPULEDGER_REPORT_EVERY", default_value = "60s", value_parser = humantime::parse_duration)]
    report_every: Duration,
    /// Where batches wait until the server acknowledges them.
    #[arg(
        long,
        env = "GPULEDGER_SPOOL_DIR",
        default_value = "/var/lib/gpuledger-agent/spool"
    )]
    spool_dir: PathBuf,
    /// Upper bound on the spool's size in bytes; past it the oldest batches are dropped.
    #[arg(long, env = "GPULEDGER_SPOOL_MAX_BYTES", default_value_t = 256 * 1024 * 1024)]
    spool_max_bytes: u64,
    #[arg(long, env = "GPULEDGER_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,
    #[arg(long, env = "GPULEDGER_RETRY_INITIAL", default_value = "500ms", value_parser = humantime::parse_duration)]
    retry_initial: Duration,
    #[arg(long, env = "GPULEDGER_RETRY_MAX", default_value = "60s", value_parser = humantime::parse_duration)]
    retry_max: Duration,
    /// After SIGTERM, how long to keep sending before leaving the rest in the spool.
    #[arg(long, env = "GPULEDGER_SHUTDOWN_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
}

#[derive(Args, Debug)]
struct OnceArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// How long to sample before printing.
    #[arg(long, env = "GPULEDGER_ONCE_DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    duration: Duration,
}

impl SourceArgs {
    fn host_config(&self) -> HostConfig {
        HostConfig {
            hostname: self.hostname.clone(),
            cluster: self.cluster.clone(),
            provider: self.provider.clone(),
            instance_id: self.instance_id.clone(),
            instance_type: self.instance_type.clone(),
            region: self.region.clone(),
            lifecycle: self.lifecycle.clone(),
            imds_endpoint: (self.imds_endpoint != "off").then(|| self.imds_endpoint.clone()),
            imds_timeout: self.imds_timeout,
        }
    }

    /// The GPU source for `once`: NVML must initialise now, or say why not.
    fn open(&self) -> anyhow::Result<Box<dyn GpuSource>> {
        match self.source.as_str() {
            "dcgm" => Ok(Box::new(DcgmSource::new(
                self.dcgm_url.clone(),
                self.dcgm_timeout,
            )?)),
            _ => self.open_nvml(),
        }
    }

    /// The GPU source for the daemon, which waits for a driver that is not up yet (loading,
    /// reloading) rather than exit: it tries again with backoff and logs why.
    fn open_waiting(&self) -> anyhow::Result<Box<dyn GpuSource>> {
        if self.source == "dcgm" {
            return self.open();
        }
        Ok(match self.open_nvml() {
            Ok(source) => source,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "NVML is not available yet; sampling starts when it is");
                Box::new(NvmlSource::retrying(self.nvml_lib.clone()))
            }
        })
    }

    fn open_nvml(&self) -> anyhow::Result<Box<dyn GpuSource>> {
        let source = NvmlSource::new(self.nvml_lib.clone()).context(
            "is the NVIDIA driver installed? (--nvml-lib names another libnvidia-ml.so)",
        )?;
        tracing::info!(driver = ?source.driver_version(), "NVML initialised");
        Ok(Box::new(source))
    }

    fn slurm(&self) -> Option<SlurmConfig> {
        (self.slurm == "auto").then(|| SlurmConfig {
            squeue: self.slurm_squeue.clone(),
            timeout: self.slurm_timeout,
        })
    }

    fn kubelet(&self) -> Option<KubeletConfig> {
        (self.kubernetes == "auto").then(|| KubeletConfig {
            socket: self.kubelet_socket.clone(),
            refresh: self.kubelet_refresh,
            timeout: self.kubelet_timeout,
        })
    }

    fn kube_api(&self) -> Option<KubeApiConfig> {
        (self.kubernetes == "auto").then(|| KubeApiConfig {
            node: self
                .hostname
                .clone()
                .unwrap_or_else(gpuledger_agent::host::system_hostname),
            labels: self.k8s_pod_labels.clone(),
            annotations: self.k8s_pod_annotations.clone(),
        })
    }

    fn serving(&self) -> ServingConfig {
        ServingConfig {
            targets: self.serving_metrics.clone(),
            timeout: self.serving_timeout,
        }
    }

    fn owners(&self) -> OwnerSources {
        OwnerSources {
            proc_root: self.proc_root.clone(),
            extra_label_keys: self.label_env_keys.clone(),
            slurm: self.slurm(),
            kubelet: self.kubelet(),
            kube_api: self.kube_api(),
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutdown requested; flushing the open window");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPULEDGER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // One TLS provider for the Kubernetes client, whichever others the build links.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Run(args) => {
            let source = args.source.open_waiting()?;
            let config = AgentConfig {
                host: args.source.host_config(),
                sample_interval: args.source.sample_interval,
                window: args.window,
                windows_per_report: run::windows_per_report(args.report_every, args.window),
                spool_dir: args.spool_dir,
                spool_max_bytes: args.spool_max_bytes,
                delivery: DeliveryConfig {
                    server: args.server,
                    token: args.token,
                    request_timeout: args.request_timeout,
                    initial_backoff: args.retry_initial,
                    max_backoff: args.retry_max,
                },
                owners: args.source.owners(),
                serving: args.source.serving(),
                shutdown_grace: args.shutdown_grace,
            };
            run::run(config, source, shutdown_signal()).await
        }
        Command::Probe(args) => {
            let nvml = match &args.nvml_lib {
                Some(lib) => nvml_wrapper::Nvml::builder()
                    .lib_path(lib.as_os_str())
                    .init(),
                None => nvml_wrapper::Nvml::init(),
            }
            .context(
                "is the NVIDIA driver installed? (--nvml-lib names another libnvidia-ml.so)",
            )?;
            let answers = gpuledger_agent::probe::answers(&nvml);
            println!("{}", serde_json::to_string_pretty(&answers)?);
            Ok(())
        }
        Command::Once(args) => {
            let source = args.source.open()?;
            let (report, serving) = run::once(
                &args.source.host_config(),
                source,
                args.source.owners().start().await,
                &args.source.serving(),
                args.source.sample_interval,
                args.duration,
            )
            .await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            // What the report cannot say by itself, for the person at the host.
            for note in gpuledger_agent::diagnose::notes(&report) {
                eprintln!("{note}");
            }
            for note in gpuledger_agent::diagnose::serving_notes(&serving) {
                eprintln!("{note}");
            }
            Ok(())
        }
    }
}
