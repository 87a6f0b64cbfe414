//! Recommendations: the rules are the core's ([`gpuledger_core::recommend`]); here, what they
//! are drawn from is read from the rollups, and ([`snapshots`]) what they said is kept.

use crate::store::{self, Store, StoreError};
use gpuledger_core::recommend::*;
#[cfg(test)]
use gpuledger_core::telemetry::{AttributionWindow, StoredProcessWindow, UsageTotal};
#[cfg(test)]
use std::collections::HashMap;

pub mod snapshots;

/// The cash savings added up, one sum per currency: `$1,200.00 + €300.00`.
pub fn savings_text(r: &Recommendations) -> String {
    crate::format::money_sums(r.total_saving.iter().map(|t| (&t.currency, &t.amount)))
}

/// The commitment the recommendations free, added up the same way; "" where they free none.
pub fn frees_text(r: &Recommendations) -> String {
    if r.total_frees_commitment.is_empty() {
        return String::new();
    }
    crate::format::money_sums((r.total_frees_commitment.iter()).map(|t| (&t.currency, &t.amount)))
}

/// The recommendations of `range` a team-scoped reader may see ([`within_scope`], its GPUs
/// judged over the same range); all of them for every team.
pub async fn for_scope(
    store: &dyn Store,
    recs: Recommendations,
    range: snapshots::Range,
    (scope, owners): (
        &gpuledger_core::scope::Scope,
        &gpuledger_core::owners::OwnerSchema,
    ),
) -> Result<Recommendations, StoreError> {
    if scope.is_all() {
        return Ok(recs);
    }
    let gpu_days =
        crate::ledger::load(store, range.from_ms, range.to_ms, store::RollupGrain::Day).await?;
    let held = scope.held_keys(&gpu_days, gpuledger_core::allocation::GroupBy::Gpu, owners);
    Ok(within_scope(recs, held.as_ref()))
}

/// The recommendations a team-scoped reader may see: those whose GPUs are all its teams'
/// (`held_gpus`, from [`gpuledger_core::scope::Scope::held_keys`] over the look-back), their
/// savings added up again. `None`: every team, all of them.
pub fn within_scope(
    recs: Recommendations,
    held_gpus: Option<&std::collections::BTreeSet<String>>,
) -> Recommendations {
    let Some(held) = held_gpus else {
        return recs;
    };
    let ours = |gpus: &[String]| !gpus.is_empty() && gpus.iter().all(|g| held.contains(g));
    let mut kept = Recommendations {
        lookback_days: recs.lookback_days,
        right_size: recs
            .right_size
            .into_iter()
            .filter(|r| ours(&r.gpus))
            .collect(),
        consolidation: (recs.consolidation.into_iter())
            .filter(|r| ours(&r.gpus))
            .collect(),
        spot: recs.spot.into_iter().filter(|r| ours(&r.gpus)).collect(),
        release: recs.release.into_iter().filter(|r| ours(&r.gpus)).collect(),
        total_saving: Vec::new(),
        total_frees_commitment: Vec::new(),
    };
    kept.sum_savings();
    kept
}

/// What recommendations for `[from_ms, to_ms)` are drawn from, summed by the database from the
/// rollups (whole days from the daily ones, the hours at either end from the hourly ones).
pub async fn recommendation_evidence(
    store: &dyn Store,
    from_ms: i64,
    to_ms: i64,
    owners: &gpuledger_core::owners::OwnerSchema,
) -> Result<Evidence, StoreError> {
    let mut evidence = Evidence {
        owners: owners.clone(),
        ..Evidence::default()
    };
    let mut texts = crate::ledger::OwnerTexts::default();
    for (grain, a, b) in crate::ledger::spans(from_ms, to_ms) {
        let (totals, usage) = tokio::try_join!(
            store::ledger::rollup_gpu_owner_totals(store.db(), grain, a, b),
            store::ledger::rollup_usage(store.db(), grain, a, b)
        )?;
        evidence.parts.extend(
            totals
                .into_iter()
                .map(|r| crate::ledger::part_of(r, &mut texts)),
        );
        evidence.usage.extend(usage);
    }
    evidence.mig_instances = store::telemetry::mig_instances(store.db())
        .await?
        .into_iter()
        .collect();
    for h in store::telemetry::hosts(store.db()).await? {
        if let Some(t) = h.instance_type {
            evidence.instance_types.insert(h.id, t);
        }
        evidence.hostnames.insert(h.id, h.hostname);
    }
    Ok(evidence)
}

