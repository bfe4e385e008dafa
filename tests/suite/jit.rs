//! Execution tests of `DedupModule<JITModule>`: the same program is compiled
//! with plain `JITModule` and through jitfold (every mode and option), every
//! function is called, and the results must be equal.

use crate::common::build::{call1, define, emit_call};
use cranelift_codegen::ir;
use cranelift_codegen::ir::{
    AbiParam, InstBuilder, MemFlagsData, Signature, StackSlotData, StackSlotKind, condcodes::IntCC,
    types::*,
};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{
    DataDescription, DataId, FuncId, Linkage, Module, ModuleError, default_libcall_names,
};
use jitfold::{DedupModule, DedupOptions, Mode};

extern "C" fn host_triple(x: i64) -> i64 {
    3 * x
}

fn jit_builder() -> JITBuilder {
    let mut b = JITBuilder::with_flags(
        &[
            ("opt_level", "speed"),
            ("enable_llvm_abi_extensions", "true"),
        ],
        default_libcall_names(),
    )
    .unwrap();
    b.symbol("host_triple", host_triple as *const u8);
    b
}

fn plain() -> JITModule {
    JITModule::new(jit_builder())
}

fn dedup(mode: Mode, distinct_addresses: bool) -> DedupModule<JITModule> {
    dedup_with(
        DedupOptions::default()
            .with_mode(mode)
            .with_distinct_addresses(distinct_addresses),
    )
}

fn dedup_with(options: DedupOptions) -> DedupModule<JITModule> {
    DedupModule::wrap(JITModule::new(jit_builder()), options)
}

fn sig(m: &impl Module, params: &[ir::Type], returns: &[ir::Type]) -> Signature {
    let mut s = m.make_signature();
    s.params.extend(params.iter().map(|&t| AbiParam::new(t)));
    s.returns.extend(returns.iter().map(|&t| AbiParam::new(t)));
    s
}

/// Defines `id` with a body built by `body` (entry block already created,
/// switched to and holding the parameters).
/// `x * k + c`, with blocks created in the order given by `twisted` (a
/// renumbered twin when true).
fn affine(b: &mut FunctionBuilder, x: ir::Value, k: i64, c: i64, twisted: bool) {
    let (done, odd) = if twisted {
        let odd = b.create_block();
        (b.create_block(), odd)
    } else {
        (b.create_block(), b.create_block())
    };
    b.append_block_param(done, I64);
    let kx = b.ins().imul_imm_s(x, k);
    let is_odd = b.ins().band_imm_s(x, 1);
    b.ins().brif(is_odd, odd, &[], done, &[kx.into()]);
    b.switch_to_block(odd);
    let plus = b.ins().iadd_imm_s(kx, c);
    b.ins().jump(done, &[plus.into()]);
    b.switch_to_block(done);
    let r = b.block_params(done)[0];
    b.ins().return_(&[r]);
}

/// Declares and defines the test program; returns the ids to call, each
/// with the arguments to call it with.
struct Program {
    twins: [FuncId; 3],
    other: FuncId,
    caller_of_dup: FuncId,
    caller_of_canonical: FuncId,
    late_caller: FuncId,
    calls_host: FuncId,
    reads_data: FuncId,
}

