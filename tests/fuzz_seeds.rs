//! The differential fuzz check over a fixed set of seeds, so every test run
//! exercises it (the same check `cargo fuzz run differential` runs).

#![cfg(unix)]

mod common;

use jitfold::fuzzing::differential_bytes;

#[test]
fn differential_check_passes_on_fixed_seeds() {
    let (mut programs, mut functions, mut merged, mut calls, mut interpreted) = (0, 0, 0, 0, 0);
    let (mut reused, mut adapted, mut traps) = (0, 0, 0);
    for seed in 0..300 {
        let data = common::seed_bytes(seed, 64 + (seed as usize % 7) * 64);
        let Some(result) = differential_bytes(&data) else {
            continue;
        };
        let outcome = result.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        programs += 1;
        functions += outcome.functions;
        merged += outcome.merged;
        reused += outcome.reused;
        adapted += outcome.adapted;
        traps += outcome.traps;
        calls += outcome.calls;
        interpreted += usize::from(outcome.interpreted);
    }
    println!(
        "{programs} programs, {functions} functions, {merged} merged, {reused} reused, \
         {adapted} adapted, {calls} calls compared, {traps} trapped, \
         {interpreted} programs also interpreted"
    );
    // The seeds really make programs, the programs really merge and reuse
    // code (relinked twins), and the interpreter really serves as a third
    // oracle for many of them.
    assert!(programs >= 250, "{programs}");
    assert!(interpreted >= 50, "only {interpreted} interpreted");
    assert!(
        merged * 10 >= functions,
        "only {merged} of {functions} merged"
    );
    // (15 with these seeds: most relinked twins call other functions in
    // another pattern, so their templates differ too.)
    assert!(reused >= 10, "only {reused} of {functions} reused");
    // Calling-convention mutants run behind adapters, and trap outcomes are
    // compared, not only values.
    assert!(adapted >= 5, "only {adapted} of {functions} adapted");
    assert!(traps * 20 >= calls, "only {traps} of {calls} calls trapped");
}
