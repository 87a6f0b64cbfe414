//! A budget as `PUT /api/v1/budgets` takes it, its fields checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpuledger_server::fuzzing::budget(data));
