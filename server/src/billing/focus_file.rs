//! Opening a FOCUS file, whatever form it came in: Parquet or CSV told by its content,
//! gzip-compressed CSV by its magic bytes.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::focus::FocusRows;
use super::CostLine;
use gpuledger_core::bill::FocusError;

/// Parses a whole FOCUS file (CSV, gzip CSV or Parquet) held in memory.
pub fn parse(bytes: &[u8]) -> Result<Vec<CostLine>, FocusError> {
    open_bytes(bytes.to_vec())?.collect()
}

/// Opens a FOCUS file on disk: Parquet or CSV by content, gzip-compressed CSV by its magic.
pub fn open_path(path: &Path) -> Result<FocusRows, FocusError> {
    let io = |e: std::io::Error| FocusError::Io(e.to_string());
    let mut file = File::open(path).map_err(io)?;
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut file, &mut magic).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    if magic[..n] == *b"PAR1" {
        return super::parquet::rows(file);
    }
    super::focus_csv::csv_rows(Box::new(file), n >= 2 && magic[..2] == [0x1f, 0x8b])
}

/// Opens a FOCUS file held in memory (tests, the demo, the fuzzer).
pub fn open_bytes(bytes: Vec<u8>) -> Result<FocusRows, FocusError> {
    if bytes.starts_with(b"PAR1") {
        return super::parquet::rows(bytes::Bytes::from(bytes));
    }
    let gzip = bytes.starts_with(&[0x1f, 0x8b]);
    super::focus_csv::csv_rows(Box::new(std::io::Cursor::new(bytes)), gzip)
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
