//! The differential fuzz check over a fixed set of seeds, so every test run
//! exercises it (the same check `cargo fuzz run differential` runs).

#![cfg(unix)]

use crate::common;

use jitfold::fuzzing::differential_bytes;

#[test]
fn differential_check_passes_on_fixed_seeds() {
    let (mut programs, mut functions, mut merged, mut calls, mut interpreted) = (0, 0, 0, 0, 0);
    let (mut reused, mut adapted, mut traps, mut code_compared) = (0, 0, 0, 0);
    let (mut similar_merged, mut loaded) = (0, 0);
    let (mut loaded_without_room, mut compiled_without_room) = (0, 0);
    let mut failures = Vec::new();
    for seed in 0..260 {
        let data = common::seed_bytes(seed, 64 + (seed as usize % 7) * 64);
        let Some(result) = differential_bytes(&data) else {
            continue;
        };
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => {
                failures.push(format!("seed {seed}: {e}"));
                continue;
            }
        };
        programs += 1;
        functions += outcome.functions;
        merged += outcome.merged;
        reused += outcome.reused;
        adapted += outcome.adapted;
        traps += outcome.traps;
        calls += outcome.calls;
        interpreted += usize::from(outcome.interpreted);
        code_compared += outcome.code_compared;
        similar_merged += outcome.similar_merged;
        loaded += outcome.loaded;
        loaded_without_room += outcome.loaded_without_room;
        compiled_without_room += outcome.compiled_without_room;
    }
    assert!(
        failures.is_empty(),
        "{} seeds fail:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    println!(
        "{programs} programs, {functions} functions, {merged} merged, {reused} reused, \
         {adapted} adapted, {calls} calls compared, {traps} trapped, \
         {interpreted} programs also interpreted, {code_compared} pairs' machine code compared, \
         {similar_merged} turned into thunks of similar functions, {loaded} loaded from a store; \
         on a store with no room, {loaded_without_room} loaded, {compiled_without_room} compiled"
    );
    // Constant mutants merge under similar-function merging, and return
    // their own results. (7 with these seeds, in 3 programs: most mutants
    // change a constant that is not a parameter site, such as a shift
    // amount or a divisor, or one of a recursive function, which calls
    // itself by its own name.)
    assert!(
        similar_merged >= 4,
        "only {similar_merged} turned into thunks"
    );
    // The seeds really make programs, the programs really merge and reuse
    // code (relinked twins), and the interpreter really serves as a third
    // oracle for many of them.
    assert!(programs >= 220, "{programs}");
    // Programs that observe their frame (slot addresses, stack limits) are
    // not interpreted: the interpreter lays frames out otherwise.
    assert!(interpreted >= 15, "only {interpreted} interpreted");
    assert!(
        merged * 10 >= functions,
        "only {merged} of {functions} merged"
    );
    // (297 with these seeds, 561 merged, 7 adapted, 1,120 of 5,866 calls
    // trapped, 1,127 pairs' code compared: the floors leave room for
    // changes to the generator.)
    assert!(reused >= 10, "only {reused} of {functions} reused");
    // Calling-convention mutants run behind adapters, and trap outcomes are
    // compared, not only values.
    assert!(adapted >= 3, "only {adapted} of {functions} adapted");
    assert!(traps * 20 >= calls, "only {traps} of {calls} calls trapped");
    // Every program's second module on a store runs code from its
    // entries (check 7), not only code it compiled.
    assert!(
        loaded >= programs,
        "only {loaded} loaded in {programs} programs"
    );
    // And on the store with no room, the second module loads some
    // functions and compiles others again (620 and 20 with these seeds:
    // a program has few templates, and two fall in one of the store's 64
    // parts now and then).
    assert!(
        loaded_without_room * 2 >= programs && compiled_without_room >= 10,
        "on a store with no room, {loaded_without_room} loaded, {compiled_without_room} compiled"
    );
    // The machine-code oracle compares merged and template-equal functions.
    assert!(
        code_compared * 2 >= merged,
        "only {code_compared} pairs compared for {merged} merged"
    );
}

/// Extension mutants differ in what they return, not only in their
/// fingerprint, so executing them would catch a wrong merge: `uext` and
/// `sext` of the same `i32` result, called natively, return other bits.
#[cfg(target_arch = "x86_64")]
#[test]
fn extension_mutants_return_other_bits() {
    use cranelift_jit::{JITBuilder, JITModule};
    use cranelift_module::{Linkage, Module, default_libcall_names};
    use jitfold::fuzzing::differential::{check, functions};
    use jitfold::fuzzing::isolated::{Entry, run};
    use jitfold::fuzzing::program::{Body, Flag, Form, Program, Term};

    // f1 returns its first argument as a `uext` i32; f0 is f1 with `sext`.
    let body = Body {
        constants: vec![0],
        mem_flags: 0,
        trap_code: 1,
        call_conv: 0,
        extension: 1,
        recurse: None,
        blocks: vec![(vec![], Term::Return(0))],
        slots: vec![],
        slot_order: vec![0, 1],
        stack_limit: false,
    };
    let program = Program {
        functions: vec![
            Form::FlagMutant {
                of: 1,
                flag: Flag::Extension,
            },
            Form::Original(body),
        ],
        inputs: vec![(-1, 0), (0x7fff_ffff, 0)],
    };
    let mut m = JITModule::new(JITBuilder::new(default_libcall_names()).unwrap());
    let mut calls: Vec<(Entry, i64, i64)> = Vec::new();
    let funcs = functions(&program);
    let ids: Vec<_> = funcs
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
        m.define_function(id, &mut ctx).unwrap();
    }
    m.finalize_definitions().unwrap();
    for &id in &ids {
        // SAFETY: generated functions are called as `extern "C"` (see
        // `jitfold::fuzzing::program`).
        let entry: Entry = unsafe { std::mem::transmute(m.get_finalized_function(id)) };
        calls.extend(program.inputs.iter().map(|&(a, b)| (entry, a, b)));
    }
    let results = run(&calls).unwrap();
    assert_eq!(
        results,
        [
            Some(-1),
            Some(0x7fff_ffff),
            Some(0xffff_ffff),
            Some(0x7fff_ffff)
        ]
    );
    // And the whole check passes on them (they are not merged).
    assert!(check(&program).is_ok());
}
