//! Invalid functions through `DedupModule<JITModule>`: every one gets the
//! error plain `JITModule` gives it, whether or not a cache hit, reused
//! code or an adapter would have spared compiling it, and nothing panics.
//! In batch mode, a failed flush defines every valid function, reports every
//! failure, and keeps failing until the failed ids are defined again or
//! given up.

use crate::common::build::{call1, declare, define, emit_call, sig};
use cranelift_codegen::CodegenError;
use cranelift_codegen::cursor::{Cursor, FuncCursor};
use cranelift_codegen::ir::{self, Block, Function, InstBuilder, UserFuncName, types::*};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Module, ModuleError, default_libcall_names};
use jitfold::store::{CodeStore, MemoryStore};
use jitfold::{DedupModule, DedupOptions, Mode};
use std::sync::Arc;

fn jit() -> JITModule {
    JITModule::new(JITBuilder::with_flags(&[], default_libcall_names()).unwrap())
}

fn dedup(options: DedupOptions) -> DedupModule<JITModule> {
    DedupModule::wrap(jit(), options)
}

/// Twenty arithmetic steps on `x` (enough for an adapter), returned.
fn chain(b: &mut FunctionBuilder, x: ir::Value) -> ir::Value {
    let mut v = x;
    for k in 1..=10 {
        v = b.ins().imul_imm_s(v, 2 * k + 1);
        v = b.ins().iadd_imm_s(v, k);
    }
    v
}

/// Returns `v`, then adds a block no branch reaches whose `iadd` mixes
/// `i64` and `i32` (the verifier rejects it; the fingerprint never sees it).
fn return_with_dead_defect(b: &mut FunctionBuilder, v: ir::Value) {
    b.ins().return_(&[v]);
    let dead = b.create_block();
    b.switch_to_block(dead);
    let narrow = b.ins().iconst(I32, 1);
    let bad = b.ins().iadd(v, narrow);
    b.ins().return_(&[bad]);
}

fn is_verifier_error(result: &Result<(), ModuleError>) -> bool {
    matches!(
        result,
        Err(ModuleError::Compilation(CodegenError::Verifier(_)))
    )
}

/// Defines and, in batch mode, flushes: the definition's own outcome.
fn define_flushed(
    m: &mut DedupModule<JITModule>,
    id: FuncId,
    body: impl FnOnce(&mut FunctionBuilder, &mut DedupModule<JITModule>, &[ir::Value]),
) -> Result<(), ModuleError> {
    define(m, id, body)?;
    m.flush()
}

/// `(i64) -> i64` whose entry block jumps to a block the function does not
/// have (no such block was ever made).
fn jump_to_missing_block(m: &impl Module) -> Function {
    let signature = sig(m, m.isa().default_call_conv());
    let mut func = Function::with_name_signature(UserFuncName::default(), signature);
    let entry = func.dfg.make_block();
    func.dfg.append_block_param(entry, I64);
    func.layout.append_block(entry);
    let mut pos = FuncCursor::new(&mut func).at_bottom(entry);
    pos.ins().jump(Block::from_u32(1000), &[]);
    func
}

#[test]
fn a_jump_to_a_missing_block_is_the_verifier_error_not_a_panic() {
    let mut plain = jit();
    let conv = plain.isa().default_call_conv();
    let id = declare(&mut plain, "f", conv);
    let mut ctx = plain.make_context();
    ctx.func = jump_to_missing_block(&plain);
    assert!(is_verifier_error(&plain.define_function(id, &mut ctx)));

    for options in DedupOptions::ALL {
        let mut m = dedup(options);
        let conv = m.isa().default_call_conv();
        let (good, bad) = (declare(&mut m, "good", conv), declare(&mut m, "bad", conv));
        define_flushed(&mut m, good, |b, _, p| {
            b.ins().return_(&[p[0]]);
        })
        .unwrap();
        let mut ctx = m.make_context();
        ctx.func = jump_to_missing_block(&m);
        let result = m.define_function(bad, &mut ctx).and_then(|()| m.flush());
        assert!(is_verifier_error(&result), "{options:?}: {result:?}");
        // The module goes on: the id can be defined again, and runs.
        define_flushed(&mut m, bad, |b, _, p| {
            let r = b.ins().iadd_imm_s(p[0], 1);
            b.ins().return_(&[r]);
        })
        .unwrap();
        m.finalize_definitions().unwrap();
        assert_eq!(call1(m.get_finalized_function(bad), 4), 5);
        assert_eq!(call1(m.get_finalized_function(good), 4), 4);
    }
}

/// A valid function is defined first; then its twin, alike but for a
/// defect in a block no branch reaches, must be rejected as plain Cranelift
/// rejects it, although the cache, a code template or an adapter would
/// let it through uncompiled.
#[test]
fn a_defect_in_an_unreachable_block_is_found_after_a_valid_twin() {
    // Exact twins (trampoline or alias), template twins (reused code: other
    // callees) and calling-convention twins (adapter).
    #[derive(Debug, Clone, Copy)]
    enum Twin {
        Exact,
        Template,
        Adapter,
    }
    for twin in [Twin::Exact, Twin::Template, Twin::Adapter] {
        let mut plain = jit();
        let conv = plain.isa().default_call_conv();
        let id = declare(&mut plain, "bad", conv);
        let plain_result = define(&mut plain, id, |b, _, p| {
            let v = chain(b, p[0]);
            return_with_dead_defect(b, v);
        });
        assert!(is_verifier_error(&plain_result), "{plain_result:?}");

        for options in DedupOptions::ALL {
            let mut m = dedup(options);
            let conv = m.isa().default_call_conv();
            let bad_conv = match twin {
                Twin::Adapter => CallConv::Tail,
                Twin::Exact | Twin::Template => conv,
            };
            let h1 = declare(&mut m, "h1", conv);
            let h2 = declare(&mut m, "h2", conv);
            let good = declare(&mut m, "good", conv);
            let bad = declare(&mut m, "bad", bad_conv);
            for (h, k) in [(h1, 1), (h2, 2)] {
                define_flushed(&mut m, h, |b, _, p| {
                    let r = b.ins().iadd_imm_s(p[0], k);
                    b.ins().return_(&[r]);
                })
                .unwrap();
            }
            define_flushed(&mut m, good, |b, m, p| {
                let v = emit_call(b, m, h1, p[0]);
                let v = chain(b, v);
                b.ins().return_(&[v]);
            })
            .unwrap();
            let bad_callee = match twin {
                Twin::Template => h2,
                Twin::Exact | Twin::Adapter => h1,
            };
            let result = define_flushed(&mut m, bad, |b, m, p| {
                let v = emit_call(b, m, bad_callee, p[0]);
                let v = chain(b, v);
                return_with_dead_defect(b, v);
            });
            assert!(
                is_verifier_error(&result),
                "{twin:?} {options:?}: {result:?}"
            );
            // Batch mode keeps the failure until it is given up.
            let failed: Vec<FuncId> = m
                .take_failed_definitions()
                .into_iter()
                .map(|f| f.0)
                .collect();
            let expected_failed = match options.mode {
                Mode::Batch => vec![bad],
                Mode::Eager => vec![],
            };
            assert_eq!(failed, expected_failed);
            m.finalize_definitions().unwrap();
            let expected = call1(m.get_finalized_function(good), 0);
            assert_ne!(expected, 0);
        }
    }
}

