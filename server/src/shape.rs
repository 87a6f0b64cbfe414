//! The shape of the work per GPU instance type over a range, from the hourly ledger summed by
//! the database per hour, type and team: the week's heatmap, the always-on floor and the peak.
//! The rules are the core's ([`gpuledger_core::shape`]).

use gpuledger_core::shape::*;

use crate::store::{self, Store, StoreError};
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::hour_floor;

/// Each instance type's shape in `[from_ms, to_ms)`, up to the hour under way at `now_ms` (the
/// hours to come are not 0 GPUs), per team; a team's reader sees its teams' GPU time only.
pub async fn for_range(
    store: &dyn Store,
    schema: &OwnerSchema,
    scope: &Scope,
    (from_ms, to_ms): (i64, i64),
    now_ms: i64,
) -> Result<Vec<TypeShape>, StoreError> {
    let to_ms = to_ms.min(hour_floor(now_ms));
    let team = match GroupBy::role(schema, Role::Team) {
        Some(GroupBy::Owner(team)) => team,
        // No team dimension: the shape per type alone (no owner has a "team" value).
        _ => "team",
    };
    // Experiments doing work could run on spot; without an experiment dimension, nothing is
    // taken for one (a name no dimension is given: dimensions are letters, digits and `_`, and
    // this one is not configured).
    let experiment = match GroupBy::role(schema, Role::Experiment) {
        Some(GroupBy::Owner(experiment)) => experiment,
        _ => "no_experiment_dimension",
    };
    let mut hours =
        store::ledger::gpu_seconds_by_type(store.db(), from_ms, to_ms, (team, experiment)).await?;
    if !scope.is_all() {
        hours.retain(|h| h.owner.as_deref().is_some_and(|t| scope.admits_team(t)));
    }
    Ok(shapes(&hours, from_ms, to_ms))
}
