//! Call-graph merging: recursive and mutually recursive twins merge in batch
//! mode, functions that differ anywhere in a cycle do not, and functions
//! whose own address is part of their result keep their identity. Every
//! function is called through plain `JITModule` and through jitfold, and
//! the results must be equal.

use crate::common::build::{call1, define, emit_call};
use cranelift_codegen::ir::{self, AbiParam, InstBuilder, condcodes::IntCC, types::I64};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitfold::{DedupModule, DedupOptions, Mode};

fn jit() -> JITModule {
    JITModule::new(
        JITBuilder::with_flags(&[("opt_level", "speed")], default_libcall_names()).unwrap(),
    )
}

/// `f(n) = n <= 0 ? base : combine(callee(n - 1), n)`, where combine is
/// `r + k` or `r * k` (`multiply`), with value numbers shifted when
/// `renumbered`.
#[derive(Clone, Copy)]
struct Step {
    callee: FuncId,
    base: i64,
    k: i64,
    multiply: bool,
    renumbered: bool,
}

fn step<M: Module>(b: &mut FunctionBuilder, m: &mut M, n: ir::Value, s: Step) {
    if s.renumbered {
        let dead = b.ins().iconst(I64, 1234);
        let inst = b.func.dfg.value_def(dead).unwrap_inst();
        b.func.layout.remove_inst(inst);
    }
    let recurse = b.create_block();
    let done = b.create_block();
    b.append_block_param(done, I64);
    let base = b.ins().iconst(I64, s.base);
    let stop = b.ins().icmp_imm_s(IntCC::SignedLessThanOrEqual, n, 0);
    b.ins().brif(stop, done, &[base.into()], recurse, &[]);
    b.switch_to_block(recurse);
    let n1 = b.ins().iadd_imm_s(n, -1);
    let r = emit_call(b, m, s.callee, n1);
    let r = if s.multiply {
        b.ins().imul_imm_s(r, s.k)
    } else {
        b.ins().iadd_imm_s(r, s.k)
    };
    let r = b.ins().iadd(r, n);
    b.ins().jump(done, &[r.into()]);
    b.switch_to_block(done);
    let out = b.block_params(done)[0];
    b.ins().return_(&[out]);
}

/// The functions of one program, by role.
struct Program {
    /// Self-recursive twins.
    fact: [FuncId; 2],
    /// Two twin 2-cycles, and a third whose second member adds 3 instead
    /// of 2.
    ping: [FuncId; 3],
    pong: [FuncId; 3],
    /// Two twin 3-cycles.
    cycle3: [[FuncId; 3]; 2],
    /// `callers[0]` calls `twins[0]`, `callers[1]` calls `twins[1]`, and
    /// the twins are exact duplicates: the callers merge.
    twins: [FuncId; 2],
    callers: [FuncId; 2],
    /// Each returns its own address at the bottom of a self-recursion.
    whoami: [FuncId; 2],
}

/// Declares local functions of signature `(i64) -> i64`, named `prefix`
/// and a number, one per call.
fn declarer<M: Module>(m: &M, prefix: &'static str) -> impl FnMut(&mut M) -> FuncId + use<M> {
    let mut sig = m.make_signature();
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I64));
    let mut next = 0;
    move |m: &mut M| {
        next += 1;
        m.declare_function(&format!("{prefix}{next}"), Linkage::Local, &sig)
            .unwrap()
    }
}

