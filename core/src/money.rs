//! Money is exact: amounts are `Decimal`s (billing files carry up to 15 decimal places), stored as
//! canonical decimal text and summed in Rust, never as floats.
//!
//! [`split_exact`] divides an amount by weights so that the parts add up to the amount exactly:
//! each part is rounded down to a quantum, and the few quanta left over go to the parts with the
//! largest remainders (the largest-remainder method).

use rust_decimal::prelude::*;
use rust_decimal::Decimal;

/// Parts are never finer than this many decimal places, nor coarser than the amount's own.
const MIN_SCALE: u32 = 9;
/// Weights are turned into integers at this resolution so the split itself is integer math.
const WEIGHT_RESOLUTION: f64 = 1e12;

/// The finest amount kept: 18 decimal places, beyond anything a billing file writes.
pub const MAX_SCALE: u32 = 18;

/// Parses a decimal amount as billing files write it ("12.5", "-0.000001", "1e-3", "").
pub fn parse_amount(text: &str) -> Option<Decimal> {
    let t = text.trim();
    if t.is_empty() {
        return Some(Decimal::ZERO);
    }
    Decimal::from_str_exact(t)
        .or_else(|_| Decimal::from_scientific(t))
        .ok()
        .map(|d| d.round_dp(MAX_SCALE).normalize())
}

/// Canonical text for storage: no trailing zeros, so equal amounts compare equal as text.
pub fn to_text(amount: Decimal) -> String {
    amount.normalize().to_string()
}

/// Reads a stored amount; storage only ever holds what [`to_text`] wrote.
pub fn from_text(text: &str) -> Decimal {
    Decimal::from_str_exact(text).unwrap_or(Decimal::ZERO)
}

/// Splits `amount` in proportion to `weights` (non-negative; NaN counts as 0). The parts sum to
/// `amount` exactly. With no positive weight, everything goes to the first part (callers always
/// put a catch-all such as "idle" first when that matters); with no parts, nothing is returned.
pub fn split_exact(amount: Decimal, weights: &[f64]) -> Vec<Decimal> {
    if weights.is_empty() {
        return Vec::new();
    }
    let scale = amount.scale().max(MIN_SCALE);
    // Work in integer quanta of 10^-scale.
    let quanta: i128 = (amount * Decimal::from_i128_with_scale(10i128.pow(scale), 0))
        .trunc()
        .to_i128()
        .unwrap_or(0);
    let ints: Vec<u128> = weights
        .iter()
        .map(|w| {
            if w.is_finite() && *w > 0.0 {
                (w * WEIGHT_RESOLUTION).round() as u128
            } else {
                0
            }
        })
        .collect();
    let total: u128 = ints.iter().sum();
    if total == 0 {
        let mut parts = vec![Decimal::ZERO; weights.len()];
        parts[0] = amount;
        return parts;
    }
    let negative = quanta < 0;
    let q = quanta.unsigned_abs();
    let mut floors: Vec<u128> = Vec::with_capacity(ints.len());
    let mut remainders: Vec<(u128, usize)> = Vec::with_capacity(ints.len());
    for (i, w) in ints.iter().enumerate() {
        // q * w can exceed u128 only for absurd amounts; split the multiplication to be safe.
        let (whole, rest) = (q / total * w, (q % total) * w);
        floors.push(whole + rest / total);
        remainders.push((rest % total, i));
    }
    let assigned: u128 = floors.iter().sum();
    let mut left = q - assigned;
    // Largest remainder first; ties go to the earlier part, so the result is deterministic.
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, i) in remainders {
        if left == 0 {
            break;
        }
        floors[i] += 1;
        left -= 1;
    }
    floors
        .into_iter()
        .map(|f| {
            let v = f as i128;
            Decimal::from_i128_with_scale(if negative { -v } else { v }, scale).normalize()
        })
        .collect()
}

/// A currency code as people type it (` usd`), as bills write it (`USD`): three ASCII letters.
pub fn currency_code(text: &str) -> Option<String> {
    let code = text.trim().to_ascii_uppercase();
    (code.len() == 3 && code.chars().all(|c| c.is_ascii_uppercase())).then_some(code)
}