/// A duplicate the verifier accepted spares the verifier to later
/// functions exactly like it (source locations aside), and to nothing else:
/// a twin with the same key but a defect in an unreachable block is still
/// rejected after it, as plain Cranelift rejects it.
#[test]
fn only_a_function_exactly_like_an_accepted_one_skips_the_verifier() {
    for options in DedupOptions::ALL {
        let mut m = dedup(options);
        let conv = m.isa().default_call_conv();
        let ids =
            ["compiled", "verified", "bad", "same", "located"].map(|n| declare(&mut m, n, conv));
        let [compiled, verified, bad, same, located] = ids;
        for id in [compiled, verified] {
            define_flushed(&mut m, id, |b, _, p| {
                let v = chain(b, p[0]);
                b.ins().return_(&[v]);
            })
            .unwrap();
        }
        let result = define_flushed(&mut m, bad, |b, _, p| {
            let v = chain(b, p[0]);
            return_with_dead_defect(b, v);
        });
        assert!(is_verifier_error(&result), "{options:?}: {result:?}");
        m.take_failed_definitions();
        define_flushed(&mut m, same, |b, _, p| {
            let v = chain(b, p[0]);
            b.ins().return_(&[v]);
        })
        .unwrap();
        define_flushed(&mut m, located, |b, _, p| {
            b.set_srcloc(ir::SourceLoc::new(7));
            let v = chain(b, p[0]);
            b.ins().return_(&[v]);
        })
        .unwrap();
        let stats = m.stats().clone();
        assert_eq!(stats.verified_by_equality, 2, "{options:?}: {stats}");
        m.finalize_definitions().unwrap();
        for id in [compiled, verified, same, located] {
            assert_eq!(
                call1(m.get_finalized_function(id), 1),
                call1(m.get_finalized_function(compiled), 1)
            );
        }
    }
}

/// A function defined from a store entry skips the verifier only when it
/// reads exactly like the function whose compile made the entry: a twin
/// with the same template (so the same entry, which passes every check)
/// but a defect in an unreachable block is still rejected, as plain
/// Cranelift rejects it, and the function itself is not verified again.
#[test]
fn a_store_entry_spares_the_verifier_only_to_the_function_it_was_compiled_from() {
    // (On two threads, a batch checks what it fetched ahead of each turn.)
    let threads = DedupOptions::batch().with_threads(2);
    for options in DedupOptions::ALL.into_iter().chain([threads]) {
        let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
        let module = || {
            DedupModule::with_options(JITBuilder::new(default_libcall_names()).unwrap(), options)
                .with_store(store.clone(), None)
        };
        let good = |b: &mut FunctionBuilder, _: &mut DedupModule<JITModule>, p: &[ir::Value]| {
            let v = chain(b, p[0]);
            b.ins().return_(&[v]);
        };
        let mut cold = module();
        let conv = cold.isa().default_call_conv();
        let f = declare(&mut cold, "f", conv);
        define_flushed(&mut cold, f, good).unwrap();
        cold.wait_for_store_writes();
        assert_eq!(cold.stats().store_writes, 1, "{options:?}");
        cold.finalize_definitions().unwrap();
        let expected = call1(cold.get_finalized_function(f), 3);

        let mut twin = module();
        let bad = declare(&mut twin, "bad", conv);
        let result = define_flushed(&mut twin, bad, |b, _, p| {
            let v = chain(b, p[0]);
            return_with_dead_defect(b, v);
        });
        assert!(is_verifier_error(&result), "{options:?}: {result:?}");
        let stats = twin.stats();
        // The entry was found and passed its checks: the verifier decided.
        assert_eq!(
            (stats.store_misses, stats.store_rejected, stats.loaded),
            (0, 0, 0),
            "{options:?}: {stats}"
        );
        assert_eq!(stats.verified_by_equality, 0, "{options:?}: {stats}");

        let mut warm = module();
        let g = declare(&mut warm, "g", conv);
        define_flushed(&mut warm, g, good).unwrap();
        let stats = warm.stats().clone();
        assert_eq!(
            (stats.loaded, stats.verified_by_equality),
            (1, 1),
            "{options:?}: {stats}"
        );
        warm.finalize_definitions().unwrap();
        assert_eq!(call1(warm.get_finalized_function(g), 3), expected);
    }
    // An inner module jitfold does not know may compile other than what it
    // is given (here: another `DedupModule`): its entries hold no digest,
    // and a function loaded from them is verified.
    let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
    let nested = || {
        DedupModule::wrap(dedup(DedupOptions::default()), DedupOptions::default())
            .with_store(store.clone(), None)
    };
    let mut loaded = 0;
    for run in 0..2 {
        let mut m = nested();
        let conv = m.isa().default_call_conv();
        let f = declare(&mut m, "f", conv);
        define(&mut m, f, |b, _, p| {
            let v = chain(b, p[0]);
            b.ins().return_(&[v]);
        })
        .unwrap();
        m.flush().unwrap();
        let stats = m.stats();
        assert_eq!(stats.verified_by_equality, 0, "run {run}: {stats}");
        loaded += stats.loaded;
    }
    // (Such a module may write frame descriptions: entries serve it only
    // with the unwind information the `store-unwind` feature keeps.)
    assert_eq!(loaded, u64::from(cfg!(feature = "store-unwind")));
}

