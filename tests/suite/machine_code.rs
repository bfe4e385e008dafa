//! The machine-code oracle of `jitfold::compile`: laying blocks out in the
//! walk's order, and the comparison that decides "same machine code".

use cranelift_codegen::ir::{Block, Function, UserExternalName};
use jitfold::SymbolName;
use jitfold::compile::{
    CodeDifference, RelocTarget, Renaming, compare_compiled, compare_compiled_renamed, compile,
    laid_out_in_walk_order,
};
use jitfold::isa::{host_isa, jit_flags};

use crate::common;

fn parse(text: &str) -> Function {
    cranelift_reader::parse_functions(text).unwrap().remove(0)
}

fn layout(func: &Function) -> Vec<Block> {
    func.layout.blocks().collect()
}

/// Blocks come out in DFS pre-order following each terminator's
/// destinations in order (`brif`: then, else; `br_table`: default, then
/// entries), unreachable blocks are gone with their instructions, each
/// block keeps its instructions in order, and a cold block stays cold.
#[test]
fn layout_follows_the_walk() {
    let func = parse(
        "function %f(i64) -> i64 {
         block5:
             v9 = iconst.i64 9
             return v9
         block0(v0: i64):
             brif v0, block3, block1
         block1 cold:
             v1 = ireduce.i32 v0
             br_table v1, block4, [block2, block3]
         block2:
             return v0
         block3:
             jump block4
         block4:
             v2 = iconst.i64 2
             v3 = iadd v0, v2
             return v3
         }",
    );
    // The parser puts the first block first: make block0 the entry.
    let mut func = func;
    let block = |n| Block::from_u32(n);
    let b5 = block(5);
    let insts: Vec<_> = func.layout.block_insts(b5).collect();
    for &inst in &insts {
        func.layout.remove_inst(inst);
    }
    func.layout.remove_block(b5);
    func.layout.append_block(b5);
    for &inst in &insts {
        func.layout.append_inst(inst, b5);
    }
    assert_eq!(layout(&func)[0], block(0));

    let laid = laid_out_in_walk_order(&func);
    // block0 -> then block3 -> block4; else block1 -> default block4
    // (seen), block2, block3 (seen).
    assert_eq!(
        layout(&laid),
        [block(0), block(3), block(4), block(1), block(2)]
    );
    assert!(laid.layout.is_cold(block(1)));
    assert!(!laid.layout.is_cold(block(3)));
    for b in layout(&laid) {
        let before: Vec<_> = func.layout.block_insts(b).collect();
        let after: Vec<_> = laid.layout.block_insts(b).collect();
        assert_eq!(before, after, "{b}");
    }
    let flags = jit_flags();
    cranelift_codegen::verify_function(&laid, &flags).unwrap();
    // The original keeps its layout.
    assert_eq!(layout(&func).len(), 6);
}

/// A generated function (fuzz seed 55, its unreachable blocks removed)
/// whose code depends on its block layout: another layout of it compiles
/// to other bytes, and the comparison still finds the same code, because
/// it lays both out in one order before it calls them different.
#[test]
fn layout_alone_is_no_mismatch() {
    let isa = host_isa(jit_flags()).unwrap();
    let func = common::layout_dependent();
    let other = common::reversed(&func);
    assert_ne!(
        compile(&func, &*isa).unwrap().code.bytes,
        compile(&other, &*isa).unwrap().code.bytes,
        "the layouts compile alike: this test needs another function"
    );
    assert_eq!(compare_compiled(&*isa, &func, &other).unwrap(), None);
}

fn slots_function(first: (u32, u8), second: (u32, u8)) -> Function {
    parse(&format!(
        "function %f(i64) -> i64 {{
             ss0 = explicit_slot {}, align = {}
             ss1 = explicit_slot {}, align = {}
         block0(v0: i64):
             v1 = stack_addr.i64 ss0
             v2 = stack_addr.i64 ss1
             v3 = isub v1, v2
             return v3
         }}",
        first.0,
        1 << first.1,
        second.0,
        1 << second.1
    ))
}

