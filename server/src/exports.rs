//! Scheduled exports: each day's allocation, once the day is settled, and each month's, once it
//! closes, written as FOCUS (CSV and/or Parquet, the same bytes `GET /api/v1/allocation?
//! format=focus` gives) to an S3 bucket, then a manifest naming the files, their sizes and
//! SHA-256. The manifest is written last, so a reader that finds it finds whole files.
//!
//! One replica at a time (the job's lease). A period is exported once: its row in `exports`
//! says done; rewriting it would write the same keys with the same bytes. A failure (the store
//! down, a refused write) is recorded with its error and tried again later, with backoff; it is
//! on the billing page and in `/metrics` until a try succeeds. Files are streamed up in parts,
//! so a month of a large fleet never sits whole in memory.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use chrono::{DateTime, NaiveDate};
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::config::{Config, ExportConfig, ExportFormat};
use crate::focus_export::{self, Format, Selection};
use crate::metrics::Metrics;

use crate::store::{self, Store, StoreError};
use gpuledger_core::time::{day_floor, month_start_ms, next_month_start, rfc3339, DAY_MS};

use crate::store::exports::{ExportHealth, ExportRow};

pub const EXPORT_JOB: &str = "s3-export";
/// Long enough for a month of a large fleet; a replica that dies mid-run frees the job after.
const LEASE_MS: i64 = 3 * 3_600_000;
/// S3 takes parts of 5 MiB at least (but the last); 8 MiB keeps memory small and parts few.
const PART_BYTES: usize = 8 * 1024 * 1024;
/// The wait before the first retry, doubled each failure up to [`MAX_BACKOFF_MS`].
const FIRST_BACKOFF_MS: i64 = 5 * 60_000;
const MAX_BACKOFF_MS: i64 = 6 * 3_600_000;

/// A bucket to write to.
#[derive(Clone)]
pub struct Target {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
}

impl Target {
    /// The bucket of `[export]`, with credentials from the usual AWS places.
    pub async fn from_config(c: &ExportConfig) -> Target {
        let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .load()
            .await;
        let mut builder = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(c.force_path_style)
            // Checksums only where S3 requires them: many S3-compatible stores refuse the
            // newer default trailers.
            .request_checksum_calculation(
                aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
            );
        if let Some(region) = &c.region {
            builder = builder.region(aws_sdk_s3::config::Region::new(region.clone()));
        }
        if let Some(url) = &c.endpoint_url {
            builder = builder.endpoint_url(url);
        }
        Target {
            client: aws_sdk_s3::Client::from_conf(builder.build()),
            bucket: c.bucket.clone(),
            prefix: c.prefix.trim_matches('/').to_owned(),
        }
    }

    fn key(&self, rest: &str) -> String {
        if self.prefix.is_empty() {
            rest.to_owned()
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }
}

/// What is exported: a UTC day, or a calendar month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Day(NaiveDate),
    Month(NaiveDate),
}

impl Period {
    fn start(self) -> NaiveDate {
        match self {
            Period::Day(d) | Period::Month(d) => d,
        }
    }

    pub fn range(self) -> (i64, i64) {
        let start = ms_of(self.start());
        match self {
            Period::Day(_) => (start, start + DAY_MS),
            Period::Month(_) => (start, next_month_start(start)),
        }
    }

    /// `day:2026-11-24` or `month:2026-10`: its row in `exports`.
    pub fn name(self) -> String {
        match self {
            Period::Day(d) => format!("day:{}", d.format("%Y-%m-%d")),
            Period::Month(d) => format!("month:{}", d.format("%Y-%m")),
        }
    }

    /// The period a row names ([`Period::name`]'s form).
    pub fn parse(name: &str) -> Option<Period> {
        match name.split_once(':')? {
            ("day", d) => NaiveDate::parse_from_str(d, "%Y-%m-%d")
                .ok()
                .map(Period::Day),
            ("month", m) => NaiveDate::parse_from_str(&format!("{m}-01"), "%Y-%m-%d")
                .ok()
                .map(Period::Month),
            _ => None,
        }
    }

