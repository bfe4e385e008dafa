//! The `jitfold` command-line tool: a thin user of the library.

mod runtests;

use clap::{Parser, Subcommand};
use jitfold::cranelift_codegen::isa::OwnedTargetIsa;
use jitfold::report::{self, Progress, Report};
use serde_json::{Value, json};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "jitfold",
    version,
    about = "Deduplicates JIT-compiled Cranelift functions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fingerprint every function of `.clif` files and group exact duplicates.
    Report(ReportArgs),
    /// JIT a built-in workload (generic library instantiated for many types
    /// in several units, plus call-site stubs) with plain `JITModule` and
    /// through jitfold, run every function under each, compare the results.
    Demo(DemoArgs),
    /// Run Cranelift's `test run` files (`; run: %f(1) == 2`) with plain
    /// `JITModule` and through jitfold in every mode; fail if any line that
    /// passes plain fails through jitfold.
    Runtests(runtests::RuntestsArgs),
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Units that each instantiate the generic library for every type.
    #[arg(long, default_value_t = 4)]
    units: usize,
    /// Per-call-site stubs into the runtime.
    #[arg(long, default_value_t = 200)]
    stubs: usize,
    /// A directory of compiled code kept across runs (a code store, in
    /// pack files: `PackStore`): the first run fills it, a second
    /// compiles nothing it holds.
    #[arg(long, value_name = "DIR")]
    cache: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
struct ReportArgs {
    /// Print one JSON object on stdout instead of a summary.
    #[arg(long)]
    json: bool,
    /// List every group of duplicates with its members.
    #[arg(long)]
    groups: bool,
    /// Exit with status 1 if any file fails to parse or read.
    #[arg(long)]
    strict: bool,
    /// ISA to verify functions of files without a `target` line against, and
    /// to compile for (default: the host), with `opt_level=speed` and frame
    /// pointers kept.
    #[arg(long)]
    isa: Option<String>,
    /// Compile every function (baseline) and one per class (dedup) for the
    /// ISA, without linking; adds a `compile` object to the JSON.
    #[arg(long)]
    compile: bool,
    /// Compile every member of every duplicate group and compare its machine
    /// code and relocations with the group's first member; adds `verify`,
    /// and exits with status 1 if any differs.
    #[arg(long)]
    verify: bool,
    /// Also group functions by template (same code up to the callees and
    /// symbols they name) and count how many could reuse compiled code; adds
    /// `reused`, and makes `--compile` count only what is really compiled
    /// and `--verify` check every reused function.
    #[arg(long)]
    reuse: bool,
    /// What merges, one or more separated by commas: `exact` duplicates
    /// (always; the default); `calls`: also functions that are the same
    /// once callees are compared by class over the call graph (adds
    /// `refined_merged`, `refine_rounds`, `refine_s`); `similar`: also
    /// group one function of each exact class (with `calls`, of each
    /// refined class) by shape (the same function
    /// up to the values of some integer and float constants), derive the
    /// parameters of a merged body and decide with a cost model in code
    /// bytes which groups pay (adds `similar`: `param_groups`,
    /// `param_merged`, ...), and with `--compile` merge and compile the
    /// groups to measure the model (`DedupOptions::with_similar` in batch
    /// mode).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "exact")]
    merge: Vec<MergeArg>,
    /// The same as `--merge similar` (kept for older scripts).
    #[arg(long)]
    similar: bool,
    /// With `--compile`: a directory of compiled code kept across runs (a
    /// code store, in pack files: `PackStore`); functions whose code it
    /// holds count their lookup, not their compile, in the dedup time.
    #[arg(long, value_name = "DIR", requires = "compile")]
    cache: Option<PathBuf>,
    /// `.clif` files or directories (searched recursively).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MergeArg {
    Exact,
    Calls,
    Similar,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Report(args) => run_report(&args),
        Command::Demo(args) => run_demo(&args),
        Command::Runtests(args) => runtests::main(&args),
    }
}

