//! The on-disk spool: every window is written here as it closes, before it is sent, and removed
//! only after the server acknowledged it, so a server outage or an agent restart loses nothing.
//!
//! Windows are sent a batch of several at a time (one report a minute by default): a batch fills
//! in `<created_ms>-<seq>-<batch_id>.open`, rewritten as each window joins it, and is sealed into
//! `….json` once full; only sealed batches are sent, and a sealed batch never changes, so sending
//! it again after a lost acknowledgement is harmless (the server keys on the batch id). A batch
//! left open by a crash is sealed when the spool is opened again. Name order is age order. A
//! write goes to a temporary file, is fsynced, renamed into place, and the directory is fsynced.
//! When the spool grows past its byte bound, the oldest batches are dropped and counted.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpuledger_proto::{HostInfo, Report, Window};

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
    /// The batch still taking windows, as on disk.
    open: Mutex<Option<OpenBatch>>,
}

/// A batch being filled: on disk at `path` (`.open`), not yet sent.
#[derive(Debug)]
struct OpenBatch {
    path: PathBuf,
    report: Report,
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
        // A batch left open was never sent: it is sealed as it stands, unless a crash came
        // between its sealed copy's write and the open one's removal.
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                let path = e.path();
                match path.extension().and_then(|x| x.to_str()) {
                    Some("tmp") => {
                        let _ = fs::remove_file(&path);
                    }
                    Some(OPEN) => {
                        let sealed = path.with_extension(SEALED);
                        if sealed.exists() {
                            let _ = fs::remove_file(&path);
                        } else {
                            fs::rename(&path, &sealed).map_err(io_err(&path))?;
                        }
                    }
                    _ => {}
                }
            }
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(&dir))?;
        }
        Ok(Spool {
            inner: Arc::new(Inner {
                dir,
                dead_letter_dir,
                max_bytes,
                seq: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                open: Mutex::new(None),
            }),
        })
    }

    /// Batches dropped since start because the spool was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Writes a whole batch durably, sealed: it is sent as it is. Returns once it is on disk.
    pub fn push(&self, report: &Report) -> Result<Entry, SpoolError> {
        let path = self.new_path(&report.batch_id, SEALED);
        self.write(report, &path)?;
        self.enforce_bound(&path);
        Ok(Entry { path })
    }

    /// Adds a closed window to the open batch (a new batch from `new_batch` if none is open, or
    /// if the host is no longer the one it names), durably: on disk when this returns. A batch
    /// holding `per_batch` windows, or [`MAX_BATCH_BYTES`], is sealed, to be sent. Answers
    /// whether a batch was sealed.
    /// If the write fails the window stays in the open batch, and is written with the next.
    pub fn add_window(
        &self,
        host: &HostInfo,
        window: Window,
        per_batch: usize,
        new_batch: impl FnOnce() -> Report,
    ) -> Result<bool, SpoolError> {
        let mut open = self.open_batch();
        let mut sealed = false;
        if open.as_ref().is_some_and(|b| b.report.host != *host) {
            sealed = self.seal_locked(&mut open)?.is_some();
        }
        let batch = open.get_or_insert_with(|| {
            let report = new_batch();
            OpenBatch {
                path: self.new_path(&report.batch_id, OPEN),
                report,
            }
        });
        batch.report.windows.push(window);
        let body = serde_json::to_vec(&batch.report)?;
        if batch.report.windows.len() >= per_batch.max(1) || body.len() >= MAX_BATCH_BYTES {
            return Ok(self.seal_locked(&mut open)?.is_some() || sealed);
        }
        self.write_body(&body, &batch.path)?;
        Ok(sealed)
    }

    /// Seals the open batch as it stands (on shutdown, so it is sent before the agent exits).
    pub fn seal(&self) -> Result<Option<Entry>, SpoolError> {
        self.seal_locked(&mut self.open_batch())
    }

    /// Windows in the open batch, not yet sealed.
    pub fn open_windows(&self) -> usize {
        self.open_batch()
            .as_ref()
            .map_or(0, |b| b.report.windows.len())
    }

    fn open_batch(&self) -> MutexGuard<'_, Option<OpenBatch>> {
        // A panic while the lock was held leaves the batch as it was: still worth sealing.
        self.inner.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the open batch, whole, under its sealed name, then removes its open copy (a crash
    /// in between leaves both; [`Spool::open`] keeps the sealed one).
    fn seal_locked(&self, open: &mut Option<OpenBatch>) -> Result<Option<Entry>, SpoolError> {
        let Some(batch) = open.as_ref() else {
            return Ok(None);
        };
        if batch.report.windows.is_empty() {
            *open = None;
            return Ok(None);
        }
        let path = batch.path.with_extension(SEALED);
        self.write(&batch.report, &path)?;
        let _ = fs::remove_file(&batch.path);
        *open = None;
        self.enforce_bound(&path);
        Ok(Some(Entry { path }))
    }

    /// A batch's file name: creation time first, so name order is age order.
    fn new_path(&self, batch_id: &str, extension: &str) -> PathBuf {
        let now_ms = crate::now_ms();
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        self.inner
            .dir
            .join(format!("{now_ms:013}-{seq:06}-{batch_id}.{extension}"))
    }

    fn write(&self, report: &Report, path: &Path) -> Result<(), SpoolError> {
        self.write_body(&serde_json::to_vec(report)?, path)
    }

    fn write_body(&self, body: &[u8], path: &Path) -> Result<(), SpoolError> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let written = write_durably(&tmp, path, body, &self.inner.dir);
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            // A full disk: make room by dropping the oldest batch, then try once more.
            if self.drop_oldest(1) > 0 {
                write_durably(&tmp, path, body, &self.inner.dir).inspect_err(|_| {
                    let _ = fs::remove_file(&tmp);
                })?;
            } else {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Spooled batches, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = match fs::read_dir(&self.inner.dir) {
            Ok(rd) => rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == SEALED))
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

/// A batch is sealed once it is this large, however few its windows: the server refuses a
/// report over its body limit (4 MiB by default) for good, and a host of many MIG instances and
/// processes sends large windows.
pub const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// A sealed batch's extension: what the deliverer sends.
const SEALED: &str = "json";
/// A batch still taking windows.
const OPEN: &str = "open";

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

    fn window(start_ms: i64) -> Window {
        Window {
            start_ms,
            end_ms: start_ms + 15_000,
            samples: 15,
            gpus: vec![],
            serving: vec![],
        }
    }

    fn host(name: &str) -> HostInfo {
        HostInfo {
            hostname: name.into(),
            ..HostInfo::default()
        }
    }

    fn batch(h: &HostInfo) -> Report {
        Report {
            host: h.clone(),
            ..report(&uuid::Uuid::new_v4().to_string(), 0)
        }
    }

    fn sealed(spool: &Spool) -> Vec<Report> {
        spool
            .entries()
            .iter()
            .map(|e| serde_json::from_slice(&spool.read(e).unwrap()).unwrap())
            .collect()
    }

    fn files_ending(dir: &Path, extension: &str) -> usize {
        fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == extension))
            .count()
    }

    #[test]
    fn windows_wait_on_disk_in_the_open_batch_until_it_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let h = host("a");
        for (i, start) in [0, 15_000].into_iter().enumerate() {
            let sealed_now = spool
                .add_window(&h, window(start), 3, || batch(&h))
                .unwrap();
            assert!(!sealed_now);
            assert_eq!(spool.depth(), 0, "nothing to send before the batch is full");
            assert_eq!(spool.open_windows(), i + 1);
            assert_eq!(files_ending(dir.path(), "open"), 1, "on disk as it closes");
        }
        assert!(spool
            .add_window(&h, window(30_000), 3, || batch(&h))
            .unwrap());
        let reports = sealed(&spool);
        assert_eq!(reports.len(), 1);
        let starts: Vec<i64> = reports[0].windows.iter().map(|w| w.start_ms).collect();
        assert_eq!(starts, [0, 15_000, 30_000]);
        assert_eq!(files_ending(dir.path(), "open"), 0);
        assert_eq!(spool.open_windows(), 0);
        // The next window starts a batch of its own, under a new id.
        spool
            .add_window(&h, window(45_000), 3, || batch(&h))
            .unwrap();
        let next = spool.seal().unwrap().unwrap();
        let next: Report = serde_json::from_slice(&spool.read(&next).unwrap()).unwrap();
        assert_ne!(next.batch_id, reports[0].batch_id);
        assert_eq!(next.windows.len(), 1);
        assert!(spool.seal().unwrap().is_none(), "nothing left open");
    }

    #[test]
    fn a_batch_left_open_by_a_crash_is_sealed_as_it_stands_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let h = host("a");
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        spool.add_window(&h, window(0), 4, || batch(&h)).unwrap();
        spool
            .add_window(&h, window(15_000), 4, || batch(&h))
            .unwrap();
        let open_id = spool.open_batch().as_ref().unwrap().report.batch_id.clone();
        drop(spool);
        let reopened = Spool::open(dir.path(), 1 << 20).unwrap();
        let reports = sealed(&reopened);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].batch_id, open_id, "the same batch, not a copy");
        assert_eq!(reports[0].windows.len(), 2);
        assert_eq!(reopened.open_windows(), 0);
        assert_eq!(files_ending(dir.path(), "open"), 0);
    }

    #[test]
    fn a_crash_while_sealing_keeps_the_sealed_copy() {
        let dir = tempfile::tempdir().unwrap();
        let h = host("a");
        let full = Report {
            windows: vec![window(0), window(15_000)],
            ..batch(&h)
        };
        let partial = Report {
            windows: vec![window(0)],
            ..full.clone()
        };
        let stem = dir
            .path()
            .join(format!("0000000000001-000000-{}", full.batch_id));
        fs::write(
            stem.with_extension("open"),
            serde_json::to_vec(&partial).unwrap(),
        )
        .unwrap();
        fs::write(
            stem.with_extension("json"),
            serde_json::to_vec(&full).unwrap(),
        )
        .unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(sealed(&spool), [full]);
        assert_eq!(files_ending(dir.path(), "open"), 0);
    }

    #[test]
    fn a_batch_as_large_as_the_bound_is_sealed_before_it_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 8 << 20).unwrap();
        let h = host("a");
        let large = || Report {
            agent_version: "x".repeat(MAX_BATCH_BYTES - 2_000),
            ..batch(&h)
        };
        assert!(!spool.add_window(&h, window(0), 4, large).unwrap());
        // Nearly the bound in the envelope, then windows until past it.
        let mut start = 15_000;
        while !spool.add_window(&h, window(start), 1_000, large).unwrap() {
            start += 15_000;
            assert!(start < 100 * 15_000, "never sealed");
        }
        let reports = sealed(&spool);
        assert_eq!(reports.len(), 1);
        assert!(reports[0].windows.len() > 2, "full windows first");
        let size = serde_json::to_vec(&reports[0]).unwrap().len();
        assert!(size >= MAX_BATCH_BYTES, "{size}");
        assert!(
            size < MAX_BATCH_BYTES + 1_000,
            "sealed at the window that passed it: {size}"
        );
    }

    #[test]
    fn a_new_host_seals_the_batch_of_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let (a, b) = (host("a"), host("b"));
        spool.add_window(&a, window(0), 4, || batch(&a)).unwrap();
        assert!(spool
            .add_window(&b, window(15_000), 4, || batch(&b))
            .unwrap());
        let reports = sealed(&spool);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].host, a);
        assert_eq!(spool.open_windows(), 1);
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
