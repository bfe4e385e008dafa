//! Compile once, instantiate many: functions that differ only in the
//! functions they call and the symbols they read share one compilation, and
//! still call their own callees and read their own data.

use crate::common;

use crate::common::build::{call1, define, emit_call};
use cranelift_codegen::ir::{self, AbiParam, InstBuilder, MemFlagsData, types::I64};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{DataDescription, FuncId, Linkage, Module, default_libcall_names};
use jitfold::compile::{RelocTarget, compile};
use jitfold::{DedupModule, DedupOptions, Fingerprinter, Mode, SymbolName};

/// Number of getters (and of callees and tables) in [`getters`].
const GETTERS: usize = 6;

extern "C" fn host_negate(x: i64) -> i64 {
    -x
}

fn jit() -> JITModule {
    let mut b = JITBuilder::with_flags(&[("opt_level", "speed")], default_libcall_names()).unwrap();
    b.symbol("host_negate", host_negate as *const u8);
    JITModule::new(b)
}

/// `GETTERS` getters `g_i(x) = c_i(x) + table_i[8 + 8 * (x & 3)]`, each
/// calling its own callee `c_i(x) = x * (i + 2) + i` and reading its own
/// table through a symbol with offset 8; odd getters are built with other
/// value and block numbering. Then `h(x) = host_negate(x) + table_0[..]`,
/// the same code except that its callee is an import (not colocated).
/// Returns the getters, then `h`.
fn getters<M: Module>(m: &mut M) -> Vec<FuncId> {
    let mut s = m.make_signature();
    s.params.push(AbiParam::new(I64));
    s.returns.push(AbiParam::new(I64));
    let host = m
        .declare_function("host_negate", Linkage::Import, &s)
        .unwrap();
    let mut out = Vec::new();
    let mut tables = Vec::new();
    for i in 0..GETTERS {
        let callee = m
            .declare_function(&format!("c{i}"), Linkage::Local, &s)
            .unwrap();
        define(m, callee, |b, _, p| {
            let k = b.ins().imul_imm_s(p[0], i as i64 + 2);
            let r = b.ins().iadd_imm_s(k, i as i64);
            b.ins().return_(&[r]);
        })
        .unwrap();
        let table = m
            .declare_data(&format!("table{i}"), Linkage::Local, false, false)
            .unwrap();
        let mut data = DataDescription::new();
        data.define((0..48u8).map(|b| b.wrapping_mul(13 + i as u8)).collect());
        m.define_data(table, &data).unwrap();
        tables.push(table);
        let getter = m
            .declare_function(&format!("g{i}"), Linkage::Local, &s)
            .unwrap();
        define(m, getter, |b, m, p| {
            getter_body(b, m, p[0], callee, table, i % 2 == 1)
        })
        .unwrap();
        out.push(getter);
    }
    let h = m.declare_function("h", Linkage::Local, &s).unwrap();
    define(m, h, |b, m, p| {
        getter_body(b, m, p[0], host, tables[0], false)
    })
    .unwrap();
    out.push(h);
    out
}

fn getter_body<M: Module>(
    b: &mut cranelift_frontend::FunctionBuilder,
    m: &mut M,
    x: ir::Value,
    callee: FuncId,
    table: cranelift_module::DataId,
    renumbered: bool,
) {
    if renumbered {
        // A dead value first shifts every later value number.
        let dead = b.ins().iconst(I64, 99);
        let inst = b.func.dfg.value_def(dead).unwrap_inst();
        b.func.layout.remove_inst(inst);
    }
    let callee = m.declare_func_in_func(callee, b.func);
    let call = b.ins().call(callee, &[x]);
    let r = b.inst_results(call)[0];
    let gv = m.declare_data_in_func(table, b.func);
    if let ir::GlobalValueData::Symbol { offset, .. } = &mut b.func.global_values[gv] {
        *offset = ir::immediates::Imm64::new(8);
    }
    let base = b.ins().symbol_value(I64, gv);
    let idx = b.ins().band_imm_s(x, 3);
    let off = b.ins().imul_imm_s(idx, 8);
    let addr = b.ins().iadd(base, off);
    let v = b.ins().load(I64, MemFlagsData::trusted(), addr, 0);
    let sum = b.ins().iadd(r, v);
    b.ins().return_(&[sum]);
}

const INPUTS: [i64; 5] = [-7, 0, 1, 2, 1 << 33];

fn results(ids: &[FuncId], get: impl Fn(FuncId) -> *const u8) -> Vec<i64> {
    ids.iter()
        .flat_map(|&id| INPUTS.map(|x| call1(get(id), x)))
        .collect()
}

