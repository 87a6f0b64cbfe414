//! FOCUS exports as Parquet (the default of AWS Data Exports): each value is turned into the
//! text the CSV export would hold, then parsed like CSV, so both formats follow one set of rules.

use std::panic::{catch_unwind, AssertUnwindSafe};

use csv::StringRecord;
use parquet::data_type::Decimal as ParquetDecimal;
use parquet::file::reader::{ChunkReader, FileReader, SerializedFileReader};
use parquet::record::reader::RowIter;
use parquet::record::{Field, Row};
use rust_decimal::Decimal;

use super::focus::FocusRows;
use gpuledger_core::bill::FocusError;

fn ms_to_rfc3339(ms: i64) -> String {
    gpuledger_core::time::rfc3339(ms)
}

/// A Parquet DECIMAL (big-endian two's complement of any width) as exact text.
fn decimal_text(d: &ParquetDecimal) -> Option<String> {
    let bytes = d.data();
    if bytes.is_empty() || bytes.len() > 16 {
        return None;
    }
    let negative = bytes[0] & 0x80 != 0;
    let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
    buf[16 - bytes.len()..].copy_from_slice(bytes);
    let unscaled = i128::from_be_bytes(buf);
    let scale = u32::try_from(d.scale()).ok()?;
    Decimal::try_from_i128_with_scale(unscaled, scale)
        .ok()
        .map(|v| v.normalize().to_string())
}

/// The text a CSV export would carry for this value.
fn text(field: &Field) -> Result<String, String> {
    Ok(match field {
        Field::Null => String::new(),
        Field::Bool(b) => b.to_string(),
        Field::Byte(v) => v.to_string(),
        Field::Short(v) => v.to_string(),
        Field::Int(v) => v.to_string(),
        Field::Long(v) => v.to_string(),
        Field::UByte(v) => v.to_string(),
        Field::UShort(v) => v.to_string(),
        Field::UInt(v) => v.to_string(),
        Field::ULong(v) => v.to_string(),
        // The shortest text that reads back as the same double: the file's own value.
        Field::Float16(v) => v.to_string(),
        Field::Float(v) => v.to_string(),
        Field::Double(v) => v.to_string(),
        Field::Decimal(d) => decimal_text(d).ok_or("a DECIMAL too wide to read exactly")?,
        Field::Str(s) => s.clone(),
        Field::Bytes(b) => String::from_utf8_lossy(b.data()).into_owned(),
        Field::Date(days) => ms_to_rfc3339(i64::from(*days) * gpuledger_core::time::DAY_MS),
        Field::TimestampMillis(ms) => ms_to_rfc3339(*ms),
        Field::TimestampMicros(us) => ms_to_rfc3339(us.div_euclid(1000)),
        Field::TimeMillis(_) | Field::TimeMicros(_) => field.to_string(),
        // Tags and SkuPriceDetails arrive as maps or structs: the JSON object CSV would hold.
        Field::Group(_) | Field::ListInternal(_) | Field::MapInternal(_) => {
            field.to_json_value().to_string()
        }
    })
}

/// Reads a Parquet FOCUS export a row group at a time. The parquet crate asserts on some
/// corrupt files instead of returning an error (a fuzzer found one: `fuzz/regressions/focus/`);
/// such a panic is caught here and answered like any unreadable file, so a bad upload never
/// takes a request down.
pub fn rows<R: ChunkReader + 'static>(input: R) -> Result<FocusRows, FocusError> {
    let corrupt = move || FocusError::Io("not a readable Parquet file: it is corrupt".into());
    // The parquet crate sizes a page's buffer from its header before reading it: a corrupt
    // header would make a few kilobytes of file take gigabytes. Every page is checked first.
    match catch_unwind(AssertUnwindSafe(|| pages::check(&input))) {
        Ok(Ok(())) => {}
        Ok(Err(why)) => {
            return Err(FocusError::Io(format!(
                "not a readable Parquet file: {why}"
            )))
        }
        Err(_) => return Err(corrupt()),
    }
    let reader = catch_unwind(AssertUnwindSafe(|| SerializedFileReader::new(input)))
        .map_err(|_| corrupt())?
        .map_err(|e| FocusError::Io(format!("not a readable Parquet file: {e}")))?;
    let headers: Vec<String> = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name().to_owned())
        .collect();
    let width = headers.len();
    let mut rows = RowIter::from_file_into(Box::new(reader));
    let mut line = 1u64;
    let records = std::iter::from_fn(move || {
        let row = match catch_unwind(AssertUnwindSafe(|| rows.next())) {
            Ok(row) => row?,
            Err(_) => return Some(Err(corrupt())),
        };
        line += 1;
        Some(record(line, width, row))
    });
    FocusRows::new(headers, Box::new(records))
}