    /// Where its files go under the prefix.
    fn folder(self) -> String {
        match self {
            Period::Day(d) => format!("daily/{}", d.format("%Y/%m/%d")),
            Period::Month(d) => format!("monthly/{}", d.format("%Y/%m")),
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Period::Day(_) => "day",
            Period::Month(_) => "month",
        }
    }
}

fn date_of(ms: i64) -> NaiveDate {
    DateTime::from_timestamp_millis(ms)
        .map(|d| d.date_naive())
        .unwrap_or_default()
}

fn ms_of(d: NaiveDate) -> i64 {
    d.and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc().timestamp_millis())
        .unwrap_or_default()
}

#[derive(Debug, thiserror::Error)]
pub enum ExportFailure {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Export(#[from] focus_export::ExportError),
    #[error("object storage: {0}")]
    S3(String),
}

fn s3<E: std::error::Error + 'static>(e: E) -> ExportFailure {
    ExportFailure::S3(DisplayErrorContext(e).to_string())
}

/// One file written, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct FileWritten {
    pub key: String,
    pub format: String,
    pub bytes: u64,
    pub sha256: String,
}

/// The periods to export at `now`: settled days of the last `catch_up_days` and closed months
/// of the last two, not done yet and not waiting out a failure's backoff (unless `retry_now`),
/// none before the ledger's first day.
pub async fn due(
    store: &dyn Store,
    export: &ExportConfig,
    close: crate::closing::ClosePolicy,
    now: i64,
    retry_now: bool,
) -> Result<Vec<Period>, StoreError> {
    let Some(first) = store::ledger::first_day(store.db()).await? else {
        return Ok(Vec::new());
    };
    let close = close.current(store).await?;
    let settle = export.settle.as_millis() as i64;
    let mut candidates = Vec::new();
    let today = day_floor(now);
    for back in (1..=i64::from(export.catch_up_days)).rev() {
        let start = today - back * DAY_MS;
        let end = start + DAY_MS;
        if start >= first && end + settle <= now {
            candidates.push(Period::Day(date_of(start)));
        }
    }
    let this_month = month_start_ms(now);
    for month in [
        month_start_ms(month_start_ms(this_month - 1) - 1),
        month_start_ms(this_month - 1),
    ] {
        if next_month_start(month) > first && close.is_closed(month, now) {
            candidates.push(Period::Month(date_of(month)));
        }
    }
    // A period that failed is tried again however long ago it was, until it succeeds.
    for r in store::exports::failed(store.db()).await? {
        if let Some(p) = Period::parse(&r.period) {
            if !candidates.contains(&p) {
                candidates.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for p in candidates {
        let (from, to) = p.range();
        // Hours still waiting for the roll-up: the figures may yet change.
        if crate::closing::pending_hours(store, from, to).await? > 0 {
            continue;
        }
        match store::exports::get(store.db(), &p.name()).await? {
            Some(r) if r.status == "done" => {}
            Some(r) if !retry_now && r.next_attempt_ms > now => {}
            _ => out.push(p),
        }
    }
    Ok(out)
}

/// Writes `period`'s files and then its manifest; what was written.
pub async fn export(
    store: &dyn Store,
    config: &Config,
    target: &Target,
    formats: &[ExportFormat],
    period: Period,
    now: i64,
) -> Result<(String, Vec<FileWritten>), ExportFailure> {
    let (from, to) = period.range();
    let folder = target.key(&period.folder());
    let mut files = Vec::new();
    for format in formats {
        let (name, fmt, content_type) = match format {
            ExportFormat::Csv => ("allocation.csv", Format::Csv, "text/csv; charset=utf-8"),
            ExportFormat::Parquet => (
                "allocation.parquet",
                Format::Parquet,
                "application/vnd.apache.parquet",
            ),
        };
        let key = format!("{folder}/{name}");
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let selection = Selection::everything(&config.owners);
        let writing = async move {
            let r = focus_export::write_export(store, from, to, &selection, fmt, &tx).await;
            drop(tx);
            r
        };
        let (written, uploaded) =
            tokio::join!(writing, upload_parts(target, &key, content_type, rx));
        let upload = uploaded?;
        if let Err(e) = written {
            upload.abort(target).await;
            return Err(e.into());
        }
        files.push(upload.complete(target, format_name(*format)).await?);
    }
    let manifest_key = format!("{folder}/manifest.json");
    let manifest = json!({
        "manifest_version": 1,
        "generator": format!("gpuledger {}", env!("CARGO_PKG_VERSION")),
        "period": { "kind": period.kind(), "start": rfc3339(from), "end": rfc3339(to) },
        "exported_at": rfc3339(now),
        "files": files,
    });
    target
        .client
        .put_object()
        .bucket(&target.bucket)
        .key(&manifest_key)
        .content_type("application/json")
        .body(ByteStream::from(
            serde_json::to_vec_pretty(&manifest).unwrap_or_default(),
        ))
        .send()
        .await
        .map_err(s3)?;
    Ok((manifest_key, files))
}

fn format_name(f: ExportFormat) -> &'static str {
    match f {
        ExportFormat::Csv => "csv",
        ExportFormat::Parquet => "parquet",
    }
}

/// A multipart upload with its parts sent, not yet completed.
struct Upload {
    key: String,
    upload_id: String,
    parts: Vec<CompletedPart>,
    bytes: u64,
    sha256: Sha256,
}

impl Upload {
    async fn complete(self, target: &Target, format: &str) -> Result<FileWritten, ExportFailure> {
        let completed = target
            .client
            .complete_multipart_upload()
            .bucket(&target.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(self.parts.clone()))
                    .build(),
            )
            .send()
            .await;
        if let Err(e) = completed {
            self.abort(target).await;
            return Err(s3(e));
        }
        Ok(FileWritten {
            key: self.key,
            format: format.to_owned(),
            bytes: self.bytes,
            sha256: hex::encode(self.sha256.finalize()),
        })
    }

    /// Gives the parts up, so that no half file is left behind (nor billed).
    async fn abort(self, target: &Target) {
        let _ = target
            .client
            .abort_multipart_upload()
            .bucket(&target.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .send()
            .await;
    }
}

/// Sends what arrives on `rx` as the parts of `key`, [`PART_BYTES`] at a time.
async fn upload_parts(
    target: &Target,
    key: &str,
    content_type: &str,
    mut rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
) -> Result<Upload, ExportFailure> {
    let created = target
        .client
        .create_multipart_upload()
        .bucket(&target.bucket)
        .key(key)
        .content_type(content_type)
        .send()
        .await
        .map_err(s3)?;
    let Some(upload_id) = created.upload_id() else {
        return Err(ExportFailure::S3(format!(
            "the store started no multipart upload for {key} (no upload id)"
        )));
    };
    let mut upload = Upload {
        key: key.to_owned(),
        upload_id: upload_id.to_owned(),
        parts: Vec::new(),
        bytes: 0,
        sha256: Sha256::new(),
    };
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let chunk = rx.recv().await;
        let ended = chunk.is_none();
        if let Some(chunk) = chunk {
            match chunk {
                Ok(bytes) => buffer.extend_from_slice(&bytes),
                Err(e) => {
                    upload.abort(target).await;
                    return Err(ExportFailure::S3(format!("reading the export: {e}")));
                }
            }
        }
        // A part once full; the rest at the end (a file has one part at least).
        if buffer.len() >= PART_BYTES || (ended && (!buffer.is_empty() || upload.parts.is_empty()))
        {
            let part = std::mem::take(&mut buffer);
            if let Err(e) = send_part(target, &mut upload, part).await {
                upload.abort(target).await;
                return Err(e);
            }
        }
        if ended {
            return Ok(upload);
        }
    }
}

async fn send_part(
    target: &Target,
    upload: &mut Upload,
    part: Vec<u8>,
) -> Result<(), ExportFailure> {
    let number = upload.parts.len() as i32 + 1;
    upload.sha256.update(&part);
    upload.bytes += part.len() as u64;
    let sent = target
        .client
        .upload_part()
        .bucket(&target.bucket)
        .key(&upload.key)
        .upload_id(&upload.upload_id)
        .part_number(number)
        .body(ByteStream::from(part))
        .send()
        .await
        .map_err(s3)?;
    upload.parts.push(
        CompletedPart::builder()
            .part_number(number)
            .set_e_tag(sent.e_tag().map(str::to_owned))
            .build(),
    );
    Ok(())
}

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RunSummary {
    pub exported: Vec<String>,
    /// Each period that failed, with why.
    pub failed: Vec<(String, String)>,
    /// Another replica holds the job.
    pub skipped: bool,
}

/// Exports whatever is due, if this replica gets the job's lease; records each period's
/// outcome (and counts it in `metrics`).
pub async fn run_due(
    store: &dyn Store,
    config: &Config,
    export_config: &ExportConfig,
    target: &Target,
    (close, holder): (crate::closing::ClosePolicy, &str),
    metrics: Option<&Metrics>,
    retry_now: bool,
) -> Result<RunSummary, StoreError> {
    let now = crate::clock::now_ms();
    if !store::jobs::try_lease(store.db(), EXPORT_JOB, holder, now, LEASE_MS).await? {
        return Ok(RunSummary {
            skipped: true,
            ..Default::default()
        });
    }
    let result = run_leased(
        store,
        (config, export_config),
        target,
        (close, holder),
        metrics,
        retry_now,
    )
    .await;
    store::jobs::finish_lease(store.db(), EXPORT_JOB, holder, crate::clock::now_ms()).await?;
    result
}

async fn run_leased(
    store: &dyn Store,
    (config, export_config): (&Config, &ExportConfig),
    target: &Target,
    (close, holder): (crate::closing::ClosePolicy, &str),
    metrics: Option<&Metrics>,
    retry_now: bool,
) -> Result<RunSummary, StoreError> {
    let mut summary = RunSummary::default();
    for period in due(
        store,
        export_config,
        close,
        crate::clock::now_ms(),
        retry_now,
    )
    .await?
    {
        // The lease again for each period, so a long catch-up keeps it; lost, stop here.
        if !store::jobs::try_lease(
            store.db(),
            EXPORT_JOB,
            holder,
            crate::clock::now_ms(),
            LEASE_MS,
        )
        .await?
        {
            break;
        }
        let name = period.name();
        let (start_ms, end_ms) = period.range();
        let before = store::exports::get(store.db(), &name).await?;
        if before.as_ref().is_some_and(|r| r.status == "done") {
            continue;
        }
        let attempts = before.as_ref().map_or(0, |r| r.attempts) + 1;
        let now = crate::clock::now_ms();
        let outcome = export(store, config, target, &export_config.formats, period, now).await;
        let row = match outcome {
            Ok((manifest_key, files)) => {
                tracing::info!(period = %name, files = files.len(), "exported to object storage");
                summary.exported.push(name.clone());
                ExportRow {
                    period: name,
                    start_ms,
                    end_ms,
                    status: "done".into(),
                    attempts,
                    next_attempt_ms: now,
                    last_error: None,
                    manifest_key: Some(manifest_key),
                    files_json: serde_json::to_string(&files).ok(),
                    updated_ms: crate::clock::now_ms(),
                }
            }
            Err(e) => {
                let backoff = (FIRST_BACKOFF_MS << (attempts - 1).clamp(0, 20)).min(MAX_BACKOFF_MS);
                tracing::error!(period = %name, attempts, error = %e, "export failed; will retry");
                summary.failed.push((name.clone(), e.to_string()));
                ExportRow {
                    period: name,
                    start_ms,
                    end_ms,
                    status: "failed".into(),
                    attempts,
                    next_attempt_ms: now + backoff,
                    last_error: Some(crate::format::clip(&e.to_string(), 2_000)),
                    manifest_key: None,
                    files_json: None,
                    updated_ms: crate::clock::now_ms(),
                }
            }
        };
        if let Some(m) = metrics {
            m.export_outcome(&row.status);
        }
        store::exports::put(store.db(), &row).await?;
    }
    Ok(summary)
}

/// The latest periods' states, newest first, then any failed period older than those: for the
/// billing page and the command line.
pub async fn recent(store: &dyn Store, limit: i64) -> Result<Vec<ExportRow>, StoreError> {
    let mut rows = store::exports::recent(store.db(), limit).await?;
    // A failure stays listed until it is written, however many periods were exported since.
    for f in store::exports::failed(store.db()).await? {
        if !rows.iter().any(|r| r.period == f.period) {
            rows.push(f);
        }
    }
    Ok(rows)
}

/// How many periods are failing and when the latest was written, for `/metrics`.
pub async fn health(store: &dyn Store) -> Result<ExportHealth, StoreError> {
    store::exports::health(store.db()).await
}

/// Runs [`run_due`] every `check_every`, for as long as the server runs.
pub fn spawn(
    store: Arc<dyn Store>,
    config: Arc<Config>,
    target: Target,
    close: crate::closing::ClosePolicy,
    metrics: Arc<Metrics>,
) -> Option<tokio::task::JoinHandle<()>> {
    let export_config = config.export.clone()?;
    let holder = crate::jobs::holder_name();
    let every = export_config.check_every.max(Duration::from_secs(1));
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let run = run_due(
                store.as_ref(),
                &config,
                &export_config,
                &target,
                (close, &holder),
                Some(&metrics),
                false,
            )
            .await;
            if let Err(e) = run {
                tracing::error!(error = %e, "export job: the database");
            }
        }
    }))
}