fn build_program<M: Module>(m: &mut M) -> Program {
    let s1 = sig(m, &[I64], &[I64]);
    let f = m.declare_function("f", Linkage::Local, &s1).unwrap();
    let g = m.declare_function("g", Linkage::Export, &s1).unwrap();
    let h = m.declare_function("h", Linkage::Local, &s1).unwrap();
    let other = m.declare_function("other", Linkage::Local, &s1).unwrap();
    let caller_of_dup = m.declare_function("a", Linkage::Local, &s1).unwrap();
    let caller_of_canonical = m.declare_function("b", Linkage::Local, &s1).unwrap();
    let late_caller = m.declare_function("late", Linkage::Local, &s1).unwrap();
    let late_callee = m
        .declare_function("late_callee", Linkage::Local, &s1)
        .unwrap();
    let host = m
        .declare_function("host_triple", Linkage::Import, &s1)
        .unwrap();
    let calls_host = m
        .declare_function("calls_host", Linkage::Local, &s1)
        .unwrap();
    let reads_data = m
        .declare_function("reads_data", Linkage::Local, &s1)
        .unwrap();
    let table = m
        .declare_data("table", Linkage::Local, false, false)
        .unwrap();

    define(m, f, |b, _, p| affine(b, p[0], 7, 3, false)).unwrap();
    define(m, g, |b, _, p| affine(b, p[0], 7, 3, true)).unwrap();
    // A caller compiled before its callee is known to be a duplicate.
    define(m, late_caller, |b, m, p| {
        let r = emit_call(b, m, late_callee, p[0]);
        let r = b.ins().iadd_imm_s(r, 1);
        b.ins().return_(&[r]);
    })
    .unwrap();
    define(m, h, |b, _, p| affine(b, p[0], 7, 3, false)).unwrap();
    define(m, other, |b, _, p| affine(b, p[0], 7, 4, false)).unwrap();
    let call_one = |callee: FuncId| {
        move |b: &mut FunctionBuilder, m: &mut M, p: &[ir::Value]| {
            let r = emit_call(b, m, callee, p[0]);
            let r = b.ins().iadd_imm_s(r, 1);
            b.ins().return_(&[r]);
        }
    };
    define(m, caller_of_dup, call_one(g)).unwrap();
    define(m, caller_of_canonical, call_one(f)).unwrap();
    define(m, late_callee, |b, _, p| affine(b, p[0], 7, 3, true)).unwrap();
    define(m, calls_host, |b, m, p| {
        let r = emit_call(b, m, host, p[0]);
        b.ins().return_(&[r]);
    })
    .unwrap();
    let mut data = DataDescription::new();
    data.define((0..64u8).map(|i| i.wrapping_mul(37)).collect());
    m.define_data(table, &data).unwrap();
    define(m, reads_data, |b, m, p| {
        let gv = m.declare_data_in_func(table, b.func);
        let base = b.ins().symbol_value(I64, gv);
        let idx = b.ins().band_imm_s(p[0], 7);
        let off = b.ins().imul_imm_s(idx, 8);
        let addr = b.ins().iadd(base, off);
        let v = b.ins().load(I64, MemFlagsData::trusted(), addr, 0);
        b.ins().return_(&[v]);
    })
    .unwrap();
    Program {
        twins: [f, g, h],
        other,
        caller_of_dup,
        caller_of_canonical,
        late_caller,
        calls_host,
        reads_data,
    }
}

fn results(get: impl Fn(FuncId) -> *const u8, p: &Program) -> Vec<i64> {
    let ids = p.twins.iter().copied().chain([
        p.other,
        p.caller_of_dup,
        p.caller_of_canonical,
        p.late_caller,
        p.calls_host,
        p.reads_data,
    ]);
    let mut out = Vec::new();
    for id in ids {
        for x in [-5i64, 0, 1, 2, 9, 1 << 40] {
            out.push(call1(get(id), x));
        }
    }
    out
}

#[test]
fn merged_code_computes_what_plain_code_computes() {
    let mut m = plain();
    let p = build_program(&mut m);
    m.finalize_definitions().unwrap();
    let expected = results(|id| m.get_finalized_function(id), &p);
    // The twins and their callers really compute the documented values.
    assert_eq!(call1(m.get_finalized_function(p.twins[0]), 2), 14);
    assert_eq!(call1(m.get_finalized_function(p.twins[0]), 3), 24);

    for options in DedupOptions::ALL {
        let mut d = dedup_with(options);
        let (mode, distinct) = (options.mode, options.distinct_addresses);
        let p2 = build_program(&mut d);
        d.finalize_definitions().unwrap();
        let got = results(|id| d.get_finalized_function(id), &p2);
        assert_eq!(got, expected, "{mode:?}, distinct addresses {distinct}");
        let s = d.stats();
        // 10 functions: f, g, h and late_callee are one class; a and b call
        // twins (g is rewritten to f) and become one class. In batch mode
        // `late` (which calls late_callee) joins them too; eager mode compiled
        // it before late_callee was known to be a duplicate.
        let merged = if mode == Mode::Batch { 5 } else { 4 };
        assert_eq!(s.defined, 10, "{mode:?} {distinct}: {s:?}");
        assert_eq!(
            s.aliased + s.trampolined,
            merged,
            "{mode:?} {distinct}: {s:?}"
        );
        // (With similar merging, a merged body is compiled too.)
        assert_eq!(
            s.compiled + s.reused,
            10 - merged + s.similar_groups,
            "{mode:?} {distinct}: {s:?}"
        );
        // In eager mode `late` has the template of a and b (a call and an
        // add), so with reuse the first of a and b copies its code.
        let reused = u64::from(options.reuse && mode == Mode::Eager);
        assert_eq!(s.reused, reused, "{mode:?} {distinct}: {s:?}");
        let ab = [
            d.canonical(p2.caller_of_canonical),
            d.canonical(p2.caller_of_dup),
        ];
        assert_eq!(ab[0], ab[1]);
        if distinct {
            assert_eq!(s.aliased, 0);
        } else {
            assert_eq!(s.trampolined, 0);
        }
        assert!(s.code_bytes < s.code_bytes_without_dedup, "{s:?}");
        assert_eq!(d.canonical(p2.twins[1]), Some(p2.twins[0]));
        assert_eq!(d.canonical(p2.other), Some(p2.other));
        // Aliases share the entry point; distinct mode keeps addresses apart.
        let a = d.get_finalized_function(p2.twins[0]);
        let b = d.get_finalized_function(p2.twins[1]);
        assert_eq!(a == b, !distinct);
    }
}

