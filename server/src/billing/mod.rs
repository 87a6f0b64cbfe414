//! Billing sources, all producing [`CostLine`]s: FOCUS exports (`focus`, with `parquet`), AWS
//! Cost Explorer (`aws`), and the rate card for hosts with no bill (`ratecard`).

pub mod aws;
pub mod current_price;
pub mod focus;
pub mod focus_csv;
pub mod focus_file;
pub mod gpu_instances;
pub mod import;
pub mod manifest;
mod parquet;
pub mod periods;
pub mod ratecard;

use std::path::{Path, PathBuf};

use rust_decimal::Decimal;
use sha2::{Digest, Sha256};

use crate::store;
use crate::store::bills::LineChunks;
use crate::store::bills::NewImport;
use crate::store::{ImportOutcome, Replaces, Store, StoreError};
use gpuledger_core::bill::{normalize_resource_id, CostLine};

/// FOCUS 1.0 says On-Demand / Commitment-Based / Dynamic; 1.1+ says Standard / Committed /
/// Dynamic. Usage covered by a commitment counts as committed whatever the column says.
pub fn pricing_category(focus: &str, commitment_status: Option<&str>) -> String {
    if commitment_status.is_some_and(|s| s.eq_ignore_ascii_case("used")) {
        return "committed".into();
    }
    match focus.trim().to_ascii_lowercase().as_str() {
        "standard" | "on-demand" | "ondemand" | "on_demand" => "on_demand",
        "committed" | "commitment-based" => "committed",
        "dynamic" | "spot" => "spot",
        _ => "other",
    }
    .into()
}

/// What an import did, for the CLI and the API.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    pub import_id: i64,
    /// False when this exact file had been imported before: nothing changed.
    pub new: bool,
    pub rows: u64,
    /// Per currency: never one total over dollars and euros.
    pub totals: crate::store::CurrencyTotals,
    /// Lines of earlier imports for the same billing periods that this one replaced.
    pub replaced_lines: u64,
}

impl ImportSummary {
    /// "billed 1.25 USD + 3.10 EUR, effective 1.20 USD + 3.00 EUR": each currency its own
    /// exact sum, as the file adds up.
    pub fn totals_text(&self) -> String {
        let each = |pick: fn(&crate::store::PeriodTotals) -> Decimal| {
            let parts: Vec<String> = self
                .totals
                .iter()
                .map(|(currency, t)| format!("{} {currency}", pick(t)))
                .collect();
            if parts.is_empty() {
                "0".to_owned()
            } else {
                parts.join(" + ")
            }
        };
        format!(
            "billed {}, effective {}",
            each(|t| t.billed),
            each(|t| t.effective)
        )
    }
}

/// Lines a chunk; a few chunks in flight bound memory whatever the file's size.
const CHUNK_LINES: usize = 1_000;

/// Reads `lines` on a blocking thread and hands them over in chunks, so parsing (CPU) and
/// storing (the database) run side by side and memory stays bounded. Stops at the first
/// error, which is handed over last, or as soon as the receiver is gone.
pub fn chunks_of<I>(lines: I) -> LineChunks
where
    I: IntoIterator<Item = Result<CostLine, gpuledger_core::bill::FocusError>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        let mut chunk = Vec::with_capacity(CHUNK_LINES);
        for line in lines {
            match line {
                Ok(l) => chunk.push(l),
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
            if chunk.len() == CHUNK_LINES {
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK_LINES));
                if tx.blocking_send(Ok(full)).is_err() {
                    return;
                }
            }
        }
        if !chunk.is_empty() {
            let _ = tx.blocking_send(Ok(chunk));
        }
    });
    rx
}

