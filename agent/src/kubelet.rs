//! Kubernetes pods as owners: which pod and container each GPU (or MIG instance) is allocated
//! to, from the kubelet's PodResources API (gRPC `v1.PodResourcesLister/List` on the node's
//! pod-resources socket, `/var/lib/kubelet/pod-resources/kubelet.sock`).
//!
//! Asked every `refresh` on a task of its own; the sampling path reads the last answer and never
//! waits. A process on a GPU allocated to one container carries that container's namespace, pod
//! and container as labels. A GPU shared by several pods (time-slicing) names no pod for its
//! processes: the kubelet says which pods hold it, not which process is whose; where all of them
//! are in one namespace, the namespace is still named. When the kubelet cannot answer (no socket,
//! garbage, a timeout), sampling goes on with the last owners known (for a while) and processes
//! carry the cause; it is logged once.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The messages of `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` that are read here, with
/// their field numbers; fields not named here (CPU ids, memory, topology, dynamic resources)
/// are skipped on decoding, as protobuf does.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesResponse {
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        #[prost(string, tag = "1")]
        pub resource_name: String,
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
    }

    /// The method's path: package `v1`, service `PodResourcesLister`.
    pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";
}

/// Where to ask.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    pub socket: PathBuf,
    pub refresh: Duration,
    pub timeout: Duration,
}

/// How long the last answer stands in for the kubelet while it cannot answer.
const KEEP_LAST_ANSWER: Duration = Duration::from_secs(300);

/// One container a device is allocated to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Allocation {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// The device each allocation names, by the id NVML gives it (`GPU-…`, `MIG-…`). The NVIDIA
/// device plugin's time-slicing replicas (`GPU-…::3`) are the GPU they share.
pub fn allocations(response: &proto::ListPodResourcesResponse) -> HashMap<String, Vec<Allocation>> {
    let mut out: HashMap<String, Vec<Allocation>> = HashMap::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for devices in &container.devices {
                for id in &devices.device_ids {
                    let device = id.split("::").next().unwrap_or(id).to_owned();
                    let a = Allocation {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                    };
                    let list = out.entry(device).or_default();
                    if !list.contains(&a) {
                        list.push(a);
                    }
                }
            }
        }
    }
    for list in out.values_mut() {
        list.sort();
    }
    out
}

/// The labels a process on a device allocated so carries, and the cause when the pod is not
/// known for sure.
pub fn labels_for(allocated: &[Allocation]) -> (Vec<(&'static str, String)>, Option<&'static str>) {
    match allocated {
        [] => (Vec::new(), None),
        [one] => (
            vec![
                ("k8s_namespace", one.namespace.clone()),
                ("k8s_pod", one.pod.clone()),
                ("k8s_container", one.container.clone()),
            ],
            None,
        ),
        [first, rest @ ..] => {
            let same_namespace = rest.iter().all(|a| a.namespace == first.namespace);
            let labels = if same_namespace {
                vec![("k8s_namespace", first.namespace.clone())]
            } else {
                Vec::new()
            };
            (labels, Some("k8s_gpu_shared"))
        }
    }
}

/// Why the kubelet's answer is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unknown {
    /// No socket: not a Kubernetes node, or the socket is not mounted into the agent.
    NoSocket,
    TimedOut,
    /// The kubelet answered something that is not PodResources (or an error status).
    Failed(String),
}

impl Unknown {
    pub fn code(&self) -> &'static str {
        match self {
            Unknown::NoSocket => "kubelet_no_socket",
            Unknown::TimedOut => "kubelet_timeout",
            Unknown::Failed(_) => "kubelet_error",
        }
    }
}

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unknown::NoSocket => write!(f, "the kubelet's pod-resources socket is not there"),
            Unknown::TimedOut => write!(f, "the kubelet did not answer in time"),
            Unknown::Failed(why) => write!(f, "the kubelet's answer was unusable: {why}"),
        }
    }
}

/// Asks the kubelet once.
pub async fn list(config: &KubeletConfig) -> Result<proto::ListPodResourcesResponse, Unknown> {
    if !config.socket.exists() {
        return Err(Unknown::NoSocket);
    }
    match tokio::time::timeout(config.timeout, ask(config.socket.clone())).await {
        Ok(answer) => answer,
        Err(_) => Err(Unknown::TimedOut),
    }
}