fn build<M: Module>(m: &mut M) -> Program {
    let mut declare = declarer(m, "f");
    let fact = [declare(m), declare(m)];
    let ping = [declare(m), declare(m), declare(m)];
    let pong = [declare(m), declare(m), declare(m)];
    let cycle3 = [
        [declare(m), declare(m), declare(m)],
        [declare(m), declare(m), declare(m)],
    ];
    let twins = [declare(m), declare(m)];
    let callers = [declare(m), declare(m)];
    let whoami = [declare(m), declare(m)];

    let plain = |callee, base, k, renumbered| Step {
        callee,
        base,
        k,
        multiply: false,
        renumbered,
    };
    for (i, &f) in fact.iter().enumerate() {
        let s = Step {
            multiply: true,
            ..plain(f, 1, 1, i == 1)
        };
        define(m, f, |b, m, p| step(b, m, p[0], s)).unwrap();
    }
    for i in 0..3 {
        let (pi, po) = (ping[i], pong[i]);
        define(m, pi, |b, m, p| step(b, m, p[0], plain(po, 0, 1, i == 1))).unwrap();
        let k = if i == 2 { 3 } else { 2 };
        define(m, po, |b, m, p| step(b, m, p[0], plain(pi, 5, k, false))).unwrap();
    }
    for (c, members) in cycle3.iter().enumerate() {
        for j in 0..3 {
            let s = plain(members[(j + 1) % 3], j as i64, 10 + j as i64, c == 1);
            define(m, members[j], |b, m, p| step(b, m, p[0], s)).unwrap();
        }
    }
    for (i, &t) in twins.iter().enumerate() {
        define(m, t, |b, _, p| {
            if i == 1 {
                let dead = b.ins().iconst(I64, 77);
                let inst = b.func.dfg.value_def(dead).unwrap_inst();
                b.func.layout.remove_inst(inst);
            }
            let r = b.ins().imul_imm_s(p[0], 7);
            let r = b.ins().iadd_imm_s(r, 3);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    for (&caller, &callee) in callers.iter().zip(&twins) {
        // `callers[0]` is defined before its callee's twin exists.
        define(m, caller, |b, m, p| {
            step(b, m, p[0], plain(callee, 0, 1, false))
        })
        .unwrap();
    }
    for &w in &whoami {
        define(m, w, |b, m, p| {
            let recurse = b.create_block();
            let done = b.create_block();
            b.append_block_param(done, I64);
            let me = m.declare_func_in_func(w, b.func);
            let addr = b.ins().func_addr(I64, me);
            let stop = b.ins().icmp_imm_s(IntCC::SignedLessThanOrEqual, p[0], 0);
            b.ins().brif(stop, done, &[addr.into()], recurse, &[]);
            b.switch_to_block(recurse);
            let n1 = b.ins().iadd_imm_s(p[0], -1);
            let call = b.ins().call(me, &[n1]);
            let r = b.inst_results(call)[0];
            b.ins().jump(done, &[r.into()]);
            b.switch_to_block(done);
            let out = b.block_params(done)[0];
            b.ins().return_(&[out]);
        })
        .unwrap();
    }
    Program {
        fact,
        ping,
        pong,
        cycle3,
        twins,
        callers,
        whoami,
    }
}

impl Program {
    /// Every function but `whoami`, whose results are addresses.
    fn computing(&self) -> Vec<FuncId> {
        let mut ids = self.fact.to_vec();
        ids.extend(self.ping);
        ids.extend(self.pong);
        ids.extend(self.cycle3.iter().flatten());
        ids.extend(self.twins);
        ids.extend(self.callers);
        ids
    }
}

fn results(p: &Program, get: impl Fn(FuncId) -> *const u8) -> Vec<i64> {
    p.computing()
        .into_iter()
        .flat_map(|id| [0, 1, 2, 5, 9].map(|n| call1(get(id), n)))
        .collect()
}

#[test]
fn recursive_twins_merge_in_batch_mode_and_compute_the_same() {
    let mut plain = jit();
    let p = build(&mut plain);
    plain.finalize_definitions().unwrap();
    let expected = results(&p, |id| plain.get_finalized_function(id));
    // The third ping/pong pair really computes something else.
    assert_ne!(
        call1(plain.get_finalized_function(p.ping[0]), 5),
        call1(plain.get_finalized_function(p.ping[2]), 5)
    );
    for options in DedupOptions::ALL {
        let mut d = DedupModule::wrap(jit(), options);
        let q = build(&mut d);
        d.finalize_definitions().unwrap();
        let got = results(&q, |id| d.get_finalized_function(id));
        assert_eq!(got, expected, "{options:?}");
        // Each function returns its own address, merged or not.
        for &w in &q.whoami {
            let ptr = d.get_finalized_function(w);
            assert_eq!(call1(ptr, 3), ptr as i64, "{options:?}");
        }
        let canonical = |id| d.canonical(id).unwrap();
        // Merging beyond exact duplicates is batch mode's refinement.
        if options.mode == Mode::Batch {
            assert_eq!(canonical(q.fact[1]), q.fact[0], "{options:?}");
            assert_eq!(canonical(q.ping[1]), q.ping[0]);
            assert_eq!(canonical(q.pong[1]), q.pong[0]);
            for j in 0..3 {
                assert_eq!(canonical(q.cycle3[1][j]), q.cycle3[0][j]);
            }
            assert!(d.stats().refine_rounds >= 2, "{:?}", d.stats());
        }
        // Always: exact twins, and callers of twins (canonicalized).
        assert_eq!(canonical(q.twins[1]), q.twins[0]);
        assert_eq!(
            canonical(q.callers[1]),
            canonical(q.callers[0]),
            "{options:?}"
        );
        // Never: the cycle that differs in one member, in neither member;
        // the functions whose address is their result.
        assert_eq!(canonical(q.ping[2]), q.ping[2], "{options:?}");
        assert_eq!(canonical(q.pong[2]), q.pong[2]);
        assert_eq!(canonical(q.whoami[1]), q.whoami[1]);
        // Members of different classes stay apart.
        assert_ne!(canonical(q.ping[0]), canonical(q.pong[0]));
        assert_ne!(canonical(q.cycle3[0][0]), canonical(q.cycle3[0][1]));
    }
}

/// Eager mode: `f`, `g` (a twin of `f`) and callers that call them by name,
/// defined in the order the test gives.
struct Late {
    f: FuncId,
    g: FuncId,
    /// Calls `g` (defined before `g`).
    a: FuncId,
    /// Calls `f`.
    b: FuncId,
    /// Call `a` and `b`.
    c: FuncId,
    d: FuncId,
}

fn late<M: Module>(m: &mut M, b_before_g: bool) -> Late {
    let mut sig = m.make_signature();
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I64));
    let mut declare = |name: &str| m.declare_function(name, Linkage::Local, &sig).unwrap();
    let ids = Late {
        f: declare("f"),
        g: declare("g"),
        a: declare("a"),
        b: declare("b"),
        c: declare("c"),
        d: declare("d"),
    };
    let leaf = |b: &mut FunctionBuilder, x: ir::Value| {
        let r = b.ins().imul_imm_s(x, 5);
        let r = b.ins().iadd_imm_s(r, 2);
        b.ins().return_(&[r]);
    };
    let call_plus_one = |callee: FuncId| {
        move |b: &mut FunctionBuilder, m: &mut M, p: &[ir::Value]| {
            step(
                b,
                m,
                p[0],
                Step {
                    callee,
                    base: 7,
                    k: 1,
                    multiply: false,
                    renumbered: false,
                },
            )
        }
    };
    define(m, ids.f, |b, _, p| leaf(b, p[0])).unwrap();
    define(m, ids.a, call_plus_one(ids.g)).unwrap();
    if b_before_g {
        define(m, ids.b, call_plus_one(ids.f)).unwrap();
    }
    define(m, ids.g, |b, _, p| leaf(b, p[0])).unwrap();
    if !b_before_g {
        define(m, ids.b, call_plus_one(ids.f)).unwrap();
    }
    define(m, ids.c, call_plus_one(ids.a)).unwrap();
    define(m, ids.d, call_plus_one(ids.b)).unwrap();
    ids
}

impl Late {
    fn all(&self) -> [FuncId; 6] {
        [self.f, self.g, self.a, self.b, self.c, self.d]
    }
}

#[test]
fn eager_mode_joins_classes_when_a_callee_turns_out_to_be_a_duplicate() {
    for b_before_g in [false, true] {
        let mut plain = jit();
        let p = late(&mut plain, b_before_g);
        plain.finalize_definitions().unwrap();
        let expected: Vec<i64> = p
            .all()
            .iter()
            .flat_map(|&id| [0, 3, 8].map(|n| call1(plain.get_finalized_function(id), n)))
            .collect();
        for distinct_addresses in [false, true] {
            let options = DedupOptions::default()
                .with_mode(Mode::Eager)
                .with_distinct_addresses(distinct_addresses)
                .with_check(true);
            let mut d = DedupModule::wrap(jit(), options);
            let q = late(&mut d, b_before_g);
            d.finalize_definitions().unwrap();
            let got: Vec<i64> = q
                .all()
                .iter()
                .flat_map(|&id| [0, 3, 8].map(|n| call1(d.get_finalized_function(id), n)))
                .collect();
            assert_eq!(got, expected, "{options:?}, b before g: {b_before_g}");
            let canonical = |id| d.canonical(id).unwrap();
            assert_eq!(canonical(q.g), q.f);
            assert!(d.stats().joined >= 1, "{:?}", d.stats());
            if b_before_g {
                // a and b were both compiled before g was known to be f's
                // twin: both keep their entry points, and calls compiled
                // later go to b, so c and d are one class.
                assert_eq!(canonical(q.a), q.a);
                assert_eq!(canonical(q.b), q.b);
                assert_ne!(d.get_finalized_function(q.a), d.get_finalized_function(q.b));
                assert_eq!(canonical(q.d), q.c, "{options:?}");
            } else {
                // a's class learned the key "calls f", so b hits it.
                assert_eq!(canonical(q.b), q.a, "{options:?}");
                assert_eq!(canonical(q.d), q.c, "{options:?}");
            }
        }
    }
}

/// `f(n) = n <= 0 ? 1 : first(n - 1) + 3 * second(n - 2)`.
fn calls_two<M: Module>(m: &mut M, id: FuncId, first: FuncId, second: FuncId) {
    define(m, id, |b, m, p| {
        let n = p[0];
        let recurse = b.create_block();
        let done = b.create_block();
        b.append_block_param(done, I64);
        let one = b.ins().iconst(I64, 1);
        let stop = b.ins().icmp_imm_s(IntCC::SignedLessThanOrEqual, n, 0);
        b.ins().brif(stop, done, &[one.into()], recurse, &[]);
        b.switch_to_block(recurse);
        let n1 = b.ins().iadd_imm_s(n, -1);
        let r1 = emit_call(b, m, first, n1);
        let n2 = b.ins().iadd_imm_s(n, -2);
        let r2 = emit_call(b, m, second, n2);
        let r2 = b.ins().imul_imm_s(r2, 3);
        let r = b.ins().iadd(r1, r2);
        b.ins().jump(done, &[r.into()]);
        b.switch_to_block(done);
        let out = b.block_params(done)[0];
        b.ins().return_(&[out]);
    })
    .unwrap();
}

/// Functions that call two callees of one class, by role.
struct TwoCallees {
    /// Self-recursive twins, and a function like them with another
    /// constant.
    twins: [FuncId; 2],
    other: FuncId,
    /// Call `twins[0]` twice; `twins[0]` then `twins[1]`; `twins[1]` then
    /// `twins[0]`; `twins[0]` then `other`.
    same: [FuncId; 3],
    differs: FuncId,
    /// `fib[0]` calls itself twice, `fib[1]` calls `fib[0]` then itself,
    /// `fib[2]` calls `fib[1]` then `fib[0]`: one function three times.
    fib: [FuncId; 3],
}

impl TwoCallees {
    fn all(&self) -> Vec<FuncId> {
        let mut ids = self.twins.to_vec();
        ids.push(self.other);
        ids.extend(self.same);
        ids.push(self.differs);
        ids.extend(self.fib);
        ids
    }
}

fn build_two_callees<M: Module>(m: &mut M) -> TwoCallees {
    let mut declare = declarer(m, "t");
    let twins = [declare(m), declare(m)];
    let other = declare(m);
    let same = [declare(m), declare(m), declare(m)];
    let differs = declare(m);
    let fib = [declare(m), declare(m), declare(m)];
    for (f, k) in [(twins[0], 2), (twins[1], 2), (other, 5)] {
        let s = Step {
            callee: f,
            base: 1,
            k,
            multiply: true,
            renumbered: false,
        };
        define(m, f, |b, m, p| step(b, m, p[0], s)).unwrap();
    }
    let [t0, t1] = twins;
    for (id, (first, second)) in same.into_iter().zip([(t0, t0), (t0, t1), (t1, t0)]) {
        calls_two(m, id, first, second);
    }
    calls_two(m, differs, t0, other);
    calls_two(m, fib[0], fib[0], fib[0]);
    calls_two(m, fib[1], fib[0], fib[1]);
    calls_two(m, fib[2], fib[1], fib[0]);
    TwoCallees {
        twins,
        other,
        same,
        differs,
        fib,
    }
}

/// A function that calls `g0` and then its twin `g1` is the function that
/// calls `g0` twice (refinement counts callees of one class as one), and
/// so is one that calls itself and then a twin of itself; merged, every
/// function computes what plain Cranelift's does.
#[test]
fn callers_of_two_twins_merge_with_callers_of_one() {
    let mut plain = jit();
    let p = build_two_callees(&mut plain);
    plain.finalize_definitions().unwrap();
    let run = |ids: &[FuncId], get: &dyn Fn(FuncId) -> *const u8| -> Vec<i64> {
        ids.iter()
            .flat_map(|&id| [0, 1, 2, 5, 9].map(|n| call1(get(id), n)))
            .collect()
    };
    let expected = run(&p.all(), &|id| plain.get_finalized_function(id));
    // `differs` really computes something else.
    assert_ne!(
        call1(plain.get_finalized_function(p.same[0]), 6),
        call1(plain.get_finalized_function(p.differs), 6)
    );
    for options in DedupOptions::ALL {
        let mut d = DedupModule::wrap(jit(), options);
        let q = build_two_callees(&mut d);
        d.finalize_definitions().unwrap();
        let got = run(&q.all(), &|id| d.get_finalized_function(id));
        assert_eq!(got, expected, "{options:?}");
        let canonical = |id| d.canonical(id).unwrap();
        assert_ne!(canonical(q.differs), canonical(q.same[0]), "{options:?}");
        assert_ne!(canonical(q.other), canonical(q.twins[0]), "{options:?}");
        if options.mode == Mode::Batch {
            assert_eq!(canonical(q.twins[1]), q.twins[0], "{options:?}");
            for &s in &q.same[1..] {
                assert_eq!(canonical(s), q.same[0], "{options:?}");
            }
            for &f in &q.fib[1..] {
                assert_eq!(canonical(f), q.fib[0], "{options:?}");
            }
        }
    }
}