/// `lines` as they are, each chunk's rows told to `progress` on the way.
fn counted(
    mut lines: LineChunks,
    progress: std::sync::Arc<dyn crate::progress::Progress>,
) -> LineChunks {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while let Some(chunk) = lines.recv().await {
            if let Ok(rows) = &chunk {
                progress.advance(rows.len() as u64);
            }
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
    });
    rx
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The SHA-256 of a file, read in blocks.
fn sha256_of_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// One file of a bill to import.
pub enum BillFile {
    /// A FOCUS export on disk (CSV, CSV.gz or Parquet), read as a stream; refused unless it
    /// holds `expected_rows` where its manifest says how many.
    FocusPath {
        path: PathBuf,
        name: String,
        expected_rows: Option<u64>,
    },
    /// A FOCUS export in memory (the demo).
    FocusBytes { name: String, bytes: Vec<u8> },
    /// Lines already parsed (Cost Explorer answers, tests), named by the hash given.
    Lines {
        source: String,
        name: String,
        content_sha256: String,
        lines: Vec<CostLine>,
    },
}

impl BillFile {
    /// Its import record and its lines, parsing on a blocking thread. A file that cannot be
    /// opened hands over its error as its lines, so it is refused like any bad row.
    async fn open(self, now_ms: i64, delivery: Option<String>) -> (NewImport, LineChunks) {
        let import = |source: &str, name: String, content_sha256: String| NewImport {
            source: source.to_owned(),
            name,
            content_sha256,
            imported_ms: now_ms,
            delivery: delivery.clone(),
        };
        let failed = |e: gpuledger_core::bill::FocusError| chunks_of(std::iter::once(Err(e)));
        match self {
            BillFile::FocusPath {
                path,
                name,
                expected_rows,
            } => {
                let opened = tokio::task::spawn_blocking(move || {
                    let sha = sha256_of_file(&path)
                        .map_err(|e| gpuledger_core::bill::FocusError::Io(e.to_string()))?;
                    let rows = focus_file::open_path(&path)?.expecting_rows(expected_rows);
                    Ok::<_, gpuledger_core::bill::FocusError>((sha, rows))
                })
                .await
                .unwrap_or_else(|e| Err(gpuledger_core::bill::FocusError::Io(e.to_string())));
                match opened {
                    Ok((sha, rows)) => (import("focus", name, sha), chunks_of(rows)),
                    Err(e) => (import("focus", name, String::new()), failed(e)),
                }
            }
            BillFile::FocusBytes { name, bytes } => {
                let sha = sha256_hex(&bytes);
                match focus_file::open_bytes(bytes) {
                    Ok(rows) => (import("focus", name, sha), chunks_of(rows)),
                    Err(e) => (import("focus", name, sha), failed(e)),
                }
            }
            BillFile::Lines {
                source,
                name,
                content_sha256,
                lines,
            } => (
                import(&source, name, content_sha256),
                chunks_of(lines.into_iter().map(Ok)),
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A file is refused; nothing of the delivery was stored.
    #[error("{file}: {error}")]
    Focus {
        file: String,
        error: gpuledger_core::bill::FocusError,
    },
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for ImportError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Rejected { file, error } => ImportError::Focus { file, error },
            e => ImportError::Store(e),
        }
    }
}

/// Imports the files of one delivery in one transaction: all of them, or (on any error) none.
/// Each file is parsed while the one before it is stored; memory stays bounded whatever their
/// size. `replaces` says which earlier files of the same periods they replace.
pub async fn import_files(
    store: &dyn Store,
    replaces: Replaces,
    delivery: Option<String>,
    files: Vec<BillFile>,
    now_ms: i64,
) -> Result<Vec<ImportSummary>, ImportError> {
    let silent = std::sync::Arc::new(crate::progress::Silent);
    import_files_reporting(store, replaces, delivery, files, now_ms, silent).await
}

/// [`import_files`], saying each file as it begins and the rows as they are read.
pub async fn import_files_reporting(
    store: &dyn Store,
    replaces: Replaces,
    delivery: Option<String>,
    files: Vec<BillFile>,
    now_ms: i64,
    progress: std::sync::Arc<dyn crate::progress::Progress>,
) -> Result<Vec<ImportSummary>, ImportError> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        for file in files {
            let (import, lines) = file.open(now_ms, delivery.clone()).await;
            progress.part(&import.name);
            let lines = counted(lines, progress.clone());
            if tx.send((import, lines)).await.is_err() {
                return;
            }
        }
    });
    let outcomes = import::delivery(store, replaces, &mut rx).await?;
    Ok(outcomes.into_iter().map(ImportSummary::from).collect())
}