fn run_demo(args: &DemoArgs) -> ExitCode {
    // Every mode as an embedder runs it: check mode (on in some of `ALL`,
    // for tests) compiles every merged function again, which is what the
    // demo measures jitfold against.
    let options = jitfold::DedupOptions::ALL.map(|o| o.with_check(false));
    let store: Option<std::sync::Arc<dyn jitfold::store::CodeStore>> = match &args.cache {
        None => None,
        Some(dir) => match jitfold::store::PackStore::new(dir) {
            Ok(store) => Some(std::sync::Arc::new(store)),
            Err(e) => {
                eprintln!("jitfold demo: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let runs =
        match jitfold::demo::compare_with_store(args.units, args.stubs, &options, store, None) {
            Ok(runs) => runs,
            Err(e) => {
                eprintln!("jitfold demo: {e}");
                return ExitCode::from(1);
            }
        };
    let plain = &runs[0];
    println!(
        "{:<44} {:>9} {:>9} {:>7} {:>7} {:>8} {:>11} {:>7} {:>11} {:>10} {:>8}",
        "",
        "functions",
        "compiled",
        "reused",
        "loaded",
        "aliased",
        "trampolines",
        "thunks",
        "code bytes",
        "time (ms)",
        "speedup"
    );
    for r in &runs {
        println!(
            "{:<44} {:>9} {:>9} {:>7} {:>7} {:>8} {:>11} {:>7} {:>11} {:>10.2} {:>7.2}x",
            r.label,
            r.functions,
            r.compiled,
            r.reused,
            r.loaded,
            r.aliased,
            r.trampolined,
            r.similar_merged,
            r.code_bytes,
            r.time.as_secs_f64() * 1e3,
            plain.time.as_secs_f64() / r.time.as_secs_f64()
        );
    }
    let calls = plain.results.len();
    let mismatched: Vec<&str> = runs[1..]
        .iter()
        .filter(|r| r.results != plain.results)
        .map(|r| r.label.as_str())
        .collect();
    if mismatched.is_empty() {
        println!("\nall {calls} calls returned the same results under every configuration");
        ExitCode::SUCCESS
    } else {
        println!("\nMISMATCH: results differ from plain JITModule under {mismatched:?}");
        ExitCode::from(1)
    }
}

fn run_report(args: &ReportArgs) -> ExitCode {
    let isa = match default_isa(args.isa.as_deref()) {
        Ok(isa) => isa,
        Err(e) => {
            eprintln!("jitfold report: {e}");
            return ExitCode::from(2);
        }
    };
    let cache = match args.cache.as_ref().map(jitfold::store::PackStore::new) {
        None => None,
        Some(Ok(store)) => Some(store),
        Some(Err(e)) => {
            eprintln!("jitfold report: {e}");
            return ExitCode::from(2);
        }
    };
    let mut bar = Bar::default();
    let options = report::ReportOptions {
        default_isa: Some(&*isa),
        compile_isa: (args.compile || args.verify).then_some(&*isa),
        verify: args.verify,
        reuse: args.reuse,
        merge_calls: args.merge.contains(&MergeArg::Calls),
        similar: args.similar || args.merge.contains(&MergeArg::Similar),
        cache: cache.as_ref().map(|c| c as &dyn jitfold::store::CodeStore),
    };
    let report = match report::build(&args.paths, &options, &mut bar) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("jitfold report: {e}");
            return ExitCode::from(2);
        }
    };
    bar.finish();
    for p in &report.skipped_files {
        eprintln!("jitfold report: note: {}: {}", p.file.display(), p.message);
    }
    if args.json {
        println!("{}", report_json(&report, args.groups));
    } else {
        print_summary(&report, args.groups);
    }
    if let Some(message) = verify_failure(&report) {
        eprint!("{message}");
        return ExitCode::from(1);
    }
    let failed = !report.parse_errors.is_empty() || !report.read_errors.is_empty();
    if args.strict && failed {
        eprintln!(
            "jitfold report: --strict: {} file(s) failed to parse, {} to read",
            report.parse_errors.len(),
            report.read_errors.len()
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// What to say on stderr when `--verify` found functions merged with a
/// function whose code differs (each pair, then a count), if it did.
fn verify_failure(report: &Report) -> Option<String> {
    let v = report.verify.as_ref()?;
    let mismatches = v.mismatches.len() + v.reuse_mismatches.len();
    if mismatches == 0 {
        return None;
    }
    let mut text = String::new();
    for (m, rep, what) in v.mismatches.iter().chain(&v.reuse_mismatches) {
        text.push_str(&format!(
            "jitfold report: MISMATCH {} {} differs from {} {} in {what}\n",
            m.file.display(),
            m.name,
            rep.file.display(),
            rep.name
        ));
    }
    text.push_str(&format!(
        "jitfold report: --verify: {mismatches} function(s) compile to other code than the function they were merged with\n"
    ));
    Some(text)
}

fn default_isa(name: Option<&str>) -> Result<OwnedTargetIsa, jitfold::isa::IsaError> {
    let flags = jitfold::isa::jit_flags();
    match name {
        Some(name) => jitfold::isa::isa_by_name(name, flags),
        None => jitfold::isa::host_isa(flags),
    }
}

/// A progress bar on stderr, shown only for large inputs on a terminal.
#[derive(Default)]
struct Bar(Option<indicatif::ProgressBar>);

impl Progress for Bar {
    fn start(&mut self, files: usize) {
        if files >= 100 && std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(files as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} files {eta}")
                    .expect("the template is valid"),
            );
            self.0 = Some(bar);
        }
    }

    fn advance(&mut self) {
        if let Some(bar) = &self.0 {
            bar.inc(1);
        }
    }
}

impl Bar {
    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// A path as a JSON string: lossily (a file name that is not valid UTF-8
/// shows U+FFFD where its bytes are not), never failing.
fn path(p: &Path) -> Value {
    Value::String(p.to_string_lossy().into_owned())
}

fn problems(list: &[report::FileProblem]) -> Value {
    list.iter()
        .map(|p| json!({ "file": path(&p.file), "message": p.message }))
        .collect()
}

fn report_json(r: &Report, with_groups: bool) -> Value {
    let mut out = json!({
        "files": r.files,
        "functions": r.functions,
        "instructions": r.instructions,
        "parse_errors": r.parse_errors.len(),
        "parse_error_list": problems(&r.parse_errors),
        "read_errors": r.read_errors.len(),
        "read_error_list": problems(&r.read_errors),
        "skipped_files": r.skipped_files.len(),
        "skipped_file_list": problems(&r.skipped_files),
        "skipped_unsupported": r.skipped_unsupported.len(),
        "skipped_unsupported_list": problems(&r.skipped_unsupported),
        "invalid_functions": r.invalid_functions.len(),
        "invalid_function_list": r.invalid_functions.iter()
            .map(|f| json!({ "file": path(&f.function.file), "function": f.function.name, "message": f.message }))
            .collect::<Vec<_>>(),
        "classes": r.classes,
        "exact_merged": r.exact_merged,
        "largest_group": r.largest_group,
        "duplicate_groups": r.groups.len(),
        "fingerprint_ns_per_inst": r.fingerprint_ns_per_inst(),
    });
    if let Some(reused) = r.reused {
        out["reused"] = json!(reused);
    }
    if let Some(refine) = &r.refine {
        out["refined_merged"] = json!(refine.refined_merged);
        out["refine_rounds"] = json!(refine.rounds);
        out["refine_s"] = json!(refine.time.as_secs_f64());
    }
    if let Some(s) = &r.similar {
        out["similar"] = similar_json(s, with_groups);
        out["similar"]["shape_ns_per_inst"] = json!(s.shape_ns_per_inst(r.instructions));
    }
    if let Some(c) = &r.compile {
        out["compile"] = json!({
            "isa": c.isa,
            "functions": c.functions,
            "compile_errors": c.errors.len(),
            "compile_error_reasons": c.errors_by_reason().into_iter()
                .map(|(reason, n)| json!({ "reason": reason, "functions": n }))
                .collect::<Vec<_>>(),
            "compile_error_list": c.errors.iter()
                .map(|f| json!({ "file": path(&f.function.file), "function": f.function.name, "message": f.message }))
                .collect::<Vec<_>>(),
            "baseline_s": c.baseline_time.as_secs_f64(),
            "dedup_s": c.dedup_time.as_secs_f64(),
            "baseline_code_bytes": c.baseline_code_bytes,
            "dedup_code_bytes": c.dedup_code_bytes,
            "cache_loaded": c.cache_loaded,
            "cache_stored": c.cache_stored,
            "cache_rejected": c.cache_rejected,
        });
    }
    if let Some(v) = &r.verify {
        out["verify"] = json!({
            "pairs": v.pairs,
            "mismatches": v.mismatches.len(),
            "mismatch_list": mismatch_list(&v.mismatches),
        });
        if r.reused.is_some() {
            out["verify"]["reuse_pairs"] = json!(v.reuse_pairs);
            out["verify"]["reuse_mismatches"] = json!(v.reuse_mismatches.len());
            out["verify"]["reuse_mismatch_list"] = mismatch_list(&v.reuse_mismatches);
        }
    }
    if with_groups {
        out["groups"] = r
            .groups
            .iter()
            .map(|g| {
                json!({
                    "stable_hash": format!("{:016x}", g.stable_hash),
                    "instructions": g.instructions,
                    "members": g.members.iter()
                        .map(|m| json!({ "file": path(&m.file), "function": m.name }))
                        .collect::<Vec<_>>(),
                })
            })
            .collect();
    }
    out
}

fn similar_json(s: &report::SimilarSummary, with_groups: bool) -> Value {
    let mut out = json!({
        "functions_with_sites": s.functions_with_sites,
        "candidate_groups": s.candidate_groups,
        "param_groups": s.param_groups,
        "param_merged": s.param_merged,
        "parameters": s.parameters,
        "refused_params": s.refused_params,
        "refused_cost": s.refused_cost,
        "refused_stack": s.refused_stack,
        "stack_growths": s.stack_growths,
        "predicted_bytes_saved": s.predicted_bytes_saved,
        "similar_s": s.time.as_secs_f64(),
    });
    if let Some(m) = &s.measured {
        out["measured"] = json!({
            "groups": m.groups,
            "predicted_right": m.predicted_right,
            "merged_members_bytes": m.merged_members_bytes,
            "merged_bytes": m.merged_bytes,
            "best_saved": m.best_saved,
            "stack_growth_max": m.stack_growth_max,
            "stack_growth_above_model": m.stack_growth_above_model,
            "uncompiled": m.uncompiled,
            "errors": m.errors.iter().map(|(f, e)| json!({
                "file": path(&f.file), "function": f.name, "message": e
            })).collect::<Vec<_>>(),
        });
    }
    if with_groups {
        out["groups"] = s
            .groups
            .iter()
            .map(|g| {
                json!({
                    "instructions": g.instructions,
                    "parameters": g.parameters,
                    "decision": format!("{:?}", g.decision),
                    "predicted_saved": g.predicted_saved,
                    "measured": g.measured.map(|m| json!({
                        "members_bytes": m.members,
                        "body_bytes": m.body,
                        "thunks_bytes": m.thunks,
                        "saved": m.saved(),
                    })),
                    "members": g.members.iter()
                        .map(|m| json!({ "file": path(&m.file), "function": m.name }))
                        .collect::<Vec<_>>(),
                })
            })
            .collect();
    }
    out
}

fn mismatch_list(list: &[(report::FunctionName, report::FunctionName, String)]) -> Value {
    list.iter()
        .map(|(m, rep, what)| {
            json!({
                "file": path(&m.file), "function": m.name,
                "representative_file": path(&rep.file), "representative": rep.name,
                "differs_in": what,
            })
        })
        .collect()
}

fn print_summary(r: &Report, with_groups: bool) {
    println!("files                 {}", r.files);
    println!("functions             {}", r.functions);
    println!("instructions          {}", r.instructions);
    println!("classes               {}", r.classes);
    println!(
        "exact_merged          {} ({:.2}% of functions)",
        r.exact_merged,
        percent(r.exact_merged, r.functions)
    );
    if let Some(reused) = r.reused {
        println!(
            "reused                {} ({:.2}% of functions)",
            reused,
            percent(reused, r.functions)
        );
    }
    if let Some(refine) = &r.refine {
        println!(
            "refined_merged        {} (call graph, {} rounds, {:.3} ms)",
            refine.refined_merged,
            refine.rounds,
            refine.time.as_secs_f64() * 1e3
        );
    }
    if let Some(s) = &r.similar {
        println!(
            "param_merged          {} in {} groups ({} parameters; {} candidate groups, refused: {} for parameters, {} for cost, {} for stack growth; predicted {} bytes saved; shapes {:.2} ns/instruction, planning {:.3} ms)",
            s.param_merged,
            s.param_groups,
            s.parameters,
            s.candidate_groups,
            s.refused_params,
            s.refused_cost,
            s.refused_stack,
            s.predicted_bytes_saved,
            s.shape_ns_per_inst(r.instructions),
            s.time.as_secs_f64() * 1e3
        );
        if let Some(m) = &s.measured {
            println!(
                "similar measured      {} groups, model right in {}; merged groups {} -> {} bytes; best possible saving {} bytes; {} errors",
                m.groups,
                m.predicted_right,
                m.merged_members_bytes,
                m.merged_bytes,
                m.best_saved,
                m.errors.len()
            );
        }
        if !s.stack_growths.is_empty() {
            let mut growths = s.stack_growths.clone();
            growths.sort_unstable();
            print!(
                "stack growth          {} stack-limited groups merged; model bound median {} bytes, largest {}",
                growths.len(),
                growths[growths.len() / 2],
                growths[growths.len() - 1]
            );
            match &s.measured {
                Some(m) => println!(
                    "; measured largest {} bytes, above the model in {} groups",
                    m.stack_growth_max, m.stack_growth_above_model
                ),
                None => println!(),
            }
        }
    }
    println!("duplicate groups      {}", r.groups.len());
    println!("largest group         {}", r.largest_group);
    println!(
        "fingerprint           {:.2} ns/instruction",
        r.fingerprint_ns_per_inst()
    );
    println!("invalid functions     {}", r.invalid_functions.len());
    println!("skipped (target ISA)  {}", r.skipped_unsupported.len());
    println!("skipped (not regular) {}", r.skipped_files.len());
    println!("parse errors          {}", r.parse_errors.len());
    for p in r.parse_errors.iter().chain(&r.read_errors) {
        println!("  {}: {}", p.file.display(), p.message);
    }
    if let Some(c) = &r.compile {
        println!(
            "compile ({})        {} functions ({} failed): baseline {:.3} s, {} bytes; dedup {:.3} s, {} bytes",
            c.isa,
            c.functions,
            c.errors.len(),
            c.baseline_time.as_secs_f64(),
            c.baseline_code_bytes,
            c.dedup_time.as_secs_f64(),
            c.dedup_code_bytes
        );
        if c.cache_loaded + c.cache_stored + c.cache_rejected > 0 {
            println!(
                "  cache: {} loaded, {} compiled and stored, {} rejected",
                c.cache_loaded, c.cache_stored, c.cache_rejected
            );
        }
        let reasons = c.errors_by_reason();
        for (reason, n) in reasons.iter().take(10) {
            println!("  {n:>6} cannot compile: {reason}");
        }
        if reasons.len() > 10 {
            println!(
                "  ({} more reasons; --json lists every function and reason)",
                reasons.len() - 10
            );
        }
    }
    if let Some(v) = &r.verify {
        println!(
            "verify                {} pairs, {} mismatches",
            v.pairs,
            v.mismatches.len()
        );
        if r.reused.is_some() {
            println!(
                "verify reuse          {} pairs, {} mismatches",
                v.reuse_pairs,
                v.reuse_mismatches.len()
            );
        }
        for (m, rep, what) in v.mismatches.iter().chain(&v.reuse_mismatches) {
            println!(
                "  {} {} differs from {} {} in {what}",
                m.file.display(),
                m.name,
                rep.file.display(),
                rep.name
            );
        }
    }
    if with_groups {
        for (i, g) in r.groups.iter().enumerate() {
            println!(
                "group {i}: {} members, {} instructions, hash {:016x}",
                g.members.len(),
                g.instructions,
                g.stable_hash
            );
            for m in &g.members {
                println!("  {} {}", m.file.display(), m.name);
            }
        }
    }
}

fn percent(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jitfold::report::{FunctionName, VerifySummary};

    fn name(file: &str, name: &str) -> FunctionName {
        FunctionName {
            file: PathBuf::from(file),
            name: name.to_string(),
        }
    }

    #[test]
    fn verify_fails_on_any_mismatch_and_names_both_functions() {
        let mut report = Report::default();
        assert_eq!(verify_failure(&report), None, "no --verify");
        report.verify = Some(VerifySummary {
            pairs: 3,
            reuse_pairs: 2,
            ..VerifySummary::default()
        });
        assert_eq!(verify_failure(&report), None, "no mismatch");
        let pair = (
            name("a.clif", "%f"),
            name("b.clif", "%g"),
            "machine code".to_string(),
        );
        for reuse in [false, true] {
            let mut v = VerifySummary::default();
            if reuse {
                v.reuse_mismatches.push(pair.clone());
            } else {
                v.mismatches.push(pair.clone());
            }
            report.verify = Some(v);
            let text = verify_failure(&report).expect("a mismatch fails");
            assert!(
                text.contains("a.clif %f differs from b.clif %g in machine code"),
                "{text}"
            );
            assert!(text.contains("1 function(s)"), "{text}");
        }
    }
}
