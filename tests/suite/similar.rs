//! Execution tests of similar-function merging ([`jitfold::similar`]):
//! functions that differ only in integer constants are merged into one
//! parameterized body behind thunks, and the thunks must return what the
//! originals return (both JIT-compiled with plain `JITModule`); functions
//! that differ in anything else must not share a shape.

use cranelift_codegen::ir::{Function, InstBuilder, UserExternalName, UserFuncName, types::I64};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitfold::Fingerprinter;
use jitfold::similar::{self, Decision, ParamKind, ShapeOf, Shaper, SimilarOptions};

fn jit() -> JITModule {
    // `return_call` on x86-64 needs frame pointers.
    let b = JITBuilder::with_flags(
        &[("opt_level", "speed"), ("preserve_frame_pointers", "true")],
        default_libcall_names(),
    )
    .unwrap();
    JITModule::new(b)
}

fn parse(text: &str) -> Function {
    let mut funcs = crate::common::parse_valid(text);
    assert_eq!(funcs.len(), 1);
    funcs.remove(0)
}

fn shape_of(func: &Function) -> ShapeOf {
    let mut walker = Fingerprinter::new();
    let walk = walker.walk(func);
    Shaper::new().shape(&walk, func)
}

/// Defines `id` in `m` as `func`.
fn define(m: &mut JITModule, id: FuncId, mut func: Function) {
    func.name = UserFuncName::user(0, id.as_u32());
    let mut ctx = m.make_context();
    ctx.func = func;
    m.define_function(id, &mut ctx).unwrap();
}

fn declare(m: &mut JITModule, name: &str, func: &Function) -> FuncId {
    m.declare_function(name, Linkage::Local, &func.signature)
        .unwrap()
}

/// A `system_v` function `(i64, i64) -> i64` that calls `callee` (of that
/// signature in any convention) and returns its result: what the host
/// calls.
fn entry(m: &mut JITModule, name: &str, callee: FuncId) -> FuncId {
    let mut sig = m.make_signature();
    sig.call_conv = CallConv::SystemV;
    sig.params
        .extend([cranelift_codegen::ir::AbiParam::new(I64); 2]);
    sig.returns.push(cranelift_codegen::ir::AbiParam::new(I64));
    let id = m.declare_function(name, Linkage::Local, &sig).unwrap();
    let mut func = Function::with_name_signature(UserFuncName::user(0, id.as_u32()), sig);
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut fctx);
    let block = b.create_block();
    b.append_block_params_for_function_params(block);
    b.switch_to_block(block);
    b.seal_block(block);
    let args = b.block_params(block).to_vec();
    let callee = m.declare_func_in_func(callee, b.func);
    let call = b.ins().call(callee, &args);
    let result = b.inst_results(call)[0];
    b.ins().return_(&[result]);
    b.finalize(m.target_config());
    let mut ctx = m.make_context();
    ctx.func = func;
    m.define_function(id, &mut ctx).unwrap();
    id
}

fn call(m: &JITModule, id: FuncId, x: i64, y: i64) -> i64 {
    let ptr = m.get_finalized_function(id);
    // SAFETY: every entry is `system_v (i64, i64) -> i64`, the host's C
    // convention on the x86-64 and aarch64 Linux hosts these tests run on,
    // and the module was finalized.
    let f: extern "C" fn(i64, i64) -> i64 = unsafe { std::mem::transmute(ptr) };
    f(x, y)
}

const INPUTS: [(i64, i64); 8] = [
    (0, 0),
    // -0.0 and a negative NaN with a payload, as floats.
    (i64::MIN, i64::MIN),
    (-1, 0x7fc0_0001),
    (1, -1),
    (7, 3),
    (-100, 55),
    (i64::MAX, 2),
    (0x1234_5678_9abc, -0x77),
];

/// Merges `texts` (functions `(i64, i64) -> i64` of one shape), JITs the
/// originals and the body with its thunks, calls each on [`INPUTS`] and
/// checks the results are equal. Returns the number of parameters.
fn merged_results_agree(texts: &[String]) -> usize {
    merged_results_agree_with(&[], texts)
}

/// [`merged_results_agree`] for members that call functions: `callees` are
/// defined first, as `u0:0` to `u0:{k-1}` (in both modules), and member
/// `i` is `u0:{k+i}` (in the merged module, its thunk).
fn merged_results_agree_with(callees: &[String], texts: &[String]) -> usize {
    merged_results_agree_with_data(&[], callees, texts)
}

/// [`merged_results_agree_with`] with data objects: `data[i]` is an
/// 8-byte object holding that value, `u1:{i}` (in both modules).
fn merged_results_agree_with_data(data: &[i64], callees: &[String], texts: &[String]) -> usize {
    let funcs: Vec<Function> = texts.iter().map(|t| parse(t)).collect();
    let shapes: Vec<ShapeOf> = funcs.iter().map(shape_of).collect();
    for s in &shapes[1..] {
        assert_eq!(s.shape, shapes[0].shape, "one shape");
    }
    let values: Vec<&[similar::ParamValue]> = shapes.iter().map(|s| &s.values[..]).collect();
    let derived = similar::derive(&values).unwrap();
    let body = similar::merged_body(&funcs[0], &shapes[0].sites, &derived).unwrap();

    let callees: Vec<Function> = callees.iter().map(|t| parse(t)).collect();
    let define_callees = |m: &mut JITModule| {
        for (i, value) in data.iter().enumerate() {
            let id = m
                .declare_data(&format!("d{i}"), Linkage::Local, false, false)
                .unwrap();
            assert_eq!(id.as_u32() as usize, i);
            let mut object = cranelift_module::DataDescription::new();
            object.define(value.to_le_bytes().into());
            m.define_data(id, &object).unwrap();
        }
        for (i, c) in callees.iter().enumerate() {
            let id = declare(m, &format!("c{i}"), c);
            assert_eq!(id.as_u32() as usize, i);
            define(m, id, c.clone());
        }
    };
    let declare_members = |m: &mut JITModule, prefix: &str| -> Vec<FuncId> {
        let ids: Vec<FuncId> = (funcs.iter().enumerate())
            .map(|(i, f)| declare(m, &format!("{prefix}{i}"), f))
            .collect();
        assert!(
            ids.iter()
                .enumerate()
                .all(|(i, id)| id.as_u32() as usize == callees.len() + i)
        );
        ids
    };

    let mut plain = jit();
    define_callees(&mut plain);
    let ids = declare_members(&mut plain, "f");
    let mut originals = Vec::new();
    for (i, (f, &id)) in funcs.iter().zip(&ids).enumerate() {
        define(&mut plain, id, f.clone());
        originals.push(entry(&mut plain, &format!("e{i}"), id));
    }
    plain.finalize_definitions().unwrap();

    let mut merged = jit();
    define_callees(&mut merged);
    let ids = declare_members(&mut merged, "t");
    let body_id = declare(&mut merged, "body", &body);
    define(&mut merged, body_id, body.clone());
    let mut thunks = Vec::new();
    for (i, (f, &id)) in funcs.iter().zip(&ids).enumerate() {
        let mut member = f.clone();
        member.name = UserFuncName::user(0, id.as_u32());
        let thunk = similar::thunk(
            merged.isa(),
            &member,
            UserExternalName::new(0, body_id.as_u32()),
            &body.signature,
            &similar::thunk_values(&derived, i),
        );
        define(&mut merged, id, thunk);
        thunks.push(entry(&mut merged, &format!("e{i}"), id));
    }
    merged.finalize_definitions().unwrap();

    for (i, (&o, &t)) in originals.iter().zip(&thunks).enumerate() {
        for (x, y) in INPUTS {
            assert_eq!(
                call(&plain, o, x, y),
                call(&merged, t, x, y),
                "member {i} on ({x}, {y})"
            );
        }
    }
    derived.params.len()
}

/// Integer constants in arithmetic, a compare, a select, a narrow type
/// and a stored value.
fn arithmetic(conv: &str, a: i64, b: i64, c: i8, d: i64) -> String {
    format!(
        "function %f(i64, i64) -> i64 {conv} {{
             ss0 = explicit_slot 8
         block0(v0: i64, v1: i64):
             v2 = iconst.i64 {a}
             v3 = iadd v0, v2
             v4 = iconst.i64 {b}
             v5 = imul v1, v4
             v6 = bxor v3, v5
             v7 = iconst.i8 {c}
             v8 = sextend.i64 v7
             v9 = icmp sgt v6, v8
             v10 = iconst.i64 {d}
             v11 = select v9, v10, v6
             v12 = iconst.i64 {d}
             v17 = stack_addr.i64 ss0
             store v12, v17
             v13 = load.i64 v17
             v14 = isub v11, v13
             v15 = iconst.i64 99
             v16 = iadd v14, v15
             return v16
         }}"
    )
}

#[test]
fn a_pair_differing_in_integer_constants_returns_its_own_results() {
    for conv in ["system_v", "tail"] {
        let params = merged_results_agree(&[
            arithmetic(conv, 3, 5, -7, 1000),
            arithmetic(conv, -3, 5, 100, -1),
        ]);
        // `b` and 99 are equal in both; `d` is two sites of one vector.
        assert_eq!(params, 3, "{conv}");
    }
}