/// A batch on two threads, which checks what it loads ahead of each
/// function's turn, counts what it verifies as one thread does: a function
/// loaded from an entry compiled from one read otherwise (other value
/// numbers, so the entry's digest is not its own), whose twin planning
/// verified with it first, passes by equality in either.
#[test]
fn threads_count_verification_skips_as_one_thread_does() {
    let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
    let module = |options: DedupOptions| {
        DedupModule::with_options(JITBuilder::new(default_libcall_names()).unwrap(), options)
            .with_store(store.clone(), None)
    };
    let body = |renumbered: bool| {
        move |b: &mut FunctionBuilder, _: &mut DedupModule<JITModule>, p: &[ir::Value]| {
            if renumbered {
                let dead = b.ins().iconst(I64, 1234);
                let inst = b.func.dfg.value_def(dead).unwrap_inst();
                b.func.layout.remove_inst(inst);
            }
            let v = chain(b, p[0]);
            b.ins().return_(&[v]);
        }
    };
    let mut cold = module(DedupOptions::eager());
    let conv = cold.isa().default_call_conv();
    let f = declare(&mut cold, "f", conv);
    define_flushed(&mut cold, f, body(false)).unwrap();
    // Its entry is written behind the flush.
    cold.wait_for_store_writes();
    let mut counts = Vec::new();
    for threads in [1, 2] {
        let mut m = module(DedupOptions::batch().with_threads(threads));
        let ids = ["f", "g"].map(|name| declare(&mut m, name, conv));
        for id in ids {
            define(&mut m, id, body(true)).unwrap();
        }
        m.flush().unwrap();
        let stats = m.stats();
        assert_eq!(
            (stats.loaded, stats.trampolined),
            (1, 1),
            "{threads}: {stats}"
        );
        counts.push(stats.verified_by_equality);
        m.finalize_definitions().unwrap();
        assert_eq!(
            call1(m.get_finalized_function(ids[1]), 2),
            call1(m.get_finalized_function(ids[0]), 2)
        );
    }
    // Planning verifies `f` and finds `g` read alike; `f`'s load finds
    // it read alike to what was verified.
    assert_eq!(counts, [2, 2]);
}

fn batch_options() -> impl Iterator<Item = DedupOptions> {
    DedupOptions::ALL
        .into_iter()
        .filter(|o| o.mode == Mode::Batch)
}

fn add(k: i64) -> impl FnOnce(&mut FunctionBuilder, &mut DedupModule<JITModule>, &[ir::Value]) {
    move |b, _, p| {
        let r = b.ins().iadd_imm_s(p[0], k);
        b.ins().return_(&[r]);
    }
}

/// Defines each of `twins` (of the `tail` convention) as a function the
/// verifier accepts but Cranelift cannot compile on x86-64: a
/// `return_call` of `callee` without `preserve_frame_pointers` panics at
/// emission.
fn define_uncompilable(m: &mut DedupModule<JITModule>, callee: FuncId, twins: &[FuncId]) {
    for &f in twins {
        define(m, f, |b, m, p| {
            let v = chain(b, p[0]);
            let callee = m.declare_func_in_func(callee, b.func);
            b.ins().return_call(callee, &[v]);
        })
        .unwrap();
    }
}

#[test]
fn a_failed_flush_defines_the_valid_functions_and_reports_every_failure() {
    for options in batch_options() {
        let mut m = dedup(options);
        let conv = m.isa().default_call_conv();
        let [good, missing_block, mistyped, caller] =
            ["good", "missing_block", "mistyped", "caller"].map(|n| declare(&mut m, n, conv));
        define(&mut m, good, add(1)).unwrap();
        let mut ctx = m.make_context();
        ctx.func = jump_to_missing_block(&m);
        m.define_function(missing_block, &mut ctx).unwrap();
        define(&mut m, mistyped, |b, _, p| {
            let narrow = b.ins().iconst(I32, 1);
            let bad = b.ins().iadd(p[0], narrow);
            b.ins().return_(&[bad]);
        })
        .unwrap();
        define(&mut m, caller, |b, m, p| {
            let r = emit_call(b, m, good, p[0]);
            b.ins().return_(&[r]);
        })
        .unwrap();

        // Both failures are reported, each with its function's name.
        let error = m.finalize_definitions().unwrap_err().to_string();
        assert!(
            error.contains("missing_block: ") && error.contains("mistyped: "),
            "{error}"
        );
        let failed: Vec<FuncId> = m.failed_definitions().iter().map(|f| f.0).collect();
        assert_eq!(failed, [missing_block, mistyped], "{options:?}");
        // The valid ones are defined.
        assert_eq!(m.canonical(good), Some(good));
        assert!(m.canonical(caller).is_some());
        assert_eq!(m.canonical(missing_block), None);
        // Finalizing again fails as long as one failed id stays undefined.
        let again = m.finalize_definitions().unwrap_err().to_string();
        assert!(
            again.contains("missing_block: ") && again.contains("mistyped: "),
            "{again}"
        );
        define(&mut m, missing_block, add(2)).unwrap();
        let still = m.finalize_definitions().unwrap_err().to_string();
        assert!(
            !still.contains("missing_block: ") && still.contains("mistyped: "),
            "{still}"
        );
        define(&mut m, mistyped, add(3)).unwrap();
        m.finalize_definitions().unwrap();
        assert!(m.failed_definitions().is_empty());
        let run = |id| call1(m.get_finalized_function(id), 10);
        assert_eq!(
            [good, missing_block, mistyped, caller].map(run),
            [11, 12, 13, 11]
        );
    }
}

/// In one flush, `f0` (defect in a block no branch reaches) and its valid
/// twin `f1`, and callers `c0` of `f0` and `c1` of `f1`: `f1` and `c1` are
/// defined, and `c1` calls `f1`, not `f0`, whatever `f0` is defined as
/// later. Either twin may come first.
#[test]
fn a_failed_twin_takes_nothing_down_with_it() {
    for options in batch_options() {
        for bad_first in [true, false] {
            let mut m = dedup(options);
            let conv = m.isa().default_call_conv();
            let [f0, f1, c0, c1] = ["f0", "f1", "c0", "c1"].map(|n| declare(&mut m, n, conv));
            let twins = if bad_first { [f0, f1] } else { [f1, f0] };
            for f in twins {
                define(&mut m, f, |b, _, p| {
                    let v = chain(b, p[0]);
                    if f == f0 {
                        return_with_dead_defect(b, v);
                    } else {
                        b.ins().return_(&[v]);
                    }
                })
                .unwrap();
            }
            for (c, f) in [(c0, f0), (c1, f1)] {
                define(&mut m, c, |b, m, p| {
                    let r = emit_call(b, m, f, p[0]);
                    let r = b.ins().iadd_imm_s(r, 5);
                    b.ins().return_(&[r]);
                })
                .unwrap();
            }
            let error = m.flush();
            assert!(is_verifier_error(&error), "{options:?}: {error:?}");
            // `f0` is now something else entirely.
            define(&mut m, f0, add(100)).unwrap();
            m.finalize_definitions().unwrap();
            let run = |id| call1(m.get_finalized_function(id), 1);
            let f1_of_1 = run(f1);
            assert_eq!(run(f0), 101);
            assert_eq!(run(c0), 106, "{options:?}, bad first: {bad_first}");
            assert_eq!(run(c1), f1_of_1 + 5, "{options:?}, bad first: {bad_first}");
        }
    }
}

