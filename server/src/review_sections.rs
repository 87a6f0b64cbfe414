//! The monthly review's heaviest sections: the ranking of every GPU by cost that picks the
//! heatmap's rows, the idle history, the cost per instance type behind coverage, the
//! scale-to-zero windows and the week's shape. Each sums a whole month of a fleet's rollups, so
//! each is kept as first computed ([`crate::sections`]): an ended month's until the roll-up
//! rewrites an hour of it, the month under way's (which the roll-up rewrites every minute) for
//! at most [`crate::sections::MAX_AGE_MS`]. A job computes them again for whoever sees every
//! team ([`refresh`]), so that views of the month under way read them kept.

use crate::idle_history::{IdleEpisode, Summary};
use crate::ledger;
use crate::scale_to_zero::OwnerWindows;
use crate::store::{Store, StoreError};
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::scope::Scope;
use gpuledger_core::shape::TypeShape;

/// GPUs in the review's utilization heatmap: the month's costliest.
pub const HEATMAP_GPUS: usize = 40;
/// Rows of the review's short lists (the costliest idle episodes).
pub const TOP_ROWS: usize = 10;

/// A month's idle waste as the review reads it: the kept summary, or the episodes a scoped
/// reader narrows to its hosts first.
pub enum IdleWaste {
    Summary(Summary),
    Episodes(Vec<IdleEpisode>),
}

/// The heavy sections of one month for one reader.
pub struct Sections {
    /// The heatmap's GPUs, and how many GPUs the month had.
    pub heatmap_gpus: (Vec<String>, usize),
    pub idle: IdleWaste,
    pub type_costs: Vec<gpuledger_core::commitment::TypeCost>,
    pub scale_to_zero: Vec<OwnerWindows>,
    pub shape: Vec<TypeShape>,
}

/// The heavy sections of `[from, to)` for a reader of `scope`, each kept or computed (and
/// kept), side by side; all computed afresh with `recompute`. The idle history, the cost per
/// type and the heatmap's ranking are kept once for the whole fleet and narrowed to a reader's
/// teams afterwards; scale-to-zero and the shape per reader's scope.
pub async fn read(
    store: &dyn Store,
    (schema, scope): (&OwnerSchema, &Scope),
    (from, to): (i64, i64),
    (now, recompute): (i64, bool),
) -> Result<Sections, StoreError> {
    let kept_for = crate::sections::key(scope, schema);
    let fleet_wide = crate::sections::key(&gpuledger_core::scope::EVERY_TEAM, schema);
    let heat = section(
        store,
        ("heatmap-top", &fleet_wide),
        (from, to),
        (now, recompute),
        ledger::top_gpus(store, from, to, HEATMAP_GPUS),
    );
    // Whoever sees every team reads the kept summary; a scoped reader the episodes, to keep
    // its hosts' alone.
    let idle = async {
        if scope.is_all() {
            let summary = section(
                store,
                ("idle-summary", &fleet_wide),
                (from, to),
                (now, recompute),
                async {
                    let episodes = crate::idle_history::load(store, from, to).await?;
                    Ok(Summary::of(episodes, TOP_ROWS))
                },
            )
            .await?;
            Ok(IdleWaste::Summary(summary))
        } else {
            section(
                store,
                ("idle-history", &fleet_wide),
                (from, to),
                (now, recompute),
                crate::idle_history::load(store, from, to),
            )
            .await
            .map(IdleWaste::Episodes)
        }
    };
    let type_costs = section(
        store,
        ("type-costs", &fleet_wide),
        (from, to),
        (now, recompute),
        crate::commitments::type_costs(store, from, to),
    );
    let scale_to_zero = section(
        store,
        ("scale-to-zero", &kept_for),
        (from, to),
        (now, recompute),
        crate::scale_to_zero::for_range(store, schema, scope, from, to),
    );
    let shape = section(
        store,
        ("shape", &kept_for),
        (from, to),
        (now, recompute),
        async {
            let shapes = crate::shape::for_range(store, schema, scope, (from, to), now).await?;
            Ok(shapes.into_iter().map(KeptShape::from).collect::<Vec<_>>())
        },
    );
    let (heatmap_gpus, idle, type_costs, scale_to_zero, shape) =
        tokio::try_join!(heat, idle, type_costs, scale_to_zero, shape)?;
    let shape = shape.into_iter().map(TypeShape::from).collect();
    Ok(Sections {
        heatmap_gpus,
        idle,
        type_costs,
        scale_to_zero,
        shape,
    })
}

/// A type's week as kept: with the hourly series the purchase mix is priced on, which the
/// shape's own serialization (the API's) leaves out.
#[derive(serde::Serialize, serde::Deserialize, PartialEq)]
struct KeptShape {
    shape: TypeShape,
    hourly: Vec<f64>,
    interruptible: Vec<f64>,
}

impl From<TypeShape> for KeptShape {
    fn from(mut shape: TypeShape) -> KeptShape {
        KeptShape {
            hourly: std::mem::take(&mut shape.hourly),
            interruptible: std::mem::take(&mut shape.interruptible),
            shape,
        }
    }
}

impl From<KeptShape> for TypeShape {
    fn from(kept: KeptShape) -> TypeShape {
        TypeShape {
            hourly: kept.hourly,
            interruptible: kept.interruptible,
            ..kept.shape
        }
    }
}

/// One section: kept, or computed afresh with `recompute`.
async fn section<T, F>(
    store: &dyn Store,
    name: (&str, &str),
    range: (i64, i64),
    (now, recompute): (i64, bool),
    compute: F,
) -> Result<T, StoreError>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq,
    F: std::future::Future<Output = Result<T, StoreError>>,
{
    if recompute {
        crate::sections::computed(store, name, range, now, compute).await
    } else {
        crate::sections::kept(store, name, range, now, compute).await
    }
}

/// The heavy sections of the months still open (from `open_from`, the oldest, and at most the
/// month before the one under way at `now`) for whoever sees every team: the month under way's
/// computed afresh, an ended month's where a roll-up retired them. What the job does every
/// [`crate::sections::REFRESH_EVERY_MS`], so that views read them kept.
pub async fn refresh(
    store: &dyn Store,
    schema: &OwnerSchema,
    open_from: i64,
    now: i64,
) -> Result<(), StoreError> {
    use gpuledger_core::time::{month_start_ms, next_month_start};
    let month_before = month_start_ms(month_start_ms(now) - 1);
    let mut month = month_start_ms(open_from.clamp(month_before, now));
    while month <= now {
        let next = next_month_start(month);
        let every_team = (schema, &gpuledger_core::scope::EVERY_TEAM);
        read(store, every_team, (month, next), (now, now < next)).await?;
        month = next;
    }
    Ok(())
}