/// Float constants (as raw bits) in arithmetic, a sign copy, a
/// promotion, and a stored value read back as an integer.
fn floats(conv: &str, a: &str, b: &str, c: &str, d: &str) -> String {
    format!(
        "function %f(i64, i64) -> i64 {conv} {{
             ss0 = explicit_slot 8
         block0(v0: i64, v1: i64):
             v2 = bitcast.f64 v0
             v3 = f64const {a}
             v4 = fadd v2, v3
             v5 = f64const {c}
             v6 = fmul v4, v5
             v7 = ireduce.i32 v1
             v8 = bitcast.f32 v7
             v9 = f32const {b}
             v10 = fcopysign v8, v9
             v11 = fpromote.f64 v10
             v12 = fadd v6, v11
             v13 = f64const {d}
             v14 = stack_addr.i64 ss0
             store v13, v14
             v15 = load.i64 v14
             v16 = bitcast.i64 v12
             v17 = bxor v16, v15
             return v17
         }}"
    )
}

#[test]
fn float_constants_are_passed_bit_exact() {
    for conv in ["system_v", "tail"] {
        let params = merged_results_agree(&[
            floats(conv, "0x1.8p1", "-0x0.0p0", "+NaN:0x1234", "+sNaN:0x1"),
            floats(conv, "-0x0.0p0", "0x0.0p0", "-NaN:0x5", "-sNaN:0x2"),
            floats(conv, "+Inf", "-NaN:0x7", "0x1.0p-1022", "0x1.0p0"),
        ]);
        assert_eq!(params, 4, "{conv}");
    }
}

#[test]
fn a_group_of_many_returns_each_members_results() {
    let texts: Vec<String> = (0..9)
        .map(|i: i64| {
            arithmetic(
                if i % 2 == 0 { "tail" } else { "system_v" },
                i * 1_000_003,
                -i,
                i as i8 * 13,
                i64::MIN + i,
            )
        })
        .collect();
    // Members of one shape share a convention: the two halves separately.
    let (even, odd): (Vec<_>, Vec<_>) =
        texts.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    for half in [even, odd] {
        let texts: Vec<String> = half.into_iter().map(|(_, t)| t).collect();
        assert_eq!(merged_results_agree(&texts), 4);
    }
}

#[test]
fn a_call_argument_and_a_block_argument_are_parameters() {
    let text = |c: i64, d: i64| {
        format!(
            "function %f(i64, i64) -> i64 system_v {{
                 fn0 = colocated %g(i64, i64) -> i64 system_v
             block0(v0: i64, v1: i64):
                 v2 = iconst.i64 {c}
                 brif v0, block1(v2), block2
             block1(v3: i64):
                 v4 = iadd v3, v1
                 return v4
             block2:
                 v5 = iconst.i64 {d}
                 v6 = call fn0(v1, v5)
                 return v6
             }}"
        )
    };
    let (a, b) = (shape_of(&parse(&text(1, 2))), shape_of(&parse(&text(8, 9))));
    assert_eq!(a.shape, b.shape);
    // The two constants, then the callee.
    let kinds: Vec<ParamKind> = a.values.iter().map(|v| v.kind).collect();
    assert_eq!(kinds, [ParamKind::Int, ParamKind::Int, ParamKind::Callee]);
}

#[test]
fn functions_differing_in_a_non_parameterizable_immediate_do_not_share_a_shape() {
    let shift = |amount: i64| {
        format!(
            "function %f(i64, i64) -> i64 system_v {{
             block0(v0: i64, v1: i64):
                 v2 = iconst.i64 {amount}
                 v3 = ishl v0, v2
                 return v3
             }}"
        )
    };
    let offset = |offset: i32| {
        format!(
            "function %f(i64, i64) -> i64 system_v {{
             block0(v0: i64, v1: i64):
                 v2 = load.i64 v0+{offset}
                 return v2
             }}"
        )
    };
    let float_divisor = |bits: &str| {
        format!(
            "function %f(i64, i64) -> i64 system_v {{
             block0(v0: i64, v1: i64):
                 v2 = f64const {bits}
                 v3 = fcvt_from_sint.f64 v0
                 v4 = sqrt v2
                 v5 = fadd v3, v4
                 v6 = fcvt_to_sint_sat.i64 v5
                 return v6
             }}"
        )
    };
    let branch = |c: i64| {
        format!(
            "function %f(i64, i64) -> i64 system_v {{
             block0(v0: i64, v1: i64):
                 v2 = iconst.i64 {c}
                 brif v2, block1, block2
             block1:
                 return v0
             block2:
                 return v1
             }}"
        )
    };
    let pairs = [
        (shift(3), shift(4)),
        (offset(8), offset(16)),
        (float_divisor("0x0.0p0"), float_divisor("-0x0.0p0")),
        (branch(0), branch(1)),
    ];
    for (a, b) in pairs {
        let (sa, sb) = (shape_of(&parse(&a)), shape_of(&parse(&b)));
        assert_ne!(sa.shape, sb.shape, "{a}");
        assert!(sa.values.is_empty(), "{a}");
    }
}

#[test]
fn recursive_members_share_a_shape_and_call_themselves_through_their_thunks() {
    // Each calls itself: the body calls the callee its thunk passes, the
    // member's own id (the thunk).
    let text = |name: &str, c: i64| {
        format!(
            "function %{name}(i64, i64) -> i64 system_v {{
                 fn0 = colocated %{name}(i64, i64) -> i64 system_v
             block0(v0: i64, v1: i64):
                 brif v0, block1, block2
             block1:
                 v2 = iconst.i64 1
                 v3 = isub v0, v2
                 v4 = call fn0(v3, v1)
                 v5 = iconst.i64 {c}
                 v6 = iadd v4, v5
                 return v6
             block2:
                 return v1
             }}"
        )
    };
    let (a, b) = (
        shape_of(&parse(&text("r0", 3))),
        shape_of(&parse(&text("r1", 4))),
    );
    assert_eq!(a.shape, b.shape);
    // One parameter for the constant, one for the callee.
    let texts = [
        self_recursive(0, 3),
        self_recursive(1, -5),
        self_recursive(2, 11),
    ];
    assert_eq!(merged_results_agree_with(&[], &texts), 2);
}

/// `u0:{id}`, which calls itself `x & 15` levels deep (counting down from
/// the inputs' first argument would take long), multiplying by `c` on the
/// way back.
fn self_recursive(id: u32, c: i64) -> String {
    format!(
        "function u0:{id}(i64, i64) -> i64 system_v {{
             fn0 = colocated u0:{id}(i64, i64) -> i64 system_v
         block0(v100: i64, v1: i64):
             v101 = iconst.i64 15
             v0 = band v100, v101
             brif v0, block1, block2
         block1:
             v2 = iconst.i64 1
             v3 = isub v0, v2
             v4 = call fn0(v3, v1)
             v5 = iconst.i64 {c}
             v6 = imul v4, v5
             v7 = iadd v6, v100
             return v7
         block2:
             return v1
         }}"
    )
}

#[test]
fn members_differing_in_their_callees_call_their_own() {
    let callee = |id: u32, op: &str| {
        format!(
            "function u0:{id}(i64, i64) -> i64 system_v {{
             block0(v0: i64, v1: i64):
                 v2 = {op} v0, v1
                 return v2
             }}"
        )
    };
    let callees = [callee(0, "iadd"), callee(1, "isub"), callee(2, "bxor")];
    // Member `i` calls `first` twice, then `second`, with a constant.
    let member = |id: u32, first: u32, second: u32, c: i64| {
        format!(
            "function u0:{id}(i64, i64) -> i64 system_v {{
                 sig0 = (i64, i64) -> i64 system_v
                 fn0 = colocated u0:{first} sig0
                 fn1 = colocated u0:{second} sig0
             block0(v0: i64, v1: i64):
                 v2 = call fn0(v0, v1)
                 v3 = call fn0(v2, v1)
                 v4 = iconst.i64 {c}
                 v5 = imul v3, v4
                 v6 = call fn1(v5, v0)
                 return v6
             }}"
        )
    };
    let texts = [
        member(3, 0, 1, 3),
        member(4, 1, 2, 3),
        member(5, 2, 0, 5),
        member(6, 0, 2, 5),
    ];
    let shapes: Vec<ShapeOf> = texts.iter().map(|t| shape_of(&parse(t))).collect();
    assert!(shapes.iter().all(|s| s.shape == shapes[0].shape));
    // Two callees and the constant.
    assert_eq!(merged_results_agree_with(&callees, &texts), 3);
    // Members that agree on a callee keep it direct.
    let same_second = [member(3, 0, 2, 3), member(4, 1, 2, 3)];
    assert_eq!(merged_results_agree_with(&callees, &same_second), 1);
}

/// A function of three instructions that adds `c` to its first argument:
/// too small for merging to pay.
fn tiny(c: i64) -> String {
    format!(
        "function %f(i64, i64) -> i64 system_v {{
         block0(v0: i64, v1: i64):
             v2 = iconst.i64 {c}
             v3 = iadd v0, v2
             return v3
         }}"
    )
}