/// A twin found only by an exact round after refinement, whose first
/// fails to verify: `g1` compiled by one flush; in the next, `g2` (its
/// duplicate), `c_bad` calling `g1` with a defect in a block no branch
/// reaches, then `c_good` calling `g2`, equal to `c_bad` only once its
/// call of `g2` is rewritten to `g1` (a second exact round). `c_bad`,
/// counted on as the first of the pair, fails; `c_good` is defined on its
/// own and calls `g1`'s code; the flush reports `c_bad` alone.
#[test]
fn a_first_failing_in_an_exact_round_leaves_its_twin_defined() {
    for options in batch_options() {
        let mut m = dedup(options);
        let conv = m.isa().default_call_conv();
        let [g1, g2, c_bad, c_good] =
            ["g1", "g2", "c_bad", "c_good"].map(|n| declare(&mut m, n, conv));
        let twin = |b: &mut FunctionBuilder, _: &mut DedupModule<JITModule>, p: &[ir::Value]| {
            let v = chain(b, p[0]);
            b.ins().return_(&[v]);
        };
        define(&mut m, g1, twin).unwrap();
        m.flush().unwrap();
        define(&mut m, g2, twin).unwrap();
        for (c, g) in [(c_bad, g1), (c_good, g2)] {
            define(&mut m, c, |b, m, p| {
                let r = emit_call(b, m, g, p[0]);
                let r = b.ins().iadd_imm_s(r, 5);
                if c == c_bad {
                    return_with_dead_defect(b, r);
                } else {
                    b.ins().return_(&[r]);
                }
            })
            .unwrap();
        }
        let error = m.flush();
        assert!(is_verifier_error(&error), "{options:?}: {error:?}");
        let failed: Vec<FuncId> = m.failed_definitions().iter().map(|f| f.0).collect();
        assert_eq!(failed, [c_bad], "{options:?}");
        define(&mut m, c_bad, add(100)).unwrap();
        m.finalize_definitions().unwrap();
        let run = |id| call1(m.get_finalized_function(id), 1);
        let g_of_1 = run(g1);
        assert_eq!(run(g2), g_of_1, "{options:?}");
        assert_eq!(run(c_good), g_of_1 + 5, "{options:?}");
        assert_eq!(run(c_bad), 101, "{options:?}");
    }
}

/// A function the verifier accepts but Cranelift cannot compile (on
/// x86-64, a `return_call` without `preserve_frame_pointers` panics at
/// emission) and its twin in the same flush: the twin, planned as a
/// duplicate of the first, is compiled on its own once the first fails, and
/// its failure is reported too (it is not left undefined without a word).
#[test]
fn the_twin_of_a_function_that_fails_to_compile_reports_its_own_failure() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    for options in batch_options() {
        let mut m = dedup(options);
        let callee = declare(&mut m, "callee", CallConv::Tail);
        let twins = ["f0", "f1"].map(|n| declare(&mut m, n, CallConv::Tail));
        define(&mut m, callee, add(1)).unwrap();
        define_uncompilable(&mut m, callee, &twins);
        let error = m.flush().unwrap_err().to_string();
        let failed: Vec<FuncId> = m.failed_definitions().iter().map(|f| f.0).collect();
        assert_eq!(failed, twins, "{options:?}: {error}");
    }
}

/// A call of a planned duplicate becomes a call of the function it
/// duplicates only once that function is defined. Here the twins `f0` and
/// `f1` fail to compile (as above): `c`, which calls `f1`, still calls
/// `f1`; `b`, which calls `f1` and was planned as a duplicate of `a`
/// (which calls `f0`), is not one; `x`, which calls `f1` and has a twin
/// `x2`, is not compiled calling `f0` even when it is defined before the
/// twins; and `g`, which calls `b` and has a twin `gx`, does not call `a`.
/// So when the twins are defined again, differently, every caller runs
/// the body it names.
#[test]
fn calls_of_a_twin_whose_original_fails_to_compile_stay_its_own() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    for options in batch_options() {
        for callers_first in [false, true] {
            let mut m = dedup(options);
            let conv = m.isa().default_call_conv();
            let callee = declare(&mut m, "callee", CallConv::Tail);
            let [f0, f1] = ["f0", "f1"].map(|n| declare(&mut m, n, CallConv::Tail));
            let [a, b, c, d, x, x2, g, gx] =
                ["a", "b", "c", "d", "x", "x2", "g", "gx"].map(|n| declare(&mut m, n, conv));
            define(&mut m, callee, add(1)).unwrap();
            if !callers_first {
                define_uncompilable(&mut m, callee, &[f0, f1]);
            }
            callers_of_twins(&mut m, [a, b, c, d, x, x2, g, gx], [f0, f1]);
            if callers_first {
                define_uncompilable(&mut m, callee, &[f0, f1]);
            }
            let error = m.flush().unwrap_err().to_string();
            let failed: Vec<FuncId> = m.failed_definitions().iter().map(|f| f.0).collect();
            assert_eq!(failed, [f0, f1], "{options:?}: {error}");
            define(&mut m, f0, add(100)).unwrap();
            define(&mut m, f1, add(200)).unwrap();
            m.finalize_definitions().unwrap();
            let run = |id| call1(m.get_finalized_function(id), 1);
            assert_eq!(
                [f0, f1, a, b, c, d, x, x2, g, gx].map(run),
                [101, 201, 108, 208, 206, 217, 204, 204, 219, 219],
                "{options:?}, callers first: {callers_first}"
            );
        }
    }
}

/// Defines the callers of the twins `f0` and `f1` the two tests below
/// share: `x`, `x2` (`f1 + 3`), `a` (`f0 + 7`), `b` (`f1 + 7`, so `a`'s
/// twin over the call graph), `c` (`f1 + 5`), and `d` (`b + 9`), `g` and
/// `gx` (`b + 11`).
fn callers_of_twins<M: Module>(m: &mut M, callers: [FuncId; 8], [f0, f1]: [FuncId; 2]) {
    let [a, b, c, d, x, x2, g, gx] = callers;
    let calls = [(x, f1, 3), (x2, f1, 3), (a, f0, 7), (b, f1, 7), (c, f1, 5)];
    for (caller, f, k) in calls
        .into_iter()
        .chain([(d, b, 9), (g, b, 11), (gx, b, 11)])
    {
        define(m, caller, |fb, m, p| {
            let r = emit_call(fb, m, f, p[0]);
            let r = fb.ins().iadd_imm_s(r, k);
            fb.ins().return_(&[r]);
        })
        .unwrap();
    }
}