/// Rounds for display: two decimals, half away from zero, as invoices do.
pub fn cents(amount: Decimal) -> Decimal {
    amount.round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero)
}

/// `parts` of `total` in cents that add up to `total` in cents: each rounded as [`cents`]
/// would, and the cents their rounding lost or gained given to (or taken from) the parts it
/// moved most, largest first. No part then shows a cent none of it carried (a residue), and
/// the parts a table shows add up to its total.
pub fn cents_adding_up(parts: &[Decimal], total: Decimal) -> Vec<Decimal> {
    let mut rounded: Vec<Decimal> = parts.iter().map(|p| cents(*p)).collect();
    let cent = Decimal::new(1, 2);
    let mut off = cents(total) - rounded.iter().sum::<Decimal>();
    // Largest rounding loss first when cents are missing, largest gain first when too many.
    let mut order: Vec<usize> = (0..parts.len()).collect();
    let step = if off.is_sign_negative() { -cent } else { cent };
    order.sort_by_key(|&i| std::cmp::Reverse((parts[i] - rounded[i]) * step.signum()));
    for i in order.into_iter().cycle().take(parts.len() * 4) {
        if off.is_zero() {
            break;
        }
        rounded[i] += step;
        off -= step;
    }
    rounded
}

const ATTO_PER_NANO: i128 = 1_000_000_000;

/// An amount as two integers SQL can sum exactly on any backend: whole nano-units (floor) and
/// the rest in 10^-18 units (`0 ≤ atto < 10^9`). Amounts never carry more than 18 decimals.
pub fn to_nano_atto(amount: Decimal) -> (i64, i64) {
    let mut a = amount.round_dp(MAX_SCALE);
    a.rescale(MAX_SCALE);
    let units = a.mantissa();
    (
        i64::try_from(units.div_euclid(ATTO_PER_NANO)).unwrap_or(i64::MAX),
        units.rem_euclid(ATTO_PER_NANO) as i64,
    )
}

/// The amount back from (sums of) nano and atto parts; the atto sum may exceed 10^9.
pub fn from_nano_atto(nano: i64, atto: i64) -> Decimal {
    let units = i128::from(nano) * ATTO_PER_NANO + i128::from(atto);
    Decimal::try_from_i128_with_scale(units, MAX_SCALE)
        .map(|d| d.normalize())
        .unwrap_or(Decimal::MAX)
}