#[test]
fn getters_share_one_compilation_and_keep_their_callees_and_data() {
    let mut plain = jit();
    let ids = getters(&mut plain);
    plain.finalize_definitions().unwrap();
    let expected = results(&ids, |id| plain.get_finalized_function(id));
    // The getters really differ from each other.
    for i in 1..GETTERS {
        assert_ne!(
            expected[..INPUTS.len()],
            expected[i * INPUTS.len()..][..INPUTS.len()]
        );
    }
    for options in DedupOptions::ALL {
        let mut d = DedupModule::wrap(jit(), options);
        let ids = getters(&mut d);
        d.finalize_definitions().unwrap();
        let got = results(&ids, |id| d.get_finalized_function(id));
        assert_eq!(got, expected, "{options:?}");
        let s = d.stats();
        // The callees differ in constants; the getters but the first reuse
        // its code; `h` calls a non-colocated import, so it is compiled.
        let reused = if options.reuse { GETTERS as u64 - 1 } else { 0 };
        assert_eq!(s.reused, reused, "{options:?}: {s:?}");
        assert_eq!(s.compiled, 2 * GETTERS as u64 + 1 - reused, "{options:?}");
        assert_eq!(s.aliased + s.trampolined, 0, "{options:?}");
        // Each getter has its own entry point.
        for (i, &a) in ids.iter().enumerate() {
            for &b in &ids[i + 1..] {
                assert_ne!(d.get_finalized_function(a), d.get_finalized_function(b));
            }
        }
    }
}

/// Code is kept for reuse only where it can serve another function: one
/// with the same template and other names. A function without names has
/// no such twin, and its exact duplicates get trampolines on this ISA.
#[test]
fn code_without_names_is_not_kept_for_reuse() {
    for options in DedupOptions::ALL.into_iter().filter(|o| o.reuse) {
        let mut d = DedupModule::wrap(jit(), options);
        let mut s = d.make_signature();
        s.params.push(AbiParam::new(I64));
        s.returns.push(AbiParam::new(I64));
        let mut callees = Vec::new();
        for i in 0..3 {
            let id = d
                .declare_function(&format!("c{i}"), Linkage::Local, &s)
                .unwrap();
            define(&mut d, id, |b, _, p| {
                let r = b.ins().imul_imm_s(p[0], i + 2);
                b.ins().return_(&[r]);
            })
            .unwrap();
            callees.push(id);
        }
        d.finalize_definitions().unwrap();
        assert_eq!(d.stats().compiled, 3, "{options:?}");
        assert_eq!(d.stats().reuse_memory_bytes, 0, "{options:?}");
        // A caller's code is kept: it can serve a caller of another callee.
        let callers: Vec<FuncId> = callees
            .iter()
            .enumerate()
            .map(|(i, &callee)| {
                let id = d
                    .declare_function(&format!("g{i}"), Linkage::Local, &s)
                    .unwrap();
                define(&mut d, id, |b, m, p| {
                    let r = emit_call(b, m, callee, p[0]);
                    b.ins().return_(&[r]);
                })
                .unwrap();
                id
            })
            .collect();
        d.finalize_definitions().unwrap();
        let s = d.stats();
        assert!(s.reuse_memory_bytes > 0, "{options:?}: {s:?}");
        assert_eq!(s.compiled + s.reused, 6, "{options:?}: {s:?}");
        for (i, &g) in callers.iter().enumerate() {
            let got = call1(d.get_finalized_function(g), 5);
            assert_eq!(got, 5 * (i as i64 + 2), "{options:?}");
        }
    }
}

#[test]
fn reuse_works_for_callers_defined_before_their_callees() {
    // Batch and eager: the getters are defined before the callees here.
    for mode in [Mode::Eager, Mode::Batch] {
        let mut d = DedupModule::wrap(
            jit(),
            DedupOptions::default().with_mode(mode).with_check(true),
        );
        let mut s = d.make_signature();
        s.params.push(AbiParam::new(I64));
        s.returns.push(AbiParam::new(I64));
        let callees: Vec<FuncId> = (0..3)
            .map(|i| {
                d.declare_function(&format!("c{i}"), Linkage::Local, &s)
                    .unwrap()
            })
            .collect();
        let callers: Vec<FuncId> = (0..3)
            .map(|i| {
                d.declare_function(&format!("g{i}"), Linkage::Local, &s)
                    .unwrap()
            })
            .collect();
        for (&caller, &callee) in callers.iter().zip(&callees) {
            define(&mut d, caller, |b, m, p| {
                let r = emit_call(b, m, callee, p[0]);
                let r = b.ins().imul_imm_s(r, 3);
                b.ins().return_(&[r]);
            })
            .unwrap();
        }
        for (i, &callee) in callees.iter().enumerate() {
            define(&mut d, callee, |b, _, p| {
                let r = b.ins().iadd_imm_s(p[0], 100 * i as i64);
                b.ins().return_(&[r]);
            })
            .unwrap();
        }
        d.finalize_definitions().unwrap();
        assert_eq!(d.stats().reused, 2, "{mode:?}");
        for (i, &caller) in callers.iter().enumerate() {
            let f = d.get_finalized_function(caller);
            assert_eq!(call1(f, 5), 3 * (5 + 100 * i as i64), "{mode:?}");
        }
    }
}

