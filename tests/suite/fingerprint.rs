//! The fingerprint's laws: invariance under renumbering, sensitivity to every
//! semantic fact, agreement with an independent oracle, and order laws.
//! Generated functions come from the fuzz generator (feature `fuzzing`,
//! Unix hosts).

#![cfg(unix)]

use crate::common;

use crate::common::canon::canonical_text;
use cranelift_codegen::ir::Function;
use jitfold::fuzzing::program::{Body, Variant, standalone};
use jitfold::{Fingerprint, Fingerprinter};
use proptest::prelude::*;
use std::collections::HashMap;

fn formats_text() -> String {
    std::fs::read_to_string(common::data_dir().join("formats.clif")).unwrap()
}

fn has_alias(func: &Function) -> bool {
    func.dfg.values().any(|v| func.dfg.value_is_alias(v))
}

/// Functions a generated body may call (declared as imports).
const CALLEES: usize = 2;

/// The body for `seed`: one function of the fuzz generator.
fn body(seed: u64) -> Body {
    Body::from_seed(seed, CALLEES).expect("a seed makes a body")
}

/// `body` emitted as `variant` says, named `u0:name`.
fn build(body: &Body, variant: Variant, name: u32) -> Function {
    standalone(body, CALLEES, name, variant)
}

#[test]
fn renumbered_twins_have_one_key() {
    let mut fp = Fingerprinter::new();
    let mut texts_differ = 0;
    let mut with_aliases = 0;
    let mut checked = 0;
    for seed in 0..300 {
        let generated = body(seed);
        let base = build(&generated, Variant::default(), 0);
        let key = fp.fingerprint(&base);
        let plain = Variant::default();
        let variants = [
            (
                Variant {
                    reverse_block_creation: true,
                    ..plain
                },
                0,
            ),
            (
                Variant {
                    reverse_layout: true,
                    ..plain
                },
                0,
            ),
            (
                Variant {
                    dead_code: true,
                    ..plain
                },
                0,
            ),
            (
                Variant {
                    srclocs: true,
                    ..plain
                },
                0,
            ),
            (plain, 77),
            (Variant::TWIN, 5),
        ];
        with_aliases += usize::from(has_alias(&base));
        for (v, name) in variants {
            let twin = build(&generated, v, name);
            assert_eq!(
                key,
                fp.fingerprint(&twin),
                "seed {seed}, {v:?}, name {name}:\n{}\n{}",
                base.display(),
                twin.display()
            );
            texts_differ += usize::from(base.display().to_string() != twin.display().to_string());
            checked += 1;
        }
    }
    // The variants really are different functions as printed, and value
    // aliases (left by `use_var`) really occur.
    assert!(
        texts_differ * 10 >= checked * 8,
        "{texts_differ} of {checked} differ"
    );
    assert!(
        with_aliases >= 20,
        "only {with_aliases} functions have aliases"
    );
}

#[test]
fn clif_text_twins_have_one_key() {
    // The same function written with other numbers, another block order, an
    // unreachable block, source locations, a value alias and another name.
    let a = "function %a(i64) -> i64 {
        ss0 = explicit_slot 8
        block0(v0: i64):
            v1 = iconst.i64 3
            brif v0, block1(v1), block2
        block1(v2: i64):
            v3 = iadd v2, v0
            return v3
        block2:
            v5 = stack_addr.i64 ss0
            store v0, v5
            v4 = load.i64 v5
            return v4
    }";
    let b = "function %b(i64) -> i64 {
        ss5 = explicit_slot 8
        ss6 = explicit_slot 32
        block7(v10: i64):
        @0010 v11 = iconst.i64 3
        @0011 brif v10, block3(v11), block9
        block4:
            v50 = iconst.i64 1
            return v50
        block9:
            v20 = stack_addr.i64 ss5
            store v10, v20
            v14 = load.i64 v20
            v15 -> v14
            return v15
        block3(v12: i64):
            v13 = iadd v12, v10
            return v13
    }";
    let fa = &common::parse_valid(a)[0];
    let fb = &common::parse_valid(b)[0];
    // ss6 is unused but enlarges the frame: in the key.
    assert_ne!(Fingerprint::of(fa), Fingerprint::of(fb));
    // Without it, the twins have one key; the parser's empty placeholders
    // ss0..ss4 (for the gap before ss5) do not count.
    let fb = &common::parse_valid(&b.replace("        ss6 = explicit_slot 32\n", ""))[0];
    assert_eq!(Fingerprint::of(fa), Fingerprint::of(fb));
    assert_eq!(
        Fingerprint::of(fa).stable_hash(),
        Fingerprint::of(fb).stable_hash()
    );
    assert_eq!(canonical_text(fa), canonical_text(fb));
    // The twins really differ as printed.
    assert_ne!(fa.display().to_string(), fb.display().to_string());
}

