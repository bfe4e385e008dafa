//! `jitfold report`: fingerprint every function of a corpus of `.clif` files
//! and group exact duplicates.
//!
//! # What this module guarantees
//!
//! - Every file is accounted for in exactly one of: parsed, `parse_errors`,
//!   `skipped_unsupported`, `read_errors`; and every path named `*.clif`
//!   that is not a regular file in `skipped_files`, never opened.
//! - Groups keep to what one module would do. Functions of files whose
//!   `set` and `target` lines differ (see
//!   [`FileOutcome::Parsed`]'s `isa_key`) are never in one class, one
//!   template class or one call graph, since a module compiles all its
//!   functions under one ISA. Test-case names (`%g`) are local to their
//!   file ([`qualify_test_case_names`]): callers of two files' own `%g`
//!   are not duplicates, and a file's `%g` is never taken for another's.
//! - Every function of a parsed file is either grouped (counted in
//!   `functions`) or in `invalid_functions` (the verifier rejected it).
//! - `exact_merged == functions - classes`, and the groups listed are exactly
//!   the classes with two or more members, members in file order.
//! - `fingerprint_ns_per_inst` is measured in this process over all grouped
//!   functions (one timed loop per file), not estimated. With `--reuse` or
//!   `--merge calls` the loop also copies each function's names out of the
//!   fingerprinter; the benches (`benches/refine.rs`) measure refinement
//!   against fingerprinting alone.
//! - With `--compile`, every grouped function is compiled once; functions
//!   that fail to compile for the ISA are listed and counted in neither the
//!   baseline nor the dedup figures. With `--verify`, every later member of a
//!   class is compared with the class's first member.
//! - What becomes of each function is what [the planner](crate::plan)
//!   decides for a module on an ISA with machine-code trampolines: a
//!   duplicate, reused code (with `--reuse`), an adapter, or compiled.
//!   `reused` counts the functions whose plan reuses the code of an earlier
//!   compiled function with their [template](crate::Fingerprint::to_template)
//!   (as in a module, code is kept from compiled functions only, not from
//!   adapters or reused code). An adapter counts as compiled (its own
//!   compile time, which overstates an adapter's). With `--compile`, the dedup
//!   time then counts compiling one function per template plus retargeting
//!   the code for each reused function, and with `--verify` every reused
//!   function's own compilation is compared with the retargeted copy.
//! - With `--merge calls`, every grouped function is also refined by call
//!   graph ([`crate::refine::CallGraph`]): `refined_merged` counts the
//!   functions merged beyond exact duplicates (exact classes minus refined
//!   classes; refinement only ever joins exact classes), and the time spent
//!   building the graph and refining is measured separately from
//!   fingerprinting.
//! - With `--merge similar` (or `--similar`), the first function of each
//!   exact class (with `--merge calls`, of each refined class: the others
//!   are duplicates in a batch flush, never merged with similar functions)
//!   that names no duplicate (a batch flush rewrites such a function and
//!   leaves it out) is shaped ([`crate::similar`]) from the walk just
//!   taken (the shape time is kept apart from `fingerprint_time`),
//!   functions of one shape are grouped (within one partition), split to
//!   fit the parameter limit, and planned by [`similar::plan_group`] with
//!   each member's size estimated from the instructions Cranelift lowers
//!   ([`similar::lowered`], [`similar::CostModel::function_bytes`]), as
//!   `DedupModule` plans them. With
//!   `--compile`, every group within the limit whose members all compile is
//!   merged (body and thunks built, verified and compiled) whatever the
//!   model decided, so that the model can be checked against the bytes
//!   Cranelift emits.

