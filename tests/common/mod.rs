//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod build;
pub mod canon;
pub mod program;

use cranelift_codegen::ir::Function;
use std::path::PathBuf;

/// The project's own test data folder.
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Parses CLIF text that must be valid, verifying every function against
/// the file's target.
pub fn parse_valid(text: &str) -> Vec<Function> {
    match jitfold::corpus::parse_text(text, None) {
        jitfold::corpus::FileOutcome::Parsed { functions, .. } => functions
            .into_iter()
            .map(|f| {
                if let Some(e) = f.verifier_error {
                    panic!("{} fails the verifier: {e}", f.func.name);
                }
                f.func
            })
            .collect(),
        jitfold::corpus::FileOutcome::ParseError(e) => panic!("parse error: {e}"),
        _ => panic!("unexpected outcome"),
    }
}
