//! End to end on Kubernetes' node side: a kubelet's PodResources server (gRPC
//! `v1.PodResourcesLister/List` on a unix socket, its messages written here from
//! `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` with every field, CPU ids, memory and
//! topology included) tells the real agent which pods hold which GPUs; the processes' cgroups,
//! in a proc tree as a node's `/proc` lays them out, say which processes are in pods. Nobody
//! sets a variable: the namespace becomes the team in the API. A GPU shared by two pods, a
//! kubelet that answers garbage or not at all, and no socket each leave a cause, and sampling
//! goes on.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// The kubelet's messages, as `api.proto` (v1) defines them.
mod v1 {
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
        #[prost(int64, repeated, tag = "3")]
        pub cpu_ids: Vec<i64>,
        #[prost(message, repeated, tag = "4")]
        pub memory: Vec<ContainerMemory>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerMemory {
        #[prost(string, tag = "1")]
        pub memory_type: String,
        #[prost(uint64, tag = "2")]
        pub size: u64,
        #[prost(message, optional, tag = "3")]
        pub topology: Option<TopologyInfo>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        #[prost(string, tag = "1")]
        pub resource_name: String,
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
        #[prost(message, optional, tag = "3")]
        pub topology: Option<TopologyInfo>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TopologyInfo {
        #[prost(message, repeated, tag = "1")]
        pub nodes: Vec<NumaNode>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NumaNode {
        #[prost(int64, tag = "1")]
        pub id: i64,
    }
}

/// A kubelet's PodResourcesLister, answering what the test puts in it.
#[derive(Clone)]
struct Kubelet(Arc<Mutex<v1::ListPodResourcesResponse>>);

impl tonic::server::NamedService for Kubelet {
    const NAME: &'static str = "v1.PodResourcesLister";
}

impl tower::Service<http::Request<tonic::body::Body>> for Kubelet {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let answer = self.0.lock().unwrap().clone();
        Box::pin(async move {
            if req.uri().path() != "/v1.PodResourcesLister/List" {
                return Ok(tonic::Status::unimplemented(req.uri().path().to_owned()).into_http());
            }
            let codec: tonic_prost::ProstCodec<
                v1::ListPodResourcesResponse,
                v1::ListPodResourcesRequest,
            > = Default::default();
            let list = tower::service_fn(move |_: tonic::Request<v1::ListPodResourcesRequest>| {
                let answer = answer.clone();
                async move { Ok::<_, tonic::Status>(tonic::Response::new(answer)) }
            });
            Ok(tonic::server::Grpc::new(codec).unary(list, req).await)
        })
    }
}

fn start_kubelet(socket: &Path, answer: v1::ListPodResourcesResponse) {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let kubelet = Kubelet(Arc::new(Mutex::new(answer)));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(kubelet)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
}

fn container(name: &str, resource: &str, ids: &[&str]) -> v1::ContainerResources {
    let numa = || {
        Some(v1::TopologyInfo {
            nodes: vec![v1::NumaNode { id: 0 }],
        })
    };
    v1::ContainerResources {
        name: name.into(),
        devices: vec![v1::ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            topology: numa(),
        }],
        cpu_ids: vec![2, 3],
        memory: vec![v1::ContainerMemory {
            memory_type: "memory".into(),
            size: 1 << 30,
            topology: numa(),
        }],
    }
}

fn pod(ns: &str, name: &str, containers: Vec<v1::ContainerResources>) -> v1::PodResources {
    v1::PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers,
    }
}

const POD_SEARCH: &str = "0b4c1d2e-1111-4a2b-9c3d-000000000001";
const POD_VISION: &str = "0b4c1d2e-2222-4a2b-9c3d-000000000002";
const POD_CHAT_1: &str = "0b4c1d2e-3333-4a2b-9c3d-000000000003";
const POD_CHAT_2: &str = "0b4c1d2e-4444-4a2b-9c3d-000000000004";
const CID: &str = "4f7e0c9a4b3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f";

