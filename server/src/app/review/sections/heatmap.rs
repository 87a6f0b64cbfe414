//! Utilization by GPU and day: the month's costliest GPUs for whoever sees every team (kept
//! with the month), a scoped viewer's own GPUs otherwise.

use std::collections::{BTreeSet, HashMap};

use super::Section;
use crate::app::review::charts::{self, Heatmap};
use crate::app::review::{Ask, Month};

use crate::store::{RollupGrain, Store, StoreError};
use gpuledger_core::attribution::Attribution;
use gpuledger_core::attribution::Part;

/// GPUs the review's heatmap shows (the costliest); the CSV has all.
pub const REVIEW_HEATMAP_GPUS: usize = crate::review_sections::HEATMAP_GPUS;

impl Section for Heatmap {
    /// A scoped viewer's GPU-days; none for whoever sees every team.
    type Read = Option<Attribution>;

    async fn read(ask: &Ask<'_>) -> Result<Option<Attribution>, StoreError> {
        if ask.viewer.sees_everything() {
            return Ok(None);
        }
        let days = crate::ledger::load(ask.cx.store, ask.from, ask.to, RollupGrain::Day).await?;
        Ok(Some(days))
    }

    async fn build(scoped: Option<Attribution>, month: &Month<'_>) -> Result<Heatmap, StoreError> {
        let ask = month.ask;
        let viewer = ask.viewer;
        // The scope's own GPU-days, or the fleet's costliest GPUs.
        let scoped = scoped.map(|days| viewer.scope.restrict(days, viewer.schema));
        let (parts, gpu_count): (&[Part], usize) = match &scoped {
            Some(days) => {
                let gpus: BTreeSet<&str> = (days.parts.iter())
                    .filter_map(|p| p.gpu_uuid.as_deref())
                    .collect();
                (&days.parts, gpus.len())
            }
            None => (&month.heat_parts, month.kept.heatmap_gpus.1),
        };
        let labels = crate::app::review::timed("heatmap labels", labels(ask.cx.store, parts)).await;
        let mut heatmap = charts::heatmap(
            (parts, &month.shown.hosts),
            ask.from,
            ask.to,
            &ask.month,
            &ask.next,
            &[],
            REVIEW_HEATMAP_GPUS,
            &labels,
        );
        heatmap.total_gpus = gpu_count;
        Ok(heatmap)
    }
}

/// Heatmap row labels of the GPUs in `parts`; failing to read them costs the labels (rows fall
/// back to the end of the UUID), not the page.
pub async fn labels(store: &dyn Store, parts: &[Part]) -> HashMap<String, String> {
    let uuids: Vec<String> = parts
        .iter()
        .filter_map(|p| p.gpu_uuid.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    match crate::fleet::gpu_labels(store, &uuids).await {
        Ok(labels) => labels,
        Err(e) => {
            tracing::warn!(error = %e, "review: GPU indexes for the heatmap");
            Default::default()
        }
    }
}
