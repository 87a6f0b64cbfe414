//! Storage: one [`Store`] trait, with a SQLite implementation (the embedded default) and a
//! PostgreSQL one (production, shared by several server replicas), chosen by URL scheme.
//!
//! Both run the same SQL where the dialects agree (`$N` placeholders work on both through sqlx);
//! each backend owns its migrations folder. The contract tests in `tests.rs` run every case on
//! both backends so they cannot drift apart.

mod postgres;
mod report_rows;
mod sqlite;
#[cfg(test)]
mod tests;
mod tokens;

use std::sync::Arc;

use async_trait::async_trait;
use gpuledger_proto::Report;

pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;
pub(crate) use tokens::{token_active_sql, token_columns_sql, token_sql_impl};
pub use tokens::{NewToken, Refusal, RefusalKind, RefusalRow, TokenRow};

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
        error: crate::billing::focus::FocusError,
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

/// One GPU on the fleet page, with its host.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct FleetRow {
    pub cluster: String,
    pub hostname: String,
    pub instance_type: Option<String>,
    pub last_report_ms: i64,
    pub spool_depth: Option<i64>,
    pub uuid: Option<String>,
    pub gpu_index: Option<i64>,
    pub name: Option<String>,
    pub parent_uuid: Option<String>,
    pub memory_total_bytes: Option<i64>,
    pub last_util_avg: Option<f64>,
    pub last_memory_used_bytes: Option<i64>,
    pub last_window_end_ms: Option<i64>,
}

/// A process in the latest window of its GPU.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct FleetProcess {
    pub gpu_uuid: String,
    pub pid: i64,
    pub process_name: Option<String>,
    pub memory_used_max_bytes: Option<i64>,
    pub sm_util_avg: Option<f64>,
    pub labels_json: String,
    pub user_name: Option<String>,
}

/// A stored GPU window, as read back.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredGpuWindow {
    pub gpu_uuid: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub samples: i64,
    pub memory_total_bytes: Option<i64>,
    pub memory_used_max_bytes: Option<i64>,
    pub util_avg: Option<f64>,
    pub util_max: Option<f64>,
    /// Samples per utilization percent, as the sender reported them (JSON).
    pub util_histogram: Option<String>,
    pub mem_util_avg: Option<f64>,
    pub power_avg_watts: Option<f64>,
    pub temperature_max_c: Option<f64>,
    pub energy_mj: Option<i64>,
}

/// One rolled-up slice of attributed cost: a host's GPU, owner, kind and price for an hour or a
/// day. Owner labels and `gpu_uuid` are `""` when absent; cost is [`gpuledger_core::money::to_nano_atto`].
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RollupRow {
    pub period_ms: i64,
    pub host_id: i64,
    pub gpu_uuid: String,
    pub model: String,
    pub experiment: String,
    pub endpoint: String,
    pub team: String,
    pub kind: String,
    pub pricing_category: String,
    pub currency: String,
    pub estimated: i64,
    pub cost_nano: i64,
    pub cost_atto: i64,
    pub gpu_seconds: f64,
    pub util_gpu_seconds: f64,
    pub util_known_seconds: f64,
    pub energy_j: f64,
}

/// How one endpoint or model used one GPU in an hour or a day: its GPU windows in one 5-point
/// band of GPU utilization and the most GPU memory one of its processes held there.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UsageRow {
    pub period_ms: i64,
    pub host_id: i64,
    pub gpu_uuid: String,
    /// `endpoint` or `model`.
    pub owner_by: String,
    pub owner_key: String,
    /// `floor(utilization / 5)`, 0 to 20; -1 for windows without utilization.
    pub util_band: i64,
    pub windows: i64,
    pub peak_memory_bytes: i64,
}

/// [`UsageRow`]s summed over a range, with the GPU's model from its latest report.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UsageTotal {
    pub host_id: i64,
    pub gpu_uuid: String,
    pub owner_by: String,
    pub owner_key: String,
    pub util_band: i64,
    pub windows: i64,
    pub peak_memory_bytes: i64,
    pub gpu_name: Option<String>,
    pub memory_total_bytes: Option<i64>,
    /// Set for a MIG instance.
    pub parent_uuid: Option<String>,
}

/// Cost in an hour on bill lines that match no GPU host.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UnattributedRow {
    pub hour_ms: i64,
    pub currency: String,
    pub cost_nano: i64,
    pub cost_atto: i64,
}

/// The hours in one day in which an experiment label had GPU work (busy or held idle).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ExperimentDayRow {
    pub day_ms: i64,
    pub experiment: String,
    pub first_hour_ms: i64,
    pub last_hour_ms: i64,
    pub hours: i64,
}

/// Attributed cost in a currency over a range, summed in SQL.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CurrencyCostRow {
    pub currency: String,
    pub cost_nano: i64,
    pub cost_atto: i64,
}

/// A month signed off by a finance lead: its bill is final, so it closed then.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SignOffRow {
    pub month_ms: i64,
    pub signed_ms: i64,
    pub by_user: String,
    pub note: String,
}

/// A closed month's figures restated: per team (and the unattributed buckets), before and after.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RestatementRow {
    pub month_ms: i64,
    pub created_ms: i64,
    pub reason: String,
    pub before_json: String,
    pub after_json: String,
}

/// An hour to roll up again, with the generation of each mark read.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DirtyMark {
    pub hour_ms: i64,
    pub host_id: i64,
    pub generation: i64,
}

/// Which rollup table to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollupGrain {
    Hour,
    Day,
    /// Hourly rows that carry an experiment label: what training runs need, and no more.
    ExperimentHour,
    /// Daily rows summed over each host's GPUs (no GPU in the row).
    HostDay,
    /// Hourly rows of idle and held-idle cost: what the idle history needs, and no more.
    IdleHour,
}

impl RollupGrain {
    /// Whether rows of this grain stand for days (else hours).
    pub fn is_daily(self) -> bool {
        matches!(self, RollupGrain::Day | RollupGrain::HostDay)
    }
}

/// The host id that marks hours changed by a bill rather than by a host's report.
pub const BILLING_MARK_HOST: i64 = 0;

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredProcessWindow {
    pub gpu_uuid: String,
    pub start_ms: i64,
    pub pid: i64,
    pub process_name: Option<String>,
    pub memory_used_max_bytes: Option<i64>,
    pub sm_util_avg: Option<f64>,
    pub model: Option<String>,
    pub experiment: Option<String>,
    pub endpoint: Option<String>,
    pub team: Option<String>,
    pub labels_json: String,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// The Unix account running the process, where the agent reported it.
    pub user_name: Option<String>,
}

/// A bill about to be stored.
#[derive(Debug, Clone)]
pub struct NewImport {
    pub source: String,
    pub name: String,
    pub content_sha256: String,
    pub imported_ms: i64,
    /// The export run the file came in (a manifest's execution or assembly id), if known.
    pub delivery: Option<String>,
}

/// How many of a new file's first lines are compared with the files already in force.
pub const REPEAT_SAMPLE_LINES: u32 = 1_000;

/// One file's lines in one billing period.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PeriodTotals {
    pub rows: u64,
    pub billed: rust_decimal::Decimal,
    pub effective: rust_decimal::Decimal,
}

impl PeriodTotals {
    fn add(&mut self, l: &crate::billing::CostLine) {
        self.rows += 1;
        self.billed += l.billed_cost;
        self.effective += l.effective_cost;
    }
}

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

/// One file's share of one billing period, for the billing page.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BillingFilePeriodRow {
    pub import_id: i64,
    pub name: String,
    pub source: String,
    pub imported_ms: i64,
    pub delivery: Option<String>,
    pub provider: String,
    pub billing_account_id: String,
    pub billing_period_start_ms: i64,
    pub currency: String,
    pub row_count: i64,
    pub billed_total: Option<String>,
    pub effective_total: Option<String>,
    pub replaced_ms: Option<i64>,
    pub replaced_by: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportOutcome {
    Imported {
        import_id: i64,
        replaced_lines: u64,
        rows: u64,
        billed_total: rust_decimal::Decimal,
        effective_total: rust_decimal::Decimal,
    },
    /// The same content was imported before; nothing changed.
    AlreadyImported { import_id: i64 },
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BillingImportRow {
    pub id: i64,
    pub source: String,
    pub name: String,
    pub imported_ms: i64,
    pub row_count: i64,
    pub billed_total: String,
    pub effective_total: String,
    /// Lines of this import still in force (a newer export of a period replaces them).
    pub current_lines: i64,
}

/// A stored cost line, as attribution reads it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredCostLine {
    pub resource_key: Option<String>,
    pub charge_period_start_ms: i64,
    pub charge_period_end_ms: i64,
    pub charge_category: String,
    pub billed_cost: String,
    pub effective_cost: String,
    pub currency: String,
    pub pricing_category: String,
    pub instance_type: Option<String>,
}

/// A stored cost line with every column it came with, for the FOCUS export.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BillLine {
    pub provider: String,
    pub billing_account_id: String,
    pub billing_period_start_ms: i64,
    pub charge_period_start_ms: i64,
    pub charge_period_end_ms: i64,
    pub charge_category: String,
    pub resource_id: Option<String>,
    pub resource_key: Option<String>,
    pub billed_cost: String,
    pub effective_cost: String,
    pub list_cost: String,
    pub currency: String,
    pub pricing_category: String,
    pub commitment_discount_id: Option<String>,
    pub commitment_discount_status: Option<String>,
    pub service_name: Option<String>,
    pub sku_id: Option<String>,
    pub region: Option<String>,
    pub tags_json: String,
    pub extra_json: String,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct HostRow {
    pub id: i64,
    pub cluster: String,
    pub hostname: String,
    pub provider: Option<String>,
    pub instance_id: Option<String>,
    pub instance_key: Option<String>,
    pub instance_type: Option<String>,
    /// on_demand or spot, where the agent knows.
    pub lifecycle: Option<String>,
}

/// What attributing a group of hosts reads: their GPU windows and their GPUs' process windows.
pub type AttributionInputs = (Vec<AttributionWindow>, Vec<StoredProcessWindow>);

/// A GPU window with its host, for attribution.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AttributionWindow {
    pub host_id: i64,
    pub gpu_uuid: String,
    pub parent_uuid: Option<String>,
    pub gpu_name: Option<String>,
    pub start_ms: i64,
    pub end_ms: i64,
    pub memory_total_bytes: Option<i64>,
    pub util_avg: Option<f64>,
    /// Samples per utilization percent (`[[percent, samples], …]` JSON), where measured: splits
    /// a partly busy window ([`gpuledger_core::activity::Thresholds::split`]).
    pub util_histogram: Option<String>,
    /// Energy inside the window (NVML's counter, physical GPUs only).
    pub energy_mj: Option<i64>,
}

/// Requests an endpoint served in `[start_ms, end_ms)`, as counted by one source.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageCount {
    pub endpoint: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub requests: i64,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UserRow {
    pub id: i64,
    pub username: String,
    pub password_hash: String,
    pub role: String,
    pub created_ms: i64,
}

/// A live session with its user.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SessionRow {
    pub user_id: i64,
    pub username: String,
    pub role: String,
    pub csrf_token: String,
    pub expires_ms: i64,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct IncidentRow {
    pub id: i64,
    pub incident_key: String,
    pub kind: String,
    pub cluster: String,
    pub hostname: Option<String>,
    pub gpus_json: String,
    pub owners_json: String,
    /// [`crate::waste::IdleDevice`]s: each GPU with its host, index and held-idle processes.
    pub devices_json: String,
    pub started_ms: i64,
    pub ended_ms: Option<i64>,
    pub last_seen_ms: i64,
    pub cost_per_hour: String,
    pub estimated: i64,
    pub wasted: String,
    pub last_notified_ms: Option<i64>,
}

