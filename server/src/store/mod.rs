//! Storage, SQLite (the embedded default) and PostgreSQL (production, shared by several server
//! replicas), chosen by URL scheme.
//!
//! One module per concern (`accounts`, `alerts`, `bills`, `closing`, `jobs`, `ledger`,
//! `recommendations`, `rollups`, `telemetry`, `tokens`, `usage`), each a set of plain functions
//! that take a [`db::On`]: the database (a pooled connection per call) or a connection of an open
//! [`db::Tx`], so a caller can make calls of several concerns one change. Each body is written
//! once and checked once per backend ([`db::on_backend`]): both run the same SQL where the
//! dialects agree (`$N` placeholders work on both through sqlx). What a backend does its own way
//! stays in its file: the one-statement PostgreSQL ingest, SQLite's writer turn, the roll-up's
//! read settings ([`Dialect`]), and each backend's migrations folder. PostgreSQL's history
//! partitions have a module of their own (`partitions`); on SQLite its functions do nothing.
//!
//! The [`Store`] trait is what is left to each backend: its name, its [`Db`], and ingest.
//! The contract tests in `tests/` run every case on both backends so they cannot drift apart.

pub mod accounts;
pub mod alerts;
pub mod anomalies;
pub mod bills;
pub mod budgets;
pub mod closing;
pub mod db;
pub mod exports;
mod group_commit;
pub mod idle;
pub use group_commit::GroupCounters;
pub mod jobs;
pub mod ledger;
pub mod partitions;
mod postgres;
pub mod read_tokens;
pub mod recommendations;
pub mod replica;
mod report_rows;
pub mod rollups;
pub mod sections;
mod sqlite;
pub mod telemetry;
#[cfg(test)]
mod tests;
pub mod tokens;
pub mod usage;

use std::sync::Arc;

use async_trait::async_trait;
use gpuledger_proto::Report;

use bills::{BillLine, BillingFilePeriodRow, BillingImportRow};
use closing::{RestatementRow, SignOffRow};
use db::{Db, Dialect};
use ledger::{CurrencyCostRow, ExperimentDayRow};
pub use postgres::PostgresStore;
use rollups::{DirtyMark, UnattributedRow, UsageRow};
pub use sqlite::SqliteStore;
use telemetry::{FleetProcess, FleetRow, StoredGpuWindow};
// The read models attribution takes are the core's: storage fills them.
use gpuledger_core::bill::StoredCostLine;
use gpuledger_core::telemetry::{AttributionWindow, HostRow, StoredProcessWindow, UsageTotal};
use tokens::{Refusal, RefusalKind};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0} already exists")]
    Conflict(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported database URL {0:?}: use sqlite:PATH or postgres://...")]
    UnsupportedUrl(String),
    #[error("{0}")]
    Invalid(String),
    /// A bill file was refused while being stored: nothing of the import was kept.
    #[error("{file}: {error}")]
    Rejected {
        file: String,
        error: gpuledger_core::bill::FocusError,
    },
}

/// What the agent said about itself beside the report (spool headers).
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentStatus {
    pub spool_depth: Option<i64>,
    pub spool_dropped: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngestOutcome {
    Stored,
    /// This batch was stored before, from the same token with the same content; nothing changed.
    Duplicate,
    /// Refused because of who sent it or what was already stored; nothing was stored.
    Refused(Refusal),
}

/// One rolled-up slice of attributed cost: a host's GPU, owner, kind and price for an hour or a
/// day. `gpu_uuid` is `""` when absent; cost is [`gpuledger_core::money::to_nano_atto`].
/// Serialized (as a closed range's rows are kept, [`crate::sections`]) bit for bit.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize, serde::Deserialize)]
pub struct RollupRow {
    pub period_ms: i64,
    pub host_id: i64,
    pub gpu_uuid: String,
    /// The owner as [`gpuledger_core::owners::Owner::key`] writes it (kept once in `owners`).
    pub owner: String,
    pub kind: String,
    pub pricing_category: String,
    pub currency: String,
    pub estimated: i64,
    pub cost_nano: i64,
    pub cost_atto: i64,
    #[serde(with = "exact_f64")]
    pub gpu_seconds: f64,
    #[serde(with = "exact_f64")]
    pub util_gpu_seconds: f64,
    #[serde(with = "exact_f64")]
    pub util_known_seconds: f64,
    #[serde(with = "exact_f64")]
    pub energy_j: f64,
    /// GPU-seconds whose energy NVML measured.
    #[serde(with = "exact_f64")]
    pub energy_known_seconds: f64,
}

/// A float written as its bits: read back from JSON exactly, where a decimal text may come back
/// one unit in the last place off (serde_json's default parsing), so that kept rows sum to what
/// the database's did.
pub(crate) mod exact_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(value.to_bits())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        u64::deserialize(d).map(f64::from_bits)
    }
}

