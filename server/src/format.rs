//! How numbers read on pages.

pub fn bytes_gib(bytes: i64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1024.0 * 1024.0 * 1024.0))
}

pub fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.0}%"))
}

pub fn ago(ms: i64) -> String {
    let s = (ms / 1000).max(0);
    match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// A quantity people read (GPU-hours, kWh) to the unit, with thousands separators: `86,304`.
pub fn whole(x: f64) -> String {
    if !x.is_finite() {
        return "—".to_owned();
    }
    thousands(x.round() as i64)
}

#[cfg(test)]
mod whole_tests {
    #[test]
    fn quantities_read_with_separators() {
        assert_eq!(super::whole(86_304.4), "86,304");
        assert_eq!(super::whole(18_983.6), "18,984");
        assert_eq!(super::whole(f64::NAN), "—");
    }
}

/// A moment as people read it, to the minute: `2026-11-23 15:10 UTC`.
pub fn utc_minute(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |d| d.format("%Y-%m-%d %H:%M UTC").to_string(),
    )
}

/// `YYYY-MM-DD HH:MM:SS UTC`: when a page's figures are from, to the second.
pub fn utc_second(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |d| d.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

/// `YYYY-MM-DDTHH:MM:SSZ`: a time in a header or an API field.
pub fn rfc3339_second(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    )
}

/// `text` cut to at most `max` characters, ending in `…` where cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A count with thousands separators: `1,234,567`.
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("−{out}")
    } else {
        out
    }
}

/// A look-back in whole days and hours, as a period's label reads it: `7 days`, `6 days 11
/// hours`, `1 day 1 hour`, `5 hours`. Never rounded to a tenth of a day: a figure scaled from
/// it must come out the same when the reader scales it.
pub fn days_and_hours(days: f64) -> String {
    let hours = (days * 24.0).round().max(0.0) as i64;
    let (d, h) = (hours / 24, hours % 24);
    let unit = |n: i64, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
    match (d, h) {
        (0, h) => unit(h, "hour"),
        (d, 0) => unit(d, "day"),
        (d, h) => format!("{} {}", unit(d, "day"), unit(h, "hour")),
    }
}

/// Dollars to the cent with thousands separators, as a finance lead reads them: `$181,024.68`.
pub fn usd(amount: rust_decimal::Decimal) -> String {
    money(amount, "USD")
}

/// An amount in its bill's currency, to the cent with thousands separators: `$181,024.68`,
/// `€1,250.00`, `1,250.00 CHF` (a symbol only where it names one currency).
pub fn money(amount: rust_decimal::Decimal, currency: &str) -> String {
    money_precise(amount, currency, 2)
}

/// Amounts in several currencies, never added across: `$1,200.00 + €300.00`; `$0.00` for none.
pub fn money_sums<'a>(
    sums: impl IntoIterator<Item = (&'a String, &'a rust_decimal::Decimal)>,
) -> String {
    let parts: Vec<String> = sums.into_iter().map(|(c, d)| money(*d, c)).collect();
    if parts.is_empty() {
        usd(rust_decimal::Decimal::ZERO)
    } else {
        parts.join(" + ")
    }
}

/// [`money`] to `places` decimals (at least two), for unit prices such as a cost per 1,000
/// requests: `$0.0123`.
pub fn money_precise(amount: rust_decimal::Decimal, currency: &str, places: u32) -> String {
    let symbol = match currency {
        "USD" => Some("$"),
        "EUR" => Some("€"),
        "GBP" => Some("£"),
        "JPY" => Some("¥"),
        "INR" => Some("₹"),
        _ => None,
    };
    let places = places.max(2);
    let cents = if places == 2 {
        gpuledger_core::money::cents(amount)
    } else {
        amount.round_dp_with_strategy(places, rust_decimal::RoundingStrategy::MidpointAwayFromZero)
    };
    let text = format!("{:.*}", places as usize, cents.abs());
    let (whole, frac) = text.split_once('.').unwrap_or((&text, "00"));
    let mut grouped = String::new();
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if cents.is_sign_negative() && !cents.is_zero() {
        "−"
    } else {
        ""
    };
    match symbol {
        Some(symbol) => format!("{sign}{symbol}{grouped}.{frac}"),
        None => format!("{sign}{grouped}.{frac} {currency}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_back_is_told_to_the_hour() {
        assert_eq!(days_and_hours(7.0), "7 days");
        assert_eq!(days_and_hours(155.0 / 24.0), "6 days 11 hours");
        assert_eq!(days_and_hours(25.0 / 24.0), "1 day 1 hour");
        assert_eq!(days_and_hours(5.0 / 24.0), "5 hours");
    }

    #[test]
    fn formats() {
        assert_eq!(bytes_gib(85_899_345_920), "80.0 GiB");
        assert_eq!(percent(None), "n/a");
        assert_eq!(percent(Some(42.4)), "42%");
        assert_eq!(ago(12_500), "12 s ago");
        assert_eq!(ago(7_200_000), "2 h ago");
        let d = |s: &str| gpuledger_core::money::parse_amount(s).unwrap();
        assert_eq!(usd(d("181024.675")), "$181,024.68");
        assert_eq!(money(d("1250"), "EUR"), "€1,250.00");
        assert_eq!(money(d("-1250.5"), "CHF"), "−1,250.50 CHF");
        assert_eq!(money_precise(d("0.012345"), "USD", 4), "$0.0123");
        let sums: std::collections::BTreeMap<String, rust_decimal::Decimal> =
            [("USD".into(), d("1200")), ("EUR".into(), d("300"))].into();
        assert_eq!(money_sums(&sums), "€300.00 + $1,200.00");
        assert_eq!(money_sums(&std::collections::BTreeMap::new()), "$0.00");
        assert_eq!(money_precise(d("1234.5"), "EUR", 4), "€1,234.5000");
        assert_eq!(usd(d("0")), "$0.00");
        assert_eq!(usd(d("999.999")), "$1,000.00");
        assert_eq!(usd(d("-1234.5")), "−$1,234.50");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(-1000), "−1,000");
    }
}
