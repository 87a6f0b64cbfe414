//! Reading a FOCUS export's CSV, plain or gzip-compressed: records as the csv crate reads them,
//! each held to [`MAX_RECORD_BYTES`], and the csv crate's errors told with their line.

use std::io::Read;

use super::focus::FocusRows;
use gpuledger_core::bill::FocusError;

/// The longest record (a CSV row, header included) read, in bytes: real rows are a few
/// kilobytes, and a reader holds a whole record in memory, so a file of one endless line (a
/// megabyte of gzip can hold a gigabyte) would take the server's memory.
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

/// A file's bytes, refused once more than [`MAX_RECORD_BYTES`] (and the reader's buffer) come
/// without a record ending: the reader says where each record ends (`record_ended`).
struct RecordLimit<R> {
    inner: R,
    since_record: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Debug)]
struct RecordTooLong;

impl std::fmt::Display for RecordTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a record longer than {MAX_RECORD_BYTES} bytes")
    }
}

impl std::error::Error for RecordTooLong {}

/// What the reader buffers ahead of the record it is reading.
const CSV_BUFFER_BYTES: usize = 1 << 16;

impl<R: Read> Read for RecordLimit<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::sync::atomic::Ordering;
        if self.since_record.load(Ordering::Relaxed) > MAX_RECORD_BYTES + CSV_BUFFER_BYTES as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                RecordTooLong,
            ));
        }
        let n = self.inner.read(buf)?;
        self.since_record.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

pub fn csv_rows(input: Box<dyn Read + Send>, gzip: bool) -> Result<FocusRows, FocusError> {
    let input: Box<dyn Read + Send> = if gzip {
        Box::new(flate2::read::MultiGzDecoder::new(input))
    } else {
        input
    };
    let since_record = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let limited = RecordLimit {
        inner: input,
        since_record: since_record.clone(),
    };
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .from_reader(std::io::BufReader::with_capacity(CSV_BUFFER_BYTES, limited));
    let headers: Vec<String> = reader
        .headers()
        .map_err(|e| csv_error(1, e))?
        .iter()
        .map(str::to_owned)
        .collect();
    since_record.store(0, std::sync::atomic::Ordering::Relaxed);
    let records = reader.into_records().enumerate().map(move |(i, r)| {
        since_record.store(0, std::sync::atomic::Ordering::Relaxed);
        r.map_err(|e| csv_error(i as u64 + 2, e))
    });
    FocusRows::new(headers, Box::new(records))
}

fn csv_error(line: u64, e: csv::Error) -> FocusError {
    match e.kind() {
        csv::ErrorKind::Io(io) if io.get_ref().is_some_and(|e| e.is::<RecordTooLong>()) => {
            FocusError::Line {
                line,
                message: format!(
                    "is longer than {} MiB: no bill's row is; is this a FOCUS export?",
                    MAX_RECORD_BYTES >> 20
                ),
            }
        }
        csv::ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::InvalidInput => {
            FocusError::Io(format!("not a valid gzip file: {io}"))
        }
        csv::ErrorKind::Io(io) => FocusError::Io(io.to_string()),
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => FocusError::Line {
            line,
            message: format!("has {len} fields where the header has {expected_len}"),
        },
        csv::ErrorKind::Utf8 { err, .. } => FocusError::Field {
            line,
            column: format!("#{}", err.field() + 1),
            message: "is not valid UTF-8".into(),
        },
        _ => FocusError::Line {
            line,
            message: format!("not valid CSV: {e}"),
        },
    }
}
