//! One address per function id (#17): `get_finalized_function`,
//! `get_address`, `func_addr` and `symbol_value` in code, and function
//! addresses in data objects all give the same address for an id, in every
//! mode; by default every id's address is its own (as in plain Cranelift),
//! and with shared addresses a duplicate shares its canonical function's
//! only if its own address was not compiled into anything before.

use crate::common::build::{call1, declare, define};
use cranelift_codegen::ir::{self, InstBuilder, condcodes::IntCC, types::I64};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{
    DataDescription, DataId, FuncId, Linkage, Module, ModuleRelocTarget, default_libcall_names,
};
use cranelift_object::{ObjectBuilder, ObjectModule};
use jitfold::{DedupModule, DedupOptions, Mode};

fn jit() -> JITModule {
    JITModule::new(JITBuilder::new(default_libcall_names()).unwrap())
}

/// `x * 7 + 2`.
fn body(b: &mut FunctionBuilder, x: ir::Value) {
    let t = b.ins().imul_imm_s(x, 7);
    let r = b.ins().iadd_imm_s(t, 2);
    b.ins().return_(&[r]);
}

/// A function of one ignored parameter returning `func_addr target`.
fn address_of<M: Module>(m: &mut M, id: FuncId, target: FuncId) {
    define(m, id, |b, m, _| {
        let r = m.declare_func_in_func(target, b.func);
        let a = b.ins().func_addr(I64, r);
        b.ins().return_(&[a]);
    })
    .unwrap();
}

/// A function of one ignored parameter returning `symbol_value target`.
fn symbol_of<M: Module>(m: &mut M, id: FuncId, target: FuncId) {
    define(m, id, |b, _, _| {
        let name = b
            .func
            .declare_imported_user_function(ir::UserExternalName::new(0, target.as_u32()));
        let gv = b.func.create_global_value(ir::GlobalValueData::Symbol {
            name: ir::ExternalName::user(name),
            offset: ir::immediates::Imm64::new(0),
            colocated: false,
            tls: false,
        });
        let a = b.ins().symbol_value(I64, gv);
        b.ins().return_(&[a]);
    })
    .unwrap();
}

/// A data object of the addresses of `targets`.
fn table<M: Module>(m: &mut M, name: &str, targets: &[FuncId]) -> DataId {
    let id = m.declare_data(name, Linkage::Local, false, false).unwrap();
    let mut data = DataDescription::new();
    data.define_zeroinit(8 * targets.len());
    for (i, &t) in targets.iter().enumerate() {
        let r = m.declare_func_in_data(t, &mut data);
        data.write_function_addr(8 * i as u32, r);
    }
    m.define_data(id, &data).unwrap();
    id
}

/// The ids of [`program`].
struct Ids {
    /// The canonical function and three twins of it.
    twins: [FuncId; 4],
    /// Returns `func_addr twins[1]`; defined before `twins[1]`.
    early_code: FuncId,
    /// Holds `&twins[2]`; defined before `twins[2]`.
    early_data: DataId,
    /// Return `func_addr` / `symbol_value` of each twin; defined last.
    late_code: [FuncId; 4],
    late_symbol: [FuncId; 4],
    /// Holds the address of each twin; defined last.
    late_data: DataId,
    /// Returns whether `func_addr twins[0] == func_addr twins[3]`.
    compare: FuncId,
}

/// Twins whose addresses are taken in every way, some before they are
/// known to be duplicates; `flush` runs after the twins are defined (a
/// batch module's flush: in batch mode, what is defined before it, code
/// and twins alike, is compiled there, but data is defined at once).
fn program<M: Module>(m: &mut M, flush: impl FnOnce(&mut M)) -> Ids {
    let mut sig = m.make_signature();
    sig.params.push(ir::AbiParam::new(I64));
    sig.returns.push(ir::AbiParam::new(I64));
    let declare = |m: &mut M, name: &str| m.declare_function(name, Linkage::Local, &sig).unwrap();
    let twins = ["t0", "t1", "t2", "t3"].map(|n| declare(m, n));
    let early_code = declare(m, "early_code");
    let late_code = ["c0", "c1", "c2", "c3"].map(|n| declare(m, n));
    let late_symbol = ["s0", "s1", "s2", "s3"].map(|n| declare(m, n));
    let compare = declare(m, "compare");

    define(m, twins[0], |b, _, p| body(b, p[0])).unwrap();
    address_of(m, early_code, twins[1]);
    let early_data = table(m, "early_data", &[twins[2]]);
    for &t in &twins[1..] {
        define(m, t, |b, _, p| {
            // Another numbering, the same function.
            b.create_block();
            body(b, p[0])
        })
        .unwrap();
    }
    flush(m);
    for i in 0..4 {
        address_of(m, late_code[i], twins[i]);
        symbol_of(m, late_symbol[i], twins[i]);
    }
    let late_data = table(m, "late_data", &twins);
    define(m, compare, |b, m, _| {
        let r0 = m.declare_func_in_func(twins[0], b.func);
        let r3 = m.declare_func_in_func(twins[3], b.func);
        let a0 = b.ins().func_addr(I64, r0);
        let a3 = b.ins().func_addr(I64, r3);
        let eq = b.ins().icmp(IntCC::Equal, a0, a3);
        let eq = b.ins().uextend(I64, eq);
        b.ins().return_(&[eq]);
    })
    .unwrap();
    Ids {
        twins,
        early_code,
        early_data,
        late_code,
        late_symbol,
        late_data,
        compare,
    }
}