use crate::cache::{ClassId, DedupCache};
use crate::compile::{self, Compiled, MachineCode, Renaming, compile, with_quiet_panics};
use crate::corpus::{
    CorpusError, FileOutcome, find_clif_files, load_file, qualify_test_case_names,
};
use crate::fingerprint::{Fingerprinter, SymbolName};
use crate::plan::{ClassFacts, CompiledCache, Policy, Step, Walk};
use crate::refine::{CallGraph, NodeId};
use crate::similar::{self, ShapeOf, Shaper, SimilarOptions};
use crate::store::load::{Checks, check};
use crate::store::{CodeContext, CodeStore, Entry, StoreKey};
use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::{Function, UserExternalName, UserFuncName};
use cranelift_codegen::isa::TargetIsa;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A function by its file and its name as printed (e.g. `%foo` or `u0:12`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionName {
    /// The file the function came from.
    pub file: PathBuf,
    /// The function's name as Cranelift prints it.
    pub name: String,
}

/// A file-level problem: the file and the message.
#[derive(Clone, Debug)]
pub struct FileProblem {
    /// The file.
    pub file: PathBuf,
    /// What went wrong, as the parser or the OS said it.
    pub message: String,
}

/// A function the verifier rejected.
#[derive(Clone, Debug)]
pub struct InvalidFunction {
    /// Which function.
    pub function: FunctionName,
    /// The verifier's message.
    pub message: String,
}

/// A class with two or more members.
#[derive(Clone, Debug)]
pub struct Group {
    /// Stable hash of the members' common fingerprint.
    pub stable_hash: u64,
    /// Instructions in each member.
    pub instructions: u32,
    /// The members, in the order they were read.
    pub members: Vec<FunctionName>,
}

/// `--compile`: every function compiled once (baseline) against one
/// compilation per class plus fingerprinting every function (dedup).
#[derive(Clone, Debug, Default)]
pub struct CompileSummary {
    /// The ISA compiled for.
    pub isa: String,
    /// Functions that compiled.
    pub functions: usize,
    /// Functions that failed to compile for this ISA, with the reason.
    pub errors: Vec<InvalidFunction>,
    /// Time to compile every function.
    pub baseline_time: Duration,
    /// Time to fingerprint every function and compile one per class (with
    /// `--reuse`: one per template, plus retargeting the code of the
    /// others). Each compile time is the one measured in the baseline pass.
    pub dedup_time: Duration,
    /// Code bytes of every function.
    pub baseline_code_bytes: u64,
    /// Code bytes of one function per class.
    pub dedup_code_bytes: u64,
    /// With a cache: functions to compile whose code came from the cache.
    pub cache_loaded: usize,
    /// With a cache: functions compiled and stored.
    pub cache_stored: usize,
    /// With a cache: entries that did not check out, or whose code was not
    /// the function's own (then compiled and stored again).
    pub cache_rejected: usize,
}

impl CompileSummary {
    /// The compile errors grouped by [`compile_error_reason`], most common
    /// first (ties by reason).
    pub fn errors_by_reason(&self) -> Vec<(String, usize)> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for e in &self.errors {
            *counts.entry(compile_error_reason(&e.message)).or_insert(0) += 1;
        }
        let mut out: Vec<(String, usize)> = counts.into_iter().collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

/// A short reason for a compile error message, shared by every function
/// that fails the same way: the opcode without a lowering on this ISA, the
/// instruction the ISA's verifier rejects, or the first words of the
/// message (numbers dropped, so that value and instruction numbers do not
/// split a reason).
pub fn compile_error_reason(message: &str) -> String {
    let opcode_after = |marker: &str| -> Option<String> {
        let rest = &message[message.find(marker)? + marker.len()..];
        // `v2 = load.i16 big v0` or `store.i8 v1, v0`: the word after `= `
        // if the instruction has results, else the first word.
        let inst = rest.split('`').next().unwrap_or(rest);
        let inst = inst.split_once(" = ").map_or(inst, |(_, r)| r);
        let word = inst.split_whitespace().next()?;
        Some(word.split('.').next().unwrap_or(word).to_string())
    };
    if message.contains("should be implemented in ISLE")
        && let Some(op) = opcode_after("inst = `")
    {
        return format!("no lowering for `{op}` on this ISA");
    }
    if message.starts_with("Verifier(")
        && let Some(op) = opcode_after("context: Some(\"")
    {
        return format!("verifier rejects `{op}` for this ISA");
    }
    let text: String = message
        .chars()
        .filter(|c| !c.is_ascii_digit())
        .take(80)
        .collect();
    text.split('`')
        .next()
        .unwrap_or(&text)
        .trim_end()
        .to_string()
}

/// `--verify`: every member of a duplicate group compiled and compared with
/// its group's first member.
#[derive(Clone, Debug, Default)]
pub struct VerifySummary {
    /// Members compared with their representative.
    pub pairs: usize,
    /// Members whose code or relocations differ: (member, representative,
    /// what differs).
    pub mismatches: Vec<(FunctionName, FunctionName, String)>,
    /// With `--reuse`: reused functions compared with the retargeted code of
    /// their template's first function.
    pub reuse_pairs: usize,
    /// Reused functions whose own compilation differs from the retargeted
    /// copy: (function, template representative, what differs).
    pub reuse_mismatches: Vec<(FunctionName, FunctionName, String)>,
}

/// What to do besides fingerprinting.
#[derive(Clone, Copy, Default)]
pub struct ReportOptions<'a> {
    /// ISA to verify functions of files without a `target` line against.
    pub default_isa: Option<&'a dyn TargetIsa>,
    /// Compile every function for this ISA (`--compile`).
    pub compile_isa: Option<&'a dyn TargetIsa>,
    /// Compare duplicates' machine code (`--verify`; needs `compile_isa`).
    pub verify: bool,
    /// Group by template as well and count reusable code (`--reuse`).
    pub reuse: bool,
    /// Refine classes over the call graph (`--merge calls`).
    pub merge_calls: bool,
    /// Group functions by [shape](crate::similar) and plan similar-function
    /// merging (`--merge similar`).
    pub similar: bool,
    /// With `compile_isa`: look each function to be compiled up in this
    /// code store first, and store what is compiled (`--cache`); the
    /// dedup time then counts a hit as its lookup, and a miss as its
    /// compile plus its store write.
    pub cache: Option<&'a dyn CodeStore>,
}

/// `--merge calls`: what call-graph refinement found.
#[derive(Clone, Debug, Default)]
pub struct RefineSummary {
    /// Functions merged beyond exact duplicates.
    pub refined_merged: usize,
    /// Rounds of refinement until stable.
    pub rounds: u32,
    /// Time to build the call graph (templates, names) and refine.
    pub time: Duration,
}

/// `--similar`: what similar-function merging ([`crate::similar`]) would
/// do with one function of each exact class (with `--merge calls`, of each
/// refined class).
#[derive(Clone, Debug, Default)]
pub struct SimilarSummary {
    /// Exact classes (with `--merge calls`, refined classes) whose first
    /// function has a parameter site, may stand behind a thunk
    /// ([`similar::mergeable`]) and names no duplicate (which a batch
    /// flush would rewrite, and leave out).
    pub functions_with_sites: usize,
    /// Shapes with two or more such classes.
    pub candidate_groups: usize,
    /// Groups (or subgroups, see [`similar::split`]) the cost model
    /// merges.
    pub param_groups: usize,
    /// Functions turned into thunks (every member of a merged group).
    pub param_merged: usize,
    /// Parameters of the merged groups' bodies.
    pub parameters: usize,
    /// Functions of candidate groups left alone because they fit in no
    /// subgroup with another member within the parameter limit
    /// ([`similar::split`]).
    pub refused_params: usize,
    /// Groups left alone because the cost model predicts no saving.
    pub refused_cost: usize,
    /// Groups left alone because their members check a stack limit and
    /// their stack growth is above the bound
    /// ([`similar::StackDepth::DEFAULT`]).
    pub refused_stack: usize,
    /// The [stack growth](similar::CostModel::stack_growth) of each merged
    /// group whose members check a stack limit.
    pub stack_growths: Vec<u64>,
    /// Bytes the cost model predicts the merged groups save (member sizes
    /// estimated from the instructions Cranelift lowers, also with
    /// `--compile`, which measures the plan instead).
    pub predicted_bytes_saved: i64,
    /// Time to compute the shapes from the walks (not in
    /// `fingerprint_time`).
    pub shape_time: Duration,
    /// Time to group and plan (with `--compile`, also to compile every
    /// member, body and thunk of the groups measured).
    pub time: Duration,
    /// With `--compile`: every candidate group within the parameter limit,
    /// merged and compiled.
    pub measured: Option<SimilarMeasured>,
    /// Candidate groups, largest first.
    pub groups: Vec<SimilarGroup>,
}

impl SimilarSummary {
    /// Nanoseconds of shape computation per instruction of the report.
    pub fn shape_ns_per_inst(&self, instructions: u64) -> f64 {
        if instructions == 0 {
            0.0
        } else {
            self.shape_time.as_nanos() as f64 / instructions as f64
        }
    }
}

/// One group of one shape.
#[derive(Clone, Debug)]
pub struct SimilarGroup {
    /// The members (first functions of their exact classes), in file order.
    pub members: Vec<FunctionName>,
    /// Instructions Cranelift lowers in its first member
    /// ([`similar::live_instructions`]).
    pub instructions: u32,
    /// Parameters of the merged body.
    pub parameters: usize,
    /// What the cost model decided.
    pub decision: similar::Decision,
    /// The predicted saving in bytes.
    pub predicted_saved: i64,
    /// With `--compile`: the code bytes measured.
    pub measured: Option<MeasuredGroup>,
}

/// The code bytes of one group, members and merged.
#[derive(Clone, Copy, Debug, Default)]
pub struct MeasuredGroup {
    /// Every member's code.
    pub members: u64,
    /// The merged body's code.
    pub body: u64,
    /// Every thunk's code.
    pub thunks: u64,
}

impl MeasuredGroup {
    /// Bytes saved by merging (negative: lost).
    pub fn saved(&self) -> i64 {
        self.members as i64 - (self.body + self.thunks) as i64
    }
}

/// `--similar --compile`: the cost model against the code Cranelift emits.
#[derive(Clone, Debug, Default)]
pub struct SimilarMeasured {
    /// Groups merged and compiled (body and thunks).
    pub groups: usize,
    /// Groups where the model's decision (merge or not) matches whether
    /// the measured code is smaller.
    pub predicted_right: usize,
    /// Code bytes of the members of the groups the model merges.
    pub merged_members_bytes: u64,
    /// Code bytes of those groups' bodies and thunks.
    pub merged_bytes: u64,
    /// Bytes saved if exactly the groups whose measured code is smaller
    /// were merged (what a perfect model would get).
    pub best_saved: u64,
    /// Of the measured groups whose members check a stack limit: the
    /// largest growth measured (the body's frame beyond the member's, and
    /// the thunk's frame with its setup area, which holds the body call's
    /// stack arguments when the thunk calls), in bytes.
    pub stack_growth_max: u64,
    /// Of those groups: how many have a member whose measured growth is
    /// above the model's ([`similar::CostModel::stack_growth`]).
    pub stack_growth_above_model: usize,
    /// Groups not measured because a member does not compile for the ISA
    /// (it is in the compile errors).
    pub uncompiled: usize,
    /// Bodies or thunks that failed to build, verify or compile while every
    /// member compiled: (first member, message). Each is a bug.
    pub errors: Vec<(FunctionName, String)>,
}

/// What the report found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// `.clif` files visited.
    pub files: usize,
    /// Functions fingerprinted and grouped (verifier-clean).
    pub functions: usize,
    /// Instructions encoded over those functions.
    pub instructions: u64,
    /// Files the parser rejected.
    pub parse_errors: Vec<FileProblem>,
    /// Files whose `target` Cranelift cannot build.
    pub skipped_unsupported: Vec<FileProblem>,
    /// Files that could not be read.
    pub read_errors: Vec<FileProblem>,
    /// Paths named `*.clif` that are not regular files (FIFOs, sockets,
    /// devices), skipped without being opened.
    pub skipped_files: Vec<FileProblem>,
    /// Functions the verifier rejected (left out of grouping).
    pub invalid_functions: Vec<InvalidFunction>,
    /// Distinct fingerprints.
    pub classes: usize,
    /// `functions - classes`: functions that need not be compiled.
    pub exact_merged: usize,
    /// With `--reuse`: functions of a new class whose template an earlier
    /// class has (their code is a retargeted copy).
    pub reused: Option<usize>,
    /// Present with `--merge calls`.
    pub refine: Option<RefineSummary>,
    /// Present with `--similar`.
    pub similar: Option<SimilarSummary>,
    /// Members in the largest class (1 if there are no duplicates).
    pub largest_group: usize,
    /// Total time spent fingerprinting.
    pub fingerprint_time: Duration,
    /// Classes with two or more members, largest first.
    pub groups: Vec<Group>,
    /// Present with `--compile`.
    pub compile: Option<CompileSummary>,
    /// Present with `--verify`.
    pub verify: Option<VerifySummary>,
}