/// [`Evidence`] from raw windows and their attribution: what the rollups summarize, so tests
/// can hold the two to the same answer.
#[cfg(test)]
pub fn evidence_from_raw(
    attribution: &gpuledger_core::attribution::Attribution,
    windows: &[AttributionWindow],
    processes: &[StoredProcessWindow],
) -> Evidence {
    let gpu_of: HashMap<&str, &AttributionWindow> =
        windows.iter().map(|w| (w.gpu_uuid.as_str(), w)).collect();
    let usage = crate::rollup::usage_rows(
        windows,
        processes,
        &gpuledger_core::owners::OwnerSchema::default(),
    )
    .into_iter()
    .map(|u| {
        let w = gpu_of.get(u.gpu_uuid.as_str());
        UsageTotal {
            host_id: u.host_id,
            gpu_name: w.and_then(|w| w.gpu_name.clone()),
            memory_total_bytes: w.and_then(|w| w.memory_total_bytes),
            parent_uuid: w.and_then(|w| w.parent_uuid.clone()),
            gpu_uuid: u.gpu_uuid,
            owner_by: u.owner_by,
            owner_key: u.owner_key,
            util_band: u.util_band,
            windows: u.windows,
            peak_memory_bytes: u.peak_memory_bytes,
        }
    })
    .collect();
    Evidence {
        owners: Default::default(),
        parts: attribution.parts.clone(),
        usage,
        mig_instances: windows
            .iter()
            .filter(|w| w.parent_uuid.is_some())
            .map(|w| w.gpu_uuid.clone())
            .collect(),
        hostnames: attribution
            .hosts
            .iter()
            .map(|(id, h)| (*id, h.hostname.clone()))
            .collect(),
        instance_types: attribution
            .hosts
            .iter()
            .filter_map(|(id, h)| Some((*id, h.instance_type.clone()?)))
            .collect(),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod scope_tests {
    use super::*;
    use rust_decimal::Decimal;

    #[test]
    fn a_scope_keeps_recommendations_on_its_gpus_alone_and_adds_them_up_again() {
        let release = |gpus: &[&str], saving: i64| Release {
            currency: "USD".into(),
            gpus: gpus.iter().map(|g| g.to_string()).collect(),
            host: "h".into(),
            owners: Default::default(),
            action: "stop".into(),
            cost: Decimal::from(saving),
            saving: Decimal::from(saving),
            frees_commitment: Decimal::ZERO,
            monthly_saving: Decimal::from(saving * 4),
            monthly_frees_commitment: Decimal::ZERO,
        };
        let all = Recommendations {
            lookback_days: 7.0,
            release: vec![
                release(&["GPU-a1"], 5),
                release(&["GPU-a2", "GPU-b1"], 7),
                release(&[], 11),
            ],
            ..Default::default()
        };
        let mut all = all;
        all.sum_savings();
        let held = std::collections::BTreeSet::from(["GPU-a1".to_owned(), "GPU-a2".to_owned()]);
        let mine = within_scope(all.clone(), Some(&held));
        assert_eq!(mine.release.len(), 1);
        assert_eq!(mine.release[0].gpus, vec!["GPU-a1"]);
        assert_eq!(mine.total_in("USD"), Decimal::from(5));
        assert_eq!(within_scope(all, None).total_in("USD"), Decimal::from(23));
    }
}
