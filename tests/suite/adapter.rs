//! ABI adapters: functions that differ from a compiled one only in their
//! calling convention call it instead of being compiled, in every mode,
//! and compute what plain `JITModule` computes.

use crate::common::build::define;
use cranelift_codegen::ir::{self, AbiParam, InstBuilder, Signature, types::I64};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitfold::{DedupModule, DedupOptions};

fn jit() -> JITModule {
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()))
}

fn sig(conv: CallConv) -> Signature {
    let mut s = Signature::new(conv);
    s.params.extend([AbiParam::new(I64), AbiParam::new(I64)]);
    s.returns.extend([AbiParam::new(I64), AbiParam::new(I64)]);
    s
}

/// Twenty-odd instructions of arithmetic on `x` and `y`, two results;
/// `k` changes one constant.
fn body(b: &mut FunctionBuilder, x: ir::Value, y: ir::Value, k: i64) -> [ir::Value; 2] {
    let mut a = x;
    let mut c = y;
    for i in 1..=6 {
        let t = b.ins().imul(a, c);
        let u = b.ins().iadd_imm_s(t, i * k);
        a = b.ins().bxor(u, x);
        c = b.ins().rotl_imm_s(c, i);
    }
    [a, c]
}

/// Functions: the body as `system_v` (compiled), as `tail` and `fast`
/// (adaptable), as `tail` with another constant (compiled), and `system_v`
/// entries calling the last three. Returns `sysv` and the entries.
fn program<M: Module>(m: &mut M) -> Vec<FuncId> {
    let mut ids = Vec::new();
    let body_fn = |m: &mut M, name: &str, conv: CallConv, k: i64| {
        let id = m
            .declare_function(name, Linkage::Local, &sig(conv))
            .unwrap();
        define(m, id, |b, _, p| {
            let r = body(b, p[0], p[1], k);
            b.ins().return_(&r);
        })
        .unwrap();
        id
    };
    let sysv = body_fn(m, "sysv", CallConv::SystemV, 3);
    let tail = body_fn(m, "tail", CallConv::Tail, 3);
    let fast = body_fn(m, "fast", CallConv::Fast, 3);
    let other = body_fn(m, "other", CallConv::Tail, 4);
    ids.push(sysv);
    for (name, callee, conv) in [
        ("enter_tail", tail, CallConv::Tail),
        ("enter_fast", fast, CallConv::Fast),
        ("enter_other", other, CallConv::Tail),
    ] {
        let id = m
            .declare_function(name, Linkage::Local, &sig(CallConv::SystemV))
            .unwrap();
        define(m, id, |b, m, p| {
            let callee_ref = m.declare_func_in_func(callee, b.func);
            let callee_sig = b.func.dfg.ext_funcs[callee_ref].signature;
            assert_eq!(b.func.dfg.signatures[callee_sig].call_conv, conv);
            let call = b.ins().call(callee_ref, &[p[0], p[1]]);
            let r = b.inst_results(call).to_vec();
            b.ins().return_(&r);
        })
        .unwrap();
        ids.push(id);
    }
    ids
}

fn call(ptr: *const u8, x: i64, y: i64) -> (i64, i64) {
    #[repr(C)]
    struct Pair(i64, i64);
    // SAFETY: every entry has the System V signature (i64, i64) -> (i64,
    // i64), returned in rax:rdx like a two-field C struct, and is finalized.
    let f: extern "C" fn(i64, i64) -> Pair = unsafe { std::mem::transmute(ptr) };
    let Pair(a, b) = f(x, y);
    (a, b)
}

const INPUTS: [(i64, i64); 4] = [(0, 0), (1, 2), (-7, 99), (i64::MIN, 12345)];

#[test]
fn calling_convention_twins_share_one_body() {
    let mut plain = jit();
    let ids = program(&mut plain);
    plain.finalize_definitions().unwrap();
    let expected: Vec<(i64, i64)> = ids
        .iter()
        .flat_map(|&id| INPUTS.map(|(x, y)| call(plain.get_finalized_function(id), x, y)))
        .collect();
    // The tail and fast twins compute what the system_v one does.
    assert_eq!(expected[4..8], expected[0..4]);
    assert_eq!(expected[8..12], expected[0..4]);
    assert_ne!(expected[12..16], expected[0..4]);
    for options in DedupOptions::ALL {
        let mut m = DedupModule::wrap(jit(), options);
        let ids = program(&mut m);
        m.finalize_definitions().unwrap();
        let got: Vec<(i64, i64)> = ids
            .iter()
            .flat_map(|&id| INPUTS.map(|(x, y)| call(m.get_finalized_function(id), x, y)))
            .collect();
        assert_eq!(got, expected, "{options:?}");
        let s = m.stats();
        assert_eq!(s.adapted, 2, "{options:?}: {s:?}");
        // sysv, other and the three entries (enter_other may reuse
        // enter_tail's code: same code, another callee).
        assert_eq!(s.compiled + s.reused, 5, "{options:?}: {s:?}");
        assert_eq!(
            s.defined,
            s.compiled + s.reused + s.adapted + s.aliased + s.trampolined + s.bytes_defined
        );
    }
}