#[test]
fn a_caller_compiled_before_its_callee_merged_still_works() {
    // Eager mode: `late` is compiled while `late_callee` is still undefined,
    // so its call goes through late_callee's trampoline.
    let mut d = dedup(Mode::Eager, false);
    let p = build_program(&mut d);
    d.finalize_definitions().unwrap();
    for x in [0i64, 1, 5, -3] {
        let direct = 7 * x + if x & 1 != 0 { 3 } else { 0 };
        assert_eq!(
            call1(d.get_finalized_function(p.late_caller), x),
            direct + 1
        );
    }
}

/// Two duplicates whose addresses the program itself compares.
#[test]
fn distinct_addresses_keep_function_pointers_apart() {
    for distinct in [false, true] {
        let mut d = dedup(Mode::Eager, distinct);
        let s1 = sig(&d, &[I64], &[I64]);
        let f = d.declare_function("f", Linkage::Local, &s1).unwrap();
        let g = d.declare_function("g", Linkage::Local, &s1).unwrap();
        let cmp = d
            .declare_function("same_fn", Linkage::Local, &sig(&d, &[], &[I64]))
            .unwrap();
        define(&mut d, f, |b, _, p| affine(b, p[0], 5, 1, false)).unwrap();
        define(&mut d, g, |b, _, p| affine(b, p[0], 5, 1, true)).unwrap();
        define(&mut d, cmp, |b, m, _| {
            let fr = m.declare_func_in_func(f, b.func);
            let gr = m.declare_func_in_func(g, b.func);
            let fa = b.ins().func_addr(I64, fr);
            let ga = b.ins().func_addr(I64, gr);
            let eq = b.ins().icmp(IntCC::Equal, fa, ga);
            let eq = b.ins().uextend(I64, eq);
            // Call g through its address, too.
            let sig = b.import_signature({
                let mut s =
                    Signature::new(CallConv::triple_default(&target_lexicon::Triple::host()));
                s.params.push(AbiParam::new(I64));
                s.returns.push(AbiParam::new(I64));
                s
            });
            let five = b.ins().iconst(I64, 5);
            let call = b.ins().call_indirect(sig, ga, &[five]);
            let r = b.inst_results(call)[0];
            let r = b.ins().imul_imm_s(r, 10);
            let r = b.ins().iadd(r, eq);
            b.ins().return_(&[r]);
        })
        .unwrap();
        d.finalize_definitions().unwrap();
        let ptr = d.get_finalized_function(cmp);
        // SAFETY: `same_fn` takes nothing and returns an i64.
        let same: extern "C" fn() -> i64 = unsafe { std::mem::transmute(ptr) };
        // g(5) = 26, so 260 + (f == g).
        assert_eq!(same(), 260 + i64::from(!distinct));
        let (pf, pg) = (d.get_finalized_function(f), d.get_finalized_function(g));
        assert_eq!(pf == pg, !distinct);
        assert_eq!(call1(pg, 3), 16);
    }
}

