//! Why spend changed against the month before, per team (or the cluster where the schema has
//! no team dimension): the largest changes, the rest in one row, and the whole change, each in
//! volume, idle, mix and price that add up to it in cents.

use super::Section;
use crate::app::review::charts;
use crate::app::review::{Ask, Month, TOP_ROWS};
use crate::format::money;
use crate::store::StoreError;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::owners::Role;
use gpuledger_core::variance::VarianceRow;

pub struct Variance {
    pub dimension: String,
    /// Month to date, against the same stretch of the month before.
    pub month_to_date: bool,
    pub rows: Vec<VarianceRowView>,
    pub total: VarianceRowView,
    pub api: String,
    pub csv: String,
}

/// One owner's change on the review, in cents that add up as shown: volume, idle and mix are
/// rounded to the cent and price is the rounded change less them.
pub struct VarianceRowView {
    pub key: String,
    pub href: Option<String>,
    pub previous: String,
    pub cost: String,
    pub change: String,
    pub volume: String,
    pub idle: String,
    pub mix: String,
    pub price: String,
}

impl Section for Variance {
    type Read = ();

    async fn read(_: &Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn build((): (), month: &Month<'_>) -> Result<Variance, StoreError> {
        let ask = month.ask;
        let by = GroupBy::role(ask.viewer.schema, Role::Team).unwrap_or(GroupBy::Cluster);
        let v = crate::variance::of(
            &month.all,
            &month.previous,
            by,
            (ask.from, ask.to, ask.prev_from, ask.prev_to, ask.partial),
        );
        Ok(view(&v, &ask.month))
    }
}

fn view(v: &crate::variance::Variance, month: &str) -> Variance {
    let cur = &v.currency;
    let view = |r: &VarianceRow, href: Option<String>| {
        let change = gpuledger_core::money::cents(r.change);
        // In cents that add up to the change, with no residue cell: a part shows a cent only
        // where it carries some.
        let parts =
            gpuledger_core::money::cents_adding_up(&[r.volume, r.idle, r.mix, r.price], r.change);
        let (volume, idle, mix, price) = (parts[0], parts[1], parts[2], parts[3]);
        VarianceRowView {
            key: r.key.clone(),
            href,
            previous: money(r.previous_cost, cur),
            cost: money(r.cost, cur),
            change: money(change, cur),
            volume: money(volume, cur),
            idle: money(idle, cur),
            mix: money(mix, cur),
            price: money(price, cur),
        }
    };
    let mut rows: Vec<VarianceRowView> = v
        .rows
        .iter()
        .take(TOP_ROWS)
        .map(|r| {
            let href =
                v.by.is_owner()
                    .then(|| charts::drill_href(month, v.by, &r.key));
            view(r, href)
        })
        .collect();
    if v.rows.len() > TOP_ROWS {
        let rest = VarianceRow::sum(
            &format!("{} others", v.rows.len() - TOP_ROWS),
            &v.rows[TOP_ROWS..],
        );
        rows.push(view(&rest, None));
    }
    let api = format!("/api/v1/variance?month={month}&by={}", v.by.as_str());
    Variance {
        dimension: v.by.as_str().replace('_', " "),
        month_to_date: v.month_to_date,
        rows,
        total: view(&v.total, None),
        csv: format!("{api}&format=csv"),
        api,
    }
}