#[test]
fn the_cost_model_refuses_a_group_of_tiny_functions() {
    let funcs = [parse(&tiny(1)), parse(&tiny(2))];
    let shapes: Vec<ShapeOf> = funcs.iter().map(shape_of).collect();
    let values: Vec<&[similar::ParamValue]> = shapes.iter().map(|s| &s.values[..]).collect();
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    let bytes: Vec<u64> = funcs
        .iter()
        .map(|f| {
            jitfold::compile::compile(f, &*isa)
                .unwrap()
                .code
                .bytes
                .len() as u64
        })
        .collect();
    let plan = similar::plan_group(
        &funcs[0].signature,
        false,
        &values,
        &bytes,
        &SimilarOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.decision, Decision::DoesNotPay, "{plan:?}");
    // Merged anyway, they still compute the same.
    assert_eq!(merged_results_agree(&[tiny(1), tiny(2)]), 1);
}

/// A `patchable` call site is metadata a consumer of the compiled code may
/// use to patch the call out (`MachBufferFinalized::nop_units`,
/// `patchable_call_sites`); a `call_indirect` has none. A callee reached
/// through a patchable function reference must not become a callee
/// parameter, or a merged member's call could no longer be patched.
#[test]
fn patchable_callees_stay_in_the_shape() {
    let text = |callee: &str| {
        format!(
            "function %f(i64) -> i64 system_v {{
                 sig0 = (i64) system_v
                 fn0 = colocated patchable %{callee} sig0
             block0(v0: i64):
                 call fn0(v0)
                 return v0
             }}"
        )
    };
    let (fa, fb) = (parse(&text("g")), parse(&text("h")));
    let (a, b) = (shape_of(&fa), shape_of(&fb));
    assert!(
        a.values.iter().all(|v| v.kind != ParamKind::Callee),
        "a patchable callee became a parameter: {:?}",
        a.values
    );
    assert_ne!(a.shape, b.shape);
}

/// One callee under two function references (one `colocated`, one not),
/// and a `tail` callee called from a `system_v` member, are one callee
/// parameter each, and every member still calls its own.
#[test]
fn a_callee_under_two_references_and_a_tail_callee_are_one_parameter_each() {
    let callee = |id: u32, op: &str, conv: &str| {
        format!(
            "function u0:{id}(i64, i64) -> i64 {conv} {{
             block0(v0: i64, v1: i64):
                 v2 = {op} v0, v1
                 return v2
             }}"
        )
    };
    let callees = [
        callee(0, "iadd", "system_v"),
        callee(1, "isub", "system_v"),
        callee(2, "bxor", "tail"),
        callee(3, "imul", "tail"),
    ];
    let member = |id: u32, first: u32, tail: u32| {
        format!(
            "function u0:{id}(i64, i64) -> i64 system_v {{
                 sig0 = (i64, i64) -> i64 system_v
                 sig1 = (i64, i64) -> i64 tail
                 fn0 = colocated u0:{first} sig0
                 fn1 = u0:{first} sig0
                 fn2 = colocated u0:{tail} sig1
             block0(v0: i64, v1: i64):
                 v2 = call fn0(v0, v1)
                 v3 = call fn1(v2, v1)
                 v4 = call fn2(v3, v0)
                 return v4
             }}"
        )
    };
    let texts = [member(4, 0, 2), member(5, 1, 3), member(6, 1, 2)];
    assert_eq!(merged_results_agree_with(&callees, &texts), 2);
}

// ---------------------------------------------------------------------------
// `DedupModule` in batch mode with `DedupOptions::with_similar`: the merged
// module against plain `JITModule`.
// ---------------------------------------------------------------------------

use jitfold::store::{CodeStore, MemoryStore, StoreError, StoreKey};
use jitfold::{DedupModule, DedupOptions, Stats};

/// `text` with `n` more instructions (`iadd` and `bxor` with the
/// parameters, no constants) before its last `return`, so that merging
/// pays for the cost model.
fn padded(text: &str, n: usize) -> String {
    let at = text.rfind("return v").expect("a return");
    let end = at + text[at..].find('\n').expect("a line");
    let result = text[at + "return ".len()..end].trim().to_string();
    let mut lines = String::new();
    let mut prev = result;
    for i in 0..n {
        let v = format!("v{}", 1000 + i);
        let op = if i % 2 == 0 { "iadd" } else { "bxor" };
        let arg = if i % 3 == 0 { "v1" } else { "v0" };
        lines.push_str(&format!("    {v} = {op} {prev}, {arg}\n"));
        prev = v;
    }
    format!("{}{lines}    return {prev}{}", &text[..at], &text[end..])
}

/// Declares (`f0`, `f1`, ... with their own signatures: `u0:i` in a text
/// is function `i`) and defines `funcs` in `m`, then an entry `e{i}`
/// (`system_v (i64, i64) -> i64`, calling `f{i}`) for each of `entries`.
/// Returns the functions' ids and the entries' ids.
fn define_all<M: Module>(
    m: &mut M,
    funcs: &[Function],
    entries: &[usize],
) -> (Vec<FuncId>, Vec<FuncId>) {
    let ids: Vec<FuncId> = funcs
        .iter()
        .enumerate()
        .map(|(i, f)| {
            m.declare_function(&format!("f{i}"), Linkage::Local, &f.signature)
                .unwrap()
        })
        .collect();
    for (f, &id) in funcs.iter().zip(&ids) {
        let mut ctx = m.make_context();
        ctx.func = f.clone();
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        m.define_function(id, &mut ctx).unwrap();
    }
    let entries = entries
        .iter()
        .map(|&i| {
            let mut sig = m.make_signature();
            sig.call_conv = CallConv::SystemV;
            sig.params
                .extend([cranelift_codegen::ir::AbiParam::new(I64); 2]);
            sig.returns.push(cranelift_codegen::ir::AbiParam::new(I64));
            let id = m
                .declare_function(&format!("e{i}"), Linkage::Export, &sig)
                .unwrap();
            crate::common::build::define(m, id, |b, m, params| {
                let callee = m.declare_func_in_func(ids[i], b.func);
                let call = b.ins().call(callee, params);
                let result = b.inst_results(call)[0];
                b.ins().return_(&[result]);
            })
            .unwrap();
            id
        })
        .collect();
    (ids, entries)
}

/// Calls `ptr`, a `system_v (i64, i64) -> i64` function, on every input.
fn results_at(ptr: *const u8) -> Vec<i64> {
    // SAFETY: every entry is `system_v (i64, i64) -> i64`, the host's C
    // convention on the x86-64 and aarch64 Linux hosts these tests run on,
    // and its module was finalized.
    let f: extern "C" fn(i64, i64) -> i64 = unsafe { std::mem::transmute(ptr) };
    INPUTS.iter().map(|&(x, y)| f(x, y)).collect()
}

fn jit_builder() -> JITBuilder {
    JITBuilder::with_flags(
        &[("opt_level", "speed"), ("preserve_frame_pointers", "true")],
        default_libcall_names(),
    )
    .unwrap()
}

/// Defines `texts` and an entry for each of `entries` in plain
/// `JITModule` and in `DedupModule<JITModule>` with `options`, calls each
/// entry on [`INPUTS`] in both and checks that they agree; returns the
/// `DedupModule`'s statistics (checked to add up).
fn merged_module_agrees(texts: &[String], entries: &[usize], options: DedupOptions) -> Stats {
    let funcs: Vec<Function> = texts.iter().map(|t| parse(t)).collect();
    merged_functions_agree(&funcs, entries, options)
}

/// [`merged_module_agrees`] of functions.
fn merged_functions_agree(funcs: &[Function], entries: &[usize], options: DedupOptions) -> Stats {
    let mut plain = jit();
    let (_, plain_entries) = define_all(&mut plain, funcs, entries);
    plain.finalize_definitions().unwrap();
    let mut dedup = DedupModule::<JITModule>::with_options(jit_builder(), options);
    let (ids, dedup_entries) = define_all(&mut dedup, funcs, entries);
    dedup.finalize_definitions().unwrap();
    for (k, &i) in entries.iter().enumerate() {
        let want = results_at(plain.get_finalized_function(plain_entries[k]));
        let got = results_at(dedup.get_finalized_function(dedup_entries[k]));
        assert_eq!(want, got, "f{i} with {options}");
        // A `system_v` member's own address runs it too (its thunk).
        if funcs[i].signature.call_conv == CallConv::SystemV {
            let own = results_at(dedup.get_finalized_function(ids[i]));
            assert_eq!(want, own, "f{i} called by its address with {options}");
        }
    }
    // Every id has an address of its own.
    let mut addresses: Vec<*const u8> = ids
        .iter()
        .map(|&id| dedup.get_finalized_function(id))
        .collect();
    addresses.sort();
    addresses.dedup();
    assert_eq!(addresses.len(), ids.len(), "distinct addresses");
    let s = dedup.stats().clone();
    assert_eq!(
        s.defined + s.similar_groups,
        s.compiled + s.reused + s.loaded + s.adapted + s.aliased + s.trampolined + s.bytes_defined,
        "{s:?}"
    );
    s
}

fn similar_batch() -> DedupOptions {
    DedupOptions::batch().with_similar(SimilarOptions::default())
}

fn all(n: usize) -> Vec<usize> {
    (0..n).collect()
}

