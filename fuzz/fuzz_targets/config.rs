//! The config file, as `--config` reads it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpuledger_server::fuzzing::config(data));