/// As above on every host, with an inner module that fails (with an error,
/// or a panic) to compile the root `f0` of the twins `f0` and `f1`: the
/// plan is undone, `f1` is compiled alone, every caller that planning
/// pointed at `f0` is put back, and once `f0` is defined again,
/// differently, every caller runs the body it names.
#[test]
fn a_root_the_inner_module_fails_to_compile_undoes_the_plan() {
    use crate::common::failing::{FailingJit, Failure};
    for options in batch_options() {
        for failure in [Failure::Error, Failure::Panic] {
            for callers_first in [false, true] {
                let context = format!("{options:?}, {failure:?}, callers first: {callers_first}");
                let inner = FailingJit::new(failure);
                let failing = inner.failing.clone();
                let mut m = DedupModule::wrap(inner, options);
                let conv = m.isa().default_call_conv();
                let [f0, f1, a, b, c, d, x, x2, g, gx] =
                    ["f0", "f1", "a", "b", "c", "d", "x", "x2", "g", "gx"]
                        .map(|n| declare(&mut m, n, conv));
                failing.set(f0, true);
                let twins = |m: &mut DedupModule<FailingJit>| {
                    for f in [f0, f1] {
                        define(m, f, |b, _, p| {
                            let r = b.ins().iadd_imm_s(p[0], 7);
                            b.ins().return_(&[r]);
                        })
                        .unwrap();
                    }
                };
                if !callers_first {
                    twins(&mut m);
                }
                callers_of_twins(&mut m, [a, b, c, d, x, x2, g, gx], [f0, f1]);
                if callers_first {
                    twins(&mut m);
                }
                let error = m.flush().unwrap_err().to_string();
                let failed: Vec<FuncId> = m.failed_definitions().iter().map(|f| f.0).collect();
                assert_eq!(failed, [f0], "{context}: {error}");
                failing.set(f0, false);
                define(&mut m, f0, |b, _, p| {
                    let r = b.ins().iadd_imm_s(p[0], 100);
                    b.ins().return_(&[r]);
                })
                .unwrap();
                m.flush().unwrap();
                let mut jit = m.into_inner().jit;
                jit.finalize_definitions().unwrap();
                let run = |id| call1(jit.get_finalized_function(id), 1);
                assert_eq!(
                    [f0, f1, a, b, c, d, x, x2, g, gx].map(run),
                    [101, 8, 108, 15, 13, 24, 11, 11, 26, 26],
                    "{context}"
                );
            }
        }
    }
}

/// As above, with similar-function merging: `r1` (twin `r1x`) and `m`
/// call the failing twin `d2` of `r2` after different constants, so they
/// are similar, but a merged body would be defined calling `r2` before
/// `r2` fails: they are not merged, and once the twins are defined again,
/// differently, `r1`, `r1x` and `m` call `d2`.
#[test]
fn similar_callers_of_a_twin_whose_original_fails_stay_its_own() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let options = DedupOptions::batch().with_similar(jitfold::similar::SimilarOptions::default());
    let mut m = dedup(options);
    let conv = m.isa().default_call_conv();
    let callee = declare(&mut m, "callee", CallConv::Tail);
    let [r2, d2] = ["r2", "d2"].map(|n| declare(&mut m, n, CallConv::Tail));
    let [r1, r1x, mid, steps] = ["r1", "r1x", "m", "steps"].map(|n| declare(&mut m, n, conv));
    define(&mut m, callee, add(1)).unwrap();
    define(&mut m, steps, |b, _, p| {
        let v = chain(b, p[0]);
        b.ins().return_(&[v]);
    })
    .unwrap();
    for (caller, k) in [(r1, 3), (r1x, 3), (mid, 4)] {
        define(&mut m, caller, |fb, m, p| {
            let v = chain(fb, p[0]);
            let v = fb.ins().iadd_imm_s(v, k);
            let r = emit_call(fb, m, d2, v);
            fb.ins().return_(&[r]);
        })
        .unwrap();
    }
    define_uncompilable(&mut m, callee, &[r2, d2]);
    let error = m.flush().unwrap_err().to_string();
    let failed: Vec<FuncId> = m.failed_definitions().iter().map(|f| f.0).collect();
    assert_eq!(failed, [r2, d2], "{error}");
    define(&mut m, r2, add(100)).unwrap();
    define(&mut m, d2, add(200)).unwrap();
    m.finalize_definitions().unwrap();
    let run = |id| call1(m.get_finalized_function(id), 1);
    let s = run(steps);
    assert_eq!([r1, r1x, mid].map(run), [s + 203, s + 203, s + 204]);
}

/// Cranelift computes an ABI for every declared signature and a concrete
/// type for every dynamic type, used or not (`SigSet::new` and
/// `Callee::new` in `machinst/abi.rs`), so one it cannot handle fails the
/// compile even when nothing uses it, while the verifier accepts it. A
/// function with such an unused declaration is therefore not the twin of
/// the same function without it: it fails as it does in plain
/// `JITModule`, also when its would-be twin was compiled first.
#[test]
fn an_unused_declaration_cranelift_cannot_compile_is_not_ignored() {
    let body = "v1 = iconst.i64 7
                v2 = iadd v0, v1
                return v2";
    for declaration in [
        // More integer returns than any target returns in registers.
        "sig0 = () -> i64, i64, i64, i64, i64, i64, i64, i64, i64 system_v",
        // A base type too wide for a dynamic vector.
        "gv0 = dyn_scale_target_const.i64x8
         dt0 = i64x8*gv0",
    ] {
        only_the_twin_compiles(declaration, body, &[]);
    }
}

/// The mid-end adds a constant for a `splat` of a constant, at the handle
/// numbered as the pool's length, and asserts that the handle is new: a
/// pool with a gap in its handles (`const1` without `const0`, as the CLIF
/// parser takes it) fails, the same pool without the gap does not.
#[test]
fn a_constant_pool_with_a_gap_is_not_the_twin_of_one_without() {
    let body = "v1 = iconst.i32 7
                v2 = splat.i32x4 v1
                v3 = extractlane v2, 1
                v4 = uextend.i64 v3
                v5 = iadd v0, v4
                return v5";
    only_the_twin_compiles(
        "const1 = 0x00000000000000000000000000000001",
        body,
        &[("opt_level", "speed")],
    );
}