#[test]
fn batch_mode_merges_functions_differing_in_integer_constants() {
    for conv in ["system_v", "tail"] {
        let texts = [
            padded(&arithmetic(conv, 3, 5, -7, 1000), 24),
            padded(&arithmetic(conv, -3, 5, 100, -1), 24),
        ];
        let s = merged_module_agrees(&texts, &all(2), similar_batch());
        assert_eq!(
            (s.similar_groups, s.similar_merged),
            (1, 2),
            "{conv}: {s:?}"
        );
        // The body and two thunks, and the two entries (the second one
        // from the first's code).
        assert_eq!(s.compiled + s.reused, 5, "{conv}: {s:?}");
        // Off by default.
        let s = merged_module_agrees(&texts, &all(2), DedupOptions::batch());
        assert_eq!(
            (s.similar_groups, s.similar_merged),
            (0, 0),
            "{conv}: {s:?}"
        );
        assert_eq!(s.compiled + s.reused, 4, "{conv}: {s:?}");
        // Eager mode merges the second member only (the first keeps its
        // code).
        let s = merged_module_agrees(&texts, &all(2), similar_eager());
        assert_eq!(
            (s.similar_groups, s.similar_merged),
            (1, 1),
            "{conv}: {s:?}"
        );
    }
}

/// A member whose name table has an entry no declaration refers to,
/// naming a duplicate (as an embedder leaves behind that renames a callee
/// by appending an entry): the entry names nothing the member does, so the
/// flush does not count the member as rewritten, and it is merged (3 in
/// `module/roots.rs` leaves out only the functions a flush rewrote).
#[test]
fn a_name_no_declaration_refers_to_does_not_keep_a_member_out() {
    // Another shape than the members'.
    let twin = padded(&arithmetic("system_v", 1, 2, 3, 4), 30);
    let texts = [
        twin.clone(),
        twin,
        padded(&arithmetic("system_v", 3, 5, -7, 1000), 24),
        padded(&arithmetic("system_v", -3, 5, 100, -1), 24),
    ];
    let mut funcs: Vec<Function> = texts.iter().map(|t| parse(t)).collect();
    // f1 is f0's duplicate; f2's table also names f1, unreferenced.
    funcs[2]
        .params
        .ensure_user_func_name(UserExternalName::new(0, 1));
    let s = merged_functions_agree(&funcs, &all(4), similar_batch());
    // f1, and e1 (which calls f1, rewritten to f0), are duplicates.
    assert_eq!(s.trampolined + s.aliased, 2, "{s:?}");
    assert_eq!((s.similar_groups, s.similar_merged), (1, 2), "{s:?}");
}

#[test]
fn batch_mode_passes_float_constants_bit_exact() {
    for conv in ["system_v", "tail"] {
        let texts = [
            padded(
                &floats(conv, "0x1.8p1", "-0x0.0p0", "+NaN:0x1234", "+sNaN:0x1"),
                24,
            ),
            padded(
                &floats(conv, "-0x0.0p0", "0x0.0p0", "-NaN:0x5", "-sNaN:0x2"),
                24,
            ),
            padded(
                &floats(conv, "+Inf", "-NaN:0x7", "0x1.0p-1022", "0x1.0p0"),
                24,
            ),
        ];
        let s = merged_module_agrees(&texts, &all(3), similar_batch());
        assert_eq!(
            (s.similar_groups, s.similar_merged),
            (1, 3),
            "{conv}: {s:?}"
        );
    }
}

#[test]
fn batch_mode_merges_a_group_of_twenty() {
    let texts: Vec<String> = (0..20)
        .map(|i: i64| {
            padded(
                &arithmetic("system_v", i * 1_000_003, 5, (i * 13) as i8, i64::MIN + i),
                24,
            )
        })
        .collect();
    let s = merged_module_agrees(&texts, &all(20), similar_batch());
    assert_eq!((s.similar_groups, s.similar_merged), (1, 20), "{s:?}");
    // On several threads: the same.
    let s = merged_module_agrees(&texts, &all(20), similar_batch().with_threads(2));
    assert_eq!((s.similar_groups, s.similar_merged), (1, 20), "{s:?}");
    // With at most one parameter, no two members fit one body.
    let one = SimilarOptions {
        max_params: 1,
        ..SimilarOptions::default()
    };
    let s = merged_module_agrees(&texts, &all(20), DedupOptions::batch().with_similar(one));
    assert_eq!(s.similar_merged, 0, "{s:?}");
}

#[test]
fn batch_mode_leaves_a_group_the_cost_model_refuses() {
    let s = merged_module_agrees(&[tiny(1), tiny(2), tiny(3)], &all(3), similar_batch());
    assert_eq!((s.similar_groups, s.similar_merged), (0, 0), "{s:?}");
    assert_eq!(s.compiled + s.reused, 6, "{s:?}");
}

/// The cost model sizes a member by the instructions Cranelift lowers: the
/// same members padded with instructions whose results nothing uses are
/// as small as unpadded ones (Cranelift emits nothing for them), and are
/// left alone, in batch and eager mode, where the same padding used
/// merges.
#[test]
fn dead_code_does_not_make_a_group_look_worth_merging() {
    let live = |c: i64| padded(&tiny(c), 24);
    let dead = |c: i64| {
        let text = tiny(c);
        let at = text.rfind("    return").expect("a return");
        let unused: String = (0..24)
            .map(|i| format!("    v{} = iadd v0, v1\n", 2000 + i))
            .collect();
        format!("{}{unused}{}", &text[..at], &text[at..])
    };
    let members = |f: &dyn Fn(i64) -> String| -> Vec<String> { (1..=3).map(f).collect() };
    for (texts, merges) in [(members(&live), true), (members(&dead), false)] {
        assert!(texts[0].contains("v2023") != merges, "{}", texts[0]);
        for options in [similar_batch(), similar_eager()] {
            let s = merged_module_agrees(&texts, &all(3), options);
            assert_eq!(
                s.similar_merged > 0,
                merges,
                "{options}: {s:?}\n{}",
                texts[0]
            );
        }
    }
}

/// Members that also differ in a constant nothing uses (as wasmtime's
/// CLIF has, where the mid-end rematerialized one) merge, in batch and
/// eager mode, with the results of plain Cranelift; that constant is no
/// parameter.
#[test]
fn a_constant_nothing_uses_does_not_keep_members_apart() {
    let text = |dead: i64, c: i64| {
        let text = padded(&tiny(c), 24);
        let at = text.find("    v2 = iconst").expect("the constant");
        format!(
            "{}    v900 = iconst.i64 {dead}\n{}",
            &text[..at],
            &text[at..]
        )
    };
    let texts: Vec<String> = [(11, 1), (-4, 2), (1 << 40, 3)]
        .into_iter()
        .map(|(dead, c)| text(dead, c))
        .collect();
    assert!(texts[0].contains("v900 = iconst.i64 11"), "{}", texts[0]);
    // Eager mode has compiled the first member by the time the second
    // makes a group: the later ones become thunks.
    for (options, merged) in [(similar_batch(), 3), (similar_eager(), 2)] {
        let s = merged_module_agrees(&texts, &all(3), options);
        assert_eq!(s.similar_merged, merged, "{options}: {s:?}");
    }
    let (a, b) = (shape_of(&parse(&texts[0])), shape_of(&parse(&texts[1])));
    assert_eq!(a.shape, b.shape);
    assert_eq!(a.values.len(), 1, "only the used constant is a parameter");
}

#[test]
fn batch_mode_does_not_merge_functions_differing_in_a_shift_or_an_offset() {
    // `c` is a parameter site; the shift amount and the offset are not.
    let text = |shift: i64, offset: i32, c: i64| {
        padded(
            &format!(
                "function %f(i64, i64) -> i64 system_v {{
                     ss0 = explicit_slot 32
                 block0(v0: i64, v1: i64):
                     v2 = iconst.i64 {shift}
                     v3 = ishl v0, v2
                     v4 = iconst.i64 {c}
                     v5 = iadd v3, v4
                     v6 = stack_addr.i64 ss0
                     store v0, v6
                     store v1, v6+8
                     store v5, v6+16
                     store v0, v6+24
                     v7 = load.i64 v6+{offset}
                     v8 = iadd v5, v7
                     return v8
                 }}"
            ),
            24,
        )
    };
    let same = merged_module_agrees(&[text(3, 8, 1), text(3, 8, 2)], &all(2), similar_batch());
    assert_eq!(same.similar_merged, 2, "{same:?}");
    for (a, b) in [
        (text(3, 8, 1), text(4, 8, 2)),
        (text(3, 8, 1), text(3, 16, 2)),
    ] {
        let s = merged_module_agrees(&[a, b], &all(2), similar_batch());
        assert_eq!((s.similar_groups, s.similar_merged), (0, 0), "{s:?}");
    }
}

