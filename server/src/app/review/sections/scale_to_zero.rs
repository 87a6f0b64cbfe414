//! Endpoints and experiments that held their GPUs idle in the same hours every week, as the
//! review lists them in the page's currency: what turning them off then saves in cash, and the
//! commitment it frees besides.

use rust_decimal::Decimal;

use super::Section;
use crate::app::review::charts::{self, freed_text};
use crate::app::review::{Ask, Month, TOP_ROWS};
use crate::format::money;
use crate::scale_to_zero::OwnerWindows;
use crate::store::StoreError;
use gpuledger_core::time::DAY_MS;

pub struct ScaleToZero {
    pub rows: Vec<ScaleToZeroRow>,
    /// In cash; and the commitment freed besides ("" where none).
    pub total: String,
    pub frees: String,
    pub api: String,
    /// Where the month so far is shorter than a window's evidence needs and none was found:
    /// how many days it has, and the month before's review, which lists its windows.
    pub too_soon: Option<(String, String)>,
}

pub struct ScaleToZeroRow {
    pub owner: String,
    pub href: String,
    pub windows: Vec<String>,
    pub hours_per_week: u32,
    /// "108 h × 4 GPUs = 432 GPU-hours at $0.85".
    pub evidence: String,
    pub saving: String,
    /// Commitment freed by turning it off in hours a commitment covered ("" where none).
    pub frees: String,
}

impl Section for ScaleToZero {
    type Read = ();

    async fn read(_: &Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn build((): (), month: &Month<'_>) -> Result<ScaleToZero, StoreError> {
        let ask = month.ask;
        Ok(view(
            &month.kept.scale_to_zero,
            &month.currency,
            &ask.month,
            (ask.from, ask.to, ask.cx.now),
        ))
    }
}

fn view(
    found: &[OwnerWindows],
    currency: &str,
    month: &str,
    (from, to, now): (i64, i64, i64),
) -> ScaleToZero {
    let seen_ms = to.min(now) - from;
    let weeks_needed = gpuledger_core::scale_to_zero::MIN_WEEKS as i64 * 7 * DAY_MS;
    let too_soon = (found.is_empty() && seen_ms < weeks_needed).then(|| {
        let days = (seen_ms.max(0) + DAY_MS - 1) / DAY_MS;
        let before =
            gpuledger_core::time::month_label(gpuledger_core::time::month_start_ms(from - 1));
        (
            match days {
                1 => "1 day".to_owned(),
                n => format!("{n} days"),
            },
            format!("/review/{before}#scale-to-zero"),
        )
    });
    let shown: Vec<&OwnerWindows> = found
        .iter()
        .filter(|f| f.candidate.currency == currency)
        .collect();
    let total: Decimal = shown.iter().map(|f| f.candidate.saving).sum();
    let frees: Decimal = shown.iter().map(|f| f.candidate.frees_commitment).sum();
    let freed = |d: Decimal| freed_text(d, currency);
    ScaleToZero {
        rows: shown
            .iter()
            .take(TOP_ROWS)
            .map(|f| {
                let c = &f.candidate;
                let gpus = if c.quiet_hours == 0 {
                    0.0
                } else {
                    c.gpu_hours / f64::from(c.quiet_hours)
                };
                ScaleToZeroRow {
                    owner: format!("{}: {}", f.dimension.replace('_', " "), c.key),
                    href: format!(
                        "/review/{month}/{}?{}",
                        f.dimension,
                        charts::query(&[("key", &c.key)])
                    ),
                    windows: c.windows.iter().map(|w| w.label.clone()).collect(),
                    hours_per_week: c.hours_per_week,
                    evidence: format!(
                        "{} h × {} GPUs = {} GPU-hours at {}",
                        crate::format::thousands(i64::from(c.quiet_hours)),
                        (gpus * 10.0).round() / 10.0,
                        crate::format::whole(c.gpu_hours),
                        c.per_gpu_hour
                            .map_or_else(|| "—".to_owned(), |r| money(r, currency)),
                    ),
                    saving: money(c.saving, currency),
                    frees: freed(c.frees_commitment),
                }
            })
            .collect(),
        total: money(total, currency),
        frees: freed(frees),
        api: format!("/api/v1/scale-to-zero?month={month}"),
        too_soon,
    }
}
