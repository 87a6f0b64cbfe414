//! What the fuzz targets in `fuzz/` run, kept here so that the regression tests replay the same
//! code on stable Rust in every test run (`fuzz/regressions/`, see `tests` below).
//!
//! Each function takes arbitrary bytes, must never panic, and checks what must hold of anything
//! the parser accepts: an accepted report survives a round trip and satisfies the invariants the
//! store relies on; an accepted FOCUS file yields lines whose amounts and periods are sane.

use gpuledger_proto::Report;

use crate::billing::focus::{self, FocusError};
use crate::http::ingest;
use crate::validate::{self, Limits};

/// A fixed "now" so that a finding replays the same way on any day.
pub const FUZZ_NOW_MS: i64 = 1_780_000_000_000;

/// The ingest path: decode, then validate, as `POST /api/v1/reports` does.
pub fn report(data: &[u8]) {
    let Ok(report) = ingest::decode(data) else {
        return;
    };
    if validate::validate(&report, FUZZ_NOW_MS, &Limits::default()).is_err() {
        return;
    }
    check_accepted(&report);
    // What the agent would send again (a retry) must decode to the same report and pass again.
    let Ok(again) = serde_json::to_vec(&report) else {
        panic!("an accepted report does not serialize");
    };
    let decoded = ingest::decode(&again).unwrap_or_else(|e| panic!("round trip: {e:?}"));
    assert_eq!(decoded, report, "round trip changed the report");
    assert!(validate::validate(&decoded, FUZZ_NOW_MS, &Limits::default()).is_ok());
}

/// What the store and attribution assume of an accepted report.
fn check_accepted(report: &Report) {
    let limits = Limits::default();
    for w in &report.windows {
        assert!(w.end_ms > w.start_ms, "window ends before it starts");
        assert!(
            w.end_ms - w.start_ms <= 3_600_000,
            "window longer than an hour"
        );
        assert!(w.start_ms >= FUZZ_NOW_MS - limits.retention_ms);
        assert!(w.end_ms <= FUZZ_NOW_MS + limits.max_clock_skew_ms);
        for g in &w.gpus {
            for v in [g.util_avg, g.util_max, g.mem_util_avg]
                .into_iter()
                .flatten()
            {
                assert!(v.is_finite() && (0.0..=100.0).contains(&v));
            }
            for v in [g.memory_total_bytes, g.memory_used_max_bytes, g.energy_mj]
                .into_iter()
                .flatten()
            {
                assert!(i64::try_from(v).is_ok(), "a counter the store cannot hold");
            }
            for p in &g.processes {
                if let Some(u) = p.sm_util_avg {
                    assert!(u.is_finite() && (0.0..=100.0).contains(&u));
                }
            }
        }
    }
    // PostgreSQL refuses NUL in text: validation must have caught every control character.
    let text = serde_json::to_string(report).unwrap_or_default();
    assert!(!text.contains("\\u0000"), "a NUL reached the store");
}

/// The FOCUS importer's path: format detection (gzip, Parquet, CSV), then the row reader.
pub fn focus(data: &[u8]) {
    match focus::parse(data) {
        Ok(lines) => {
            assert!(!lines.is_empty(), "an accepted file with no line");
            for l in &lines {
                assert!(
                    l.charge_period_end_ms >= l.charge_period_start_ms,
                    "a charge period that ends before it starts"
                );
                assert!(!l.currency.is_empty(), "a line with no currency");
                let texts = [&l.provider, &l.billing_account_id, &l.currency]
                    .into_iter()
                    .chain(l.resource_id.iter())
                    .chain(l.resource_key.iter());
                for t in texts {
                    assert!(!t.contains('\0'), "a NUL reached the store: {t:?}");
                }
            }
        }
        Err(FocusError::Line { line, .. }) => assert!(line >= 1, "an error on line 0"),
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// Every input a fuzzer found (and every seed) replays without a panic.
    fn replay(target: &str, run: fn(&[u8])) {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        let mut count = 0;
        for dir in ["regressions", "seeds"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let data = std::fs::read(&path).unwrap_or_default();
                let outcome = std::panic::catch_unwind(|| run(&data));
                assert!(outcome.is_ok(), "{} panics", path.display());
                count += 1;
            }
        }
        assert!(count > 0, "no inputs found for {target}");
    }

    /// The seeds start the fuzzers from inputs that pass, so they explore past the first check.
    #[test]
    fn seeds_are_accepted() {
        let seeds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
        let report = std::fs::read(seeds.join("report/valid.json")).unwrap();
        let report = crate::http::ingest::decode(&report).unwrap();
        crate::validate::validate(&report, super::FUZZ_NOW_MS, &Default::default()).unwrap();
        for file in ["aws-azure.csv", "aws-azure.csv.gz", "aws-azure.parquet"] {
            let bytes = std::fs::read(seeds.join("focus").join(file)).unwrap();
            let lines = crate::billing::focus::parse(&bytes).unwrap();
            assert_eq!(lines.len(), 2, "{file}");
        }
        for (file, rows) in [("real-export-traits.csv", 3), ("focus-1.3.csv", 1)] {
            let bytes = std::fs::read(seeds.join("focus").join(file)).unwrap();
            let lines = crate::billing::focus::parse(&bytes).unwrap();
            assert_eq!(lines.len(), rows, "{file}");
        }
    }

    #[test]
    fn report_findings_and_seeds_replay() {
        replay("report", super::report);
    }

    #[test]
    fn focus_findings_and_seeds_replay() {
        replay("focus", super::focus);
    }
}
