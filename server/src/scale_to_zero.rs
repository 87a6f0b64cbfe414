//! Scale-to-zero windows of a range, from the hourly ledger summed by the database per owner
//! and hour: the inference endpoints and the experiments (notebooks, dev jobs) that hold GPUs
//! idle in the same hours every week. The rules are the core's
//! ([`gpuledger_core::scale_to_zero`]).

use serde::{Deserialize, Serialize};

use gpuledger_core::scale_to_zero::*;

use crate::store::{self, Store, StoreError};
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;
use gpuledger_core::scope::Scope;

/// A candidate with the owner dimension it is a value of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OwnerWindows {
    /// The owner dimension: the endpoint's or the experiment's.
    pub dimension: String,
    #[serde(flatten)]
    pub candidate: Candidate,
}

/// The endpoints' and experiments' windows in `[from_ms, to_ms)` as `scope` sees them (a
/// team's reader, its teams' owners' hours only), largest saving first.
pub async fn for_range(
    store: &dyn Store,
    schema: &OwnerSchema,
    scope: &Scope,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<OwnerWindows>, StoreError> {
    let team = match GroupBy::role(schema, Role::Team) {
        Some(GroupBy::Owner(team)) => Some(team),
        _ => None,
    };
    let mut found = Vec::new();
    for role in [Role::Endpoint, Role::Experiment] {
        let Some(GroupBy::Owner(dimension)) = GroupBy::role(schema, role) else {
            continue;
        };
        // Without a team dimension no owner is any team's: a scoped reader sees none.
        if team.is_none() && !scope.is_all() {
            continue;
        }
        let rows = store::ledger::owner_hours(
            store.db(),
            from_ms,
            to_ms,
            dimension,
            team.unwrap_or(dimension),
        )
        .await?;
        let hours: Vec<OwnerHour> = rows
            .into_iter()
            .filter(|(t, _)| scope.is_all() || t.as_deref().is_some_and(|t| scope.admits_team(t)))
            .map(|(_, hour)| hour)
            .collect();
        found.extend(find(&hours).into_iter().map(|candidate| OwnerWindows {
            dimension: dimension.to_owned(),
            candidate,
        }));
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.candidate.saving + f.candidate.frees_commitment));
    Ok(found)
}