impl Report {
    /// Nanoseconds of fingerprinting per encoded instruction.
    pub fn fingerprint_ns_per_inst(&self) -> f64 {
        if self.instructions == 0 {
            0.0
        } else {
            self.fingerprint_time.as_nanos() as f64 / self.instructions as f64
        }
    }
}

/// Progress through the files, for a progress bar.
pub trait Progress {
    /// Called once with the number of files, before reading any.
    fn start(&mut self, files: usize);
    /// Called after each file.
    fn advance(&mut self);
}

/// A [`Progress`] that shows nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _: usize) {}
    fn advance(&mut self) {}
}

/// Reads every `.clif` file under `paths`, fingerprints and groups; compiles
/// and verifies as `options` say. Functions of files without a `target` line
/// are verified against `options.default_isa` (see
/// [`crate::corpus::load_file`]).
pub fn build(
    paths: &[PathBuf],
    options: &ReportOptions,
    progress: &mut dyn Progress,
) -> Result<Report, CorpusError> {
    match options.compile_isa {
        Some(_) => with_quiet_panics(|| build_inner(paths, options, progress)),
        None => build_inner(paths, options, progress),
    }
}

fn build_inner(
    paths: &[PathBuf],
    options: &ReportOptions,
    progress: &mut dyn Progress,
) -> Result<Report, CorpusError> {
    let default_isa = options.default_isa;
    let found = find_clif_files(paths)?;
    let files = found.files;
    progress.start(files.len());
    let mut report = Report {
        files: files.len(),
        skipped_files: found
            .skipped
            .into_iter()
            .map(|(file, message)| FileProblem { file, message })
            .collect(),
        ..Report::default()
    };
    // One partition per ISA configuration, in order of first sight.
    let mut partitions: Vec<Partition> = Vec::new();
    let mut by_isa: HashMap<String, usize> = HashMap::new();
    let mut compiling = options.compile_isa.map(|isa| Compiling {
        isa,
        cache: options.cache.map(|store| (store, CodeContext::of(isa))),
        summary: CompileSummary {
            isa: isa.triple().to_string(),
            ..CompileSummary::default()
        },
        verify: options.verify.then(VerifySummary::default),
    });
    for (index, file) in files.into_iter().enumerate() {
        match load_file(&file, default_isa) {
            FileOutcome::Parsed {
                functions, isa_key, ..
            } => {
                let mut valid = Vec::with_capacity(functions.len());
                for f in functions {
                    let name = FunctionName {
                        file: file.clone(),
                        name: f.func.name.to_string(),
                    };
                    match f.verifier_error {
                        None => {
                            let mut func = f.func;
                            qualify_test_case_names(&mut func, index);
                            valid.push((func, name));
                        }
                        Some(message) => report.invalid_functions.push(InvalidFunction {
                            function: name,
                            message,
                        }),
                    }
                }
                let p = *by_isa.entry(isa_key).or_insert_with(|| {
                    partitions.push(Partition {
                        grouping: Grouping::new(options, 16),
                        code: ClassCode::default(),
                    });
                    partitions.len() - 1
                });
                let partition = &mut partitions[p];
                let compiling = compiling.as_mut().map(|c| (c, &mut partition.code));
                partition.grouping.add_file(&mut report, valid, compiling);
            }
            FileOutcome::ParseError(message) => {
                report.parse_errors.push(FileProblem { file, message })
            }
            FileOutcome::UnsupportedIsa(message) => report
                .skipped_unsupported
                .push(FileProblem { file, message }),
            FileOutcome::ReadError(message) => {
                report.read_errors.push(FileProblem { file, message })
            }
        }
        progress.advance();
    }
    let mut reuse_time = Duration::ZERO;
    report.reused = options.reuse.then_some(0);
    if options.merge_calls {
        report.refine = Some(RefineSummary::default());
    }
    if options.similar {
        report.similar = Some(SimilarSummary::default());
    }
    for mut partition in partitions {
        let refined_away = partition.grouping.finish(&mut report);
        if let (Some(collector), Some(summary)) =
            (&mut partition.grouping.similar, &mut report.similar)
        {
            collector.finish(summary, options.compile_isa, &refined_away);
        }
        reuse_time += partition.grouping.reuse_time;
    }
    report.exact_merged = report.functions - report.classes;
    report.largest_group = report
        .groups
        .iter()
        .map(|g| g.members.len())
        .max()
        .unwrap_or(usize::from(report.functions > 0));
    sort_groups(&mut report.groups);
    if let Some(summary) = &mut report.similar {
        summary.groups.sort_by(|a, b| {
            (
                b.members.len(),
                b.instructions,
                &a.members[0].file,
                &a.members[0].name,
            )
                .cmp(&(
                    a.members.len(),
                    a.instructions,
                    &b.members[0].file,
                    &b.members[0].name,
                ))
        });
    }
    if let Some(mut c) = compiling {
        c.summary.dedup_time += report.fingerprint_time + reuse_time;
        report.compile = Some(c.summary);
        report.verify = c.verify;
    }
    Ok(report)
}

