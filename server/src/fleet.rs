//! The fleet as it stands: each GPU's latest state, the processes on it, the hosts, and the
//! reports refused lately (what the fleet page and the review's heatmap labels read).

use crate::store::telemetry::FleetProcess;
use crate::store::telemetry::FleetRow;
use crate::store::tokens::RefusalRow;
use crate::store::{self, Store, StoreError};
use gpuledger_core::scope::host_key;
use gpuledger_core::telemetry::HostRow;

/// Each GPU's latest window, by host.
pub async fn gpus(store: &dyn Store) -> Result<Vec<FleetRow>, StoreError> {
    store::telemetry::fleet(store.db()).await
}

/// How each of these GPUs is named on its host (`#3`, a MIG device's `#3 MIG`), by UUID; a GPU
/// not known is left out.
pub async fn gpu_labels(
    store: &dyn Store,
    uuids: &[String],
) -> Result<std::collections::HashMap<String, String>, StoreError> {
    Ok(store::telemetry::gpu_places(store.db(), uuids)
        .await?
        .into_iter()
        .map(|(uuid, index, parent)| {
            let label = gpuledger_core::telemetry::gpu_label(index, &uuid, parent.is_some());
            (uuid, label)
        })
        .collect())
}

/// The processes of each GPU's latest window.
pub async fn processes(store: &dyn Store) -> Result<Vec<FleetProcess>, StoreError> {
    store::telemetry::fleet_processes(store.db()).await
}

/// Every host an agent has reported (not those known from the bill alone).
pub async fn hosts(store: &dyn Store) -> Result<Vec<HostRow>, StoreError> {
    let mut hosts = store::telemetry::hosts(store.db()).await?;
    hosts.retain(|h| !h.from_bill);
    Ok(hosts)
}

/// Reports refused since `since_ms`, per token, host and reason, latest first.
pub async fn refusals(store: &dyn Store, since_ms: i64) -> Result<Vec<RefusalRow>, StoreError> {
    store::tokens::ingest_refusals(store.db(), since_ms).await
}

/// How far back the ledger says which hosts are a team's, for its fleet page.
pub const HELD_LOOKBACK_MS: i64 = 7 * gpuledger_core::time::DAY_MS;

/// The fleet as a team-scoped reader sees it: the hosts wholly its teams' over the last week of
/// the ledger ([`gpuledger_core::scope::Scope::held_keys`]), with its teams' processes alone on
/// them. Everything for every team.
pub async fn within_scope(
    store: &dyn Store,
    (rows, processes): (Vec<FleetRow>, Vec<FleetProcess>),
    (scope, schema): (
        &gpuledger_core::scope::Scope,
        &gpuledger_core::owners::OwnerSchema,
    ),
    now_ms: i64,
) -> Result<(Vec<FleetRow>, Vec<FleetProcess>), StoreError> {
    if scope.is_all() {
        return Ok((rows, processes));
    }
    let week = crate::ledger::load(
        store,
        now_ms - HELD_LOOKBACK_MS,
        now_ms,
        store::RollupGrain::HostRange,
    )
    .await?;
    let held = scope.held_hosts(&week, schema).unwrap_or_default();
    let rows: Vec<FleetRow> = rows
        .into_iter()
        .filter(|r| held.contains(&host_key(&r.cluster, &r.hostname)))
        .collect();
    let cluster_of: std::collections::HashMap<&str, &str> = rows
        .iter()
        .filter_map(|r| Some((r.uuid.as_deref()?, r.cluster.as_str())))
        .collect();
    let with_processes: std::collections::HashSet<&str> =
        processes.iter().map(|p| p.gpu_uuid.as_str()).collect();
    let processes: Vec<FleetProcess> = processes
        .iter()
        .filter(|p| {
            let Some(cluster) = cluster_of.get(p.gpu_uuid.as_str()) else {
                return false;
            };
            let labels: std::collections::BTreeMap<String, String> =
                serde_json::from_str(&p.labels_json).unwrap_or_default();
            scope.admits(&schema.owner_of(&labels, cluster), schema)
        })
        .cloned()
        .collect();
    // Of those hosts, the GPUs that are the teams' now: running one of their processes, or
    // running none on a cluster that is theirs. A GPU idle with no process on a cluster no
    // team owns is the whole fleet's idle, as the ledger has it (`idle_history::in_scope`),
    // even where one of the teams used it last week.
    let ours: std::collections::HashSet<&str> =
        processes.iter().map(|p| p.gpu_uuid.as_str()).collect();
    let no_labels = std::collections::BTreeMap::new();
    let is_ours = |r: &FleetRow| match r.uuid.as_deref() {
        None => true,
        Some(g) if with_processes.contains(g) => ours.contains(g),
        Some(_) => scope.admits(&schema.owner_of(&no_labels, &r.cluster), schema),
    };
    // A MIG instance of theirs keeps its physical GPU on the page.
    let parents: std::collections::HashSet<&str> = rows
        .iter()
        .filter(|r| is_ours(r))
        .filter_map(|r| r.parent_uuid.as_deref())
        .collect();
    let rows: Vec<FleetRow> = rows
        .iter()
        .filter(|r| is_ours(r) || r.uuid.as_deref().is_some_and(|g| parents.contains(g)))
        .cloned()
        .collect();
    Ok((rows, processes))
}
