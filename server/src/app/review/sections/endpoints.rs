//! What each endpoint's requests and tokens cost: per 1,000 requests, per 1M tokens and per 1M
//! generated tokens, with who counted them. Requests count only for endpoints wholly the
//! viewer's.

use super::Section;
use crate::app::review::charts::{self, by_role};
use crate::app::review::{Ask, Month, TOP_ROWS};
use crate::format::money;
use crate::store::StoreError;
use crate::unit_costs::{self, EndpointUnitCost};
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::owners::Role;

pub struct Endpoints {
    /// The costliest.
    pub rows: Vec<EndpointRow>,
    /// Every endpoint, as CSV.
    pub csv: String,
}

pub struct EndpointRow {
    pub endpoint: String,
    pub href: String,
    pub requests: String,
    pub cost: String,
    pub per_1k: String,
    /// What a million tokens in and out cost, where they are counted.
    pub per_1m_tokens: String,
    /// The whole cost per million generated tokens.
    pub per_1m_output: String,
    /// Who counted: "serving code", "vLLM (agent)", …
    pub counted_by: String,
    /// Counted by serving code and read from an engine too: each unit looks half its cost.
    pub counted_twice: bool,
}

/// What the month's endpoints counted: requests, tokens (in, out) and who counted them.
pub struct Counts {
    pub requests: Vec<(String, i64)>,
    pub tokens: Vec<(String, Option<i64>, Option<i64>)>,
    pub sources: Vec<(String, String)>,
}

impl Counts {
    pub async fn read(ask: &Ask<'_>) -> Result<Counts, StoreError> {
        let (store, from, to) = (ask.cx.store, ask.from, ask.to);
        let (requests, tokens, sources) = tokio::try_join!(
            unit_costs::request_totals(store, from, to),
            unit_costs::token_totals(store, from, to),
            unit_costs::usage_sources(store, from, to),
        )?;
        Ok(Counts {
            requests,
            tokens,
            sources,
        })
    }

    /// Each endpoint's cost in `a` per unit of what it counted, costliest first; requests
    /// only of the endpoints wholly the viewer's, judged on the `whole` month.
    pub fn unit_costs(
        self,
        (a, whole): (
            &gpuledger_core::attribution::Attribution,
            &gpuledger_core::attribution::Attribution,
        ),
        viewer: crate::app::Viewer<'_>,
    ) -> Vec<EndpointUnitCost> {
        let requests = unit_costs::requests_of_held_endpoints(
            whole,
            self.requests,
            (viewer.schema, viewer.scope),
        );
        let mut rows = unit_costs::endpoint_costs(a, &requests, viewer.schema);
        unit_costs::with_tokens(&mut rows, &self.tokens);
        unit_costs::with_sources(&mut rows, &self.sources);
        rows
    }
}

impl Section for Endpoints {
    type Read = Counts;

    async fn read(ask: &Ask<'_>) -> Result<Counts, StoreError> {
        Counts::read(ask).await
    }

    async fn build(counts: Counts, month: &Month<'_>) -> Result<Endpoints, StoreError> {
        let ask = month.ask;
        let endpoints = counts.unit_costs((&month.shown, month.whole()), ask.viewer);
        Ok(Endpoints {
            rows: (endpoints.iter().take(TOP_ROWS))
                .map(|e| row(e, &ask.month, ask.viewer.schema))
                .collect(),
            csv: format!(
                "/api/v1/usage?{}",
                charts::query(&[("from", &ask.month), ("to", &ask.next), ("format", "csv")])
            ),
        })
    }
}

/// How the pages name who counted an endpoint's work.
fn source_name(source: &str) -> &str {
    match source {
        "posted" => "serving code",
        "vllm" => "vLLM (agent)",
        "tgi" => "TGI (agent)",
        "triton" => "Triton (agent)",
        other => other,
    }
}

/// An endpoint's unit costs in words, linking to its drill-down.
pub fn row(e: &EndpointUnitCost, month: &str, schema: &OwnerSchema) -> EndpointRow {
    let precise = |c: Option<rust_decimal::Decimal>| {
        c.map_or_else(
            || "—".into(),
            |c| crate::format::money_precise(c, &e.currency, 4),
        )
    };
    EndpointRow {
        endpoint: e.endpoint.clone(),
        href: charts::drill_href(month, by_role(schema, Role::Endpoint), &e.endpoint),
        requests: e
            .requests
            .map_or_else(|| "no counts".into(), crate::format::thousands),
        cost: money(e.cost, &e.currency),
        per_1k: precise(e.cost_per_1k_requests),
        per_1m_tokens: precise(e.cost_per_1m_tokens),
        per_1m_output: precise(e.cost_per_1m_output_tokens),
        counted_by: e
            .counted_by
            .iter()
            .map(|s| source_name(s))
            .collect::<Vec<_>>()
            .join(", "),
        counted_twice: e.counted_twice(),
    }
}