/// Which rollup table to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollupGrain {
    Hour,
    Day,
    /// Hourly rows whose owner has a value in this dimension (the experiment's: what training
    /// runs need, and no more), summed over each host's GPUs: no GPU, utilisation or energy in
    /// the row (the hours summed per host keep none).
    OwnerHour(&'static str),
    /// Daily rows summed over each host's GPUs (no GPU in the row).
    HostDay,
    /// The daily rows of the whole range summed per host by the database, a row per host and
    /// owner rather than per host, owner and day (each row's period is the range's first day;
    /// days without GPU time summed apart from those with it): for figures of a whole range,
    /// such as a month's tables, totals and variance.
    HostRange,
    /// [`RollupGrain::HostRange`] summed once more over hosts alike in all but name (cluster,
    /// provider, region, instance type, lifecycle, billed or not), a row per such group and
    /// owner standing on the group's lowest host id: every figure that groups by a host's
    /// attributes or its owner is the same, with a row per group where a fleet of 100,000 GPUs
    /// has one per host. Not for a reader who needs hosts themselves (a team's held hosts).
    HostGroupRange,
}

/// A host's idle (or held-idle) cost in one hour for one owner, of one price, summed by the
/// roll-up over its GPUs: what the idle history reads (a row per host-hour and owner, where the
/// hourly rollups hold one per GPU).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct IdleHourRow {
    pub hour_ms: i64,
    pub host_id: i64,
    pub kind: String,
    pub currency: String,
    /// 1 if it is a rate-card estimate.
    pub estimated: i64,
    pub cost_nano: i64,
    pub cost_atto: i64,
    /// The GPUs that carried it, a JSON array of texts (`""` for cost on no GPU).
    pub gpus: String,
    /// Its owner's text.
    pub owner: String,
}

impl RollupGrain {
    /// Whether rows of this grain stand for days (else hours).
    pub fn is_daily(self) -> bool {
        matches!(
            self,
            RollupGrain::Day
                | RollupGrain::HostDay
                | RollupGrain::HostRange
                | RollupGrain::HostGroupRange
        )
    }
}

/// The host id that marks hours changed by a bill rather than by a host's report.
pub const BILLING_MARK_HOST: i64 = 0;

/// How many of a new file's first lines are compared with the files already in force.
pub const REPEAT_SAMPLE_LINES: u32 = 1_000;

/// One file's lines in one billing period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeriodTotals {
    pub rows: u64,
    pub billed: rust_decimal::Decimal,
    pub effective: rust_decimal::Decimal,
}

impl PeriodTotals {
    fn add(&mut self, l: &gpuledger_core::bill::CostLine) {
        self.rows += 1;
        self.billed += l.billed_cost;
        self.effective += l.effective_cost;
    }
}

/// An import's totals in each currency its lines were billed in: never added across
/// currencies.
pub type CurrencyTotals = std::collections::BTreeMap<String, PeriodTotals>;

/// A file's (provider, billing account, billing period, currency)s with its lines in each: a
/// file covers a handful, so a list beats a map.
pub type FilePeriods = Vec<((String, String, i64, String), PeriodTotals)>;

/// Which earlier files a newly imported bill replaces, in the (provider, billing account,
/// billing period) triples its lines cover. Files never replace other periods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaces {
    /// An earlier file of the same name and source: the same part delivered again. A file of
    /// another name adds to the period (part 2 of a multi-part export, an incremental report).
    SameName,
    /// Every earlier file: the files imported together are the whole of their periods (an
    /// export run's manifest, a Cost Explorer sync, `--whole-periods`).
    WholePeriods,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportOutcome {
    Imported {
        import_id: i64,
        replaced_lines: u64,
        rows: u64,
        /// Per currency: a bill in dollars and euros has two totals, never one.
        totals: CurrencyTotals,
    },
    /// The same content was imported before; nothing changed.
    AlreadyImported { import_id: i64 },
}

/// What attributing a group of hosts reads: their GPU windows and their GPUs' process windows.
pub type AttributionInputs = (Vec<AttributionWindow>, Vec<StoredProcessWindow>);