async fn ask(socket: PathBuf) -> Result<proto::ListPodResourcesResponse, Unknown> {
    let failed = |e: &dyn std::fmt::Display| Unknown::Failed(e.to_string());
    // The address is a placeholder: the connector below dials the socket whatever it says.
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.local")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| failed(&e))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| failed(&e))?;
    let codec: tonic_prost::ProstCodec<
        proto::ListPodResourcesRequest,
        proto::ListPodResourcesResponse,
    > = tonic_prost::ProstCodec::default();
    let response = grpc
        .unary(
            tonic::Request::new(proto::ListPodResourcesRequest {}),
            http::uri::PathAndQuery::from_static(proto::LIST_PATH),
            codec,
        )
        .await
        .map_err(|status| failed(&format!("{:?}: {}", status.code(), status.message())))?;
    Ok(response.into_inner())
}

#[derive(Default)]
struct State {
    devices: HashMap<String, Vec<Allocation>>,
    answered: Option<Instant>,
    failing: Option<Unknown>,
}

/// The last answer of the kubelet, kept fresh by [`Pods::refresh`].
#[derive(Clone, Default)]
pub struct Pods {
    state: Arc<Mutex<State>>,
}

impl Pods {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the kubelet now and keeps the answer (or the cause, said once per cause).
    pub async fn refresh(&self, config: &KubeletConfig) {
        let answer = list(config).await;
        let mut s = self.lock();
        match answer {
            Ok(response) => {
                s.devices = allocations(&response);
                s.answered = Some(Instant::now());
                if s.failing.take().is_some() {
                    tracing::info!("the kubelet's pod resources answer again");
                }
            }
            Err(why) => {
                if s.failing.as_ref() != Some(&why) {
                    let socket = config.socket.display();
                    if why == Unknown::NoSocket {
                        // Most hosts that are no Kubernetes node: a note, not a warning.
                        tracing::info!(%socket, "no kubelet pod-resources socket: pods are not named (said once)");
                    } else {
                        tracing::warn!(cause = %why, %socket, "pods holding GPUs unknown until the kubelet answers (said once per cause)");
                    }
                }
                s.failing = Some(why);
            }
        }
    }

    /// Why the last question to the kubelet failed, while it fails.
    pub fn failing(&self) -> Option<Unknown> {
        self.lock().failing.clone()
    }

    /// Refreshes every `config.refresh` for as long as the agent runs.
    pub async fn keep_fresh(self, config: KubeletConfig) {
        let mut tick = tokio::time::interval(config.refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.refresh(&config).await;
        }
    }

    /// The containers `device` (or, for a MIG instance allocated whole with its GPU, `parent`)
    /// is allocated to, or why that is unknown. An answer older than a few minutes is no answer.
    pub fn of(&self, device: &str, parent: Option<&str>) -> Result<Vec<Allocation>, Unknown> {
        let s = self.lock();
        let fresh = s.answered.is_some_and(|at| at.elapsed() < KEEP_LAST_ANSWER);
        if !fresh {
            // Not asked yet: nothing to say, not a fault.
            return match &s.failing {
                Some(why) => Err(why.clone()),
                None => Ok(Vec::new()),
            };
        }
        let found = s
            .devices
            .get(device)
            .or_else(|| parent.and_then(|p| s.devices.get(p)));
        Ok(found.cloned().unwrap_or_default())
    }
}

/// Adds the pod labels of a process on `device` to `labels`; the cause when they are unknown.
/// A label the process set itself stays.
pub fn add_pod_labels(
    pods: &Pods,
    device: &str,
    parent: Option<&str>,
    labels: &mut BTreeMap<String, String>,
) -> Option<&'static str> {
    match pods.of(device, parent) {
        Ok(allocated) => {
            let (found, cause) = labels_for(&allocated);
            for (key, value) in found {
                labels.entry(key.to_owned()).or_insert(value);
            }
            // The last answer, while the kubelet fails: kept, and said to be stale.
            cause.or_else(|| pods.failing().map(|why| why.code()))
        }
        Err(why) => Some(why.code()),
    }
}

#[cfg(test)]
mod tests {
    use super::proto::*;
    use super::*;