#[test]
fn batch_mode_merges_members_called_recursively_and_self_recursive_ones() {
    // f0 and f1 call f2, which calls f0 or f1 by the parity of x: the
    // merged body calls f2, which calls the thunks.
    let member = |c: i64| {
        padded(
            &format!(
                "function %f(i64, i64) -> i64 system_v {{
                     fn0 = colocated u0:2(i64, i64) -> i64 system_v
                 block0(v0: i64, v1: i64):
                     v2 = iconst.i64 0
                     v3 = icmp sle v0, v2
                     brif v3, block2, block1
                 block1:
                     v4 = iconst.i64 1
                     v5 = isub v0, v4
                     v6 = call fn0(v5, v1)
                     v7 = iconst.i64 {c}
                     v8 = imul v6, v7
                     v9 = iadd v8, v0
                     return v9
                 block2:
                     return v1
                 }}"
            ),
            24,
        )
    };
    let dispatch = "function %d(i64, i64) -> i64 system_v {
             fn0 = colocated u0:0(i64, i64) -> i64 system_v
             fn1 = colocated u0:1(i64, i64) -> i64 system_v
         block0(v0: i64, v1: i64):
             v5 = iconst.i64 1
             v2 = band v0, v5
             brif v2, block1, block2
         block1:
             v3 = call fn1(v0, v1)
             return v3
         block2:
             v4 = call fn0(v0, v1)
             return v4
         }"
    .to_string();
    // Small inputs, so that the recursion ends soon: `x` is masked.
    let masked = |m: String| {
        m.replace(
            "block0(v0: i64, v1: i64):",
            "block0(v100: i64, v1: i64):\n v101 = iconst.i64 15\n v0 = band v100, v101",
        )
    };
    let texts = [masked(member(3)), masked(member(-5)), dispatch];
    let s = merged_module_agrees(&texts, &all(3), similar_batch());
    assert_eq!((s.similar_groups, s.similar_merged), (1, 2), "{s:?}");
    // Each calls itself: its own name is a callee parameter, so the body
    // recurses through the member's own thunk.
    let recursive = |id: u32, c: i64| padded(&self_recursive(id, c), 24);
    let s = merged_module_agrees(
        &[recursive(0, 3), recursive(1, 4)],
        &all(2),
        similar_batch(),
    );
    assert_eq!((s.similar_groups, s.similar_merged), (1, 2), "{s:?}");
}

#[test]
fn check_mode_does_not_merge() {
    let texts = [
        padded(&arithmetic("system_v", 3, 5, -7, 1000), 24),
        padded(&arithmetic("system_v", -3, 5, 100, -1), 24),
    ];
    let s = merged_module_agrees(&texts, &all(2), similar_batch().with_check(true));
    assert_eq!(s.similar_merged, 0, "{s:?}");
}

#[test]
fn an_object_file_has_every_members_symbol_and_a_local_body() {
    use cranelift_object::object::{self, Object, ObjectSymbol, SymbolKind};
    use cranelift_object::{ObjectBuilder, ObjectModule};
    let texts = [
        padded(&arithmetic("system_v", 3, 5, -7, 1000), 24),
        padded(&arithmetic("system_v", -3, 5, 100, -1), 24),
    ];
    let funcs: Vec<Function> = texts.iter().map(|t| parse(t)).collect();
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    let builder = ObjectBuilder::new(isa, "similar", default_libcall_names()).unwrap();
    let mut m = DedupModule::wrap(ObjectModule::new(builder), similar_batch());
    define_all(&mut m, &funcs, &all(2));
    m.flush().unwrap();
    assert_eq!(m.stats().similar_merged, 2);
    let bytes = m.finish().emit().unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let text: Vec<_> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .collect();
    for name in ["f0", "f1", "e0", "e1"] {
        assert!(
            text.iter().any(|s| s.name() == Ok(name)),
            "{name} in {:?}",
            text.iter().map(|s| s.name()).collect::<Vec<_>>()
        );
    }
    // The body: defined, local, not one of the user's names.
    let others: Vec<_> = text
        .iter()
        .filter(|s| !matches!(s.name(), Ok("f0" | "f1" | "e0" | "e1")))
        .collect();
    assert_eq!(
        others.len(),
        1,
        "{:?}",
        others.iter().map(|s| s.name()).collect::<Vec<_>>()
    );
    assert!(others[0].is_local());
}

#[test]
fn tail_members_merge_where_tail_calls_do_not_compile() {
    // x86-64 compiles `return_call` only with frame pointers kept: the
    // thunks then call and return.
    let texts = [
        padded(&arithmetic("tail", 3, 5, -7, 1000), 24),
        padded(&arithmetic("tail", -3, 5, 100, -1), 24),
    ];
    let funcs: Vec<Function> = texts.iter().map(|t| parse(t)).collect();
    let builder = JITBuilder::with_flags(&[("opt_level", "speed")], default_libcall_names());
    let mut plain = JITModule::new(builder.unwrap());
    let (_, plain_entries) = define_all(&mut plain, &funcs, &all(2));
    plain.finalize_definitions().unwrap();
    let builder = JITBuilder::with_flags(&[("opt_level", "speed")], default_libcall_names());
    let mut dedup = DedupModule::<JITModule>::with_options(builder.unwrap(), similar_batch());
    let (_, entries) = define_all(&mut dedup, &funcs, &all(2));
    dedup.finalize_definitions().unwrap();
    assert_eq!(dedup.stats().similar_merged, 2);
    for (p, d) in plain_entries.iter().zip(&entries) {
        assert_eq!(
            results_at(plain.get_finalized_function(*p)),
            results_at(dedup.get_finalized_function(*d))
        );
    }
}

#[test]
fn a_duplicate_of_a_member_runs_its_thunk() {
    let a = padded(&arithmetic("system_v", 3, 5, -7, 1000), 24);
    let b = padded(&arithmetic("system_v", -3, 5, 100, -1), 24);
    let s = merged_module_agrees(&[a.clone(), b, a], &all(3), similar_batch());
    assert_eq!((s.similar_groups, s.similar_merged), (1, 2), "{s:?}");
    // f2 is f0's duplicate, and so e2 (which calls f2, rewritten to f0)
    // is e0's.
    assert_eq!(s.trampolined, 2, "{s:?}");
}

#[test]
fn a_later_flush_with_a_members_twin_and_a_new_member_runs_right() {
    let text = |a: i64| padded(&arithmetic("system_v", a, 5, -7, 1000), 24);
    let funcs: Vec<Function> = [text(1), text(2), text(1), text(3), text(4)]
        .iter()
        .map(|t| parse(t))
        .collect();
    let mut plain = jit();
    let (_, plain_entries) = define_all(&mut plain, &funcs, &all(5));
    plain.finalize_definitions().unwrap();
    let mut dedup = DedupModule::<JITModule>::with_options(jit_builder(), similar_batch());
    // Two flushes: f0 and f1, then f2 (f0's twin), f3 and f4.
    let ids: Vec<FuncId> = funcs
        .iter()
        .enumerate()
        .map(|(i, f)| {
            dedup
                .declare_function(&format!("f{i}"), Linkage::Local, &f.signature)
                .unwrap()
        })
        .collect();
    let mut flushed = Vec::new();
    for range in [0..2, 2..5] {
        for i in range {
            let mut ctx = dedup.make_context();
            ctx.func = funcs[i].clone();
            ctx.func.name = UserFuncName::user(0, ids[i].as_u32());
            dedup.define_function(ids[i], &mut ctx).unwrap();
        }
        dedup.finalize_definitions().unwrap();
        flushed.push(dedup.stats().clone());
    }
    assert_eq!(flushed[0].similar_merged, 2, "{:?}", flushed[0]);
    // f2 is not a duplicate of f0 under f0's original key (the cache holds
    // only the keys of the code compiled: the thunk's and the body's): it
    // merges with f3 and f4. Their body is the first one's (a duplicate),
    // and so, its call rewritten to the first body, is f2's thunk (f0's).
    let s = dedup.stats();
    assert_eq!((s.similar_groups, s.similar_merged), (2, 5), "{s:?}");
    assert_eq!(s.trampolined, 2, "{s:?}");
    assert_eq!(
        s.compiled, 5,
        "a body and two thunks, then two thunks: {s:?}"
    );
    for (i, &p) in plain_entries.iter().enumerate() {
        assert_eq!(
            results_at(plain.get_finalized_function(p)),
            results_at(dedup.get_finalized_function(ids[i])),
            "f{i}"
        );
    }
}

/// Members that differ in which function's address they take and which
/// data object they read: each address is a parameter its thunk passes.
#[test]
fn members_differing_in_addresses_they_take_use_their_own() {
    let callee = |id: u32, k: i64| {
        format!(
            "function u0:{id}(i64, i64) -> i64 system_v {{
             block0(v0: i64, v1: i64):
                 v2 = iconst.i64 {k}
                 v3 = imul v0, v2
                 v4 = iadd v3, v1
                 return v4
             }}"
        )
    };
    let callees = [callee(0, 3), callee(1, -7)];
    // Reads data object `object`, calls function `function` through its
    // address (so the name is used as data, not as a callee).
    let member = |id: u32, function: u32, object: u32| {
        format!(
            "function u0:{id}(i64, i64) -> i64 system_v {{
                 gv0 = symbol colocated u1:{object}
                 sig0 = (i64, i64) -> i64 system_v
                 fn0 = colocated u0:{function} sig0
             block0(v0: i64, v1: i64):
                 v2 = symbol_value.i64 gv0
                 v3 = load.i64 notrap aligned v2
                 v4 = func_addr.i64 fn0
                 v5 = call_indirect sig0, v4(v0, v3)
                 v6 = iadd v5, v1
                 return v6
             }}"
        )
    };
    let texts = [member(2, 0, 0), member(3, 1, 1), member(4, 0, 1)];
    let shapes: Vec<ShapeOf> = texts.iter().map(|t| shape_of(&parse(t))).collect();
    let kinds: Vec<ParamKind> = shapes[0].values.iter().map(|v| v.kind).collect();
    assert_eq!(
        kinds,
        [ParamKind::SymbolAddress, ParamKind::FunctionAddress]
    );
    assert_eq!(
        merged_results_agree_with_data(&[1000, -55], &callees, &texts),
        2
    );
}