/// Types that stress the ABI: stack-passed arguments, i128, floats, SIMD.
#[test]
fn wide_and_many_arguments() {
    fn program<M: Module>(m: &mut M) -> [FuncId; 6] {
        let many: Vec<ir::Type> = (0..12)
            .map(|i| if i % 3 == 0 { F64 } else { I64 })
            .collect();
        let s_many = sig(m, &many, &[F64]);
        let s_wide = sig(m, &[I128, I128], &[I128]);
        let s_simd = sig(m, &[I32X4, I32X4], &[I32X4]);
        let many_a = m
            .declare_function("many_a", Linkage::Local, &s_many)
            .unwrap();
        let many_b = m
            .declare_function("many_b", Linkage::Local, &s_many)
            .unwrap();
        let wide_a = m
            .declare_function("wide_a", Linkage::Local, &s_wide)
            .unwrap();
        let wide_b = m
            .declare_function("wide_b", Linkage::Local, &s_wide)
            .unwrap();
        let simd_a = m
            .declare_function("simd_a", Linkage::Local, &s_simd)
            .unwrap();
        let simd_b = m
            .declare_function("simd_b", Linkage::Local, &s_simd)
            .unwrap();
        for id in [many_a, many_b] {
            define(m, id, |b, _, p| {
                let mut acc = b.ins().f64const(0.5);
                for (i, &v) in p.iter().enumerate() {
                    let v = if i % 3 == 0 {
                        v
                    } else {
                        b.ins().fcvt_from_sint(F64, v)
                    };
                    let scaled = b.ins().fmul(acc, v);
                    acc = b.ins().fadd(scaled, v);
                }
                b.ins().return_(&[acc]);
            })
            .unwrap();
        }
        for id in [wide_a, wide_b] {
            define(m, id, |b, _, p| {
                let x = b.ins().imul(p[0], p[1]);
                let y = b.ins().iadd(x, p[0]);
                b.ins().return_(&[y]);
            })
            .unwrap();
        }
        for id in [simd_a, simd_b] {
            define(m, id, |b, _, p| {
                let x = b.ins().iadd(p[0], p[1]);
                let y = b.ins().imul(x, p[1]);
                b.ins().return_(&[y]);
            })
            .unwrap();
        }
        [many_a, many_b, wide_a, wide_b, simd_a, simd_b]
    }
    type Many = extern "C" fn(f64, i64, i64, f64, i64, i64, f64, i64, i64, f64, i64, i64) -> f64;
    type Wide = extern "C" fn(i128, i128) -> i128;
    let run = |get: &dyn Fn(FuncId) -> *const u8, ids: [FuncId; 6]| -> Vec<u128> {
        let mut out = Vec::new();
        for &id in &ids[0..2] {
            // SAFETY: the signature declared above, in the host convention.
            let f: Many = unsafe { std::mem::transmute(get(id)) };
            out.push(f(1.5, -2, 3, -0.0, 5, 6, f64::MAX, 8, -9, 1e-300, 11, 12).to_bits() as u128);
        }
        for &id in &ids[2..4] {
            // SAFETY: as above.
            let f: Wide = unsafe { std::mem::transmute(get(id)) };
            out.push(f(-(1i128 << 100) + 12345, 987654321987654321) as u128);
        }
        for &id in &ids[4..6] {
            // SAFETY: (i32x4, i32x4) -> i32x4 is passed in xmm registers as __m128i.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                use std::arch::x86_64::*;
                let f: extern "C" fn(__m128i, __m128i) -> __m128i = std::mem::transmute(get(id));
                let r = f(
                    _mm_set_epi32(1, -2, 3, i32::MAX),
                    _mm_set_epi32(5, 6, -7, 8),
                );
                out.push(std::mem::transmute::<__m128i, u128>(r));
            }
        }
        out
    };
    let mut m = plain();
    let ids = program(&mut m);
    m.finalize_definitions().unwrap();
    let expected = run(&|id| m.get_finalized_function(id), ids);
    for options in DedupOptions::ALL {
        let mut d = dedup_with(options);
        let (mode, distinct) = (options.mode, options.distinct_addresses);
        let ids = program(&mut d);
        d.finalize_definitions().unwrap();
        assert_eq!(
            run(&|id| d.get_finalized_function(id), ids),
            expected,
            "{mode:?} {distinct}"
        );
        assert_eq!(
            d.stats().compiled,
            3,
            "{mode:?} {distinct}: {:?}",
            d.stats()
        );
    }
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    for mode in [Mode::Eager, Mode::Batch] {
        let mut d = dedup(mode, false);
        let s1 = sig(&d, &[I64], &[I64]);
        let f = d.declare_function("f", Linkage::Local, &s1).unwrap();
        let imported = d
            .declare_function("host_triple", Linkage::Import, &s1)
            .unwrap();
        let unused = d
            .declare_function("never_defined", Linkage::Local, &s1)
            .unwrap();
        define(&mut d, f, |b, _, p| affine(b, p[0], 2, 1, false)).unwrap();

        // Defining twice.
        let again = define(&mut d, f, |b, _, p| affine(b, p[0], 2, 1, false));
        assert!(
            matches!(again, Err(ModuleError::DuplicateDefinition(ref n)) if n == "f"),
            "{again:?}"
        );
        // Defining an import.
        let import = define(&mut d, imported, |b, _, p| affine(b, p[0], 2, 1, false));
        assert!(
            matches!(import, Err(ModuleError::InvalidImportDefinition(_))),
            "{import:?}"
        );
        // (Defining with another signature than declared is no misuse:
        // `JITModule` compiles it with the signature it is defined with;
        // see `signatures.rs`.)
        // An id from nowhere.
        let mut ctx = d.make_context();
        ctx.func.signature = s1.clone();
        let bogus = d.define_function(FuncId::from_u32(999), &mut ctx);
        assert!(
            matches!(bogus, Err(ModuleError::Undeclared(_))),
            "{bogus:?}"
        );
        // Pointers of undefined or unfinalized ids.
        let early = d.try_get_finalized_function(f);
        assert!(early.is_err(), "pointer before finalize");
        d.finalize_definitions().unwrap();
        let undefined = d.try_get_finalized_function(unused);
        assert!(format!("{}", undefined.unwrap_err()).contains("never_defined is not defined"));
        assert!(d.try_get_finalized_function(FuncId::from_u32(999)).is_err());
        assert_eq!(call1(d.get_finalized_function(f), 3), 7);
    }
}