/// Two functions that use the same two slots in the other index order lay
/// out their frames differently: a mismatch, with what differs and both
/// disassemblies.
#[test]
fn slot_index_order_is_a_mismatch() {
    let isa = host_isa(jit_flags()).unwrap();
    // ss1 starts at 12 in one frame and at 4 in the other.
    let a = slots_function((12, 2), (4, 2));
    let b = slots_function((4, 2), (12, 2));
    let mismatch = compare_compiled(&*isa, &a, &b)
        .unwrap()
        .expect("the frames differ");
    assert_eq!(mismatch.difference, CodeDifference::Bytes);
    assert_ne!(mismatch.first, mismatch.second);
    assert!(mismatch.first.contains("alignment"), "{}", mismatch.first);
    let shown = mismatch.to_string();
    assert!(shown.starts_with("machine code differs"), "{shown}");
    // The same function is the same code.
    assert_eq!(compare_compiled(&*isa, &a, &a.clone()).unwrap(), None);
}

fn calling(callee: u32) -> Function {
    parse(&format!(
        "function u0:9(i64) -> i64 {{
             sig0 = (i64) -> i64
             fn0 = colocated u0:{callee} sig0
         block0(v0: i64):
             v1 = call fn0(v0)
             return v1
         }}"
    ))
}

fn user(index: u32) -> SymbolName {
    SymbolName::User(UserExternalName::new(0, index))
}

/// Callers of other callees differ in their relocations only; a renaming
/// slot for slot, or by class, makes them the same code, and a renaming
/// that maps the names apart does not.
#[test]
fn relocations_compare_modulo_a_renaming() {
    let isa = host_isa(jit_flags()).unwrap();
    let (a, b) = (calling(1), calling(2));
    let mismatch = compare_compiled(&*isa, &a, &b)
        .unwrap()
        .expect("other callee");
    assert_eq!(mismatch.difference, CodeDifference::Relocations);

    let (first, second) = ([user(1)], [user(2)]);
    let slots = Renaming::slots(&first, &second);
    assert_eq!(
        compare_compiled_renamed(&*isa, &a, &b, &slots).unwrap(),
        None
    );
    // Slot for slot against the wrong name is still a mismatch.
    let wrong = [user(3)];
    let slots = Renaming::slots(&wrong, &second);
    assert!(
        compare_compiled_renamed(&*isa, &a, &b, &slots)
            .unwrap()
            .is_some()
    );

    // u0:1 and u0:2 in one class (named by the lower index).
    let class = Renaming::by_class(|_, name: &SymbolName| match name {
        SymbolName::User(u) if u.index == 2 => user(1),
        other => other.clone(),
    });
    assert_eq!(
        compare_compiled_renamed(&*isa, &a, &b, &class).unwrap(),
        None
    );
    let apart = Renaming::by_class(|_, name: &SymbolName| name.clone());
    assert!(
        compare_compiled_renamed(&*isa, &a, &b, &apart)
            .unwrap()
            .is_some()
    );
    // Renaming changes only the targets it is asked to.
    let code = compile(&a, &*isa).unwrap().code;
    let renamed = code.renamed(&|r| match &r.target {
        RelocTarget::Name(_) => RelocTarget::OwnOffset(0),
        other => other.clone(),
    });
    assert_eq!(renamed.bytes, code.bytes);
    assert_eq!(renamed.relocs.len(), code.relocs.len());
    assert!(
        renamed
            .relocs
            .iter()
            .all(|r| r.target == RelocTarget::OwnOffset(0))
    );
}

/// A compile error is an `Err` naming the side, not a mismatch.
#[test]
fn a_compile_error_is_an_error() {
    let isa = host_isa(jit_flags()).unwrap();
    let good = calling(1);
    // Returns an `i64` as an `i32`: the verifier rejects it.
    let bad = parse(
        "function %bad(i64) -> i32 {
         block0(v0: i64):
             return v0
         }",
    );
    let e = compare_compiled(&*isa, &good, &bad).unwrap_err();
    assert!(e.contains("second"), "{e}");
}
