//! Kubernetes pods' own facts, from the API server: a process's pod (by the UID in its cgroup)
//! gives its namespace, name, container (by the container id in its cgroup), the labels and
//! annotations named in config, and the workload behind it, following ownerReferences up
//! (ReplicaSet to Deployment, Job to CronJob, StatefulSet, DaemonSet, …).
//!
//! One watch of the pods scheduled on this node (field selector `spec.nodeName`), on a task of
//! its own; sampling reads what it has and never waits. With the API server away, the pods last
//! seen keep their owners, marked stale (`kube_api_stale`), and the cause is logged once.
//! Annotations `gpuledger.io/model`, `…/experiment`, `…/endpoint` and `…/team` declare owners as
//! the `GPULEDGER_*` variables do (a variable in the process's environment still wins).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;

/// Which of a pod's labels and annotations become process labels (`k8s_label.KEY`,
/// `k8s_annotation.KEY`).
#[derive(Debug, Clone, Default)]
pub struct KubeApiConfig {
    pub node: String,
    pub labels: Vec<String>,
    pub annotations: Vec<String>,
}

/// What a process in a pod carries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    /// Container id (as in the cgroup, no runtime prefix) to container name.
    pub containers: HashMap<String, String>,
    pub labels: Vec<(String, String)>,
    /// (kind, name) of the workload behind the pod.
    pub workload: Option<(String, String)>,
}

impl PodFacts {
    /// The process labels, for a process in container `container_id`.
    pub fn process_labels(&self, container_id: Option<&str>) -> Vec<(String, String)> {
        let mut out = vec![
            ("k8s_namespace".to_owned(), self.namespace.clone()),
            ("k8s_pod".to_owned(), self.name.clone()),
        ];
        if let Some(name) = container_id.and_then(|id| self.containers.get(id)) {
            out.push(("k8s_container".into(), name.clone()));
        }
        if let Some((kind, name)) = &self.workload {
            out.push(("k8s_workload_kind".into(), kind.clone()));
            out.push(("k8s_workload".into(), name.clone()));
        }
        out.extend(self.labels.iter().cloned());
        out
    }
}

/// The facts of a pod object (its workload found separately).
pub fn facts_of(pod: &Pod, config: &KubeApiConfig) -> PodFacts {
    let meta = &pod.metadata;
    let mut labels = Vec::new();
    let (pod_labels, annotations) = (meta.labels.as_ref(), meta.annotations.as_ref());
    for key in &config.labels {
        if let Some(v) = pod_labels
            .and_then(|l| l.get(key))
            .filter(|v| !v.is_empty())
        {
            labels.push((format!("k8s_label.{key}"), v.clone()));
        }
    }
    for key in &config.annotations {
        if let Some(v) = annotations
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
        {
            labels.push((format!("k8s_annotation.{key}"), v.clone()));
        }
    }
    for role in gpuledger_proto::OWNER_KEYS {
        if let Some(v) = annotations
            .and_then(|a| a.get(&format!("gpuledger.io/{role}")))
            .filter(|v| !v.is_empty())
        {
            labels.push(((*role).to_owned(), v.clone()));
        }
    }
    let mut containers = HashMap::new();
    let status = pod.status.as_ref();
    let statuses = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .chain(status.and_then(|s| s.init_container_statuses.as_ref()))
        .flatten();
    for c in statuses {
        // `containerd://<id>`, `cri-o://<id>`, `docker://<id>`.
        if let Some(id) = c
            .container_id
            .as_deref()
            .and_then(|id| id.rsplit("://").next())
        {
            containers.insert(id.to_owned(), c.name.clone());
        }
    }
    PodFacts {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        containers,
        labels,
        workload: None,
    }
}

fn controller(refs: Option<&Vec<OwnerReference>>) -> Option<&OwnerReference> {
    refs?.iter().find(|r| r.controller == Some(true))
}

