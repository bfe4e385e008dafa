//! `jitfold runtests`: Cranelift's run tests, plain and through jitfold.

use jitfold::fingerprint::CRANELIFT_VERSION;
use jitfold::runtests::{LineOutcome, ModeResult, Regression, SkipReason, Suite, regressions};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct RuntestsArgs {
    /// Print one JSON object on stdout instead of tables.
    #[arg(long)]
    json: bool,
    /// List every line that fails under plain Cranelift too.
    #[arg(long)]
    failures: bool,
    /// `.clif` files or directories (searched recursively); files without a
    /// `test run` line are ignored.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

pub fn main(args: &RuntestsArgs) -> ExitCode {
    let suite = match Suite::load(&args.paths) {
        Ok(suite) => suite,
        Err(e) => {
            eprintln!("jitfold runtests: {e}");
            return ExitCode::from(2);
        }
    };
    for (file, why) in &suite.skipped_files {
        eprintln!("jitfold runtests: note: {}: {why}", file.display());
    }
    // Cranelift panics on some files (they are caught, and reported as
    // compile errors); keep their backtraces off the terminal.
    let (baseline, modes) = jitfold::compile::with_quiet_panics(|| {
        let baseline = suite.run_plain();
        let modes: Vec<ModeResult> = jitfold::runtests::modes()
            .into_iter()
            .map(|options| suite.run_jitfold(options, &baseline))
            .collect();
        (baseline, modes)
    });
    let regressed: Vec<(&ModeResult, Vec<Regression>)> = modes
        .iter()
        .map(|m| (m, regressions(&baseline, m)))
        .collect();
    if args.json {
        println!("{}", to_json(&suite, &baseline, &regressed));
    } else {
        print_tables(&suite, &baseline, &regressed, args.failures);
    }
    let mut ok = true;
    for (mode, list) in &regressed {
        if !list.is_empty() || mode.passed() < baseline.passed() {
            eprintln!(
                "jitfold runtests: {}: {} line(s) pass plain and not through jitfold ({} passed vs {} plain)",
                mode.mode.name(),
                list.len(),
                mode.passed(),
                baseline.passed()
            );
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Skipped lines by reason, with the lines of unparsable files added.
fn skipped(suite: &Suite, mode: &ModeResult) -> BTreeMap<SkipReason, usize> {
    let mut by_reason = mode.skipped();
    let unparsed: usize = suite.unparsed.iter().map(|f| f.run_lines).sum();
    if unparsed > 0 {
        *by_reason.entry(SkipReason::FileDoesNotParse).or_insert(0) += unparsed;
    }
    by_reason
}

/// `file [target] function: line` for line `line` of unit `unit`.
fn describe(suite: &Suite, unit: usize, line: usize) -> String {
    let u = &suite.units[unit];
    let l = &u.lines[line];
    format!(
        "{} [{}] {}: {}",
        u.file.display(),
        u.target,
        u.functions[l.function].name,
        l.text
    )
}

fn failures(suite: &Suite, mode: &ModeResult) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (u, lines) in mode.outcomes.iter().enumerate() {
        for (l, outcome) in lines.iter().enumerate() {
            if let LineOutcome::Failed(message) = outcome {
                out.push((describe(suite, u, l), message.clone()));
            }
        }
    }
    out
}

fn mode_json(suite: &Suite, mode: &ModeResult, regressions: Option<&[Regression]>) -> Value {
    let stats = mode.stats.as_ref();
    let skipped: serde_json::Map<String, Value> = skipped(suite, mode)
        .into_iter()
        .map(|(reason, n)| (reason.to_string(), json!(n)))
        .collect();
    let mut v = json!({
        "mode": mode.mode.name(),
        "modules": mode.modules,
        "functions": mode.functions,
        "merged": mode.merged,
        "merged_across_files": mode.merged_across_files,
        "compiled": stats.map(|s| s.compiled),
        "reused": stats.map(|s| s.reused),
        "compile_s": mode.compile_time.as_secs_f64(),
        "passed": mode.passed(),
        "failed": mode.failed(),
        "skipped": skipped,
        "compile_errors": mode.compile_errors.iter().map(|(u, e)| json!({
            "file": suite.units[*u].file.to_string_lossy(),
            "target": suite.units[*u].target,
            "message": e,
        })).collect::<Vec<_>>(),
        "failures": failures(suite, mode).into_iter().map(|(line, message)| json!({
            "line": line, "message": message,
        })).collect::<Vec<_>>(),
    });
    if let Some(list) = regressions {
        v["regressions"] = json!(
            list.iter()
                .map(|r| json!({
                    "line": describe(suite, r.unit, r.line),
                    "outcome": format!("{:?}", r.outcome),
                }))
                .collect::<Vec<_>>()
        );
    }
    v
}

fn to_json(
    suite: &Suite,
    baseline: &ModeResult,
    modes: &[(&ModeResult, Vec<Regression>)],
) -> Value {
    let mut all = vec![mode_json(suite, baseline, None)];
    all.extend(modes.iter().map(|(m, r)| mode_json(suite, m, Some(r))));
    json!({
        "files": suite.files_read,
        "run_files": suite.run_files,
        "other_arch_files": suite.other_arch_files,
        "unparsed_files": suite.unparsed.iter().map(|f| json!({
            "file": f.path.to_string_lossy(),
            "message": f.message,
            "run_lines": f.run_lines,
        })).collect::<Vec<_>>(),
        "skipped_files": suite.skipped_files.iter().map(|(f, why)| json!({
            "file": f.to_string_lossy(),
            "message": why,
        })).collect::<Vec<_>>(),
        "units": suite.units.len(),
        "configs": suite.configs.len(),
        "run_lines": suite.run_lines() + suite.unparsed.iter().map(|f| f.run_lines).sum::<usize>(),
        "modes": all,
    })
}

fn print_tables(
    suite: &Suite,
    baseline: &ModeResult,
    modes: &[(&ModeResult, Vec<Regression>)],
    list_failures: bool,
) {
    println!(
        "{} .clif files, {} `test run` files: {} run on this host as {} (file, target) units in {} configurations, {} for other architectures only, {} do not parse",
        suite.files_read,
        suite.run_files,
        suite.run_files - suite.other_arch_files - suite.unparsed.len(),
        suite.units.len(),
        suite.configs.len(),
        suite.other_arch_files,
        suite.unparsed.len()
    );
    println!(
        "\n{:<22} {:>7} {:>9} {:>7} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7} {:>10}",
        "mode",
        "modules",
        "functions",
        "merged",
        "across",
        "compiled",
        "reused",
        "passed",
        "failed",
        "skipped",
        "compile s"
    );
    let rows = std::iter::once(baseline).chain(modes.iter().map(|(m, _)| *m));
    for m in rows {
        let stats = m.stats.as_ref();
        let dash = || "-".to_string();
        println!(
            "{:<22} {:>7} {:>9} {:>7} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7} {:>10.2}",
            m.mode.name(),
            m.modules,
            m.functions,
            m.merged,
            m.merged_across_files,
            stats.map_or_else(dash, |s| s.compiled.to_string()),
            stats.map_or_else(dash, |s| s.reused.to_string()),
            m.passed(),
            m.failed(),
            skipped(suite, m).values().sum::<usize>(),
            m.compile_time.as_secs_f64()
        );
    }
    for (file, why) in &suite.skipped_files {
        println!("not read: {}: {why}", file.display());
    }
    println!("\nskipped lines (plain), by reason:");
    for (reason, n) in skipped(suite, baseline) {
        println!("  {n:>6}  {reason}");
    }
    if !baseline.compile_errors.is_empty() {
        println!("\nnot compiled under plain Cranelift {CRANELIFT_VERSION}:");
        for (u, message) in &baseline.compile_errors {
            let unit = &suite.units[*u];
            println!("  {} [{}]: {message}", unit.file.display(), unit.target);
        }
    }
    let base_failures = failures(suite, baseline);
    if list_failures {
        println!("\nlines failing under plain Cranelift {CRANELIFT_VERSION}:");
        for (line, message) in &base_failures {
            println!("  {line}\n      {message}");
        }
    } else if !base_failures.is_empty() {
        println!(
            "\n{} line(s) fail under plain Cranelift {CRANELIFT_VERSION} (--failures lists them)",
            base_failures.len()
        );
    }
    for (m, list) in modes {
        for r in list {
            println!(
                "REGRESSION {}: {}\n      {:?}",
                m.mode.name(),
                describe(suite, r.unit, r.line),
                r.outcome
            );
        }
    }
}