/// A symbol read with an offset, or thread-local, stays in the shape.
#[test]
fn symbols_with_offsets_stay_in_the_shape() {
    let text = |object: u32| {
        format!(
            "function %f(i64) -> i64 system_v {{
                 gv0 = symbol colocated u1:{object}+8
             block0(v0: i64):
                 v1 = symbol_value.i64 gv0
                 v2 = load.i64 notrap aligned v1
                 return v2
             }}"
        )
    };
    let (a, b) = (shape_of(&parse(&text(0))), shape_of(&parse(&text(1))));
    assert!(a.values.is_empty(), "{:?}", a.values);
    assert_ne!(a.shape, b.shape);
}

fn similar_eager() -> DedupOptions {
    DedupOptions::eager().with_similar(SimilarOptions::default())
}

/// Eager mode: the first member keeps its own code, the second gets a body
/// and a thunk, every later one that fits a thunk only; one that does not
/// fit (a constant the body kept differs) compiles on its own.
#[test]
fn eager_mode_merges_from_the_second_member_on() {
    let member = |a: i64, b: i64| padded(&arithmetic("system_v", a, b, -7, 1000), 24);
    // The first two differ in `a` only: `b` stays a constant of the body.
    let mut texts: Vec<String> = (0..6).map(|i| member(i * 1_000_003, 5)).collect();
    texts.push(member(77, 6));
    let s = merged_module_agrees(&texts, &all(texts.len()), similar_eager());
    // Members 2 to 6 are thunks of one body; the last does not fit.
    assert_eq!((s.similar_groups, s.similar_merged), (1, 5), "{s:?}");
    // Compiled: the first member, the body, the five thunks, the last
    // member, and the first entry (the other entries reuse its code).
    assert_eq!((s.compiled, s.reused), (1 + 1 + 5 + 1 + 1, 6), "{s:?}");
    // In tail convention and on float constants too.
    let texts: Vec<String> = (0..4)
        .map(|i| padded(&arithmetic("tail", i * 7, 5, 3, 9), 24))
        .collect();
    let s = merged_module_agrees(&texts, &all(4), similar_eager());
    assert_eq!((s.similar_groups, s.similar_merged), (1, 3), "{s:?}");
    // Thunks are never merged again, even where a model that finds
    // everything worth merging would merge thunks of one body (which
    // differ only in the constants they pass).
    let free = similar::CostModel {
        thunk_bytes: 0,
        thunk_bytes_per_param: 0,
        body_bytes_per_param: 0,
        ..similar::CostModel::X86_64
    };
    let options = DedupOptions::eager().with_similar(SimilarOptions {
        max_params: 16,
        model: free,
        ..SimilarOptions::DEFAULT
    });
    let texts: Vec<String> = (0..5).map(|i| member(i, 5)).collect();
    let s = merged_module_agrees(&texts, &all(5), options);
    assert_eq!((s.similar_groups, s.similar_merged), (1, 4), "{s:?}");
}

/// Eager mode leaves a shape alone for good when a body for two members
/// does not pay.
#[test]
fn eager_mode_leaves_shapes_alone_that_do_not_pay() {
    let texts: Vec<String> = (0..5).map(tiny).collect();
    let s = merged_module_agrees(&texts, &all(5), similar_eager());
    assert_eq!((s.similar_groups, s.similar_merged), (0, 0), "{s:?}");
    // Every member, and the first entry (the others reuse its code).
    assert_eq!((s.compiled, s.reused), (5 + 1, 4), "{s:?}");
}

/// Eager mode: a member whose own code would fail to verify (here in a
/// block the walk never reaches, so its shape is a valid member's) is not
/// hidden behind a thunk: defining it fails, as in plain Cranelift.
#[test]
fn eager_mode_does_not_hide_a_member_that_fails_to_verify() {
    let member = |a: i64| padded(&arithmetic("system_v", a, 5, -7, 1000), 24);
    let mut broken = member(3);
    let at = broken.rfind('}').unwrap();
    broken.insert_str(
        at,
        "block99:\n    v900 = iadd.i32 v0, v0\n    return v900\n",
    );
    let broken = cranelift_reader::parse_functions(&broken)
        .unwrap()
        .remove(0);
    let mut m = DedupModule::<JITModule>::with_options(jit_builder(), similar_eager());
    let define = |m: &mut DedupModule<JITModule>, i: usize, func: Function| {
        let id = m
            .declare_function(&format!("f{i}"), Linkage::Local, &func.signature)
            .unwrap();
        let mut ctx = m.make_context();
        ctx.func = func;
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        m.define_function(id, &mut ctx)
    };
    for i in 0..3 {
        define(&mut m, i, parse(&member(i as i64 * 1000))).unwrap();
    }
    assert_eq!(m.stats().similar_merged, 2, "{}", m.stats());
    assert!(define(&mut m, 3, broken).is_err());
    assert_eq!(m.stats().similar_merged, 2, "{}", m.stats());
}

/// A store that reserves every key it misses and records which
/// reservations are still open; it says so (`reserves()`) unless it
/// hides it.
#[derive(Default)]
struct ReservingStore {
    entries: std::sync::Mutex<std::collections::HashMap<jitfold::store::StoreKey, Vec<u8>>>,
    open: std::sync::Mutex<std::collections::HashSet<jitfold::store::StoreKey>>,
    hides_reserving: bool,
}

impl jitfold::store::CodeStore for ReservingStore {
    fn get(
        &self,
        key: &jitfold::store::StoreKey,
    ) -> Result<Option<Vec<u8>>, jitfold::store::StoreError> {
        Ok(self.entries.lock().unwrap().get(key).cloned())
    }
    fn put(
        &self,
        key: &jitfold::store::StoreKey,
        value: &[u8],
    ) -> Result<(), jitfold::store::StoreError> {
        self.open.lock().unwrap().remove(key);
        self.entries.lock().unwrap().insert(*key, value.to_vec());
        Ok(())
    }
    fn get_or_reserve(
        &self,
        key: &jitfold::store::StoreKey,
    ) -> Result<Option<Vec<u8>>, jitfold::store::StoreError> {
        let got = self.get(key)?;
        if got.is_none() {
            self.open.lock().unwrap().insert(*key);
        }
        Ok(got)
    }
    fn release(&self, key: &jitfold::store::StoreKey) {
        self.open.lock().unwrap().remove(key);
    }
    fn reserves(&self) -> bool {
        !self.hides_reserving
    }
}

/// Eager mode with a code store that reserves what it misses (as a store
/// shared by threads does): a member defined as a thunk gives up the
/// reservation of its own template, also when its thunk is a duplicate of
/// an earlier one, so that no other thread waits for it (what is compiled
/// ends its reservation with its write, by the end of a flush). A store
/// that reserves without saying so gets its entries written behind the
/// flush, and its reservations end once they are.
#[test]
fn eager_thunks_leave_no_reservation_open() {
    for hides_reserving in [false, true] {
        eager_thunks_leave_no_reservation_open_in(ReservingStore {
            hides_reserving,
            ..ReservingStore::default()
        });
    }
}

fn eager_thunks_leave_no_reservation_open_in(store: ReservingStore) {
    let store = std::sync::Arc::new(store);
    let mut m = DedupModule::<JITModule>::with_options(jit_builder(), similar_eager())
        .with_store(store.clone(), None);
    let member = |a: i64| parse(&padded(&arithmetic("system_v", a, 5, -7, 1000), 24));
    // The third is the second again: its thunk is the second's.
    for (i, a) in [0, 1000, 1000, 2000].into_iter().enumerate() {
        let func = member(a);
        let id = m
            .declare_function(&format!("f{i}"), Linkage::Local, &func.signature)
            .unwrap();
        let mut ctx = m.make_context();
        ctx.func = func;
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        m.define_function(id, &mut ctx).unwrap();
        // Compiled entries are written (ending their reservations) on the
        // store's writer thread by the end of a flush, or behind it where
        // the store does not say it reserves.
        m.flush().unwrap();
        if store.hides_reserving {
            m.wait_for_store_writes();
        }
        assert!(
            store.open.lock().unwrap().is_empty(),
            "f{i} left a reservation open: {}",
            m.stats()
        );
    }
    assert_eq!(m.stats().similar_merged, 3, "{}", m.stats());
}

