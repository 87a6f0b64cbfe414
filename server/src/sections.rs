//! Sections of a month's pages kept as first computed. Summing a month of a whole fleet's
//! hourly rollups again for every view (the week's shape, the scale-to-zero windows) would only
//! give the same answer slower while the month's rollups stand. They change only when the
//! roll-up rewrites hours of the month (the month under way's new hours, late data, a
//! restatement, a month attributed for the first time), which counts a new generation of each
//! day it rewrites in the same transaction. A section is kept with the generation read before
//! it was computed (summed over the days its range overlaps) and served only while that is
//! still theirs, so one computed while a roll-up ran (on any replica) is never served. Counted
//! per day, the month under way's days before today are kept like a closed month's: the
//! roll-up's minute-by-minute rewrites of today leave them alone. A range still under way (the
//! review's heaviest sections of the month under way) is served by its age instead, for at most
//! [`MAX_AGE_MS`], and computed again by a job ([`crate::review_sections`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::store::{self, Store, StoreError};
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::scope::Scope;

/// For whom a section is kept: the viewer's scope and the owner dimensions it was grouped by,
/// as a short digest (a config change reads the month again rather than an old grouping).
pub fn key(scope: &Scope, schema: &OwnerSchema) -> String {
    let digest = Sha256::digest(format!("{scope:?}\n{schema:?}").as_bytes());
    digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// How long a section of a range still under way is served after it was computed: the review's
/// heaviest sections of the month under way, which the roll-up would otherwise retire every
/// minute, are computed again by a job every [`REFRESH_EVERY_MS`].
pub const MAX_AGE_MS: i64 = 10 * 60_000;

/// How long anything is kept once computed: a closed month's sections are computed again on
/// the first view after, and a range read once (an API client's) does not stay for ever.
pub const KEPT_FOR_MS: i64 = 30 * 24 * 3_600_000;

/// Deletes what was computed more than [`KEPT_FOR_MS`] before `now_ms`; the hourly retention
/// job calls it.
pub async fn prune(store: &dyn Store, now_ms: i64) -> Result<u64, StoreError> {
    store::sections::prune_kept(store.db(), now_ms - KEPT_FOR_MS).await
}
/// How often the job computes the sections of the months still open again (well inside
/// [`MAX_AGE_MS`]).
pub const REFRESH_EVERY_MS: i64 = 5 * 60_000;

/// The range a section covers: `[from_ms, to_ms)`, which `grows` when its end moves on each
/// day (the month under way's days so far, the same stretch of the month before): each day's
/// then replaces the day before's rather than leaving one behind a day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub from_ms: i64,
    pub to_ms: i64,
    pub grows: bool,
}

impl Span {
    pub fn growing(from_ms: i64, to_ms: i64) -> Span {
        Span {
            from_ms,
            to_ms,
            grows: true,
        }
    }
}

impl From<(i64, i64)> for Span {
    fn from((from_ms, to_ms): (i64, i64)) -> Span {
        Span {
            from_ms,
            to_ms,
            grows: false,
        }
    }
}

/// `compute`'s answer for `section` over `span` (a month, a range of months or days): the one
/// kept, if computed after the range ended and no roll-up has rewritten an hour of its days
/// since, or if computed while the range was under way and younger than [`MAX_AGE_MS`]; else
/// computed and kept. Keeping it is best effort: a failed write still answers what was
/// computed. Where this process is already computing it (another view, or the job), this waits
/// for that and serves what it kept.
pub async fn kept<T, F>(
    store: &dyn Store,
    (section, key): (&str, &str),
    span: impl Into<Span>,
    now_ms: i64,
    compute: F,
) -> Result<T, StoreError>
where
    T: Serialize + DeserializeOwned + PartialEq,
    F: Future<Output = Result<T, StoreError>>,
{
    let span = span.into();
    if reading_afresh() {
        return compute.await;
    }
    if let Some(kept) = servable(store, (section, key), span, (now_ms, MAX_AGE_MS)).await? {
        return Ok(kept);
    }
    in_turn(store, (section, key), span, (now_ms, MAX_AGE_MS), compute).await
}

tokio::task_local! {
    static AFRESH: ();
}