/// Each mutation changes one semantic fact of `formats.clif`; the mutated
/// file must still be valid, and the mutated function must get a new key.
const MUTATIONS: &[(&str, &str, &str)] = &[
    ("opcode", "v5 = iadd v0, v4", "v5 = isub v0, v4"),
    ("stack map entry offset", "i32 @ ss0+8", "i32 @ ss0+12"),
    ("stack map entry type", "i32 @ ss0+8", "i64 @ ss0+8"),
    (
        "stack map entry slot",
        "i32 @ ss0+8, i64 @ ss0+0",
        "i32 @ ss0+8, i64 @ ss1+0",
    ),
    (
        "stack map entries",
        ", stack_map=[i32 @ ss0+8, i64 @ ss0+0]",
        ", stack_map=[i32 @ ss0+8]",
    ),
    (
        "stack map on a call",
        "v17 = call fn0(v13, v14)",
        "v17 = call fn0(v13, v14), stack_map=[i32 @ ss0+8]",
    ),
    (
        "result type",
        "v23 = atomic_load.i64 v12",
        "v23 = atomic_load.i32 v12",
    ),
    ("Imm64", "iconst.i32 42", "iconst.i32 43"),
    ("Ieee16", "f16const 0x1.0p0", "f16const 0x1.8p0"),
    ("Ieee32", "f32const 0x1.5p2", "f32const 0x1.6p2"),
    (
        "Ieee64 -0.0 vs 0.0",
        "f64const -0x0.0p0",
        "f64const 0x0.0p0",
    ),
    ("NaN payload f64", "+NaN:0x1", "+NaN:0x3"),
    ("NaN sign f32", "-NaN:0x2", "+NaN:0x2"),
    ("Offset32", "little region0 v12+8", "little region0 v12+12"),
    (
        "stack_addr offset",
        "stack_addr.i64 ss0+4",
        "stack_addr.i64 ss0+0",
    ),
    ("lane index", "extractlane v4, 2", "extractlane v4, 3"),
    (
        "insertlane index",
        "insertlane v4, v5, 1",
        "insertlane v4, v5, 0",
    ),
    ("IntCC", "icmp sgt", "icmp ugt"),
    ("FloatCC", "fcmp lt", "fcmp gt"),
    (
        "memflags notrap",
        "load.i64 notrap aligned v12",
        "load.i64 aligned v12",
    ),
    ("memflags endianness", "little region0", "big region0"),
    (
        "memflags readonly (global value)",
        "notrap aligned readonly gv0+8",
        "notrap aligned gv0+8",
    ),
    (
        "alias region",
        "region0 = 7 \"heap\"",
        "region0 = 8 \"heap\"",
    ),
    ("no alias region", "little region0 v12+8", "little v12+8"),
    ("trap code (trapz)", "trapz v20, user9", "trapz v20, user8"),
    ("trap code (IntAddTrap)", "v19, user7", "v19, user6"),
    ("trap code (trap)", "trap user3", "trap user4"),
    ("atomic rmw op", "atomic_rmw.i64 add", "atomic_rmw.i64 sub"),
    (
        "stack slot size",
        "explicit_slot 16, align = 8",
        "explicit_slot 24, align = 8",
    ),
    (
        "stack slot alignment",
        "explicit_slot 16, align = 8",
        "explicit_slot 16, align = 16",
    ),
    ("function call conv", "-> i64 system_v {", "-> i64 fast {"),
    (
        "argument extension",
        "(i64, i32 uext) -> i64 sext",
        "(i64, i32 sext) -> i64 sext",
    ),
    (
        "return extension",
        "(i64, i32 uext) -> i64 sext",
        "(i64, i32 uext) -> i64 uext",
    ),
    (
        "argument purpose",
        "sig0 = (i64, i32 uext)",
        "sig0 = (i64 vmctx, i32 uext)",
    ),
    (
        "callee call conv",
        "%other(i32) -> i32 tail",
        "%other(i32) -> i32 system_v",
    ),
    ("callee name", "fn0 = %callee sig0", "fn0 = %callee2 sig0"),
    ("callee colocated", "fn1 = colocated %other", "fn1 = %other"),
    (
        "global value load offset",
        "readonly gv0+8",
        "readonly gv0+16",
    ),
    (
        "global value iadd_imm",
        "iadd_imm.i64 gv1, 16",
        "iadd_imm.i64 gv1, 24",
    ),
    ("symbol offset", "%some_data+4", "%some_data+8"),
    (
        "symbol colocated",
        "symbol colocated %some_data",
        "symbol %some_data",
    ),
    ("stack limit", "stack_limit = gv2", "stack_limit = gv1"),
    (
        "constant pool bytes",
        "0x00000001000000020000000300000004",
        "0x00000001000000020000000300000005",
    ),
    (
        "shuffle immediate",
        "0x1f1e1d1c1b1a19181716151413121110",
        "0x1f1e1d1c1b1a19181716151413121111",
    ),
    (
        "jump table target",
        "[block1(v29), block3, block1(v26)]",
        "[block1(v29), block1(v26), block3]",
    ),
    (
        "jump table args",
        "[block1(v29), block3, block1(v26)]",
        "[block1(v26), block3, block1(v29)]",
    ),
    (
        "jump table default",
        "br_table v0, block3, [",
        "br_table v0, block1(v26), [",
    ),
    (
        "block argument order",
        "brif v4, block1(v4, v2), block2",
        "brif v4, block1(v2, v4), block2",
    ),
    (
        "branch condition",
        "brif v9, block1(v26), block2",
        "brif v10, block1(v26), block2",
    ),
    ("exception tag", "tag0: block2(exn0)", "tag1: block2(exn0)"),
    ("exception context", "context v0, tag0", "context v1, tag0"),
    (
        "exception default",
        "default: block3(exn0) ]\nblock1",
        "default: block2(exn0) ]\nblock1",
    ),
    (
        "operand order",
        "v11 = select v10, v1, v6",
        "v11 = select v10, v6, v1",
    ),
];

