//! The FOCUS export as Parquet: typed columns (decimals as DECIMAL(38,18), dates as UTC
//! timestamps), a row group at a time.

use super::{ExportError, Row, SharedBuf, Sink, COLUMNS, EXTRA_COLUMNS};
use gpuledger_core::money::parse_amount;

/// FOCUS 1.2's decimal columns (TypeDecimal): DECIMAL(38,18) in Parquet.
const DECIMAL_COLUMNS: [&str; 12] = [
    "BilledCost",
    "CommitmentDiscountQuantity",
    "ConsumedQuantity",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "ListCost",
    "ListUnitPrice",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
];

/// FOCUS 1.2's date-time columns: UTC timestamps in Parquet.
const TIME_COLUMNS: [&str; 4] = [
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargePeriodEnd",
    "ChargePeriodStart",
];

/// Rows a Parquet row group: a few megabytes of cells at most.
const ROW_GROUP_ROWS: usize = 2_048;

pub(super) struct ParquetSink {
    writer: parquet::file::writer::SerializedFileWriter<SharedBuf>,
    buf: SharedBuf,
    /// The row group under way, a column at a time in file order (FOCUS's, then gpuledger's).
    columns: Vec<ColumnBuf>,
    rows: usize,
}

/// One column's cells of the row group under way, already in their Parquet type: a decimal is
/// 16 bytes rather than its text, and a text equal to the cell before shares its bytes (the
/// rows a bill line splits into repeat most of its columns).
enum ColumnCells {
    Decimal(Vec<parquet::data_type::FixedLenByteArray>),
    Time(Vec<i64>),
    Double(Vec<f64>),
    Text(Vec<parquet::data_type::ByteArray>),
}

struct ColumnBuf {
    cells: ColumnCells,
    /// Parquet's definition levels: 1 where the row has a value, 0 where it is null.
    defs: Vec<i16>,
}

impl ColumnBuf {
    fn for_column(index: usize) -> Self {
        let cells = match COLUMNS.get(index) {
            Some(c) if DECIMAL_COLUMNS.contains(c) => ColumnCells::Decimal(Vec::new()),
            Some(c) if TIME_COLUMNS.contains(c) => ColumnCells::Time(Vec::new()),
            None if index == COLUMNS.len() + 2 => ColumnCells::Double(Vec::new()),
            _ => ColumnCells::Text(Vec::new()),
        };
        ColumnBuf {
            cells,
            defs: Vec::new(),
        }
    }

    fn push(&mut self, cell: Option<String>) {
        let Some(text) = cell.filter(|v| !v.is_empty()) else {
            self.defs.push(0);
            return;
        };
        let added = match &mut self.cells {
            ColumnCells::Decimal(v) => push_some(v, decimal_bytes(&text)),
            ColumnCells::Time(v) => push_some(v, crate::billing::focus::parse_time_ms(&text)),
            ColumnCells::Double(v) => push_some(v, text.parse().ok()),
            ColumnCells::Text(v) => {
                let same = v
                    .last()
                    .filter(|last| last.data() == text.as_bytes())
                    .cloned();
                v.push(same.unwrap_or_else(|| text.into_bytes().into()));
                true
            }
        };
        self.defs.push(i16::from(added));
    }
}

/// Pushes `value` if there is one; whether it did.
fn push_some<T>(cells: &mut Vec<T>, value: Option<T>) -> bool {
    match value {
        Some(v) => {
            cells.push(v);
            true
        }
        None => false,
    }
}

fn parquet_schema() -> String {
    let mut fields = String::new();
    for c in COLUMNS {
        let field = if DECIMAL_COLUMNS.contains(&c) {
            format!("OPTIONAL FIXED_LEN_BYTE_ARRAY (16) {c} (DECIMAL(38,18));")
        } else if TIME_COLUMNS.contains(&c) {
            format!("OPTIONAL INT64 {c} (TIMESTAMP(MILLIS,true));")
        } else {
            format!("OPTIONAL BYTE_ARRAY {c} (UTF8);")
        };
        fields.push_str(&field);
    }
    fields.push_str("OPTIONAL BYTE_ARRAY x_GpuledgerKind (UTF8);");
    fields.push_str("OPTIONAL BYTE_ARRAY x_GpuledgerHost (UTF8);");
    fields.push_str("OPTIONAL DOUBLE x_GpuHours;");
    format!("message focus {{ {fields} }}")
}