/// An incident as the evaluator writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct IncidentUpdate {
    pub incident_key: String,
    pub kind: String,
    pub cluster: String,
    pub hostname: Option<String>,
    pub gpus_json: String,
    pub owners_json: String,
    pub devices_json: String,
    pub started_ms: i64,
    pub last_seen_ms: i64,
    pub cost_per_hour: String,
    pub estimated: bool,
    pub wasted: String,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SlackMessageRow {
    pub id: i64,
    pub incident_id: Option<i64>,
    pub event: String,
    pub route: String,
    pub payload: String,
    pub created_ms: i64,
    pub status: String,
    pub attempts: i64,
    pub next_attempt_ms: i64,
    pub last_error: Option<String>,
    pub sent_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SnoozeRow {
    pub cluster: String,
    pub until_ms: i64,
    pub by_user: String,
}

#[async_trait]
pub trait Store: Send + Sync {
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;
    async fn ping(&self) -> Result<(), StoreError>;

    async fn create_token(&self, token: &NewToken<'_>, now_ms: i64) -> Result<(), StoreError>;
    async fn list_tokens(&self) -> Result<Vec<TokenRow>, StoreError>;
    async fn token_by_name(&self, name: &str) -> Result<Option<TokenRow>, StoreError>;
    /// Returns whether an active token by that name was revoked.
    async fn revoke_token(&self, name: &str, now_ms: i64) -> Result<bool, StoreError>;
    /// Gives an active token a new secret; the old one keeps working until
    /// `old_valid_until_ms`. Returns whether an active token by that name was found.
    async fn rotate_token(
        &self,
        name: &str,
        new_hash: &str,
        old_valid_until_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError>;
    /// The active (neither revoked nor expired) token with this secret's hash, or the previous
    /// secret's during its overlap.
    async fn active_token(&self, hash: &str, now_ms: i64) -> Result<Option<TokenRow>, StoreError>;
    /// Records that a token was used, and from where.
    async fn touch_token(
        &self,
        token_id: i64,
        now_ms: i64,
        address: Option<&str>,
    ) -> Result<(), StoreError>;
    /// The clusters of the hosts bound to a token.
    async fn token_clusters(&self, token_id: i64) -> Result<Vec<String>, StoreError>;
    /// Scopes a token made before scopes existed, which never reported, to the first cluster
    /// it reports. Returns whether it did.
    async fn adopt_token_cluster(&self, token_id: i64, cluster: &str) -> Result<bool, StoreError>;
    /// Binds a host to a token. Returns whether the host exists.
    async fn rebind_host(
        &self,
        cluster: &str,
        hostname: &str,
        token_id: i64,
    ) -> Result<bool, StoreError>;
    /// Counts a refused report for the fleet page.
    async fn record_refusal(
        &self,
        token_id: i64,
        cluster: &str,
        hostname: &str,
        refusal: &Refusal,
        now_ms: i64,
    ) -> Result<(), StoreError>;
    /// Refused reports seen since `since_ms`, newest first.
    async fn ingest_refusals(&self, since_ms: i64) -> Result<Vec<RefusalRow>, StoreError>;

    /// Stores a validated report in one transaction, at most once per batch id.
    async fn ingest(
        &self,
        report: &Report,
        token_id: i64,
        agent: AgentStatus,
        now_ms: i64,
    ) -> Result<IngestOutcome, StoreError>;

    async fn fleet(&self) -> Result<Vec<FleetRow>, StoreError>;
    async fn fleet_processes(&self) -> Result<Vec<FleetProcess>, StoreError>;

    /// Windows that start in `[from_ms, to_ms)`, ordered by GPU and time.
    async fn gpu_windows(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<StoredGpuWindow>, StoreError>;
    async fn process_windows(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<StoredProcessWindow>, StoreError>;
    async fn batch_count(&self) -> Result<i64, StoreError>;

    /// Stores the files of one delivery, each file's lines read as they are parsed, in one
    /// transaction, then replaces what `replaces` names in the periods they cover. A file whose
    /// content was imported before changes nothing (but counts as part of the delivery). A
    /// parse error rolls everything back and comes back as [`StoreError::Rejected`].
    async fn import_bill(
        &self,
        replaces: Replaces,
        files: &mut crate::billing::BillFiles,
    ) -> Result<Vec<ImportOutcome>, StoreError>;
    /// Every file's share of every billing period, by provider, account and period.
    async fn billing_file_periods(&self) -> Result<Vec<BillingFilePeriodRow>, StoreError>;
    async fn billing_imports(&self) -> Result<Vec<BillingImportRow>, StoreError>;
    /// Cost lines whose charge period overlaps `[from_ms, to_ms)`.
    async fn cost_lines(&self, from_ms: i64, to_ms: i64)
        -> Result<Vec<StoredCostLine>, StoreError>;
    /// The same lines as [`Store::cost_lines`], with every column, for the FOCUS export.
    async fn bill_lines(&self, from_ms: i64, to_ms: i64) -> Result<Vec<BillLine>, StoreError>;
    async fn hosts(&self) -> Result<Vec<HostRow>, StoreError>;
    /// GPU windows starting in `[from_ms, to_ms)` with their host and GPU model.
    async fn attribution_windows(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<AttributionWindow>, StoreError>;
    /// What attributing `[from_ms, to_ms)` of the hosts in `host_ids` reads, in one snapshot:
    /// their GPU windows (by host, start, GPU) and the process windows of those GPUs in the same
    /// time (by GPU, start, pid). Read by index, host by host and GPU by GPU, so a large fleet's
    /// hour costs the same however many groups of hosts it is read in. Where a GPU moved hosts
    /// within the range this holds process windows of the other host's windows too; readers
    /// match processes to windows.
    async fn attribution_inputs_of_hosts(
        &self,
        from_ms: i64,
        to_ms: i64,
        host_ids: &[i64],
    ) -> Result<AttributionInputs, StoreError>;

    /// The idle and held-idle hourly rollup rows of the hosts in `host_ids` in
    /// `[from_ms, to_ms)`: what an incident's dollars are read from.
    async fn idle_rollups_of_hosts(
        &self,
        from_ms: i64,
        to_ms: i64,
        host_ids: &[i64],
    ) -> Result<Vec<RollupRow>, StoreError>;

    /// Days (UTC midnights) in `[from_ms, to_ms)` already fetched from Cost Explorer.
    async fn ce_synced_days(&self, from_ms: i64, to_ms: i64) -> Result<Vec<i64>, StoreError>;
    async fn mark_ce_synced(&self, days: &[i64], now_ms: i64) -> Result<(), StoreError>;

    /// Takes the lease on a periodic job unless another holder's lease is still running.
    async fn try_lease(
        &self,
        job: &str,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Records that `holder` finished `job` and gives the lease up.
    async fn finish_lease(&self, job: &str, holder: &str, now_ms: i64) -> Result<(), StoreError>;
    async fn job_last_run(&self, job: &str) -> Result<Option<i64>, StoreError>;

    async fn create_user(
        &self,
        username: &str,
        password_hash: &str,
        role: &str,
        now_ms: i64,
    ) -> Result<(), StoreError>;
    async fn user_by_name(&self, username: &str) -> Result<Option<UserRow>, StoreError>;
    async fn list_users(&self) -> Result<Vec<UserRow>, StoreError>;
    async fn create_session(
        &self,
        token_hash: &str,
        user_id: i64,
        csrf_token: &str,
        now_ms: i64,
        expires_ms: i64,
    ) -> Result<(), StoreError>;
    /// The session behind this token hash, if it has not expired.
    async fn session(
        &self,
        token_hash: &str,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, StoreError>;
    async fn delete_session(&self, token_hash: &str) -> Result<(), StoreError>;
    /// Records a failed sign-in and forgets those older than `forget_before_ms`.
    async fn record_sign_in_failure(
        &self,
        username: &str,
        client: &str,
        at_ms: i64,
        forget_before_ms: i64,
    ) -> Result<(), StoreError>;
    /// Failed sign-ins since `since_ms`: (for this username, from this client).
    async fn sign_in_failures(
        &self,
        username: &str,
        client: &str,
        since_ms: i64,
    ) -> Result<(i64, i64), StoreError>;
    /// Stores usage counts from `source` in one transaction; a count for the same endpoint,
    /// source and period start replaces the earlier one, when it came from the same token (or
    /// one no longer active). A count another active token sent is never replaced: the whole
    /// post is refused, naming it.
    async fn upsert_usage(
        &self,
        source: &str,
        counts: &[UsageCount],
        token_id: i64,
        now_ms: i64,
    ) -> Result<Option<Refusal>, StoreError>;
    /// Requests per endpoint for periods starting in `[from_ms, to_ms)`, all sources summed.
    async fn usage_totals(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<(String, i64)>, StoreError>;
    /// A successful sign-in wipes the username's failures.
    async fn clear_sign_in_failures(&self, username: &str) -> Result<(), StoreError>;

    /// Marks hours for the roll-up job to attribute again (a rebuild, a changed rate card).
    async fn mark_dirty_hours(&self, hours: &[i64]) -> Result<(), StoreError>;
    /// The oldest marks, at most `limit`.
    async fn dirty_marks(&self, limit: i64) -> Result<Vec<DirtyMark>, StoreError> {
        self.dirty_marks_in(i64::MIN, i64::MAX, limit).await
    }
    /// The oldest marks of hours in `[from_ms, to_ms)`, at most `limit` (the roll-up job reads
    /// only months still open: see `closing`).
    async fn dirty_marks_in(
        &self,
        from_ms: i64,
        to_ms: i64,
        limit: i64,
    ) -> Result<Vec<DirtyMark>, StoreError>;
    /// How many host-hours in `[from_ms, to_ms)` are marked and not rolled up yet.
    async fn dirty_mark_count(&self, from_ms: i64, to_ms: i64) -> Result<i64, StoreError>;
    /// How far retention has deleted raw windows (hours before this may have lost theirs).
    async fn raw_deleted_before(&self) -> Result<Option<i64>, StoreError>;
    /// Records that retention deleted raw windows before `before_ms` (it only moves forward).
    async fn set_raw_deleted_before(&self, before_ms: i64) -> Result<(), StoreError>;
    async fn add_restatement(&self, restatement: &RestatementRow) -> Result<(), StoreError>;
    /// The restatements of the month starting at `month_ms`, oldest first.
    async fn restatements(&self, month_ms: i64) -> Result<Vec<RestatementRow>, StoreError>;
    /// Records that a month's bill is final (it closes now); false if it was signed off before.
    async fn sign_off_month(&self, sign_off: &SignOffRow) -> Result<bool, StoreError>;
    /// Every month signed off, oldest first.
    async fn sign_offs(&self) -> Result<Vec<SignOffRow>, StoreError>;
    /// In one transaction: replaces the rollup rows of the marks' hours with `rows` and
    /// `unattributed`, rebuilds the days those hours fall in, and clears each mark whose
    /// generation is still the one read (a report that came meanwhile keeps its mark).
    async fn replace_rollups(
        &self,
        marks: &[DirtyMark],
        rows: &[RollupRow],
        unattributed: &[UnattributedRow],
        usage: &[UsageRow],
    ) -> Result<(), StoreError>;
    /// Per GPU, owner, kind and price: the rollup rows of `grain` (hour or day) in
    /// `[from_ms, to_ms)` summed by the database (`period_ms` is `from_ms`), GPU rows only.
    async fn rollup_gpu_owner_totals(
        &self,
        grain: RollupGrain,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<RollupRow>, StoreError>;
    /// Recommendations stored for a range: `(computed_ms, JSON body)`.
    async fn recommendation_snapshot(
        &self,
        from_ms: i64,
        to_ms: i64,
        observed_ms: i64,
    ) -> Result<Option<(i64, String)>, StoreError>;
    /// Stores (or replaces) the recommendations for a range.
    async fn put_recommendation_snapshot(
        &self,
        from_ms: i64,
        to_ms: i64,
        observed_ms: i64,
        computed_ms: i64,
        body: &str,
    ) -> Result<(), StoreError>;
    /// Deletes snapshots of ranges still under way that were computed before `before_ms`.
    async fn expire_recommendation_snapshots(&self, before_ms: i64) -> Result<u64, StoreError>;
    /// Every MIG instance's UUID.
    async fn mig_instances(&self) -> Result<Vec<String>, StoreError>;
    /// The usage rows of `grain` (hour or day) in `[from_ms, to_ms)` summed per GPU, owner and
    /// utilization band by the database.
    async fn rollup_usage(
        &self,
        grain: RollupGrain,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<UsageTotal>, StoreError>;
    /// Rollup rows with `period_ms` in `[from_ms, to_ms)`.
    async fn rollup_rows(
        &self,
        grain: RollupGrain,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<RollupRow>, StoreError>;
    /// Whether the ledger holds anything for `[from_ms, to_ms)`: a rollup row or unattributed
    /// cost in any hour of it; with `from_windows_only`, a row attributed to a GPU (which only
    /// raw windows can give).
    async fn has_rollups(
        &self,
        from_ms: i64,
        to_ms: i64,
        from_windows_only: bool,
    ) -> Result<bool, StoreError>;
    /// Unattributed cost per currency in `[from_ms, to_ms)` (hour_ms is `from_ms`).
    async fn rollup_unattributed(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<UnattributedRow>, StoreError>;
    /// How many raw GPU windows start in each hour of `[from_ms, to_ms)` per host, as
    /// `(hour_ms, host_id, windows)` by hour and host id.
    async fn gpu_windows_per_hour_and_host(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<(i64, i64, i64)>, StoreError>;
    /// The `limit` GPUs that cost most in the days of `[from_ms, to_ms)`, costliest first, and
    /// how many GPUs have rows there.
    async fn rollup_top_gpus(
        &self,
        from_ms: i64,
        to_ms: i64,
        limit: i64,
    ) -> Result<(Vec<String>, i64), StoreError>;
    /// The daily rows of these GPUs in `[from_ms, to_ms)`.
    async fn rollup_gpu_days(
        &self,
        from_ms: i64,
        to_ms: i64,
        gpus: &[String],
    ) -> Result<Vec<RollupRow>, StoreError>;
    /// Per experiment label, its active hours in the days that start in `[from_ms, to_ms)`.
    async fn rollup_experiment_days(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<ExperimentDayRow>, StoreError>;
    /// Attributed cost per currency of the rows of `grain` (hour or day) in `[from_ms, to_ms)`.
    async fn rollup_costs(
        &self,
        grain: RollupGrain,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<CurrencyCostRow>, StoreError>;
    /// Deletes at most `limit` raw GPU windows, process windows and batch ids older than
    /// `before_ms`; returns how many rows went. Called in a loop so no transaction is long.
    async fn delete_raw_before(&self, before_ms: i64, limit: i64) -> Result<u64, StoreError>;

    async fn open_incidents(&self) -> Result<Vec<IncidentRow>, StoreError>;
    /// Incidents that overlap `[from_ms, to_ms)`, newest first.
    async fn incidents(&self, from_ms: i64, to_ms: i64) -> Result<Vec<IncidentRow>, StoreError>;
    async fn incident(&self, id: i64) -> Result<Option<IncidentRow>, StoreError>;
    async fn insert_incident(&self, incident: &IncidentUpdate) -> Result<i64, StoreError>;
    async fn update_incident(&self, id: i64, incident: &IncidentUpdate) -> Result<(), StoreError>;
    async fn resolve_incident(&self, id: i64, ended_ms: i64) -> Result<(), StoreError>;
    async fn mark_incident_notified(&self, id: i64, at_ms: i64) -> Result<(), StoreError>;
    /// Sets an incident's dollars (a resolved one, once the ledger holds its last hours).
    async fn set_incident_wasted(&self, id: i64, wasted: &str) -> Result<(), StoreError>;

    async fn snooze(
        &self,
        cluster: &str,
        until_ms: i64,
        by_user: &str,
        now_ms: i64,
    ) -> Result<(), StoreError>;
    async fn active_snoozes(&self, now_ms: i64) -> Result<Vec<SnoozeRow>, StoreError>;

    async fn enqueue_slack(
        &self,
        incident_id: Option<i64>,
        event: &str,
        route: &str,
        payload: &str,
        now_ms: i64,
    ) -> Result<i64, StoreError>;
    /// Pending messages whose next attempt is due, oldest first.
    async fn due_slack_messages(
        &self,
        now_ms: i64,
        limit: i64,
    ) -> Result<Vec<SlackMessageRow>, StoreError>;
    async fn record_slack_attempt(&self, message: &SlackMessageRow) -> Result<(), StoreError>;
    async fn slack_history(&self, limit: i64) -> Result<Vec<SlackMessageRow>, StoreError>;
    /// Every message about one incident, oldest first.
    async fn incident_messages(&self, incident_id: i64)
        -> Result<Vec<SlackMessageRow>, StoreError>;
}

/// Opens the database named by `url` and brings its schema up to date.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::connect(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(redacted_url(url)))
    }
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
/// The hours (UTC starts) that charge periods touch; a period is capped at 400 days so an odd
/// line cannot mark a century. A point-in-time charge (end ≤ start) touches its own hour.
pub(crate) fn hours_of_spans(spans: &[(i64, i64)]) -> Vec<i64> {
    use gpuledger_core::time::{hour_floor, HOUR_MS};
    const MAX_SPAN_MS: i64 = 400 * 24 * HOUR_MS;
    let mut hours = std::collections::BTreeSet::new();
    for &(start, end) in spans {
        let end = end.max(start + 1).min(start.saturating_add(MAX_SPAN_MS));
        let mut h = hour_floor(start);
        while h < end {
            hours.insert(h);
            h += HOUR_MS;
        }
    }
    hours.into_iter().collect()
}

pub(crate) fn to_i64(v: Option<u64>) -> Option<i64> {
    v.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

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
            $crate::store::token_active_sql!("t", "$8"),
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
                    .map($crate::billing::normalize_resource_id),
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

/// The SQL both backends share. Written once, expanded once per backend, because sqlx's
/// executor types differ per database while the statements do not.
macro_rules! shared_sql_impl {
    ($db:ty) => {
        async fn mark_dirty_sql(
            tx: &mut sqlx::Transaction<'_, $db>,
            hours: &[i64],
            host_id: i64,
        ) -> Result<(), $crate::store::StoreError> {
            for chunk in hours.chunks(1000) {
                let mut q = sqlx::QueryBuilder::<$db>::new(
                    "INSERT INTO rollup_dirty_hours (hour_ms, host_id, generation) ",
                );
                q.push_values(chunk, |mut b, h| {
                    b.push_bind(*h).push_bind(host_id).push_bind(0i64);
                });
                q.push(concat!(" ", $crate::store::dirty_mark_on_conflict_sql!()));
                q.build().execute(&mut **tx).await?;
            }
            Ok(())
        }

        async fn mark_dirty_hours_sql(
            pool: &sqlx::Pool<$db>,
            hours: &[i64],
        ) -> Result<(), $crate::store::StoreError> {
            let mut tx = pool.begin().await?;
            mark_dirty_sql(&mut tx, hours, $crate::store::BILLING_MARK_HOST).await?;
            tx.commit().await?;
            Ok(())
        }

        async fn dirty_marks_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
            limit: i64,
        ) -> Result<Vec<$crate::store::DirtyMark>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT hour_ms, host_id, generation FROM rollup_dirty_hours
                 WHERE hour_ms >= $2 AND hour_ms < $3
                 ORDER BY hour_ms, host_id LIMIT $1",
            )
            .bind(limit)
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn replace_rollups_sql(
            pool: &sqlx::Pool<$db>,
            marks: &[$crate::store::DirtyMark],
            rows: &[$crate::store::RollupRow],
            unattributed: &[$crate::store::UnattributedRow],
            usage: &[$crate::store::UsageRow],
        ) -> Result<(), $crate::store::StoreError> {
            use gpuledger_core::time::DAY_MS;
            let hours: std::collections::BTreeSet<i64> = marks.iter().map(|m| m.hour_ms).collect();
            let days: std::collections::BTreeSet<i64> =
                hours.iter().map(|h| h.div_euclid(DAY_MS) * DAY_MS).collect();
            let mut tx = pool.begin().await?;
            // A row lock that serializes roll-up writers across replicas and CLI runs, so two
            // never interleave their deletes and inserts of the same hour.
            sqlx::query(
                "INSERT INTO job_leases (name, holder, expires_ms) VALUES ('rollup-writer', NULL, 0)
                 ON CONFLICT (name) DO UPDATE SET expires_ms = 0",
            )
            .execute(&mut *tx)
            .await?;
            for h in &hours {
                sqlx::query("DELETE FROM rollup_hours WHERE hour_ms = $1")
                    .bind(h)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("DELETE FROM rollup_unattributed WHERE hour_ms = $1")
                    .bind(h)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("DELETE FROM rollup_usage_hours WHERE hour_ms = $1")
                    .bind(h)
                    .execute(&mut *tx)
                    .await?;
            }
            for chunk in usage.chunks(1000) {
                let mut q = sqlx::QueryBuilder::<$db>::new(
                    "INSERT INTO rollup_usage_hours (hour_ms, host_id, gpu_uuid, owner_by,
                        owner_key, util_band, windows, peak_memory_bytes) ",
                );
                q.push_values(chunk, |mut b, u| {
                    b.push_bind(u.period_ms)
                        .push_bind(u.host_id)
                        .push_bind(u.gpu_uuid.clone())
                        .push_bind(u.owner_by.clone())
                        .push_bind(u.owner_key.clone())
                        .push_bind(u.util_band)
                        .push_bind(u.windows)
                        .push_bind(u.peak_memory_bytes);
                });
                q.build().execute(&mut *tx).await?;
            }
            // 17 parameters a row: 1,000 rows stay under both backends' limits.
            for chunk in rows.chunks(1000) {
                let mut q = sqlx::QueryBuilder::<$db>::new(
                    "INSERT INTO rollup_hours (hour_ms, host_id, gpu_uuid, model, experiment,
                        endpoint, team, kind, pricing_category, currency, estimated, cost_nano,
                        cost_atto, gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j) ",
                );
                q.push_values(chunk, |mut b, r| {
                    b.push_bind(r.period_ms)
                        .push_bind(r.host_id)
                        .push_bind(r.gpu_uuid.clone())
                        .push_bind(r.model.clone())
                        .push_bind(r.experiment.clone())
                        .push_bind(r.endpoint.clone())
                        .push_bind(r.team.clone())
                        .push_bind(r.kind.clone())
                        .push_bind(r.pricing_category.clone())
                        .push_bind(r.currency.clone())
                        .push_bind(r.estimated)
                        .push_bind(r.cost_nano)
                        .push_bind(r.cost_atto)
                        .push_bind(r.gpu_seconds)
                        .push_bind(r.util_gpu_seconds)
                        .push_bind(r.util_known_seconds)
                        .push_bind(r.energy_j);
                });
                q.build().execute(&mut *tx).await?;
            }
            for chunk in unattributed.chunks(1000) {
                let mut q = sqlx::QueryBuilder::<$db>::new(
                    "INSERT INTO rollup_unattributed (hour_ms, currency, cost_nano, cost_atto) ",
                );
                q.push_values(chunk, |mut b, u| {
                    b.push_bind(u.hour_ms)
                        .push_bind(u.currency.clone())
                        .push_bind(u.cost_nano)
                        .push_bind(u.cost_atto);
                });
                q.build().execute(&mut *tx).await?;
            }
            for day in days {
                sqlx::query("DELETE FROM rollup_days WHERE day_ms = $1")
                    .bind(day)
                    .execute(&mut *tx)
                    .await?;
                // Sums stay exact: atto parts carry over into nano parts in integer math.
                sqlx::query(
                    "INSERT INTO rollup_days (day_ms, host_id, gpu_uuid, model, experiment,
                        endpoint, team, kind, pricing_category, currency, estimated, cost_nano,
                        cost_atto, gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j)
                     SELECT $1, host_id, gpu_uuid, model, experiment, endpoint, team, kind,
                        pricing_category, currency, estimated,
                        CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000,
                        CAST(SUM(cost_atto) AS BIGINT) % 1000000000,
                        SUM(gpu_seconds), SUM(util_gpu_seconds), SUM(util_known_seconds),
                        SUM(energy_j)
                     FROM rollup_hours WHERE hour_ms >= $1 AND hour_ms < $2
                     GROUP BY host_id, gpu_uuid, model, experiment, endpoint, team, kind,
                        pricing_category, currency, estimated",
                )
                .bind(day)
                .bind(day + DAY_MS)
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM rollup_host_days WHERE day_ms = $1")
                    .bind(day)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO rollup_host_days (day_ms, host_id, model, experiment, endpoint,
                        team, kind, pricing_category, currency, estimated, cost_nano, cost_atto,
                        gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j)
                     SELECT day_ms, host_id, model, experiment, endpoint, team, kind,
                        pricing_category, currency, estimated,
                        CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000,
                        CAST(SUM(cost_atto) AS BIGINT) % 1000000000,
                        SUM(gpu_seconds), SUM(util_gpu_seconds), SUM(util_known_seconds),
                        SUM(energy_j)
                     FROM rollup_days WHERE day_ms = $1
                     GROUP BY day_ms, host_id, model, experiment, endpoint, team, kind,
                        pricing_category, currency, estimated",
                )
                .bind(day)
                .execute(&mut *tx)
                .await?;
                // Recommendations of ended ranges over this day were drawn from old rows.
                sqlx::query(
                    "DELETE FROM recommendation_snapshots
                     WHERE from_ms < $2 AND to_ms > $1 AND computed_ms >= to_ms",
                )
                .bind(day)
                .bind(day + DAY_MS)
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM rollup_usage_days WHERE day_ms = $1")
                    .bind(day)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO rollup_usage_days (day_ms, host_id, gpu_uuid, owner_by,
                        owner_key, util_band, windows, peak_memory_bytes)
                     SELECT $1, host_id, gpu_uuid, owner_by, owner_key, util_band,
                        CAST(SUM(windows) AS BIGINT), MAX(peak_memory_bytes)
                     FROM rollup_usage_hours WHERE hour_ms >= $1 AND hour_ms < $2
                     GROUP BY host_id, gpu_uuid, owner_by, owner_key, util_band",
                )
                .bind(day)
                .bind(day + DAY_MS)
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM rollup_experiment_days WHERE day_ms = $1")
                    .bind(day)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO rollup_experiment_days (day_ms, experiment, first_hour_ms,
                        last_hour_ms, hours)
                     SELECT $1, experiment, MIN(hour_ms), MAX(hour_ms), COUNT(DISTINCT hour_ms)
                     FROM rollup_hours
                     WHERE hour_ms >= $1 AND hour_ms < $2 AND experiment <> ''
                       AND kind IN ('used', 'held_idle')
                     GROUP BY experiment",
                )
                .bind(day)
                .bind(day + DAY_MS)
                .execute(&mut *tx)
                .await?;
            }
            for m in marks {
                sqlx::query(
                    "DELETE FROM rollup_dirty_hours
                     WHERE hour_ms = $1 AND host_id = $2 AND generation = $3",
                )
                .bind(m.hour_ms)
                .bind(m.host_id)
                .bind(m.generation)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        }

        async fn has_rollups_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
            from_windows_only: bool,
        ) -> Result<bool, $crate::store::StoreError> {
            let sql = if from_windows_only {
                "SELECT EXISTS (SELECT 1 FROM rollup_hours
                                WHERE hour_ms >= $1 AND hour_ms < $2 AND gpu_uuid <> '')"
            } else {
                "SELECT EXISTS (SELECT 1 FROM rollup_hours WHERE hour_ms >= $1 AND hour_ms < $2)
                     OR EXISTS (SELECT 1 FROM rollup_unattributed
                                WHERE hour_ms >= $1 AND hour_ms < $2)"
            };
            let (any,): (bool,) = sqlx::query_as(sql)
                .bind(from_ms)
                .bind(to_ms)
                .fetch_one(pool)
                .await?;
            Ok(any)
        }

        async fn rollup_rows_sql(
            pool: &sqlx::Pool<$db>,
            grain: $crate::store::RollupGrain,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::RollupRow>, $crate::store::StoreError> {
            let sql = match grain {
                $crate::store::RollupGrain::Hour => {
                    "SELECT hour_ms AS period_ms, host_id, gpu_uuid, model, experiment, endpoint,
                        team, kind, pricing_category, currency, estimated, cost_nano, cost_atto,
                        gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j
                     FROM rollup_hours WHERE hour_ms >= $1 AND hour_ms < $2"
                }
                $crate::store::RollupGrain::ExperimentHour => {
                    "SELECT hour_ms AS period_ms, host_id, gpu_uuid, model, experiment, endpoint,
                        team, kind, pricing_category, currency, estimated, cost_nano, cost_atto,
                        gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j
                     FROM rollup_hours
                     WHERE hour_ms >= $1 AND hour_ms < $2 AND experiment <> ''"
                }
                $crate::store::RollupGrain::IdleHour => {
                    "SELECT hour_ms AS period_ms, host_id, gpu_uuid, model, experiment, endpoint,
                        team, kind, pricing_category, currency, estimated, cost_nano, cost_atto,
                        gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j
                     FROM rollup_hours
                     WHERE hour_ms >= $1 AND hour_ms < $2 AND kind IN ('idle', 'held_idle')"
                }
                $crate::store::RollupGrain::Day => {
                    "SELECT day_ms AS period_ms, host_id, gpu_uuid, model, experiment, endpoint,
                        team, kind, pricing_category, currency, estimated, cost_nano, cost_atto,
                        gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j
                     FROM rollup_days WHERE day_ms >= $1 AND day_ms < $2"
                }
                $crate::store::RollupGrain::HostDay => {
                    "SELECT day_ms AS period_ms, host_id, '' AS gpu_uuid, model, experiment,
                        endpoint, team, kind, pricing_category, currency, estimated, cost_nano,
                        cost_atto, gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j
                     FROM rollup_host_days WHERE day_ms >= $1 AND day_ms < $2"
                }
            };
            Ok(sqlx::query_as(sql)
                .bind(from_ms)
                .bind(to_ms)
                .fetch_all(pool)
                .await?)
        }

        async fn gpu_windows_per_hour_and_host_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<(i64, i64, i64)>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT start_ms - start_ms % $3 AS hour_ms, host_id, COUNT(*) FROM gpu_windows
                 WHERE start_ms >= $1 AND start_ms < $2
                 GROUP BY start_ms - start_ms % $3, host_id ORDER BY hour_ms, host_id",
            )
            .bind(from_ms)
            .bind(to_ms)
            .bind(gpuledger_core::time::HOUR_MS)
            .fetch_all(pool)
            .await?)
        }

        async fn rollup_top_gpus_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
            limit: i64,
        ) -> Result<(Vec<String>, i64), $crate::store::StoreError> {
            // One pass: the window counts the grouped GPUs before the limit applies.
            let top: Vec<(String, i64)> = sqlx::query_as(
                "SELECT gpu_uuid, COUNT(*) OVER () FROM rollup_days
                 WHERE day_ms >= $1 AND day_ms < $2 AND gpu_uuid <> ''
                 GROUP BY gpu_uuid
                 ORDER BY CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000 DESC,
                    gpu_uuid
                 LIMIT $3",
            )
            .bind(from_ms)
            .bind(to_ms)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            let count = top.first().map_or(0, |(_, n)| *n);
            Ok((top.into_iter().map(|(g, _)| g).collect(), count))
        }

        async fn rollup_gpu_days_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
            gpus: &[String],
        ) -> Result<Vec<$crate::store::RollupRow>, $crate::store::StoreError> {
            let mut rows = Vec::new();
            for chunk in gpus.chunks(500) {
                let mut q = sqlx::QueryBuilder::<$db>::new(
                    "SELECT day_ms AS period_ms, host_id, gpu_uuid, model, experiment, endpoint,
                        team, kind, pricing_category, currency, estimated, cost_nano, cost_atto,
                        gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j
                     FROM rollup_days WHERE day_ms >= ",
                );
                q.push_bind(from_ms)
                    .push(" AND day_ms < ")
                    .push_bind(to_ms)
                    .push(" AND gpu_uuid IN (");
                let mut list = q.separated(", ");
                for g in chunk {
                    list.push_bind(g.clone());
                }
                list.push_unseparated(")");
                rows.extend(q.build_query_as().fetch_all(pool).await?);
            }
            Ok(rows)
        }

        async fn rollup_experiment_days_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::ExperimentDayRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT day_ms, experiment, first_hour_ms, last_hour_ms, hours
                 FROM rollup_experiment_days WHERE day_ms >= $1 AND day_ms < $2",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn rollup_costs_sql(
            pool: &sqlx::Pool<$db>,
            grain: $crate::store::RollupGrain,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::CurrencyCostRow>, $crate::store::StoreError> {
            let (table, period) = if grain.is_daily() {
                ("rollup_days", "day_ms")
            } else {
                ("rollup_hours", "hour_ms")
            };
            // Sums stay exact: atto parts carry over into nano parts in integer math.
            let sql = format!(
                "SELECT currency,
                    CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000 AS cost_nano,
                    CAST(SUM(cost_atto) AS BIGINT) % 1000000000 AS cost_atto
                 FROM {table} WHERE {period} >= $1 AND {period} < $2 GROUP BY currency"
            );
            Ok(sqlx::query_as(&sql)
                .bind(from_ms)
                .bind(to_ms)
                .fetch_all(pool)
                .await?)
        }

        async fn rollup_gpu_owner_totals_sql(
            pool: &sqlx::Pool<$db>,
            grain: $crate::store::RollupGrain,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::RollupRow>, $crate::store::StoreError> {
            let (table, period) = if grain.is_daily() {
                ("rollup_days", "day_ms")
            } else {
                ("rollup_hours", "hour_ms")
            };
            // Sums stay exact: atto parts carry over into nano parts in integer math.
            let sql = format!(
                "SELECT CAST($1 AS BIGINT) AS period_ms, host_id, gpu_uuid, model, experiment,
                    endpoint, team, kind, pricing_category, currency, estimated,
                    CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000 AS cost_nano,
                    CAST(SUM(cost_atto) AS BIGINT) % 1000000000 AS cost_atto,
                    SUM(gpu_seconds) AS gpu_seconds, SUM(util_gpu_seconds) AS util_gpu_seconds,
                    SUM(util_known_seconds) AS util_known_seconds, SUM(energy_j) AS energy_j
                 FROM {table} WHERE {period} >= $1 AND {period} < $2 AND gpu_uuid <> ''
                 GROUP BY host_id, gpu_uuid, model, experiment, endpoint, team, kind,
                    pricing_category, currency, estimated"
            );
            Ok(sqlx::query_as(&sql)
                .bind(from_ms)
                .bind(to_ms)
                .fetch_all(pool)
                .await?)
        }

        async fn mig_instances_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<String>, $crate::store::StoreError> {
            let rows: Vec<(String,)> =
                sqlx::query_as("SELECT uuid FROM gpus WHERE parent_uuid IS NOT NULL")
                    .fetch_all(pool)
                    .await?;
            Ok(rows.into_iter().map(|(u,)| u).collect())
        }

        async fn rollup_usage_sql(
            pool: &sqlx::Pool<$db>,
            grain: $crate::store::RollupGrain,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::UsageTotal>, $crate::store::StoreError> {
            let (table, period) = if grain.is_daily() {
                ("rollup_usage_days", "day_ms")
            } else {
                ("rollup_usage_hours", "hour_ms")
            };
            let sql = format!(
                "SELECT u.host_id, u.gpu_uuid, u.owner_by, u.owner_key, u.util_band,
                    CAST(SUM(u.windows) AS BIGINT) AS windows,
                    MAX(u.peak_memory_bytes) AS peak_memory_bytes,
                    g.name AS gpu_name, g.memory_total_bytes, g.parent_uuid
                 FROM {table} u LEFT JOIN gpus g ON g.uuid = u.gpu_uuid
                 WHERE u.{period} >= $1 AND u.{period} < $2
                 GROUP BY u.host_id, u.gpu_uuid, u.owner_by, u.owner_key, u.util_band, g.name,
                    g.memory_total_bytes, g.parent_uuid"
            );
            Ok(sqlx::query_as(&sql)
                .bind(from_ms)
                .bind(to_ms)
                .fetch_all(pool)
                .await?)
        }

        async fn rollup_unattributed_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::UnattributedRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT CAST($1 AS BIGINT) AS hour_ms, currency,
                        CAST(SUM(cost_nano) AS BIGINT) AS cost_nano,
                        CAST(SUM(cost_atto) AS BIGINT) AS cost_atto
                 FROM rollup_unattributed WHERE hour_ms >= $1 AND hour_ms < $2
                 GROUP BY currency ORDER BY currency",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn delete_raw_before_sql(
            pool: &sqlx::Pool<$db>,
            before_ms: i64,
            limit: i64,
        ) -> Result<u64, $crate::store::StoreError> {
            let mut deleted = 0;
            for sql in [
                "DELETE FROM process_windows WHERE (gpu_uuid, start_ms, pid) IN
                    (SELECT gpu_uuid, start_ms, pid FROM process_windows
                     WHERE start_ms < $1 LIMIT $2)",
                "DELETE FROM gpu_windows WHERE (gpu_uuid, start_ms) IN
                    (SELECT gpu_uuid, start_ms FROM gpu_windows WHERE start_ms < $1 LIMIT $2)",
                "DELETE FROM ingested_batches WHERE batch_id IN
                    (SELECT batch_id FROM ingested_batches WHERE received_ms < $1 LIMIT $2)",
            ] {
                deleted += sqlx::query(sql)
                    .bind(before_ms)
                    .bind(limit)
                    .execute(pool)
                    .await?
                    .rows_affected();
            }
            Ok(deleted)
        }

        async fn fleet_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::FleetRow>, $crate::store::StoreError> {
            // The latest state is the GPU's newest window: one index probe per GPU.
            Ok(sqlx::query_as(
                "SELECT h.cluster, h.hostname, h.instance_type, h.last_report_ms, h.spool_depth,
                        g.uuid, g.gpu_index, g.name, g.parent_uuid, g.memory_total_bytes,
                        w.util_avg AS last_util_avg,
                        w.memory_used_max_bytes AS last_memory_used_bytes,
                        w.end_ms AS last_window_end_ms
                 FROM hosts h
                 LEFT JOIN gpus g ON g.host_id = h.id
                 LEFT JOIN gpu_windows w ON w.gpu_uuid = g.uuid AND w.start_ms =
                    (SELECT MAX(x.start_ms) FROM gpu_windows x WHERE x.gpu_uuid = g.uuid)
                 ORDER BY h.cluster, h.hostname, g.gpu_index, g.uuid",
            )
            .fetch_all(pool)
            .await?)
        }

        async fn fleet_processes_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::FleetProcess>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT p.gpu_uuid, p.pid, p.process_name, p.memory_used_max_bytes, p.sm_util_avg,
                        p.labels_json, p.user_name
                 FROM gpus g
                 JOIN process_windows p ON p.gpu_uuid = g.uuid AND p.start_ms =
                    (SELECT MAX(x.start_ms) FROM gpu_windows x WHERE x.gpu_uuid = g.uuid)
                 ORDER BY p.gpu_uuid, p.pid",
            )
            .fetch_all(pool)
            .await?)
        }

        async fn gpu_windows_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::StoredGpuWindow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT gpu_uuid, start_ms, end_ms, samples, memory_total_bytes, memory_used_max_bytes,
                        util_avg, util_max, util_histogram, mem_util_avg, power_avg_watts,
                        temperature_max_c, energy_mj
                 FROM gpu_windows WHERE start_ms >= $1 AND start_ms < $2
                 ORDER BY gpu_uuid, start_ms",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn process_windows_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::StoredProcessWindow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT gpu_uuid, start_ms, pid, process_name, memory_used_max_bytes, sm_util_avg,
                        model, experiment, endpoint, team, labels_json, container_id, pod_uid,
                        user_name
                 FROM process_windows WHERE start_ms >= $1 AND start_ms < $2
                 ORDER BY gpu_uuid, start_ms, pid",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        /// Sums, once, the per-period totals of files imported before `billing_file_periods`
        /// existed (its migration could count their lines but not sum decimal text exactly).
        async fn backfill_file_period_totals(
            tx: &mut sqlx::Transaction<'_, $db>,
        ) -> Result<(), $crate::store::StoreError> {
            use gpuledger_core::money::{from_text, to_text};
            let missing: Vec<(i64, String, String, i64, String)> = sqlx::query_as(
                "SELECT import_id, provider, billing_account_id, billing_period_start_ms, currency
                 FROM billing_file_periods WHERE billed_total IS NULL",
            )
            .fetch_all(&mut **tx)
            .await?;
            for (import_id, provider, account, period, currency) in missing {
                let amounts: Vec<(String, String)> = sqlx::query_as(
                    "SELECT billed_cost, effective_cost FROM cost_lines
                     WHERE import_id = $1 AND provider = $2 AND billing_account_id = $3
                       AND billing_period_start_ms = $4 AND currency = $5",
                )
                .bind(import_id)
                .bind(&provider)
                .bind(&account)
                .bind(period)
                .bind(&currency)
                .fetch_all(&mut **tx)
                .await?;
                let billed: rust_decimal::Decimal = amounts.iter().map(|a| from_text(&a.0)).sum();
                let effective: rust_decimal::Decimal =
                    amounts.iter().map(|a| from_text(&a.1)).sum();
                sqlx::query(
                    "UPDATE billing_file_periods SET billed_total = $1, effective_total = $2
                     WHERE import_id = $3 AND provider = $4 AND billing_account_id = $5
                       AND billing_period_start_ms = $6 AND currency = $7",
                )
                .bind(to_text(billed))
                .bind(to_text(effective))
                .bind(import_id)
                .bind(&provider)
                .bind(&account)
                .bind(period)
                .bind(&currency)
                .execute(&mut **tx)
                .await?;
            }
            Ok(())
        }

        /// Inserts one file's lines as they arrive; returns its per-period counts and totals.
        async fn insert_bill_file(
            tx: &mut sqlx::Transaction<'_, $db>,
            import_id: i64,
            file: &str,
            lines: &mut $crate::billing::LineChunks,
            spans: &mut std::collections::HashSet<(i64, i64)>,
        ) -> Result<$crate::store::FilePeriods, $crate::store::StoreError> {
            use gpuledger_core::money::to_text;
            let mut periods = $crate::store::FilePeriods::new();
            while let Some(chunk) = lines.recv().await {
                let chunk = chunk.map_err(|error| $crate::store::StoreError::Rejected {
                    file: file.to_owned(),
                    error,
                })?;
                for l in &chunk {
                    // Distinct charge periods: a month of hourly lines has a few hundred.
                    spans.insert((l.charge_period_start_ms, l.charge_period_end_ms));
                    let key = (
                        l.provider.as_str(),
                        l.billing_account_id.as_str(),
                        l.billing_period_start_ms,
                        l.currency.as_str(),
                    );
                    match periods.iter_mut().find(|(p, _)| {
                        (p.0.as_str(), p.1.as_str(), p.2, p.3.as_str()) == key
                    }) {
                        Some((_, t)) => t.add(l),
                        None => {
                            let mut t = $crate::store::PeriodTotals::default();
                            t.add(l);
                            let key = (key.0.to_owned(), key.1.to_owned(), key.2, key.3.to_owned());
                            periods.push((key, t));
                        }
                    }
                }
                // Multi-row inserts: 23 parameters a row stays under both backends' limits.
                for part in chunk.chunks(500) {
                    let mut q = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO cost_lines (import_id, line_no, provider, billing_account_id,
                            billing_period_start_ms, charge_period_start_ms, charge_period_end_ms,
                            charge_category, resource_id, resource_key, billed_cost, effective_cost,
                            list_cost, currency, pricing_category, commitment_discount_id,
                            commitment_discount_status, service_name, sku_id, region, instance_type,
                            tags_json, extra_json) ",
                    );
                    q.push_values(part, |mut b, l| {
                        b.push_bind(import_id)
                            .push_bind(l.line_no as i64)
                            .push_bind(&l.provider)
                            .push_bind(&l.billing_account_id)
                            .push_bind(l.billing_period_start_ms)
                            .push_bind(l.charge_period_start_ms)
                            .push_bind(l.charge_period_end_ms)
                            .push_bind(&l.charge_category)
                            .push_bind(&l.resource_id)
                            .push_bind(&l.resource_key)
                            .push_bind(to_text(l.billed_cost))
                            .push_bind(to_text(l.effective_cost))
                            .push_bind(to_text(l.list_cost))
                            .push_bind(&l.currency)
                            .push_bind(&l.pricing_category)
                            .push_bind(&l.commitment_discount_id)
                            .push_bind(&l.commitment_discount_status)
                            .push_bind(&l.service_name)
                            .push_bind(&l.sku_id)
                            .push_bind(&l.region)
                            .push_bind(&l.instance_type)
                            .push_bind(&l.tags_json)
                            .push_bind(&l.extra_json);
                    });
                    q.build().execute(&mut **tx).await?;
                }
            }
            for ((provider, account, period, currency), t) in &periods {
                sqlx::query(
                    "INSERT INTO billing_file_periods (import_id, provider, billing_account_id,
                         billing_period_start_ms, currency, row_count, billed_total,
                         effective_total)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(import_id)
                .bind(provider)
                .bind(account)
                .bind(*period)
                .bind(currency)
                .bind(t.rows as i64)
                .bind(to_text(t.billed))
                .bind(to_text(t.effective))
                .execute(&mut **tx)
                .await?;
            }
            Ok(periods)
        }

        async fn import_bill_sql(
            pool: &sqlx::Pool<$db>,
            replaces: $crate::store::Replaces,
            files: &mut $crate::billing::BillFiles,
        ) -> Result<Vec<$crate::store::ImportOutcome>, $crate::store::StoreError> {
            use gpuledger_core::money::to_text;
            use $crate::store::{ImportOutcome, Replaces};
            type Period = (String, String, i64);
            let mut tx = pool.begin().await?;
            backfill_file_period_totals(&mut tx).await?;
            let mut outcomes: Vec<ImportOutcome> = Vec::new();
            // The delivery's files (new, or imported before with the same content), with the
            // name, source and periods of each; the charge periods of new lines.
            let mut delivery: Vec<(i64, String, String, Vec<Period>)> = Vec::new();
            let mut spans: std::collections::HashSet<(i64, i64)> = Default::default();
            let mut now_ms = 0;
            while let Some((import, mut lines)) = files.recv().await {
                now_ms = now_ms.max(import.imported_ms);
                let existing: Option<(i64,)> =
                    sqlx::query_as("SELECT id FROM billing_imports WHERE content_sha256 = $1")
                        .bind(&import.content_sha256)
                        .fetch_optional(&mut *tx)
                        .await?;
                if let Some((import_id,)) = existing {
                    // Dropping `lines` stops its parser.
                    let periods: Vec<Period> = sqlx::query_as(
                        "SELECT DISTINCT provider, billing_account_id, billing_period_start_ms
                         FROM billing_file_periods WHERE import_id = $1 AND replaced_ms IS NULL",
                    )
                    .bind(import_id)
                    .fetch_all(&mut *tx)
                    .await?;
                    delivery.push((import_id, import.name.clone(), import.source.clone(), periods));
                    outcomes.push(ImportOutcome::AlreadyImported { import_id });
                    continue;
                }
                // Counts and totals are known once the last line is read: written at the end.
                let (import_id,): (i64,) = sqlx::query_as(
                    "INSERT INTO billing_imports (source, name, content_sha256, imported_ms,
                         row_count, billed_total, effective_total, delivery)
                     VALUES ($1, $2, $3, $4, 0, '0', '0', $5) RETURNING id",
                )
                .bind(&import.source)
                .bind(&import.name)
                .bind(&import.content_sha256)
                .bind(import.imported_ms)
                .bind(&import.delivery)
                .fetch_one(&mut *tx)
                .await?;
                let periods = insert_bill_file(&mut tx, import_id, &import.name, &mut lines, &mut spans).await?;
                let mut total = $crate::store::PeriodTotals::default();
                for (_, t) in &periods {
                    total.rows += t.rows;
                    total.billed += t.billed;
                    total.effective += t.effective;
                }
                sqlx::query(
                    "UPDATE billing_imports SET row_count = $1, billed_total = $2,
                         effective_total = $3
                     WHERE id = $4",
                )
                .bind(total.rows as i64)
                .bind(to_text(total.billed))
                .bind(to_text(total.effective))
                .bind(import_id)
                .execute(&mut *tx)
                .await?;
                let mut covered: Vec<Period> = periods.into_iter().map(|(p, _)| (p.0, p.1, p.2)).collect();
                covered.sort();
                covered.dedup();
                delivery.push((import_id, import.name.clone(), import.source.clone(), covered));
                outcomes.push(ImportOutcome::Imported {
                    import_id,
                    replaced_lines: 0,
                    rows: total.rows,
                    billed_total: total.billed,
                    effective_total: total.effective,
                });
            }

            // What each file of the delivery replaces, period by period.
            let ours: std::collections::HashSet<i64> = delivery.iter().map(|d| d.0).collect();
            let mut victims: Vec<(i64, Period, i64)> = Vec::new();
            let mut seen: std::collections::HashSet<(i64, Period)> = Default::default();
            for (by, name, source, periods) in &delivery {
                for (provider, account, period) in periods {
                    let rows: Vec<(i64, String, String)> = sqlx::query_as(
                        "SELECT DISTINCT p.import_id, i.name, i.source
                         FROM billing_file_periods p JOIN billing_imports i ON i.id = p.import_id
                         WHERE p.provider = $1 AND p.billing_account_id = $2
                           AND p.billing_period_start_ms = $3 AND p.replaced_ms IS NULL",
                    )
                    .bind(provider)
                    .bind(account)
                    .bind(*period)
                    .fetch_all(&mut *tx)
                    .await?;
                    for (victim, victim_name, victim_source) in rows {
                        let replaced = !ours.contains(&victim)
                            && match replaces {
                                Replaces::WholePeriods => true,
                                Replaces::SameName => {
                                    &victim_name == name && &victim_source == source
                                }
                            };
                        let key = (victim, (provider.clone(), account.clone(), *period));
                        if replaced && seen.insert(key.clone()) {
                            victims.push((key.0, key.1, *by));
                        }
                    }
                }
            }
            for (victim, (provider, account, period), by) in victims {
                let old: (Option<i64>, Option<i64>) = sqlx::query_as(
                    "SELECT MIN(charge_period_start_ms), MAX(charge_period_end_ms) FROM cost_lines
                     WHERE import_id = $1 AND provider = $2 AND billing_account_id = $3
                       AND billing_period_start_ms = $4",
                )
                .bind(victim)
                .bind(&provider)
                .bind(&account)
                .bind(period)
                .fetch_one(&mut *tx)
                .await?;
                if let (Some(a), Some(b)) = old {
                    spans.insert((a, b));
                }
                let deleted = sqlx::query(
                    "DELETE FROM cost_lines
                     WHERE import_id = $1 AND provider = $2 AND billing_account_id = $3
                       AND billing_period_start_ms = $4",
                )
                .bind(victim)
                .bind(&provider)
                .bind(&account)
                .bind(period)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                sqlx::query(
                    "UPDATE billing_file_periods SET replaced_ms = $1, replaced_by = $2
                     WHERE import_id = $3 AND provider = $4 AND billing_account_id = $5
                       AND billing_period_start_ms = $6",
                )
                .bind(now_ms)
                .bind(by)
                .bind(victim)
                .bind(&provider)
                .bind(&account)
                .bind(period)
                .execute(&mut *tx)
                .await?;
                for o in outcomes.iter_mut() {
                    if let ImportOutcome::Imported {
                        import_id,
                        replaced_lines,
                        ..
                    } = o
                    {
                        if *import_id == by {
                            *replaced_lines += deleted;
                        }
                    }
                }
            }
            // A file of another name adds to its periods; one that repeats most of what another
            // file in force says is a new export of the same period imported as a part, which
            // would count the period twice: refused, saying how to import it.
            if replaces == Replaces::SameName {
                for (import_id, name, _, periods) in &delivery {
                    let Some(ImportOutcome::Imported { rows, .. }) = outcomes.iter().find(|o| {
                        matches!(o, ImportOutcome::Imported { import_id: id, .. } if id == import_id)
                    }) else {
                        continue;
                    };
                    let sampled = (*rows).min(u64::from($crate::store::REPEAT_SAMPLE_LINES));
                    // Only files in force for the same periods can be repeated: usually none.
                    let mut others: Vec<(i64, String)> = Vec::new();
                    for (provider, account, period) in periods {
                        let found: Vec<(i64, String)> = sqlx::query_as(
                            "SELECT DISTINCT p.import_id, i.name
                             FROM billing_file_periods p
                             JOIN billing_imports i ON i.id = p.import_id
                             WHERE p.provider = $1 AND p.billing_account_id = $2
                               AND p.billing_period_start_ms = $3 AND p.replaced_ms IS NULL",
                        )
                        .bind(provider)
                        .bind(account)
                        .bind(*period)
                        .fetch_all(&mut *tx)
                        .await?;
                        others.extend(found.into_iter().filter(|(id, _)| !ours.contains(id)));
                    }
                    others.sort();
                    others.dedup();
                    for (other_id, other) in others {
                        // By the (import, charge period) index: a few lookups a sampled line.
                        let (repeated,): (i64,) = sqlx::query_as(
                            "SELECT COUNT(*) FROM cost_lines n
                             WHERE n.import_id = $1 AND n.line_no <= $2 AND EXISTS (
                               SELECT 1 FROM cost_lines o
                               WHERE o.import_id = $3
                                 AND o.charge_period_start_ms = n.charge_period_start_ms
                                 AND o.charge_period_end_ms = n.charge_period_end_ms
                                 AND o.provider = n.provider
                                 AND o.billing_account_id = n.billing_account_id
                                 AND COALESCE(o.resource_id, '') = COALESCE(n.resource_id, '')
                                 AND COALESCE(o.sku_id, '') = COALESCE(n.sku_id, '')
                                 AND o.charge_category = n.charge_category
                                 AND o.billed_cost = n.billed_cost
                                 AND o.effective_cost = n.effective_cost
                                 AND o.tags_json = n.tags_json
                                 AND o.extra_json = n.extra_json)",
                        )
                        .bind(*import_id)
                        .bind(i64::from($crate::store::REPEAT_SAMPLE_LINES) + 1)
                        .bind(other_id)
                        .fetch_one(&mut *tx)
                        .await?;
                        if repeated > 0 && (repeated as u64) * 2 >= sampled {
                            return Err($crate::store::StoreError::Rejected {
                                file: name.clone(),
                                error: $crate::billing::focus::FocusError::RepeatsFile {
                                    other,
                                    repeated: repeated as u64,
                                    sampled,
                                },
                            });
                        }
                    }
                }
            }
            // The hours whose attribution changes: those of new lines and of replaced ones.
            let spans: Vec<(i64, i64)> = spans.into_iter().collect();
            let hours = $crate::store::hours_of_spans(&spans);
            mark_dirty_sql(&mut tx, &hours, $crate::store::BILLING_MARK_HOST).await?;
            tx.commit().await?;
            Ok(outcomes)
        }

        async fn billing_file_periods_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::BillingFilePeriodRow>, $crate::store::StoreError> {
            let mut tx = pool.begin().await?;
            backfill_file_period_totals(&mut tx).await?;
            let rows = sqlx::query_as(
                "SELECT p.import_id, i.name, i.source, i.imported_ms, i.delivery, p.provider,
                        p.billing_account_id, p.billing_period_start_ms, p.currency, p.row_count,
                        p.billed_total, p.effective_total, p.replaced_ms, p.replaced_by
                 FROM billing_file_periods p JOIN billing_imports i ON i.id = p.import_id
                 ORDER BY p.billing_period_start_ms DESC, p.provider, p.billing_account_id,
                          i.imported_ms, i.id",
            )
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(rows)
        }

        async fn billing_imports_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::BillingImportRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT i.id, i.source, i.name, i.imported_ms, i.row_count, i.billed_total,
                        i.effective_total,
                        (SELECT COUNT(*) FROM cost_lines c WHERE c.import_id = i.id) AS current_lines
                 FROM billing_imports i ORDER BY i.id",
            )
            .fetch_all(pool)
            .await?)
        }

        async fn cost_lines_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::StoredCostLine>, $crate::store::StoreError> {
            Ok(sqlx::query_as(concat!(
                "SELECT resource_key, charge_period_start_ms, charge_period_end_ms, charge_category,
                        billed_cost, effective_cost, currency, pricing_category, instance_type ",
                $crate::store::cost_lines_in_range_sql!()
            ))
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn bill_lines_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::BillLine>, $crate::store::StoreError> {
            Ok(sqlx::query_as(concat!(
                "SELECT provider, billing_account_id, billing_period_start_ms,
                        charge_period_start_ms, charge_period_end_ms, charge_category, resource_id,
                        resource_key, billed_cost, effective_cost, list_cost, currency,
                        pricing_category, commitment_discount_id, commitment_discount_status,
                        service_name, sku_id, region, tags_json, extra_json ",
                $crate::store::cost_lines_in_range_sql!()
            ))
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn hosts_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::HostRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT id, cluster, hostname, provider, instance_id, instance_key, instance_type,
                        lifecycle
                 FROM hosts ORDER BY cluster, hostname",
            )
            .fetch_all(pool)
            .await?)
        }

        async fn attribution_windows_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::AttributionWindow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT w.host_id, w.gpu_uuid, g.parent_uuid, g.name AS gpu_name, w.start_ms, w.end_ms,
                        w.memory_total_bytes, w.util_avg, w.util_histogram, w.energy_mj
                 FROM gpu_windows w LEFT JOIN gpus g ON g.uuid = w.gpu_uuid
                 WHERE w.start_ms >= $1 AND w.start_ms < $2
                 ORDER BY w.host_id, w.start_ms, w.gpu_uuid",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        /// `select` (ending in WHERE) for rows whose `time` column is in `[from, to)` and whose
        /// `column` is one of `values`, each value bound.
        fn in_time_and_list<'a, V>(
            select: &str,
            (time, from_ms, to_ms): (&str, i64, i64),
            column: &str,
            values: &'a [V],
        ) -> sqlx::QueryBuilder<'a, $db>
        where
            V: Copy + 'a + sqlx::Encode<'a, $db> + sqlx::Type<$db>,
        {
            let mut q = sqlx::QueryBuilder::<$db>::new(select);
            q.push(format_args!(" {time} >= "))
                .push_bind(from_ms)
                .push(format_args!(" AND {time} < "))
                .push_bind(to_ms)
                .push(format_args!(" AND {column} IN ("));
            let mut list = q.separated(", ");
            for v in values {
                list.push_bind(*v);
            }
            q.push(")");
            q
        }

        async fn attribution_inputs_of_hosts_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
            host_ids: &[i64],
        ) -> Result<$crate::store::AttributionInputs, $crate::store::StoreError> {
            // Ids bound per statement: far below either database's limit on parameters (and
            // a handful in tests, so that they read in several statements).
            const IDS_PER_STATEMENT: usize = if cfg!(test) { 3 } else { 1_000 };
            let mut tx = pool.begin().await?;
            for setting in ROLLUP_READ_SETTINGS {
                sqlx::query(setting).execute(&mut *tx).await?;
            }
            let mut windows: Vec<$crate::store::AttributionWindow> = Vec::new();
            for ids in host_ids.chunks(IDS_PER_STATEMENT) {
                let mut q = in_time_and_list(
                    "SELECT w.host_id, w.gpu_uuid, g.parent_uuid, g.name AS gpu_name, w.start_ms,
                            w.end_ms, w.memory_total_bytes, w.util_avg, w.util_histogram,
                            w.energy_mj
                     FROM gpu_windows w LEFT JOIN gpus g ON g.uuid = w.gpu_uuid WHERE",
                    ("w.start_ms", from_ms, to_ms),
                    "w.host_id",
                    ids,
                );
                // Statements differ in their number of ids and are planned for their values.
                windows.extend(q.build_query_as().persistent(false).fetch_all(&mut *tx).await?);
            }
            windows.sort_by(|a, b| {
                (a.host_id, a.start_ms, &a.gpu_uuid).cmp(&(b.host_id, b.start_ms, &b.gpu_uuid))
            });
            let gpus: Vec<&str> = windows
                .iter()
                .map(|w| w.gpu_uuid.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let mut processes: Vec<$crate::store::StoredProcessWindow> = Vec::new();
            for uuids in gpus.chunks(IDS_PER_STATEMENT) {
                let mut q = in_time_and_list(
                    "SELECT gpu_uuid, start_ms, pid, process_name, memory_used_max_bytes,
                            sm_util_avg, model, experiment, endpoint, team, labels_json,
                            container_id, pod_uid, user_name
                     FROM process_windows WHERE",
                    ("start_ms", from_ms, to_ms),
                    "gpu_uuid",
                    uuids,
                );
                processes.extend(q.build_query_as().persistent(false).fetch_all(&mut *tx).await?);
            }
            processes.sort_by(|a, b| {
                (&a.gpu_uuid, a.start_ms, a.pid).cmp(&(&b.gpu_uuid, b.start_ms, b.pid))
            });
            tx.commit().await?;
            Ok((windows, processes))
        }

        async fn ce_synced_days_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<i64>, $crate::store::StoreError> {
            let rows: Vec<(i64,)> = sqlx::query_as(
                "SELECT day_ms FROM aws_ce_synced_days WHERE day_ms >= $1 AND day_ms < $2 ORDER BY day_ms",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?;
            Ok(rows.into_iter().map(|(d,)| d).collect())
        }

        async fn mark_ce_synced_sql(
            pool: &sqlx::Pool<$db>,
            days: &[i64],
            now_ms: i64,
        ) -> Result<(), $crate::store::StoreError> {
            let mut tx = pool.begin().await?;
            for day in days {
                sqlx::query(
                    "INSERT INTO aws_ce_synced_days (day_ms, synced_ms) VALUES ($1, $2)
                     ON CONFLICT (day_ms) DO UPDATE SET synced_ms = excluded.synced_ms",
                )
                .bind(day)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        }

        async fn try_lease_sql(
            pool: &sqlx::Pool<$db>,
            job: &str,
            holder: &str,
            now_ms: i64,
            ttl_ms: i64,
        ) -> Result<bool, $crate::store::StoreError> {
            // One statement, so two replicas racing for it cannot both win.
            let result = sqlx::query(
                "INSERT INTO job_leases (name, holder, expires_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_ms = excluded.expires_ms
                 WHERE job_leases.expires_ms <= $4 OR job_leases.holder = excluded.holder",
            )
            .bind(job)
            .bind(holder)
            .bind(now_ms + ttl_ms)
            .bind(now_ms)
            .execute(pool)
            .await?;
            Ok(result.rows_affected() == 1)
        }

        async fn finish_lease_sql(
            pool: &sqlx::Pool<$db>,
            job: &str,
            holder: &str,
            now_ms: i64,
        ) -> Result<(), $crate::store::StoreError> {
            sqlx::query(
                "UPDATE job_leases SET last_run_ms = $3, expires_ms = $3, holder = NULL
                 WHERE name = $1 AND holder = $2",
            )
            .bind(job)
            .bind(holder)
            .bind(now_ms)
            .execute(pool)
            .await?;
            Ok(())
        }

        async fn job_last_run_sql(
            pool: &sqlx::Pool<$db>,
            job: &str,
        ) -> Result<Option<i64>, $crate::store::StoreError> {
            let row: Option<(Option<i64>,)> =
                sqlx::query_as("SELECT last_run_ms FROM job_leases WHERE name = $1")
                    .bind(job)
                    .fetch_optional(pool)
                    .await?;
            Ok(row.and_then(|(r,)| r))
        }

        async fn create_user_sql(
            pool: &sqlx::Pool<$db>,
            username: &str,
            password_hash: &str,
            role: &str,
            now_ms: i64,
        ) -> Result<(), $crate::store::StoreError> {
            let result = sqlx::query(
                "INSERT INTO users (username, password_hash, role, created_ms) VALUES ($1, $2, $3, $4)
                 ON CONFLICT DO NOTHING",
            )
            .bind(username)
            .bind(password_hash)
            .bind(role)
            .bind(now_ms)
            .execute(pool)
            .await?;
            if result.rows_affected() == 0 {
                return Err($crate::store::StoreError::Conflict(format!("user {username:?}")));
            }
            Ok(())
        }

        async fn user_by_name_sql(
            pool: &sqlx::Pool<$db>,
            username: &str,
        ) -> Result<Option<$crate::store::UserRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT id, username, password_hash, role, created_ms FROM users WHERE username = $1",
            )
            .bind(username)
            .fetch_optional(pool)
            .await?)
        }

        async fn list_users_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::UserRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT id, username, password_hash, role, created_ms FROM users ORDER BY username",
            )
            .fetch_all(pool)
            .await?)
        }

        async fn create_session_sql(
            pool: &sqlx::Pool<$db>,
            token_hash: &str,
            user_id: i64,
            csrf_token: &str,
            now_ms: i64,
            expires_ms: i64,
        ) -> Result<(), $crate::store::StoreError> {
            // Expired sessions go as new ones come, so the table stays small.
            sqlx::query("DELETE FROM sessions WHERE expires_ms <= $1")
                .bind(now_ms)
                .execute(pool)
                .await?;
            sqlx::query(
                "INSERT INTO sessions (token_hash, user_id, csrf_token, created_ms, expires_ms)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(token_hash)
            .bind(user_id)
            .bind(csrf_token)
            .bind(now_ms)
            .bind(expires_ms)
            .execute(pool)
            .await?;
            Ok(())
        }

        async fn session_sql(
            pool: &sqlx::Pool<$db>,
            token_hash: &str,
            now_ms: i64,
        ) -> Result<Option<$crate::store::SessionRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT s.user_id, u.username, u.role, s.csrf_token, s.expires_ms
                 FROM sessions s JOIN users u ON u.id = s.user_id
                 WHERE s.token_hash = $1 AND s.expires_ms > $2",
            )
            .bind(token_hash)
            .bind(now_ms)
            .fetch_optional(pool)
            .await?)
        }

        async fn delete_session_sql(
            pool: &sqlx::Pool<$db>,
            token_hash: &str,
        ) -> Result<(), $crate::store::StoreError> {
            sqlx::query("DELETE FROM sessions WHERE token_hash = $1")
                .bind(token_hash)
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn record_sign_in_failure_sql(
            pool: &sqlx::Pool<$db>,
            username: &str,
            client: &str,
            at_ms: i64,
            forget_before_ms: i64,
        ) -> Result<(), $crate::store::StoreError> {
            let mut tx = pool.begin().await?;
            sqlx::query("DELETE FROM sign_in_failures WHERE at_ms < $1")
                .bind(forget_before_ms)
                .execute(&mut *tx)
                .await?;
            sqlx::query("INSERT INTO sign_in_failures (at_ms, username, client) VALUES ($1, $2, $3)")
                .bind(at_ms)
                .bind(username)
                .bind(client)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        }

        async fn sign_in_failures_sql(
            pool: &sqlx::Pool<$db>,
            username: &str,
            client: &str,
            since_ms: i64,
        ) -> Result<(i64, i64), $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT
                   (SELECT COUNT(*) FROM sign_in_failures WHERE username = $1 AND at_ms >= $3),
                   (SELECT COUNT(*) FROM sign_in_failures WHERE client = $2 AND at_ms >= $3)",
            )
            .bind(username)
            .bind(client)
            .bind(since_ms)
            .fetch_one(pool)
            .await?)
        }

        async fn clear_sign_in_failures_sql(
            pool: &sqlx::Pool<$db>,
            username: &str,
        ) -> Result<(), $crate::store::StoreError> {
            sqlx::query("DELETE FROM sign_in_failures WHERE username = $1")
                .bind(username)
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn upsert_usage_sql(
            pool: &sqlx::Pool<$db>,
            source: &str,
            counts: &[$crate::store::UsageCount],
            token_id: i64,
            now_ms: i64,
        ) -> Result<Option<$crate::store::Refusal>, $crate::store::StoreError> {
            let mut tx = pool.begin().await?;
            for (i, c) in counts.iter().enumerate() {
                let written = sqlx::query(concat!(
                    "INSERT INTO usage_counts
                       (endpoint, source, start_ms, end_ms, requests, token_id, received_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (endpoint, source, start_ms) DO UPDATE SET
                       end_ms = excluded.end_ms, requests = excluded.requests,
                       token_id = excluded.token_id, received_ms = excluded.received_ms
                     WHERE usage_counts.token_id = excluded.token_id
                        OR NOT EXISTS (SELECT 1 FROM api_tokens t
                                       WHERE t.id = usage_counts.token_id AND ",
                    $crate::store::token_active_sql!("t", "$7"),
                    ")"
                ))
                .bind(&c.endpoint)
                .bind(source)
                .bind(c.start_ms)
                .bind(c.end_ms)
                .bind(c.requests)
                .bind(token_id)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
                if written.rows_affected() == 0 {
                    tx.rollback().await?;
                    return Ok(Some($crate::store::Refusal {
                        kind: $crate::store::RefusalKind::SourceOfAnotherToken,
                        field: format!("counts[{i}]"),
                        message: format!(
                            "source {source:?}'s count for {} from {} ms came from another \
                             token; a source's counts are replaced only by the token that sent \
                             them",
                            c.endpoint, c.start_ms
                        ),
                    }));
                }
            }
            tx.commit().await?;
            Ok(None)
        }

        async fn usage_totals_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<(String, i64)>, $crate::store::StoreError> {
            // SUM over BIGINT is NUMERIC on PostgreSQL: cast back to a 64-bit integer.
            Ok(sqlx::query_as(
                "SELECT endpoint, CAST(SUM(requests) AS BIGINT) FROM usage_counts
                 WHERE start_ms >= $1 AND start_ms < $2
                 GROUP BY endpoint ORDER BY endpoint",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        const INCIDENT_COLUMNS: &str = "id, incident_key, kind, cluster, hostname, gpus_json, owners_json,
            devices_json, started_ms, ended_ms, last_seen_ms, cost_per_hour, estimated, wasted, last_notified_ms";
        const SLACK_COLUMNS: &str = "id, incident_id, event, route, payload, created_ms, status, attempts,
            next_attempt_ms, last_error, sent_ms";

        async fn open_incidents_sql(
            pool: &sqlx::Pool<$db>,
        ) -> Result<Vec<$crate::store::IncidentRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(&format!(
                "SELECT {INCIDENT_COLUMNS} FROM incidents WHERE ended_ms IS NULL ORDER BY id"
            ))
            .fetch_all(pool)
            .await?)
        }

        async fn incidents_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
        ) -> Result<Vec<$crate::store::IncidentRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(&format!(
                "SELECT {INCIDENT_COLUMNS} FROM incidents
                 WHERE started_ms < $2 AND (ended_ms IS NULL OR ended_ms > $1)
                 ORDER BY started_ms DESC, id DESC"
            ))
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn incident_sql(
            pool: &sqlx::Pool<$db>,
            id: i64,
        ) -> Result<Option<$crate::store::IncidentRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(&format!(
                "SELECT {INCIDENT_COLUMNS} FROM incidents WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?)
        }

        async fn insert_incident_sql(
            pool: &sqlx::Pool<$db>,
            i: &$crate::store::IncidentUpdate,
        ) -> Result<i64, $crate::store::StoreError> {
            let (id,): (i64,) = sqlx::query_as(
                "INSERT INTO incidents (incident_key, kind, cluster, hostname, gpus_json, owners_json,
                    started_ms, last_seen_ms, cost_per_hour, estimated, wasted, devices_json)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id",
            )
            .bind(&i.incident_key)
            .bind(&i.kind)
            .bind(&i.cluster)
            .bind(&i.hostname)
            .bind(&i.gpus_json)
            .bind(&i.owners_json)
            .bind(i.started_ms)
            .bind(i.last_seen_ms)
            .bind(&i.cost_per_hour)
            .bind(i64::from(i.estimated))
            .bind(&i.wasted)
            .bind(&i.devices_json)
            .fetch_one(pool)
            .await?;
            Ok(id)
        }

        async fn update_incident_sql(
            pool: &sqlx::Pool<$db>,
            id: i64,
            i: &$crate::store::IncidentUpdate,
        ) -> Result<(), $crate::store::StoreError> {
            sqlx::query(
                "UPDATE incidents SET gpus_json = $2, owners_json = $3, last_seen_ms = $4,
                    cost_per_hour = $5, estimated = $6, wasted = $7, hostname = $8,
                    devices_json = $9
                 WHERE id = $1",
            )
            .bind(id)
            .bind(&i.gpus_json)
            .bind(&i.owners_json)
            .bind(i.last_seen_ms)
            .bind(&i.cost_per_hour)
            .bind(i64::from(i.estimated))
            .bind(&i.wasted)
            .bind(&i.hostname)
            .bind(&i.devices_json)
            .execute(pool)
            .await?;
            Ok(())
        }

        async fn resolve_incident_sql(
            pool: &sqlx::Pool<$db>,
            id: i64,
            ended_ms: i64,
        ) -> Result<(), $crate::store::StoreError> {
            sqlx::query("UPDATE incidents SET ended_ms = $2 WHERE id = $1 AND ended_ms IS NULL")
                .bind(id)
                .bind(ended_ms)
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn set_incident_wasted_sql(
            pool: &sqlx::Pool<$db>,
            id: i64,
            wasted: &str,
        ) -> Result<(), $crate::store::StoreError> {
            sqlx::query("UPDATE incidents SET wasted = $2 WHERE id = $1")
                .bind(id)
                .bind(wasted)
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn idle_rollups_of_hosts_sql(
            pool: &sqlx::Pool<$db>,
            from_ms: i64,
            to_ms: i64,
            host_ids: &[i64],
        ) -> Result<Vec<$crate::store::RollupRow>, $crate::store::StoreError> {
            const IDS_PER_STATEMENT: usize = 1_000;
            let mut rows = Vec::new();
            for ids in host_ids.chunks(IDS_PER_STATEMENT) {
                let mut q = in_time_and_list(
                    "SELECT hour_ms AS period_ms, host_id, gpu_uuid, model, experiment, endpoint,
                        team, kind, pricing_category, currency, estimated, cost_nano, cost_atto,
                        gpu_seconds, util_gpu_seconds, util_known_seconds, energy_j
                     FROM rollup_hours WHERE kind IN ('idle', 'held_idle') AND",
                    ("hour_ms", from_ms, to_ms),
                    "host_id",
                    ids,
                );
                rows.extend(q.build_query_as().persistent(false).fetch_all(pool).await?);
            }
            Ok(rows)
        }

        async fn mark_incident_notified_sql(
            pool: &sqlx::Pool<$db>,
            id: i64,
            at_ms: i64,
        ) -> Result<(), $crate::store::StoreError> {
            sqlx::query("UPDATE incidents SET last_notified_ms = $2 WHERE id = $1")
                .bind(id)
                .bind(at_ms)
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn snooze_sql(
            pool: &sqlx::Pool<$db>,
            cluster: &str,
            until_ms: i64,
            by_user: &str,
            now_ms: i64,
        ) -> Result<(), $crate::store::StoreError> {
            sqlx::query(
                "INSERT INTO snoozes (cluster, until_ms, by_user, created_ms) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (cluster) DO UPDATE SET until_ms = excluded.until_ms,
                    by_user = excluded.by_user, created_ms = excluded.created_ms",
            )
            .bind(cluster)
            .bind(until_ms)
            .bind(by_user)
            .bind(now_ms)
            .execute(pool)
            .await?;
            Ok(())
        }

        async fn active_snoozes_sql(
            pool: &sqlx::Pool<$db>,
            now_ms: i64,
        ) -> Result<Vec<$crate::store::SnoozeRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(
                "SELECT cluster, until_ms, by_user FROM snoozes WHERE until_ms > $1 ORDER BY cluster",
            )
            .bind(now_ms)
            .fetch_all(pool)
            .await?)
        }

        async fn enqueue_slack_sql(
            pool: &sqlx::Pool<$db>,
            incident_id: Option<i64>,
            event: &str,
            route: &str,
            payload: &str,
            now_ms: i64,
        ) -> Result<i64, $crate::store::StoreError> {
            let (id,): (i64,) = sqlx::query_as(
                "INSERT INTO slack_messages (incident_id, event, route, payload, created_ms, status,
                    attempts, next_attempt_ms)
                 VALUES ($1, $2, $3, $4, $5, 'pending', 0, $5) RETURNING id",
            )
            .bind(incident_id)
            .bind(event)
            .bind(route)
            .bind(payload)
            .bind(now_ms)
            .fetch_one(pool)
            .await?;
            Ok(id)
        }

        async fn due_slack_messages_sql(
            pool: &sqlx::Pool<$db>,
            now_ms: i64,
            limit: i64,
        ) -> Result<Vec<$crate::store::SlackMessageRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(&format!(
                "SELECT {SLACK_COLUMNS} FROM slack_messages
                 WHERE status = 'pending' AND next_attempt_ms <= $1 ORDER BY id LIMIT $2"
            ))
            .bind(now_ms)
            .bind(limit)
            .fetch_all(pool)
            .await?)
        }

        async fn record_slack_attempt_sql(
            pool: &sqlx::Pool<$db>,
            m: &$crate::store::SlackMessageRow,
        ) -> Result<(), $crate::store::StoreError> {
            sqlx::query(
                "UPDATE slack_messages SET status = $2, attempts = $3, next_attempt_ms = $4,
                    last_error = $5, sent_ms = $6
                 WHERE id = $1",
            )
            .bind(m.id)
            .bind(&m.status)
            .bind(m.attempts)
            .bind(m.next_attempt_ms)
            .bind(&m.last_error)
            .bind(m.sent_ms)
            .execute(pool)
            .await?;
            Ok(())
        }

        async fn slack_history_sql(
            pool: &sqlx::Pool<$db>,
            limit: i64,
        ) -> Result<Vec<$crate::store::SlackMessageRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(&format!(
                "SELECT {SLACK_COLUMNS} FROM slack_messages ORDER BY id DESC LIMIT $1"
            ))
            .bind(limit)
            .fetch_all(pool)
            .await?)
        }

        async fn incident_messages_sql(
            pool: &sqlx::Pool<$db>,
            incident_id: i64,
        ) -> Result<Vec<$crate::store::SlackMessageRow>, $crate::store::StoreError> {
            Ok(sqlx::query_as(&format!(
                "SELECT {SLACK_COLUMNS} FROM slack_messages WHERE incident_id = $1 ORDER BY id"
            ))
            .bind(incident_id)
            .fetch_all(pool)
            .await?)
        }

        async fn batch_count_sql(pool: &sqlx::Pool<$db>) -> Result<i64, $crate::store::StoreError> {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ingested_batches")
                .fetch_one(pool)
                .await?;
            Ok(n)
        }
    };
}
pub(crate) use shared_sql_impl;

