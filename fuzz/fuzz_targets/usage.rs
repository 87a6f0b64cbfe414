//! A usage post as `POST /api/v1/usage` receives it: decoded, then checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpuledger_server::fuzzing::usage(data));