#[test]
fn finalize_reports_a_referenced_undefined_function() {
    let mut d = dedup(Mode::Eager, false);
    let s1 = sig(&d, &[I64], &[I64]);
    let missing = d.declare_function("missing", Linkage::Local, &s1).unwrap();
    let caller = d.declare_function("caller", Linkage::Local, &s1).unwrap();
    define(&mut d, caller, |b, m, p| {
        let r = emit_call(b, m, missing, p[0]);
        b.ins().return_(&[r]);
    })
    .unwrap();
    let err = d.finalize_definitions().unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    // Defining it afterwards makes finalization succeed.
    define(&mut d, missing, |b, _, p| affine(b, p[0], 1, 0, false)).unwrap();
    d.finalize_definitions().unwrap();
    assert_eq!(call1(d.get_finalized_function(caller), 4), 4);
}

#[test]
fn a_failed_compile_leaves_no_cache_entry() {
    for mode in [Mode::Eager, Mode::Batch] {
        let mut d = dedup(mode, false);
        let s1 = sig(&d, &[I64], &[I64]);
        let f = d.declare_function("f", Linkage::Local, &s1).unwrap();
        let g = d.declare_function("g", Linkage::Local, &s1).unwrap();
        // The verifier rejects a function whose block is not terminated.
        let mut ctx = d.make_context();
        ctx.func.signature = s1.clone();
        let entry = ctx.func.dfg.make_block();
        ctx.func.layout.append_block(entry);
        let result = d.define_function(f, &mut ctx).and_then(|()| d.flush());
        assert!(
            matches!(result, Err(ModuleError::Compilation(_))),
            "{mode:?}: {result:?}"
        );
        assert_eq!(d.cache().classes(), 0);
        // f may be defined again, correctly, and g (same body) is its twin.
        define(&mut d, f, |b, _, p| affine(b, p[0], 3, 1, false)).unwrap();
        define(&mut d, g, |b, _, p| affine(b, p[0], 3, 1, true)).unwrap();
        d.finalize_definitions().unwrap();
        assert_eq!(d.stats().compiled, 1);
        // The failed definition is not counted.
        let s = d.stats();
        assert_eq!(s.defined, 2, "{mode:?}: {s:?}");
        assert_eq!(
            s.defined,
            s.compiled + s.aliased + s.trampolined + s.bytes_defined
        );
        assert_eq!(call1(d.get_finalized_function(g), 5), 16);
    }
}

#[test]
fn stack_slots_and_loops_survive_merging() {
    fn program<M: Module>(m: &mut M) -> [FuncId; 2] {
        let s1 = sig(m, &[I64], &[I64]);
        let a = m.declare_function("sum_a", Linkage::Local, &s1).unwrap();
        let b2 = m.declare_function("sum_b", Linkage::Local, &s1).unwrap();
        for (id, twisted) in [(a, false), (b2, true)] {
            define(m, id, |b, _, p| {
                let slot = b.create_sized_stack_slot(StackSlotData::new(
                    StackSlotKind::ExplicitSlot,
                    8,
                    3,
                ));
                let (head, body, exit) = if twisted {
                    let exit = b.create_block();
                    let body = b.create_block();
                    (b.create_block(), body, exit)
                } else {
                    (b.create_block(), b.create_block(), b.create_block())
                };
                let zero = b.ins().iconst(I64, 0);
                b.ins().stack_store(I64, zero, slot, 0);
                b.append_block_param(head, I64);
                b.ins().jump(head, &[p[0].into()]);
                b.switch_to_block(head);
                let n = b.block_params(head)[0];
                b.ins().brif(n, body, &[], exit, &[]);
                b.switch_to_block(body);
                let acc = b.ins().stack_load(I64, I64, slot, 0);
                let acc = b.ins().iadd(acc, n);
                b.ins().stack_store(I64, acc, slot, 0);
                let n1 = b.ins().iadd_imm_s(n, -1);
                b.ins().jump(head, &[n1.into()]);
                b.switch_to_block(exit);
                let r = b.ins().stack_load(I64, I64, slot, 0);
                b.ins().return_(&[r]);
            })
            .unwrap();
        }
        [a, b2]
    }
    for options in DedupOptions::ALL {
        let mut d = dedup_with(options);
        let mode = options.mode;
        let ids = program(&mut d);
        d.finalize_definitions().unwrap();
        assert_eq!(d.stats().compiled, 1, "{mode:?}");
        for id in ids {
            assert_eq!(call1(d.get_finalized_function(id), 100), 5050);
        }
    }
}