/// Each FOCUS file's first error (`None` for one that reads to its end), read without storing
/// anything: what an upload refused whole says of every file chosen with the bad one, so the
/// next try fixes them all at once. `expected_rows` as the export's manifest says.
pub async fn first_errors(
    files: Vec<(String, PathBuf, Option<u64>)>,
) -> Vec<(String, Option<String>)> {
    let names: Vec<String> = files.iter().map(|f| f.0.clone()).collect();
    let checked = tokio::task::spawn_blocking(move || {
        files
            .into_iter()
            .map(|(name, path, expected_rows)| {
                let error = match focus_file::open_path(&path) {
                    Err(e) => Some(e.to_string()),
                    Ok(rows) => rows
                        .expecting_rows(expected_rows)
                        .find_map(Result::err)
                        .map(|e| e.to_string()),
                };
                (name, error)
            })
            .collect()
    })
    .await;
    checked.unwrap_or_else(|e| {
        names
            .into_iter()
            .map(|n| (n, Some(format!("could not be read again: {e}"))))
            .collect()
    })
}

impl From<ImportOutcome> for ImportSummary {
    fn from(outcome: ImportOutcome) -> Self {
        match outcome {
            ImportOutcome::Imported {
                import_id,
                replaced_lines,
                rows,
                totals,
            } => ImportSummary {
                import_id,
                new: true,
                rows,
                totals,
                replaced_lines,
            },
            ImportOutcome::AlreadyImported { import_id } => ImportSummary {
                import_id,
                new: false,
                rows: 0,
                totals: Default::default(),
                replaced_lines: 0,
            },
        }
    }
}

async fn import_one(
    store: &dyn Store,
    replaces: Replaces,
    file: BillFile,
    now_ms: i64,
) -> Result<ImportSummary, ImportError> {
    import_files(store, replaces, None, vec![file], now_ms)
        .await?
        .pop()
        .ok_or_else(|| ImportError::Store(StoreError::Invalid("no file was imported".into())))
}

/// Stores lines that are the whole of their billing periods (a Cost Explorer sync), replacing
/// whatever earlier imports said about those periods.
pub async fn store_lines(
    store: &dyn Store,
    source: &str,
    name: &str,
    content_sha256: String,
    lines: Vec<CostLine>,
    now_ms: i64,
) -> Result<ImportSummary, ImportError> {
    let file = BillFile::Lines {
        source: source.to_owned(),
        name: name.to_owned(),
        content_sha256,
        lines,
    };
    import_one(store, Replaces::WholePeriods, file, now_ms).await
}

/// Imports one FOCUS file on disk (CSV, CSV.gz or Parquet), streaming. It replaces an earlier
/// file of the same name in the periods it covers, and adds to them otherwise (part 2 of a
/// multi-part export). `name` is what the billing page calls it.
pub async fn import_focus_file(
    store: &dyn Store,
    path: &Path,
    name: &str,
    now_ms: i64,
) -> Result<ImportSummary, ImportError> {
    let file = BillFile::FocusPath {
        path: path.to_owned(),
        name: name.to_owned(),
        expected_rows: None,
    };
    import_one(store, Replaces::SameName, file, now_ms).await
}

/// Imports one FOCUS file held in memory (the demo), like [`import_focus_file`].
pub async fn import_focus(
    store: &dyn Store,
    name: &str,
    bytes: Vec<u8>,
    now_ms: i64,
) -> Result<ImportSummary, ImportError> {
    let file = BillFile::FocusBytes {
        name: name.to_owned(),
        bytes,
    };
    import_one(store, Replaces::SameName, file, now_ms).await
}

