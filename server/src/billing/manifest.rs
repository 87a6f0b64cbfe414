//! Export runs' manifests: the list of files that make up one delivery of a billing period, and
//! the run's id. Read so a period delivered as several files is imported as a whole.
//!
//! - AWS Data Exports: `<export>/metadata/BILLING_PERIOD=YYYY-MM/<export>-Manifest.json` with
//!   `executionId` and `dataFiles` (full `s3://` URIs of `<export>/data/BILLING_PERIOD=…/…`).
//! - AWS Cost and Usage Reports (legacy): `assemblyId` and `reportKeys` (S3 keys).
//! - Azure Cost Management exports: `manifest.json` with `runInfo.runId` and `blobs[].blobName`.
//!
//! The listed files are looked for beside the manifest and, by the tail of their path, under its
//! parent folders, which is where `aws s3 sync` or `azcopy` put them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The export run's id (AWS execution or assembly id, Azure run id).
    pub delivery: String,
    pub files: Vec<PathBuf>,
    /// For each file, the rows the manifest says it holds, where it says (Azure's
    /// `blobs[].dataRowCount`): a file with other than that is refused.
    pub row_counts: Vec<Option<u64>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    execution_id: Option<String>,
    data_files: Option<Vec<String>>,
    assembly_id: Option<String>,
    report_keys: Option<Vec<String>>,
    run_info: Option<RunInfo>,
    blobs: Option<Vec<Blob>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunInfo {
    run_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Blob {
    blob_name: String,
    data_row_count: Option<u64>,
}

/// How far up from the manifest's folder a listed file is looked for.
const ANCESTORS: usize = 4;

/// What a manifest lists, before its files are looked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    /// The export run's id.
    pub delivery: String,
    /// Each data file as listed (an `s3://` URI, a key or a blob name).
    pub listed: Vec<String>,
    /// The rows each holds, where the manifest says.
    pub row_counts: Vec<Option<u64>>,
}

impl Listing {
    /// The name each listed file has on disk or in an upload: the last segment of its path.
    pub fn file_names(&self) -> Vec<&str> {
        self.listed
            .iter()
            .map(|l| l.rsplit('/').next().unwrap_or(l))
            .collect()
    }
}

/// Reads a manifest's text; errors name `source` (a path, an uploaded file's name).
pub fn parse(source: &str, text: &str) -> Result<Listing, String> {
    let raw: Raw =
        serde_json::from_str(text).map_err(|e| format!("{source}: not a manifest: {e}"))?;
    let (delivery, listed, row_counts) =
        if let (Some(id), Some(files)) = (raw.execution_id, raw.data_files) {
            let counts = vec![None; files.len()];
            (id, files, counts)
        } else if let (Some(id), Some(keys)) = (raw.assembly_id, raw.report_keys) {
            let counts = vec![None; keys.len()];
            (id, keys, counts)
        } else if let (Some(id), Some(blobs)) = (raw.run_info.and_then(|r| r.run_id), raw.blobs) {
            let counts = blobs.iter().map(|b| b.data_row_count).collect();
            (id, blobs.into_iter().map(|b| b.blob_name).collect(), counts)
        } else {
            return Err(format!(
                "{source}: not a manifest gpuledger knows: it needs executionId and dataFiles \
                 (AWS Data Exports), assemblyId and reportKeys (AWS CUR) or runInfo.runId and \
                 blobs (Azure)"
            ));
        };
    if listed.is_empty() {
        return Err(format!("{source}: the manifest lists no data file"));
    }
    Ok(Listing {
        delivery,
        listed,
        row_counts,
    })
}

