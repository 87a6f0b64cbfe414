//! History kept in partitions, PostgreSQL's own (migration 0041). Raw windows (`gpu_windows`,
//! `process_windows`) have one partition per UTC day. Hourly attribution (`rollup_hours`,
//! `rollup_host_hours`, `rollup_usage_hours`, `rollup_unattributed`) has one per UTC month.
//! Retention then drops a past day whole instead of deleting its rows, and a month's reads touch
//! only its partitions. SQLite has no partitions and keeps batched deletes: everything here does
//! nothing there.
//!
//! Each table also has a default partition, so that no row fails for want of one (a window from
//! an agent's spool older than the partitions made, a clock far ahead). `serve` calls
//! [`make_ahead`] before it takes its first report, and the hourly retention job under its lease:
//! it makes the partitions of the coming week and month before their rows arrive, and moves rows
//! waiting in a default partition into the partition it makes for them.
//!
//! A partition is made as a table of its own and then attached: ATTACH leaves the parent open
//! to reads, where `CREATE TABLE … PARTITION OF` would lock it whole. Attaching still holds up
//! ingest for its moment: it locks the default partition to check it holds none of the new
//! range (a read of the whole default), and `hosts` while it copies the windows' foreign key to
//! the new partition. For an empty default and a new partition that is milliseconds; moving a
//! backlog holds them longer, which is why `serve` leaves it to the job. Dropping a partition
//! locks the parent whole for a moment. Every statement here waits at most 5 s for its locks:
//! behind a long read the work is left for the next hour rather than holding up ingest queued
//! behind it. A report whose rows were routed to a default partition as the
//! partition for them was attached fails and is sent again (the API answers 503 for it, see
//! `error.rs`), as does one PostgreSQL picks to break a lock cycle with the job.

use chrono::{DateTime, Datelike};
use gpuledger_core::time::DAY_MS;

use super::db::Backend;
use super::{Db, StoreError};

/// Days made ahead of today: a week of hourly runs may fail before a day's rows land in the
/// default partition.
pub const DAYS_AHEAD: i64 = 7;

/// Most partitions one run makes, so that a backlog (rows of many old days waiting in a default
/// partition) is worked off over several runs, none long.
const MOST_MADE_PER_RUN: usize = 64;

/// How long a statement here waits for a lock before it gives up until the next run, for the
/// rest of its transaction.
const SET_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '5s'";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Span {
    Day,
    Month,
}

/// A partitioned table: by which column, by which span, and whether retention drops its old
/// partitions.
struct History {
    table: &'static str,
    column: &'static str,
    span: Span,
    retention_drops: bool,
}

const HISTORY: [History; 6] = [
    History {
        table: "gpu_windows",
        column: "start_ms",
        span: Span::Day,
        retention_drops: true,
    },
    History {
        table: "process_windows",
        column: "start_ms",
        span: Span::Day,
        retention_drops: true,
    },
    History {
        table: "rollup_hours",
        column: "hour_ms",
        span: Span::Month,
        retention_drops: false,
    },
    History {
        table: "rollup_host_hours",
        column: "hour_ms",
        span: Span::Month,
        retention_drops: false,
    },
    History {
        table: "rollup_usage_hours",
        column: "hour_ms",
        span: Span::Month,
        retention_drops: false,
    },
    History {
        table: "rollup_unattributed",
        column: "hour_ms",
        span: Span::Month,
        retention_drops: false,
    },
];

/// One partition and the range `[from_ms, to_ms)` it holds: `None` for an open end (the first
/// partition of a migrated table starts at MINVALUE), both `None` for the default partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    pub is_default: bool,
}

/// What one run of [`make_ahead`] or [`drop_before`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PartitionWork {
    /// Partitions made (or dropped), by name.
    pub partitions: Vec<String>,
    /// Rows moved out of default partitions into the partitions made for them.
    pub rows_moved: u64,
    /// Partitions left for the next run: a lock not had within 5 s, or another race (see
    /// `worth_trying_later`).
    pub left_for_later: Vec<String>,
}

