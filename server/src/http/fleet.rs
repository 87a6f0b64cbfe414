//! The fleet page at `/`: clusters → hosts → GPUs (and MIG instances) with what each is doing
//! now (busy, held idle, idle, by the cluster's thresholds), utilization, memory, the processes
//! that hold them with owner labels, and what they cost per hour (the latest billed hour, else
//! the rate card), totalled per host, cluster and fleet with the part that is idle.

use std::collections::{BTreeMap, HashMap};

use rust_decimal::Decimal;

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use utoipa_axum::router::OpenApiRouter;

use super::page::{self, Chrome};
use super::session::TeamScoped;
use super::AppState;
use crate::billing::current_price::{self, GpuPrice};
use crate::clock::now_ms;
use crate::format::{ago, bytes_gib, money, money_sums, percent};

use crate::store::telemetry::FleetProcess;
use crate::store::telemetry::FleetRow;
use gpuledger_core::activity::{Activity, Thresholds};
use gpuledger_core::idle::IdleConfig;
use gpuledger_core::telemetry::{AttributionWindow, Fault};

/// A host that has not reported for this long is shown as stale.
const STALE_AFTER_MS: i64 = 5 * 60 * 1000;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().route("/", get(fleet_page))
}

pub struct ProcessView {
    pub pid: i64,
    pub name: String,
    pub memory: String,
    pub sm_util: String,
    pub labels: Vec<(String, String)>,
    /// The Unix account running it, where the agent reported one.
    pub user: Option<String>,
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
    /// What it is doing now; a MIG-mode GPU what its instances do.
    pub activity: Activity,
    /// A physical GPU's cost per hour; empty for MIG instances (their GPU carries it).
    pub per_hour: String,
    /// What went wrong with it, in words, where its latest window says.
    pub fault: Option<String>,
    /// Memory held by processes the agent cannot see, and why, where there is any.
    pub unseen: Option<String>,
    /// When its latest window ended: a MIG device's state counts for its GPU while it is as
    /// fresh as the GPU's.
    pub last_window_end_ms: Option<i64>,
}

pub struct HostView {
    pub hostname: String,
    pub instance_type: String,
    pub last_report: String,
    pub stale: bool,
    pub spool_depth: Option<i64>,
    pub gpus: Vec<GpuView>,
    /// The host's GPUs per hour, "—" when neither the bill nor the rate card prices it.
    pub per_hour: String,
    /// Priced from the rate card: no bill line for the host in the last hours.
    pub estimated: bool,
}

pub struct ClusterView {
    pub name: String,
    pub gpu_count: usize,
    pub busy_gpus: usize,
    pub hosts: Vec<HostView>,
    pub per_hour: String,
    /// What its idle and held-idle GPUs cost per hour.
    pub idle_per_hour: String,
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
    pub per_hour: String,
    pub idle_per_hour: String,
    /// Hosts reporting that neither the bill nor the rate card prices.
    pub unpriced_hosts: usize,
}

fn process_view(p: &FleetProcess) -> ProcessView {
    let labels: BTreeMap<String, String> = serde_json::from_str(&p.labels_json).unwrap_or_default();
    ProcessView {
        pid: p.pid,
        name: p.process_name.clone().unwrap_or_else(|| "?".into()),
        memory: p.memory_used_max_bytes.map_or("—".into(), bytes_gib),
        sm_util: percent(p.sm_util_avg),
        user: p.user_name.clone(),
        labels: labels.into_iter().collect(),
    }
}

impl GpuView {
    pub fn state(&self) -> &'static str {
        self.activity.as_str()
    }
    /// The state's CSS class: `busy`, `held`, `idle`, `nodata`.
    pub fn state_class(&self) -> &'static str {
        match self.activity {
            Activity::Busy | Activity::Present => "busy",
            Activity::HeldIdle => "held",
            Activity::Idle => "idle",
            Activity::Unknown => "nodata",
        }
    }
}

/// A MIG-mode GPU does what its instances do: busy if one is (or in use where nothing measures
/// it), else held idle if one is held.
fn combined(states: impl IntoIterator<Item = Activity>) -> Activity {
    let all: Vec<Activity> = states.into_iter().collect();
    [
        Activity::Busy,
        Activity::Present,
        Activity::HeldIdle,
        Activity::Idle,
    ]
    .into_iter()
    .find(|s| all.contains(s))
    .unwrap_or(Activity::Unknown)
}

/// `9.0 GiB held by processes the agent cannot see (it runs in its own PID namespace)`.
fn unseen_text(bytes: i64, cause: Option<&str>) -> String {
    let why = match cause {
        Some("pid_namespace") => " (the agent runs in its own PID namespace: give it the host's)",
        Some("no_permission") => " (NVML refused to list them: run the agent as root)",
        _ => "",
    };
    format!(
        "{} held by processes the agent cannot see{why}",
        bytes_gib(bytes)
    )
}

fn per_hour_text(amount: Option<Decimal>, currency: &str) -> String {
    amount.map_or_else(|| "—".into(), |a| format!("{}/h", money(a, currency)))
}

