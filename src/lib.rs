#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
//!
//! # Modules
//!
//! The pipeline: [`fingerprint`] (one canonical walk per function, giving
//! an exact key and a template key) → [`cache`] (classes found by key) →
//! [`refine`] (classes over the call graph) → [`module`] (a
//! `cranelift_module::Module` that compiles each class once, copies code
//! between functions with one template, and adapts functions that differ
//! only in their calling convention), with [`store`] keeping compiled code
//! across runs and processes. The [`corpus`], [`report`],
//! [`compile`] and [`isa`] modules serve the `jitfold` command line and the
//! benchmarks; [`demo`] is the built-in workload, `runtests` (feature
//! `runtests`) runs Cranelift's `test run` files plainly and through
//! jitfold, and `fuzzing` (feature `fuzzing`, Unix hosts) is the
//! differential check.

pub mod cache;
pub mod code;
pub mod compile;
pub mod corpus;
pub mod demo;
pub mod fingerprint;
// The differential check runs calls that may trap in child processes.
#[cfg(all(feature = "fuzzing", unix))]
pub mod fuzzing;
pub mod isa;
pub mod module;
pub mod plan;
pub mod refine;
pub mod report;
#[cfg(feature = "runtests")]
pub mod runtests;
pub mod store;

pub use cache::{ClassId, DedupCache, Lookup};
pub use cranelift_codegen;
pub use fingerprint::{
    BorrowedFingerprint, CanonicalKey, ErasedConvention, Fingerprint, Fingerprinter, SymbolName,
    Template, Walk,
};
pub use module::{DedupError, DedupModule, DedupOptions, Mode, Stats};
