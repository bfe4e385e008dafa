//! Differential fuzzing helpers (feature `fuzzing`): a generator of valid
//! programs with calls among them ([`program`]) and the check that merged
//! code behaves like unmerged code ([`differential`]) and compiles to the
//! same machine code ([`machine_code`]), whose calls run in
//! child processes so that a trap is an outcome ([`isolated`]; Unix only).
//! [`api`] is the differential test of the `Module` API itself: random
//! sequences of calls against a plain module and `DedupModule`.
//! The cargo-fuzz targets in `fuzz/` and the seeded test in
//! `tests/suite/fuzz_seeds.rs` are thin callers of [`differential_bytes`] and
//! [`fingerprint_bytes`].

pub mod api;
pub mod defects;
pub mod differential;
pub mod isolated;
pub mod machine_code;
pub mod program;
mod stored;

use arbitrary::{Arbitrary, Unstructured};

/// Runs the whole differential check on the program `data` encodes. Returns
/// `None` when `data` is too short to make a program.
pub fn differential_bytes(data: &[u8]) -> Option<Result<differential::Outcome, String>> {
    let program = program::Program::arbitrary(&mut Unstructured::new(data)).ok()?;
    Some(differential::check(&program))
}

/// Checks only the fingerprint laws on the program `data` encodes.
pub fn fingerprint_bytes(data: &[u8]) -> Option<Result<(), String>> {
    let program = program::Program::arbitrary(&mut Unstructured::new(data)).ok()?;
    Some(differential::check_fingerprints(&program))
}
