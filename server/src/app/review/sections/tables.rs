//! Spend per owner dimension (the default four first, as finance reads them), then how it was
//! bought and where.

use super::Section;
use crate::app::review::charts::{self, Tables};
use crate::app::review::{Ask, Month};
use crate::store::StoreError;
use gpuledger_core::allocation::GroupBy;

impl Section for Tables {
    type Read = ();

    async fn read(_: &Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn build((): (), month: &Month<'_>) -> Result<Tables, StoreError> {
        let ask = month.ask;
        let default_order = [
            GroupBy::MODEL,
            GroupBy::TEAM,
            GroupBy::ENDPOINT,
            GroupBy::EXPERIMENT,
        ];
        let owner_tables = GroupBy::all(ask.viewer.schema)
            .into_iter()
            .filter(|g| g.is_owner() && !default_order.contains(g));
        let list = default_order
            .into_iter()
            .chain(owner_tables)
            .chain([GroupBy::PricingCategory, GroupBy::Cluster])
            .map(|by| {
                charts::table(
                    (&month.shown, &month.grid),
                    by,
                    (&ask.month, &ask.next),
                    &[],
                    month.total(),
                    (&month.currency, &month.others),
                )
            })
            .collect();
        Ok(Tables { list })
    }
}
