//! Each GPU instance type's month priced all on demand, with its floor committed, and with
//! experiments above the floor on spot: the fleet's, shown to whoever sees every team.

use super::Section;
use crate::app::review::{Ask, Month};
use crate::format::money;
use crate::store::StoreError;

pub struct PurchaseMix {
    pub rows: Vec<PurchaseRow>,
    /// What every purchase mix assumes.
    pub assumes: &'static str,
}

/// One option of a type's purchase mix as the review lists it.
pub struct PurchaseRow {
    /// The type, on its first option's row only.
    pub instance_type: String,
    pub choice: String,
    pub cost: String,
    pub break_even: String,
    /// GPU-hours of experiments' work on spot.
    pub on_spot: String,
    pub cheapest: bool,
    /// What keeps a commitment from being priced, on the type's last row.
    pub missing: String,
}

impl Section for PurchaseMix {
    type Read = ();

    async fn read(_: &Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn build((): (), month: &Month<'_>) -> Result<PurchaseMix, StoreError> {
        let ask = month.ask;
        let mixes = if ask.viewer.sees_everything() {
            let kept = &month.kept;
            crate::purchase::of_shapes(ask.cx.rate_card, &kept.shape, &kept.type_costs)
        } else {
            Vec::new()
        };
        Ok(PurchaseMix {
            rows: rows(&mixes),
            assumes: gpuledger_core::purchase::ASSUMES,
        })
    }
}

fn rows(mixes: &[gpuledger_core::purchase::TypeMix]) -> Vec<PurchaseRow> {
    let mut rows = Vec::new();
    for m in mixes {
        if m.options.is_empty() {
            rows.push(PurchaseRow {
                instance_type: m.instance_type.clone(),
                choice: String::new(),
                cost: String::new(),
                break_even: String::new(),
                on_spot: String::new(),
                cheapest: false,
                missing: m.missing.clone().unwrap_or_default(),
            });
            continue;
        }
        let last = m.options.len().saturating_sub(1);
        for (i, o) in m.options.iter().enumerate() {
            rows.push(PurchaseRow {
                instance_type: if i == 0 {
                    format!(
                        "{} (floor {} × {} GPUs)",
                        m.instance_type, m.floor_instances, m.gpus_per_instance
                    )
                } else {
                    String::new()
                },
                choice: o.choice.clone(),
                cost: money(o.cost, &m.currency),
                break_even: o
                    .break_even_percent
                    .map_or_else(String::new, |p| format!("{p}% of hours")),
                on_spot: if o.spot_gpu_hours > 0.0 {
                    format!("{} GPU-h", crate::format::whole(o.spot_gpu_hours))
                } else {
                    String::new()
                },
                cheapest: o.choice == m.cheapest && m.options.len() > 1,
                missing: if i == last {
                    m.missing.clone().unwrap_or_default()
                } else {
                    String::new()
                },
            });
        }
    }
    rows
}
