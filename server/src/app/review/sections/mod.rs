//! The review's sections, in the order of the page: the one list to add a section to.
//!
//! A section is a module with a type implementing [`Section`]: what it reads of its own (side
//! by side with the month's ledger and every other section's reads), then its figures from
//! that and the [`Month`]. Adding one is its module, a line in `review_sections!` below, and
//! its block in `templates/review.html`, which reads it as `section_name.field`.

pub mod anomalies;
pub mod budgets;
pub mod chart;
pub mod closing;
pub mod commitments;
pub mod endpoints;
pub mod figures;
pub mod heatmap;
pub mod idle_waste;
pub mod purchase_mix;
pub mod runs;
pub mod savings;
pub mod scale_to_zero;
pub mod shape;
pub mod tables;
pub mod variance;

use std::future::Future;

use super::{charts, timed, Ask, Month};
use crate::store::StoreError;

/// One section of the month's review.
pub(crate) trait Section: Sized {
    /// What the section reads of its own, before the month is known.
    type Read: Send;

    /// Its reads, side by side with the month's ledger and the other sections'.
    fn read(ask: &Ask<'_>) -> impl Future<Output = Result<Self::Read, StoreError>> + Send;

    /// The section from what it read and the month as the viewer sees it (a read that needs
    /// the month, such as the commitments of the types it ran, is made here).
    fn build(
        read: Self::Read,
        month: &Month<'_>,
    ) -> impl Future<Output = Result<Self, StoreError>> + Send;
}

/// The sections struct, and their reads and builds, from the list of sections.
macro_rules! review_sections {
    ($($(#[$doc:meta])* $name:ident: $section:ty,)*) => {
        /// The review's sections, in the order of the page.
        pub struct Sections {
            $($(#[$doc])* pub $name: $section,)*
        }

        /// Every section's reads side by side with the month's, then each built from the
        /// month. Each future is boxed: side by side they make a large future, too deep for a
        /// thread's stack in an unoptimized build.
        pub(super) async fn load(ask: &Ask<'_>) -> Result<Sections, StoreError> {
            let (month, $($name,)*) = tokio::try_join!(
                Box::pin(Month::read(ask)),
                $(Box::pin(timed(stringify!($name), <$section as Section>::read(ask))),)*
            )?;
            let month = Month::of(month, ask);
            let ($($name,)*) = tokio::try_join!(
                $(Box::pin(<$section as Section>::build($name, &month)),)*
            )?;
            Ok(Sections { $($name,)* })
        }
    };
}

review_sections! {
    /// Whether the month's figures are final, and its restatements.
    closing: closing::Closing,
    /// The headline figures, and what the bill carries besides.
    figures: figures::Figures,
    /// The month's budgets in a line.
    budgets: budgets::Budgets,
    /// Spend per day.
    chart: charts::Chart,
    /// Spend per owner dimension, pricing and cluster.
    tables: charts::Tables,
    /// The bill's commitment discounts.
    commitments: commitments::Commitments,
    /// Why spend changed against the month before.
    variance: variance::Variance,
    /// Days an owner spent well above its usual.
    anomalies: anomalies::Anomalies,
    /// Cost per 1,000 requests and per 1M tokens.
    endpoints: endpoints::Endpoints,
    /// Training runs.
    runs: runs::Runs,
    /// Utilization by GPU and day.
    heatmap: charts::Heatmap,
    /// GPUs held per instance type by hour of the week.
    shape: shape::Shape,
    /// Each type's month priced all on demand and with its floor committed.
    purchase_mix: purchase_mix::PurchaseMix,
    /// Endpoints and experiments quiet in the same hours every week.
    scale_to_zero: scale_to_zero::ScaleToZero,
    /// The costliest runs of idle and held-idle hours.
    idle_waste: idle_waste::IdleWaste,
    /// What to change, and what it saves.
    savings: savings::Savings,
}
