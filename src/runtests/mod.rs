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

pub mod execute;
pub mod host;
pub mod invoke;
pub mod suite;

pub use execute::{LineOutcome, ModeResult, Regression, RunMode, regressions};
pub use suite::{SkipReason, Suite, SuiteError, Unit};