/// Every imported bill file, newest first.
pub async fn imports(
    store: &dyn Store,
) -> Result<Vec<crate::store::bills::BillingImportRow>, StoreError> {
    store::bills::billing_imports(store.db()).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support;
    use std::str::FromStr;

    /// The FOCUS project's real sample through the whole import, on both databases: totals to
    /// the last decimal of the file; a copy broken near its end is refused by file, line and
    /// column, and nothing of it is stored.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_real_focus_sample_imports_whole_and_a_broken_copy_not_at_all() {
        let sample = focus::tests::shared_sample_path();
        let text = std::fs::read_to_string(&sample).unwrap();
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let headers = reader.headers().unwrap().clone();
        let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
        let (billed_col, effective_col) = (col("BilledCost"), col("EffectiveCost"));
        let (mut billed, mut effective) = (Decimal::ZERO, Decimal::ZERO);
        for r in reader.records() {
            let r = r.unwrap();
            billed += Decimal::from_str(&r[billed_col]).unwrap();
            effective += Decimal::from_str(&r[effective_col]).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let broken = dir.path().join("broken.csv");
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines[899] = lines[899].replacen(",\"USD\",", ",\"US Dollars\",", 1);
        std::fs::write(&broken, lines.join("\n")).unwrap();

        for db in test_support::both().await {
            let store = db.open().await;
            let b = db.backend;
            let s = import_focus_file(store.as_ref(), &sample, "focus_sample.csv", 1)
                .await
                .unwrap();
            assert!(s.new, "{b}");
            assert_eq!(s.rows, 1000, "{b}");
            // The sample bills in dollars alone: one total, in dollars.
            let usd = |t: &crate::store::CurrencyTotals| {
                assert_eq!(t.keys().collect::<Vec<_>>(), ["USD"], "{b}");
                (t["USD"].billed, t["USD"].effective)
            };
            assert_eq!(usd(&s.totals), (billed, effective), "{b}");
            let imports = store::bills::billing_imports(store.db()).await.unwrap();
            assert_eq!(imports.len(), 1, "{b}");
            assert_eq!(usd(&imports[0].totals), (billed, effective), "{b}");
            assert_eq!(imports[0].totals["USD"].rows, 1000, "{b}");
            assert_eq!(imports[0].row_count, 1000, "{b}");
            assert_eq!(imports[0].current_lines, 1000, "{b}");

            match import_focus_file(store.as_ref(), &broken, "broken.csv", 2).await {
                Err(ImportError::Focus { file, error }) => {
                    assert_eq!(file, "broken.csv", "{b}");
                    assert_eq!(
                        error.to_string(),
                        "line 900, column BillingCurrency: not an ISO 4217 code: \"US Dollars\"",
                        "{b}"
                    );
                }
                other => panic!("{b}: {other:?}"),
            }
            let imports = store::bills::billing_imports(store.db()).await.unwrap();
            assert_eq!(
                imports.len(),
                1,
                "{b}: nothing of the broken file is stored"
            );
            assert_eq!(
                imports[0].current_lines, 1000,
                "{b}: nor did it replace anything"
            );
        }
    }

    #[test]
    fn resource_ids_normalise_for_joining() {
        assert_eq!(
            normalize_resource_id("arn:aws:ec2:us-east-1:1111:instance/i-0ABC"),
            "i-0abc"
        );
        assert_eq!(normalize_resource_id("i-0abc"), "i-0abc");
        assert_eq!(
            normalize_resource_id("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/GPU-VM-1"),
            "gpu-vm-1"
        );
        assert_eq!(
            normalize_resource_id(
                "//compute.googleapis.com/projects/p/zones/us-central1-a/instances/a3-node-7"
            ),
            "a3-node-7"
        );
    }

    #[test]
    fn pricing_categories_across_focus_versions() {
        assert_eq!(pricing_category("Standard", None), "on_demand");
        assert_eq!(pricing_category("On-Demand", None), "on_demand");
        assert_eq!(pricing_category("Dynamic", None), "spot");
        assert_eq!(pricing_category("Commitment-Based", None), "committed");
        assert_eq!(pricing_category("Standard", Some("Used")), "committed");
        assert_eq!(pricing_category("", None), "other");
    }
}
