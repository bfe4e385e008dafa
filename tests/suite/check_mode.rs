//! Check mode (`DedupOptions::check`): it lets real duplicates, reused code
//! and adapters through, and turns a wrong cache into an error naming both
//! functions instead of a false merge.

use crate::common::build::{built, call1, declare, define, emit_call};
use cranelift_codegen::ir::{self, InstBuilder};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitfold::module::Poison;
use jitfold::{DedupModule, DedupOptions, Mode};

use crate::common;

fn dedup(options: DedupOptions) -> DedupModule<JITModule> {
    let builder = JITBuilder::with_flags(&[], default_libcall_names()).unwrap();
    DedupModule::wrap(JITModule::new(builder), options)
}

/// `(x * k + 1) * k + 2 ...`: twenty steps, enough for an adapter.
fn chain(b: &mut FunctionBuilder, x: ir::Value, k: i64) -> ir::Value {
    let mut v = x;
    for i in 1..=10 {
        v = b.ins().imul_imm_s(v, k);
        v = b.ins().iadd_imm_s(v, i);
    }
    v
}

/// A body: `chain(callee(x), k)`, or `chain(x, k)` without a callee.
fn body(
    callee: Option<FuncId>,
    k: i64,
) -> impl FnOnce(&mut FunctionBuilder, &mut DedupModule<JITModule>, &[ir::Value]) {
    move |b, m, p| {
        let x = match callee {
            Some(callee) => emit_call(b, m, callee, p[0]),
            None => p[0],
        };
        let r = chain(b, x, k);
        b.ins().return_(&[r]);
    }
}

#[test]
fn check_mode_lets_real_duplicates_reuse_and_adapters_through() {
    for options in DedupOptions::ALL {
        let options = options.with_check(true);
        let mut m = dedup(options);
        let conv = m.isa().default_call_conv();
        let [h1, h2, f, twin, other_callee, r0, r1] =
            ["h1", "h2", "f", "twin", "other_callee", "r0", "r1"].map(|n| declare(&mut m, n, conv));
        let tail = declare(&mut m, "tail", CallConv::Tail);
        define(&mut m, h1, body(None, 3)).unwrap();
        define(&mut m, h2, body(None, 5)).unwrap();
        define(&mut m, f, body(Some(h1), 7)).unwrap();
        define(&mut m, twin, body(Some(h1), 7)).unwrap();
        define(&mut m, other_callee, body(Some(h2), 7)).unwrap();
        define(&mut m, tail, body(Some(h1), 7)).unwrap();
        // Recursive twins: each calls itself (its code names itself).
        for r in [r0, r1] {
            define(&mut m, r, |b, m, p| {
                let zero = b.ins().icmp_imm_s(ir::condcodes::IntCC::Equal, p[0], 0);
                let (done, again) = (b.create_block(), b.create_block());
                b.ins().brif(zero, done, &[], again, &[]);
                b.switch_to_block(again);
                let less = b.ins().iadd_imm_s(p[0], -1);
                let sum = emit_call(b, m, r, less);
                let sum = b.ins().iadd(sum, p[0]);
                b.ins().return_(&[sum]);
                b.switch_to_block(done);
                b.ins().return_(&[p[0]]);
            })
            .unwrap();
        }
        m.finalize_definitions().unwrap();
        let s = m.stats();
        assert!(s.aliased + s.trampolined >= 1, "{options:?}: {s:?}");
        assert_eq!(s.reused >= 1, options.reuse, "{options:?}: {s:?}");
        assert_eq!(s.adapted, 1, "{options:?}: {s:?}");
        if options.mode == Mode::Batch {
            assert_eq!(m.canonical(r1), Some(r0), "{options:?}");
        }
        let run = |id| call1(m.get_finalized_function(id), 3);
        assert_eq!(run(f), run(twin));
        assert_ne!(run(f), run(other_callee));
        assert_eq!([run(r0), run(r1)], [6, 6]);
    }
}