/// `%f(i64) -> i64` with `body` compiles with `flags`, and with
/// `declaration` added it does not (see [`only_the_first_compiles`]).
fn only_the_twin_compiles(declaration: &str, body: &str, flags: &[(&str, &str)]) {
    let text = |declaration: &str| {
        format!(
            "function %f(i64) -> i64 system_v {{
                 {declaration}
             block0(v0: i64):
                 {body}
             }}"
        )
    };
    only_the_first_compiles(&text(""), &text(declaration), flags);
}

/// The `(i64) -> i64` function `twin` compiles with `flags` and `with`
/// does not, both in plain `JITModule` (where it may panic) and in
/// `DedupModule`, eager and batch, with the twin first.
fn only_the_first_compiles(twin: &str, with: &str, flags: &[(&str, &str)]) {
    let parse = |text: &str| crate::common::parse_valid(text).remove(0);
    compiles_as_in_cranelift(&parse(twin), &parse(with), flags, with, false);
}

/// [`only_the_first_compiles`] of functions (`what` names `with` in
/// failure messages), or, with `with_compiles`, both compile (where `with`
/// is the twin's duplicate in `DedupModule`).
fn compiles_as_in_cranelift(
    twin: &Function,
    with: &Function,
    flags: &[(&str, &str)],
    what: &str,
    with_compiles: bool,
) {
    let jit = || JITModule::new(JITBuilder::with_flags(flags, default_libcall_names()).unwrap());
    let mut plain = jit();
    let ids = ["f", "g"].map(|n| declare(&mut plain, n, CallConv::SystemV));
    for (id, func, compiles) in [(ids[0], twin, true), (ids[1], with, with_compiles)] {
        let mut ctx = plain.make_context();
        ctx.func = func.clone();
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        // (Cranelift may panic; jitfold reports it.)
        let result = jitfold::compile::with_quiet_panics(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                plain.define_function(id, &mut ctx)
            }))
        });
        let compiled = matches!(result, Ok(Ok(())));
        assert_eq!(compiled, compiles, "plain, {what}");
    }
    for options in [DedupOptions::eager(), DedupOptions::batch()] {
        let mut m = DedupModule::wrap(jit(), options);
        let ids = ["f", "g"].map(|n| declare(&mut m, n, CallConv::SystemV));
        for (id, func) in [(ids[0], twin), (ids[1], with)] {
            let mut ctx = m.make_context();
            ctx.func = func.clone();
            ctx.func.name = UserFuncName::user(0, id.as_u32());
            let result = m.define_function(id, &mut ctx);
            if options.mode == Mode::Eager {
                let compiles = id == ids[0] || with_compiles;
                assert_eq!(result.is_ok(), compiles, "{options}, {what}");
            }
        }
        if options.mode == Mode::Batch {
            let flushed = m.flush();
            let failed: Vec<FuncId> = m.failed_definitions().iter().map(|f| f.0).collect();
            let expected: &[FuncId] = if with_compiles { &[] } else { &ids[1..] };
            assert_eq!(failed, expected, "{options}, {what}");
            assert_eq!(flushed.is_ok(), with_compiles, "{options}, {what}");
        }
        if with_compiles {
            assert_eq!(m.stats().compiled, 1, "{options}, {what}: merged");
        }
    }
}

/// With NaN canonicalization on, Cranelift rewrites every block in the
/// layout before it removes unreachable code, and panics on float
/// arithmetic of a type it cannot canonicalize: an unreachable `fadd` of
/// `f32x8`, which the key never sees, fails the compile.
#[test]
fn nan_canonicalization_fails_on_an_unreachable_block_as_it_does_in_cranelift() {
    let text = |unreachable: &str| {
        format!(
            "function %f(i64) -> i64 system_v {{
             block0(v0: i64):
                 v1 = iconst.i64 7
                 v2 = iadd v0, v1
                 return v2
             {unreachable}
             }}"
        )
    };
    only_the_first_compiles(
        &text(""),
        &text(
            "block1(v3: f32x8, v4: f32x8):
                 v5 = fadd v3, v4
                 trap user1",
        ),
        &[("enable_nan_canonicalization", "true")],
    );
}

/// Cranelift resolves the value aliases of every value and of every
/// instruction the function holds, in its layout or not, before it
/// optimizes (`DataFlowGraph::resolve_all_aliases`), and panics on an
/// alias loop or on an argument that is not a value. The verifier looks
/// only at the layout, and the key only at reachable code, so such a
/// defect outside them fails the compile of a function whose twin
/// compiles.
#[test]
fn an_alias_defect_outside_the_layout_fails_as_it_does_in_cranelift() {
    let twin = plus(7);
    compiles_as_in_cranelift(&twin, &with_alias_loop(&twin), &[], "an alias loop", false);

    let mut missing_argument = twin.clone();
    missing_argument.dfg.make_inst(ir::InstructionData::Unary {
        opcode: ir::Opcode::Ineg,
        arg: ir::Value::from_u32(1000),
    });
    compiles_as_in_cranelift(&twin, &missing_argument, &[], "a missing argument", false);

    let mut labelled = twin.clone();
    labelled.dfg.collect_debug_info();
    let mut missing_label = labelled.clone();
    let label = ir::ValueLabelAssignments::Starts(Vec::new());
    let labels = missing_label.dfg.values_labels.as_mut().unwrap();
    labels.insert(ir::Value::from_u32(1000), label);
    compiles_as_in_cranelift(&labelled, &missing_label, &[], "a missing label", false);

    // Where the pass does not look, nothing fails: the entries past the
    // default of a jump table no reachable block ends with (cleared
    // first), and the target of a label on an alias (dropped first).
    let mut cleared_table = twin.clone();
    let dfg = &mut cleared_table.dfg;
    let entry = ir::Block::from_u32(0);
    let default = ir::BlockCall::new(entry, [], &mut dfg.value_lists);
    let missing = [ir::BlockArg::Value(ir::Value::from_u32(1000))];
    let dangling = ir::BlockCall::new(entry, missing, &mut dfg.value_lists);
    let table = dfg
        .jump_tables
        .push(ir::JumpTableData::new(default, &[dangling]));
    dfg.make_inst(ir::InstructionData::BranchTable {
        opcode: ir::Opcode::BrTable,
        arg: ir::Value::from_u32(0),
        table,
    });
    compiles_as_in_cranelift(&twin, &cleared_table, &[], "a cleared table", true);

    let mut alias_label = labelled.clone();
    let (a, b) = (dead_value(&mut alias_label), dead_value(&mut alias_label));
    alias_label.dfg.make_value_alias_for_serialization(a, b);
    let label = ir::ValueLabelAssignments::Alias {
        from: ir::RelSourceLoc::default(),
        value: ir::Value::from_u32(1000),
    };
    alias_label
        .dfg
        .values_labels
        .as_mut()
        .unwrap()
        .insert(b, label);
    compiles_as_in_cranelift(&labelled, &alias_label, &[], "a label on an alias", true);

    // Also on a block parameter that every branch passes the same value,
    // which `remove_constant_phis` turns into an alias first.
    let mut phi = crate::common::parse_valid(
        "function %f(i64) -> i64 system_v {
         block0(v0: i64):
             jump block1(v0)
         block1(v1: i64):
             return v1
         }",
    )
    .remove(0);
    phi.dfg.collect_debug_info();
    let mut phi_label = phi.clone();
    let label = ir::ValueLabelAssignments::Alias {
        from: ir::RelSourceLoc::default(),
        value: ir::Value::from_u32(1000),
    };
    let param = ir::Value::from_u32(1);
    phi_label
        .dfg
        .values_labels
        .as_mut()
        .unwrap()
        .insert(param, label);
    compiles_as_in_cranelift(&phi, &phi_label, &[], "a label on a constant phi", true);
}