/// The functions of one ISA configuration: what is grouped, and with
/// `--compile`, the code of each class's first member.
struct Partition {
    grouping: Grouping,
    code: ClassCode,
}

/// Fingerprints, exact classes, templates and the call graph, file by file.
/// What becomes of each function (duplicate, reused code, adapter,
/// compiled) is what [the planner](crate::plan) decides for a module with
/// machine-code trampolines. Each kind of work is timed as one span per
/// file, so that reading the clock does not weigh on small functions.
struct Grouping {
    fingerprinter: Fingerprinter,
    /// What a module would have compiled so far: exact classes (every
    /// function is either a duplicate of one or starts one) and templates.
    compiled: CompiledCache<()>,
    members: SecondaryMap<ClassId, Vec<FunctionName>>,
    policy: Policy,
    graph: Option<CallGraph>,
    /// A function of each node of `graph` that calls two names or more
    /// (refinement walks it again with callees of one class as one).
    graph_functions: Vec<Option<Function>>,
    graph_time: Duration,
    reused: usize,
    /// Time of the planning that reuse needs.
    reuse_time: Duration,
    /// With `--similar`: shapes and candidates.
    similar: Option<SimilarCollector>,
    // Scratch, per file: each function's walk.
    walks: Vec<Walk>,
}

impl Grouping {
    /// `files`: how many files will be read (a hint for capacities).
    fn new(options: &ReportOptions, files: usize) -> Self {
        Self {
            fingerprinter: Fingerprinter::new(),
            compiled: CompiledCache::new(),
            members: SecondaryMap::new(),
            policy: Policy {
                reuse: options.reuse,
                machine_trampolines: true,
                store: options.cache.is_some() && options.compile_isa.is_some(),
                // As `DedupModule::<JITModule>::new` in this build.
                compile_catching: crate::module::jit_records_exception_tables(),
                // Similar merging is planned for the whole corpus (as a
                // batch flush plans it), not per function.
                similar: false,
            },
            graph: options.merge_calls.then(|| CallGraph::with_capacity(files)),
            graph_functions: Vec::new(),
            graph_time: Duration::ZERO,
            reused: 0,
            reuse_time: Duration::ZERO,
            similar: options.similar.then(SimilarCollector::default),
            walks: Vec::new(),
        }
    }

