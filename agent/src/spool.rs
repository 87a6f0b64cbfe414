//! The on-disk spool: every batch is written here before it is sent, and removed only after
//! the server acknowledged it, so a server outage or an agent restart loses nothing.
//!
//! Files are `<created_ms>-<seq>-<batch_id>.json`, so name order is age order. A write goes to a
//! temporary file, is fsynced, renamed into place, and the directory is fsynced. When the spool
//! grows past its byte bound, the oldest batches are dropped and counted.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gpuledger_proto::Report;

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("encoding a report: {0}")]
    Encode(#[from] serde_json::Error),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        source,
    }
}

#[derive(Debug, Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    dead_letter_dir: PathBuf,
    max_bytes: u64,
    seq: AtomicU64,
    dropped: AtomicU64,
}

/// One spooled batch.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub path: PathBuf,
}

impl Spool {
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<Spool, SpoolError> {
        let dir = dir.into();
        let dead_letter_dir = dir.join("dead-letter");
        fs::create_dir_all(&dead_letter_dir).map_err(io_err(&dead_letter_dir))?;
        // Leftover temporaries are writes that never completed: they were never acknowledged
        // by anyone, and the window they held is still in memory nowhere, so they are garbage.
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().ends_with(".tmp") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        Ok(Spool {
            inner: Arc::new(Inner {
                dir,
                dead_letter_dir,
                max_bytes,
                seq: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
            }),
        })
    }

    /// Batches dropped since start because the spool was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Writes a batch durably. Returns once it is on disk.
    pub fn push(&self, report: &Report) -> Result<Entry, SpoolError> {
        let body = serde_json::to_vec(report)?;
        let now_ms = crate::now_ms();
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        let name = format!("{now_ms:013}-{seq:06}-{}.json", report.batch_id);
        let path = self.inner.dir.join(&name);
        let tmp = self.inner.dir.join(format!("{name}.tmp"));
        let written = write_durably(&tmp, &path, &body, &self.inner.dir);
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            // A full disk: make room by dropping the oldest batch, then try once more.
            if self.drop_oldest(1) > 0 {
                write_durably(&tmp, &path, &body, &self.inner.dir).inspect_err(|_| {
                    let _ = fs::remove_file(&tmp);
                })?;
            } else {
                return Err(e);
            }
        }
        self.enforce_bound(&path);
        Ok(Entry { path })
    }

    /// Spooled batches, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = match fs::read_dir(&self.inner.dir) {
            Ok(rd) => rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .map(|path| Entry { path })
                .collect(),
            Err(_) => Vec::new(),
        };
        out.sort();
        out
    }

    pub fn depth(&self) -> usize {
        self.entries().len()
    }

    pub fn read(&self, entry: &Entry) -> Result<Vec<u8>, SpoolError> {
        fs::read(&entry.path).map_err(io_err(&entry.path))
    }

    /// The server has the batch: forget it.
    pub fn ack(&self, entry: &Entry) -> Result<(), SpoolError> {
        match fs::remove_file(&entry.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&entry.path)(e)),
        }
    }

    /// The server refused the batch for good: keep it for a person to look at, out of the queue.
    pub fn dead_letter(&self, entry: &Entry) -> Result<PathBuf, SpoolError> {
        let name = entry.path.file_name().unwrap_or_default();
        let target = self.inner.dead_letter_dir.join(name);
        fs::rename(&entry.path, &target).map_err(io_err(&entry.path))?;
        Ok(target)
    }

    fn total_bytes(entries: &[Entry]) -> u64 {
        entries
            .iter()
            .filter_map(|e| fs::metadata(&e.path).ok())
            .map(|m| m.len())
            .sum()
    }

    fn enforce_bound(&self, keep: &Path) {
        let entries = self.entries();
        let mut total = Self::total_bytes(&entries);
        for e in &entries {
            if total <= self.inner.max_bytes || e.path == keep {
                break;
            }
            let len = fs::metadata(&e.path).map(|m| m.len()).unwrap_or(0);
            if fs::remove_file(&e.path).is_ok() {
                total = total.saturating_sub(len);
                self.count_drop(e);
            }
        }
    }

    fn drop_oldest(&self, n: usize) -> usize {
        let mut dropped = 0;
        for e in self.entries().into_iter().take(n) {
            if fs::remove_file(&e.path).is_ok() {
                self.count_drop(&e);
                dropped += 1;
            }
        }
        dropped
    }

    fn count_drop(&self, e: &Entry) {
        let total = self.inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(batch = %e.path.display(), dropped_total = total, "spool full: dropped the oldest batch");
    }
}

fn write_durably(tmp: &Path, path: &Path, body: &[u8], dir: &Path) -> Result<(), SpoolError> {
    let mut f = File::create(tmp).map_err(io_err(tmp))?;
    f.write_all(body).map_err(io_err(tmp))?;
    f.sync_all().map_err(io_err(tmp))?;
    fs::rename(tmp, path).map_err(io_err(path))?;
    // The rename is durable only once the directory itself is synced.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_proto::HostInfo;

    fn report(id: &str, filler: usize) -> Report {
        Report {
            batch_id: id.into(),
            agent_version: "x".repeat(filler),
            host: HostInfo::default(),
            windows: vec![],
        }
    }

    #[test]
    fn push_list_ack_in_age_order_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        spool.push(&report("a", 0)).unwrap();
        spool.push(&report("b", 0)).unwrap();
        let reopened = Spool::open(dir.path(), 1 << 20).unwrap();
        let entries = reopened.entries();
        assert_eq!(entries.len(), 2);
        let first: Report = serde_json::from_slice(&reopened.read(&entries[0]).unwrap()).unwrap();
        assert_eq!(first.batch_id, "a");
        reopened.ack(&entries[0]).unwrap();
        assert_eq!(reopened.depth(), 1);
    }

    #[test]
    fn a_full_spool_drops_the_oldest_and_counts_it() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 2_500).unwrap();
        for id in ["a", "b", "c"] {
            spool.push(&report(id, 1_000)).unwrap();
        }
        let names: Vec<String> = spool
            .entries()
            .iter()
            .map(|e| e.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2);
        assert!(names[0].ends_with("-b.json") && names[1].ends_with("-c.json"));
        assert_eq!(spool.dropped(), 1);
    }

    #[test]
    fn dead_letter_moves_out_of_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let e = spool.push(&report("bad", 0)).unwrap();
        let target = spool.dead_letter(&e).unwrap();
        assert!(target.exists());
        assert_eq!(spool.depth(), 0);
    }
}
