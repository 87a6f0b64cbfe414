//! A month's review and its drill-downs, as one viewer sees them: every figure from the hourly
//! ledger, in the page's currency, laid out as the pages show them (words, links and chart
//! coordinates: data, not markup). The review's sections are listed in one place
//! ([`sections`]); each is a module that reads what it needs beside the others and builds its
//! figures from the month ([`Month`]).

pub mod charts;
mod drill_down;
mod month;
pub mod sections;

use std::ops::Deref;

use crate::app::{ReadContext, Viewer};
use crate::store::StoreError;
use gpuledger_core::allocation::calendar_month;
use gpuledger_core::time::month_label;

pub use drill_down::{DrillDown, DrillDownError};
pub use month::{Ask, Month, MonthRead};
use sections::Sections;

/// Rows of the review's short lists (the costliest idle episodes, endpoints, runs, savings).
pub const TOP_ROWS: usize = crate::review_sections::TOP_ROWS;

/// The month's review as one viewer sees it: where it sits among months, and its sections.
pub struct MonthReview {
    /// `YYYY-MM`, and the months before and after.
    pub month: String,
    pub previous: String,
    pub next: String,
    /// The next month has begun: a link to it leads somewhere.
    pub next_begun: bool,
    /// A team-scoped viewer's teams: the review is theirs alone.
    pub teams: Option<String>,
    pub sections: Sections,
}

/// The review's sections read as the review's own fields (`review.savings`), as its template
/// reads them.
impl Deref for MonthReview {
    type Target = Sections;

    fn deref(&self) -> &Sections {
        &self.sections
    }
}

/// Why there is no review to show.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("months are written YYYY-MM")]
    NoSuchMonth,
    /// A month still to come: no figures, no comparison, no forecast.
    #[error("the month has not begun")]
    NotBegun { from: i64, now: i64 },
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

impl MonthReview {
    /// The review of `month` (`YYYY-MM`). A team-scoped viewer gets the review of its teams:
    /// every figure and table from their part of the ledger, and of lists (recommendations,
    /// idle episodes, anomalies, endpoints' requests) only what is wholly theirs.
    pub async fn load(
        cx: ReadContext<'_>,
        viewer: Viewer<'_>,
        month: &str,
    ) -> Result<MonthReview, ReviewError> {
        let (from, to) = calendar_month(month).ok_or(ReviewError::NoSuchMonth)?;
        if from > cx.now {
            return Err(ReviewError::NotBegun { from, now: cx.now });
        }
        let started = std::time::Instant::now();
        let ask = Ask::new(cx, viewer, (from, to));
        let sections = sections::load(&ask).await?;
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            "review computed"
        );
        Ok(MonthReview {
            month: ask.month.clone(),
            previous: month_label(ask.prev_from),
            next: ask.next.clone(),
            next_begun: to <= cx.now,
            teams: (!viewer.sees_everything()).then(|| viewer.scope.describe()),
            sections,
        })
    }
}

/// `read`, its time logged at debug level (`GPULEDGER_LOG=gpuledger_server::app::review=debug`):
/// where a slow view spends it. Reads run side by side, so each time includes waiting for the
/// database while it works on the others.
pub(crate) async fn timed<T>(what: &'static str, read: impl std::future::Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let out = read.await;
    tracing::debug!(
        read = what,
        ms = started.elapsed().as_secs_f64() * 1e3,
        "review read"
    );
    out
}

/// The day and time of `ms` as the pages write it: `3 Nov 2026 14:00 UTC`.
pub fn day_and_time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(String::new, |d| d.format("%-d %b %Y %H:%M UTC").to_string())
}