/// Per hour in each currency the hosts are billed in, never added across.
type PerHour = BTreeMap<String, Decimal>;

fn sums_text(sums: &PerHour) -> String {
    format!("{}/h", money_sums(sums))
}

fn add(sums: &mut PerHour, currency: &str, amount: Decimal) {
    *sums.entry(currency.to_owned()).or_default() += amount;
}

/// A GPU (or MIG device) of the fleet's latest windows, with the processes on it: its state as
/// the one definition of busy reads its latest window (its processes, the memory of those the
/// agent cannot see, its fault) under its cluster's thresholds.
fn gpu_view(row: FleetRow, mine: Vec<&FleetProcess>, thresholds: Thresholds) -> GpuView {
    let latest = AttributionWindow {
        util_avg: row.last_util_avg,
        unseen_memory_bytes: row.last_unseen_memory_bytes,
        unseen_cause: row.last_unseen_cause.clone(),
        fault: row.last_fault_code.clone().map(|code| Fault {
            code,
            detail: row.last_fault_detail.clone().unwrap_or_default(),
        }),
        ..Default::default()
    };
    let state = thresholds.of_window_with(
        &latest,
        mine.iter()
            .map(|p| (p.memory_used_max_bytes, p.sm_util_avg)),
    );
    let memory = match (row.last_memory_used_bytes, row.memory_total_bytes) {
        (Some(u), Some(t)) => format!("{} / {}", bytes_gib(u), bytes_gib(t)),
        (None, Some(t)) => format!("? / {}", bytes_gib(t)),
        _ => "—".into(),
    };
    GpuView {
        index: row.gpu_index.unwrap_or(0),
        processes: mine.into_iter().map(process_view).collect(),
        name: row.name.unwrap_or_default(),
        is_mig: row.parent_uuid.is_some(),
        util: percent(row.last_util_avg),
        util_bar: row.last_util_avg.unwrap_or(0.0).clamp(0.0, 100.0),
        memory,
        uuid: row.uuid.unwrap_or_default(),
        activity: state,
        per_hour: String::new(),
        fault: latest.fault.map(|f| f.detail),
        unseen: latest
            .unseen_memory_bytes
            .map(|b| unseen_text(b, latest.unseen_cause.as_deref())),
        last_window_end_ms: row.last_window_end_ms,
    }
}

/// A host complete: physical GPUs first, each followed by its MIG instances; a MIG-mode GPU's
/// state from its instances; each GPU's price, counted as busy (`busy`) or idle (`idle`, the
/// cluster's and the fleet's sums per hour). The host's cost per hour, where it is priced.
fn finish_host(
    host: &mut HostView,
    price: Option<&GpuPrice>,
    busy: &mut usize,
    (cluster_idle, fleet_idle): (&mut PerHour, &mut PerHour),
) -> Decimal {
    host.gpus
        .sort_by(|a, b| (a.index, a.is_mig, &a.uuid).cmp(&(b.index, b.is_mig, &b.uuid)));
    let mut host_cost = Decimal::ZERO;
    let physical: Vec<usize> = (0..host.gpus.len())
        .filter(|i| !host.gpus[*i].is_mig)
        .collect();
    for i in physical {
        let (index, gpu_end) = (host.gpus[i].index, host.gpus[i].last_window_end_ms);
        // Its MIG devices as fresh as it is: a GPU lost since keeps no device's old state.
        let instances: Vec<Activity> = host
            .gpus
            .iter()
            .filter(|g| g.is_mig && g.index == index && g.last_window_end_ms >= gpu_end)
            .map(|g| g.activity)
            .collect();
        let state = if instances.is_empty() {
            host.gpus[i].activity
        } else {
            combined(instances)
        };
        let gpu = &mut host.gpus[i];
        gpu.activity = state;
        if state.in_use() {
            *busy += 1;
        }
        if let Some(p) = price {
            gpu.per_hour = per_hour_text(Some(p.per_gpu_hour), &p.currency);
            host_cost += p.per_gpu_hour;
            if matches!(state, Activity::Idle | Activity::HeldIdle) {
                add(cluster_idle, &p.currency, p.per_gpu_hour);
                add(fleet_idle, &p.currency, p.per_gpu_hour);
            }
        }
    }
    host_cost
}