/// `(i64) -> i64`: its argument plus `k`.
fn plus(k: i64) -> Function {
    crate::common::parse_valid(&format!(
        "function %f(i64) -> i64 system_v {{
         block0(v0: i64):
             v1 = iconst.i64 {k}
             v2 = iadd v0, v1
             return v2
         }}"
    ))
    .remove(0)
}

/// The result of a new instruction of `func` that is not in its layout.
fn dead_value(func: &mut Function) -> ir::Value {
    let inst = func.dfg.make_inst(ir::InstructionData::UnaryImm {
        opcode: ir::Opcode::Iconst,
        imm: 0.into(),
    });
    func.dfg.make_inst_results(inst, I64);
    func.dfg.first_result(inst)
}

/// `twin` with two results outside the layout aliased to each other, a
/// loop Cranelift's alias resolution panics on (the key never sees it).
fn with_alias_loop(twin: &Function) -> Function {
    let mut alias_loop = twin.clone();
    let (a, b) = (dead_value(&mut alias_loop), dead_value(&mut alias_loop));
    alias_loop.dfg.make_value_alias_for_serialization(a, b);
    alias_loop.dfg.make_value_alias_for_serialization(b, a);
    alias_loop
}

/// With the verifier off, as wasmtime ships, a function whose template's
/// store entry passes every check but which compiling panics on (an alias
/// loop outside the layout) gets the error compiling it gives, never the
/// entry's code: in eager mode, and in batch mode whether the entry is
/// checked in the function's turn or ahead of it on the flush's threads.
#[test]
fn an_alias_defect_is_found_before_a_store_entry_is_used() {
    let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
    let module = |options: DedupOptions| {
        let flags = [("enable_verifier", "false")];
        let jit = JITModule::new(JITBuilder::with_flags(&flags, default_libcall_names()).unwrap());
        DedupModule::wrap(jit, options).with_store(store.clone(), None)
    };
    let twin = plus(7);
    let define_as = |m: &mut DedupModule<JITModule>, func: &Function| {
        let id = declare(m, "f", CallConv::SystemV);
        let mut ctx = m.make_context();
        ctx.func = func.clone();
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        let defined = m.define_function(id, &mut ctx).and_then(|()| m.flush());
        (id, defined)
    };
    let mut cold = module(DedupOptions::eager());
    define_as(&mut cold, &twin).1.unwrap();
    cold.wait_for_store_writes();
    assert_eq!(cold.stats().store_writes, 1);
    for options in [
        DedupOptions::eager(),
        DedupOptions::batch(),
        DedupOptions::batch().with_threads(2),
    ] {
        // The twin itself loads its entry...
        let mut warm = module(options);
        let (id, defined) = define_as(&mut warm, &twin);
        defined.unwrap();
        assert_eq!(warm.stats().loaded, 1, "{options}: {}", warm.stats());
        warm.finalize_definitions().unwrap();
        assert_eq!(call1(warm.get_finalized_function(id), 1), 8);
        // ... and the function with the defect does not.
        let mut warm = module(options);
        let (id, defined) = define_as(&mut warm, &with_alias_loop(&twin));
        let error = defined.expect_err("compiling it panics");
        assert!(
            matches!(
                jitfold::DedupError::of(&error),
                Some(jitfold::DedupError::CraneliftPanic { .. })
            ),
            "{options}: {error}"
        );
        let stats = warm.stats();
        assert_eq!(
            (stats.loaded, stats.store_rejected),
            (0, 0),
            "{options}: {stats}"
        );
        if options.mode == Mode::Batch {
            let failed: Vec<FuncId> = warm.failed_definitions().iter().map(|f| f.0).collect();
            assert_eq!(failed, [id], "{options}");
        }
    }
}

/// The verifier itself panics on some malformed functions (building the
/// control-flow graph of a `br_table` whose table does not exist, here in
/// a block no branch reaches); plain Cranelift panics, and jitfold gives
/// the error instead of panicking too.
#[test]
fn a_verifier_panic_on_a_duplicate_is_an_error() {
    let twin = crate::common::parse_valid(
        "function %f(i64) -> i64 system_v {
         block0(v0: i64):
             return v0
         }",
    )
    .remove(0);
    let mut with = twin.clone();
    let unreachable = with.dfg.make_block();
    with.layout.append_block(unreachable);
    let mut pos = FuncCursor::new(&mut with).at_bottom(unreachable);
    let index = pos.ins().iconst(I32, 0);
    pos.ins().br_table(index, ir::JumpTable::from_u32(5));
    compiles_as_in_cranelift(&twin, &with, &[], "a missing jump table", false);
}

/// A function whose constant pool maps bytes to handles otherwise than its
/// handles say (`entries_mut` changed them) is the duplicate of nothing
/// (see `fingerprint::an_irregular_constant_pool_merges_with_nothing`):
/// defined twice, it is compiled twice, in every mode, and runs.
#[test]
fn a_stale_constant_pool_is_compiled_every_time() {
    let mut stale = plus(3);
    stale
        .dfg
        .constants
        .insert(ir::ConstantData::from(vec![1u8; 16]));
    for data in stale.dfg.constants.entries_mut() {
        *data = ir::ConstantData::from(vec![2u8; 16]);
    }
    for options in DedupOptions::ALL {
        let mut m = dedup(options);
        let ids = ["f", "g"].map(|n| declare(&mut m, n, CallConv::SystemV));
        for id in ids {
            let mut ctx = m.make_context();
            ctx.func = stale.clone();
            ctx.func.name = UserFuncName::user(0, id.as_u32());
            m.define_function(id, &mut ctx).unwrap();
        }
        m.finalize_definitions().unwrap();
        assert_eq!(m.stats().compiled, 2, "{options}");
        for id in ids {
            assert_eq!(call1(m.get_finalized_function(id), 4), 7, "{options}");
        }
    }
}