/// The hand-written test data files.
const TEST_DATA: [&str; 3] = ["formats.clif", "dynamic.clif", "layout.clif"];

#[test]
fn test_data_covers_every_instruction_format() {
    let mut formats = std::collections::HashSet::new();
    for name in TEST_DATA {
        let text = std::fs::read_to_string(common::data_dir().join(name)).unwrap();
        for func in common::parse_valid(&text) {
            for block in func.layout.blocks() {
                for inst in func.layout.block_insts(block) {
                    formats.insert(format!("{:?}", func.dfg.insts[inst].opcode().format()));
                }
            }
        }
    }
    // `InstructionData` has 36 variants in Cranelift 0.135.8.
    assert_eq!(formats.len(), 36, "{formats:?}");
}

fn functions_by_name(text: &str) -> Vec<(String, Function)> {
    common::parse_valid(text)
        .into_iter()
        .map(|f| (f.name.to_string(), f))
        .collect()
}

#[test]
fn every_semantic_fact_changes_the_key() {
    let text = formats_text();
    let originals = functions_by_name(&text);
    for &(what, from, to) in MUTATIONS {
        assert_eq!(
            text.matches(from).count(),
            1,
            "{what}: `{from}` must occur once"
        );
        let mutated = functions_by_name(&text.replacen(from, to, 1));
        let changed: Vec<_> = originals
            .iter()
            .zip(&mutated)
            .filter(|((_, a), (_, b))| Fingerprint::of(a) != Fingerprint::of(b))
            .map(|((name, _), _)| name.clone())
            .collect();
        assert_eq!(changed.len(), 1, "{what}: changed keys of {changed:?}");
    }
}