/// A cache made wrong on purpose (each table in turn) hands out the code of
/// another function: without check mode, a false merge; with it, an error
/// naming both functions, and nothing defined.
#[test]
fn check_mode_catches_a_wrong_cache() {
    let cases = [Poison::Exact, Poison::Template, Poison::Body]
        .into_iter()
        .flat_map(|p| [Mode::Eager, Mode::Batch].map(|mode| (p, mode)));
    for (poison, mode) in cases {
        for check in [false, true] {
            let options = DedupOptions::default().with_mode(mode).with_check(check);
            let mut m = dedup(options);
            let conv = m.isa().default_call_conv();
            let wrong_conv = match poison {
                Poison::Body => CallConv::Tail,
                Poison::Exact | Poison::Template => conv,
            };
            let h1 = declare(&mut m, "h1", conv);
            let h2 = declare(&mut m, "h2", conv);
            let right = declare(&mut m, "right", conv);
            let wrong = declare(&mut m, "wrong", wrong_conv);
            define(&mut m, h1, body(None, 3)).unwrap();
            define(&mut m, h2, body(None, 5)).unwrap();
            define(&mut m, right, body(Some(h1), 7)).unwrap();
            m.flush().unwrap();
            // Not `right`'s twin: another multiplier (and, for a template,
            // another callee).
            let callee = match poison {
                Poison::Template => h2,
                Poison::Exact | Poison::Body => h1,
            };
            let func = built(&mut m, wrong, body(Some(callee), 9));
            m.poison_cache_for_testing(&func, right, poison);
            let mut ctx = m.make_context();
            ctx.func = func;
            let result = m.define_function(wrong, &mut ctx).and_then(|()| m.flush());
            if check {
                let Err(e) = &result else {
                    panic!("{poison:?} {mode:?}: {result:?}");
                };
                assert!(
                    matches!(
                        jitfold::DedupError::of(e),
                        Some(jitfold::DedupError::CheckMismatch { function, other, .. })
                            if function == "wrong" && other == "right"
                    ),
                    "{poison:?} {mode:?}: {e:?}"
                );
                let e = e.to_string();
                assert!(
                    e.contains("wrong") && e.contains("right") && e.contains("differ"),
                    "{poison:?} {mode:?}: {e}"
                );
                assert_eq!(m.canonical(wrong), None);
            } else {
                // The poison took: `wrong` was not compiled.
                result.unwrap();
                assert_eq!(m.stats().compiled, 3, "{poison:?} {mode:?}");
            }
        }
    }
}

/// Twins whose blocks are laid out in other orders compile to other bytes
/// (register choice follows the layout), and the check still lets the
/// second through as a duplicate: it lays both out in one order before it
/// calls them different.
#[test]
fn check_mode_lets_twins_in_another_block_layout_through() {
    let func = common::layout_dependent();
    let other = common::reversed(&func);
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    let compile = |f: &ir::Function| jitfold::compile::compile(f, &*isa).unwrap().code;
    assert_ne!(
        compile(&func).bytes,
        compile(&other).bytes,
        "needs another function"
    );
    for mode in [Mode::Eager, Mode::Batch] {
        let builder = JITBuilder::with_isa(isa.clone(), default_libcall_names());
        let options = DedupOptions::default().with_mode(mode).with_check(true);
        let mut m = DedupModule::wrap(JITModule::new(builder), options);
        let ids: Vec<FuncId> = [&func, &other]
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let id = m
                    .declare_function(&format!("f{i}"), Linkage::Local, &f.signature)
                    .unwrap();
                let mut ctx = m.make_context();
                ctx.func = (*f).clone();
                m.define_function(id, &mut ctx).unwrap();
                id
            })
            .collect();
        m.finalize_definitions().unwrap();
        assert_eq!(m.canonical(ids[1]), Some(ids[0]), "{mode:?}");
    }
}
