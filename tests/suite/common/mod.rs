//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod build;
pub mod canon;
pub mod eh_frame;
pub mod failing;

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

/// Deterministic pseudo-random bytes for a seed (xorshift), as inputs to the
/// fuzz generator.
pub fn seed_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A function whose machine code depends on its block layout
/// (`tests/data/layout_dependent.clif`).
pub fn layout_dependent() -> Function {
    let text = std::fs::read_to_string(data_dir().join("layout_dependent.clif")).unwrap();
    cranelift_reader::parse_functions(&text).unwrap().remove(0)
}

/// `func` with every block after the entry moved, with its instructions,
/// to the front of the rest in reverse order: the same function in another
/// layout.
pub fn reversed(func: &Function) -> Function {
    let mut func = func.clone();
    let blocks: Vec<_> = func.layout.blocks().collect();
    for &block in &blocks[1..] {
        let insts: Vec<_> = func.layout.block_insts(block).collect();
        for &inst in &insts {
            func.layout.remove_inst(inst);
        }
        func.layout.remove_block(block);
        func.layout.insert_block_after(block, blocks[0]);
        for &inst in &insts {
            func.layout.append_inst(inst, block);
        }
    }
    func
}
