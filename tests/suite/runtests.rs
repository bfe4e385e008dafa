//! The run-test runner on small files whose expected results were worked
//! out by hand (`tests/data/runtests`): what passes, fails and is skipped,
//! in plain mode and in every jitfold mode.

use jitfold::DedupOptions;
use jitfold::runtests::execute::NOT_RUN_AGAIN;
use jitfold::runtests::{LineOutcome, ModeResult, SkipReason, Suite, regressions};
use std::path::PathBuf;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/runtests")
}

fn suite() -> Suite {
    Suite::load(&[data()]).expect("the test data loads")
}

/// The outcome of the line with text `text` in `file`.
fn outcome<'a>(suite: &Suite, result: &'a ModeResult, file: &str, text: &str) -> &'a LineOutcome {
    let u = suite
        .units
        .iter()
        .position(|u| u.file.ends_with(file))
        .unwrap_or_else(|| panic!("no unit for {file}"));
    let l = suite.units[u]
        .lines
        .iter()
        .position(|l| l.text == text)
        .unwrap_or_else(|| panic!("no line {text:?} in {file}"));
    &result.outcomes[u][l]
}

#[test]
fn files_are_sorted_into_units_and_skips() {
    let suite = suite();
    assert_eq!(suite.files_read, 9);
    assert_eq!(suite.run_files, 9);
    assert_eq!(
        suite.other_arch_files, 1,
        "elsewhere.clif is for aarch64 only"
    );
    assert_eq!(suite.unparsed.len(), 1);
    assert!(suite.unparsed[0].path.ends_with("newer.clif"));
    assert_eq!(suite.unparsed[0].run_lines, 2);
    assert_eq!(suite.units.len(), 7);
    // types.clif sets enable_llvm_abi_extensions; the others do not.
    assert_eq!(suite.configs.len(), 2);
    assert_eq!(suite.run_lines(), 18);
}

#[test]
fn plain_mode_passes_right_lines_and_fails_wrong_ones() {
    let suite = suite();
    let plain = suite.run_plain();
    assert_eq!(plain.passed(), 14);
    assert_eq!(plain.failed(), 1);
    assert!(matches!(
        outcome(&suite, &plain, "wrong.clif", "; run: %one() == 2"),
        LineOutcome::Failed(m) if m.contains("actual: 1")
    ));
    // Each file's `%twice` calls its own `%combine`.
    assert_eq!(
        outcome(&suite, &plain, "add.clif", "; run: %twice(21) == 42"),
        &LineOutcome::Passed
    );
    assert_eq!(
        outcome(&suite, &plain, "sub.clif", "; run: %twice(21) == 0"),
        &LineOutcome::Passed
    );
    let skipped = plain.skipped();
    assert_eq!(skipped.get(&SkipReason::PrintOnly), Some(&1));
    assert_eq!(skipped.get(&SkipReason::DoesNotCompile), Some(&1));
    assert_eq!(
        skipped.get(&SkipReason::NeedsRunnerFunction(
            "%__cranelift_throw".to_string()
        )),
        Some(&1)
    );
    assert_eq!(plain.compile_errors.len(), 2);
}

#[test]
fn every_jitfold_mode_matches_plain_line_by_line() {
    let suite = suite();
    let plain = suite.run_plain();
    for options in jitfold::runtests::modes() {
        let merged = suite.run_jitfold(options, &plain);
        let name = merged.mode.name();
        assert_eq!(merged.outcomes, as_not_run_again(&plain), "{name}");
        assert!(regressions(&plain, &merged).is_empty(), "{name}");
        assert_eq!(merged.modules, 2, "{name}: one module per configuration");
        // plus.clif's `%plus` is add.clif's `%combine`.
        assert_eq!(merged.merged, 1, "{name}");
        assert_eq!(merged.merged_across_files, 1, "{name}");
        let stats = merged.stats.as_ref().expect("jitfold modes have stats");
        // sub.clif's `%twice` is add.clif's with another callee.
        assert_eq!(stats.reused, u64::from(options.reuse), "{name}");
    }
}

#[test]
fn regressions_are_the_lines_that_pass_plain_only() {
    let suite = suite();
    let plain = suite.run_plain();
    let mut broken = suite.run_jitfold(DedupOptions::default(), &plain);
    let u = suite
        .units
        .iter()
        .position(|u| u.file.ends_with("sub.clif"))
        .unwrap();
    broken.outcomes[u][0] = LineOutcome::Failed("made up".to_string());
    let found = regressions(&plain, &broken);
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].unit, found[0].line), (u, 0));
    // A line failing in both is not a regression.
    let w = suite
        .units
        .iter()
        .position(|u| u.file.ends_with("wrong.clif"))
        .unwrap();
    assert!(!found.iter().any(|r| r.unit == w));
}

#[test]
fn missing_paths_are_errors() {
    let err = Suite::load(&[data().join("no-such-dir")])
        .err()
        .expect("an error");
    assert!(err.to_string().contains("no such file"), "{err}");
    assert!(Suite::load(&[]).is_err());
}

/// The bad-input files (`tests/data/runtests_bad`), loaded once per test.
fn bad_suite() -> Suite {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/runtests_bad");
    Suite::load(&[dir]).expect("the bad-input data loads")
}

