#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
//!
//! # Modules
//!
//! The pipeline: [`fingerprint`] (one canonical walk per function) →
//! [`cache`] (exact duplicates found by key) → [`module`] (a
//! `cranelift_module::Module` that compiles each class once). The
//! [`corpus`], [`report`] and [`isa`] modules serve the `jitfold` command line
//! and the benchmarks.

pub mod cache;
pub mod compile;
pub mod corpus;
pub mod demo;
pub mod fingerprint;
pub mod isa;
pub mod module;
pub mod report;

pub use cache::{ClassId, DedupCache, Lookup};
pub use cranelift_codegen;
pub use fingerprint::{Fingerprint, Fingerprinter};
pub use module::{DedupModule, DedupOptions, Mode, Stats};