#[test]
fn f32_twins_merge_and_keep_their_bits() {
    fn program<M: Module>(m: &mut M) -> [FuncId; 3] {
        let s = sig(m, &[F32, F32], &[F32]);
        let ids = [
            m.declare_function("fa", Linkage::Local, &s).unwrap(),
            m.declare_function("fb", Linkage::Local, &s).unwrap(),
            m.declare_function("fc_neg_zero", Linkage::Local, &s)
                .unwrap(),
        ];
        for (i, &id) in ids.iter().enumerate() {
            define(m, id, |b, _, p| {
                if i == 1 {
                    // Renumber: a dead constant first.
                    let dead = b.ins().f32const(9.0);
                    let inst = b.func.dfg.value_def(dead).unwrap_inst();
                    b.func.layout.remove_inst(inst);
                }
                // fc adds -0.0 instead of +0.0: a different function.
                let zero = b.ins().f32const(if i == 2 { -0.0 } else { 0.0 });
                let prod = b.ins().fmul(p[0], p[1]);
                let r = b.ins().fadd(prod, zero);
                b.ins().return_(&[r]);
            })
            .unwrap();
        }
        ids
    }
    let call = |ptr: *const u8, a: f32, b: f32| -> u32 {
        // SAFETY: (f32, f32) -> f32 in the host convention, finalized.
        let f: extern "C" fn(f32, f32) -> f32 = unsafe { std::mem::transmute(ptr) };
        f(a, b).to_bits()
    };
    let inputs = [
        (1.5f32, -2.0f32),
        (-0.0, 3.0),
        (f32::NAN, 1.0),
        (1e30, 1e30),
    ];
    let mut m = plain();
    let ids = program(&mut m);
    m.finalize_definitions().unwrap();
    let expected: Vec<u32> = ids
        .iter()
        .flat_map(|&id| inputs.map(|(a, b)| call(m.get_finalized_function(id), a, b)))
        .collect();
    // -0.0 * 3 + 0.0 = +0.0, but + (-0.0) keeps -0.0: the functions differ.
    assert_ne!(expected[1], expected[9]);
    for options in DedupOptions::ALL {
        let mut d = dedup_with(options);
        let (mode, distinct) = (options.mode, options.distinct_addresses);
        let ids = program(&mut d);
        d.finalize_definitions().unwrap();
        let got: Vec<u32> = ids
            .iter()
            .flat_map(|&id| inputs.map(|(a, b)| call(d.get_finalized_function(id), a, b)))
            .collect();
        assert_eq!(got, expected, "{mode:?} {distinct}");
        assert_eq!(d.stats().compiled, 2, "{mode:?} {distinct}");
    }
}

#[test]
fn raw_bytes_and_data_misuse_are_errors() {
    let mut d = dedup(Mode::Eager, false);
    // Undeclared ids, for raw bytes and for data.
    let bytes = d.define_function_bytes(FuncId::from_u32(7), 16, &[0xc3], &[]);
    assert!(
        matches!(bytes, Err(ModuleError::Undeclared(_))),
        "{bytes:?}"
    );
    let data = d.define_data(
        cranelift_module::DataId::from_u32(3),
        &DataDescription::new(),
    );
    assert!(matches!(data, Err(ModuleError::Undeclared(_))), "{data:?}");
    assert!(
        d.try_get_finalized_data(cranelift_module::DataId::from_u32(3))
            .is_err()
    );
    // A declared but undefined data object referenced by code.
    let s1 = sig(&d, &[I64], &[I64]);
    let table = d
        .declare_data("table", Linkage::Local, false, false)
        .unwrap();
    let f = d.declare_function("f", Linkage::Local, &s1).unwrap();
    define(&mut d, f, |b, m, _| {
        let gv = m.declare_data_in_func(table, b.func);
        let base = b.ins().symbol_value(I64, gv);
        b.ins().return_(&[base]);
    })
    .unwrap();
    let err = d.finalize_definitions().unwrap_err();
    assert!(err.to_string().contains("data object table"), "{err}");
    let mut data = DataDescription::new();
    data.define_zeroinit(8);
    d.define_data(table, &data).unwrap();
    d.finalize_definitions().unwrap();
    let (ptr, size) = d.get_finalized_data(table);
    assert_eq!(size, 8);
    assert_eq!(call1(d.get_finalized_function(f), 0), ptr as i64);
}

