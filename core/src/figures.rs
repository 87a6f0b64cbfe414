//! How measured quantities (GPU-hours, utilization, energy, emissions) are written out: to a
//! fixed number of decimals, as the CSVs write them. They are float sums, and a sum read in
//! another order (the database's plan, a kept copy's rows) can differ in its last bits: written
//! to a fixed precision, the same figure reads the same on every view. Where parts are summed
//! into a figure, [`Sum`] makes the sum itself independent of the order.

use serde::Serializer;
use std::ops::AddAssign;

/// A sum of measured quantities that is the same whatever order its terms come in: each term
/// is held to a billionth, in fixed point, so additions are exact. A float sum is not
/// (`(0.1 + 0.2) + 0.3 != 0.1 + (0.2 + 0.3)`), and a kept copy summed day by day could then
/// read otherwise than a fresh sum of the same hours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sum(i128);

impl Sum {
    const SCALE: f64 = 1e9;

    pub fn get(self) -> f64 {
        self.0 as f64 / Self::SCALE
    }
}

impl AddAssign<f64> for Sum {
    fn add_assign(&mut self, term: f64) {
        // `as` saturates, and reads NaN as 0: no term can make the sum panic.
        self.0 += (term * Self::SCALE).round() as i128;
    }
}

impl AddAssign for Sum {
    fn add_assign(&mut self, other: Sum) {
        self.0 += other.0;
    }
}

fn rounded(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (x * scale).round() / scale
}

/// To 4 decimals (GPU-hours, kWh, kg, shares).
pub fn four<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(rounded(*x, 4))
}

/// To 4 decimals, null where unknown.
pub fn four_or_null<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(x) => s.serialize_some(&rounded(*x, 4)),
        None => s.serialize_none(),
    }
}

/// To 2 decimals, null where unknown (utilization in percent).
pub fn two_or_null<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(x) => s.serialize_some(&rounded(*x, 2)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_in_another_order_write_the_same() {
        let parts = [0.1, 0.2, 0.3];
        let forward: f64 = parts.iter().sum();
        let backward: f64 = parts.iter().rev().sum();
        assert_ne!(forward.to_bits(), backward.to_bits(), "the bits differ");
        let written = |x: f64| {
            let mut out = Vec::new();
            super::four(&x, &mut serde_json::Serializer::new(&mut out)).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(written(forward), written(backward));
        assert_eq!(written(forward), "0.6");
    }
}
