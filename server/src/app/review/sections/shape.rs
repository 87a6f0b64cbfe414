//! GPUs held per GPU instance type at each hour of the week, averaged over the month: the
//! floor worth committing, the median and the peak, per team.

use super::Section;
use crate::app::review::{Ask, Month, TOP_ROWS};
use crate::store::StoreError;
use gpuledger_core::shape::TypeShape;

pub struct Shape {
    pub types: Vec<TypeShapeView>,
    pub api: String,
}

pub struct TypeShapeView {
    pub instance_type: String,
    /// "floor 48 · median 48 · peak 64 GPUs · 35,712 GPU-hours".
    pub summary: String,
    /// The week: (x, y, class, title) per hour.
    pub cells: Vec<(f64, f64, &'static str, String)>,
    /// Per team: (team, floor, median, peak, GPU-hours).
    pub owners: Vec<(String, String, String, String, String)>,
}

/// The week's cells: 7 rows (Monday first) of 24 hours, after a column of day names.
pub const SHAPE_CELL: f64 = 14.0;
pub const SHAPE_LABEL_WIDTH: f64 = 34.0;
const WEEKDAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

impl Section for Shape {
    type Read = ();

    async fn read(_: &Ask<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn build((): (), month: &Month<'_>) -> Result<Shape, StoreError> {
        Ok(view(&month.kept.shape, &month.ask.month))
    }
}

/// GPUs held as a share of the type's peak, in the heatmap's six shades.
fn shape_class(gpus: f64, peak: f64) -> &'static str {
    let share = if peak > 0.0 { gpus / peak * 100.0 } else { 0.0 };
    match share {
        s if s < 5.0 => "h0",
        s if s < 20.0 => "h1",
        s if s < 40.0 => "h2",
        s if s < 60.0 => "h3",
        s if s < 80.0 => "h4",
        _ => "h5",
    }
}

fn gpus(x: f64) -> String {
    let rounded = (x * 10.0).round() / 10.0;
    if rounded.fract() == 0.0 {
        crate::format::whole(rounded)
    } else {
        format!("{rounded:.1}")
    }
}

fn view(types: &[TypeShape], month: &str) -> Shape {
    Shape {
        types: types.iter().take(TOP_ROWS).map(type_view).collect(),
        api: format!("/api/v1/shape?month={month}"),
    }
}

fn type_view(t: &TypeShape) -> TypeShapeView {
    let s = &t.spread;
    let mut cells = Vec::with_capacity(7 * 24);
    for (d, hours) in t.week.iter().enumerate() {
        for (h, g) in hours.iter().enumerate() {
            cells.push((
                SHAPE_LABEL_WIDTH + h as f64 * SHAPE_CELL,
                d as f64 * SHAPE_CELL,
                shape_class(*g, s.peak),
                format!(
                    "{} {h:02}:00 UTC: {} GPUs on average",
                    WEEKDAYS.get(d).copied().unwrap_or(""),
                    gpus(*g)
                ),
            ));
        }
    }
    TypeShapeView {
        instance_type: t.instance_type.clone(),
        summary: format!(
            "floor {} · median {} · peak {} GPUs · {} GPU-hours",
            gpus(s.floor),
            gpus(s.median),
            gpus(s.peak),
            crate::format::whole(s.gpu_hours)
        ),
        cells,
        owners: t
            .owners
            .iter()
            .map(|o| {
                (
                    o.owner.clone().unwrap_or_else(|| "(no team)".into()),
                    gpus(o.spread.floor),
                    gpus(o.spread.median),
                    gpus(o.spread.peak),
                    crate::format::whole(o.spread.gpu_hours),
                )
            })
            .collect(),
    }
}