/// The whole `Store` impl for a backend type with a `pool` field and a `write_guard()`: every
/// method forwards to the shared SQL; writes first take the backend's write guard (SQLite
/// serialises writers; PostgreSQL needs none).
macro_rules! store_impl {
    ($store:ty, $name:literal) => {
        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            fn backend(&self) -> &'static str {
                $name
            }
            async fn ping(&self) -> Result<(), $crate::store::StoreError> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }
            async fn create_token(
                &self,
                token: &$crate::store::NewToken<'_>,
                now_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                create_token_sql(&self.pool, token, now_ms).await
            }
            async fn list_tokens(
                &self,
            ) -> Result<Vec<$crate::store::TokenRow>, $crate::store::StoreError> {
                list_tokens_sql(&self.pool).await
            }
            async fn token_by_name(
                &self,
                name: &str,
            ) -> Result<Option<$crate::store::TokenRow>, $crate::store::StoreError> {
                token_by_name_sql(&self.pool, name).await
            }
            async fn revoke_token(
                &self,
                name: &str,
                now_ms: i64,
            ) -> Result<bool, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                revoke_token_sql(&self.pool, name, now_ms).await
            }
            async fn rotate_token(
                &self,
                name: &str,
                new_hash: &str,
                old_valid_until_ms: i64,
                now_ms: i64,
            ) -> Result<bool, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                rotate_token_sql(&self.pool, name, new_hash, old_valid_until_ms, now_ms).await
            }
            async fn active_token(
                &self,
                hash: &str,
                now_ms: i64,
            ) -> Result<Option<$crate::store::TokenRow>, $crate::store::StoreError> {
                active_token_sql(&self.pool, hash, now_ms).await
            }
            async fn touch_token(
                &self,
                token_id: i64,
                now_ms: i64,
                address: Option<&str>,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                touch_token_sql(&self.pool, token_id, now_ms, address).await
            }
            async fn token_clusters(
                &self,
                token_id: i64,
            ) -> Result<Vec<String>, $crate::store::StoreError> {
                token_clusters_sql(&self.pool, token_id).await
            }
            async fn adopt_token_cluster(
                &self,
                token_id: i64,
                cluster: &str,
            ) -> Result<bool, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                adopt_token_cluster_sql(&self.pool, token_id, cluster).await
            }
            async fn rebind_host(
                &self,
                cluster: &str,
                hostname: &str,
                token_id: i64,
            ) -> Result<bool, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                rebind_host_sql(&self.pool, cluster, hostname, token_id).await
            }
            async fn record_refusal(
                &self,
                token_id: i64,
                cluster: &str,
                hostname: &str,
                refusal: &$crate::store::Refusal,
                now_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                record_refusal_sql(&self.pool, token_id, cluster, hostname, refusal, now_ms).await
            }
            async fn ingest_refusals(
                &self,
                since_ms: i64,
            ) -> Result<Vec<$crate::store::RefusalRow>, $crate::store::StoreError> {
                ingest_refusals_sql(&self.pool, since_ms).await
            }
            async fn ingest(
                &self,
                report: &gpuledger_proto::Report,
                token_id: i64,
                agent: $crate::store::AgentStatus,
                now_ms: i64,
            ) -> Result<$crate::store::IngestOutcome, $crate::store::StoreError> {
                let digest = $crate::store::report_rows::content_sha256(report)?;
                let _writer = self.write_guard().await;
                // Each backend stores a report its own way (see ingest_report in its module),
                // all of it or (a repeat, a refusal) none of it.
                ingest_report(&self.pool, report, token_id, &digest, agent, now_ms).await
            }
            async fn import_bill(
                &self,
                replaces: $crate::store::Replaces,
                files: &mut $crate::billing::BillFiles,
            ) -> Result<Vec<$crate::store::ImportOutcome>, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                import_bill_sql(&self.pool, replaces, files).await
            }
            async fn billing_file_periods(
                &self,
            ) -> Result<Vec<$crate::store::BillingFilePeriodRow>, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                billing_file_periods_sql(&self.pool).await
            }
            async fn billing_imports(
                &self,
            ) -> Result<Vec<$crate::store::BillingImportRow>, $crate::store::StoreError> {
                billing_imports_sql(&self.pool).await
            }
            async fn cost_lines(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::StoredCostLine>, $crate::store::StoreError> {
                cost_lines_sql(&self.pool, from_ms, to_ms).await
            }
            async fn bill_lines(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::BillLine>, $crate::store::StoreError> {
                bill_lines_sql(&self.pool, from_ms, to_ms).await
            }
            async fn hosts(
                &self,
            ) -> Result<Vec<$crate::store::HostRow>, $crate::store::StoreError> {
                hosts_sql(&self.pool).await
            }
            async fn attribution_windows(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::AttributionWindow>, $crate::store::StoreError> {
                attribution_windows_sql(&self.pool, from_ms, to_ms).await
            }
            async fn attribution_inputs_of_hosts(
                &self,
                from_ms: i64,
                to_ms: i64,
                host_ids: &[i64],
            ) -> Result<$crate::store::AttributionInputs, $crate::store::StoreError> {
                attribution_inputs_of_hosts_sql(&self.pool, from_ms, to_ms, host_ids).await
            }
            async fn idle_rollups_of_hosts(
                &self,
                from_ms: i64,
                to_ms: i64,
                host_ids: &[i64],
            ) -> Result<Vec<$crate::store::RollupRow>, $crate::store::StoreError> {
                idle_rollups_of_hosts_sql(&self.pool, from_ms, to_ms, host_ids).await
            }
            async fn fleet(
                &self,
            ) -> Result<Vec<$crate::store::FleetRow>, $crate::store::StoreError> {
                fleet_sql(&self.pool).await
            }
            async fn fleet_processes(
                &self,
            ) -> Result<Vec<$crate::store::FleetProcess>, $crate::store::StoreError> {
                fleet_processes_sql(&self.pool).await
            }
            async fn gpu_windows(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::StoredGpuWindow>, $crate::store::StoreError> {
                gpu_windows_sql(&self.pool, from_ms, to_ms).await
            }
            async fn process_windows(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::StoredProcessWindow>, $crate::store::StoreError> {
                process_windows_sql(&self.pool, from_ms, to_ms).await
            }
            async fn batch_count(&self) -> Result<i64, $crate::store::StoreError> {
                batch_count_sql(&self.pool).await
            }
            async fn ce_synced_days(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<i64>, $crate::store::StoreError> {
                ce_synced_days_sql(&self.pool, from_ms, to_ms).await
            }
            async fn mark_ce_synced(
                &self,
                days: &[i64],
                now_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                mark_ce_synced_sql(&self.pool, days, now_ms).await
            }
            async fn try_lease(
                &self,
                job: &str,
                holder: &str,
                now_ms: i64,
                ttl_ms: i64,
            ) -> Result<bool, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                try_lease_sql(&self.pool, job, holder, now_ms, ttl_ms).await
            }
            async fn finish_lease(
                &self,
                job: &str,
                holder: &str,
                now_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                finish_lease_sql(&self.pool, job, holder, now_ms).await
            }
            async fn job_last_run(
                &self,
                job: &str,
            ) -> Result<Option<i64>, $crate::store::StoreError> {
                job_last_run_sql(&self.pool, job).await
            }
            async fn create_user(
                &self,
                username: &str,
                password_hash: &str,
                role: &str,
                now_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                create_user_sql(&self.pool, username, password_hash, role, now_ms).await
            }
            async fn user_by_name(
                &self,
                username: &str,
            ) -> Result<Option<$crate::store::UserRow>, $crate::store::StoreError> {
                user_by_name_sql(&self.pool, username).await
            }
            async fn list_users(
                &self,
            ) -> Result<Vec<$crate::store::UserRow>, $crate::store::StoreError> {
                list_users_sql(&self.pool).await
            }
            async fn create_session(
                &self,
                token_hash: &str,
                user_id: i64,
                csrf_token: &str,
                now_ms: i64,
                expires_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                create_session_sql(
                    &self.pool, token_hash, user_id, csrf_token, now_ms, expires_ms,
                )
                .await
            }
            async fn session(
                &self,
                token_hash: &str,
                now_ms: i64,
            ) -> Result<Option<$crate::store::SessionRow>, $crate::store::StoreError> {
                session_sql(&self.pool, token_hash, now_ms).await
            }
            async fn delete_session(
                &self,
                token_hash: &str,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                delete_session_sql(&self.pool, token_hash).await
            }
            async fn record_sign_in_failure(
                &self,
                username: &str,
                client: &str,
                at_ms: i64,
                forget_before_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                record_sign_in_failure_sql(&self.pool, username, client, at_ms, forget_before_ms)
                    .await
            }
            async fn sign_in_failures(
                &self,
                username: &str,
                client: &str,
                since_ms: i64,
            ) -> Result<(i64, i64), $crate::store::StoreError> {
                sign_in_failures_sql(&self.pool, username, client, since_ms).await
            }
            async fn upsert_usage(
                &self,
                source: &str,
                counts: &[$crate::store::UsageCount],
                token_id: i64,
                now_ms: i64,
            ) -> Result<Option<$crate::store::Refusal>, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                upsert_usage_sql(&self.pool, source, counts, token_id, now_ms).await
            }
            async fn usage_totals(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<(String, i64)>, $crate::store::StoreError> {
                usage_totals_sql(&self.pool, from_ms, to_ms).await
            }
            async fn clear_sign_in_failures(
                &self,
                username: &str,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                clear_sign_in_failures_sql(&self.pool, username).await
            }
            async fn mark_dirty_hours(
                &self,
                hours: &[i64],
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                mark_dirty_hours_sql(&self.pool, hours).await
            }
            async fn dirty_marks_in(
                &self,
                from_ms: i64,
                to_ms: i64,
                limit: i64,
            ) -> Result<Vec<$crate::store::DirtyMark>, $crate::store::StoreError> {
                dirty_marks_sql(&self.pool, from_ms, to_ms, limit).await
            }
            async fn dirty_mark_count(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<i64, $crate::store::StoreError> {
                let (n,): (i64,) = sqlx::query_as(
                    "SELECT COUNT(*) FROM rollup_dirty_hours WHERE hour_ms >= $1 AND hour_ms < $2",
                )
                .bind(from_ms)
                .bind(to_ms)
                .fetch_one(&self.pool)
                .await?;
                Ok(n)
            }
            async fn raw_deleted_before(&self) -> Result<Option<i64>, $crate::store::StoreError> {
                let row: Option<(i64,)> =
                    sqlx::query_as("SELECT deleted_before_ms FROM raw_retention")
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(row.map(|(ms,)| ms))
            }
            async fn set_raw_deleted_before(
                &self,
                before_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                sqlx::query(
                    "INSERT INTO raw_retention (only_row, deleted_before_ms) VALUES (1, $1)
                     ON CONFLICT (only_row) DO UPDATE SET deleted_before_ms = excluded.deleted_before_ms
                     WHERE raw_retention.deleted_before_ms < excluded.deleted_before_ms",
                )
                .bind(before_ms)
                .execute(&self.pool)
                .await?;
                Ok(())
            }
            async fn sign_off_month(
                &self,
                s: &$crate::store::SignOffRow,
            ) -> Result<bool, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                let done = sqlx::query(
                    "INSERT INTO month_sign_offs (month_ms, signed_ms, by_user, note)
                     VALUES ($1, $2, $3, $4) ON CONFLICT (month_ms) DO NOTHING",
                )
                .bind(s.month_ms)
                .bind(s.signed_ms)
                .bind(&s.by_user)
                .bind(&s.note)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }
            async fn sign_offs(
                &self,
            ) -> Result<Vec<$crate::store::SignOffRow>, $crate::store::StoreError> {
                Ok(sqlx::query_as(
                    "SELECT month_ms, signed_ms, by_user, note FROM month_sign_offs
                     ORDER BY month_ms",
                )
                .fetch_all(&self.pool)
                .await?)
            }
            async fn add_restatement(
                &self,
                r: &$crate::store::RestatementRow,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                sqlx::query(
                    "INSERT INTO restatements (month_ms, created_ms, reason, before_json, after_json)
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(r.month_ms)
                .bind(r.created_ms)
                .bind(&r.reason)
                .bind(&r.before_json)
                .bind(&r.after_json)
                .execute(&self.pool)
                .await?;
                Ok(())
            }
            async fn restatements(
                &self,
                month_ms: i64,
            ) -> Result<Vec<$crate::store::RestatementRow>, $crate::store::StoreError> {
                Ok(sqlx::query_as(
                    "SELECT month_ms, created_ms, reason, before_json, after_json
                     FROM restatements WHERE month_ms = $1 ORDER BY created_ms, id",
                )
                .bind(month_ms)
                .fetch_all(&self.pool)
                .await?)
            }
            async fn replace_rollups(
                &self,
                marks: &[$crate::store::DirtyMark],
                rows: &[$crate::store::RollupRow],
                unattributed: &[$crate::store::UnattributedRow],
                usage: &[$crate::store::UsageRow],
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                replace_rollups_sql(&self.pool, marks, rows, unattributed, usage).await
            }
            async fn rollup_gpu_owner_totals(
                &self,
                grain: $crate::store::RollupGrain,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::RollupRow>, $crate::store::StoreError> {
                rollup_gpu_owner_totals_sql(&self.pool, grain, from_ms, to_ms).await
            }
            async fn recommendation_snapshot(
                &self,
                from_ms: i64,
                to_ms: i64,
                observed_ms: i64,
            ) -> Result<Option<(i64, String)>, $crate::store::StoreError> {
                Ok(sqlx::query_as(
                    "SELECT computed_ms, body FROM recommendation_snapshots
                     WHERE from_ms = $1 AND to_ms = $2 AND observed_ms = $3",
                )
                .bind(from_ms)
                .bind(to_ms)
                .bind(observed_ms)
                .fetch_optional(&self.pool)
                .await?)
            }
            async fn put_recommendation_snapshot(
                &self,
                from_ms: i64,
                to_ms: i64,
                observed_ms: i64,
                computed_ms: i64,
                body: &str,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                sqlx::query(
                    "INSERT INTO recommendation_snapshots
                        (from_ms, to_ms, observed_ms, computed_ms, body)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (from_ms, to_ms, observed_ms)
                     DO UPDATE SET computed_ms = EXCLUDED.computed_ms, body = EXCLUDED.body",
                )
                .bind(from_ms)
                .bind(to_ms)
                .bind(observed_ms)
                .bind(computed_ms)
                .bind(body)
                .execute(&self.pool)
                .await?;
                Ok(())
            }
            async fn expire_recommendation_snapshots(
                &self,
                before_ms: i64,
            ) -> Result<u64, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                Ok(sqlx::query(
                    "DELETE FROM recommendation_snapshots
                     WHERE computed_ms < to_ms AND computed_ms < $1",
                )
                .bind(before_ms)
                .execute(&self.pool)
                .await?
                .rows_affected())
            }
            async fn mig_instances(&self) -> Result<Vec<String>, $crate::store::StoreError> {
                mig_instances_sql(&self.pool).await
            }
            async fn rollup_usage(
                &self,
                grain: $crate::store::RollupGrain,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::UsageTotal>, $crate::store::StoreError> {
                rollup_usage_sql(&self.pool, grain, from_ms, to_ms).await
            }
            async fn rollup_rows(
                &self,
                grain: $crate::store::RollupGrain,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::RollupRow>, $crate::store::StoreError> {
                rollup_rows_sql(&self.pool, grain, from_ms, to_ms).await
            }
            async fn has_rollups(
                &self,
                from_ms: i64,
                to_ms: i64,
                from_windows_only: bool,
            ) -> Result<bool, $crate::store::StoreError> {
                has_rollups_sql(&self.pool, from_ms, to_ms, from_windows_only).await
            }
            async fn rollup_unattributed(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::UnattributedRow>, $crate::store::StoreError> {
                rollup_unattributed_sql(&self.pool, from_ms, to_ms).await
            }
            async fn gpu_windows_per_hour_and_host(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<(i64, i64, i64)>, $crate::store::StoreError> {
                gpu_windows_per_hour_and_host_sql(&self.pool, from_ms, to_ms).await
            }
            async fn rollup_top_gpus(
                &self,
                from_ms: i64,
                to_ms: i64,
                limit: i64,
            ) -> Result<(Vec<String>, i64), $crate::store::StoreError> {
                rollup_top_gpus_sql(&self.pool, from_ms, to_ms, limit).await
            }
            async fn rollup_gpu_days(
                &self,
                from_ms: i64,
                to_ms: i64,
                gpus: &[String],
            ) -> Result<Vec<$crate::store::RollupRow>, $crate::store::StoreError> {
                rollup_gpu_days_sql(&self.pool, from_ms, to_ms, gpus).await
            }
            async fn rollup_experiment_days(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::ExperimentDayRow>, $crate::store::StoreError> {
                rollup_experiment_days_sql(&self.pool, from_ms, to_ms).await
            }
            async fn rollup_costs(
                &self,
                grain: $crate::store::RollupGrain,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::CurrencyCostRow>, $crate::store::StoreError> {
                rollup_costs_sql(&self.pool, grain, from_ms, to_ms).await
            }
            async fn delete_raw_before(
                &self,
                before_ms: i64,
                limit: i64,
            ) -> Result<u64, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                delete_raw_before_sql(&self.pool, before_ms, limit).await
            }
            async fn open_incidents(
                &self,
            ) -> Result<Vec<$crate::store::IncidentRow>, $crate::store::StoreError> {
                open_incidents_sql(&self.pool).await
            }
            async fn incidents(
                &self,
                from_ms: i64,
                to_ms: i64,
            ) -> Result<Vec<$crate::store::IncidentRow>, $crate::store::StoreError> {
                incidents_sql(&self.pool, from_ms, to_ms).await
            }
            async fn incident(
                &self,
                id: i64,
            ) -> Result<Option<$crate::store::IncidentRow>, $crate::store::StoreError> {
                incident_sql(&self.pool, id).await
            }
            async fn insert_incident(
                &self,
                incident: &$crate::store::IncidentUpdate,
            ) -> Result<i64, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                insert_incident_sql(&self.pool, incident).await
            }
            async fn update_incident(
                &self,
                id: i64,
                incident: &$crate::store::IncidentUpdate,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                update_incident_sql(&self.pool, id, incident).await
            }
            async fn resolve_incident(
                &self,
                id: i64,
                ended_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                resolve_incident_sql(&self.pool, id, ended_ms).await
            }
            async fn mark_incident_notified(
                &self,
                id: i64,
                at_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                mark_incident_notified_sql(&self.pool, id, at_ms).await
            }
            async fn set_incident_wasted(
                &self,
                id: i64,
                wasted: &str,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                set_incident_wasted_sql(&self.pool, id, wasted).await
            }
            async fn snooze(
                &self,
                cluster: &str,
                until_ms: i64,
                by_user: &str,
                now_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                snooze_sql(&self.pool, cluster, until_ms, by_user, now_ms).await
            }
            async fn active_snoozes(
                &self,
                now_ms: i64,
            ) -> Result<Vec<$crate::store::SnoozeRow>, $crate::store::StoreError> {
                active_snoozes_sql(&self.pool, now_ms).await
            }
            async fn enqueue_slack(
                &self,
                incident_id: Option<i64>,
                event: &str,
                route: &str,
                payload: &str,
                now_ms: i64,
            ) -> Result<i64, $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                enqueue_slack_sql(&self.pool, incident_id, event, route, payload, now_ms).await
            }
            async fn due_slack_messages(
                &self,
                now_ms: i64,
                limit: i64,
            ) -> Result<Vec<$crate::store::SlackMessageRow>, $crate::store::StoreError> {
                due_slack_messages_sql(&self.pool, now_ms, limit).await
            }
            async fn record_slack_attempt(
                &self,
                message: &$crate::store::SlackMessageRow,
            ) -> Result<(), $crate::store::StoreError> {
                let _writer = self.write_guard().await;
                record_slack_attempt_sql(&self.pool, message).await
            }
            async fn slack_history(
                &self,
                limit: i64,
            ) -> Result<Vec<$crate::store::SlackMessageRow>, $crate::store::StoreError> {
                slack_history_sql(&self.pool, limit).await
            }
            async fn incident_messages(
                &self,
                incident_id: i64,
            ) -> Result<Vec<$crate::store::SlackMessageRow>, $crate::store::StoreError> {
                incident_messages_sql(&self.pool, incident_id).await
            }
        }
    };
}
pub(crate) use store_impl;