    fn add_file(
        &mut self,
        report: &mut Report,
        valid: Vec<(Function, FunctionName)>,
        compiling: Option<(&mut Compiling, &mut ClassCode)>,
    ) {
        // 1. Walks, and with `--similar` each function's shape from its
        //    walk (timed apart from the walk).
        self.walks.clear();
        let mut shapes = Vec::new();
        let mut shape_time = Duration::ZERO;
        let start = Instant::now();
        for (func, _) in &valid {
            self.walks.push(Walk::of(&mut self.fingerprinter, func));
            if let Some(collector) = &mut self.similar {
                let start = Instant::now();
                let walk = self.fingerprinter.last_walk();
                let shape = collector.shaper.shape(&walk, func);
                let mergeable = similar::mergeable(
                    func,
                    walk.observes_own_frame(),
                    SimilarOptions::DEFAULT.stack,
                );
                shapes.push((!shape.values.is_empty() && mergeable).then_some(shape));
                shape_time += start.elapsed();
            }
        }
        report.fingerprint_time += start.elapsed().saturating_sub(shape_time);
        if let Some(collector) = &mut self.similar {
            collector.shape_time += shape_time;
        }
        let mut shapes = shapes.into_iter();
        // 2. Plans, function by function: each function is a duplicate or
        //    starts a class (a node of the call graph).
        let mut planned = Vec::with_capacity(valid.len());
        let start = Instant::now();
        for (walk, (func, _)) in self.walks.iter().zip(&valid) {
            report.functions += 1;
            report.instructions += u64::from(walk.fingerprint.instructions());
            let plan = self.compiled.plan(&walk.planned(func), self.policy);
            // Nothing declines here: the first step is what happens.
            let step = plan.steps().next().expect("a plan has a step");
            let (class, kept_template) = match step {
                Step::Duplicate(class) => (class, None),
                // (The report's policy plans no `Similar` step.)
                Step::Reuse(_) | Step::Adapter(_) | Step::Load | Step::Similar | Step::Compile => {
                    let class = self
                        .compiled
                        .add_class(walk.fingerprint.clone(), ClassFacts::default())
                        .class();
                    let compiled = matches!(step, Step::Load | Step::Compile);
                    let kept = plan
                        .keep_template
                        .filter(|_| compiled)
                        .and_then(|t| self.compiled.keep_template(t, ()));
                    if let (Some(body), true) = (plan.keep_body, compiled) {
                        self.compiled
                            .keep_body(body, class, func.signature.call_conv);
                    }
                    (class, kept)
                }
            };
            if let Step::Reuse(_) = step {
                self.reused += 1;
            }
            planned.push((class, step, kept_template));
        }
        self.reuse_time += start.elapsed();
        // 3. The call graph: a node per exact class, every function's name.
        if let Some(graph) = &mut self.graph {
            let start = Instant::now();
            for ((class, step, _), (walk, (func, _))) in
                planned.iter().zip(self.walks.iter().zip(&valid))
            {
                // Nodes are added in the order of exact classes, one each.
                let node = NodeId::from_u32(class.as_u32());
                if !matches!(step, Step::Duplicate(_)) {
                    let added = graph.add_node(&walk.fingerprint, &walk.names, &walk.address_taken);
                    debug_assert_eq!(added, node, "a node per exact class");
                    let calls = walk.address_taken.iter().filter(|&&taken| !taken).count();
                    self.graph_functions.push((calls > 1).then(|| func.clone()));
                }
                graph.add_function_with_func_name(&func.name, node);
            }
            self.graph_time += start.elapsed();
        }
        // 4. Compilation, function by function.
        let mut compiling = compiling;
        for ((class, step, kept_template), (walk, (func, name))) in
            planned.into_iter().zip(self.walks.iter().zip(valid))
        {
            if let Some((c, code)) = compiling.as_mut() {
                let planned = Planned {
                    class,
                    step,
                    kept_template,
                    names: &walk.names,
                    walk,
                };
                c.compile(code, &func, &name, planned);
            }
            // A candidate is the first function of its exact class and
            // of its refined class (see `finish`), as in a batch flush of
            // every function (nothing was compiled before the flush, so
            // nothing is reused; see 1 in `module/similar.rs`), and one
            // that names no duplicate: the flush rewrites those to name
            // the duplicate's canonical function, and leaves them out
            // (see 3 in `module/roots.rs`).
            let shape = shapes.next().flatten();
            let duplicate = matches!(step, Step::Duplicate(_));
            if let Some(collector) = &mut self.similar {
                collector.note_name(&func, class, duplicate);
                if let (Some(shape), false) = (shape, duplicate) {
                    collector.add(func, name.clone(), shape, class);
                }
            }
            self.members[class].push(name);
        }
    }

    /// Adds this partition's classes, reuse, refinement and groups to
    /// `report` (whose `reused` is `Some` with `--reuse` and `refine` with
    /// `--merge calls`).
    ///
    /// Returns the exact classes refinement merged into an earlier one
    /// (which batch mode defines as duplicates, never merging them with
    /// similar functions).
    fn finish(&mut self, report: &mut Report) -> HashSet<ClassId> {
        let classes = self.compiled.exact().classes();
        let mut refined_away = HashSet::new();
        report.classes += classes;
        if let Some(reused) = &mut report.reused {
            *reused += self.reused;
        }
        if let (Some(graph), Some(summary)) = (&self.graph, &mut report.refine) {
            let start = Instant::now();
            let functions = &self.graph_functions;
            let refinement = graph.refine_with(|node| functions[node.as_u32() as usize].as_ref());
            summary.refined_merged += classes - refinement.classes;
            summary.rounds = summary.rounds.max(refinement.rounds);
            summary.time += self.graph_time + start.elapsed();
            // Nodes are exact classes, in order: all but the first of each
            // refined class are duplicates.
            let mut seen = HashSet::new();
            for (node, class) in refinement.class_of.iter() {
                if !seen.insert(*class) {
                    refined_away.insert(ClassId::from_u32(node.as_u32()));
                }
            }
        }
        let members = core::mem::take(&mut self.members);
        report
            .groups
            .extend(group_list(self.compiled.exact(), members));
        refined_away
    }
}

/// `--similar`: the shapes of one partition's exact classes.
#[derive(Default)]
struct SimilarCollector {
    shaper: Shaper,
    /// Each shape's index in `groups`.
    by_shape: HashMap<crate::fingerprint::Shape, usize>,
    /// The first function of each exact class that has a parameter site,
    /// by shape, in order of first sight, with its exact class.
    groups: Vec<Vec<(Member, ClassId)>>,
    /// Every function's name (as its module's callers name it), its exact
    /// class, and whether it is an exact duplicate.
    names: Vec<(UserExternalName, ClassId, bool)>,
    shape_time: Duration,
}