/// The partitions of `table`, in the order of their ranges (the default last); empty on SQLite.
pub async fn partitions(db: &Db, table: &str) -> Result<Vec<Partition>, StoreError> {
    let mut conn = db.read().await?;
    let Backend::Postgres(c) = conn.backend() else {
        return Ok(Vec::new());
    };
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid)
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = to_regclass($1)",
    )
    .bind(table)
    .fetch_all(&mut *c)
    .await?;
    let mut parts = Vec::with_capacity(rows.len());
    for (name, bound) in rows {
        let part = parse_bound(&name, &bound)
            .ok_or_else(|| StoreError::Invalid(format!("partition {name}: bound {bound:?}")))?;
        parts.push(part);
    }
    parts.sort_by_key(|p| (p.is_default, p.from_ms.is_some(), p.from_ms));
    Ok(parts)
}

/// Reads PostgreSQL's text of a range partition's bound: `DEFAULT`, or
/// `FOR VALUES FROM ('1') TO ('2')` with `MINVALUE`/`MAXVALUE` for open ends.
fn parse_bound(name: &str, bound: &str) -> Option<Partition> {
    if bound == "DEFAULT" {
        return Some(Partition {
            name: name.to_owned(),
            from_ms: None,
            to_ms: None,
            is_default: true,
        });
    }
    let rest = bound.strip_prefix("FOR VALUES FROM (")?;
    let (from, rest) = rest.split_once(") TO (")?;
    let to = rest.strip_suffix(')')?;
    let value = |v: &str| -> Option<Option<i64>> {
        match v {
            "MINVALUE" | "MAXVALUE" => Some(None),
            quoted => quoted
                .strip_prefix('\'')?
                .strip_suffix('\'')?
                .parse()
                .ok()
                .map(Some),
        }
    };
    Some(Partition {
        name: name.to_owned(),
        from_ms: value(from)?,
        to_ms: value(to)?,
        is_default: false,
    })
}

/// The span that holds `ms`, as `[from, to)`.
fn span_of(span: Span, ms: i64) -> (i64, i64) {
    match span {
        Span::Day => {
            let from = ms.div_euclid(DAY_MS) * DAY_MS;
            (from, from + DAY_MS)
        }
        Span::Month => {
            let from = gpuledger_core::time::month_start_ms(ms);
            (from, gpuledger_core::time::next_month_start(from))
        }
    }
}

/// A partition's name: its table and the UTC day (`gpu_windows_20261127`) or month
/// (`rollup_hours_202611`) it holds.
fn partition_name(table: &str, span: Span, from_ms: i64) -> String {
    let day = DateTime::from_timestamp_millis(from_ms).unwrap_or_default();
    match span {
        Span::Day => format!("{table}_{}", day.format("%Y%m%d")),
        Span::Month => format!("{table}_{:04}{:02}", day.year(), day.month()),
    }
}

fn overlaps(part: &Partition, (from, to): (i64, i64)) -> bool {
    !part.is_default && part.from_ms.is_none_or(|f| f < to) && part.to_ms.is_none_or(|t| t > from)
}

/// Whether a statement lost a race the next run settles: `lock_timeout` ran out (55P03),
/// PostgreSQL broke a deadlock with a report being written (40P01), or another replica starting
/// at the same moment made the same partition (42P07).
fn worth_trying_later(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| matches!(code.as_ref(), "55P03" | "40P01" | "42P07"))
}

/// What [`make_ahead`] does with rows waiting in a default partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Make their spans' partitions and move them in: the hourly job.
    Move,
    /// Leave them, and their spans, to the job: `serve` before its first report, which must not
    /// wait on moving a backlog.
    Leave,
}