/// A merged body that fails to compile (on x86-64 a `return_call` without
/// frame pointers panics at emission) leaves no function of jitfold's
/// declared and undefined: its id is defined as a trap, so the object
/// module finishes once the members, which fail on their own too, are
/// defined again. (`ObjectModule::finish` panics on an undefined local
/// function.)
#[test]
fn a_merged_body_that_fails_to_compile_leaves_no_undefined_function() {
    use cranelift_object::object::{self, Object, ObjectSymbol, SymbolKind};
    use cranelift_object::{ObjectBuilder, ObjectModule};
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    // Member `i` is `f{i}`; both tail-call `f2`.
    let tail_calling = |a: i64, c: i8, d: i64| {
        let text = padded(&arithmetic("tail", a, 5, c, d), 24)
            .replace(
                "ss0 = explicit_slot 8",
                "ss0 = explicit_slot 8\n fn0 = colocated u0:2(i64, i64) -> i64 tail",
            )
            .replace("return v1023", "return_call fn0(v1023, v1)");
        parse(&text)
    };
    let callee = parse(
        "function %g(i64, i64) -> i64 tail {
         block0(v0: i64, v1: i64):
             return v0
         }",
    );
    let members = [tail_calling(3, -7, 1000), tail_calling(-3, 100, -1)];
    // Without frame pointers kept.
    let flags = jitfold::isa::flags(&[("opt_level", "speed")]).unwrap();
    let isa = jitfold::isa::host_isa(flags).unwrap();
    let builder = ObjectBuilder::new(isa, "similar", default_libcall_names()).unwrap();
    let mut m = DedupModule::wrap(ObjectModule::new(builder), similar_batch());
    let funcs: Vec<&Function> = members.iter().chain([&callee]).collect();
    let ids: Vec<FuncId> = (0..3)
        .map(|i| {
            m.declare_function(&format!("f{i}"), Linkage::Local, &funcs[i].signature)
                .unwrap()
        })
        .collect();
    let define = |m: &mut DedupModule<ObjectModule>, id: FuncId, func: &Function| {
        let mut ctx = m.make_context();
        ctx.func = func.clone();
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        m.define_function(id, &mut ctx).unwrap();
    };
    for (&id, func) in ids.iter().zip(&funcs) {
        define(&mut m, id, func);
    }
    m.flush().unwrap_err();
    let failed: Vec<FuncId> = m.failed_definitions().iter().map(|f| f.0).collect();
    assert_eq!(failed, ids[..2]);
    // The members again, returning instead of tail-calling.
    for (i, (a, c, d)) in [(3, -7, 1000), (-3, 100, -1)].into_iter().enumerate() {
        define(
            &mut m,
            ids[i],
            &parse(&padded(&arithmetic("tail", a, 5, c, d), 24)),
        );
    }
    m.flush().unwrap();
    // The trap is not counted (the members merge this time, behind a body
    // that compiles): every definition is accounted for.
    let s = m.stats().clone();
    assert_eq!(
        s.defined + s.similar_groups,
        s.compiled + s.reused + s.loaded + s.adapted + s.aliased + s.trampolined + s.bytes_defined,
        "{s:?}"
    );
    let bytes = m.finish().emit().unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let others: Vec<_> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .filter(|s| !matches!(s.name(), Ok("f0" | "f1" | "f2")))
        .map(|s| (s.name().map(str::to_owned), s.is_local()))
        .collect();
    // The failed body (or bodies) only, local.
    assert!(
        !others.is_empty() && others.iter().all(|s| s.1),
        "{others:?}"
    );
}

/// A store that reserves keys and lists what it was asked, in order.
#[derive(Default)]
struct Reserving {
    inner: MemoryStore,
    log: std::sync::Mutex<ReservingLog>,
}

/// What [`Reserving`] was asked.
#[derive(Default)]
struct ReservingLog {
    /// `(operation, key)`, the key numbered by first sight.
    events: Vec<(&'static str, usize)>,
    keys: Vec<StoreKey>,
}

impl Reserving {
    fn note(&self, operation: &'static str, key: &StoreKey) {
        let mut log = self.log.lock().unwrap();
        let n = match log.keys.iter().position(|k| k == key) {
            Some(n) => n,
            None => {
                log.keys.push(*key);
                log.keys.len() - 1
            }
        };
        log.events.push((operation, n));
    }
}

impl CodeStore for Reserving {
    fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key)
    }

    fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
        self.note("put", key);
        self.inner.put(key, value)
    }

    fn get_or_reserve(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.note("reserve", key);
        self.inner.get(key)
    }

    fn reserves(&self) -> bool {
        true
    }

    fn release(&self, key: &StoreKey) {
        self.note("release", key);
    }
}

/// In eager mode the second member, which reserved its template in a store
/// that reserves, keeps the reservation while its merged body is defined
/// (so another thread waits for it rather than compiling the member), and
/// gives it up only when it becomes the body's thunk.
#[test]
fn a_member_keeps_its_reservation_while_its_body_is_defined() {
    let texts = [
        padded(&arithmetic("system_v", 3, 5, -7, 1000), 24),
        padded(&arithmetic("system_v", -3, 5, 100, -1), 24),
    ];
    let funcs: Vec<Function> = texts.iter().map(|t| parse(t)).collect();
    let store = std::sync::Arc::new(Reserving::default());
    let mut m = DedupModule::<JITModule>::with_options(jit_builder(), similar_eager())
        .with_store(store.clone(), None);
    define_all(&mut m, &funcs, &[]);
    m.finalize_definitions().unwrap();
    assert_eq!(m.stats().similar_merged, 1, "{:?}", m.stats());
    let events = store.log.lock().unwrap().events.clone();
    // The first member: reserved, compiled and stored. The second (key 1):
    // reserved; its body (key 2) reserved and stored; then its own
    // reservation given up; then its thunk (key 3) reserved and stored.
    // Entries are put by the writer thread, each after its reservation,
    // in order, but at no fixed point among the defining thread's events.
    let (puts, reservations): (Vec<_>, Vec<_>) =
        events.iter().copied().partition(|(op, _)| *op == "put");
    assert_eq!(
        reservations,
        [
            ("reserve", 0),
            ("reserve", 1),
            ("reserve", 2),
            ("release", 1),
            ("reserve", 3),
        ],
        "{events:?}"
    );
    assert_eq!(puts, [("put", 0), ("put", 2), ("put", 3)], "{events:?}");
    for (i, (op, key)) in events.iter().enumerate() {
        if *op == "put" {
            assert!(events[..i].contains(&("reserve", *key)), "{events:?}");
        }
    }
}

/// `text` (a `system_v (i64, i64) -> i64` function) with a stack limit:
/// its first argument, as the `vmctx` the limit is read from.
fn stack_limited(text: &str) -> String {
    text.replacen(
        "(i64, i64) -> i64 system_v {",
        "(i64 vmctx, i64) -> i64 system_v {\n    gv0 = vmctx\n    stack_limit = gv0",
        1,
    )
}

/// Functions with a stack limit merge under the default
/// [`StackDepth`](jitfold::similar::StackDepth), in batch and eager mode,
/// and not with `with_exact_stack_depth`, nor when the group's growth is
/// above the bound; the same pair without the limit merges under every
/// choice.
#[test]
fn functions_with_a_stack_limit_merge_within_the_stack_growth_bound() {
    use jitfold::similar::StackDepth;
    let plain = [
        padded(&arithmetic("system_v", 3, 5, -7, 1000), 24),
        padded(&arithmetic("system_v", -3, 5, 100, -1), 24),
    ];
    let with_limit: Vec<String> = plain.iter().map(|t| stack_limited(t)).collect();
    assert!(with_limit[0].contains("stack_limit"), "{}", with_limit[0]);
    let default = SimilarOptions::default();
    let exact = default.with_exact_stack_depth();
    // Three parameters (`a`, `c`, `d`), no stack argument: 16 + 3 * 8 + 16
    // bytes.
    let growth = 56;
    let just_within = SimilarOptions {
        stack: StackDepth::Bounded { max_growth: growth },
        ..default
    };
    let just_above = SimilarOptions {
        stack: StackDepth::Bounded {
            max_growth: growth - 1,
        },
        ..default
    };
    let cases = [
        (&plain[..], default, 2),
        (&plain[..], exact, 2),
        (&plain[..], just_above, 2),
        (&with_limit[..], default, 2),
        (&with_limit[..], just_within, 2),
        (&with_limit[..], just_above, 0),
        (&with_limit[..], exact, 0),
    ];
    for (texts, similar, merged) in cases {
        let funcs: Vec<Function> = texts.iter().map(|t| parse(t)).collect();
        assert_eq!(
            similar::mergeable(&funcs[0], false, similar.stack),
            funcs[0].stack_limit.is_none() || similar.stack != StackDepth::Exact,
        );
        for options in [
            DedupOptions::batch().with_similar(similar),
            DedupOptions::eager().with_similar(similar),
        ] {
            let mut m = DedupModule::<JITModule>::with_options(jit_builder(), options);
            define_all(&mut m, &funcs, &[]);
            m.finalize_definitions().unwrap();
            // Eager mode merges the second member only.
            let expected = if options.mode == jitfold::Mode::Eager {
                merged / 2
            } else {
                merged
            };
            assert_eq!(
                m.stats().similar_merged,
                expected,
                "{options}: {}",
                texts[0]
            );
        }
    }
}