#[test]
fn declared_but_unused_references_need_no_definition() {
    for mode in [Mode::Eager, Mode::Batch] {
        let mut d = dedup(mode, false);
        let s1 = sig(&d, &[I64], &[I64]);
        let never = d
            .declare_function("never_defined", Linkage::Local, &s1)
            .unwrap();
        let f = d.declare_function("f", Linkage::Local, &s1).unwrap();
        define(&mut d, f, |b, m, p| {
            // Imported into the function, never called.
            m.declare_func_in_func(never, b.func);
            b.ins().return_(&[p[0]]);
        })
        .unwrap();
        d.finalize_definitions().unwrap();
        assert_eq!(call1(d.get_finalized_function(f), 9), 9, "{mode:?}");
    }
}

/// A JIT builder with the host's `late` and `late_data`.
fn host_builder() -> JITBuilder {
    let mut b = JITBuilder::new(default_libcall_names()).unwrap();
    b.symbol("late", host_late as *const u8);
    b.symbol("late_data", &HOST_LATE_DATA as *const i64 as *const u8);
    b
}

/// Runs `$run` (generic over the module: `fn run<M: Module>(m, finalize,
/// pointer_of)`) on plain `JITModule` and through `DedupModule` in every
/// option set, each made with [`host_builder`]; asserts that every result
/// is plain's, and gives plain's.
macro_rules! same_as_plain_in_every_option_set {
    ($run:ident) => {{
        let finalize = |m: &mut JITModule| m.finalize_definitions().unwrap();
        let mut plain = JITModule::new(host_builder());
        let expected = $run(&mut plain, &mut { finalize }, &|m: &JITModule, id| {
            m.get_finalized_function(id)
        });
        for options in DedupOptions::ALL {
            let mut m = DedupModule::with_options(host_builder(), options);
            let got = $run(
                &mut m,
                &mut |m: &mut DedupModule<JITModule>| m.finalize_definitions().unwrap(),
                &|m: &DedupModule<JITModule>, id| m.get_finalized_function(id),
            );
            assert_eq!(got, expected, "{options:?}");
        }
        expected
    }};
}

/// The host's `late`, which a JIT binds a preemptible `late` to while the
/// module does not define it.
extern "C" fn host_late(x: i64) -> i64 {
    x + 1
}

/// A preemptible function referenced before the module defines it is
/// bound to the host's symbol at that finalize, and to the module's own
/// definition in every finalize after it is defined. A function defined
/// after that, equal to one finalized before, must not run the earlier
/// function's code (which calls the host's symbol): plain `JITModule`
/// binds its call to the module's definition (as it does for a twin
/// defined before the module defines the callee, finalized after). In
/// every option set.
#[test]
fn a_twin_of_code_bound_to_a_host_symbol_binds_its_own_calls() {
    fn run<M: Module>(
        m: &mut M,
        finalize: &mut dyn FnMut(&mut M),
        ptr: &dyn Fn(&M, FuncId) -> *const u8,
    ) -> (i64, i64) {
        let conv = m.isa().default_call_conv();
        let s = crate::common::build::sig(m, conv);
        let late = m
            .declare_function("late", Linkage::Preemptible, &s)
            .unwrap();
        let caller = |m: &mut M, name: &str| {
            let id = m.declare_function(name, Linkage::Local, &s).unwrap();
            define(m, id, |b, m, p| {
                let r = emit_call(b, m, late, p[0]);
                b.ins().return_(&[r]);
            })
            .unwrap();
            id
        };
        let first = caller(m, "first");
        finalize(m);
        let before = call1(ptr(m, first), 10);
        // Defined while `late` is still the host's, finalized once it is
        // the module's.
        let middle = caller(m, "middle");
        define(m, late, |b, _, p| {
            let r = b.ins().imul_imm_s(p[0], 100);
            b.ins().return_(&[r]);
        })
        .unwrap();
        let second = caller(m, "second");
        finalize(m);
        let after = call1(ptr(m, second), 10);
        assert_eq!(call1(ptr(m, middle), 10), after);
        // The first keeps calling the host's.
        assert_eq!(call1(ptr(m, first), 10), before);
        (before, after)
    }
    let expected = same_as_plain_in_every_option_set!(run);
    assert_eq!(expected, (11, 1000));
}

/// The host's `late_data`, which a JIT binds a preemptible `late_data` to
/// while the module does not define it.
static HOST_LATE_DATA: i64 = 5;

/// Declares and defines local function `name`, which returns its argument
/// plus the 8 bytes at data object `data`.
fn data_reader<M: Module>(m: &mut M, data: DataId, name: &str) -> FuncId {
    let conv = m.isa().default_call_conv();
    let s = crate::common::build::sig(m, conv);
    let id = m.declare_function(name, Linkage::Local, &s).unwrap();
    define(m, id, |b, m, p| {
        let gv = m.declare_data_in_func(data, b.func);
        let addr = b.ins().symbol_value(ir::types::I64, gv);
        let v = b
            .ins()
            .load(ir::types::I64, MemFlagsData::trusted(), addr, 0);
        let r = b.ins().iadd(v, p[0]);
        b.ins().return_(&[r]);
    })
    .unwrap();
    id
}

