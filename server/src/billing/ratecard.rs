//! The rate card from a file (`--rate-card`); the card and its prices are the core's
//! [`gpuledger_core::ratecard`].

use std::path::Path;

use gpuledger_core::ratecard::RateCard;

#[derive(Debug, thiserror::Error)]
pub enum RateCardError {
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// Reads and checks the rate card at `path`; an error names the file.
pub fn load(path: &Path) -> Result<RateCard, RateCardError> {
    let invalid = |message: String| RateCardError::Invalid {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
    RateCard::parse(&text).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_card_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rates.toml");
        std::fs::write(
            &p,
            "currency = \"USD\"\n[gpu_models.X]\non_demand = \"cheap\"\n",
        )
        .unwrap();
        let err = load(&p).unwrap_err().to_string();
        assert!(err.contains("rates.toml"), "{err}");
        assert!(load(&dir.path().join("missing.toml")).is_err());
    }
}
