//! Defects the key does not see: a generated function with one added where
//! the walk does not look (an unused declaration, an instruction outside
//! the layout, a block no branch reaches), defined right after the function
//! itself, must compile through `DedupModule` exactly when it compiles in
//! plain `JITModule`. Each defect is one that makes Cranelift fail (an
//! error, or a panic) while its verifier, or its absence, lets the function
//! through; most leave the key as it is, so `DedupModule` sees a duplicate
//! of the function it just compiled and must not take its code.
//!
//! # What this module guarantees
//!
//! [`check`] returns `Err` exactly when, for some [`Defect`], plain
//! `JITModule` and `DedupModule` (eager, and batch with a flush) disagree
//! on whether the defective function compiles, or `DedupModule` panics, or
//! a defect meant to be out of the key's sight changes the key (or one
//! meant to be in it does not): then the check would no longer reach the
//! path it is for. The oracle is plain Cranelift's outcome, never
//! jitfold's model of which defects matter. Most defects make Cranelift
//! fail; [`Defect::ClearedJumpTableEntry`] is one it lets through, so the
//! check also fails if jitfold rejects what plain Cranelift compiles.

use super::differential::{build_function, functions, jit_builder_with};
use super::program::Program;
use crate::{DedupModule, DedupOptions, Fingerprint, Mode};
use cranelift_codegen::ir::{
    self, AbiParam, Function, GlobalValueData, InstBuilder, InstructionData, Opcode, Signature,
    types,
};
use cranelift_codegen::isa::CallConv;
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Linkage, Module};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A defect out of the key's sight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defect {
    /// An unused signature with more returns than any target returns
    /// (Cranelift lowers every declared signature).
    UnusedSignature,
    /// An unused dynamic type of a base type too wide (Cranelift makes
    /// every one concrete, and panics).
    UnusedDynamicType,
    /// Two values, results of instructions outside the layout, aliasing
    /// each other (resolving aliases panics).
    AliasLoop,
    /// An instruction outside the layout whose argument is no value.
    DanglingArgument,
    /// A block no branch reaches that adds an `i64` to an `i32` (the
    /// verifier rejects it).
    IllTypedUnreachableBlock,
    /// A block no branch reaches with float arithmetic the NaN
    /// canonicalization pass does not know, with that pass on.
    UnknownFloatWithNanCanonicalization,
    /// A jump table that only an instruction outside the layout uses, with
    /// an argument that is no value past its default entry: Cranelift
    /// clears such tables to their default before it looks, and compiles.
    ClearedJumpTableEntry,
}

impl Defect {
    /// Every defect.
    pub const ALL: [Defect; 7] = [
        Defect::UnusedSignature,
        Defect::UnusedDynamicType,
        Defect::AliasLoop,
        Defect::DanglingArgument,
        Defect::IllTypedUnreachableBlock,
        Defect::UnknownFloatWithNanCanonicalization,
        Defect::ClearedJumpTableEntry,
    ];

    /// Whether the defect is in the key: Cranelift lowers every declared
    /// signature and dynamic type, so the key holds unused ones; the other
    /// defects are where the walk does not look.
    fn in_key(self) -> bool {
        match self {
            Defect::UnusedSignature | Defect::UnusedDynamicType => true,
            Defect::AliasLoop
            | Defect::DanglingArgument
            | Defect::IllTypedUnreachableBlock
            | Defect::UnknownFloatWithNanCanonicalization
            | Defect::ClearedJumpTableEntry => false,
        }
    }

    /// The Cranelift flags the defect needs (beside the harness's own).
    fn flags(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Defect::UnknownFloatWithNanCanonicalization => {
                &[("enable_nan_canonicalization", "true")]
            }
            Defect::UnusedSignature
            | Defect::UnusedDynamicType
            | Defect::AliasLoop
            | Defect::DanglingArgument
            | Defect::IllTypedUnreachableBlock
            | Defect::ClearedJumpTableEntry => &[],
        }
    }

    /// Adds the defect to `func`.
    pub fn apply(self, func: &mut Function) {
        match self {
            Defect::UnusedSignature => {
                let mut signature = Signature::new(CallConv::SystemV);
                signature.returns = vec![AbiParam::new(types::I64); 9];
                func.import_signature(signature);
            }
            Defect::UnusedDynamicType => {
                let scale = func.create_global_value(GlobalValueData::DynScaleTargetConst {
                    vector_type: types::I64X8,
                });
                func.dfg.make_dynamic_ty(ir::DynamicTypeData {
                    base_vector_ty: types::I64X8,
                    dynamic_scale: scale,
                });
            }
            Defect::AliasLoop => {
                let (a, b) = (dead_value(func), dead_value(func));
                func.dfg.make_value_alias_for_serialization(a, b);
                func.dfg.make_value_alias_for_serialization(b, a);
            }
            Defect::DanglingArgument => {
                func.dfg.make_inst(InstructionData::Unary {
                    opcode: Opcode::Ineg,
                    arg: ir::Value::from_u32(u32::MAX - 1),
                });
            }
            Defect::IllTypedUnreachableBlock => {
                let block = unreachable_block(func);
                let mut pos = cursor_at(func, block);
                let wide = pos.ins().iconst(types::I64, 1);
                let narrow = pos.ins().iconst(types::I32, 1);
                let bad = pos.ins().iadd(wide, narrow);
                pos.ins().return_(&[bad]);
            }
            Defect::UnknownFloatWithNanCanonicalization => {
                let block = unreachable_block(func);
                let x = func.dfg.append_block_param(block, types::F32X8);
                let mut pos = cursor_at(func, block);
                pos.ins().fadd(x, x);
                pos.ins().trap(ir::TrapCode::unwrap_user(1));
            }
            Defect::ClearedJumpTableEntry => {
                let entry = func.layout.entry_block().expect("an entry block");
                let dfg = &mut func.dfg;
                let default = dfg.block_call(entry, &[]);
                // (Block arguments encode values below 2^30.)
                let missing = [ir::BlockArg::Value(ir::Value::from_u32(1 << 29))];
                let entry_call = dfg.block_call(entry, &missing);
                let table = dfg
                    .jump_tables
                    .push(ir::JumpTableData::new(default, &[entry_call]));
                let index = dead_value(func);
                func.dfg.make_inst(InstructionData::BranchTable {
                    opcode: Opcode::BrTable,
                    arg: index,
                    table,
                });
            }
        }
    }
}