/// Page sizes, read from each page header before the parquet crate allocates for them.
mod pages {
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::reader::ChunkReader;

    /// The most a page may hold uncompressed. Writers use about 1 MiB (pyarrow, Spark,
    /// DuckDB, AWS Data Exports); far more is a corrupt or hostile file.
    pub const MAX_PAGE_BYTES: i64 = 64 << 20;
    /// Bytes read to find one page header (its statistics make it longer than its sizes).
    const HEADER_WINDOW: u64 = 64 << 10;

    /// Checks that every page of every column chunk declares sizes its chunk can hold: no more
    /// compressed bytes than are left in the chunk, no more uncompressed than the footer gives
    /// the whole chunk, nor than [`MAX_PAGE_BYTES`].
    pub fn check<R: ChunkReader>(input: &R) -> Result<(), String> {
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(input)
            .map_err(|e| e.to_string())?;
        let file_len = input.len();
        for (g, group) in meta.row_groups().iter().enumerate() {
            for (c, column) in group.columns().iter().enumerate() {
                let at = format!("row group {g}, column {c}");
                let start = column
                    .dictionary_page_offset()
                    .filter(|o| *o > 0)
                    .unwrap_or(column.data_page_offset());
                let (start, len) = match (
                    u64::try_from(start),
                    u64::try_from(column.compressed_size()),
                ) {
                    (Ok(s), Ok(l)) if s.checked_add(l).is_some_and(|e| e <= file_len) => (s, l),
                    _ => return Err(format!("{at} lies outside the file")),
                };
                let most = column.uncompressed_size().min(MAX_PAGE_BYTES);
                let end = start + len;
                let mut pos = start;
                while pos < end {
                    let window = input
                        .get_bytes(pos, (end - pos).min(HEADER_WINDOW) as usize)
                        .map_err(|e| e.to_string())?;
                    let (uncompressed, compressed, header_len) = page_sizes(&window)
                        .ok_or_else(|| format!("{at}: a page header is unreadable"))?;
                    if !(0..=most).contains(&uncompressed) {
                        return Err(format!(
                            "{at}: a page declares {uncompressed} bytes uncompressed, more \
                             than its column holds ({}) or than gpuledger reads in one page \
                             ({MAX_PAGE_BYTES})",
                            column.uncompressed_size()
                        ));
                    }
                    let next = u64::try_from(compressed)
                        .ok()
                        .and_then(|c| (pos + header_len as u64).checked_add(c))
                        .filter(|n| *n <= end)
                        .ok_or_else(|| format!("{at}: a page runs past its column"))?;
                    pos = next;
                }
            }
        }
        Ok(())
    }

