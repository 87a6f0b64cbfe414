//! Spend per day, used, held idle and idle stacked; each day links to its rows.

use super::Section;
use crate::app::review::charts::{self, Chart};
use crate::app::review::{Ask, Month};
use crate::store::StoreError;
use gpuledger_core::attribution::Attribution;
use gpuledger_core::owners::Role;

impl Section for Chart {
    type Read = Attribution;

    /// Per day and team, so a scoped reader's chart is its teams'.
    async fn read(ask: &Ask<'_>) -> Result<Attribution, StoreError> {
        let team = ask.viewer.schema.role(Role::Team);
        crate::ledger::days_by(ask.cx.store, ask.from, ask.to, team, ask.keep).await
    }

    async fn build(per_day: Attribution, month: &Month<'_>) -> Result<Chart, StoreError> {
        let (ask, viewer) = (month.ask, month.ask.viewer);
        let per_day = viewer.scope.restrict(per_day, viewer.schema);
        Ok(charts::days(
            &per_day,
            ask.from,
            ask.to,
            &[],
            &month.currency,
        ))
    }
}
