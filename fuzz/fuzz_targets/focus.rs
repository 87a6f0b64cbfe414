//! A FOCUS cost-and-usage export (CSV or Parquet) as `billing import-focus` reads it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpuledger_server::fuzzing::focus(data));