/// A getter in CLIF: `fn = u0:{callee}`, `gv = u1:{table}+{offset}`.
/// `renumbered` gives every value, block and declaration other numbers and
/// declares the symbol last.
fn clif_getter(callee: u32, table: u32, offset: i64, colocated: bool, renumbered: bool) -> String {
    let coloc = if colocated { "colocated " } else { "" };
    let gv = format!("symbol colocated u1:{table}+{offset}");
    let (decls, gv_ref, fn_ref) = if renumbered {
        (
            format!("    sig2 = (i64) -> i64\n    fn5 = {coloc}u0:{callee} sig2\n    gv3 = {gv}\n"),
            "gv3",
            "fn5",
        )
    } else {
        (
            format!("    gv0 = {gv}\n    sig0 = (i64) -> i64\n    fn0 = {coloc}u0:{callee} sig0\n"),
            "gv0",
            "fn0",
        )
    };
    let (a, b, c, d, e, blk) = if renumbered {
        (10, 12, 14, 16, 18, 7)
    } else {
        (0, 1, 2, 3, 4, 0)
    };
    format!(
        "function u0:99(i64) -> i64 {{\n{decls}\nblock{blk}(v{a}: i64):\n    \
         v{b} = call {fn_ref}(v{a})\n    v{c} = symbol_value.i64 {gv_ref}\n    \
         v{d} = load.i64 notrap aligned v{c}+16\n    v{e} = iadd v{b}, v{d}\n    \
         return v{e}\n}}\n"
    )
}

fn keys(text: &str) -> (jitfold::Template, jitfold::Fingerprint, Vec<SymbolName>) {
    let func = &common::parse_valid(text)[0];
    let mut fp = Fingerprinter::new();
    let walk = fp.walk(func);
    (walk.template(), walk.fingerprint(), walk.names().to_vec())
}

fn user(namespace: u32, index: u32) -> SymbolName {
    SymbolName::User(ir::UserExternalName::new(namespace, index))
}

#[test]
fn templates_match_across_numbering_and_names_but_not_across_call_facts() {
    let (t0, e0, names0) = keys(&clif_getter(3, 3, 8, true, false));
    let (t1, e1, names1) = keys(&clif_getter(4, 5, 8, true, true));
    assert_eq!(t0, t1, "same code, other names and numbering");
    assert_ne!(e0, e1, "other callee and table");
    // Names in first-use order: the callee, then the table.
    assert_eq!(names0, [user(0, 3), user(1, 3)]);
    assert_eq!(names1, [user(0, 4), user(1, 5)]);
    // One name in both roles is one slot; two names are two.
    let (t_same, _, names_same) = keys(&clif_getter(3, 3, 8, true, false).replace("u1:3", "u0:3"));
    assert_eq!(names_same, [user(0, 3)]);
    assert_ne!(t_same, t0);
    // Facts about a reference stay in the template.
    let (t_offset, ..) = keys(&clif_getter(3, 3, 16, true, false));
    assert_ne!(t_offset, t0, "symbol offset");
    let (t_far, ..) = keys(&clif_getter(3, 3, 8, false, false));
    assert_ne!(t_far, t0, "colocated");
    let (t_tail, ..) = keys(
        &clif_getter(3, 3, 8, true, false)
            .replace("sig0 = (i64) -> i64", "sig0 = (i64) -> i64 tail"),
    );
    assert_ne!(t_tail, t0, "callee calling convention");
    let (t_sext, ..) = keys(
        &clif_getter(3, 3, 8, true, false)
            .replace("sig0 = (i64) -> i64", "sig0 = (i64 sext) -> i64"),
    );
    assert_ne!(t_sext, t0, "callee argument extension");
}

fn host_isa() -> cranelift_codegen::isa::OwnedTargetIsa {
    jitfold::isa::host_isa(jitfold::isa::flags(&[("opt_level", "speed")]).unwrap()).unwrap()
}