fn oracle_set() -> Vec<Function> {
    let mut funcs = Vec::new();
    let text = formats_text();
    for name in TEST_DATA {
        let t = std::fs::read_to_string(common::data_dir().join(name)).unwrap();
        funcs.extend(common::parse_valid(&t));
    }
    for &(_, from, to) in MUTATIONS {
        funcs.extend(common::parse_valid(&text.replacen(from, to, 1)));
    }
    // Random variants and names.
    let choices = common::seed_bytes(7, 120);
    for (seed, c) in (0..120).zip(choices) {
        let v = Variant {
            reverse_block_creation: c & 1 != 0,
            reverse_layout: c & 2 != 0,
            dead_code: c & 4 != 0,
            srclocs: c & 8 != 0,
        };
        funcs.push(build(&body(seed % 80), v, u32::from(c >> 4) % 3));
    }
    funcs
}

#[test]
fn keys_agree_with_canonical_printing() {
    let funcs = oracle_set();
    let keys: Vec<Fingerprint> = funcs.iter().map(Fingerprint::of).collect();
    let texts: Vec<String> = funcs.iter().map(canonical_text).collect();
    let (mut equal, mut unequal) = (0, 0);
    for i in 0..funcs.len() {
        for j in i + 1..funcs.len() {
            let key_eq = keys[i] == keys[j];
            let text_eq = texts[i] == texts[j];
            assert_eq!(
                key_eq, text_eq,
                "key says {key_eq}, text says {text_eq}:\n{}\n{}",
                texts[i], texts[j]
            );
            if key_eq { equal += 1 } else { unequal += 1 }
        }
    }
    assert!(
        equal >= 100 && unequal >= 1000,
        "equal {equal}, unequal {unequal}"
    );
}

fn order_set() -> Vec<Fingerprint> {
    oracle_set().iter().map(Fingerprint::of).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn order_laws(i in 0usize..10_000, j in 0usize..10_000, k in 0usize..10_000) {
        thread_local!(static SET: Vec<Fingerprint> = order_set());
        SET.with(|set| {
            let (a, b, c) = (&set[i % set.len()], &set[j % set.len()], &set[k % set.len()]);
            // Antisymmetry and consistency with Eq and Hash.
            prop_assert_eq!(a.cmp(b), b.cmp(a).reverse());
            prop_assert_eq!(a == b, a.cmp(b).is_eq());
            if a == b {
                prop_assert_eq!(a.fast_hash(), b.fast_hash());
                prop_assert_eq!(a.stable_hash(), b.stable_hash());
            }
            // Transitivity.
            if a <= b && b <= c {
                prop_assert!(a <= c);
            }
            Ok(())
        })?;
    }
}

#[test]
fn erased_calling_conventions_equal_only_each_other() {
    let funcs = common::parse_valid(
        "function %sysv(i64) -> i64 system_v {
         block0(v0: i64):
             v1 = iconst.i64 7
             v2 = iadd v0, v1
             return v2
         }
         function %tail(i64) -> i64 tail {
         block0(v0: i64):
             v1 = iconst.i64 7
             v2 = iadd v0, v1
             return v2
         }
         function %other(i64) -> i64 system_v {
         block0(v0: i64):
             v1 = iconst.i64 8
             v2 = iadd v0, v1
             return v2
         }",
    );
    let [sysv, tail, other] = [0, 1, 2].map(|i| Fingerprint::of(&funcs[i]));
    let [sysv_erased, tail_erased, other_erased] =
        [&sysv, &tail, &other].map(Fingerprint::erase_call_conv);
    assert_ne!(sysv, tail);
    assert_eq!(sysv_erased, tail_erased);
    assert_eq!(sysv_erased.fast_hash(), tail_erased.fast_hash());
    assert_eq!(sysv_erased.cmp(&tail_erased), std::cmp::Ordering::Equal);
    assert_ne!(sysv_erased, other_erased);
    // An erased key is of another type than an exact one, so the two are
    // never compared.
}