impl SimilarCollector {
    /// Notes the name of `func`, of exact class `class`, a duplicate of
    /// an earlier function if `duplicate`.
    fn note_name(&mut self, func: &Function, class: ClassId, duplicate: bool) {
        if let UserFuncName::User(name) = &func.name {
            self.names.push((name.clone(), class, duplicate));
        }
    }

    /// The names of the duplicates a batch flush plans: exact duplicates
    /// and the functions of the classes in `refined_away`.
    fn duplicate_names(&self, refined_away: &HashSet<ClassId>) -> HashSet<UserExternalName> {
        self.names
            .iter()
            .filter(|(_, class, duplicate)| *duplicate || refined_away.contains(class))
            .map(|(name, _, _)| name.clone())
            .collect()
    }

    fn add(&mut self, func: Function, name: FunctionName, shape: ShapeOf, class: ClassId) {
        let next = self.groups.len();
        let g = *self.by_shape.entry(shape.shape.clone()).or_insert(next);
        if g == next {
            self.groups.push(Vec::new());
        }
        self.groups[g].push(((func, name, shape), class));
    }

    /// Plans every group into `summary`, without the functions of the
    /// classes in `refined_away` (duplicates in batch mode) and those that
    /// name a duplicate (a batch flush rewrites them, and leaves them out:
    /// 3 in `module/roots.rs`; a name counts if a declaration refers to
    /// it, whether or not an instruction uses that, as
    /// `DedupModule::reference_rewrites` counts it); with `isa`, merges
    /// and compiles every group within the parameter limit to measure it.
    fn finish(
        &mut self,
        summary: &mut SimilarSummary,
        isa: Option<&dyn TargetIsa>,
        refined_away: &HashSet<ClassId>,
    ) {
        let options = SimilarOptions::default();
        let start = Instant::now();
        // With an ISA the groups are measured, even when there are none.
        if isa.is_some() {
            summary
                .measured
                .get_or_insert_with(SimilarMeasured::default);
        }
        let duplicates = self.duplicate_names(refined_away);
        let names_a_duplicate = |func: &Function| {
            crate::fingerprint::declared_user_names(func).any(|(_, name)| duplicates.contains(name))
        };
        for group in core::mem::take(&mut self.groups) {
            let group: Vec<Member> = group
                .into_iter()
                .filter(|((func, _, _), class)| {
                    !refined_away.contains(class) && !names_a_duplicate(func)
                })
                .map(|(member, _)| member)
                .collect();
            summary.functions_with_sites += group.len();
            if group.len() < 2 {
                continue;
            }
            summary.candidate_groups += 1;
            let values: Vec<&[similar::ParamValue]> =
                group.iter().map(|(_, _, s)| &s.values[..]).collect();
            let parts = similar::split(&values, options.max_params);
            let mut members: Vec<Option<Member>> = group.into_iter().map(Some).collect();
            for part in parts {
                if part.len() < 2 {
                    summary.refused_params += 1;
                    continue;
                }
                let sub = part.iter().filter_map(|&i| members[i].take()).collect();
                plan_subgroup(summary, sub, isa, &options);
            }
        }
        summary.shape_time += self.shape_time;
        summary.time += start.elapsed();
    }
}

/// A function collected for `--similar`, with its name and shape.
type Member = (Function, FunctionName, ShapeOf);

/// Plans `group` (two or more members of one shape whose parameters fit
/// the limit) into `summary`; with `isa`, merges and compiles it to
/// measure it.
fn plan_subgroup(
    summary: &mut SimilarSummary,
    group: Vec<Member>,
    isa: Option<&dyn TargetIsa>,
    options: &SimilarOptions,
) {
    let values: Vec<&[similar::ParamValue]> = group.iter().map(|(_, _, s)| &s.values[..]).collect();
    // Planned as `DedupModule` plans (see `module/similar.rs`): each
    // member's size estimated from the instructions Cranelift lowers.
    let lowered: Vec<similar::Lowered> =
        group.iter().map(|(f, _, _)| similar::lowered(f)).collect();
    let instructions = lowered[0].instructions;
    let bytes: Vec<u64> = lowered
        .iter()
        .map(|&l| options.model.function_bytes(l))
        .collect();
    // Member sizes (and frames) as compiled, to measure the plan.
    let compiled: Option<Vec<Result<(u64, u32), String>>> = isa.map(|isa| {
        group
            .iter()
            .map(|(f, _, _)| compile(f, isa).map(|c| (c.code.bytes.len() as u64, c.frame_bytes)))
            .collect()
    });
    // A member that does not compile for the ISA (listed with the compile
    // errors) leaves the group estimated and unmeasured.
    let compiled: Option<Vec<(u64, u32)>> = compiled.and_then(|sizes| {
        sizes
            .into_iter()
            .collect::<Result<Vec<(u64, u32)>, String>>()
            .ok()
    });
    if isa.is_some() && compiled.is_none() {
        summary
            .measured
            .get_or_insert_with(SimilarMeasured::default)
            .uncompiled += 1;
    }
    let first = &group[0].0;
    let stack_limited = first.stack_limit.is_some();
    let Some(plan) = similar::plan_group(&first.signature, stack_limited, &values, &bytes, options)
    else {
        return;
    };
    let merge = plan.decision == similar::Decision::Merge;
    match plan.decision {
        similar::Decision::Merge => {
            summary.param_groups += 1;
            summary.param_merged += group.len();
            summary.parameters += plan.derived.params.len();
            summary.predicted_bytes_saved += plan.prediction.saved();
            summary.stack_growths.extend(plan.stack_growth);
        }
        similar::Decision::TooManyParams => summary.refused_params += 1,
        similar::Decision::DoesNotPay => summary.refused_cost += 1,
        similar::Decision::StackGrowth => summary.refused_stack += 1,
    }
    let mut measured_group = None;
    if let (Some(isa), Some(sizes)) = (isa, &compiled)
        && plan.decision != similar::Decision::TooManyParams
    {
        let measured = summary
            .measured
            .get_or_insert_with(SimilarMeasured::default);
        let frames: Vec<u32> = sizes.iter().map(|&(_, frame)| frame).collect();
        match merged_bytes(isa, &group, &frames, &plan.derived) {
            Ok(Merged {
                body,
                thunks,
                stack_growth,
            }) => {
                if stack_limited {
                    measured.stack_growth_max = measured.stack_growth_max.max(stack_growth);
                    let model = options.model.stack_growth(
                        &first.signature,
                        &plan.derived.params.iter().map(|p| p.ty).collect::<Vec<_>>(),
                    );
                    measured.stack_growth_above_model += usize::from(stack_growth > model);
                }
                let members: u64 = sizes.iter().map(|&(bytes, _)| bytes).sum();
                let merged = body + thunks;
                measured.groups += 1;
                if (members > merged) == merge {
                    measured.predicted_right += 1;
                }
                if merge {
                    measured.merged_members_bytes += members;
                    measured.merged_bytes += merged;
                }
                measured.best_saved += members.saturating_sub(merged);
                measured_group = Some(MeasuredGroup {
                    members,
                    body,
                    thunks,
                });
            }
            Err(e) => measured.errors.push((group[0].1.clone(), e)),
        }
    }
    summary.groups.push(SimilarGroup {
        members: group.iter().map(|(_, n, _)| n.clone()).collect(),
        instructions,
        parameters: plan.derived.params.len(),
        decision: plan.decision,
        predicted_saved: plan.prediction.saved(),
        measured: measured_group,
    });
}