/// Runs `f` with every kept copy passed by: each section, kept ledger read and stored
/// recommendation computed from the ledger as on a first view, and nothing read or written
/// kept. What a view would serve if nothing had been kept: the reference the differential
/// tests hold every served figure to.
pub async fn afresh<F: Future>(f: F) -> F::Output {
    AFRESH.scope((), f).await
}

/// Whether this task reads everything afresh ([`afresh`]).
pub fn reading_afresh() -> bool {
    AFRESH.try_with(|_| ()).is_ok()
}

/// The kept answer for `section` over `span`, if it may be served at `now_ms`: one computed
/// while the range was under way if younger than `max_age_ms`.
async fn servable<T: DeserializeOwned>(
    store: &dyn Store,
    (section, key): (&str, &str),
    span: Span,
    (now_ms, max_age_ms): (i64, i64),
) -> Result<Option<T>, StoreError> {
    let range = (span.from_ms, span.to_ms);
    let Some(kept) = store::sections::stored_section(store.db(), (section, key), range).await?
    else {
        return Ok(None);
    };
    let under_way = kept.computed_ms < span.to_ms;
    let serve = if under_way {
        now_ms - kept.computed_ms < max_age_ms
    } else {
        kept.current
    };
    if !serve {
        return Ok(None);
    }
    match serde_json::from_str(&kept.body) {
        Ok(kept) => Ok(Some(kept)),
        // Written by another version: compute again and overwrite.
        Err(e) => {
            tracing::warn!(section, error = %e, "kept section unreadable");
            Ok(None)
        }
    }
}

/// Sections this process is computing, by section, key and range. A month's first views and
/// the job that refreshes the month under way ask for the same sections at once (after a
/// start, say); each computing them beside the others only shared the same cores and slowed
/// every page. Other replicas compute their own: the turn is per process.
static COMPUTING: LazyLock<Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Default::default);

/// The turn to compute `section` for `key` over `span`, shared by whoever asks while it is held.
fn turn_to_compute(section: &str, key: &str, span: Span) -> Arc<tokio::sync::Mutex<()>> {
    let name = format!("{section}\n{key}\n{}\n{}", span.from_ms, span.to_ms);
    let mut computing = COMPUTING.lock().unwrap_or_else(PoisonError::into_inner);
    // Turns nobody holds or waits for are let go.
    computing.retain(|_, turn| turn.strong_count() > 0);
    if let Some(turn) = computing.get(&name).and_then(Weak::upgrade) {
        return turn;
    }
    let turn = Arc::new(tokio::sync::Mutex::new(()));
    computing.insert(name, Arc::downgrade(&turn));
    turn
}

/// How young a section of a range under way the job leaves as it is: a view computed it moments
/// ago (after a start, say). Kept at most this plus [`REFRESH_EVERY_MS`] before the job computes
/// it again, well inside [`MAX_AGE_MS`].
pub const FRESH_FOR_JOB_MS: i64 = REFRESH_EVERY_MS / 2;

/// `compute`'s answer for `section` over `span`, computed now and kept unless one younger than
/// [`FRESH_FOR_JOB_MS`] is kept: what the job that refreshes a range under way does. Views that
/// ask for it meanwhile wait and serve it.
pub async fn computed<T, F>(
    store: &dyn Store,
    (section, key): (&str, &str),
    span: impl Into<Span>,
    now_ms: i64,
    compute: F,
) -> Result<T, StoreError>
where
    T: Serialize + DeserializeOwned + PartialEq,
    F: Future<Output = Result<T, StoreError>>,
{
    if reading_afresh() {
        return compute.await;
    }
    let fresh = (now_ms, FRESH_FOR_JOB_MS);
    in_turn(store, (section, key), span.into(), fresh, compute).await
}

/// In this process's turn for the section: the one kept if servable (younger than `max_age_ms`
/// while under way; whoever held the turn may have kept it meanwhile), else computed and kept.
async fn in_turn<T, F>(
    store: &dyn Store,
    (section, key): (&str, &str),
    span: Span,
    (now_ms, max_age_ms): (i64, i64),
    compute: F,
) -> Result<T, StoreError>
where
    T: Serialize + DeserializeOwned + PartialEq,
    F: Future<Output = Result<T, StoreError>>,
{
    let turn = turn_to_compute(section, key, span);
    let _turn = turn.lock().await;
    if let Some(kept) = servable(store, (section, key), span, (now_ms, max_age_ms)).await? {
        return Ok(kept);
    }
    // On the heap: a section's computation is a large future, and a page awaits several.
    Box::pin(compute_and_keep(
        store,
        (section, key),
        span,
        now_ms,
        compute,
    ))
    .await
}