/// The walk reads stack map entries where it encodes the formats of calls
/// and of `stack_switch`: every opcode that can carry entries (a safepoint)
/// has one of those.
#[test]
fn every_safepoint_has_a_format_whose_stack_maps_are_read() {
    use cranelift_codegen::ir::Opcode;
    use cranelift_codegen::ir::instructions::InstructionFormat as F;
    let safepoints: Vec<Opcode> = Opcode::all()
        .iter()
        .copied()
        .filter(|op| op.is_safepoint())
        .collect();
    assert!(safepoints.contains(&Opcode::Call), "{safepoints:?}");
    for op in safepoints {
        assert!(
            matches!(
                op.format(),
                F::Call | F::CallIndirect | F::TryCall | F::TryCallIndirect | F::Ternary
            ),
            "{op} is a safepoint of format {:?}",
            op.format()
        );
    }
}

/// `stack_switch` is a safepoint too: its stack map entries (which
/// Cranelift's printer leaves out, so the printing oracle cannot see them)
/// are in the key.
#[test]
fn stack_switch_stack_maps_are_in_the_key() {
    let switch = |stack_map: &str| {
        let text = format!(
            "function %switch(i64, i64, i64) -> i64 system_v {{
                 ss0 = explicit_slot 8
                 ss1 = explicit_slot 16
             block0(v0: i64, v1: i64, v2: i64):
                 v3 = stack_switch v0, v1, v2{stack_map}
                 return v3
             }}"
        );
        Fingerprint::of(&common::parse_valid(&text)[0])
    };
    let base = switch(", stack_map=[i64 @ ss0+0]");
    assert_eq!(base, switch(", stack_map=[i64 @ ss0+0]"));
    for other in [
        "",
        ", stack_map=[i32 @ ss0+0]",
        ", stack_map=[i64 @ ss0+4]",
        ", stack_map=[i64 @ ss1+0]",
        ", stack_map=[i64 @ ss0+0, i64 @ ss1+0]",
    ] {
        assert_ne!(base, switch(other), "{other}");
    }
}

/// The functions of `layout.clif` by name.
fn layout_functions() -> HashMap<String, Function> {
    let text = std::fs::read_to_string(common::data_dir().join("layout.clif")).unwrap();
    functions_by_name(&text).into_iter().collect()
}

/// Stack slots are in the key in the order Cranelift lays them out (index
/// order), unused ones included; a callee or signature declared twice is
/// one declaration, but not for `func_addr`. Checked against the machine
/// code Cranelift makes of each pair, which shares nothing with the walk.
#[test]
fn frame_layout_and_declarations_are_keyed_as_cranelift_compiles_them() {
    let funcs = layout_functions();
    let isa = jitfold::isa::isa_by_name(
        "x86_64",
        jitfold::isa::flags(&[("opt_level", "speed"), ("preserve_frame_pointers", "true")])
            .unwrap(),
    )
    .unwrap();
    let pairs = [
        ("slot_order_ab", "slot_order_ba", false),
        ("unused_slot_first", "unused_slot_last", false),
        ("callee_declared_twice", "callee_declared_once", true),
        ("address_declared_twice", "address_declared_once", false),
        ("constant_once", "constant_twice", false),
        ("dynamic_slot_unused", "dynamic_slot_none", false),
    ];
    for (a, b, same) in pairs {
        let (fa, fb) = (&funcs[&format!("%{a}")], &funcs[&format!("%{b}")]);
        assert_eq!(
            Fingerprint::of(fa) == Fingerprint::of(fb),
            same,
            "{a} vs {b}"
        );
        let code = |f: &Function| jitfold::compile::compile(f, &*isa).unwrap().code;
        assert_eq!(code(fa) == code(fb), same, "{a} vs {b}: machine code");
    }
}