/// A group merged and compiled, measured.
struct Merged {
    /// Code bytes of its body.
    body: u64,
    /// Code bytes of all its thunks.
    thunks: u64,
    /// The largest stack growth of a member (as
    /// [`SimilarMeasured::stack_growth_max`]).
    stack_growth: u64,
}

/// A group's merged body and all its thunks, each verified and compiled
/// for `isa`; `member_frames` are the members' frames compiled alone.
fn merged_bytes(
    isa: &dyn TargetIsa,
    group: &[(Function, FunctionName, ShapeOf)],
    member_frames: &[u32],
    derived: &similar::Derived,
) -> Result<Merged, String> {
    let (first, _, shape) = &group[0];
    let body = similar::merged_body(first, &shape.sites, derived)?;
    let flags = isa.flags();
    let verified = |f: &Function| {
        cranelift_codegen::verify_function(f, flags).map_err(|e| format!("{e}\n{f}"))
    };
    verified(&body)?;
    let body_code = compile(&body, isa)?;
    let mut merged = Merged {
        body: body_code.code.bytes.len() as u64,
        thunks: 0,
        stack_growth: 0,
    };
    let body_name = cranelift_codegen::ir::UserExternalName::new(0, u32::MAX);
    for (m, (func, _, _)) in group.iter().enumerate() {
        let thunk = similar::thunk(
            isa,
            func,
            body_name.clone(),
            &body.signature,
            &similar::thunk_values(derived, m),
        );
        verified(&thunk)?;
        let thunk_code = compile(&thunk, isa)?;
        merged.thunks += thunk_code.code.bytes.len() as u64;
        let body_beyond = body_code.frame_bytes.saturating_sub(member_frames[m]);
        let growth =
            u64::from(body_beyond) + u64::from(thunk_code.frame_bytes) + similar::THUNK_FRAME_BYTES;
        merged.stack_growth = merged.stack_growth.max(growth);
    }
    Ok(merged)
}

/// What the plan of one function made of it, for `--compile`.
struct Planned<'a> {
    /// Its exact class.
    class: ClassId,
    /// The step taken.
    step: Step,
    /// The template class whose code it is to keep, when compiled.
    kept_template: Option<ClassId>,
    /// Its names in slot order.
    names: &'a [SymbolName],
    /// Its walk, for its template (`--cache`).
    walk: &'a Walk,
}

/// The state of `--compile` and `--verify` while files are read.
struct Compiling<'a> {
    isa: &'a dyn TargetIsa,
    /// `--cache`: the store and what its entries must be for.
    cache: Option<(&'a dyn CodeStore, CodeContext)>,
    summary: CompileSummary,
    verify: Option<VerifySummary>,
}

/// The code of one partition's classes, for `--compile` and `--verify`.
#[derive(Default)]
struct ClassCode {
    /// For `--verify`: each class's first member and its code.
    representatives: SecondaryMap<ClassId, Option<Kept>>,
    /// With `--reuse`: each template class's first function, its names and
    /// its code.
    template_code: SecondaryMap<ClassId, Option<(Kept, Vec<SymbolName>)>>,
}

/// A function kept to compare others with: its name, its code, and (with
/// `--verify`) the function itself, which the comparison lays out again
/// where the code differs ([`compile::compare_compiled_code`]).
#[derive(Clone)]
struct Kept {
    name: FunctionName,
    code: MachineCode,
    func: Option<Function>,
}