/// The result of a new instruction outside the layout.
fn dead_value(func: &mut Function) -> ir::Value {
    let inst = func.dfg.make_inst(InstructionData::UnaryImm {
        opcode: Opcode::Iconst,
        imm: 0.into(),
    });
    func.dfg.make_inst_results(inst, types::I64);
    func.dfg.first_result(inst)
}

/// A new block at the end of the layout, which no branch names.
fn unreachable_block(func: &mut Function) -> ir::Block {
    let block = func.dfg.make_block();
    func.layout.append_block(block);
    block
}

fn cursor_at(func: &mut Function, block: ir::Block) -> cranelift_codegen::cursor::FuncCursor<'_> {
    use cranelift_codegen::cursor::{Cursor, FuncCursor};
    FuncCursor::new(func).at_bottom(block)
}

/// Whether defining function `index` of `program` and then, under another
/// id, the same function with `defect` succeeds in `m`: `Ok` of the
/// defective function's outcome (`true`: it compiled), `Err` if the
/// function itself failed. `finish` ends the definition (a flush in batch
/// mode).
fn defective_compiles<M: Module>(
    m: &mut M,
    program: &Program,
    index: usize,
    defect: Defect,
    finish: impl FnOnce(&mut M, FuncId) -> bool,
) -> Result<bool, String> {
    let ids: Vec<FuncId> = (0..program.functions.len())
        .map(|i| {
            let signature = program.body(i).0.signature();
            m.declare_function(&format!("f{i}"), Linkage::Local, &signature)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let defective = m
        .declare_function(
            "defective",
            Linkage::Local,
            &program.body(index).0.signature(),
        )
        .map_err(|e| e.to_string())?;
    let mut func = Function::new();
    build_function(program, index, &mut func, &mut |j, f| {
        m.declare_func_in_func(ids[j], f)
    });
    let mut ctx = m.make_context();
    ctx.func = func.clone();
    m.define_function(ids[index], &mut ctx)
        .map_err(|e| format!("f{index} without a defect: {e:?}"))?;
    defect.apply(&mut func);
    let mut ctx = m.make_context();
    ctx.func = func;
    let defined = m.define_function(defective, &mut ctx).is_ok();
    Ok(finish(m, defective) && defined)
}

/// Checks that function `index` of `program` with each [`Defect`] compiles
/// through `DedupModule` exactly when it does in plain `JITModule` (see the
/// module docs).
pub fn check(program: &Program, index: usize) -> Result<(), String> {
    let original = functions(program).swap_remove(index);
    for defect in Defect::ALL {
        let mut defective = original.clone();
        defect.apply(&mut defective);
        if (Fingerprint::of(&defective) != Fingerprint::of(&original)) != defect.in_key() {
            return Err(format!(
                "f{index} with {defect:?}: the key {} it",
                if defect.in_key() {
                    "does not see"
                } else {
                    "sees"
                }
            ));
        }
        let flags = defect.flags();
        let plain = crate::compile::with_quiet_panics(|| {
            catch_unwind(AssertUnwindSafe(|| {
                let mut plain = JITModule::new(jit_builder_with(flags)?);
                let compiles = defective_compiles(&mut plain, program, index, defect, |_, _| true);
                // SAFETY: nothing of the module's code is used after this.
                unsafe { plain.free_memory() };
                compiles
            }))
        });
        // A panic of plain Cranelift is its failing.
        let expected = plain.unwrap_or(Ok(false))?;
        for options in [DedupOptions::eager(), DedupOptions::batch()] {
            // Quiet: Cranelift panics that jitfold catches would otherwise
            // reach the panic hook (which under cargo-fuzz aborts).
            let got = crate::compile::with_quiet_panics(|| {
                catch_unwind(AssertUnwindSafe(|| {
                    let inner = JITModule::new(jit_builder_with(flags)?);
                    let mut dedup = DedupModule::wrap(inner, options);
                    let compiles =
                        defective_compiles(&mut dedup, program, index, defect, |m, id| {
                            options.mode == Mode::Eager
                                || (m.flush().is_ok()
                                    && m.failed_definitions().iter().all(|f| f.0 != id))
                        });
                    // SAFETY: as above.
                    unsafe { dedup.into_inner().free_memory() };
                    compiles
                }))
            })
            .map_err(|panic| {
                let message = crate::compile::panic_message(&panic);
                format!("f{index} with {defect:?}, {options}: jitfold panicked: {message}")
            })??;
            if got != expected {
                return Err(format!(
                    "f{index} with {defect:?}, {options}: {} through jitfold, {} plainly",
                    if got { "compiles" } else { "fails" },
                    if expected { "compiles" } else { "fails" },
                ));
            }
        }
    }
    Ok(())
}