async fn compute_and_keep<T, F>(
    store: &dyn Store,
    (section, key): (&str, &str),
    span: Span,
    now_ms: i64,
    compute: F,
) -> Result<T, StoreError>
where
    T: Serialize + DeserializeOwned + PartialEq,
    F: Future<Output = Result<T, StoreError>>,
{
    let Span {
        from_ms,
        to_ms,
        grows,
    } = span;
    // Read before the figures: a roll-up that commits while they are computed moves it on.
    let generation = store::sections::rollup_generation(store.db(), (from_ms, to_ms)).await?;
    let value = compute.await?;
    let Some(body) = copy_of(section, &value) else {
        return Ok(value);
    };
    // On the primary when read from a replica: the generation read with the figures keeps one
    // computed from a replica behind a later roll-up from being served. Written after the
    // answer there, so a slow primary does not hold up a page the replica served.
    let (primary, section, key) = (store.primary().clone(), section.to_owned(), key.to_owned());
    let keep = async move {
        let kept = store::sections::put_section_snapshot(
            &primary,
            (&section, &key),
            (from_ms, to_ms, grows),
            (generation, now_ms),
            &body,
        )
        .await;
        if let Err(e) = kept {
            tracing::warn!(section, error = %e, "section not kept; computed again next view");
        }
    };
    if store.is_replica() {
        tokio::spawn(keep);
    } else {
        keep.await;
    }
    Ok(value)
}

