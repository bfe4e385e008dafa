//! jitfold: deduplicates JIT-compiled Cranelift functions.
//!
//! The pipeline: [`fingerprint`] (one canonical walk per function) →
//! [`cache`] (exact duplicates found by key) → compile each class once.

pub mod cache;
pub mod corpus;
pub mod fingerprint;
pub mod isa;
pub mod report;

pub use cache::{ClassId, DedupCache, Lookup};
pub use fingerprint::{Fingerprint, Fingerprinter};
pub use cranelift_codegen;
