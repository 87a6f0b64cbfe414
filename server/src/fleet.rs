//! The fleet as it stands: each GPU's latest state, the processes on it, the hosts, and the
//! reports refused lately (what the fleet page and the review's heatmap labels read).

use crate::store::{self, FleetProcess, FleetRow, HostRow, RefusalRow, Store, StoreError};

/// Each GPU's latest window, by host.
pub async fn gpus(store: &dyn Store) -> Result<Vec<FleetRow>, StoreError> {
    store::telemetry::fleet(store.db()).await
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