/// Makes the partitions of yesterday, today and the next [`DAYS_AHEAD`] days for raw windows, of
/// this month and the next for hourly attribution, and (with [`Waiting::Move`]) of every span
/// whose rows wait in a default partition, moving them in. Raw-window days that end before
/// `keep_from_ms` are not made: retention deletes their rows. Does nothing on SQLite.
pub async fn make_ahead(
    db: &Db,
    now_ms: i64,
    keep_from_ms: i64,
    waiting: Waiting,
) -> Result<PartitionWork, StoreError> {
    let mut work = PartitionWork::default();
    if db.backend() != "postgres" {
        return Ok(work);
    }
    for history in &HISTORY {
        if work.partitions.len() >= MOST_MADE_PER_RUN {
            break;
        }
        let existing = partitions(db, history.table).await?;
        let Some(default) = existing.iter().find(|p| p.is_default) else {
            continue; // not partitioned (migration 0041 not applied)
        };
        let mut wanted: Vec<(i64, i64)> = match history.span {
            // Yesterday too: on a new database, windows that straddle midnight arrive first.
            Span::Day => (-1..=DAYS_AHEAD)
                .map(|d| span_of(Span::Day, now_ms + d * DAY_MS))
                .collect(),
            Span::Month => {
                let this = span_of(Span::Month, now_ms);
                vec![this, span_of(Span::Month, this.1)]
            }
        };
        let mut waiting_spans: Vec<(i64, i64)> = waiting_days(db, &default.name, history.column)
            .await?
            .into_iter()
            .map(|day| span_of(history.span, day))
            .collect();
        match waiting {
            Waiting::Move => wanted.append(&mut waiting_spans),
            // Each attach reads the whole default partition to check it holds none of the new
            // range: with a backlog there, the job makes them.
            Waiting::Leave if !waiting_spans.is_empty() => continue,
            Waiting::Leave => {}
        }
        wanted.sort_unstable();
        wanted.dedup();
        // Not a range a partition already covers, nor a day retention is about to delete.
        let covered = |range: (i64, i64)| existing.iter().any(|p| overlaps(p, range));
        let past = |range: (i64, i64)| history.retention_drops && range.1 <= keep_from_ms;
        wanted.retain(|&range| !covered(range) && !past(range));
        let moved_before = work.rows_moved;
        for range in wanted {
            if work.partitions.len() >= MOST_MADE_PER_RUN {
                break;
            }
            let name = partition_name(history.table, history.span, range.0);
            match make_partition(db, history, &default.name, &name, range).await {
                Ok(moved) => {
                    work.partitions.push(name);
                    work.rows_moved += moved;
                }
                Err(StoreError::Database(e)) if worth_trying_later(&e) => {
                    work.left_for_later.push(name)
                }
                Err(e) => return Err(e),
            }
        }
        if work.rows_moved > moved_before {
            vacuum(db, &default.name).await?;
        }
    }
    if !work.partitions.is_empty() {
        analyze_parents(db).await?;
    }
    Ok(work)
}

/// Samples each partitioned table as a whole. Autovacuum analyzes partitions but never their
/// parent, whose statistics the planner takes for a join over the table; without them it
/// guesses. Once a day is enough: [`make_ahead`] calls it when it made a partition.
async fn analyze_parents(db: &Db) -> Result<(), StoreError> {
    let mut conn = db.write().await?;
    let Backend::Postgres(c) = conn.backend() else {
        return Ok(());
    };
    let tables: Vec<&str> = HISTORY.iter().map(|h| h.table).collect();
    sqlx::query(&format!("ANALYZE {}", tables.join(", ")))
        .execute(&mut *c)
        .await?;
    Ok(())
}

/// Vacuums a default partition rows were moved out of: until then their dead versions fill its
/// pages, and every look for rows waiting there (at each start, and each hour) reads them all:
/// after a backlog of a month of 100,000 GPUs, longer than a start may take.
async fn vacuum(db: &Db, default: &str) -> Result<(), StoreError> {
    let mut conn = db.write().await?;
    let Backend::Postgres(c) = conn.backend() else {
        return Ok(());
    };
    sqlx::query(&format!("VACUUM \"{default}\""))
        .execute(&mut *c)
        .await?;
    Ok(())
}

/// The UTC days of the rows waiting in a default partition.
async fn waiting_days(db: &Db, default: &str, column: &str) -> Result<Vec<i64>, StoreError> {
    let mut conn = db.read().await?;
    let Backend::Postgres(c) = conn.backend() else {
        return Ok(Vec::new());
    };
    let days: Vec<(i64,)> = sqlx::query_as(&format!(
        "SELECT DISTINCT floor({column} / {DAY_MS}.0)::BIGINT * {DAY_MS} FROM \"{default}\""
    ))
    .fetch_all(&mut *c)
    .await?;
    Ok(days.into_iter().map(|(d,)| d).collect())
}

