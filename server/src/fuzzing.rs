//! What the fuzz targets in `fuzz/` run, kept here so that the regression tests replay the same
//! code on stable Rust in every test run (`fuzz/regressions/`, see `tests` below).
//!
//! Each function takes arbitrary bytes, must never panic, and checks what must hold of anything
//! the parser accepts: an accepted report survives a round trip and satisfies the invariants the
//! store relies on; an accepted FOCUS file yields lines whose amounts and periods are sane.

use gpuledger_proto::Report;

use crate::http::ingest;
use crate::validate::{self, Limits};
use gpuledger_core::bill::FocusError;

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
    match crate::billing::focus_file::parse(data) {
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

/// `POST /api/v1/usage`'s decoding and checks: what an accepted post may hold.
pub fn usage(data: &[u8]) {
    let limits = Limits::default();
    let Ok((source, counts, progress)) = crate::http::usage::parse(
        data,
        FUZZ_NOW_MS,
        limits.retention_ms,
        limits.max_clock_skew_ms,
    ) else {
        return;
    };
    let named = |text: &str| !text.trim().is_empty() && !text.chars().any(char::is_control);
    assert!(
        named(&source),
        "a source with no name or a control character"
    );
    for c in &counts {
        assert!(
            named(&c.endpoint),
            "an endpoint with no name or a control character"
        );
        assert!(c.end_ms > c.start_ms, "a period that ends before it starts");
        assert!(
            c.end_ms - c.start_ms <= 31 * 24 * 3_600_000,
            "a period over 31 days"
        );
        assert!(c.start_ms >= FUZZ_NOW_MS - limits.retention_ms);
        assert!(c.end_ms <= FUZZ_NOW_MS + limits.max_clock_skew_ms);
        let seconds = ((c.end_ms - c.start_ms).max(1_000) as u64).div_ceil(1_000);
        assert!(c.requests >= 0, "a negative count");
        assert!(
            c.requests as u64 <= validate::MAX_REQUESTS_PER_SECOND * seconds,
            "a count beyond its bound"
        );
        for t in [c.input_tokens, c.output_tokens].into_iter().flatten() {
            assert!(t >= 0 && t as u64 <= validate::MAX_TOKENS_PER_SECOND * seconds);
        }
    }
    for p in &progress {
        assert!(
            named(&p.experiment),
            "an experiment with no name or a control character"
        );
        assert!(
            p.step >= 0 && p.epoch.is_none_or(|e| e >= 0),
            "a negative step or epoch"
        );
        assert!(p.at_ms <= FUZZ_NOW_MS + limits.max_clock_skew_ms);
    }
}

/// A budget as `PUT /api/v1/budgets` takes it (its fields as JSON strings), checked before the
/// ledger is asked about its key: an accepted one is storable as it stands.
pub fn budget(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let field = |name: &str| value.get(name).and_then(|v| v.as_str()).unwrap_or_default();
    let schema = gpuledger_core::owners::OwnerSchema::default();
    let ask = crate::budgets::SetBudget {
        dimension: field("dimension"),
        key: field("key"),
        amount: field("amount"),
        currency: field("currency"),
        from_month: field("from_month"),
    };
    let Ok(b) = crate::budgets::check(&schema, &ask) else {
        return;
    };
    assert!(!b.key.is_empty() && !b.key.chars().any(char::is_control));
    assert!(
        !b.amount.is_sign_negative() || b.amount.is_zero(),
        "a negative budget"
    );
    assert!(b.amount.normalize().scale() <= 6, "more than six decimals");
    assert!(
        b.currency.len() == 3 && b.currency.chars().all(|c| c.is_ascii_uppercase()),
        "a currency that is not a code: {:?}",
        b.currency
    );
    assert!(
        b.month_to > b.month_from,
        "a month that ends before it starts"
    );
    // What is stored reads back as the same amount.
    let text = gpuledger_core::money::to_text(b.amount);
    assert_eq!(gpuledger_core::money::from_text(&text), b.amount);
}

/// The config file (`--config`): any text is refused with a message or read whole, never a
/// panic; an accepted one holds what the server relies on.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = crate::config::Config::parse(text, "fuzz.toml") else {
        return;
    };
    assert!((0.0..=100.0).contains(&config.idle.threshold_percent));
    for o in config.idle.clusters.values() {
        assert!(o
            .threshold_percent
            .is_none_or(|t| (0.0..=100.0).contains(&t)));
    }
    // The rules attribution and the pages are built from.
    let _ = config.attribution_rules();
    let names: Vec<&str> = config.owners.names().collect();
    assert!(!names.is_empty(), "no owner dimension");
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
            let lines = crate::billing::focus_file::parse(&bytes).unwrap();
            assert_eq!(lines.len(), 2, "{file}");
        }
        for (file, rows) in [("real-export-traits.csv", 3), ("focus-1.3.csv", 1)] {
            let bytes = std::fs::read(seeds.join("focus").join(file)).unwrap();
            let lines = crate::billing::focus_file::parse(&bytes).unwrap();
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

    #[test]
    fn usage_budget_and_config_findings_and_seeds_replay() {
        replay("usage", super::usage);
        replay("budget", super::budget);
        replay("config", super::config);
    }

    /// The new targets' seeds pass their checks, so the fuzzers start past them.
    #[test]
    fn usage_budget_and_config_seeds_are_accepted() {
        let seeds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
        let usage = std::fs::read(seeds.join("usage/counts-and-progress.json")).unwrap();
        let limits = crate::validate::Limits::default();
        crate::http::usage::parse(
            &usage,
            super::FUZZ_NOW_MS,
            limits.retention_ms,
            limits.max_clock_skew_ms,
        )
        .unwrap();
        let budget = std::fs::read(seeds.join("budget/team.json")).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&budget).unwrap();
        let field = |name: &str| value[name].as_str().unwrap_or_default().to_owned();
        let (d, k, a, c, m) = (
            field("dimension"),
            field("key"),
            field("amount"),
            field("currency"),
            field("from_month"),
        );
        crate::budgets::check(
            &Default::default(),
            &crate::budgets::SetBudget {
                dimension: &d,
                key: &k,
                amount: &a,
                currency: &c,
                from_month: &m,
            },
        )
        .unwrap();
        let config = std::fs::read_to_string(seeds.join("config/full.toml")).unwrap();
        crate::config::Config::parse(&config, "full.toml").unwrap();
    }
}