/// A node's `/proc` for five GPU processes: four in pods (cgroup v2, systemd driver, as the
/// kubelet and containerd lay them out) and one started on the host.
fn proc_tree(root: &Path) -> BTreeMap<&'static str, u32> {
    let in_pod = |uid: &str| {
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n",
            uid.replace('-', "_")
        )
    };
    let procs = [
        ("search", 41_001, in_pod(POD_SEARCH)),
        ("vision", 41_002, in_pod(POD_VISION)),
        ("chat-1", 41_003, in_pod(POD_CHAT_1)),
        ("chat-2", 41_004, in_pod(POD_CHAT_2)),
        (
            "host",
            41_005,
            "0::/user.slice/user-1000.slice/session-4.scope\n".to_owned(),
        ),
    ];
    let mut out = BTreeMap::new();
    for (name, pid, cgroup) in procs {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), cgroup).unwrap();
        std::fs::write(dir.join("environ"), b"PATH=/usr/bin\0HOME=/root\0").unwrap();
        std::fs::write(dir.join("comm"), "python3\n").unwrap();
        std::fs::write(dir.join("status"), "Name:\tpython3\nUid:\t0\t0\t0\t0\n").unwrap();
        out.insert(name, pid);
    }
    out
}

const GIB: u64 = 1024 * 1024 * 1024;