/// Reads a manifest on disk and finds the files it lists.
pub fn read(path: &Path) -> Result<Manifest, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let Listing {
        delivery,
        listed,
        row_counts,
    } = parse(&path.display().to_string(), &text)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let files = listed
        .iter()
        .map(|f| {
            locate(dir, f).ok_or_else(|| {
                format!(
                    "{}: {f} is listed but not found beside it or under its parent folders",
                    path.display()
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Manifest {
        delivery,
        files,
        row_counts,
    })
}

/// Finds a listed file (an `s3://` URI, a key or a blob name) on disk: the longest tail of its
/// path that exists under the manifest's folder or one of its parents.
fn locate(dir: &Path, listed: &str) -> Option<PathBuf> {
    let path = listed.strip_prefix("s3://").map_or(listed, |rest| {
        rest.split_once('/').map_or(rest, |(_, key)| key)
    });
    let segments: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != "..")
        .collect();
    for start in 0..segments.len() {
        let tail: PathBuf = segments[start..].iter().collect();
        for base in dir.ancestors().take(ANCESTORS + 1) {
            let candidate = base.join(&tail);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_data_exports_layout() {
        let root = tempfile::tempdir().unwrap();
        let export = root.path().join("focus-export");
        let data = export.join("data/BILLING_PERIOD=2024-09");
        let meta = export.join("metadata/BILLING_PERIOD=2024-09");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&meta).unwrap();
        for part in ["focus-export-00001.csv.gz", "focus-export-00002.csv.gz"] {
            std::fs::write(data.join(part), b"x").unwrap();
        }
        let manifest = meta.join("focus-export-Manifest.json");
        std::fs::write(
            &manifest,
            r#"{"executionId":"exec-1","billingPeriod":{"start":"2024-09-01T00:00:00.000Z"},
                "dataFiles":["s3://bucket/prefix/focus-export/data/BILLING_PERIOD=2024-09/focus-export-00001.csv.gz",
                             "s3://bucket/prefix/focus-export/data/BILLING_PERIOD=2024-09/focus-export-00002.csv.gz"],
                "columns":[{"name":"BilledCost","type":"double"}]}"#,
        )
        .unwrap();
        let m = read(&manifest).unwrap();
        assert_eq!(m.delivery, "exec-1");
        assert_eq!(m.row_counts, [None, None]);
        assert_eq!(
            m.files,
            vec![
                data.join("focus-export-00001.csv.gz"),
                data.join("focus-export-00002.csv.gz")
            ]
        );
    }

    #[test]
    fn azure_and_legacy_cur_manifests() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("part_0_0001.csv"), b"x").unwrap();
        let azure = dir.path().join("manifest.json");
        std::fs::write(
            &azure,
            r#"{"runInfo":{"runId":"run-7","startDate":"2024-09-01T00:00:00"},
                "blobs":[{"blobName":"exports/focus/20240901-20240930/run-7/part_0_0001.csv","byteCount":1,"dataRowCount":136}],
                "blobCount":1,"dataRowCount":136}"#,
        )
        .unwrap();
        let m = read(&azure).unwrap();
        assert_eq!((m.delivery.as_str(), m.files.len()), ("run-7", 1));
        assert_eq!(
            m.row_counts,
            [Some(136)],
            "Azure says how many rows each blob holds"
        );

        let cur = dir.path().join("cur-Manifest.json");
        std::fs::write(
            &cur,
            r#"{"assemblyId":"asm-2","reportKeys":["r/20240901-20241001/asm-2/part_0_0001.csv"]}"#,
        )
        .unwrap();
        assert_eq!(read(&cur).unwrap().delivery, "asm-2");
    }

    #[test]
    fn what_cannot_be_read_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("m.json");
        std::fs::write(
            &m,
            r#"{"executionId":"e","dataFiles":["s3://b/x/missing.csv.gz"]}"#,
        )
        .unwrap();
        let err = read(&m).unwrap_err();
        assert!(
            err.contains("s3://b/x/missing.csv.gz is listed but not found"),
            "{err}"
        );
        std::fs::write(&m, r#"{"hello":1}"#).unwrap();
        assert!(read(&m)
            .unwrap_err()
            .contains("not a manifest gpuledger knows"));
        std::fs::write(&m, "{").unwrap();
        assert!(read(&m).unwrap_err().contains("not a manifest"));
        std::fs::write(&m, r#"{"executionId":"e","dataFiles":[]}"#).unwrap();
        assert!(read(&m).unwrap_err().contains("lists no data file"));
    }
}