/// As for a preemptible function above, for a preemptible data object: a
/// function defined after the module defines it reads the module's, as
/// with plain `JITModule`, not the host's that an equal function read
/// before.
#[test]
fn a_twin_of_code_bound_to_host_data_reads_its_own() {
    fn run<M: Module>(
        m: &mut M,
        finalize: &mut dyn FnMut(&mut M),
        ptr: &dyn Fn(&M, FuncId) -> *const u8,
    ) -> (i64, i64) {
        let data = m
            .declare_data("late_data", Linkage::Preemptible, false, false)
            .unwrap();
        let first = data_reader(m, data, "first");
        finalize(m);
        let before = call1(ptr(m, first), 0);
        let mut description = DataDescription::new();
        description.define(7i64.to_le_bytes().into());
        m.define_data(data, &description).unwrap();
        let second = data_reader(m, data, "second");
        finalize(m);
        (before, call1(ptr(m, second), 0))
    }
    let expected = same_as_plain_in_every_option_set!(run);
    assert_eq!(expected, (5, 7));
}

/// A reference is checked at the finalization that resolves it only: code
/// finalized reading preemptible `late_data` (bound to the host's) stays
/// as it is when `late_data` is then declared exported and never defined,
/// and the next finalization succeeds, as with plain `JITModule` (which
/// relocates only what it finalizes).
#[test]
fn a_reference_finalized_before_its_name_turned_local_is_not_checked_again() {
    fn run<M: Module>(
        m: &mut M,
        finalize: &mut dyn FnMut(&mut M),
        ptr: &dyn Fn(&M, FuncId) -> *const u8,
    ) -> (i64, i64) {
        let data = m
            .declare_data("late_data", Linkage::Preemptible, false, false)
            .unwrap();
        let reader = data_reader(m, data, "reader");
        finalize(m);
        let before = call1(ptr(m, reader), 1);
        m.declare_data("late_data", Linkage::Export, false, false)
            .unwrap();
        let conv = m.isa().default_call_conv();
        let s = crate::common::build::sig(m, conv);
        let other = m.declare_function("other", Linkage::Local, &s).unwrap();
        define(m, other, |b, _, p| {
            b.ins().return_(&[p[0]]);
        })
        .unwrap();
        finalize(m);
        (before, call1(ptr(m, other), 2))
    }
    let expected = same_as_plain_in_every_option_set!(run);
    assert_eq!(expected, (6, 2));
}

/// A late merge must not redirect calls *from* a function whose code calls
/// a host symbol the module defines later: `x` (calling `late`, bound to
/// the host's) becomes equal to `y` once `late` is defined as a twin of
/// `q`, but a function defined after that calling `x` still runs `x`'s
/// code, as with plain `JITModule`.
#[test]
fn no_call_is_redirected_from_code_bound_to_a_host_symbol() {
    fn run<M: Module>(
        m: &mut M,
        finalize: &mut dyn FnMut(&mut M),
        ptr: &dyn Fn(&M, FuncId) -> *const u8,
    ) -> i64 {
        let conv = m.isa().default_call_conv();
        let s = crate::common::build::sig(m, conv);
        let late = m
            .declare_function("late", Linkage::Preemptible, &s)
            .unwrap();
        // Preemptible as `late` is, so that `x` and `y` are calls alike (a
        // local callee is colocated, a preemptible one is not).
        let q = m.declare_function("q", Linkage::Preemptible, &s).unwrap();
        let hundred = |b: &mut FunctionBuilder, _: &mut M, p: &[ir::Value]| {
            let r = b.ins().imul_imm_s(p[0], 100);
            b.ins().return_(&[r]);
        };
        define(m, q, hundred).unwrap();
        let caller = |m: &mut M, name: &str, callee: FuncId| {
            let id = m.declare_function(name, Linkage::Local, &s).unwrap();
            define(m, id, |b, m, p| {
                let r = emit_call(b, m, callee, p[0]);
                b.ins().return_(&[r]);
            })
            .unwrap();
            id
        };
        caller(m, "y", q);
        let x = caller(m, "x", late);
        finalize(m);
        define(m, late, hundred).unwrap();
        let w = caller(m, "w", x);
        finalize(m);
        call1(ptr(m, w), 10)
    }
    let expected = same_as_plain_in_every_option_set!(run);
    assert_eq!(expected, 11);
}
