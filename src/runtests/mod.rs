//! Cranelift's own run tests, run through jitfold: a peer's test suite for
//! merged code (feature `runtests`).
//!
//! Cranelift's filetests state calls and their expected results in comments
//! (`; run: %add(1, 2) == 3`). [`Suite::load`] reads the `test run` files
//! under some paths ([`suite`]); [`Suite::run_plain`] compiles each file
//! with a plain `JITModule`, as Cranelift's own runner does (the baseline);
//! [`Suite::run_jitfold`] compiles all files of one configuration together
//! through a [`DedupModule`](crate::DedupModule), so that duplicates across
//! files merge ([`execute`]); [`regressions`] lists every line the baseline
//! passes and jitfold does not. Calls go through one trampoline per
//! signature, in child processes ([`invoke`]; Unix only, through the
//! fuzzing harness's [`crate::fuzzing::isolated`], which is why this
//! feature enables `fuzzing`).
//!
//! # What this module guarantees
//!
//! - Every run line the suite holds has one outcome per mode (passed,
//!   failed with a message, or skipped with a [`SkipReason`]), in the same
//!   order in every mode.
//! - Results are compared as Cranelift's runner compares them
//!   (`cranelift_reader::RunCommand::run`: bitwise, `==` and `!=`).
//! - A line that fails under plain Cranelift (its time limit included) is
//!   run once, in the baseline: every jitfold mode takes its outcome.
//! - [`modes`] is every option set `jitfold runtests` runs: each of
//!   [`DedupOptions::ALL`](crate::DedupOptions::ALL), and similar merging
//!   with code reuse (eager) and on two batch threads, which `ALL` does not
//!   combine.

use crate::DedupOptions;
use crate::similar::SimilarOptions;

/// The option sets `jitfold runtests` runs every line under (see the
/// module docs).
pub fn modes() -> Vec<DedupOptions> {
    let mut modes = DedupOptions::ALL.to_vec();
    modes.push(DedupOptions::eager().with_similar(SimilarOptions::DEFAULT));
    modes.push(
        DedupOptions::batch()
            .with_threads(2)
            .with_similar(SimilarOptions::DEFAULT),
    );
    modes
}

pub mod execute;
pub mod host;
pub mod invoke;
pub mod suite;

pub use execute::{LineOutcome, ModeResult, Regression, RunMode, regressions};
pub use suite::{SkipReason, Suite, SuiteError, Unit};