/// A sized slot of size 0 and alignment 1 moves nothing when unused (the
/// parser's placeholders for gaps in `ssN` numbers), but a used one is
/// where the next slot would start, and any other unused slot counts.
#[test]
fn empty_slots_are_left_out_of_the_frame_unless_used() {
    let with = |slots: &str, used: &str| {
        let text = format!(
            "function %f() -> i64 {{
                {slots}
            block0:
                v0 = stack_addr.i64 {used}
                return v0
            }}"
        );
        Fingerprint::of(&common::parse_valid(&text)[0])
    };
    let one = "ss9 = explicit_slot 8";
    let two = "ss0 = explicit_slot 8\n ss3 = explicit_slot 0\n ss5 = explicit_slot 0\n ss9 = explicit_slot 8";
    // ss0..ss8 are placeholders here.
    assert_eq!(with(one, "ss9"), with("ss0 = explicit_slot 8", "ss0"));
    assert_ne!(
        with(one, "ss9"),
        with(
            "ss0 = explicit_slot 8, align = 16\n ss9 = explicit_slot 8",
            "ss9"
        ),
        "an unused slot that is not empty"
    );
    // A used placeholder is where ss9 starts, as all of ss1..ss8 are.
    assert_ne!(with(two, "ss3"), with(two, "ss0"), "a used empty slot");
    assert_eq!(
        with(two, "ss3"),
        with(two, "ss5"),
        "two empty slots in one place"
    );
}

/// The walk reads only what exists: a function that jumps to a block or
/// uses a value that was never created (the verifier rejects it) gets a
/// fingerprint, not a panic.
#[test]
fn references_to_missing_entities_do_not_panic() {
    use cranelift_codegen::cursor::{Cursor, FuncCursor};
    use cranelift_codegen::ir::{AbiParam, Block, InstBuilder, Value, types::I64};
    let mut func = Function::new();
    func.signature.returns.push(AbiParam::new(I64));
    let entry = func.dfg.make_block();
    let next = func.dfg.make_block();
    func.layout.append_block(entry);
    func.layout.append_block(next);
    let mut pos = FuncCursor::new(&mut func).at_bottom(entry);
    let one = pos.ins().iconst(I64, 1);
    pos.ins()
        .brif(one, Block::from_u32(4_000_000_000), &[], next, &[]);
    pos.goto_bottom(next);
    pos.ins().return_(&[Value::from_u32(4_000_000_000)]);
    let broken = Fingerprint::of(&func);
    assert_ne!(broken, Fingerprint::of(&Function::new()));
}

/// Nor do references to declarations that do not exist, as far as the
/// builder makes them (it looks up a callee's signature for `call`, but not
/// for `func_addr`): a function address, a callee's signature and a global
/// value. They are written as missing, not numbered (numbering would size a
/// table by the entity's number, which may be anything).
#[test]
fn references_to_missing_declarations_do_not_panic() {
    use cranelift_codegen::cursor::{Cursor, FuncCursor};
    use cranelift_codegen::ir::{
        AbiParam, ExtFuncData, ExternalName, FuncRef, GlobalValue, InstBuilder, SigRef, types::I64,
    };
    let huge = 4_000_000_000;
    let mut func = Function::new();
    func.signature.returns.push(AbiParam::new(I64));
    let callee = func.import_function(ExtFuncData {
        name: ExternalName::testcase("g"),
        signature: SigRef::from_u32(huge),
        colocated: false,
        patchable: false,
    });
    let entry = func.dfg.make_block();
    func.layout.append_block(entry);
    let mut pos = FuncCursor::new(&mut func).at_bottom(entry);
    let missing = pos.ins().func_addr(I64, FuncRef::from_u32(huge));
    let unsigned = pos.ins().func_addr(I64, callee);
    let symbol = pos.ins().symbol_value(I64, GlobalValue::from_u32(huge));
    let sum = pos.ins().iadd(missing, unsigned);
    let sum = pos.ins().iadd(sum, symbol);
    pos.ins().return_(&[sum]);
    let broken = Fingerprint::of(&func);
    assert_ne!(broken, Fingerprint::of(&Function::new()));
}