    fn pod(ns: &str, name: &str, container: &str, resource: &str, ids: &[&str]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![ContainerResources {
                name: container.into(),
                devices: vec![ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                }],
            }],
        }
    }

    #[test]
    fn devices_map_to_their_pods_whole_mig_and_time_sliced() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "search",
                    "ranker-7d9f",
                    "model",
                    "nvidia.com/gpu",
                    &["GPU-aaa"],
                ),
                pod(
                    "vision",
                    "train-0",
                    "trainer",
                    "nvidia.com/mig-3g.40gb",
                    &["MIG-bbb"],
                ),
                pod("nlp", "chat-1", "vllm", "nvidia.com/gpu", &["GPU-ccc::0"]),
                pod("nlp", "chat-2", "vllm", "nvidia.com/gpu", &["GPU-ccc::1"]),
                pod("ads", "x-1", "x", "nvidia.com/gpu", &["GPU-ddd::0"]),
                pod("nlp", "y-1", "y", "nvidia.com/gpu", &["GPU-ddd::1"]),
            ],
        };
        let by_device = allocations(&response);
        let (labels, cause) = labels_for(&by_device["GPU-aaa"]);
        assert_eq!(cause, None);
        assert!(labels.contains(&("k8s_namespace", "search".into())));
        assert!(labels.contains(&("k8s_pod", "ranker-7d9f".into())));
        assert!(labels.contains(&("k8s_container", "model".into())));
        assert_eq!(
            labels_for(&by_device["MIG-bbb"]).0[1],
            ("k8s_pod", "train-0".into())
        );
        // Shared in one namespace: the namespace, not a pod.
        let (labels, cause) = labels_for(&by_device["GPU-ccc"]);
        assert_eq!(labels, vec![("k8s_namespace", "nlp".into())]);
        assert_eq!(cause, Some("k8s_gpu_shared"));
        // Shared across namespaces: nothing named.
        assert_eq!(
            labels_for(&by_device["GPU-ddd"]),
            (vec![], Some("k8s_gpu_shared"))
        );
        let causes = gpuledger_proto::OWNER_UNKNOWN_CAUSES;
        assert!(causes.contains(&"k8s_gpu_shared"));
        for why in [
            Unknown::NoSocket,
            Unknown::TimedOut,
            Unknown::Failed(String::new()),
        ] {
            assert!(causes.contains(&why.code()), "{why}");
        }
        assert!(!by_device.contains_key("GPU-ccc::0"));
    }

    #[test]
    fn extra_fields_of_the_real_message_are_skipped() {
        // A ContainerResources with cpu_ids (3) and a device's topology (3), as kubelets send.
        use prost::Message;
        #[derive(Clone, PartialEq, prost::Message)]
        struct Topology {
            #[prost(message, repeated, tag = "1")]
            nodes: Vec<Numa>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct Numa {
            #[prost(int64, tag = "1")]
            id: i64,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct FullDevices {
            #[prost(string, tag = "1")]
            resource_name: String,
            #[prost(string, repeated, tag = "2")]
            device_ids: Vec<String>,
            #[prost(message, optional, tag = "3")]
            topology: Option<Topology>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct FullContainer {
            #[prost(string, tag = "1")]
            name: String,
            #[prost(message, repeated, tag = "2")]
            devices: Vec<FullDevices>,
            #[prost(int64, repeated, tag = "3")]
            cpu_ids: Vec<i64>,
        }
        let bytes = FullContainer {
            name: "trainer".into(),
            devices: vec![FullDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-aaa".into()],
                topology: Some(Topology {
                    nodes: vec![Numa { id: 1 }],
                }),
            }],
            cpu_ids: vec![0, 1, 2],
        }
        .encode_to_vec();
        let read = ContainerResources::decode(bytes.as_slice()).unwrap();
        assert_eq!(read.devices[0].device_ids, ["GPU-aaa"]);
    }

    #[tokio::test]
    async fn no_socket_is_a_cause_not_a_wait() {
        let pods = Pods::default();
        let config = KubeletConfig {
            socket: "/nonexistent/kubelet.sock".into(),
            refresh: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
        };
        pods.refresh(&config).await;
        assert_eq!(pods.of("GPU-aaa", None), Err(Unknown::NoSocket));
        let mut labels = BTreeMap::new();
        assert_eq!(
            add_pod_labels(&pods, "GPU-aaa", None, &mut labels),
            Some("kubelet_no_socket")
        );
        assert!(labels.is_empty());
    }
}