    /// Thrift compact protocol, as much as reading past a page header needs.
    struct Compact<'a> {
        bytes: &'a [u8],
        at: usize,
    }

    impl Compact<'_> {
        fn byte(&mut self) -> Option<u8> {
            let b = *self.bytes.get(self.at)?;
            self.at += 1;
            Some(b)
        }
        fn advance(&mut self, n: u64) -> Option<()> {
            let n = usize::try_from(n).ok()?;
            self.at = self.at.checked_add(n).filter(|a| *a <= self.bytes.len())?;
            Some(())
        }
        fn varint(&mut self) -> Option<u64> {
            let mut value = 0u64;
            for shift in (0..70).step_by(7) {
                let b = self.byte()?;
                value |= u64::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    return Some(value);
                }
            }
            None
        }
        fn zigzag(&mut self) -> Option<i64> {
            let v = self.varint()?;
            Some((v >> 1) as i64 ^ -((v & 1) as i64))
        }
        /// Skips one value of compact type `ty`.
        fn skip(&mut self, ty: u8, depth: u8) -> Option<()> {
            if depth > 16 {
                return None;
            }
            match ty {
                1 | 2 => Some(()),
                3 => self.advance(1),
                4..=6 => self.varint().map(|_| ()),
                7 => self.advance(8),
                8 => {
                    let len = self.varint()?;
                    self.advance(len)
                }
                9 | 10 => {
                    let head = self.byte()?;
                    let elem = head & 0x0f;
                    let size = match head >> 4 {
                        15 => self.varint()?,
                        n => u64::from(n),
                    };
                    for _ in 0..size {
                        self.skip_element(elem, depth + 1)?;
                    }
                    Some(())
                }
                11 => {
                    let size = self.varint()?;
                    if size == 0 {
                        return Some(());
                    }
                    let kinds = self.byte()?;
                    for _ in 0..size {
                        self.skip_element(kinds >> 4, depth + 1)?;
                        self.skip_element(kinds & 0x0f, depth + 1)?;
                    }
                    Some(())
                }
                12 => self.skip_struct(depth + 1, |_, _, _| None),
                _ => None,
            }
        }
        /// Skips an element of a list, set or map. A boolean there takes a byte (in a struct
        /// its value is in the field's type), so every element takes at least one byte and a
        /// huge size runs out of bytes rather than looping.
        fn skip_element(&mut self, ty: u8, depth: u8) -> Option<()> {
            if matches!(ty, 1 | 2) {
                self.advance(1)
            } else {
                self.skip(ty, depth)
            }
        }

        /// Reads a struct's fields: `read` takes the ones it wants (by id and type) and
        /// answers `Some`; the rest are skipped.
        fn skip_struct(
            &mut self,
            depth: u8,
            mut read: impl FnMut(&mut Self, i16, u8) -> Option<()>,
        ) -> Option<()> {
            let mut last = 0i16;
            loop {
                let head = self.byte()?;
                if head == 0 {
                    return Some(());
                }
                let ty = head & 0x0f;
                let id = match head >> 4 {
                    0 => i16::try_from(self.zigzag()?).ok()?,
                    delta => last.checked_add(i16::from(delta))?,
                };
                last = id;
                let at = self.at;
                if read(self, id, ty).is_none() {
                    self.at = at;
                    self.skip(ty, depth)?;
                }
            }
        }
    }

    /// A page header's uncompressed and compressed sizes and its own length in bytes.
    pub fn page_sizes(bytes: &[u8]) -> Option<(i64, i64, usize)> {
        let mut r = Compact { bytes, at: 0 };
        let (mut uncompressed, mut compressed) = (None, None);
        r.skip_struct(0, |r, id, ty| match (id, ty) {
            (2, 5) => {
                uncompressed = Some(r.zigzag()?);
                Some(())
            }
            (3, 5) => {
                compressed = Some(r.zigzag()?);
                Some(())
            }
            _ => None,
        })?;
        Some((uncompressed?, compressed?, r.at))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn zigzag(v: i64) -> Vec<u8> {
            let mut z = ((v << 1) ^ (v >> 63)) as u64;
            let mut out = Vec::new();
            loop {
                let b = (z & 0x7f) as u8;
                z >>= 7;
                if z == 0 {
                    out.push(b);
                    return out;
                }
                out.push(b | 0x80);
            }
        }

        /// A data page header as writers lay it out: type, sizes, crc, then a nested
        /// DataPageHeader holding a boolean, a list and statistics with binary values.
        fn header(uncompressed: i64, compressed: i64) -> Vec<u8> {
            let mut h = vec![0x15];
            h.extend(zigzag(0)); // 1: type DATA_PAGE
            h.push(0x15);
            h.extend(zigzag(uncompressed)); // 2
            h.push(0x15);
            h.extend(zigzag(compressed)); // 3
            h.push(0x15);
            h.extend(zigzag(-12345)); // 4: crc
            h.push(0x1c); // 5: data_page_header, a struct
            h.push(0x15);
            h.extend(zigzag(100)); // num_values
            h.push(0x11); // a boolean field, true
            h.push(0x19); // a list
            h.push(0x25); // 2 elements of i32
            h.extend(zigzag(7));
            h.extend(zigzag(8));
            h.push(0x1c); // statistics
            h.extend([0x18, 3, b'a', b'b', b'c']); // binary
            h.push(0x00);
            h.push(0x00); // end of data_page_header
            h.push(0x00); // end of the page header
            h
        }

        #[test]
        fn page_sizes_are_read_past_nested_fields() {
            let h = header(1_048_576, 4_000);
            let mut bytes = h.clone();
            bytes.extend([0xAB; 32]); // the page's data follows
            assert_eq!(page_sizes(&bytes), Some((1_048_576, 4_000, h.len())));
            let huge = header(2_000_000_000, 10);
            assert_eq!(page_sizes(&huge).map(|p| p.0), Some(2_000_000_000));
            // Cut short, or an overlong varint: unreadable, not a guess.
            assert_eq!(page_sizes(&h[..h.len() - 3]), None);
            assert_eq!(
                page_sizes(&[
                    0x15, 0x00, 0x15, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca,
                    0xca
                ]),
                None
            );
            // A list claiming 2^60 elements runs out of bytes instead of looping.
            let mut bomb = vec![0x19, 0xf5];
            bomb.extend(zigzag(1 << 59));
            assert_eq!(page_sizes(&bomb), None);
            // So does a map of as many booleans (a boolean in a map takes a byte).
            let mut bomb = vec![0x1b];
            bomb.extend(zigzag(1 << 59));
            bomb.push(0x11);
            assert_eq!(page_sizes(&bomb), None);
        }

        /// A real Parquet export whose first page claims more than its whole column holds
        /// (the size rewritten in place, the same number of bytes) is refused by [`check`];
        /// the file as written passes.
        #[test]
        fn a_page_larger_than_its_column_is_refused() {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../fuzz/seeds/focus/aws-azure.parquet"
            );
            let good = bytes::Bytes::from(std::fs::read(path).unwrap());
            check(&good).unwrap();
            let meta = ParquetMetaDataReader::new()
                .parse_and_finish(&good)
                .unwrap();
            // A column whose first page's size takes two or more varint bytes, so that the
            // largest value of that length is more than the whole column holds.
            let (bad, claimed) = meta.row_groups()[0]
                .columns()
                .iter()
                .find_map(|column| {
                    let start = column
                        .dictionary_page_offset()
                        .filter(|o| *o > 0)
                        .unwrap_or(column.data_page_offset())
                        as usize;
                    let mut bad = good.to_vec();
                    // Field 1 (type, one byte), then field 2: the uncompressed size's varint.
                    if (bad[start], bad[start + 2]) != (0x15, 0x15) {
                        return None;
                    }
                    let mut end = start + 3;
                    while bad[end] & 0x80 != 0 {
                        end += 1;
                    }
                    let n = end - start - 2;
                    // The largest even (positive) zigzag value of the same length.
                    let claimed = ((1i64 << (7 * n)) - 2) / 2;
                    if n < 2 || claimed <= column.uncompressed_size() {
                        return None;
                    }
                    bad[start + 3] = 0xfe;
                    for b in &mut bad[start + 4..end] {
                        *b = 0xff;
                    }
                    bad[end] = 0x7f;
                    Some((bad, claimed))
                })
                .expect("a column to rewrite");
            let why = check(&bytes::Bytes::from(bad)).unwrap_err();
            assert!(
                why.contains(&format!("a page declares {claimed} bytes uncompressed")),
                "{why}"
            );
        }
    }
}

fn record(
    line: u64,
    width: usize,
    row: Result<Row, parquet::errors::ParquetError>,
) -> Result<StringRecord, FocusError> {
    let row = row.map_err(|e| FocusError::Line {
        line,
        message: format!("unreadable Parquet row: {e}"),
    })?;
    let mut cells = vec![String::new(); width];
    for (j, (name, field)) in row.get_column_iter().enumerate() {
        cells[j.min(width.saturating_sub(1))] =
            text(field).map_err(|message| FocusError::Field {
                line,
                column: name.clone(),
                message,
            })?;
    }
    Ok(StringRecord::from(cells))
}
