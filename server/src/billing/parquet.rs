//! FOCUS exports as Parquet (the default of AWS Data Exports): each value is turned into the
//! text the CSV export would hold, then parsed like CSV, so both formats follow one set of rules.

use std::panic::{catch_unwind, AssertUnwindSafe};

use csv::StringRecord;
use parquet::data_type::Decimal as ParquetDecimal;
use parquet::file::reader::{ChunkReader, FileReader, SerializedFileReader};
use parquet::record::reader::RowIter;
use parquet::record::{Field, Row};
use rust_decimal::Decimal;

use super::focus::{FocusError, FocusRows};

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
