//! Where the month stands: open (its figures may change until it closes) or closed, with the
//! changes that arrived after it closed and its restatements.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;

use super::Section;
use crate::app::review::{day_and_time, Ask, Month};
use crate::closing::ClosePolicy;
use crate::store::closing::RestatementRow;
use crate::store::StoreError;
use gpuledger_core::time::month_label;

pub struct Closing {
    pub closed: bool,
    pub text: String,
    /// Host-hours marked after the month closed and not applied.
    pub waiting: i64,
    pub restatements: Vec<Restatement>,
}

pub struct Restatement {
    pub when: String,
    pub reason: String,
    /// Team, before, after: the teams whose figure changed.
    pub changes: Vec<(String, String, String)>,
}

pub struct Read {
    close: ClosePolicy,
    waiting: i64,
    restated: Vec<RestatementRow>,
}

impl Section for Closing {
    type Read = Read;

    async fn read(ask: &Ask<'_>) -> Result<Read, StoreError> {
        let store = ask.cx.store;
        let (close, waiting, restated) = tokio::try_join!(
            ask.cx.close.current(store),
            crate::closing::pending_hours(store, ask.from, ask.to),
            crate::closing::restatements(store, ask.from),
        )?;
        Ok(Read {
            close,
            waiting,
            restated,
        })
    }

    async fn build(read: Read, month: &Month<'_>) -> Result<Closing, StoreError> {
        let sees_everything = month.ask.viewer.sees_everything();
        // The bill's restatements are the whole bill's: not a team's to read; nor is how much
        // of the whole fleet changed after the month closed.
        let restated = if sees_everything {
            read.restated
        } else {
            Vec::new()
        };
        let waiting = if sees_everything { read.waiting } else { 0 };
        // Nothing reported, billed, waiting or restated for the whole fleet: the month says so
        // (a team's part of a month with data can be empty and still final).
        let whole = month.whole();
        let empty = whole.parts.is_empty()
            && whole.unattributed.values().all(Decimal::is_zero)
            && waiting == 0
            && restated.is_empty();
        Ok(closing(
            read.close,
            (month.ask.from, month.ask.cx.now),
            (empty, waiting),
            &restated,
            &month.currency,
        ))
    }
}

fn closing(
    close: ClosePolicy,
    (from, now): (i64, i64),
    (empty, waiting): (bool, i64),
    restatements: &[RestatementRow],
    currency: &str,
) -> Closing {
    let closes = close.closes_at(from);
    // A month nothing was reported or billed for has no figures to be final.
    let closed = close.is_closed(from, now) && !empty;
    let text = if empty {
        format!(
            "No data: no agent reported and no bill covers {}, so there is nothing to review{}.",
            month_label(from),
            if close.is_closed(from, now) {
                ""
            } else {
                " yet"
            }
        )
    } else if closed && close.is_signed_off(from) && closes > now {
        "Closed: signed off with its final bill; these figures are final.".to_owned()
    } else if closed {
        format!("Closed {}: these figures are final.", day_and_time(closes))
    } else {
        let under_way = now < gpuledger_core::time::next_month_start(from);
        format!(
            "Open: late data and bills may still change these figures until the month closes on {}.{}",
            day_and_time(closes),
            if under_way {
                // Kept between refreshes (review_sections): say how old they can be.
                " The idle history, the heatmap's GPUs, coverage, scale-to-zero and the week's shape can be up to 10 minutes old."
            } else {
                ""
            }
        )
    };
    Closing {
        closed,
        text,
        waiting: if closed { waiting } else { 0 },
        restatements: restatements
            .iter()
            .map(|r| restatement(r, currency))
            .collect(),
    }
}

fn restatement(r: &RestatementRow, currency: &str) -> Restatement {
    let parse =
        |json: &str| -> BTreeMap<String, String> { serde_json::from_str(json).unwrap_or_default() };
    let (before, after) = (parse(&r.before_json), parse(&r.after_json));
    let teams: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    // Amounts are in the month's currency unless written "amount CUR".
    let money = |v: Option<&String>| {
        v.map_or_else(
            || "—".to_owned(),
            |v| {
                let (amount, c) = v.split_once(' ').unwrap_or((v, currency));
                crate::format::money(gpuledger_core::money::from_text(amount), c)
            },
        )
    };
    Restatement {
        when: day_and_time(r.created_ms),
        reason: r.reason.clone(),
        changes: teams
            .into_iter()
            .filter(|t| before.get(*t) != after.get(*t))
            .map(|t| (t.clone(), money(before.get(t)), money(after.get(t))))
            .collect(),
    }
}