/// Groups flat rows (ordered by cluster, host) into the page's tree; `prices` per
/// (cluster, hostname).
pub fn build(
    rows: Vec<FleetRow>,
    processes: Vec<FleetProcess>,
    now: i64,
    prices: &HashMap<(String, String), GpuPrice>,
    idle: &IdleConfig,
) -> FleetPage {
    let mut procs: HashMap<String, Vec<&FleetProcess>> = HashMap::new();
    for p in &processes {
        procs.entry(p.gpu_uuid.clone()).or_default().push(p);
    }
    let mut clusters: Vec<ClusterView> = Vec::new();
    let mut total_gpus = 0;
    let mut total_hosts = 0;
    let (mut fleet_cost, mut fleet_idle) = (PerHour::new(), PerHour::new());
    let mut unpriced_hosts = 0;
    // Per cluster being built: its cost and idle cost per hour.
    let (mut cluster_cost, mut cluster_idle) = (PerHour::new(), PerHour::new());
    let mut rows = rows.into_iter().peekable();
    while let Some(row) = rows.next() {
        if clusters.last().is_none_or(|c| c.name != row.cluster) {
            clusters.push(ClusterView {
                name: row.cluster.clone(),
                gpu_count: 0,
                busy_gpus: 0,
                hosts: Vec::new(),
                per_hour: String::new(),
                idle_per_hour: String::new(),
            });
            (cluster_cost, cluster_idle) = (PerHour::new(), PerHour::new());
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
            let price = prices.get(&(row.cluster.clone(), row.hostname.clone()));
            cluster.hosts.push(HostView {
                hostname: row.hostname.clone(),
                instance_type: row.instance_type.clone().unwrap_or_default(),
                last_report: ago(now - row.last_report_ms),
                stale: now - row.last_report_ms > STALE_AFTER_MS,
                spool_depth: row.spool_depth.filter(|d| *d > 0),
                gpus: Vec::new(),
                per_hour: String::new(),
                estimated: price.is_some_and(|p| p.estimated),
            });
        }
        let last_of_host = rows
            .peek()
            .is_none_or(|n| n.cluster != row.cluster || n.hostname != row.hostname);
        let Some(host) = cluster.hosts.last_mut() else {
            continue;
        };
        if let Some(uuid) = row.uuid.clone() {
            let mine = procs.remove(&uuid).unwrap_or_default();
            let gpu = gpu_view(row, mine, idle.thresholds(&cluster.name));
            if !gpu.is_mig {
                cluster.gpu_count += 1;
                total_gpus += 1;
            }
            host.gpus.push(gpu);
        }
        if !last_of_host {
            continue;
        }
        let price = prices.get(&(cluster.name.clone(), host.hostname.clone()));
        let idle_sums = (&mut cluster_idle, &mut fleet_idle);
        let host_cost = finish_host(host, price, &mut cluster.busy_gpus, idle_sums);
        if price.is_none() {
            unpriced_hosts += 1;
        }
        if let Some(p) = price {
            host.per_hour = per_hour_text(Some(host_cost), &p.currency);
            add(&mut cluster_cost, &p.currency, host_cost);
            add(&mut fleet_cost, &p.currency, host_cost);
        } else {
            host.per_hour = per_hour_text(None, "");
        }
        cluster.per_hour = sums_text(&cluster_cost);
        cluster.idle_per_hour = sums_text(&cluster_idle);
    }
    FleetPage {
        chrome: None,
        refused: Vec::new(),
        clusters,
        total_hosts,
        total_gpus,
        per_hour: sums_text(&fleet_cost),
        idle_per_hour: sums_text(&fleet_idle),
        unpriced_hosts,
    }
}

/// `GET /`: the fleet as it stands. A team-scoped reader sees the hosts that are its teams' and
/// its teams' processes on them ([`crate::fleet::within_scope`]), and no refused reports.
async fn fleet_page(State(state): State<AppState>, TeamScoped(user): TeamScoped) -> Response {
    let loaded = async {
        let rows = crate::fleet::gpus(user.reads.store()).await?;
        let processes = crate::fleet::processes(user.reads.store()).await?;
        let (rows, processes) = crate::fleet::within_scope(
            user.reads.store(),
            (rows, processes),
            (&user.scope, &state.config.owners),
            now_ms(),
        )
        .await?;
        let hosts = crate::fleet::hosts(user.reads.store()).await?;
        let ids: HashMap<(&str, &str), i64> = hosts
            .iter()
            .map(|h| ((h.cluster.as_str(), h.hostname.as_str()), h.id))
            .collect();
        let mut names: HashMap<i64, Vec<String>> = HashMap::new();
        for r in rows
            .iter()
            .filter(|r| r.uuid.is_some() && r.parent_uuid.is_none())
        {
            if let Some(id) = ids.get(&(r.cluster.as_str(), r.hostname.as_str())) {
                names
                    .entry(*id)
                    .or_default()
                    .push(r.name.clone().unwrap_or_default());
            }
        }
        let by_id = current_price::gpu_prices(
            user.reads.store(),
            &hosts,
            &names,
            &state.rate_card,
            now_ms(),
        )
        .await?;
        let prices: HashMap<(String, String), GpuPrice> = hosts
            .iter()
            .filter_map(|h| {
                Some((
                    (h.cluster.clone(), h.hostname.clone()),
                    by_id.get(&h.id)?.clone(),
                ))
            })
            .collect();
        // Which agent tokens were refused is the fleet's business, not a team's.
        let refused = if user.scope.is_all() {
            crate::fleet::refusals(user.reads.store(), now_ms() - REFUSED_SHOWN_MS).await?
        } else {
            Vec::new()
        };
        Ok::<_, crate::store::StoreError>((rows, processes, refused, prices))
    }
    .await;
    match loaded {
        Ok((rows, processes, refused, prices)) => {
            let now = now_ms();
            let mut page = build(rows, processes, now, &prices, &state.config.idle);
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
