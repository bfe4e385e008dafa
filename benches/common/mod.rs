//! Shared by the benches: reading back what criterion measured in this run,
//! so each bench can print ratios against its baseline.

use std::path::Path;

/// Mean time in nanoseconds of the benchmark `target/criterion/<id...>`
/// from this run's estimates, if criterion wrote them.
pub fn mean_ns(id: &[&str]) -> Option<f64> {
    let mut path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/criterion");
    for part in id {
        path.push(part);
    }
    let text = std::fs::read_to_string(path.join("new/estimates.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["mean"]["point_estimate"].as_f64()
}
