//! A FOCUS cost-and-usage export (CSV or Parquet) as `billing import-focus` reads it.
#![no_main]

libfuzzer_sys::fuzz_target!(
    // libfuzzer-sys aborts on any panic through its panic hook, even one the importer catches
    // (it catches the parquet crate's asserts on corrupt files). The default hook lets those be
    // caught; a panic that escapes still ends the run as a crash.
    init: {
        let _ = std::panic::take_hook();
    },
    |data: &[u8]| gpuledger_server::fuzzing::focus(data)
);