/// An A100 whole to one pod, an H100 in MIG mode with an instance for another, and an A10G
/// time-sliced between two pods of one namespace, where a host process also runs.
fn scenario(dir: &Path, pids: &BTreeMap<&str, u32>) -> PathBuf {
    let p = |name: &str| json!({ "pid": pids[name], "name": "python3", "memory_used_bytes": 4 * GIB, "sm_util": 40 });
    let doc = json!({ "gpus": [
        { "model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-k8s-a100",
          "power_mw": 250_000, "phases": [{ "gpu_util": 70, "memory_used_bytes": 4 * GIB, "processes": [p("search")] }] },
        { "model": "NVIDIA H100 80GB HBM3", "uuid": "GPU-k8s-h100",
          "mig": [{ "profile": "3g.40gb", "gpu_instance_id": 1, "uuid": "MIG-k8s-h100-1",
                    "phases": [{ "gpu_util": 50, "memory_used_bytes": 4 * GIB, "processes": [p("vision")] }] }] },
        { "model": "NVIDIA A10G", "uuid": "GPU-k8s-a10g",
          "phases": [{ "gpu_util": 60, "memory_used_bytes": 12 * GIB,
                       "processes": [p("chat-1"), p("chat-2"), p("host")] }] }
    ]});
    let path = dir.join("scenario.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    path
}

fn node_answer() -> v1::ListPodResourcesResponse {
    v1::ListPodResourcesResponse {
        pod_resources: vec![
            pod(
                "search",
                "ranker-6d8f9c7b5-x2x4q",
                vec![
                    container("model", "nvidia.com/gpu", &["GPU-k8s-a100"]),
                    // A sidecar with no device.
                    v1::ContainerResources {
                        name: "envoy".into(),
                        ..Default::default()
                    },
                ],
            ),
            pod(
                "vision",
                "train-resnet-0",
                vec![container(
                    "trainer",
                    "nvidia.com/mig-3g.40gb",
                    &["MIG-k8s-h100-1"],
                )],
            ),
            pod(
                "chat",
                "vllm-1",
                vec![container("vllm", "nvidia.com/gpu", &["GPU-k8s-a10g::0"])],
            ),
            pod(
                "chat",
                "vllm-2",
                vec![container("vllm", "nvidia.com/gpu", &["GPU-k8s-a10g::1"])],
            ),
            // A pod with no GPU at all.
            pod("kube-system", "coredns-1", vec![]),
        ],
    }
}

/// The agent of node `gpu-node-1`: one-second windows, the proc tree under `dir/proc`, the
/// kubelet at `socket`.
fn node_agent(
    server: &Server,
    token: &str,
    scenario: &Path,
    dir: &Path,
    socket: &Path,
) -> std::process::Command {
    let mut cmd = agent_command(&AgentOptions {
        server: &server.url,
        token,
        scenario,
        spool: &dir.join("spool"),
        cluster: "k8s",
        hostname: "gpu-node-1",
        window: "1s",
    });
    cmd.arg("--proc-root")
        .arg(dir.join("proc"))
        .arg("--kubelet-socket")
        .arg(socket)
        .args(["--slurm", "off"]);
    cmd
}

/// What `gpuledger-agent once` reads, per process: its labels and its `owner_unknown`.
fn once(scenario: &Path, proc_root: &Path, extra: &[&str]) -> BTreeMap<u32, (Value, Value)> {
    let out = std::process::Command::new(artifact("gpuledger-agent"))
        .args(["once", "--imds-endpoint", "off", "--slurm", "off"])
        .arg("--nvml-lib")
        .arg(artifact("libfake_nvml.so"))
        .arg("--proc-root")
        .arg(proc_root)
        .args(extra)
        .env("FAKE_NVML_SCENARIO", scenario)
        .env("GPULEDGER_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut by_pid = BTreeMap::new();
    for gpu in report["windows"][0]["gpus"].as_array().unwrap() {
        for p in gpu["processes"].as_array().unwrap() {
            by_pid.insert(
                p["pid"].as_u64().unwrap() as u32,
                (p["labels"].clone(), p["owner_unknown"].clone()),
            );
        }
    }
    by_pid
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pods_namespace_becomes_its_team_without_a_variable_set() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    let pids = proc_tree(&proc_root);
    let scenario = scenario(dir.path(), &pids);
    let socket = dir.path().join("kubelet.sock");
    start_kubelet(&socket, node_answer());
    let kubelet = ["--kubelet-socket", socket.to_str().unwrap()];

    let seen = once(&scenario, &proc_root, &kubelet);
    let (search, cause) = &seen[&pids["search"]];
    assert_eq!(search["k8s_namespace"], "search");
    assert_eq!(search["k8s_pod"], "ranker-6d8f9c7b5-x2x4q");
    assert_eq!(search["k8s_container"], "model");
    assert!(cause.is_null());
    let (vision, _) = &seen[&pids["vision"]];
    assert_eq!(vision["k8s_pod"], "train-resnet-0", "a MIG instance's pod");
    // Time-sliced between two pods: their namespace, no pod, and why.
    for shared in ["chat-1", "chat-2"] {
        let (labels, cause) = &seen[&pids[shared]];
        assert_eq!(labels["k8s_namespace"], "chat");
        assert!(labels.get("k8s_pod").is_none(), "{labels}");
        assert_eq!(cause, "k8s_gpu_shared");
    }
    // A host process on a pod's GPU is no pod's.
    let (host, cause) = &seen[&pids["host"]];
    assert!(
        host.get("k8s_namespace").is_none() && cause.is_null(),
        "{host}"
    );

    // Through the server: the namespaces are the teams.
    let db = test_support::sqlite();
    let token = create_token(&db.url, "k8s", "k8s");
    let server = start_server(&db.url, free_port()).await;
    let mut agent = Proc(
        node_agent(&server, &token, &scenario, dir.path(), &socket)
            .spawn()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(agent.terminate(Duration::from_secs(15)).success());
    server_run(&db.url, &["rollup"]);
    let viewer = signed_in(&server, "viewer").await;
    let q = around_now();
    let (body, teams) = allocation_rows(&viewer, &server, &format!("{q}&by=team")).await;
    for team in ["search", "vision", "chat"] {
        assert!(teams.contains_key(team), "{team} in {body}");
    }
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let review = viewer
        .get(format!("{}/review/{month}", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        review.contains("search") && review.contains("vision"),
        "the review names the namespaces as teams"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kubelet_absent_garbled_or_silent_leaves_a_cause_and_sampling_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    let pids = proc_tree(&proc_root);
    let scenario = scenario(dir.path(), &pids);

    // No socket: pods' processes say so; the host's says nothing.
    let missing = dir.path().join("absent.sock");
    let seen = once(
        &scenario,
        &proc_root,
        &["--kubelet-socket", missing.to_str().unwrap()],
    );
    assert_eq!(seen[&pids["search"]].1, "kubelet_no_socket");
    assert!(seen[&pids["host"]].1.is_null());

    // Garbage: something on the socket that is no gRPC server.
    let garbled = dir.path().join("garbled.sock");
    let listener = tokio::net::UnixListener::bind(&garbled).unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s
                .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nnot grpc")
                .await;
        }
    });
    let seen = once(
        &scenario,
        &proc_root,
        &["--kubelet-socket", garbled.to_str().unwrap()],
    );
    assert_eq!(seen[&pids["search"]].1, "kubelet_error");
    assert_eq!(seen.len(), pids.len(), "every process still sampled");

    // Silent: accepts and never answers.
    let silent = dir.path().join("silent.sock");
    let listener = tokio::net::UnixListener::bind(&silent).unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let started = std::time::Instant::now();
    let seen = once(
        &scenario,
        &proc_root,
        &[
            "--kubelet-socket",
            silent.to_str().unwrap(),
            "--kubelet-timeout",
            "1s",
        ],
    );
    assert_eq!(seen[&pids["search"]].1, "kubelet_timeout");
    assert!(started.elapsed() < Duration::from_secs(20));

    // Off: nothing asked, nothing said.
    let seen = once(&scenario, &proc_root, &["--kubernetes", "off"]);
    assert!(seen[&pids["search"]].1.is_null());
    assert!(seen[&pids["search"]].0.get("k8s_namespace").is_none());
}

/// The API server's side: pods on the node as real `Pod` objects, their ReplicaSet and Job, a
/// list and then a watch that streams what the test sends (pod churn), as kube's watcher asks.
mod api_server {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use axum::extract::{Path, Query, State};
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;
    use axum::{Json, Router};
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
    use serde_json::{json, Value};
    use tokio::sync::mpsc;

    #[derive(Clone)]
    pub struct Cluster {
        pub pods: Vec<Pod>,
        /// Watch events (`{"type": "ADDED", "object": …}`) still to stream.
        pub events: Arc<Mutex<Option<mpsc::UnboundedReceiver<Value>>>>,
        /// The field selectors the pods were asked with.
        pub selectors: Arc<Mutex<Vec<String>>>,
    }

    pub fn owner(kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    pub fn pod(
        ns: &str,
        name: &str,
        uid: &str,
        owner_ref: OwnerReference,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        container: (&str, &str),
    ) -> Pod {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                uid: Some(uid.into()),
                resource_version: Some("7".into()),
                labels: Some(map(labels)),
                annotations: Some(map(annotations)),
                owner_references: Some(vec![owner_ref]),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some("Running".into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: container.0.into(),
                    container_id: Some(format!("containerd://{}", container.1)),
                    image: "registry.example/model:1".into(),
                    image_id: String::new(),
                    ready: true,
                    restart_count: 0,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    async fn pods(State(c): State<Cluster>, Query(q): Query<BTreeMap<String, String>>) -> Response {
        if let Some(sel) = q.get("fieldSelector") {
            c.selectors.lock().unwrap().push(sel.clone());
        }
        if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
            let Some(mut rx) = c.events.lock().unwrap().take() else {
                // One watch streams the test's events; a re-watch waits quietly.
                return axum::body::Body::from_stream(futures::stream::pending::<
                    Result<String, std::io::Error>,
                >())
                .into_response();
            };
            let stream = futures::stream::poll_fn(move |cx| {
                rx.poll_recv(cx)
                    .map(|e| e.map(|e| Ok::<_, std::io::Error>(format!("{e}\n"))))
            });
            return axum::body::Body::from_stream(stream).into_response();
        }
        Json(json!({
            "apiVersion": "v1", "kind": "PodList",
            "metadata": { "resourceVersion": "7" },
            "items": c.pods,
        }))
        .into_response()
    }

    async fn replica_set(Path((ns, name)): Path<(String, String)>) -> Response {
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns),
                owner_references: Some(vec![owner(
                    "Deployment",
                    name.rsplit_once('-').map_or(name.as_str(), |(d, _)| d),
                )]),
                ..Default::default()
            },
            ..Default::default()
        };
        Json(rs).into_response()
    }

    async fn job(Path((ns, name)): Path<(String, String)>) -> Response {
        let job = Job {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(ns),
                owner_references: Some(vec![owner("CronJob", "nightly-train")]),
                ..Default::default()
            },
            ..Default::default()
        };
        Json(job).into_response()
    }

    /// Serves `cluster` on a free port; its URL.
    pub async fn start(cluster: Cluster) -> (String, tokio::task::JoinHandle<()>) {
        let app = Router::new()
            .route("/api/v1/pods", get(pods))
            .route(
                "/apis/apps/v1/namespaces/{ns}/replicasets/{name}",
                get(replica_set),
            )
            .route("/apis/batch/v1/namespaces/{ns}/jobs/{name}", get(job))
            .with_state(cluster);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (url, task)
    }

    /// A kubeconfig naming the server, as `kubectl config view --raw` writes one.
    pub fn kubeconfig(dir: &std::path::Path, url: &str) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n\
                 users:\n- name: agent\n  user:\n    token: test-token\n\
                 contexts:\n- name: test\n  context:\n    cluster: test\n    user: agent\n\
                 current-context: test\n"
            ),
        )
        .unwrap();
        path
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_names_each_processs_pod_labels_and_workload_and_churn_follows() {
    use api_server::*;
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    let pids = proc_tree(&proc_root);
    let scenario = scenario(dir.path(), &pids);
    let socket = dir.path().join("kubelet.sock");
    start_kubelet(&socket, node_answer());

    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let cluster = Cluster {
        pods: vec![
            pod(
                "search",
                "ranker-6d8f9c7b5-x2x4q",
                POD_SEARCH,
                owner("ReplicaSet", "ranker-6d8f9c7b5"),
                &[
                    ("app.kubernetes.io/name", "ranker"),
                    ("pod-template-hash", "6d8f9c7b5"),
                ],
                &[("gpuledger.io/model", "llama-70b")],
                ("model", CID),
            ),
            pod(
                "vision",
                "nightly-train-29100000-abcde",
                POD_VISION,
                owner("Job", "nightly-train-29100000"),
                &[],
                &[],
                ("trainer", CID),
            ),
            pod(
                "chat",
                "vllm-1",
                POD_CHAT_1,
                owner("StatefulSet", "vllm"),
                &[("app.kubernetes.io/name", "chat")],
                &[],
                ("vllm", CID),
            ),
        ],
        events: Arc::new(Mutex::new(Some(rx))),
        selectors: Default::default(),
    };
    let (url, api) = start(cluster.clone()).await;
    let kubeconfig = kubeconfig(dir.path(), &url);

    let db = test_support::sqlite();
    let token = create_token(&db.url, "k8s", "k8s");
    // Cost per workload, as docs/owners.md shows.
    let config = dir.path().join("server.toml");
    std::fs::write(
        &config,
        "[owners]\nworkload = { from = [\"label:k8s_workload\"] }\n",
    )
    .unwrap();
    let server = start_server_with(&db.url, free_port(), Some(&config)).await;
    let mut agent = Proc(
        node_agent(&server, &token, &scenario, dir.path(), &socket)
            .env("KUBECONFIG", &kubeconfig)
            .spawn()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // Churn: the second chat pod is scheduled.
    let chat_2 = pod(
        "chat",
        "vllm-2",
        POD_CHAT_2,
        owner("StatefulSet", "vllm"),
        &[],
        &[("gpuledger.io/team", "chat-serving")],
        ("vllm", CID),
    );
    events
        .send(json!({ "type": "ADDED", "object": chat_2 }))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // The API server goes away: the pods last seen keep their owners, marked stale.
    api.abort();
    drop(events);
    // Until a window marked stale has been stored (the watch notices the API server gone on
    // its next try, later on a loaded machine), for at most half a minute; asserted below.
    let stale_stored = || async {
        let metrics = reqwest::get(format!("{}/metrics", server.url)).await.ok()?;
        let text = metrics.text().await.ok()?;
        text.lines()
            .any(|l| {
                l.starts_with("gpuledger_process_windows_owner_unknown_total")
                    && l.contains("cause=\"kube_api_stale\"")
            })
            .then_some(())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    while stale_stored().await.is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(agent.terminate(Duration::from_secs(15)).success());

    assert!(
        cluster
            .selectors
            .lock()
            .unwrap()
            .iter()
            .all(|s| s == "spec.nodeName=gpu-node-1"),
        "one watch scoped to the node"
    );
    let store = db.open().await;
    let mut procs = gpuledger_server::store::telemetry::process_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    procs.sort_by_key(|p| p.start_ms);
    let labels_of = |pid: u32| -> Vec<Value> {
        procs
            .iter()
            .filter(|p| p.pid == i64::from(pid))
            .map(|p| serde_json::from_str(&p.labels_json).unwrap())
            .collect()
    };
    let search = labels_of(pids["search"]);
    let first = &search[0];
    assert_eq!(first["k8s_pod"], "ranker-6d8f9c7b5-x2x4q");
    assert_eq!(first["k8s_container"], "model");
    assert_eq!(first["k8s_workload_kind"], "Deployment");
    assert_eq!(first["k8s_workload"], "ranker");
    assert_eq!(first["k8s_label.app.kubernetes.io/name"], "ranker");
    assert_eq!(
        first["model"], "llama-70b",
        "the annotation declares the model"
    );
    assert!(first.get("k8s_label.pod-template-hash").is_none());
    let vision = &labels_of(pids["vision"])[0];
    assert_eq!(vision["k8s_workload_kind"], "CronJob");
    assert_eq!(vision["k8s_workload"], "nightly-train");
    // The time-sliced GPU: each process's own pod, by the UID in its cgroup.
    assert_eq!(labels_of(pids["chat-1"])[0]["k8s_pod"], "vllm-1");
    let chat_2 = labels_of(pids["chat-2"]);
    assert!(
        chat_2.first().unwrap().get("k8s_pod").is_none(),
        "before it was scheduled, the kubelet's shared GPU names no pod"
    );
    let last = chat_2.last().unwrap();
    assert_eq!(last["k8s_pod"], "vllm-2", "{chat_2:?}");
    assert_eq!(last["team"], "chat-serving");
    assert_eq!(last["k8s_workload_kind"], "StatefulSet");

    // Every window after the API server left still names the pods; the metrics say stale.
    assert_eq!(search.last().unwrap()["k8s_pod"], "ranker-6d8f9c7b5-x2x4q");
    let metrics = reqwest::get(format!("{}/metrics", server.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("gpuledger_process_windows_owner_unknown_total")
                && l.contains("cause=\"kube_api_stale\"")
        ),
        "{metrics}"
    );

    // Cost per workload in the API: each workload's row, its GPU-hours and utilization.
    // The roll-up reads owners with the server's config, as `serve` does.
    server_run(&db.url, &["rollup", "--config", config.to_str().unwrap()]);
    let viewer = signed_in(&server, "viewer").await;
    let q = around_now();
    let (body, rows) = allocation_rows(&viewer, &server, &format!("{q}&by=workload")).await;
    for workload in ["ranker", "nightly-train", "vllm"] {
        let row = rows
            .get(workload)
            .unwrap_or_else(|| panic!("{workload}: {body}"));
        assert!(row["gpu_hours"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["avg_util"].as_f64().is_some(), "{row}");
    }
}