#[test]
fn declarations_numbered_with_gaps_compile_and_run() {
    let suite = bad_suite();
    let plain = suite.run_plain();
    assert!(
        plain
            .compile_errors
            .iter()
            .all(|(u, _)| !suite.units[*u].file.ends_with("gaps.clif")),
        "{:?}",
        plain.compile_errors
    );
    assert_eq!(
        outcome(&suite, &plain, "gaps.clif", "; run: %gaps(40) == 42"),
        &LineOutcome::Passed
    );
    for options in DedupOptions::ALL {
        let merged = suite.run_jitfold(options, &plain);
        assert_eq!(
            outcome(&suite, &merged, "gaps.clif", "; run: %gaps(40) == 42"),
            &LineOutcome::Passed,
            "{}",
            merged.mode.name()
        );
    }
}

#[test]
fn a_run_line_the_reader_panics_on_is_a_line_that_does_not_parse() {
    let suite = bad_suite();
    let plain = suite.run_plain();
    let line =
        "; run: %id(0x000102030405060708090a0b0c0d0e0f) == 0x000102030405060708090a0b0c0d0e0f";
    assert_eq!(
        outcome(&suite, &plain, "vector.clif", line),
        &LineOutcome::Skipped(SkipReason::RunLineDoesNotParse)
    );
    // The other line of the file still runs.
    assert_eq!(
        outcome(&suite, &plain, "vector.clif", "; run: %id([1 2]) == [1 2]"),
        &LineOutcome::Passed
    );
}

#[test]
fn traps_and_faults_fail_their_line_only_in_every_mode() {
    let suite = bad_suite();
    let plain = suite.run_plain();
    let failed = |result: &ModeResult, text: &str| match outcome(&suite, result, "calls.clif", text)
    {
        LineOutcome::Failed(message) => message.clone(),
        other => panic!("{text}: {other:?}"),
    };
    assert_eq!(failed(&plain, "; run: %div(6, 0) == 0"), "the call trapped");
    let fault = failed(&plain, "; run: %deref(0) == 0");
    assert!(fault.contains(&format!("signal {SIGSEGV}")), "{fault}");
    // The calls after a trap or a fault still run.
    for text in [
        "; run: %div(8, 2) == 4",
        "; run: %sub(9, 3) == 6",
        "; run: %neg(5) == -5",
    ] {
        assert_eq!(
            outcome(&suite, &plain, "calls.clif", text),
            &LineOutcome::Passed,
            "{text}"
        );
    }
    for options in jitfold::runtests::modes() {
        let merged = suite.run_jitfold(options, &plain);
        assert_eq!(
            merged.outcomes,
            as_not_run_again(&plain),
            "{}",
            merged.mode.name()
        );
    }
}

/// The outcomes a jitfold mode has where it matches `plain`: a line that
/// fails under plain Cranelift is not run again, and says so.
fn as_not_run_again(plain: &ModeResult) -> Vec<Vec<LineOutcome>> {
    plain
        .outcomes
        .iter()
        .map(|unit| {
            unit.iter()
                .map(|o| match o {
                    LineOutcome::Failed(m) => LineOutcome::Failed(format!("{m} {NOT_RUN_AGAIN}")),
                    other => other.clone(),
                })
                .collect()
        })
        .collect()
}

/// SIGSEGV on the hosts jitfold runs tests on (Linux).
const SIGSEGV: i32 = 11;

#[test]
fn a_run_line_naming_another_function_is_skipped_not_run() {
    let suite = bad_suite();
    let plain = suite.run_plain();
    // Under %sub, `%div(9, 3) == 3` would pass if %sub were run as %div,
    // and fail if %div were run as %sub.
    assert_eq!(
        outcome(&suite, &plain, "calls.clif", "; run: %sub(9, 3) == 6"),
        &LineOutcome::Passed
    );
    for text in [
        "; run: %div(9, 3) == 3",
        "; run: %missing(9, 3) == 6",
        "; run: %deref(8) == 0",
    ] {
        assert_eq!(
            outcome(&suite, &plain, "calls.clif", text),
            &LineOutcome::Skipped(SkipReason::RunLineNamesOther),
            "{text}"
        );
    }
}

#[test]
fn huge_entity_numbers_are_a_parse_error_not_an_abort() {
    let suite = bad_suite();
    let entity = suite
        .unparsed
        .iter()
        .find(|f| f.path.ends_with("entity.clif"))
        .expect("entity.clif is unparsed");
    assert!(
        entity.message.contains("entity number block4294967290"),
        "{}",
        entity.message
    );
    assert_eq!(entity.run_lines, 1);
}

#[test]
fn a_call_that_never_ends_fails_its_line_after_the_time_limit() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/runtests_loop");
    let suite = Suite::load(&[dir]).expect("loads");
    let plain = suite.run_plain();
    match outcome(&suite, &plain, "loop.clif", "; run: %spin(1) == 1") {
        LineOutcome::Failed(m) => assert!(m.contains("no end within"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        outcome(&suite, &plain, "loop.clif", "; run: %one() == 1"),
        &LineOutcome::Passed
    );
    // Through jitfold, the line that loops is not run again (it would cost
    // its time limit once more), and the other still runs.
    let merged = suite.run_jitfold(DedupOptions::default(), &plain);
    match outcome(&suite, &merged, "loop.clif", "; run: %spin(1) == 1") {
        LineOutcome::Failed(m) => assert!(m.ends_with(NOT_RUN_AGAIN), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        outcome(&suite, &merged, "loop.clif", "; run: %one() == 1"),
        &LineOutcome::Passed
    );
}
