//! Progress of long work (a bill's import, a Cost Explorer sync, a roll-up, the demo's seeding)
//! for whoever started it. Library code says what it is at ([`Progress`]); the command line
//! shows it ([`Reporter`]): a bar on a terminal, plain lines on stderr otherwise (a log, CI).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What long work says as it goes. Every method has a default that says nothing.
pub trait Progress: Send + Sync {
    /// A part begins: a file, a range of days, a phase.
    fn part(&self, _name: &str) {}
    /// `n` more units done (rows, days, hours).
    fn advance(&self, _n: u64) {}
    /// The whole is `total` units, where it is known.
    fn total(&self, _total: u64) {}
}

/// Nobody is watching: the server's own jobs, the web form, tests.
pub struct Silent;

impl Progress for Silent {}

/// How often a plain line says how far the work is, when nothing else was said.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// Progress shown to a person at a terminal (an `indicatif` bar), or as lines on stderr.
pub struct Reporter {
    label: String,
    unit: &'static str,
    bar: Option<indicatif::ProgressBar>,
    done: AtomicU64,
    total: AtomicU64,
    started: Instant,
    last_line: Mutex<Instant>,
}

impl Reporter {
    /// `label` names the work (`billing import`); `unit` what is counted (`rows`).
    pub fn new(label: &str, unit: &'static str) -> Reporter {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{{spinner}} {label}: {{msg}} {{human_pos}} {unit} ({{per_sec}}, {{elapsed}})"
                ))
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Reporter {
            label: label.to_owned(),
            unit,
            bar,
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            started: Instant::now(),
            last_line: Mutex::new(Instant::now()),
        }
    }

    /// Ends the bar and says how it went, with how long it took.
    pub fn finish(&self, summary: &str) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        eprintln!(
            "{}: {summary} ({:.1} s)",
            self.label,
            self.started.elapsed().as_secs_f64()
        );
    }

    fn so_far(&self) -> String {
        let done = self.done.load(Ordering::Relaxed);
        match self.total.load(Ordering::Relaxed) {
            0 => format!("{} {}", thousands(done), self.unit),
            total => format!("{} of {} {}", thousands(done), thousands(total), self.unit),
        }
    }
}

impl Progress for Reporter {
    fn part(&self, name: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(name.to_owned()),
            None => eprintln!("{}: {name} ({} so far)", self.label, self.so_far()),
        }
    }

    fn advance(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
        match &self.bar {
            Some(bar) => bar.inc(n),
            None => {
                let Ok(mut last) = self.last_line.lock() else {
                    return;
                };
                if last.elapsed() >= LINE_EVERY {
                    *last = Instant::now();
                    eprintln!("{}: {}", self.label, self.so_far());
                }
            }
        }
    }

    fn total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.set_length(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{} {{msg}} [{{bar:30}}] {{human_pos}}/{{human_len}} {} ({{eta}} left)",
                    self.label, self.unit
                ))
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
        }
    }
}

fn thousands(n: u64) -> String {
    crate::format::thousands(i64::try_from(n).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reporter_counts_what_it_is_told() {
        let r = Reporter::new("test", "rows");
        r.total(10);
        r.part("a.csv");
        r.advance(3);
        r.advance(1_234);
        assert_eq!(r.so_far(), "1,237 of 10 rows");
    }
}