/// The workload behind a pod: its controller, and that controller's controller for a
/// ReplicaSet (a Deployment's) or a Job (a CronJob's). A controller that cannot be read (no
/// RBAC for it, gone) is the workload itself.
async fn workload_of(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
    cache: &mut HashMap<(String, String, String), (String, String)>,
) -> Option<(String, String)> {
    let owner = controller(pod.metadata.owner_references.as_ref())?;
    let key = (namespace.to_owned(), owner.kind.clone(), owner.name.clone());
    if let Some(found) = cache.get(&key) {
        return Some(found.clone());
    }
    let direct = (owner.kind.clone(), owner.name.clone());
    let up = match owner.kind.as_str() {
        "ReplicaSet" => Api::<ReplicaSet>::namespaced(client.clone(), namespace)
            .get_opt(&owner.name)
            .await
            .ok()
            .flatten()
            .and_then(|rs| {
                controller(rs.metadata.owner_references.as_ref())
                    .map(|o| (o.kind.clone(), o.name.clone()))
            }),
        "Job" => Api::<Job>::namespaced(client.clone(), namespace)
            .get_opt(&owner.name)
            .await
            .ok()
            .flatten()
            .and_then(|job| {
                controller(job.metadata.owner_references.as_ref())
                    .map(|o| (o.kind.clone(), o.name.clone()))
            }),
        _ => None,
    };
    let found = up.unwrap_or(direct);
    cache.insert(key, found.clone());
    Some(found)
}

#[derive(Default)]
struct State {
    pods: HashMap<String, PodFacts>,
    /// The watch has listed the node's pods at least once.
    listed: bool,
    /// Why the watch is down, while it is.
    failing: Option<String>,
    /// Pods listed since the last restart of the watch (to drop the ones gone meanwhile).
    relisting: Option<HashSet<String>>,
}

/// The pods on this node as the API server last said.
#[derive(Clone, Default)]
pub struct PodDirectory {
    state: Arc<Mutex<State>>,
}

impl PodDirectory {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod with this UID, with the cause when it is unknown or stale.
    pub fn of(&self, uid: &str) -> (Option<PodFacts>, Option<&'static str>) {
        let s = self.lock();
        let found = s.pods.get(uid).cloned();
        let cause = match (&found, &s.failing, s.listed) {
            (Some(_), Some(_), _) => Some("kube_api_stale"),
            (Some(_), None, _) => None,
            (None, Some(_), _) => Some("kube_api_error"),
            // Listed, and yet not there: a pod newer than the watch's last event.
            (None, None, true) => Some("kube_pod_unknown"),
            (None, None, false) => None,
        };
        (found, cause)
    }

    fn put(&self, uid: String, facts: PodFacts) {
        let mut s = self.lock();
        if let Some(seen) = s.relisting.as_mut() {
            seen.insert(uid.clone());
        }
        s.pods.insert(uid, facts);
    }

