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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes_gib(85_899_345_920), "80.0 GiB");
        assert_eq!(percent(None), "n/a");
        assert_eq!(percent(Some(42.4)), "42%");
        assert_eq!(ago(12_500), "12 s ago");
        assert_eq!(ago(7_200_000), "2 h ago");
    }
}