/// Every address obtained for each twin, after finalizing: per twin, a
/// list of (how, address). Also the result of `compare`.
fn addresses(
    get_function: &dyn Fn(FuncId) -> *const u8,
    get_address: &dyn Fn(FuncId) -> *const u8,
    get_data: &dyn Fn(DataId) -> (*const u8, usize),
    ids: &Ids,
) -> ([Vec<(&'static str, usize)>; 4], i64) {
    let read = |data: DataId, i: usize| {
        let (ptr, size) = get_data(data);
        assert!(size >= 8 * (i + 1));
        // SAFETY: a finalized data object of at least 8 * (i + 1) bytes.
        unsafe { std::ptr::read_unaligned((ptr as *const usize).add(i)) }
    };
    let mut all: [Vec<(&'static str, usize)>; 4] = Default::default();
    for (i, &t) in ids.twins.iter().enumerate() {
        let ways = &mut all[i];
        ways.push(("get_finalized_function", get_function(t) as usize));
        ways.push(("get_address", get_address(t) as usize));
        ways.push((
            "func_addr",
            call1(get_function(ids.late_code[i]), 0) as usize,
        ));
        ways.push((
            "symbol_value",
            call1(get_function(ids.late_symbol[i]), 0) as usize,
        ));
        ways.push(("data", read(ids.late_data, i)));
        assert_eq!(call1(get_function(t), 3), 23, "twin {i} runs");
    }
    all[1].push((
        "func_addr before",
        call1(get_function(ids.early_code), 0) as usize,
    ));
    all[2].push(("data before", read(ids.early_data, 0)));
    (all, call1(get_function(ids.compare), 0))
}

/// Options under test: every entry of `DedupOptions::ALL`, the default,
/// and shared addresses in both modes without check mode.
fn all_options() -> Vec<DedupOptions> {
    let mut all = DedupOptions::ALL.to_vec();
    all.push(DedupOptions::default());
    for mode in [Mode::Eager, Mode::Batch] {
        all.push(
            DedupOptions::default()
                .with_mode(mode)
                .with_distinct_addresses(false),
        );
    }
    all
}

#[test]
fn every_way_of_getting_an_address_agrees() {
    let mut plain = jit();
    let ids = program(&mut plain, |_| {});
    plain.finalize_definitions().unwrap();
    let (plain_ways, plain_compare) = addresses(
        &|id| plain.get_finalized_function(id),
        &|id| plain.get_address(&ModuleRelocTarget::user(0, id.as_u32())),
        &|id| plain.get_finalized_data(id),
        &ids,
    );
    assert_eq!(plain_compare, 0);
    for options in all_options() {
        let mut d = DedupModule::wrap(jit(), options);
        let ids = program(&mut d, |d| d.flush().unwrap());
        d.finalize_definitions().unwrap();
        let (ways, compare) = addresses(
            &|id| d.get_finalized_function(id),
            &|id| d.get_address(&ModuleRelocTarget::user(0, id.as_u32())),
            &|id| d.get_finalized_data(id),
            &ids,
        );
        let own: Vec<usize> = ways.iter().map(|w| w[0].1).collect();
        for (i, ways) in ways.iter().enumerate() {
            for &(how, address) in ways {
                assert_eq!(
                    address, own[i],
                    "{options:?}: twin {i}'s address by {how} is not its address"
                );
            }
        }
        assert_eq!(d.canonical(ids.twins[3]), Some(ids.twins[0]), "{options:?}");
        // Which twins share t0's address: none by default; with shared
        // addresses, those whose own address was not compiled into
        // anything when they were defined (in batch mode, the code taking
        // t1's address is compiled in the flush that finds t1 a duplicate,
        // after its reference is rewritten; the data is defined at once).
        let shares = |i: usize| {
            !options.distinct_addresses
                && match i {
                    1 => options.mode == Mode::Batch,
                    2 => false,
                    _ => true,
                }
        };
        for i in 1..4 {
            assert_eq!(own[i] == own[0], shares(i), "{options:?}: twin {i}");
        }
        let distinct: std::collections::HashSet<usize> = own.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            4 - (1..4).filter(|&i| shares(i)).count(),
            "{options:?}"
        );
        assert_eq!(compare, i64::from(shares(3)), "{options:?}");
        if options.distinct_addresses {
            assert_eq!(compare, plain_compare, "{options:?}: as plain Cranelift");
        }
    }
    assert!(
        plain_ways
            .iter()
            .all(|w| w.iter().all(|&(_, a)| a == w[0].1))
    );
}

/// Twins whose addresses are compared, and twins that compare each
/// other's addresses, behave as in plain Cranelift under the default
/// options.
#[test]
fn twins_comparing_addresses_behave_as_plain_cranelift_by_default() {
    /// Defines `a` and `b` (twins), `p` and `q` ("is my argument my twin's
    /// address?"), `r` (`&a == &b`) and `s` (`&p == &q`).
    fn define_all<M: Module>(m: &mut M) -> Vec<FuncId> {
        let mut sig = m.make_signature();
        sig.params.push(ir::AbiParam::new(I64));
        sig.returns.push(ir::AbiParam::new(I64));
        let ids: Vec<FuncId> = ["a", "b", "p", "q", "r", "s"]
            .iter()
            .map(|n| m.declare_function(n, Linkage::Local, &sig).unwrap())
            .collect();
        for id in [ids[0], ids[1]] {
            define(m, id, |b, _, p| body(b, p[0])).unwrap();
        }
        let compare = |b: &mut FunctionBuilder, m: &mut M, x: FuncId, y: ir::Value| {
            let r = m.declare_func_in_func(x, b.func);
            let a = b.ins().func_addr(I64, r);
            let eq = b.ins().icmp(IntCC::Equal, a, y);
            let eq = b.ins().uextend(I64, eq);
            b.ins().return_(&[eq]);
        };
        for (me, twin) in [(ids[2], ids[3]), (ids[3], ids[2])] {
            define(m, me, |b, m, p| compare(b, m, twin, p[0])).unwrap();
        }
        for (me, x, y) in [(ids[4], ids[0], ids[1]), (ids[5], ids[2], ids[3])] {
            define(m, me, |b, m, _| {
                let r = m.declare_func_in_func(y, b.func);
                let ya = b.ins().func_addr(I64, r);
                compare(b, m, x, ya)
            })
            .unwrap();
        }
        ids
    }
    let results = |get: &dyn Fn(FuncId) -> *const u8, ids: &[FuncId]| {
        let [a, b, p, q, r, s] = [0, 1, 2, 3, 4, 5].map(|i| get(ids[i]));
        vec![
            i64::from(a == b),
            call1(r, 0),
            call1(p, q as i64),
            call1(q, p as i64),
            call1(p, p as i64),
            call1(s, 0),
            i64::from(p == q),
        ]
    };
    let mut plain = jit();
    let ids = define_all(&mut plain);
    plain.finalize_definitions().unwrap();
    let expected = results(&|id| plain.get_finalized_function(id), &ids);
    assert_eq!(expected, [0, 0, 1, 1, 0, 0, 0]);
    for mode in [Mode::Eager, Mode::Batch] {
        let options = DedupOptions::default().with_mode(mode);
        let mut d = DedupModule::wrap(jit(), options);
        let ids = define_all(&mut d);
        d.finalize_definitions().unwrap();
        let got = results(&|id| d.get_finalized_function(id), &ids);
        assert_eq!(got, expected, "{options:?}");
        assert_eq!(d.canonical(ids[1]), Some(ids[0]), "a and b are merged");
    }
}

/// In an object file, a duplicate's symbol is on its canonical function's
/// code only when it shares the address; one whose address was taken
/// before stays on its trampoline.
#[test]
fn object_symbols_follow_the_same_rule() {
    for distinct_addresses in [true, false] {
        let isa = jitfold::isa::isa_by_name("x86_64", jitfold::isa::flags(&[]).unwrap()).unwrap();
        let builder = ObjectBuilder::new(isa, "addresses", default_libcall_names()).unwrap();
        let options = DedupOptions::default().with_distinct_addresses(distinct_addresses);
        let mut d = DedupModule::wrap(ObjectModule::new(builder), options);
        let ids = program(&mut d, |_| {});
        let product = d.finish();
        let place = |id: FuncId| {
            let s = product.object.symbol(product.function_symbol(id));
            (s.section, s.value)
        };
        let t = ids.twins;
        assert_eq!(place(t[3]) == place(t[0]), !distinct_addresses);
        assert_ne!(place(t[1]), place(t[0]), "address taken by code before");
        assert_ne!(place(t[2]), place(t[0]), "address taken by data before");
    }
}

/// `functions_at` maps code back to every id whose code runs there: the
/// canonical function's code to it and all its duplicates, a trampoline to
/// its duplicate, reused code to its own id; nothing else maps anywhere.
#[test]
fn functions_at_names_every_id_whose_code_runs_there() {
    for options in all_options() {
        let mut d = DedupModule::wrap(jit(), options);
        let ids = program(&mut d, |d| d.flush().unwrap());
        d.finalize_definitions().unwrap();
        let t = ids.twins;
        let canonical_code = d.get_finalized_function(t[0]);
        let mut at_canonical = d.functions_at(canonical_code.wrapping_add(1));
        at_canonical.sort();
        assert_eq!(at_canonical, t.to_vec(), "{options:?}");
        for (i, &id) in t.iter().enumerate() {
            let found = d.functions_at(d.get_finalized_function(id));
            assert!(found.contains(&id), "{options:?}: twin {i}: {found:?}");
            if d.address_of(id) == Some(id) && i > 0 {
                assert_eq!(found, [id], "{options:?}: twin {i}'s trampoline");
            }
        }
        // Every id is found at its address, with only ids of its class
        // (with shared addresses, c3 and s3 are duplicates of c0 and s0).
        let others = [ids.early_code, ids.compare];
        let everything = ids.late_code.iter().chain(&ids.late_symbol).chain(&others);
        for &id in everything {
            let found = d.functions_at(d.get_finalized_function(id));
            assert!(found.contains(&id), "{options:?}: {found:?}");
            for other in found {
                assert_eq!(d.canonical(other), d.canonical(id), "{options:?}");
            }
        }
        let (table, _) = d.get_finalized_data(ids.late_data);
        assert!(d.functions_at(table).is_empty());
        assert!(d.functions_at(std::ptr::null()).is_empty());
    }
}

/// With `log2_min_function_alignment`, every function Cranelift compiles is
/// aligned to it; a duplicate with its own address (a trampoline) must be
/// too, as its own compile would have been.
#[test]
fn a_duplicate_is_as_aligned_as_the_flags_ask() {
    let flags = [("log2_min_function_alignment", "6")];
    for options in [DedupOptions::eager(), DedupOptions::batch()] {
        let builder = JITBuilder::with_flags(&flags, default_libcall_names()).unwrap();
        let mut d = DedupModule::wrap(JITModule::new(builder), options);
        let ids: Vec<FuncId> = (0..8)
            .map(|i| {
                let id = declare(&mut d, &format!("f{i}"), CallConv::SystemV);
                define(&mut d, id, |b, _, p| body(b, p[0])).unwrap();
                id
            })
            .collect();
        d.flush().unwrap();
        d.finalize_definitions().unwrap();
        assert_eq!(d.stats().compiled, 1, "{options}");
        for &id in &ids {
            let code = d.get_finalized_function(id);
            assert_eq!(code as usize % 64, 0, "{options}: {id}");
            assert_eq!(call1(code, 3), 23, "{options}: {id}");
        }
    }
}

/// Batch mode with shared addresses: `d` is a copy of `q`, `x` returns the
/// address of `d` and `z` that of `q`, all in one flush. Each returns the
/// address its own body names, the one `get_finalized_function` gives: `x`
/// is not merged with `z` on the strength of `d` sharing `q`'s address,
/// since `x` uses `d`'s address (its own from then on).
#[test]
fn a_function_taking_a_planned_duplicates_address_gets_that_address() {
    for options in all_options() {
        if options.mode != Mode::Batch {
            continue;
        }
        let mut m = DedupModule::wrap(jit(), options);
        let [q, d, x, z] = ["q", "d", "x", "z"].map(|n| declare(&mut m, n, CallConv::SystemV));
        for f in [q, d] {
            define(&mut m, f, |b, _, p| body(b, p[0])).unwrap();
        }
        address_of(&mut m, x, d);
        address_of(&mut m, z, q);
        m.finalize_definitions().unwrap();
        let entry = |id| m.get_finalized_function(id) as i64;
        let returned = |id| call1(m.get_finalized_function(id), 0);
        assert_eq!(returned(x), entry(d), "{options:?}");
        assert_eq!(returned(z), entry(q), "{options:?}");
        assert_eq!(call1(m.get_finalized_function(d), 3), 23);
    }
}