/// The day a period row starts, for people (`2026-11-24`, or `2026-10` for a month).
pub fn label(row: &ExportRow) -> String {
    row.period
        .split_once(':')
        .map_or_else(|| row.period.clone(), |(_, p)| p.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Datelike;

    #[test]
    fn a_period_reads_back_from_its_name() {
        let d = NaiveDate::from_ymd_opt(2026, 2, 28).unwrap();
        let m = NaiveDate::from_ymd_opt(2026, 2, 1).unwrap();
        for p in [Period::Day(d), Period::Month(m)] {
            assert_eq!(Period::parse(&p.name()), Some(p));
        }
        for bad in ["day:2026-02-30", "week:2026-01", "2026-01-01", "month:2026"] {
            assert_eq!(Period::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn periods_name_their_rows_and_folders() {
        let d = NaiveDate::from_ymd_opt(2026, 11, 24).unwrap();
        assert_eq!(Period::Day(d).name(), "day:2026-11-24");
        assert_eq!(Period::Day(d).folder(), "daily/2026/11/24");
        let (from, to) = Period::Day(d).range();
        assert_eq!(
            (rfc3339(from).as_str(), to - from),
            ("2026-11-24T00:00:00Z", DAY_MS)
        );
        let m = NaiveDate::from_ymd_opt(2026, 10, 1).unwrap();
        assert_eq!(Period::Month(m).name(), "month:2026-10");
        assert_eq!(Period::Month(m).folder(), "monthly/2026/10");
        let (from, to) = Period::Month(m).range();
        assert_eq!(rfc3339(to), "2026-11-01T00:00:00Z");
        assert_eq!(date_of(from).month(), 10);
    }
}