/// Merged functions with a stack limit still check it in every frame:
/// with the limit below the stack they return what they return unmerged,
/// and with it above the stack pointer they trap, as unmerged (each call
/// in a child process). Members and thunks in the `tail` convention too
/// (the thunk tail-calls the body and checks the limit itself).
#[cfg(all(feature = "fuzzing", unix))]
#[test]
fn merged_functions_with_a_stack_limit_still_trap_on_it() {
    use jitfold::fuzzing::isolated::{Entry, run};
    for conv in ["system_v", "tail"] {
        let texts: Vec<String> = [(3, 5, -7, 1000), (-3, 5, 100, -1), (9, 5, 1, 7)]
            .iter()
            .map(|&(a, b, c, d)| padded(&arithmetic("system_v", a, b, c, d), 24))
            .map(|t| stack_limited(&t))
            .collect();
        let funcs: Vec<Function> = texts.iter().map(|t| parse(t)).collect();
        // The members themselves in `conv`, called through `system_v`
        // entries.
        let funcs: Vec<Function> = funcs
            .into_iter()
            .map(|mut f| {
                if conv == "tail" {
                    f.signature.call_conv = CallConv::Tail;
                }
                f
            })
            .collect();
        let entries = all(funcs.len());
        let mut plain = jit();
        let (_, plain_entries) = define_all(&mut plain, &funcs, &entries);
        plain.finalize_definitions().unwrap();
        let mut dedup = DedupModule::<JITModule>::with_options(jit_builder(), similar_batch());
        let (_, dedup_entries) = define_all(&mut dedup, &funcs, &entries);
        dedup.finalize_definitions().unwrap();
        assert_eq!(dedup.stats().similar_merged, funcs.len() as u64, "{conv}");
        let entry = |ptr: *const u8| -> Entry {
            // SAFETY: every entry is `system_v (i64, i64) -> i64`, the
            // host's C convention on the Unix hosts these tests run on,
            // and its module was finalized.
            unsafe { std::mem::transmute(ptr) }
        };
        // The limit is the first argument: 0 is below every stack,
        // `i64::MAX` above every user-space stack pointer (and far enough
        // from the top that adding a frame's size does not wrap).
        let mut calls = Vec::new();
        for (&p, &d) in plain_entries.iter().zip(&dedup_entries) {
            for limit in [0, i64::MAX] {
                calls.push((entry(plain.get_finalized_function(p)), limit, 77));
                calls.push((entry(dedup.get_finalized_function(d)), limit, 77));
            }
        }
        let results = run(&calls).unwrap();
        for (i, pair) in results.chunks(2).enumerate() {
            assert_eq!(pair[0], pair[1], "{conv}: call {i}");
            assert_eq!(pair[0].is_none(), i % 2 == 1, "{conv}: call {i} traps");
        }
    }
}

/// `u0:{id}`, in `conv`, with its first argument as its stack limit: it
/// calls itself `n` (its second argument) levels deep and adds `c` and
/// mixes in `n` on the way back (enough instructions for merging to pay).
#[cfg(all(feature = "fuzzing", unix))]
pub(crate) fn recursing_to_the_limit(id: u32, conv: &str, c: i64) -> String {
    let mut mix = String::new();
    let mut prev = "v6".to_string();
    for i in 0..24 {
        let op = if i % 2 == 0 { "iadd" } else { "bxor" };
        mix.push_str(&format!("v{} = {op} {prev}, v3\n", 100 + i));
        prev = format!("v{}", 100 + i);
    }
    format!(
        "function u0:{id}(i64 vmctx, i64) -> i64 {conv} {{
             gv0 = vmctx
             fn0 = colocated u0:{id}(i64 vmctx, i64) -> i64 {conv}
             stack_limit = gv0
         block0(v0: i64, v1: i64):
             brif v1, block1, block2
         block1:
             v2 = iconst.i64 1
             v3 = isub v1, v2
             v4 = call fn0(v0, v3)
             v5 = iconst.i64 {c}
             v6 = iadd v4, v5
             {mix}
             return {prev}
         block2:
             return v1
         }}"
    )
}

/// `u0:{id}(gap, n)`: calls `u0:{member}` (in `conv`) `n` levels deep
/// with the stack limit `gap` bytes below its own stack pointer. The
/// rotation by a multiple of 64 (no rotation; a shift amount stays in the
/// shape) keeps entries of different members from sharing a shape.
#[cfg(all(feature = "fuzzing", unix))]
pub(crate) fn entry_with_a_limit(id: u32, member: u32, conv: &str) -> String {
    let amount = 64 * id;
    format!(
        "function u0:{id}(i64, i64) -> i64 system_v {{
             sig0 = (i64 vmctx, i64) -> i64 {conv}
             fn0 = colocated u0:{member} sig0
         block0(v0: i64, v1: i64):
             v2 = get_stack_pointer.i64
             v3 = isub v2, v0
             v4 = iconst.i64 {amount}
             v5 = rotl v1, v4
             v6 = call fn0(v3, v5)
             return v6
         }}"
    )
}

/// Merged functions with a stack limit that recurse until it traps: the
/// least gap between the stack pointer and the limit at which a call
/// `DEPTH` levels deep returns (found by bisection, each try in a child
/// process) may grow under merging by at most the group's
/// [`CostModel::stack_growth`](jitfold::similar::CostModel::stack_growth)
/// per level, a call with no room at all always traps (so no overflow
/// goes undetected), and every call that returns returns what the member
/// returns unmerged. In `system_v` (thunks that call and check) and in
/// `tail` (thunks that tail-call and, with every argument in a register,
/// do not check: the body does), in batch mode and (`tail`) eager mode.
#[cfg(all(feature = "fuzzing", unix))]
#[test]
fn a_merged_recursion_traps_for_its_stack_within_the_growth_bound() {
    use jitfold::fuzzing::isolated::{Entry, run};
    const DEPTH: i64 = 40;
    let eager = DedupOptions::eager().with_similar(SimilarOptions::default());
    // Eager mode keeps the first member's own code and merges the second.
    for (conv, options, merged) in [
        ("system_v", similar_batch(), 2),
        ("tail", similar_batch(), 2),
        ("tail", eager, 1),
    ] {
        let texts = [
            recursing_to_the_limit(0, conv, 3),
            recursing_to_the_limit(1, conv, -5),
            entry_with_a_limit(2, 0, conv),
            entry_with_a_limit(3, 1, conv),
        ];
        let funcs: Vec<Function> = texts.iter().map(|t| parse(t)).collect();
        let member_sig = funcs[0].signature.clone();
        let mut plain = jit();
        let (plain_ids, _) = define_all(&mut plain, &funcs, &[]);
        plain.finalize_definitions().unwrap();
        let mut dedup = DedupModule::<JITModule>::with_options(jit_builder(), options);
        let (dedup_ids, _) = define_all(&mut dedup, &funcs, &[]);
        dedup.finalize_definitions().unwrap();
        assert_eq!(dedup.stats().similar_merged, merged, "{conv}, {options}");
        // The body's parameters: the constant and the callee.
        let growth = SimilarOptions::default()
            .model
            .stack_growth(&member_sig, &[I64, I64]);
        let entry = |ptr: *const u8| -> Entry {
            // SAFETY: the entries are `system_v (i64, i64) -> i64`, the
            // host's C convention on the Unix hosts these tests run on,
            // and their modules were finalized.
            unsafe { std::mem::transmute(ptr) }
        };
        // The least gap (a multiple of 8) at which `f` returns.
        let least_gap = |f: Entry| -> i64 {
            let (mut trapped, mut returned) = (0i64, 1 << 16);
            assert!(run(&[(f, returned, DEPTH)]).unwrap()[0].is_some(), "{conv}");
            while returned - trapped > 8 {
                let mid = (trapped + returned) / 2 / 8 * 8;
                match run(&[(f, mid, DEPTH)]).unwrap()[0] {
                    Some(_) => returned = mid,
                    None => trapped = mid,
                }
            }
            returned
        };
        for member in 0..2 {
            let p = entry(plain.get_finalized_function(plain_ids[member + 2]));
            let d = entry(dedup.get_finalized_function(dedup_ids[member + 2]));
            let results = run(&[(p, 1 << 16, DEPTH), (d, 1 << 16, DEPTH), (d, 0, DEPTH)]).unwrap();
            assert_eq!(results[0], results[1], "{conv}: member {member}");
            assert_eq!(results[2], None, "{conv}: member {member} with no room");
            let (unmerged, merged) = (least_gap(p), least_gap(d));
            assert!(
                merged <= unmerged + (DEPTH + 1) * growth as i64,
                "{conv}: member {member} needs {merged} bytes merged, {unmerged} unmerged, \
                 {growth} more per level allowed"
            );
        }
    }
}

/// An `iconst` whose bits do not fit its type (the builder does not mask
/// them, and with the verifier off nothing rejects them) folds otherwise
/// than a parameter of its type would: `uextend` of `iconst.i32` with all
/// 64 bits set is -1 after the mid-end, of an `i32` parameter 2^32 - 1. It
/// stays in the shape, so such a function shares one only with its exact
/// twin; in range, the same constant is a parameter.
#[test]
fn an_integer_constant_wider_than_its_type_is_not_a_parameter() {
    let text = |c: i64| {
        format!(
            "function %f(i64, i64) -> i64 system_v {{
             block0(v0: i64, v1: i64):
                 v2 = iconst.i32 {c}
                 v3 = uextend.i64 v2
                 v4 = iadd v0, v3
                 return v4
             }}"
        )
    };
    // `iconst.i32 5`, its immediate then set to `bits`.
    let with_bits = |bits: i64| {
        let mut func = parse(&text(5));
        let inst = func
            .layout
            .block_insts(func.layout.entry_block().unwrap())
            .next()
            .unwrap();
        func.dfg.insts[inst] = cranelift_codegen::ir::InstructionData::UnaryImm {
            opcode: cranelift_codegen::ir::Opcode::Iconst,
            imm: cranelift_codegen::ir::immediates::Imm64::new(bits),
        };
        func
    };
    let in_range = shape_of(&with_bits(0xffff_ffff));
    let seven = shape_of(&parse(&text(7)));
    assert_eq!(in_range.shape, seven.shape);
    assert_eq!(in_range.values.len(), 1);
    let wide = shape_of(&with_bits(-1));
    assert_ne!(wide.shape, seven.shape);
    assert!(wide.values.is_empty());
}