/// An exact decimal as DECIMAL(38,18)'s 16 big-endian bytes.
fn decimal_bytes(text: &str) -> Option<parquet::data_type::FixedLenByteArray> {
    let mut d = parse_amount(text)?;
    d.rescale(18);
    Some(d.mantissa().to_be_bytes().to_vec().into())
}

impl ParquetSink {
    pub(super) fn new() -> Result<Self, ExportError> {
        use parquet::file::properties::WriterProperties;
        let schema = std::sync::Arc::new(parquet::schema::parser::parse_message_type(
            &parquet_schema(),
        )?);
        // Statistics per row group only, and short: the footer holds them for every row group
        // of the file, and long text (descriptions, JSON) would make it tens of megabytes.
        let props = WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Chunk)
            .set_statistics_truncate_length(Some(32))
            .set_column_index_truncate_length(Some(32))
            .set_offset_index_disabled(true)
            .set_created_by("gpuledger".into())
            .build();
        let buf = SharedBuf::default();
        let writer = parquet::file::writer::SerializedFileWriter::new(
            buf.clone(),
            schema,
            std::sync::Arc::new(props),
        )?;
        Ok(ParquetSink {
            writer,
            buf,
            columns: (0..COLUMNS.len() + EXTRA_COLUMNS.len())
                .map(ColumnBuf::for_column)
                .collect(),
            rows: 0,
        })
    }

    /// Writes the buffered rows as one row group, column by column.
    fn flush_group(&mut self) -> Result<(), ExportError> {
        use parquet::data_type::{ByteArrayType, DoubleType, FixedLenByteArrayType, Int64Type};
        if self.rows == 0 {
            return Ok(());
        }
        self.rows = 0;
        let mut group = self.writer.next_row_group()?;
        let mut buffered = self.columns.iter_mut();
        while let Some(mut column) = group.next_column()? {
            let Some(b) = buffered.next() else {
                return Err(ExportError::Parquet(
                    parquet::errors::ParquetError::General(
                        "more columns in the schema than buffered".into(),
                    ),
                ));
            };
            let defs = Some(b.defs.as_slice());
            match &mut b.cells {
                ColumnCells::Decimal(v) => {
                    column
                        .typed::<FixedLenByteArrayType>()
                        .write_batch(v, defs, None)?;
                    v.clear();
                }
                ColumnCells::Time(v) => {
                    column.typed::<Int64Type>().write_batch(v, defs, None)?;
                    v.clear();
                }
                ColumnCells::Double(v) => {
                    column.typed::<DoubleType>().write_batch(v, defs, None)?;
                    v.clear();
                }
                ColumnCells::Text(v) => {
                    column.typed::<ByteArrayType>().write_batch(v, defs, None)?;
                    v.clear();
                }
            }
            b.defs.clear();
            column.close()?;
        }
        group.close()?;
        Ok(())
    }
}

impl Sink for ParquetSink {
    fn row(&mut self, row: Row, extra: [String; 3]) -> Result<(), ExportError> {
        let mut row = row;
        let cells = COLUMNS
            .iter()
            .map(|c| row.remove(c))
            .chain(extra.into_iter().map(Some));
        for (column, cell) in self.columns.iter_mut().zip(cells) {
            column.push(cell);
        }
        self.rows += 1;
        if self.rows >= ROW_GROUP_ROWS {
            self.flush_group()?;
        }
        Ok(())
    }
    fn take(&mut self) -> Result<Vec<u8>, ExportError> {
        Ok(self.buf.take())
    }
    fn pending(&mut self) -> Result<usize, ExportError> {
        Ok(self.buf.len())
    }
    fn finish(mut self: Box<Self>) -> Result<Vec<u8>, ExportError> {
        self.flush_group()?;
        let buf = self.buf.clone();
        self.writer.close()?;
        Ok(buf.take())
    }
}