#[test]
fn retargeted_code_equals_a_separate_compilation() {
    let isa = host_isa();
    let base = &common::parse_valid(&clif_getter(3, 3, 8, true, false))[0];
    let other = &common::parse_valid(&clif_getter(4, 5, 8, true, true))[0];
    let mut fp = Fingerprinter::new();
    let base_names = fp.walk(base).names().to_vec();
    let other_names = fp.walk(other).names().to_vec();
    let base_code = compile(base, &*isa).unwrap().code;
    let other_code = compile(other, &*isa).unwrap().code;
    // The oracle: `other` compiled on its own.
    assert_eq!(
        base_code.retarget(&base_names, &other_names).as_ref(),
        Some(&other_code)
    );
    // The relocations really carry the symbol offset in their addend, and
    // point at the other function's names.
    let table = other_code
        .relocs
        .iter()
        .find(|r| r.target == RelocTarget::Name(user(1, 5)))
        .expect("a relocation against the table");
    let plain_table = compile(
        &common::parse_valid(&clif_getter(4, 5, 0, true, true))[0],
        &*isa,
    )
    .unwrap()
    .code;
    let plain = plain_table
        .relocs
        .iter()
        .find(|r| r.target == RelocTarget::Name(user(1, 5)))
        .unwrap();
    assert_eq!(table.kind, plain.kind);
    assert_eq!(table.addend, plain.addend + 8, "the symbol offset");
    assert!(
        other_code
            .relocs
            .iter()
            .any(|r| r.target == RelocTarget::Name(user(0, 4)))
    );
    // Slot lists of other lengths, or code naming something outside the
    // list, are refused.
    assert_eq!(
        base_code.retarget(&base_names[..1], &other_names[..1]),
        None
    );
    assert_eq!(base_code.retarget(&base_names, &other_names[..1]), None);
}

#[test]
fn with_names_equals_fingerprinting_the_renamed_function() {
    // The oracle: rename the callee in the text and fingerprint again.
    let (template, exact, names) = keys(&clif_getter(3, 3, 8, true, false));
    let (_, renamed_exact, renamed_names) = keys(&clif_getter(9, 3, 8, true, false));
    assert_eq!(renamed_names, [user(0, 9), user(1, 3)]);
    assert_eq!(template.with_names(&renamed_names), renamed_exact);
    assert_eq!(template.with_names(&names), exact);
    assert_ne!(renamed_exact, exact);
}

/// `try_call`s `callee` with the parameter (both in the `tail`
/// convention), returning its result, or 99 when it throws.
fn catching_caller<M: Module>(m: &mut M, id: FuncId, callee: FuncId) {
    define(m, id, |b, m, p| {
        let callee = m.declare_func_in_func(callee, b.func);
        let sig = b.func.dfg.ext_funcs[callee].signature;
        let returned = b.create_block();
        b.append_block_param(returned, I64);
        let caught = b.create_block();
        let normal = b
            .func
            .dfg
            .block_call(returned, &[ir::BlockArg::TryCallRet(0)]);
        let default = b.func.dfg.block_call(caught, &[]);
        let table =
            ir::ExceptionTableData::new(sig, normal, [ir::ExceptionTableItem::Default(default)]);
        let table = b.func.dfg.exception_tables.push(table);
        b.ins().try_call(callee, &[p[0]], table);
        b.switch_to_block(returned);
        let r = b.block_params(returned)[0];
        b.ins().return_(&[r]);
        b.switch_to_block(caught);
        let fallback = b.ins().iconst(I64, 99);
        b.ins().return_(&[fallback]);
    })
    .unwrap();
}

/// Declares and defines, for `k` in 3 and 5: `c_k(x) = x * k` and
/// `t_k(x)`, which calls `c_k` with `try_call` (99 if it throws), both in
/// the `tail` convention, then `e_k(x) = t_k(x)` in the default one, to
/// call from Rust. The `t_k` differ only in their callee, as do the `e_k`.
/// Returns the `e_k`.
fn catching_program<M: Module>(m: &mut M) -> Vec<FuncId> {
    let mut s = m.make_signature();
    s.params.push(AbiParam::new(I64));
    s.returns.push(AbiParam::new(I64));
    let mut tail = s.clone();
    tail.call_conv = cranelift_codegen::isa::CallConv::Tail;
    let mut entries = Vec::new();
    for (i, k) in [3, 5].into_iter().enumerate() {
        let callee = m
            .declare_function(&format!("c{i}"), Linkage::Local, &tail)
            .unwrap();
        define(m, callee, |b, _, p| {
            let r = b.ins().imul_imm_s(p[0], k);
            b.ins().return_(&[r]);
        })
        .unwrap();
        let caller = m
            .declare_function(&format!("t{i}"), Linkage::Local, &tail)
            .unwrap();
        catching_caller(m, caller, callee);
        let entry = m
            .declare_function(&format!("e{i}"), Linkage::Local, &s)
            .unwrap();
        define(m, entry, |b, m, p| {
            let r = emit_call(b, m, caller, p[0]);
            b.ins().return_(&[r]);
        })
        .unwrap();
        entries.push(entry);
    }
    entries
}

