//! Scale-to-zero windows of a range, from the hourly ledger: the inference endpoints and the
//! experiments (notebooks, dev jobs) that hold GPUs idle in the same hours every week. The rules
//! are the core's ([`gpuledger_core::scale_to_zero`]).

use serde::Serialize;

pub use gpuledger_core::scale_to_zero::*;

use crate::allocation::GroupBy;
use crate::config::OwnerSchema;
use crate::ledger;
use crate::session::Scope;
use crate::store::{RollupGrain, Store, StoreError};
use gpuledger_core::owners::Role;

/// A candidate with the owner dimension it is a value of.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
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
    let mut found = Vec::new();
    for role in [Role::Endpoint, Role::Experiment] {
        let Some(GroupBy::Owner(dimension)) = GroupBy::role(schema, role) else {
            continue;
        };
        let hours = ledger::load(store, from_ms, to_ms, RollupGrain::OwnerHour(dimension)).await?;
        let hours = scope.restrict(hours, schema);
        found.extend(
            find(&OwnerHour::of_parts(&hours.parts, dimension))
                .into_iter()
                .map(|candidate| OwnerWindows {
                    dimension: dimension.to_owned(),
                    candidate,
                }),
        );
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.candidate.saving));
    Ok(found)
}
