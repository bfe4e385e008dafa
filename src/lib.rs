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
//! across runs and processes. Under the planner, [`code`] is
//! machine code with relocations by target (what reuse copies and
//! retargets) and [`compile`] the machine-code oracle (check mode,
//! `report --verify`, the fuzzer).
//!
//! # Features
//!
//! - `jit` and `object` (default): `DedupModule<JITModule>` and
//!   `DedupModule<ObjectModule>` with those modules' own methods; an
//!   embedder that only JITs can turn `object` off
//!   (`default-features = false, features = ["jit"]`), and neither pulls
//!   in `cranelift-reader`.
//! - `tools`: the modules the command line, tests and benchmarks share:
//!   `corpus` (reading CLIF), `report`, `demo` (the built-in workload) and
//!   `isa` (ISA lookup by name). `cli` adds the `jitfold` binary's own
//!   dependencies; `runtests` runs Cranelift's `test run` files plainly
//!   and through jitfold; `fuzzing` (Unix hosts) is the differential check.

pub mod cache;
pub mod code;
pub mod compile;
#[cfg(feature = "tools")]
pub mod corpus;
#[cfg(feature = "tools")]
pub mod demo;
pub mod fingerprint;
// The differential check runs calls that may trap in child processes.
#[cfg(all(feature = "fuzzing", unix))]
pub mod fuzzing;
#[cfg(feature = "tools")]
pub mod isa;
pub mod module;
pub mod plan;
pub mod refine;
#[cfg(feature = "tools")]
pub mod report;
#[cfg(feature = "runtests")]
pub mod runtests;
pub mod similar;
pub mod store;

pub use cache::{ClassId, DedupCache, Lookup};
pub use cranelift_codegen;
pub use fingerprint::{
    BorrowedFingerprint, CanonicalKey, ErasedConvention, Fingerprint, Fingerprinter, SymbolName,
    Template, Walk,
};
pub use module::{DedupError, DedupModule, DedupOptions, InnerBuilder, Mode, Stats};
