//! The fleet page at `/`: clusters → hosts → GPUs (and MIG instances) with their latest
//! utilization, memory and the processes that hold them, with owner labels.

use std::collections::{BTreeMap, HashMap};

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use super::page::{self, Chrome};
use super::AppState;
use crate::format::{ago, bytes_gib, percent};
use crate::now_ms;
use crate::session::SignedIn;
use crate::store::{FleetProcess, FleetRow};

/// A host that has not reported for this long is shown as stale.
const STALE_AFTER_MS: i64 = 5 * 60 * 1000;

pub fn router() -> Router<AppState> {
    Router::new().route("/", get(fleet_page))
}

pub struct ProcessView {
    pub pid: i64,
    pub name: String,
    pub memory: String,
    pub sm_util: String,
    pub labels: Vec<(String, String)>,
}

pub struct GpuView {
    pub index: i64,
    pub uuid: String,
    pub name: String,
    pub is_mig: bool,
    pub util: String,
    /// Bar width in percent; 0 when unknown.
    pub util_bar: f64,
    pub memory: String,
    pub processes: Vec<ProcessView>,
}

pub struct HostView {
    pub hostname: String,
    pub instance_type: String,
    pub last_report: String,
    pub stale: bool,
    pub spool_depth: Option<i64>,
    pub gpus: Vec<GpuView>,
}

pub struct ClusterView {
    pub name: String,
    pub gpu_count: usize,
    pub busy_gpus: usize,
    pub hosts: Vec<HostView>,
}

/// Reports refused for one token, host and reason.
pub struct RefusedView {
    pub token: String,
    pub host: String,
    pub message: String,
    pub attempts: i64,
    pub last: String,
}

/// How far back the page lists refused reports.
const REFUSED_SHOWN_MS: i64 = 7 * 24 * 3_600_000;

#[derive(Template)]
#[template(path = "fleet.html")]
pub struct FleetPage {
    pub chrome: Option<Chrome>,
    pub refused: Vec<RefusedView>,
    pub clusters: Vec<ClusterView>,
    pub total_hosts: usize,
    pub total_gpus: usize,
}

fn process_view(p: &FleetProcess) -> ProcessView {
    let labels: BTreeMap<String, String> = serde_json::from_str(&p.labels_json).unwrap_or_default();
    ProcessView {
        pid: p.pid,
        name: p.process_name.clone().unwrap_or_else(|| "?".into()),
        memory: p.memory_used_max_bytes.map_or("—".into(), bytes_gib),
        sm_util: percent(p.sm_util_avg),
        labels: labels.into_iter().collect(),
    }
}

/// Groups flat rows (ordered by cluster, host) into the page's tree.
pub fn build(rows: Vec<FleetRow>, processes: Vec<FleetProcess>, now: i64) -> FleetPage {
    let mut procs: HashMap<String, Vec<ProcessView>> = HashMap::new();
    for p in &processes {
        procs
            .entry(p.gpu_uuid.clone())
            .or_default()
            .push(process_view(p));
    }
    let mut clusters: Vec<ClusterView> = Vec::new();
    let mut total_gpus = 0;
    let mut total_hosts = 0;
    for row in rows {
        if clusters.last().is_none_or(|c| c.name != row.cluster) {
            clusters.push(ClusterView {
                name: row.cluster.clone(),
                gpu_count: 0,
                busy_gpus: 0,
                hosts: Vec::new(),
            });
        }
        let Some(cluster) = clusters.last_mut() else {
            continue;
        };
        if cluster
            .hosts
            .last()
            .is_none_or(|h| h.hostname != row.hostname)
        {
            total_hosts += 1;
            cluster.hosts.push(HostView {
                hostname: row.hostname.clone(),
                instance_type: row.instance_type.clone().unwrap_or_default(),
                last_report: ago(now - row.last_report_ms),
                stale: now - row.last_report_ms > STALE_AFTER_MS,
                spool_depth: row.spool_depth.filter(|d| *d > 0),
                gpus: Vec::new(),
            });
        }
        let (Some(host), Some(uuid)) = (cluster.hosts.last_mut(), row.uuid) else {
            continue;
        };
        let is_mig = row.parent_uuid.is_some();
        if !is_mig {
            cluster.gpu_count += 1;
            total_gpus += 1;
        }
        if row.last_util_avg.is_some_and(|u| u >= 5.0) && !is_mig {
            cluster.busy_gpus += 1;
        }
        let memory = match (row.last_memory_used_bytes, row.memory_total_bytes) {
            (Some(u), Some(t)) => format!("{} / {}", bytes_gib(u), bytes_gib(t)),
            (None, Some(t)) => format!("? / {}", bytes_gib(t)),
            _ => "—".into(),
        };
        host.gpus.push(GpuView {
            index: row.gpu_index.unwrap_or(0),
            processes: procs.remove(&uuid).unwrap_or_default(),
            name: row.name.unwrap_or_default(),
            is_mig,
            util: percent(row.last_util_avg),
            util_bar: row.last_util_avg.unwrap_or(0.0).clamp(0.0, 100.0),
            memory,
            uuid,
        });
    }
    for c in &mut clusters {
        for h in &mut c.hosts {
            // Physical GPUs first, each followed by its MIG instances.
            h.gpus
                .sort_by(|a, b| (a.index, a.is_mig, &a.uuid).cmp(&(b.index, b.is_mig, &b.uuid)));
        }
    }
    FleetPage {
        chrome: None,
        refused: Vec::new(),
        clusters,
        total_hosts,
        total_gpus,
    }
}

async fn fleet_page(State(state): State<AppState>, user: SignedIn) -> Response {
    let loaded = async {
        let rows = state.store.fleet().await?;
        let processes = state.store.fleet_processes().await?;
        let refused = state
            .store
            .ingest_refusals(now_ms() - REFUSED_SHOWN_MS)
            .await?;
        Ok::<_, crate::store::StoreError>((rows, processes, refused))
    }
    .await;
    match loaded {
        Ok((rows, processes, refused)) => {
            let now = now_ms();
            let mut page = build(rows, processes, now);
            page.refused = refused
                .into_iter()
                .map(|r| RefusedView {
                    token: r.token,
                    host: format!("{}/{}", r.cluster, r.hostname),
                    message: r.message,
                    attempts: r.attempts,
                    last: ago(now - r.last_ms),
                })
                .collect();
            page.chrome = Some(Chrome::from(&user));
            page::render(&page)
        }
        Err(e) => {
            tracing::error!(error = %e, "fleet page: storage failed");
            page::error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable",
                "The fleet cannot be read right now. Try again in a minute.",
            )
        }
    }
}
