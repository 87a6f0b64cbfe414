//! Days an owner spent well above its usual, biggest first (dismissed ones last): what is
//! wholly the viewer's, judged on the whole ledger.

use super::Section;
use crate::anomalies::OwnerAnomaly;
use crate::app::review::{Ask, Month};
use crate::format::money;
use crate::store::StoreError;
use gpuledger_core::time::rfc3339;

pub struct Anomalies {
    pub list: Vec<AnomalyView>,
}

/// An anomaly as the review shows it.
pub struct AnomalyView {
    pub owner: String,
    pub kind: &'static str,
    pub since: String,
    pub days: usize,
    /// Today is one of its days, judged on its cost so far.
    pub ongoing: bool,
    pub expected: String,
    pub actual: String,
    pub excess: String,
    /// Where the money went, one line per GPU.
    pub drivers: Vec<String>,
    pub dismissed: Option<String>,
    /// What the dismiss button sends.
    pub dimension: String,
    pub key: String,
    pub currency: String,
    pub start: String,
}

impl Section for Anomalies {
    type Read = Vec<OwnerAnomaly>;

    async fn read(ask: &Ask<'_>) -> Result<Vec<OwnerAnomaly>, StoreError> {
        let range = (ask.from, ask.to);
        crate::anomalies::find(ask.cx.store, ask.cx.config, range, (ask.cx.now, ask.keep)).await
    }

    async fn build(found: Vec<OwnerAnomaly>, month: &Month<'_>) -> Result<Anomalies, StoreError> {
        let viewer = month.ask.viewer;
        let found = crate::anomalies::within_scope(found, (viewer.scope, viewer.schema));
        Ok(Anomalies {
            list: found.iter().map(view).collect(),
        })
    }
}

fn view(a: &OwnerAnomaly) -> AnomalyView {
    let m = |d| money(d, &a.currency);
    let day = |ms: i64| rfc3339(ms).get(..10).unwrap_or_default().to_owned();
    AnomalyView {
        owner: format!("{} {}", a.dimension.replace('_', " "), a.key),
        kind: a.anomaly.kind.label(),
        since: day(a.anomaly.start_ms),
        days: a.anomaly.days.len(),
        ongoing: a.anomaly.days.iter().any(|d| d.partial),
        expected: m(a.anomaly.expected),
        actual: m(a.anomaly.actual),
        excess: m(a.anomaly.excess()),
        drivers: a.drivers.iter().map(|d| d.label(m)).collect(),
        dismissed: a.dismissed.as_ref().map(|d| {
            let mut s = format!("dismissed by {} on {}", d.by, day(d.at_ms));
            if !d.reason.is_empty() {
                s.push_str(": ");
                s.push_str(&d.reason);
            }
            s
        }),
        dimension: a.dimension.clone(),
        key: a.key.clone(),
        currency: a.currency.clone(),
        start: day(a.anomaly.start_ms),
    }
}
