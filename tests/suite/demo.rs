//! The built-in workload: merged code must compute what plain code computes,
//! and the workload must really contain duplicates.

use jitfold::DedupOptions;

#[test]
fn demo_results_match_plain_jit_in_every_configuration() {
    let runs = jitfold::demo::compare(2, 20, &DedupOptions::ALL).unwrap();
    let plain = &runs[0];
    // 2 units x 9 types x 7 generics + 20 stubs.
    assert_eq!(plain.functions, 2 * 9 * 7 + 20);
    assert_eq!(
        plain.results.len(),
        plain.functions * jitfold::demo::INPUTS.len()
    );
    for run in &runs[1..] {
        assert_eq!(run.results, plain.results, "{}", run.label);
        assert_eq!(run.functions, plain.functions);
        // Classes of the first unit, besides fib: square 3 (64-bit, i32,
        // u32/char), sum_of_squares 3, max 4 (signedness matters), div 4,
        // sum_to 3, hash 9 (each type its own salt). Every other unit
        // repeats them, except fib, which calls itself by name (2 units x
        // 9 types). All stubs but one are twins. Batch mode refines over
        // the call graph: each fib calls itself, so the fibs of all units
        // merge into 3 classes, like square's.
        let batch = run.label.contains("batch");
        let classes = if batch { 26 + 3 + 1 } else { 26 + 18 + 1 };
        // Merging similar functions turns the hashes of each machine type
        // (5 of 64 bits, 3 of 32) into thunks of one body each: two more
        // functions compiled, of the module's own.
        let (thunks, bodies) = if run.label.contains("similar") {
            (8, 2)
        } else {
            (0, 0)
        };
        assert_eq!(run.similar_merged, thunks, "{}", run.label);
        assert_eq!(run.compiled + run.reused, classes + bodies, "{}", run.label);
        // With reuse in eager mode, each fib of a later unit is the first
        // unit's fib of the same type calling another function: one
        // template. (In batch mode they merged instead.)
        if run.label.contains("no reuse") || batch {
            assert_eq!(run.reused, 0);
        } else {
            assert!(run.reused >= 9, "{}: {}", run.label, run.reused);
        }
        assert_eq!(
            run.aliased + run.trampolined,
            plain.functions as u64 + bodies - run.compiled - run.reused
        );
        assert!(run.code_bytes < plain.code_bytes, "{}", run.label);
    }
    // The stubs really call the runtime: f(1, 2) = ((1 * 31 + 2) ^ 0x5a5a) + 1.
    let stub_results = &plain.results[plain.results.len() - jitfold::demo::INPUTS.len()..];
    assert_eq!(stub_results[1], ((31 + 2) ^ 0x5a5a) + 1);
}
