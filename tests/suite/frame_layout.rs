//! Execution tests of what the fingerprint must tell apart or may merge
//! because of how Cranelift lays out a frame and reads declarations: the
//! functions of `tests/data/layout.clif` and callers of twins, run with
//! plain `JITModule` and through jitfold in every mode.

use crate::common::build::{call1, define, emit_call};
use cranelift_codegen::ir::{self, AbiParam, InstBuilder, types::I64};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitfold::{DedupModule, DedupOptions};

use crate::common;

fn jit() -> JITModule {
    let flags = [("opt_level", "speed"), ("preserve_frame_pointers", "true")];
    JITModule::new(JITBuilder::with_flags(&flags, default_libcall_names()).unwrap())
}

/// Functions of `layout.clif` that call nothing, with their names.
fn frame_functions() -> Vec<(String, ir::Function)> {
    let text = std::fs::read_to_string(common::data_dir().join("layout.clif")).unwrap();
    common::parse_valid(&text)
        .into_iter()
        .map(|f| (f.name.to_string(), f))
        .filter(|(name, _)| name.contains("slot"))
        .collect()
}

/// Defines every function of `funcs` in `m` in order, finalizes, and calls
/// each (they take nothing and return an i64).
fn run<M: Module>(
    m: &mut M,
    funcs: &[(String, ir::Function)],
    finalize: impl FnOnce(&mut M),
    address: impl Fn(&M, FuncId) -> *const u8,
) -> Vec<i64> {
    let mut ids = Vec::new();
    for (i, (_, func)) in funcs.iter().enumerate() {
        let id = m
            .declare_function(&format!("f{i}"), Linkage::Local, &func.signature)
            .unwrap();
        let mut ctx = m.make_context();
        ctx.func = func.clone();
        ctx.func.name = ir::UserFuncName::user(0, id.as_u32());
        m.define_function(id, &mut ctx).unwrap();
        ids.push(id);
    }
    finalize(m);
    ids.iter()
        .map(|&id| {
            // SAFETY: every function of `frame_functions` is `() -> i64` in
            // the host's default calling convention, and was finalized.
            let f: extern "C" fn() -> i64 = unsafe { std::mem::transmute(address(m, id)) };
            f()
        })
        .collect()
}

#[test]
fn frames_laid_out_differently_are_not_merged() {
    let funcs = frame_functions();
    assert_eq!(funcs.len(), 6);
    let mut plain = jit();
    let expected = run(
        &mut plain,
        &funcs,
        |m| m.finalize_definitions().unwrap(),
        |m, id| m.get_finalized_function(id),
    );
    // Each pair really behaves differently.
    assert_eq!(expected[0], -16, "{}", funcs[0].0);
    assert_eq!(expected[1], 16, "{}", funcs[1].0);
    assert_eq!(
        expected[3] - expected[2],
        16,
        "{} and {}",
        funcs[2].0,
        funcs[3].0
    );
    for options in DedupOptions::ALL {
        let mut m = DedupModule::wrap(jit(), options);
        let got = run(
            &mut m,
            &funcs,
            |m| m.finalize_definitions().unwrap(),
            |m, id| m.get_finalized_function(id),
        );
        assert_eq!(got, expected, "{options:?}");
        assert_eq!(m.stats().compiled, 6, "{options:?}");
    }
}

/// `g0` and `g1` are twins; `both` calls each once, `twice` calls `g0`
/// twice through one declaration. Once `g1` is known as `g0`'s duplicate,
/// `both` is rewritten to call `g0` through two declarations of it, which
/// is `twice`: it is not compiled again.
#[test]
fn a_caller_of_twins_merges_with_a_caller_of_the_canonical_function() {
    let mut m = DedupModule::wrap(jit(), DedupOptions::default());
    let mut sig = m.make_signature();
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I64));
    let declare = |m: &mut DedupModule<JITModule>, name: &str| {
        m.declare_function(name, Linkage::Local, &sig).unwrap()
    };
    let (g0, g1) = (declare(&mut m, "g0"), declare(&mut m, "g1"));
    let (twice, both) = (declare(&mut m, "twice"), declare(&mut m, "both"));
    for g in [g0, g1] {
        define(&mut m, g, |b, _, p| {
            let three = b.ins().iconst(I64, 3);
            let r = b.ins().imul(p[0], three);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    define(&mut m, twice, |b, m, p| {
        let g = m.declare_func_in_func(g0, b.func);
        let call = b.ins().call(g, &[p[0]]);
        let x = b.inst_results(call)[0];
        let call = b.ins().call(g, &[x]);
        let r = b.inst_results(call)[0];
        b.ins().return_(&[r]);
    })
    .unwrap();
    let compiled = m.stats().compiled;
    define(&mut m, both, |b, m, p| {
        let x = emit_call(b, m, g0, p[0]);
        let r = emit_call(b, m, g1, x);
        b.ins().return_(&[r]);
    })
    .unwrap();
    assert_eq!(m.stats().compiled, compiled, "`both` was compiled again");
    assert_eq!(m.canonical(both), Some(twice));
    m.finalize_definitions().unwrap();
    for f in [twice, both] {
        assert_eq!(call1(m.get_finalized_function(f), 5), 45);
    }
}