impl Compiling<'_> {
    fn compile(
        &mut self,
        code: &mut ClassCode,
        func: &Function,
        name: &FunctionName,
        planned: Planned<'_>,
    ) {
        let compiled = match compile(func, self.isa) {
            Ok(c) => c,
            Err(message) => {
                self.summary.errors.push(InvalidFunction {
                    function: name.clone(),
                    message,
                });
                return;
            }
        };
        let bytes = compiled.code.bytes.len() as u64;
        self.summary.functions += 1;
        self.summary.baseline_time += compiled.time;
        self.summary.baseline_code_bytes += bytes;
        let class = planned.class;
        match planned.step {
            Step::Duplicate(class) => {
                let (Some(verify), Some(rep)) = (&mut self.verify, &code.representatives[class])
                else {
                    return;
                };
                verify.pairs += 1;
                let own = (func, &compiled.code);
                if let Some(what) = differs(self.isa, rep, own, &Renaming::identity()) {
                    verify
                        .mismatches
                        .push((name.clone(), rep.name.clone(), what));
                }
                return;
            }
            Step::Reuse(template) => {
                self.summary.dedup_code_bytes += bytes;
                self.reuse(code, template, name, func, planned.names, &compiled);
            }
            // An adapter is counted as compiled: its own compile time.
            Step::Adapter(_) | Step::Load | Step::Similar | Step::Compile => {
                self.summary.dedup_code_bytes += bytes;
                let time = match planned.step {
                    Step::Load => self.compile_or_load(&planned, &compiled),
                    _ => compiled.time,
                };
                self.summary.dedup_time += time;
                if let Some(template) = planned.kept_template {
                    let kept = self.kept(name, func, &compiled.code);
                    code.template_code[template] = Some((kept, planned.names.to_vec()));
                }
            }
        }
        if self.verify.is_some() {
            code.representatives[class] = Some(self.kept(name, func, &compiled.code));
        }
    }

    /// `name` (with `names`, compiled to `own`) reuses the code of template
    /// class `template`: times the retargeting, and with `--verify` compares
    /// the copy with `own`. If the template's first function failed to
    /// compile, this function counts as compiled.
    fn reuse(
        &mut self,
        code: &ClassCode,
        template: ClassId,
        name: &FunctionName,
        func: &Function,
        names: &[SymbolName],
        own: &Compiled,
    ) {
        let Some((rep, rep_names)) = &code.template_code[template] else {
            self.summary.dedup_time += own.time;
            return;
        };
        let start = Instant::now();
        let copy = rep.code.retarget(rep_names, names);
        self.summary.dedup_time += start.elapsed();
        let Some(verify) = &mut self.verify else {
            return;
        };
        verify.reuse_pairs += 1;
        let what = match &copy {
            None => Some("names the template's code cannot be retargeted to".to_string()),
            // The copy is the template's code, names slot for slot.
            Some(_) => differs(
                self.isa,
                rep,
                (func, &own.code),
                &Renaming::slots(rep_names, names),
            ),
        };
        if let Some(what) = what {
            verify
                .reuse_mismatches
                .push((name.clone(), rep.name.clone(), what));
        }
    }

    /// The time getting the code of a function to compile takes: its
    /// compile time, or with a cache, the lookup of its entry if that
    /// holds its own code, otherwise its compile time and the write of its
    /// entry.
    fn compile_or_load(&mut self, planned: &Planned<'_>, compiled: &Compiled) -> Duration {
        let Some((store, context)) = &self.cache else {
            return compiled.time;
        };
        let template = planned.walk.as_ref().template_key();
        let start = Instant::now();
        let key = StoreKey::of_words(context, template);
        // The one load path, as a JIT module's (no secret; no frame
        // descriptions are written).
        let checks = Checks {
            context,
            secret: None,
            isa: self.isa,
            needs_unwind: false,
        };
        let loaded = store
            .get(&key)
            .ok()
            .flatten()
            .map(|bytes| check(&bytes, &checks, template, planned.names));
        let lookup = start.elapsed();
        match loaded {
            Some(Ok(loaded)) if loaded.code == compiled.code => {
                self.summary.cache_loaded += 1;
                return lookup;
            }
            Some(_) => self.summary.cache_rejected += 1,
            None => {}
        }
        let start = Instant::now();
        let unwind = compiled.unwind.as_ref();
        let entry = Entry::new(
            &planned.walk.fingerprint.to_template(),
            planned.names,
            &compiled.code,
            compiled.time,
            unwind,
        );
        if let Some(entry) = entry
            && store.put(&key, &entry.encode(context, None)).is_ok()
        {
            self.summary.cache_stored += 1;
        }
        lookup + compiled.time + start.elapsed()
    }

    /// `func` (named `name`, compiled to `code`) as kept for comparisons.
    fn kept(&self, name: &FunctionName, func: &Function, code: &MachineCode) -> Kept {
        Kept {
            name: name.clone(),
            code: code.clone(),
            func: self.verify.is_some().then(|| func.clone()),
        }
    }
}

/// What differs between two compilations, if anything.
/// What differs between the code of `kept` and `own` (a function and its
/// code), relocation targets brought together by `renaming`, after both
/// are laid out in one block order ([`compile::compare_compiled_code`]);
/// `None` when nothing does.
fn differs(
    isa: &dyn TargetIsa,
    kept: &Kept,
    own: (&Function, &MachineCode),
    renaming: &Renaming,
) -> Option<String> {
    let Some(kept_func) = &kept.func else {
        // Kept without `--verify`: compared as compiled.
        let renamed = |code: &MachineCode, rename| code.renamed(rename);
        return compile::difference(
            &renamed(&kept.code, &renaming.first),
            &renamed(own.1, &renaming.second),
        )
        .map(|d| d.to_string());
    };
    match compile::compare_compiled_code(isa, (kept_func, &kept.code), own, renaming) {
        Ok(None) => None,
        Ok(Some(mismatch)) => Some(mismatch.difference.to_string()),
        Err(e) => Some(e),
    }
}

/// The classes of `cache` with two or more members.
fn group_list(
    cache: &DedupCache,
    mut members: SecondaryMap<ClassId, Vec<FunctionName>>,
) -> Vec<Group> {
    cache
        .iter()
        .filter_map(|(fp, class)| {
            let names = core::mem::take(&mut members[class]);
            (names.len() >= 2).then(|| Group {
                stable_hash: fp.stable_hash(),
                instructions: fp.instructions(),
                members: names,
            })
        })
        .collect()
}

/// Largest group first, then by the first member's file and name.
fn sort_groups(groups: &mut [Group]) {
    groups.sort_by(|a, b| {
        (b.members.len(), &a.members[0].file, &a.members[0].name).cmp(&(
            a.members.len(),
            &b.members[0].file,
            &b.members[0].name,
        ))
    });
}

#[cfg(test)]
mod tests {
    use super::compile_error_reason;

    #[test]
    fn compile_errors_are_grouped_by_opcode_or_message() {
        assert_eq!(
            compile_error_reason(
                "Unsupported(\"should be implemented in ISLE: inst = `v2 = load.i16 big region0 v0`, type = `Some(types::I16)`\")"
            ),
            "no lowering for `load` on this ISA"
        );
        assert_eq!(
            compile_error_reason(
                "Unsupported(\"should be implemented in ISLE: inst = `store.i8 v1, v0`, type = `None`\")"
            ),
            "no lowering for `store` on this ISA"
        );
        assert_eq!(
            compile_error_reason(
                "Verifier(VerifierErrors([VerifierError { location: inst3, context: Some(\"v4 = x86_pshufb v1, v2\"), message: \"...\" }]))"
            ),
            "verifier rejects `x86_pshufb` for this ISA"
        );
        assert_eq!(
            compile_error_reason("Cranelift panicked: i128 args/return values not supported"),
            compile_error_reason("Cranelift panicked: i64 args/return values not supported"),
        );
    }
}