/// `block0` branches to two `br_table`s, each on a jump table whose one
/// entry passes `v0` to `block3`: two equal tables (`shared` false) or one
/// table both use.
fn two_branch_tables(shared: bool) -> Function {
    let mut func = Function::new();
    func.signature = sig(&jit(), CallConv::SystemV);
    let blocks = [(); 4].map(|()| func.dfg.make_block());
    for block in blocks {
        func.layout.append_block(block);
    }
    let v0 = func.dfg.append_block_param(blocks[0], I64);
    let param = func.dfg.append_block_param(blocks[3], I64);
    let mut table = || {
        let dfg = &mut func.dfg;
        let call = dfg.block_call(blocks[3], &[ir::BlockArg::Value(v0)]);
        dfg.jump_tables.push(ir::JumpTableData::new(call, &[]))
    };
    let first = table();
    let second = if shared { first } else { table() };
    let mut pos = FuncCursor::new(&mut func).at_bottom(blocks[0]);
    let index = pos.ins().ireduce(I32, v0);
    pos.ins().brif(index, blocks[1], &[], blocks[2], &[]);
    let mut pos = pos.at_bottom(blocks[1]);
    pos.ins().br_table(index, first);
    let mut pos = pos.at_bottom(blocks[2]);
    pos.ins().br_table(index, second);
    let mut pos = pos.at_bottom(blocks[3]);
    pos.ins().return_(&[param]);
    func
}

/// A jump table two `br_table`s share is not two equal tables: Cranelift
/// edits a table's entries in place once per branch when it removes a
/// block parameter every branch passes the same value
/// (`remove_constant_phis`), and asserts on a shared one.
#[test]
fn a_shared_jump_table_is_not_two_equal_ones() {
    let (separate, shared) = (two_branch_tables(false), two_branch_tables(true));
    assert_ne!(
        jitfold::Fingerprint::of(&separate),
        jitfold::Fingerprint::of(&shared)
    );
    compiles_as_in_cranelift(&separate, &shared, &[], "a shared jump table", false);
}

/// `block0` squares its parameter and returns that from two blocks, whose
/// `return`s have one operand list (`shared`: the second instruction a copy
/// of the first's `InstructionData`) or two equal ones.
fn two_returns(shared: bool) -> Function {
    let mut func = Function::new();
    func.signature = sig(&jit(), CallConv::SystemV);
    let blocks = [(); 3].map(|()| func.dfg.make_block());
    for block in blocks {
        func.layout.append_block(block);
    }
    let x = func.dfg.append_block_param(blocks[0], I64);
    let mut pos = FuncCursor::new(&mut func).at_bottom(blocks[0]);
    let sum = pos.ins().imul(x, x);
    pos.ins().brif(x, blocks[1], &[], blocks[2], &[]);
    let mut pos = pos.at_bottom(blocks[1]);
    let first = pos.ins().return_(&[sum]);
    let mut pos = pos.at_bottom(blocks[2]);
    if shared {
        let copy = pos.func.dfg.insts[first];
        let second = pos.func.dfg.make_inst(copy);
        pos.insert_inst(second);
    } else {
        pos.ins().return_(&[sum]);
    }
    func
}

/// An operand list two instructions share is rewritten for both when the
/// mid-end rewrites one's operands in place: such a function gets a key no
/// other function has, and is compiled, as plain Cranelift compiles it.
#[test]
fn an_operand_list_two_instructions_share_is_not_two_equal_ones() {
    let (separate, shared) = (two_returns(false), two_returns(true));
    assert_eq!(
        jitfold::Fingerprint::of(&separate),
        jitfold::Fingerprint::of(&separate)
    );
    assert_ne!(
        jitfold::Fingerprint::of(&shared),
        jitfold::Fingerprint::of(&shared)
    );
    let flags = [("opt_level", "speed")];
    compiles_as_in_cranelift(&separate, &shared, &flags, "a shared operand list", false);
}

/// `block0` switches on its parameter through a jump table whose default
/// and two entries are one branch destination to `block1`, which returns
/// the parameter squared: with `arguments`, the destination passes the
/// parameter to `block1`'s own; without, `block1` reads it from `block0`.
fn one_destination_thrice(arguments: bool) -> Function {
    let mut func = Function::new();
    func.signature = sig(&jit(), CallConv::SystemV);
    let blocks = [(); 2].map(|()| func.dfg.make_block());
    for block in blocks {
        func.layout.append_block(block);
    }
    let x = func.dfg.append_block_param(blocks[0], I64);
    let (call, squared) = if arguments {
        let y = func.dfg.append_block_param(blocks[1], I64);
        (func.dfg.block_call(blocks[1], &[ir::BlockArg::Value(x)]), y)
    } else {
        (func.dfg.block_call(blocks[1], &[]), x)
    };
    let table = func
        .dfg
        .jump_tables
        .push(ir::JumpTableData::new(call, &[call, call]));
    let mut pos = FuncCursor::new(&mut func).at_bottom(blocks[0]);
    let index = pos.ins().ireduce(I32, x);
    pos.ins().br_table(index, table);
    let mut pos = pos.at_bottom(blocks[1]);
    let r = pos.ins().imul(squared, squared);
    pos.ins().return_(&[r]);
    func
}

/// A branch destination without arguments that a jump table repeats (as
/// translators of dense switches make them) is rewritten by nothing: the
/// function merges with its copy. One with arguments makes the key unique.
#[test]
fn only_shared_lists_with_operands_make_a_key_unique() {
    let mut walker = jitfold::Fingerprinter::new();
    assert!(!walker.walk(&one_destination_thrice(false)).key_is_unique());
    assert!(walker.walk(&one_destination_thrice(true)).key_is_unique());
    assert!(walker.walk(&two_returns(true)).key_is_unique());
    assert!(!walker.walk(&two_returns(false)).key_is_unique());
    for options in DedupOptions::ALL {
        let mut m = dedup(options);
        let ids = ["f", "g"].map(|n| declare(&mut m, n, CallConv::SystemV));
        for id in ids {
            let mut ctx = m.make_context();
            ctx.func = one_destination_thrice(false);
            ctx.func.name = UserFuncName::user(0, id.as_u32());
            m.define_function(id, &mut ctx).unwrap();
        }
        m.finalize_definitions().unwrap();
        assert_eq!(m.stats().compiled, 1, "{options}");
        for id in ids {
            assert_eq!(call1(m.get_finalized_function(id), 5), 25, "{options}");
        }
    }
}