/// The currency a page about these amounts is in: the one carrying the most money (by absolute
/// amount), ties to the first by name; USD when there is none. Amounts in different currencies
/// are never added: a page shows this one and lists the others apart.
pub fn main_currency<'a>(amounts: impl IntoIterator<Item = (&'a str, Decimal)>) -> String {
    let mut per: std::collections::BTreeMap<&str, Decimal> = Default::default();
    for (currency, amount) in amounts {
        *per.entry(currency).or_default() += amount.abs();
    }
    per.into_iter()
        .max_by(|x, y| x.1.cmp(&y.1).then(y.0.cmp(x.0)))
        .map_or_else(|| "USD".to_owned(), |(c, _)| c.to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn parts_in_cents_add_up_without_a_residue() {
        use super::*;
        let d = |s: &str| Decimal::from_str_exact(s).unwrap();
        // Each rounds down by 0.4 of a cent; the price nearly nothing: the lost cent goes to
        // a part that lost most, not to the price as a residue of a cent it never carried.
        let parts = [d("1.004"), d("1.004"), d("1.004"), d("0.002")];
        let total: Decimal = parts.iter().sum();
        let shown = cents_adding_up(&parts, total);
        assert_eq!(shown, [d("1.01"), d("1.00"), d("1.00"), d("0.00")]);
        assert_eq!(shown.iter().sum::<Decimal>(), cents(total));
        // Too many cents: taken back from a part rounding raised most.
        let parts = [d("0.005"), d("0.006"), d("-0.004")];
        let shown = cents_adding_up(&parts, parts.iter().sum());
        assert_eq!(shown, [d("0.00"), d("0.01"), d("0.00")]);
        // Exact parts are left as they are.
        let parts = [d("3.25"), d("-1.50")];
        assert_eq!(cents_adding_up(&parts, d("1.75")), parts);
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_main_currency_carries_the_most_money() {
        let d = |s: &str| parse_amount(s).unwrap_or_default();
        assert_eq!(main_currency([]), "USD");
        assert_eq!(
            main_currency([("USD", d("10")), ("EUR", d("7")), ("EUR", d("4"))]),
            "EUR"
        );
        // A credit counts by its size: it is money on the page too.
        assert_eq!(main_currency([("USD", d("3")), ("GBP", d("-5"))]), "GBP");
        assert_eq!(main_currency([("USD", d("5")), ("EUR", d("5"))]), "EUR");
    }

    #[test]
    fn nano_atto_round_trip_and_sum() {
        for s in [
            "0",
            "32.7726",
            "-0.000000000000000001",
            "-3.5",
            "0.123456789012345678",
        ] {
            let (n, a) = to_nano_atto(d(s));
            assert!((0..1_000_000_000).contains(&a));
            assert_eq!(from_nano_atto(n, a), d(s), "{s}");
        }
        let xs = [
            "0.3333333333333333",
            "0.3333333333333333",
            "0.3333333333333334",
            "-1",
        ];
        let (n, a) = xs
            .iter()
            .map(|s| to_nano_atto(d(s)))
            .fold((0, 0), |(n, a), (x, y)| (n + x, a + y));
        assert_eq!(from_nano_atto(n, a), Decimal::ZERO);
    }

    fn d(s: &str) -> Decimal {
        parse_amount(s).unwrap()
    }

    #[test]
    fn parses_billing_amounts() {
        assert_eq!(d("11.36694143040000"), d("11.3669414304"));
        assert_eq!(d(""), Decimal::ZERO);
        assert_eq!(d("1e-3"), d("0.001"));
        assert!(parse_amount("12,5").is_none());
        assert_eq!(to_text(d("32.016000")), "32.016");
        assert_eq!(
            from_text(&to_text(d("-0.000000000000001"))),
            d("-0.000000000000001")
        );
    }

    #[test]
    fn splits_sum_exactly() {
        let parts = split_exact(d("10"), &[1.0, 1.0, 1.0]);
        assert_eq!(parts.iter().sum::<Decimal>(), d("10"));
        assert_eq!(parts[0], d("3.333333334"));
        assert_eq!(parts[1], d("3.333333333"));
        let parts = split_exact(d("32.7726"), &[0.7, 0.2, 0.1]);
        assert_eq!(parts, vec![d("22.94082"), d("6.55452"), d("3.27726")]);
        let fine = split_exact(d("0.000000000000007"), &[1.0, 1.0]);
        assert_eq!(fine.iter().sum::<Decimal>(), d("0.000000000000007"));
    }

    #[test]
    fn degenerate_weights() {
        assert!(split_exact(d("5"), &[]).is_empty());
        assert_eq!(
            split_exact(d("5"), &[0.0, 0.0]),
            vec![d("5"), Decimal::ZERO]
        );
        assert_eq!(
            split_exact(d("5"), &[f64::NAN, 1.0]),
            vec![Decimal::ZERO, d("5")]
        );
        let neg = split_exact(d("-3"), &[1.0, 2.0]);
        assert_eq!(neg, vec![d("-1"), d("-2")]);
    }

    proptest! {
        #[test]
        fn any_split_sums_to_the_amount(
            units in -10_000_000_000_000i64..10_000_000_000_000i64,
            scale in 0u32..16,
            weights in proptest::collection::vec(0.0f64..1000.0, 1..40),
        ) {
            let amount = Decimal::new(units, scale);
            let parts = split_exact(amount, &weights);
            prop_assert_eq!(parts.len(), weights.len());
            prop_assert_eq!(parts.iter().sum::<Decimal>(), amount);
            // Rollup storage holds up to ±9.2 billion per row, far beyond any GPU-hour.
            if amount.abs() < Decimal::from(1_000_000_000) {
                let (n, a) = parts.iter().map(|p| to_nano_atto(*p)).fold((0i64, 0i64), |(n, a), (x, y)| (n + x, a + y));
                prop_assert_eq!(from_nano_atto(n, a), amount);
            }
        }
    }
}