/// Makes one partition in one transaction: a table like the parent, the default partition's
/// rows of its range moved in, then attached. Returns how many rows moved.
async fn make_partition(
    db: &Db,
    history: &History,
    default: &str,
    name: &str,
    (from, to): (i64, i64),
) -> Result<u64, StoreError> {
    let mut tx = db.begin().await?;
    let mut conn = tx.conn();
    let Backend::Postgres(c) = conn.backend() else {
        return Ok(0);
    };
    let (table, column) = (history.table, history.column);
    sqlx::query(SET_LOCK_TIMEOUT).execute(&mut *c).await?;
    // No row may land in the default partition between the move and the attach, which checks
    // that the default holds none of the new range. Ingest of other days goes on.
    sqlx::query(&format!("LOCK TABLE \"{default}\" IN EXCLUSIVE MODE"))
        .execute(&mut *c)
        .await?;
    sqlx::query(&format!(
        "CREATE TABLE \"{name}\" (LIKE \"{table}\" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    ))
    .execute(&mut *c)
    .await?;
    // The range as a CHECK, made while the table is empty and checked row by row as rows move
    // in, spares the attach a scan of them; the partition bound then replaces it.
    sqlx::query(&format!(
        "ALTER TABLE \"{name}\" ADD CONSTRAINT \"{name}_range\"
             CHECK ({column} IS NOT NULL AND {column} >= {from} AND {column} < {to})"
    ))
    .execute(&mut *c)
    .await?;
    let moved = sqlx::query(&format!(
        "WITH moved AS (DELETE FROM \"{default}\" WHERE {column} >= $1 AND {column} < $2
                        RETURNING *)
         INSERT INTO \"{name}\" SELECT * FROM moved"
    ))
    .bind(from)
    .bind(to)
    .execute(&mut *c)
    .await?
    .rows_affected();
    sqlx::query(&format!(
        "ALTER TABLE \"{table}\" ATTACH PARTITION \"{name}\" FOR VALUES FROM ({from}) TO ({to})"
    ))
    .execute(&mut *c)
    .await?;
    sqlx::query(&format!(
        "ALTER TABLE \"{name}\" DROP CONSTRAINT \"{name}_range\""
    ))
    .execute(&mut *c)
    .await?;
    drop(conn);
    tx.commit().await?;
    Ok(moved)
}

/// Drops the raw-window partitions that hold only windows before `before_ms` (the first
/// partition of a migrated table included, once its bound is passed). Rows before `before_ms`
/// in partitions that straddle it, or in the default partition, are left to the batched delete.
/// Does nothing on SQLite.
pub async fn drop_before(db: &Db, before_ms: i64) -> Result<PartitionWork, StoreError> {
    let mut work = PartitionWork::default();
    if db.backend() != "postgres" {
        return Ok(work);
    }
    for history in HISTORY.iter().filter(|h| h.retention_drops) {
        for part in partitions(db, history.table).await? {
            if part.is_default || part.to_ms.is_none_or(|to| to > before_ms) {
                continue;
            }
            let mut tx = db.begin().await?;
            let mut conn = tx.conn();
            let Backend::Postgres(c) = conn.backend() else {
                return Ok(work);
            };
            let dropped = async {
                sqlx::query(SET_LOCK_TIMEOUT).execute(&mut *c).await?;
                sqlx::query(&format!("DROP TABLE \"{}\"", part.name))
                    .execute(&mut *c)
                    .await
            }
            .await;
            drop(conn);
            match dropped {
                Ok(_) => {
                    tx.commit().await?;
                    work.partitions.push(part.name);
                }
                Err(e) if worth_trying_later(&e) => work.left_for_later.push(part.name),
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(work)
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn bounds_read_as_postgresql_writes_them() {
        let p = parse_bound(
            "gpu_windows_20261127",
            "FOR VALUES FROM ('1795737600000') TO ('1795824000000')",
        )
        .unwrap();
        assert_eq!(
            (p.from_ms, p.to_ms),
            (Some(1_795_737_600_000), Some(1_795_824_000_000))
        );
        let first = parse_bound("x", "FOR VALUES FROM (MINVALUE) TO ('100')").unwrap();
        assert_eq!(
            (first.from_ms, first.to_ms, first.is_default),
            (None, Some(100), false)
        );
        assert!(parse_bound("x", "DEFAULT").unwrap().is_default);
        assert!(parse_bound("x", "FOR VALUES IN ('a')").is_none());
    }

    #[test]
    fn partitions_are_named_by_their_utc_day_or_month() {
        let day = 1_795_737_600_000; // 2026-11-27T00:00:00Z
        assert_eq!(span_of(Span::Day, day + 5), (day, day + DAY_MS));
        assert_eq!(
            partition_name("gpu_windows", Span::Day, day),
            "gpu_windows_20261127"
        );
        let (from, to) = span_of(Span::Month, day);
        assert_eq!(
            partition_name("rollup_hours", Span::Month, from),
            "rollup_hours_202611"
        );
        assert_eq!(
            partition_name("rollup_hours", Span::Month, to),
            "rollup_hours_202612"
        );
    }
}