#[async_trait]
pub trait Store: Send + Sync {
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;
    /// The database itself, for the storage functions of the modules split out by concern.
    fn db(&self) -> &Db;
    /// Where what is computed from reads is kept: the database itself, or a read replica's
    /// primary (a replica takes no writes).
    fn primary(&self) -> &Db {
        self.db()
    }
    /// Whether reads may lag what was written (a read replica): what is kept from them then
    /// needs a guard that a newer write wins.
    fn is_replica(&self) -> bool {
        false
    }
    async fn ping(&self) -> Result<(), StoreError>;

    /// This replica's ingest groups so far (see `group_commit`).
    fn ingest_groups(&self) -> &GroupCounters;

    /// Stores a validated report in one transaction, at most once per batch id.
    async fn ingest(
        &self,
        report: &Report,
        token_id: i64,
        agent: AgentStatus,
        now_ms: i64,
    ) -> Result<IngestOutcome, StoreError>;
}

/// Opens the database named by `url` and brings its schema, and data older than it, up to date.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    let store: Arc<dyn Store> = if url.starts_with("sqlite:") {
        Arc::new(SqliteStore::connect(url).await?)
    } else if is_postgres_url(url) {
        Arc::new(PostgresStore::connect(url).await?)
    } else {
        return Err(StoreError::UnsupportedUrl(redacted_url(url)));
    };
    bills::backfill_file_period_totals(store.db()).await?;
    Ok(store)
}

fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The database URL as it may appear in logs and error messages: a password in it (in the
/// user part or a `password=` parameter) is replaced by `***`.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Converts a byte or counter value that validation has already bounded.
/// The hours (UTC starts) that charge periods touch (`core::bill::charge_hours`), each period
/// capped at 400 days so an odd line cannot mark a century.
pub(crate) fn hours_of_spans(spans: &[(i64, i64)]) -> Vec<i64> {
    use gpuledger_core::time::DAY_MS;
    const MAX_SPAN_MS: i64 = 400 * DAY_MS;
    let mut hours = std::collections::BTreeSet::new();
    for &(start, end) in spans {
        hours.extend(gpuledger_core::bill::charge_hours(
            start,
            end.min(start.saturating_add(MAX_SPAN_MS)),
        ));
    }
    hours.into_iter().collect()
}

pub(crate) fn to_i64(v: Option<u64>) -> Option<i64> {
    v.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

/// A closure from a row read as a tuple of columns (in field order) to a core type with those
/// fields: the core's read models know no database, so they derive no row mapping.
macro_rules! from_columns {
    ($ty:path { $($field:ident),+ $(,)? }) => {
        |($($field,)+)| -> $ty { $ty { $($field),+ } }
    };
}
pub(crate) use from_columns;

/// The cost lines a range `[$1, $2)` reads: attribution and the FOCUS export read the same
/// ones, so the export adds up to what was attributed.
macro_rules! cost_lines_in_range_sql {
    () => {
        "FROM cost_lines
         WHERE charge_period_start_ms < $2 AND charge_period_end_ms > $1
         ORDER BY charge_period_start_ms, id"
    };
}
pub(crate) use cost_lines_in_range_sql;

/// SQL both backends' ingest runs, as literals so `concat!` can build larger statements.
/// The host upsert's columns: `$1..$12` as [`bind_host!`] binds them, then the token's id.
macro_rules! host_columns_sql {
    () => {
        "INSERT INTO hosts (cluster, hostname, provider, instance_id, instance_type, region,
                            agent_version, last_report_ms, spool_depth, spool_dropped,
                            instance_key, lifecycle, token_id) "
    };
}
pub(crate) use host_columns_sql;

/// What a report changes on a known host. The host is updated only for the token it is bound
/// to, or for any token once that one is revoked or expired (the new one takes the host); else
/// nothing is written and the caller finds out why (`ingest_refusal_sql`). `$8` is now.
macro_rules! host_on_conflict_sql {
    () => {
        $crate::store::host_on_conflict_sql!("$8")
    };
    // `$now`: where the statement has now, when not in `$8`.
    ($now:literal) => {
        concat!(
            "ON CONFLICT (cluster, hostname) DO UPDATE SET
            provider = COALESCE(excluded.provider, hosts.provider),
            instance_id = COALESCE(excluded.instance_id, hosts.instance_id),
            instance_key = COALESCE(excluded.instance_key, hosts.instance_key),
            lifecycle = COALESCE(excluded.lifecycle, hosts.lifecycle),
            instance_type = COALESCE(excluded.instance_type, hosts.instance_type),
            region = COALESCE(excluded.region, hosts.region),
            agent_version = excluded.agent_version,
            last_report_ms = CASE WHEN excluded.last_report_ms > hosts.last_report_ms
                                  THEN excluded.last_report_ms ELSE hosts.last_report_ms END,
            spool_depth = COALESCE(excluded.spool_depth, hosts.spool_depth),
            spool_dropped = COALESCE(excluded.spool_dropped, hosts.spool_dropped),
            token_id = excluded.token_id
         WHERE (hosts.token_id IS NULL OR hosts.token_id = excluded.token_id
                OR NOT EXISTS (SELECT 1 FROM api_tokens t WHERE t.id = hosts.token_id AND ",
            $crate::store::tokens::token_active_sql!("t", $now),
            "))"
        )
    };
}
pub(crate) use host_on_conflict_sql;

/// Binds [`host_columns_sql!`]'s `$1..$12` for a report.
macro_rules! bind_host {
    ($query:expr, $report:expr, $agent:expr, $now_ms:expr) => {{
        let h = &$report.host;
        $query
            .bind(&h.cluster)
            .bind(&h.hostname)
            .bind(&h.provider)
            .bind(&h.instance_id)
            .bind(&h.instance_type)
            .bind(&h.region)
            .bind(&$report.agent_version)
            .bind($now_ms)
            .bind($agent.spool_depth)
            .bind($agent.spool_dropped)
            .bind(
                h.instance_id
                    .as_deref()
                    .map(gpuledger_core::bill::normalize_resource_id),
            )
            .bind(&h.lifecycle)
    }};
}
pub(crate) use bind_host;

/// A GPU's row is rewritten only when what it is or where it sits changed (it moved host, a MIG
/// layout changed), not on every report: its latest state is read from its newest window.
macro_rules! gpu_identity_on_conflict_sql {
    () => {
        "ON CONFLICT (uuid) DO UPDATE SET
            host_id = excluded.host_id,
            gpu_index = excluded.gpu_index,
            name = excluded.name,
            parent_uuid = excluded.parent_uuid,
            memory_total_bytes = excluded.memory_total_bytes
         WHERE gpus.host_id IS DISTINCT FROM excluded.host_id
            OR gpus.gpu_index IS DISTINCT FROM excluded.gpu_index
            OR gpus.name IS DISTINCT FROM excluded.name
            OR gpus.parent_uuid IS DISTINCT FROM excluded.parent_uuid
            OR gpus.memory_total_bytes IS DISTINCT FROM excluded.memory_total_bytes"
    };
}
pub(crate) use gpu_identity_on_conflict_sql;

/// Marking an hour again bumps its generation (see [`DirtyMark`]).
macro_rules! dirty_mark_on_conflict_sql {
    () => {
        "ON CONFLICT (hour_ms, host_id)
         DO UPDATE SET generation = rollup_dirty_hours.generation + 1"
    };
}
pub(crate) use dirty_mark_on_conflict_sql;

/// A report's serving counts add to the hour's (the batch id makes a report count once); a
/// count either side does not know leaves the sum unknown.
macro_rules! serving_on_conflict_sql {
    () => {
        "ON CONFLICT (host_id, endpoint, model, hour_ms) DO UPDATE SET
            engine = excluded.engine,
            requests = serving_counts.requests + excluded.requests,
            input_tokens = serving_counts.input_tokens + excluded.input_tokens,
            output_tokens = serving_counts.output_tokens + excluded.output_tokens"
    };
}
pub(crate) use serving_on_conflict_sql;

/// The whole `Store` impl for a backend type with a `pool`, its `db` and the `group` of ingest
/// writers (SQLite's take the one writer's turn; PostgreSQL's need none).
macro_rules! store_impl {
    ($store:ty, $name:literal) => {
        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            fn backend(&self) -> &'static str {
                $name
            }
            fn db(&self) -> &$crate::store::Db {
                &self.db
            }
            async fn ping(&self) -> Result<(), $crate::store::StoreError> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }
            fn ingest_groups(&self) -> &$crate::store::GroupCounters {
                &self.group.counters
            }
            async fn ingest(
                &self,
                report: &gpuledger_proto::Report,
                token_id: i64,
                agent: $crate::store::AgentStatus,
                now_ms: i64,
            ) -> Result<$crate::store::IngestOutcome, $crate::store::StoreError> {
                let content_sha256 = $crate::store::report_rows::content_sha256(report)?;
                // Written with the reports queued beside it (see group_commit), each backend its
                // own way: all of a report or (a repeat, a refusal) none of it.
                self.group
                    .ingest($crate::store::group_commit::Job {
                        report: report.clone(),
                        token_id,
                        content_sha256,
                        agent,
                        now_ms,
                    })
                    .await
            }
        }
    };
}
pub(crate) use store_impl;
