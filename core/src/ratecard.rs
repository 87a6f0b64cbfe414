//! The rate card: hourly prices for hosts that have no bill (on-prem, or not billed yet).
//! Costs from it are estimates, replaced by the bill once one covers the same host and hour.

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::Deserialize;

const DEFAULT: &str = include_str!("ratecard.default.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateCard {
    pub currency: String,
    #[serde(default)]
    pub instance_types: BTreeMap<String, InstanceRate>,
    #[serde(default)]
    pub gpu_models: BTreeMap<String, Rate>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceRate {
    pub gpus: u32,
    #[serde(with = "rust_decimal::serde::str")]
    pub on_demand: Decimal,
    #[serde(default, with = "rust_decimal::serde::str_option")]
    pub spot: Option<Decimal>,
    /// The hourly price under a 1-year commitment (savings plan or reservation), where your
    /// contract says; what purchase-mix advice prices commitments at.
    #[serde(default, with = "rust_decimal::serde::str_option")]
    pub commit_1y: Option<Decimal>,
    /// The same for 3 years.
    #[serde(default, with = "rust_decimal::serde::str_option")]
    pub commit_3y: Option<Decimal>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    #[serde(with = "rust_decimal::serde::str")]
    pub on_demand: Decimal,
    #[serde(default, with = "rust_decimal::serde::str_option")]
    pub spot: Option<Decimal>,
}

impl RateCard {
    /// The shipped defaults: approximate list prices for common GPU instances and GPUs.
    pub fn default_card() -> RateCard {
        // The shipped file is tested below; failing here would be a build defect.
        toml::from_str(DEFAULT).unwrap_or_else(|e| panic!("built-in rate card is invalid: {e}"))
    }

    /// Reads a rate card from its TOML text; rates must not be negative.
    pub fn parse(text: &str) -> Result<RateCard, String> {
        let card: RateCard = toml::from_str(text).map_err(|e| e.to_string())?;
        let negative = card.instance_types.values().any(|r| {
            [Some(r.on_demand), r.spot, r.commit_1y, r.commit_3y]
                .into_iter()
                .flatten()
                .any(|d| d.is_sign_negative())
        }) || card
            .gpu_models
            .values()
            .any(|r| r.on_demand.is_sign_negative());
        if negative {
            return Err("rates must not be negative".into());
        }
        Ok(card)
    }

    /// The hourly price of a whole host and its pricing category: by instance type, else per
    /// GPU by model; the spot rate for a spot host where the card has one, else on-demand.
    pub fn host_price(
        &self,
        instance_type: Option<&str>,
        gpu_names: &[&str],
        spot: bool,
    ) -> Option<(Decimal, &'static str)> {
        let pick = |on_demand: Decimal, spot_rate: Option<Decimal>| match spot_rate {
            Some(s) if spot => (s, "spot"),
            _ => (on_demand, "on_demand"),
        };
        if let Some(rate) = instance_type.and_then(|t| self.instance_types.get(t)) {
            return Some(pick(rate.on_demand, rate.spot));
        }
        if gpu_names.is_empty() {
            return None;
        }
        let rates: Option<Vec<&Rate>> = gpu_names.iter().map(|n| self.gpu_rate(n)).collect();
        let rates = rates?;
        let all_spot = rates.iter().all(|r| r.spot.is_some());
        let total = rates
            .iter()
            .map(|r| {
                if spot && all_spot {
                    r.spot.unwrap_or(r.on_demand)
                } else {
                    r.on_demand
                }
            })
            .sum();
        Some((
            total,
            if spot && all_spot {
                "spot"
            } else {
                "on_demand"
            },
        ))
    }

    /// The rate for a GPU by NVML name; the longest model name contained in it wins.
    fn gpu_rate(&self, gpu_name: &str) -> Option<&Rate> {
        let upper = gpu_name.to_ascii_uppercase();
        self.gpu_models
            .iter()
            .filter(|(model, _)| upper.contains(&model.to_ascii_uppercase()))
            .max_by_key(|(model, _)| model.len())
            .map(|(_, rate)| rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn the_shipped_card_loads_and_prices_common_hosts() {
        let card = RateCard::default_card();
        assert_eq!(card.currency, "USD");
        for t in [
            "p4d.24xlarge",
            "p5.48xlarge",
            "g5.xlarge",
            "g6.xlarge",
            "g4dn.xlarge",
        ] {
            assert!(card.instance_types.contains_key(t), "{t}");
        }
        assert_eq!(
            card.host_price(Some("p4d.24xlarge"), &[], false)
                .map(|(p, _)| p),
            Some(Decimal::from_str("32.7726").unwrap())
        );
        // An on-prem host: per GPU by model, longest name first.
        let names = ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"];
        assert_eq!(
            card.host_price(None, &names, false).map(|(p, _)| p),
            Some(Decimal::from_str("5.00").unwrap())
        );
        assert_eq!(
            card.host_price(None, &["NVIDIA H100 80GB HBM3"], false)
                .map(|(p, _)| p),
            Some(Decimal::from_str("3.50").unwrap())
        );
        assert_eq!(
            card.host_price(None, &["Tesla T4"], false).map(|(p, _)| p),
            Some(Decimal::from_str("0.35").unwrap())
        );
        assert_eq!(
            card.host_price(None, &["Quadro Unknown"], false)
                .map(|(p, _)| p),
            None
        );
        assert_eq!(
            card.host_price(Some("p4d.24xlarge"), &[], true),
            Some((Decimal::from_str("13.1090").unwrap(), "spot"))
        );
        assert_eq!(
            card.host_price(None, &["Tesla T4"], true),
            Some((Decimal::from_str("0.14").unwrap(), "spot"))
        );
    }

    #[test]
    fn a_negative_rate_is_refused() {
        let err = RateCard::parse("currency = \"USD\"\n[gpu_models.X]\non_demand = \"-1\"\n")
            .unwrap_err();
        assert!(err.contains("negative"), "{err}");
    }
}
