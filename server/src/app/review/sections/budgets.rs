//! The month's budgets in a line: how many are over, heading over and on track.

use super::Section;
use crate::app::review::{Ask, Month};
use crate::budgets::BudgetStatus;
use crate::store::StoreError;
use gpuledger_core::budget::Standing;

pub struct Budgets {
    /// "2 of 5 budgets over, 1 heading over, 2 on track"; "" when there are none.
    pub text: String,
}

impl Section for Budgets {
    type Read = Vec<BudgetStatus>;

    async fn read(ask: &Ask<'_>) -> Result<Vec<BudgetStatus>, StoreError> {
        let viewer = (ask.viewer.schema, ask.viewer.scope);
        crate::budgets::for_month(ask.cx.store, viewer, (ask.from, ask.to), ask.cx.now).await
    }

    async fn build(budgets: Vec<BudgetStatus>, _: &Month<'_>) -> Result<Budgets, StoreError> {
        Ok(Budgets {
            text: in_a_line(&budgets),
        })
    }
}

fn in_a_line(budgets: &[BudgetStatus]) -> String {
    if budgets.is_empty() {
        return String::new();
    }
    let count = |s: Standing| budgets.iter().filter(|b| b.standing == s).count();
    let over = count(Standing::Over);
    let risk = count(Standing::AtRisk);
    format!(
        "{over} of {} budgets over, {risk} heading over, {} on track",
        budgets.len(),
        count(Standing::OnTrack)
    )
}