/// `value` as it is kept, if it reads back as the same value. A kept copy is a copy: one that
/// would read back as anything else (a field the format skips, a float it rounds) is not kept,
/// and the section is computed on every view, with an error logged, until its type is mended;
/// tests fail on it.
pub fn copy_of<T>(section: &str, value: &T) -> Option<String>
where
    T: Serialize + DeserializeOwned + PartialEq,
{
    let body = match serde_json::to_string(value) {
        Ok(body) => body,
        Err(e) => {
            tracing::warn!(section, error = %e, "section not kept; computed again next view");
            return None;
        }
    };
    let differs = match serde_json::from_str::<T>(&body) {
        Ok(back) if back == *value => return Some(body),
        Ok(_) => "it reads back as another value".to_owned(),
        Err(e) => format!("it does not read back: {e}"),
    };
    tracing::error!(
        section,
        differs,
        "section not kept: its kept copy would differ from what was computed"
    );
    if cfg!(test) {
        panic!("section {section}: its kept copy would differ from what was computed: {differs}");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support;
    use gpuledger_core::time::{DAY_MS, HOUR_MS};

    /// 2026-10-01 00:00 UTC, a month long closed at [`NOW`].
    const OCTOBER: i64 = 1_790_812_800_000;
    const NOW: i64 = OCTOBER + 60 * DAY_MS;

    /// Late data for `hour`: the roll-up attributes it again.
    async fn roll_up(store: &dyn Store, hour: i64) {
        store::rollups::mark_dirty_hours(store.db(), &[hour])
            .await
            .unwrap();
        crate::test_support::roll_up(store).await;
    }

    async fn shape(store: &dyn Store, key: &str, answer: u32) -> Vec<u32> {
        kept(
            store,
            ("shape", key),
            (OCTOBER, OCTOBER + 31 * DAY_MS),
            NOW,
            async move { Ok::<_, StoreError>(vec![answer]) },
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_section_is_kept_until_the_roll_up_rewrites_one_of_its_hours() {
        for db in test_support::both().await {
            let store = db.open().await;
            let (s, b) = (store.as_ref(), db.backend);
            assert_eq!(shape(s, "all", 1).await, [1], "{b}");
            assert_eq!(shape(s, "all", 2).await, [1], "{b}: kept");
            assert_eq!(shape(s, "team-a", 3).await, [3], "{b}: another viewer's");

            // Late data for one hour of the month: the roll-up rewrites its day.
            roll_up(s, OCTOBER + 40 * HOUR_MS).await;
            assert_eq!(shape(s, "all", 5).await, [5], "{b}: read again");
            assert_eq!(shape(s, "all", 6).await, [5], "{b}: and kept");

            // An hour of another month leaves it alone.
            roll_up(s, OCTOBER + 40 * DAY_MS).await;
            assert_eq!(shape(s, "all", 7).await, [5], "{b}");

            // What another version wrote and this one cannot read is computed again.
            let generation =
                store::sections::rollup_generation(s.db(), (OCTOBER, OCTOBER + 31 * DAY_MS))
                    .await
                    .unwrap();
            assert!(generation > 0, "{b}: the roll-up counted its rewrite");
            store::sections::put_section_snapshot(
                s.db(),
                ("shape", "all"),
                (OCTOBER, OCTOBER + 31 * DAY_MS, false),
                (generation, NOW),
                "{\"not\": \"a list\"}",
            )
            .await
            .unwrap();
            assert_eq!(shape(s, "all", 8).await, [8], "{b}");

            // A roll-up that commits while a view computes: what that view computed is kept
            // but never served, since it may hold the hours from before.
            let racing = kept(
                s,
                ("shape", "racing"),
                (OCTOBER, OCTOBER + 31 * DAY_MS),
                NOW,
                async {
                    roll_up(s, OCTOBER + 50 * HOUR_MS).await;
                    Ok::<_, StoreError>(vec![9])
                },
            )
            .await
            .unwrap();
            assert_eq!(racing, [9], "{b}");
            assert_eq!(shape(s, "racing", 10).await, [10], "{b}: computed again");
            assert_eq!(shape(s, "racing", 11).await, [10], "{b}: and kept");

            // A range over several months is retired by a rewrite of any of them, the last
            // included; not by one after it.
            let (from, to) = (OCTOBER - 20 * DAY_MS, OCTOBER + 31 * DAY_MS);
            let months = |answer: u32| {
                kept(s, ("months", "all"), (from, to), NOW, async move {
                    Ok::<_, StoreError>(vec![answer])
                })
            };
            assert_eq!(months(1).await.unwrap(), [1], "{b}");
            assert_eq!(months(2).await.unwrap(), [1], "{b}: kept");
            roll_up(s, OCTOBER + 60 * HOUR_MS).await;
            assert_eq!(
                months(3).await.unwrap(),
                [3],
                "{b}: its last month rewritten"
            );
            roll_up(s, OCTOBER - 3 * DAY_MS).await;
            assert_eq!(
                months(4).await.unwrap(),
                [4],
                "{b}: its first month rewritten"
            );
            roll_up(s, OCTOBER + 45 * DAY_MS).await;
            assert_eq!(months(5).await.unwrap(), [4], "{b}: a month after it");
            // A view computing it while a later month of it is rewritten: not served.
            let racing = |answer: u32| {
                kept(s, ("months", "racing"), (from, to), NOW, async move {
                    if answer == 6 {
                        roll_up(s, OCTOBER + 70 * HOUR_MS).await;
                    }
                    Ok::<_, StoreError>(vec![answer])
                })
            };
            assert_eq!(racing(6).await.unwrap(), [6], "{b}");
            assert_eq!(racing(7).await.unwrap(), [7], "{b}: computed again");
            assert_eq!(racing(8).await.unwrap(), [7], "{b}: and kept");
        }
    }

    /// Counted per day: a range of a month's days is retired by a rewrite of one of its days,
    /// not by one of the month's later days. A growing range replaces the shorter growing ones
    /// of the same start, and no range of fixed end.
    #[tokio::test]
    async fn days_are_retired_by_their_own_rewrites_and_a_growing_range_replaces_its_last() {
        for db in test_support::both().await {
            let store = db.open().await;
            let (s, b) = (store.as_ref(), db.backend);
            let days = |to_day: i64, answer: u32| {
                let span = Span::growing(OCTOBER, OCTOBER + to_day * DAY_MS);
                kept(s, ("days", "all"), span, NOW, async move {
                    Ok::<_, StoreError>(vec![answer])
                })
            };
            assert_eq!(days(20, 1).await.unwrap(), [1], "{b}");
            // Today (day 20) and after: rewritten every minute, and nothing of the range.
            roll_up(s, OCTOBER + 20 * DAY_MS + 3 * HOUR_MS).await;
            roll_up(s, OCTOBER + 25 * DAY_MS).await;
            assert_eq!(days(20, 2).await.unwrap(), [1], "{b}: kept");
            roll_up(s, OCTOBER + 19 * DAY_MS + 23 * HOUR_MS).await;
            assert_eq!(
                days(20, 3).await.unwrap(),
                [3],
                "{b}: its last day rewritten"
            );

            // A range of fixed end over the same start, shorter and longer.
            let fixed = |to_day: i64, answer: u32| {
                kept(
                    s,
                    ("days", "all"),
                    (OCTOBER, OCTOBER + to_day * DAY_MS),
                    NOW,
                    async move { Ok::<_, StoreError>(vec![answer]) },
                )
            };
            assert_eq!(fixed(10, 4).await.unwrap(), [4], "{b}");
            assert_eq!(fixed(31, 5).await.unwrap(), [5], "{b}");
            // The next day's growing range replaces the day before's, and no other.
            assert_eq!(days(21, 6).await.unwrap(), [6], "{b}: a day on");
            let stored = |to_day: i64| {
                store::sections::stored_section(
                    s.db(),
                    ("days", "all"),
                    (OCTOBER, OCTOBER + to_day * DAY_MS),
                )
            };
            assert_eq!(stored(20).await.unwrap(), None, "{b}: replaced");
            for to_day in [10, 21, 31] {
                assert!(stored(to_day).await.unwrap().is_some(), "{b}: {to_day}");
            }
            assert_eq!(fixed(10, 7).await.unwrap(), [4], "{b}: still kept");
        }
    }

    /// What was computed over [`KEPT_FOR_MS`] ago goes, sections and recommendations alike;
    /// what was computed since stays, and a range read again is computed and kept anew.
    #[tokio::test]
    async fn what_was_kept_long_ago_is_pruned() {
        for db in test_support::both().await {
            let store = db.open().await;
            let (s, b) = (store.as_ref(), db.backend);
            let (old, recent) = (NOW - KEPT_FOR_MS - 1, NOW - KEPT_FOR_MS + DAY_MS);
            for (at, key) in [(old, "old"), (recent, "recent")] {
                let range = (OCTOBER, OCTOBER + 31 * DAY_MS, false);
                store::sections::put_section_snapshot(
                    s.db(),
                    ("shape", key),
                    range,
                    (0, at),
                    "[1]",
                )
                .await
                .unwrap();
                let range = (OCTOBER + at % DAY_MS, OCTOBER + 31 * DAY_MS, 0);
                store::recommendations::put_recommendation_snapshot(s.db(), range, (0, at), "{}")
                    .await
                    .unwrap();
            }
            assert_eq!(prune(s, NOW).await.unwrap(), 2, "{b}");
            let month = (OCTOBER, OCTOBER + 31 * DAY_MS);
            let kept =
                |key: &'static str| store::sections::stored_section(s.db(), ("shape", key), month);
            assert!(kept("old").await.unwrap().is_none(), "{b}");
            assert!(kept("recent").await.unwrap().is_some(), "{b}");
            let advice = |at: i64| {
                let to = OCTOBER + 31 * DAY_MS;
                store::recommendations::recommendation_snapshot(
                    s.db(),
                    OCTOBER + at % DAY_MS,
                    to,
                    0,
                )
            };
            assert!(advice(old).await.unwrap().is_none(), "{b}");
            assert!(advice(recent).await.unwrap().is_some(), "{b}");
            assert_eq!(shape(s, "old", 2).await, [2], "{b}: computed again");
            assert_eq!(prune(s, NOW).await.unwrap(), 0, "{b}");
        }
    }

    /// A section of a month under way outlives the roll-ups of its latest hours for
    /// [`MAX_AGE_MS`], then is computed again.
    #[tokio::test]
    async fn a_section_under_way_is_served_by_its_age() {
        for db in test_support::both().await {
            let store = db.open().await;
            let (s, b) = (store.as_ref(), db.backend);
            let month = (OCTOBER, OCTOBER + 31 * DAY_MS);
            let at = OCTOBER + 20 * DAY_MS;
            let shape = |now: i64, answer: u32| {
                kept(s, ("shape", "all"), month, now, async move {
                    Ok::<_, StoreError>(vec![answer])
                })
            };
            assert_eq!(shape(at, 1).await.unwrap(), [1], "{b}");
            // The roll-up rewrites the hour under way: still served, and still stored.
            roll_up(s, at - HOUR_MS).await;
            assert_eq!(shape(at + 60_000, 2).await.unwrap(), [1], "{b}: by its age");
            assert_eq!(
                shape(at + MAX_AGE_MS - 1, 3).await.unwrap(),
                [1],
                "{b}: until it is too old"
            );
            assert_eq!(shape(at + MAX_AGE_MS, 4).await.unwrap(), [4], "{b}");
            // The job leaves one a view has just computed, and computes afresh one as old as
            // half its period.
            let job = |now: i64, answer: u32| {
                computed(s, ("shape", "all"), month, now, async move {
                    Ok::<_, StoreError>(vec![answer])
                })
            };
            let kept_at = at + MAX_AGE_MS;
            let young = kept_at + FRESH_FOR_JOB_MS - 1;
            assert_eq!(job(young, 5).await.unwrap(), [4], "{b}: left as it is");
            let old = kept_at + FRESH_FOR_JOB_MS;
            assert_eq!(job(old, 5).await.unwrap(), [5], "{b}: computed afresh");
            assert_eq!(shape(old + 1, 6).await.unwrap(), [5], "{b}");
            // Once the month has ended, the count of rewrites alone decides: one computed
            // while it was under way is computed again.
            assert_eq!(shape(NOW, 7).await.unwrap(), [7], "{b}: ended");
            assert_eq!(shape(NOW + 1, 8).await.unwrap(), [7], "{b}: and kept");
        }
    }

    /// A section whose kept copy would read back as another value (a field its serialization
    /// skips) is never kept: tests fail on it, and a server logs it and computes it afresh.
    #[test]
    fn a_copy_that_would_differ_is_never_kept() {
        #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
        struct Lossy {
            shown: u32,
            #[serde(skip)]
            priced_on: Vec<f64>,
        }
        let whole = Lossy {
            shown: 1,
            priced_on: Vec::new(),
        };
        assert_eq!(copy_of("whole", &whole).as_deref(), Some(r#"{"shown":1}"#));
        let lossy = Lossy {
            shown: 1,
            priced_on: vec![2.5],
        };
        let refused = std::panic::catch_unwind(|| copy_of("lossy", &lossy));
        assert!(
            refused.is_err(),
            "a lossy copy fails the test that makes it"
        );
        // Floats read back bit for bit.
        let thirds: Vec<f64> = (1..50).map(|i| f64::from(i) / 3.0).collect();
        assert!(copy_of("thirds", &thirds).is_some());
    }

    #[test]
    fn the_key_tells_viewers_and_owner_dimensions_apart() {
        let schema = OwnerSchema::default();
        let team = Scope::teams(["search"]).unwrap();
        assert_eq!(
            key(&Scope::all(), &schema),
            key(&Scope::all(), &schema.clone())
        );
        assert_ne!(key(&Scope::all(), &schema), key(&team, &schema));
        let more: OwnerSchema =
            toml::from_str(r#"cost_center = { from = ["label:cost_center"] }"#).unwrap();
        assert_ne!(key(&Scope::all(), &schema), key(&Scope::all(), &more));
    }

    #[tokio::test]
    async fn whoever_asks_while_a_section_is_computed_waits_for_it() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Duration;
        for db in test_support::both().await {
            let store = db.open().await;
            let (s, b) = (store.as_ref(), db.backend);
            let computations = AtomicUsize::new(0);
            let slow = |answer: u32| {
                let computations = &computations;
                async move {
                    computations.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, StoreError>(vec![answer])
                }
            };
            let october = (OCTOBER, OCTOBER + 31 * DAY_MS);

            // Two first views at once: one computes, the other serves what it kept.
            let name = ("two-views", "all");
            let (first, second) = tokio::join!(
                kept(s, name, october, NOW, slow(1)),
                kept(s, name, october, NOW, slow(2)),
            );
            assert_eq!((first.unwrap(), second.unwrap()), (vec![1], vec![1]), "{b}");
            assert_eq!(computations.load(Ordering::SeqCst), 1, "{b}: computed once");

            // A view while the job computes: it waits and serves the job's.
            let name = ("job-and-view", "all");
            let (job, view) = tokio::join!(computed(s, name, october, NOW, slow(3)), async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                kept(s, name, october, NOW, slow(4)).await
            });
            assert_eq!((job.unwrap(), view.unwrap()), (vec![3], vec![3]), "{b}");
            assert_eq!(
                computations.load(Ordering::SeqCst),
                2,
                "{b}: the view computed nothing"
            );
        }
    }
}
