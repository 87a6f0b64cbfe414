//! Grid carbon intensities for the ledger's energy: the built-in table per cloud region
//! (`carbon/grid-intensity.toml`, with its sources) under the config's `[carbon]` table, and
//! each host of an attribution's intensity from its cluster and region. The rules are the core's
//! ([`gpuledger_core::carbon`]).

use std::sync::OnceLock;

use gpuledger_core::carbon::*;

use gpuledger_core::attribution::Attribution;

const BUILT_IN: &str = include_str!("carbon/grid-intensity.toml");

/// The built-in table: every cloud region it names, no default.
pub fn built_in() -> &'static GridTable {
    static TABLE: OnceLock<GridTable> = OnceLock::new();
    // A test parses and checks the file, so it cannot fail here; an empty table (emissions
    // unknown) would be the safe answer if it ever did.
    TABLE.get_or_init(|| toml::from_str(BUILT_IN).unwrap_or_default())
}

/// The table in force: the config's `[carbon]` over the built-in one.
pub fn table(config: &GridTable) -> GridTable {
    config.over(built_in())
}

/// The intensity of each host `a` knows, as the table in force gives it.
pub fn grid(a: &Attribution, config: &GridTable) -> Grid {
    Grid::of_hosts(
        &table(config),
        a.hosts
            .values()
            .map(|h| (h.id, h.cluster.as_str(), h.region.as_deref())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_table_parses_and_every_figure_is_a_grid_intensity() {
        let table: GridTable = toml::from_str(BUILT_IN).unwrap();
        table.check().unwrap();
        assert!(table.regions.len() > 100, "{}", table.regions.len());
        assert!(table.clusters.is_empty() && table.default_g_per_kwh.is_none());
        // One of each provider, as their sources give them.
        assert_eq!(table.regions["us-east-1"], 379.1);
        assert_eq!(table.regions["europe-west4"], 410.0);
        assert_eq!(table.regions["westeurope"], 328.4);
        assert_eq!(built_in(), &table);
    }

    #[test]
    fn the_config_overrides_and_extends_the_built_in_table() {
        let config: GridTable = toml::from_str(
            "default_g_per_kwh = 436\n[clusters]\nonprem = 45.5\n[regions]\nus-east-1 = 350\n",
        )
        .unwrap();
        let t = table(&config);
        assert_eq!(t.intensity("onprem", Some("us-west-2")).unwrap().0, 45.5);
        assert_eq!(t.intensity("train", Some("us-east-1")).unwrap().0, 350.0);
        assert_eq!(t.intensity("train", Some("us-west-2")).unwrap().0, 322.2);
        assert_eq!(t.intensity("train", None).unwrap().0, 436.0);
        assert!(
            toml::from_str::<GridTable>("regon = {}").is_err(),
            "a misspelt table"
        );
    }
}