/// Where the inner module records no exception tables (cranelift-jit
/// without its `wasmtime-unwinder` feature, as this crate is built;
/// cranelift-object), a function that catches is reused and loaded like
/// any other, and runs as compiled: of `catching_program`, `t1` and `e1`
/// are copies of `t0`'s and `e0`'s code, and a second run compiles nothing
/// (it loads four and copies those for the other two).
/// (Around a module it does not know, `DedupModule::wrap` assumes it
/// records them: see the test below.)
#[test]
fn a_function_that_catches_is_reused_where_no_exception_tables_are_recorded() {
    let store: std::sync::Arc<dyn jitfold::store::CodeStore> =
        std::sync::Arc::new(jitfold::store::MemoryStore::new());
    for run in 0..2 {
        let b = JITBuilder::with_flags(&[("opt_level", "speed")], default_libcall_names()).unwrap();
        let mut m = DedupModule::<JITModule>::with_options(b, DedupOptions::eager())
            .with_store(store.clone(), None);
        let entries = catching_program(&mut m);
        m.finalize_definitions().unwrap();
        let stats = m.stats();
        let expected = if run == 0 { (4, 2, 0) } else { (0, 2, 4) };
        assert_eq!(
            (stats.compiled, stats.reused, stats.loaded),
            expected,
            "run {run}"
        );
        assert_eq!(
            call1(m.get_finalized_function(entries[0]), 7),
            21,
            "run {run}"
        );
        assert_eq!(
            call1(m.get_finalized_function(entries[1]), 7),
            35,
            "run {run}"
        );
        // SAFETY: nothing of the module's code is used after this.
        unsafe { m.into_inner().free_memory() };
    }
    let mut object = DedupModule::<cranelift_object::ObjectModule>::new(
        cranelift_object::ObjectBuilder::new(
            jitfold::isa::isa_by_name("x86_64", jitfold::isa::flags(&[]).unwrap()).unwrap(),
            "catching",
            default_libcall_names(),
        )
        .unwrap(),
    );
    catching_program(&mut object);
    assert_eq!((object.stats().compiled, object.stats().reused), (4, 2));
}

/// A function that catches exceptions is compiled by the inner module
/// itself, never copied from another's code or loaded from a store, where
/// the inner module may record exception tables only of what it compiles:
/// cranelift-jit with its `wasmtime-unwinder` feature, and any module
/// jitfold does not know (here a test double around a `JITModule`, which
/// `wrap` cannot tell from one that records them).
#[test]
fn a_function_that_catches_is_neither_reused_nor_loaded() {
    use crate::common::failing::{FailingJit, Failure};
    let store: std::sync::Arc<dyn jitfold::store::CodeStore> =
        std::sync::Arc::new(jitfold::store::MemoryStore::new());
    for run in 0..2 {
        let inner = FailingJit::new(Failure::Error);
        let mut m = DedupModule::wrap(inner, DedupOptions::eager()).with_store(store.clone(), None);
        let mut s = m.make_signature();
        s.call_conv = cranelift_codegen::isa::CallConv::Tail;
        s.params.push(AbiParam::new(I64));
        s.returns.push(AbiParam::new(I64));
        for (i, k) in [3, 5].into_iter().enumerate() {
            let callee = m
                .declare_function(&format!("c{i}"), Linkage::Local, &s)
                .unwrap();
            define(&mut m, callee, |b, _, p| {
                let r = b.ins().imul_imm_s(p[0], k);
                b.ins().return_(&[r]);
            })
            .unwrap();
            let caller = m
                .declare_function(&format!("t{i}"), Linkage::Local, &s)
                .unwrap();
            catching_caller(&mut m, caller, callee);
        }
        m.flush().unwrap();
        let stats = m.stats();
        assert_eq!(stats.reused, 0, "run {run}");
        // The callees are loaded from the store on the second run; the
        // callers, alike but for their callees, are compiled every time.
        let loaded = if run == 0 { 0 } else { 2 };
        assert_eq!(
            (stats.compiled, stats.loaded),
            (4 - loaded, loaded),
            "run {run}"
        );
    }
}