    /// Watches the node's pods for as long as the agent runs; restarts with backoff.
    pub async fn watch(self, client: kube::Client, config: KubeApiConfig) {
        let pods: Api<Pod> = Api::all(client.clone());
        let selector = format!("spec.nodeName={}", config.node);
        let mut events = watcher::watcher(pods, watcher::Config::default().fields(&selector))
            .default_backoff()
            .boxed();
        let mut workloads = HashMap::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => self.lock().relisting = Some(HashSet::new()),
                Ok(Event::InitApply(pod)) | Ok(Event::Apply(pod)) => {
                    let Some(uid) = pod.metadata.uid.clone() else {
                        continue;
                    };
                    let mut facts = facts_of(&pod, &config);
                    facts.workload =
                        workload_of(&client, &facts.namespace, &pod, &mut workloads).await;
                    self.put(uid, facts);
                    self.answered();
                }
                Ok(Event::Delete(pod)) => {
                    if let Some(uid) = pod.metadata.uid {
                        self.lock().pods.remove(&uid);
                    }
                }
                Ok(Event::InitDone) => {
                    let mut s = self.lock();
                    if let Some(seen) = s.relisting.take() {
                        s.pods.retain(|uid, _| seen.contains(uid));
                    }
                    s.listed = true;
                    drop(s);
                    self.answered();
                }
                Err(e) => {
                    let mut s = self.lock();
                    if s.failing.is_none() {
                        tracing::warn!(error = %e, "pods' labels and workloads stale until the API server answers (said once)");
                    }
                    s.failing = Some(e.to_string());
                }
            }
        }
    }

    /// Waits up to `timeout` for the first listing (or a failure), so a first window names its
    /// pods.
    pub async fn settle(&self, timeout: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            {
                let s = self.lock();
                if s.listed || s.failing.is_some() {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    fn answered(&self) {
        if self.lock().failing.take().is_some() {
            tracing::info!("the API server answers again");
        }
    }
}

/// Starts watching the node's pods where a cluster is configured (in a pod, the service
/// account; else `KUBECONFIG` or `~/.kube/config`); `None` where none is.
pub async fn start(config: KubeApiConfig) -> Option<PodDirectory> {
    let client = match kube::Config::infer().await {
        Ok(c) => match kube::Client::try_from(c) {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the Kubernetes API; pods' labels unknown");
                return None;
            }
        },
        Err(_) => return None,
    };
    let directory = PodDirectory::default();
    tokio::spawn(directory.clone().watch(client, config));
    directory.settle(std::time::Duration::from_secs(10)).await;
    Some(directory)
}

/// Adds the facts of the pod `uid` (container `container_id`) to `labels`; the cause, when
/// it is unknown or stale. A label already there stays.
pub fn add_pod_facts(
    directory: &PodDirectory,
    uid: &str,
    container_id: Option<&str>,
    labels: &mut BTreeMap<String, String>,
) -> (bool, Option<&'static str>) {
    let (found, cause) = directory.of(uid);
    if let Some(facts) = &found {
        for (key, value) in facts.process_labels(container_id) {
            labels.entry(key).or_insert(value);
        }
    }
    (found.is_some(), cause)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_facts_name_its_containers_chosen_labels_and_declared_owners() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "ranker-6d8f9c7b5-x2x4q", "namespace": "search", "uid": "u-1",
                "labels": { "app.kubernetes.io/name": "ranker", "pod-template-hash": "6d8f9c7b5" },
                "annotations": { "gpuledger.io/model": "llama-70b", "gpuledger.io/other": "x",
                                 "kubectl.kubernetes.io/last-applied-configuration": "{…}" }
            },
            "status": { "containerStatuses": [
                { "name": "model", "containerID": "containerd://abc123", "image": "i", "imageID": "",
                  "ready": true, "restartCount": 0 }
            ]}
        }))
        .unwrap();
        let config = KubeApiConfig {
            node: "n".into(),
            labels: vec!["app.kubernetes.io/name".into(), "missing".into()],
            annotations: vec![],
        };
        let facts = facts_of(&pod, &config);
        let labels: BTreeMap<String, String> =
            facts.process_labels(Some("abc123")).into_iter().collect();
        assert_eq!(labels["k8s_namespace"], "search");
        assert_eq!(labels["k8s_container"], "model");
        assert_eq!(labels["k8s_label.app.kubernetes.io/name"], "ranker");
        assert_eq!(labels["model"], "llama-70b");
        assert!(
            !labels.contains_key("k8s_label.pod-template-hash"),
            "only the chosen"
        );
        assert!(!labels.keys().any(|k| k.contains("last-applied")));
        assert_eq!(labels.len(), 5);
    }

    #[test]
    fn a_pod_is_stale_unknown_or_missing_with_a_cause_the_server_counts() {
        let directory = PodDirectory::default();
        assert_eq!(
            directory.of("u-1"),
            (None, None),
            "not listed yet: nothing to say"
        );
        directory.put("u-1".into(), PodFacts::default());
        directory.lock().listed = true;
        assert_eq!(directory.of("u-1").1, None);
        let (_, unknown) = directory.of("u-2");
        directory.lock().failing = Some("connection refused".into());
        let (kept, stale) = directory.of("u-1");
        let (_, down) = directory.of("u-2");
        assert!(
            kept.is_some(),
            "the last facts stay while the API server is away"
        );
        for cause in [unknown, stale, down] {
            let cause = cause.expect("a cause");
            assert!(
                gpuledger_proto::OWNER_UNKNOWN_CAUSES.contains(&cause),
                "{cause}"
            );
        }
    }
}