/// Collecting value labels keeps `vmctx` alive to the end of the function,
/// which changes the code: whether they are collected is in the key (what
/// they say is not).
#[test]
fn collecting_value_labels_changes_the_key() {
    let text = "function %f(i64 vmctx) -> i64 {
        block0(v0: i64):
            v1 = load.i64 v0
            return v1
    }";
    let plain = common::parse_valid(text).remove(0);
    let mut labelled = plain.clone();
    labelled.dfg.collect_debug_info();
    assert_ne!(Fingerprint::of(&plain), Fingerprint::of(&labelled));
}

/// One walk's parts agree with each other: its borrowed key, its owned
/// fingerprint, its template (copied on its own) and the template taken
/// from the fingerprint (sharing its words) are the same keys with the
/// same hashes, and the template with the walk's names is the fingerprint.
#[test]
fn a_walk_is_one_consistent_value() {
    let mut fingerprinter = Fingerprinter::new();
    for func in oracle_set().iter().take(200) {
        let walk = fingerprinter.walk(func);
        let fp = walk.fingerprint();
        assert_eq!(walk.key().key(), fp.key());
        assert_eq!(walk.key().fast_hash(), fp.fast_hash());
        assert_eq!(walk.instructions(), fp.instructions());
        let (copied, shared) = (walk.template(), fp.to_template());
        assert_eq!(copied, shared);
        assert_eq!(copied.fast_hash(), shared.fast_hash());
        assert_eq!(copied.stable_hash(), shared.stable_hash());
        assert_eq!(walk.names().len(), walk.address_taken().len());
        assert_eq!(copied.with_names(walk.names()), fp);
        assert_eq!(fp, Fingerprint::of(func));
    }
}

/// The one Cranelift version string is the version of every Cranelift
/// crate jitfold is built with.
#[test]
fn the_cranelift_version_is_the_one_built_against() {
    assert_eq!(
        jitfold::fingerprint::CRANELIFT_VERSION,
        cranelift_frontend::VERSION
    );
    assert_eq!(
        jitfold::fingerprint::CRANELIFT_VERSION,
        cranelift_jit::VERSION
    );
}

/// The signatures and dynamic types no instruction uses are in the key as
/// sets (Cranelift lowers each, and one it cannot lower fails the
/// compile; see `an_unused_declaration_cranelift_cannot_compile_is_not_ignored`
/// in `bad_input.rs`): their order and repeats do not matter, nor do
/// those that lower whenever the function does (equal to its own
/// signature, empty, or the CLIF parser's placeholders for gaps). A
/// constant pool counts only if its handles have a gap (see
/// `a_constant_pool_with_a_gap_is_not_the_twin_of_one_without`).
#[test]
fn unused_declarations_are_keyed_as_sets() {
    let key = |declarations: &str| {
        let text = format!(
            "function %f(i64) -> i64 system_v {{
                 {declarations}
             block0(v0: i64):
                 return v0
             }}"
        );
        Fingerprint::of(&common::parse_valid(&text)[0])
    };
    let none = key("");
    let a = key("sig0 = (i32) -> i64 system_v\n sig1 = (f64) fast");
    let b = key("sig0 = (f64) fast\n sig1 = (i32) -> i64 system_v\n sig2 = (f64) fast");
    assert_eq!(a, b, "order and repeats");
    assert_ne!(a, none);
    assert_ne!(a, key("sig0 = (i32) -> i64 system_v"));
    // Equal to the function's own; the gaps before it are empty `fast`.
    assert_eq!(none, key("sig3 = (i64) -> i64 system_v"));
    assert_eq!(none, key("sig0 = () tail"));
    // riscv64 and s390x cannot lower even an empty `winch` signature.
    assert_ne!(none, key("sig0 = () winch"));
    // Dynamic types by base type; `dt1` makes `dt0` a copy of it.
    let dynamic = |types: &str| key(&format!("gv0 = dyn_scale_target_const.i32x4\n {types}"));
    assert_eq!(
        dynamic(""),
        none,
        "an unused global value is not in the key"
    );
    let one = dynamic("dt0 = i32x4*gv0");
    assert_ne!(one, none);
    assert_eq!(one, dynamic("dt1 = i32x4*gv0"));
    assert_ne!(one, dynamic("dt0 = i64x2*gv0"));
    // A constant pool with handles 0 to its length is one word whatever
    // it holds; one with a gap is written out.
    let constant = "0x00000000000000000000000000000001";
    assert_eq!(none, key(&format!("const0 = {constant}")));
    let gap = key(&format!("const1 = {constant}"));
    assert_ne!(gap, none);
    assert_ne!(gap, key("const1 = 0x00000000000000000000000000000002"));
    assert_ne!(gap, key(&format!("const2 = {constant}")));
    // So is one whose bytes repeat (the mid-end takes the last handle of
    // bytes it adds, used or not), and its uses are by handle.
    let repeat = key(&format!("const0 = {constant}\n const1 = {constant}"));
    assert_ne!(repeat, none);
    let other = "0x00000000000000000000000000000002";
    let distinct = key(&format!("const0 = {constant}\n const1 = {other}"));
    assert_eq!(distinct, none);
    let uses = |handle: &str| {
        let text = format!(
            "function %f(i64) -> i64x2 system_v {{
                 const0 = {constant}
                 const1 = {constant}
             block0(v0: i64):
                 v1 = vconst.i64x2 {handle}
                 return v1
             }}"
        );
        Fingerprint::of(&common::parse_valid(&text)[0])
    };
    assert_ne!(uses("const0"), uses("const1"));
    // The order the bytes were set in decides which handle the mid-end
    // takes for them (the last): set out of handle order (the parser sets
    // them in text order), the pool's map is not one its handles make, and
    // the function merges with nothing, not even itself.
    let reversed = format!("const1 = {constant}\n const0 = {constant}");
    assert_ne!(key(&reversed), key(&reversed));
    assert_eq!(
        repeat,
        key(&format!("const0 = {constant}\n const1 = {constant}"))
    );
}

