//! An agent report as `POST /api/v1/reports` receives it: decoded, then validated.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpuledger_server::fuzzing::report(data));