/// A constant pool whose map from bytes to handles is not the one its
/// handles make (`entries_mut` changes bytes without the map) is the
/// duplicate of nothing, not even of itself; in a pool written out by
/// handle, a handle the pool has and one it has not are never one use.
#[test]
fn an_irregular_constant_pool_merges_with_nothing() {
    use cranelift_codegen::cursor::{Cursor, FuncCursor};
    use cranelift_codegen::ir::{Constant, ConstantData, InstBuilder, types::I8X16};
    use cranelift_codegen::packed_option::ReservedValue;
    let base = common::parse_valid(
        "function %f(i64) -> i64 system_v {
         block0(v0: i64):
             return v0
         }",
    )
    .remove(0);
    let mut stale = base.clone();
    stale
        .dfg
        .constants
        .insert(ConstantData::from(vec![1u8; 16]));
    for data in stale.dfg.constants.entries_mut() {
        *data = ConstantData::from(vec![2u8; 16]);
    }
    let mut fresh = base.clone();
    fresh
        .dfg
        .constants
        .insert(ConstantData::from(vec![2u8; 16]));
    assert_eq!(Fingerprint::of(&fresh), Fingerprint::of(&base));
    assert_ne!(Fingerprint::of(&stale), Fingerprint::of(&base));
    assert_ne!(Fingerprint::of(&stale), Fingerprint::of(&stale));

    // The reserved handle (`u32::MAX`) is a handle like another.
    let using = |handle: Constant| {
        let mut func = base.clone();
        func.dfg
            .constants
            .set(Constant::from_u32(0), ConstantData::from(vec![1u8; 16]));
        func.dfg.constants.set(
            Constant::reserved_value(),
            ConstantData::from(vec![3u8; 16]),
        );
        let block = func.layout.entry_block().unwrap();
        let ret = func.layout.last_inst(block).unwrap();
        let mut pos = FuncCursor::new(&mut func).at_inst(ret);
        pos.ins().vconst(I8X16, handle);
        Fingerprint::of(&func)
    };
    assert_ne!(
        using(Constant::reserved_value()),
        using(Constant::from_u32(7))
    );
}
