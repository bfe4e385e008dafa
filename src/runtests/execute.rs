//! Compiling a [`Suite`] under one [`RunMode`] and running its run lines.
//!
//! # What this module guarantees
//!
//! - Plain mode compiles each unit into its own `JITModule`, as Cranelift's
//!   runner does; a unit that does not compile there is skipped
//!   ([`SkipReason::DoesNotCompile`]) in every mode.
//! - A jitfold mode compiles *all* units of one configuration into one
//!   [`DedupModule`], so duplicates across files merge. Calls between the
//!   functions of a file go to that file's functions: each file's names
//!   (`%name` test cases and `uN:M` user names) are mapped to ids declared
//!   for that unit alone, so the same name in two files is two functions.
//! - A unit the baseline compiled but a jitfold mode fails to compile, or a
//!   configuration whose module fails to finalize, makes its run lines
//!   *failed*, never skipped: it is a jitfold bug.
//! - Every run line of every unit gets exactly one [`LineOutcome`], in
//!   suite order, so modes can be compared line by line ([`regressions`]).
//! - Calls run in child processes ([`invoke::call_isolated`]): a call that
//!   traps, faults or does not end within the fuzzing harness's time limit
//!   fails its own line, and the runner goes on with the next.

use super::suite::{LineError, SkipReason, Suite, Unit};
use super::{host, invoke};
use crate::compile::panic_message;
use crate::corpus::{UnboundName, bind_names};
use crate::module::{DedupModule, DedupOptions, Stats};
use cranelift_codegen::Context;
use cranelift_codegen::ir::Signature;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, ModuleResult, default_libcall_names};
use cranelift_reader::RunCommand;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// How the functions of a suite are compiled.
#[derive(Clone, Copy, Debug)]
pub enum RunMode {
    /// A plain `JITModule` per unit: the baseline.
    Plain,
    /// A [`DedupModule`] per configuration, holding every unit of it.
    Jitfold(DedupOptions),
}

impl RunMode {
    /// A short name: `plain`, or the options' name (their `Display`).
    pub fn name(&self) -> String {
        match self {
            RunMode::Plain => "plain".to_string(),
            RunMode::Jitfold(o) => o.to_string(),
        }
    }
}

/// What became of one run line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineOutcome {
    /// The call returned what the line expects.
    Passed,
    /// The call returned something else (or could not be made); the message
    /// says what.
    Failed(String),
    /// The line was not run.
    Skipped(SkipReason),
}

/// The outcome of running a suite under one mode.
pub struct ModeResult {
    /// The mode.
    pub mode: RunMode,
    /// Per unit (in suite order), per run line: the outcome.
    pub outcomes: Vec<Vec<LineOutcome>>,
    /// Per unit: whether its functions compiled.
    pub compiled: Vec<bool>,
    /// Modules made (one per unit in plain mode, one per configuration in
    /// jitfold modes).
    pub modules: usize,
    /// Test functions defined (trampolines of the runner not counted).
    pub functions: usize,
    /// Test functions that run another function's code (duplicates).
    pub merged: usize,
    /// Of which duplicates of a function of another file.
    pub merged_across_files: usize,
    /// jitfold's counters, summed over modules (runner trampolines
    /// included); `None` in plain mode.
    pub stats: Option<Stats>,
    /// Compile errors: (unit index, message).
    pub compile_errors: Vec<(usize, String)>,
    /// Time to compile and finalize every module.
    pub compile_time: Duration,
}

impl ModeResult {
    fn count(&self, pick: impl Fn(&LineOutcome) -> bool) -> usize {
        self.outcomes.iter().flatten().filter(|o| pick(o)).count()
    }

    /// Run lines whose call returned what they expect.
    pub fn passed(&self) -> usize {
        self.count(|o| matches!(o, LineOutcome::Passed))
    }

    /// Run lines that failed.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, LineOutcome::Failed(_)))
    }

    /// Run lines not run, by reason.
    pub fn skipped(&self) -> BTreeMap<SkipReason, usize> {
        let mut by_reason = BTreeMap::new();
        for o in self.outcomes.iter().flatten() {
            if let LineOutcome::Skipped(reason) = o {
                *by_reason.entry(reason.clone()).or_insert(0) += 1;
            }
        }
        by_reason
    }
}

/// What follows the baseline's message on a line a jitfold mode did not
/// run again, since it failed under plain Cranelift.
pub const NOT_RUN_AGAIN: &str = "(under plain Cranelift; not run again)";

/// A run line that passes in the baseline and not in another mode.
#[derive(Debug, PartialEq, Eq)]
pub struct Regression {
    /// Index of the unit in the suite.
    pub unit: usize,
    /// Index of the line in the unit.
    pub line: usize,
    /// What the line did in the other mode.
    pub outcome: LineOutcome,
}

/// Every line that `baseline` passes and `other` does not.
pub fn regressions(baseline: &ModeResult, other: &ModeResult) -> Vec<Regression> {
    let mut out = Vec::new();
    for (unit, (base, theirs)) in baseline.outcomes.iter().zip(&other.outcomes).enumerate() {
        for (line, (b, o)) in base.iter().zip(theirs).enumerate() {
            if *b == LineOutcome::Passed && *o != LineOutcome::Passed {
                out.push(Regression {
                    unit,
                    line,
                    outcome: o.clone(),
                });
            }
        }
    }
    out
}

impl Suite {
    /// Compiles each unit into its own `JITModule` and runs its lines.
    pub fn run_plain(&self) -> ModeResult {
        let mut result = self.empty_result(RunMode::Plain);
        for (u, unit) in self.units.iter().enumerate() {
            let Some(config) = self.runnable_config(unit) else {
                result.outcomes[u] = skipped_lines(unit);
                continue;
            };
            let start = Instant::now();
            let mut module = jit_module(&self.configs[config].isa);
            let mut program = Program::default();
            let built = guarded(|| {
                program.add(&mut module, u, unit)?;
                module
                    .finalize_definitions()
                    .map_err(|e| BuildError::Other(error_text(&e)))
            });
            result.compile_time += start.elapsed();
            result.modules += 1;
            match built {
                Ok(()) => {
                    result.compiled[u] = true;
                    result.functions += unit.functions.len();
                    let mut outcomes = program.run(&module, &[(u, unit)], None);
                    result.outcomes[u] = outcomes.remove(0);
                }
                Err(e) => {
                    let reason = match &e {
                        BuildError::Unresolved(e) if e.name.starts_with("%__cranelift_") => {
                            SkipReason::NeedsRunnerFunction(e.name.clone())
                        }
                        _ => SkipReason::DoesNotCompile,
                    };
                    result.compile_errors.push((u, e.to_string()));
                    result.outcomes[u] = unit
                        .lines
                        .iter()
                        .map(|_| LineOutcome::Skipped(reason.clone()))
                        .collect();
                }
            }
        }
        result
    }

    /// Compiles every unit `baseline` compiled into one [`DedupModule`] per
    /// configuration, and runs the lines.
    pub fn run_jitfold(&self, options: DedupOptions, baseline: &ModeResult) -> ModeResult {
        let mut result = self.empty_result(RunMode::Jitfold(options));
        let mut stats = Stats::default();
        for (u, unit) in self.units.iter().enumerate() {
            if self.runnable_config(unit).is_none() {
                result.outcomes[u] = skipped_lines(unit);
            } else if !baseline.compiled[u] {
                result.outcomes[u] = baseline.outcomes[u].clone();
            }
        }
        for config in 0..self.configs.len() {
            let members: Vec<usize> = (0..self.units.len())
                .filter(|&u| {
                    baseline.compiled[u] && self.runnable_config(&self.units[u]) == Some(config)
                })
                .collect();
            if members.is_empty() {
                continue;
            }
            let start = Instant::now();
            let mut module = DedupModule::wrap(jit_module(&self.configs[config].isa), options);
            let mut program = Program::default();
            let mut failing_unit = None;
            let built = guarded(|| {
                for &u in &members {
                    failing_unit = Some(u);
                    program.add(&mut module, u, &self.units[u])?;
                }
                failing_unit = None;
                module
                    .finalize_definitions()
                    .map_err(|e| BuildError::Other(error_text(&e)))
            });
            result.compile_time += start.elapsed();
            result.modules += 1;
            if let Err(e) = built {
                let e = e.to_string();
                result
                    .compile_errors
                    .push((failing_unit.unwrap_or(members[0]), e.clone()));
                for &u in &members {
                    result.outcomes[u] = fail_lines(&self.units[u], &e);
                }
                continue;
            }
            stats += module.stats().clone();
            for &u in &members {
                let unit = &self.units[u];
                result.compiled[u] = true;
                result.functions += unit.functions.len();
                for &id in &program.functions[&u] {
                    let Some(canonical) = module.canonical(id) else {
                        continue;
                    };
                    if canonical != id {
                        result.merged += 1;
                        if self.units[program.owner[&canonical]].file != unit.file {
                            result.merged_across_files += 1;
                        }
                    }
                }
            }
            let units: Vec<(usize, &Unit)> = members.iter().map(|&u| (u, &self.units[u])).collect();
            let runs = program.run(&module, &units, Some(baseline));
            for (&u, outcomes) in members.iter().zip(runs) {
                result.outcomes[u] = outcomes;
            }
        }
        result.stats = Some(stats);
        result
    }

    fn empty_result(&self, mode: RunMode) -> ModeResult {
        ModeResult {
            mode,
            outcomes: vec![Vec::new(); self.units.len()],
            compiled: vec![false; self.units.len()],
            modules: 0,
            functions: 0,
            merged: 0,
            merged_across_files: 0,
            stats: None,
            compile_errors: Vec::new(),
            compile_time: Duration::ZERO,
        }
    }

    /// The configuration of `unit` if it is to be compiled at all.
    fn runnable_config(&self, unit: &Unit) -> Option<usize> {
        if unit.skip.is_some() {
            None
        } else {
            unit.config
        }
    }
}

fn skipped_lines(unit: &Unit) -> Vec<LineOutcome> {
    let reason = unit.skip.clone().unwrap_or(SkipReason::DoesNotCompile);
    unit.lines
        .iter()
        .map(|_| LineOutcome::Skipped(reason.clone()))
        .collect()
}

fn fail_lines(unit: &Unit, error: &str) -> Vec<LineOutcome> {
    unit.lines
        .iter()
        .map(|line| match line_skip(&line.command) {
            Some(reason) => LineOutcome::Skipped(reason),
            None => LineOutcome::Failed(format!("jitfold did not compile the file: {error}")),
        })
        .collect()
}

/// Why a line is skipped on its own (whatever the mode), if it is.
fn line_skip(command: &Result<RunCommand, LineError>) -> Option<SkipReason> {
    match command {
        Err(e) => Some(e.reason.clone()),
        Ok(RunCommand::Print(_)) => Some(SkipReason::PrintOnly),
        Ok(RunCommand::Run(..)) => None,
    }
}

fn jit_module(isa: &OwnedTargetIsa) -> JITModule {
    let mut builder = JITBuilder::with_isa(isa.clone(), default_libcall_names());
    builder.symbols(host::symbols());
    JITModule::new(builder)
}

/// Why a unit could not be compiled.
enum BuildError {
    /// A function names a function the file does not define.
    Unresolved(UnboundName),
    /// Anything else (the message).
    Other(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Unresolved(e) => write!(f, "{e}"),
            BuildError::Other(message) => write!(f, "{message}"),
        }
    }
}

/// Runs `f`, turning a panic inside Cranelift into an error.
fn guarded(f: impl FnOnce() -> Result<(), BuildError>) -> Result<(), BuildError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(BuildError::Other(format!(
            "Cranelift panicked: {}",
            panic_message(&p)
        )))
    })
}

/// A module that can hand out entry points once finalized.
trait Executable: Module {
    fn entry(&self, id: FuncId) -> ModuleResult<*const u8>;
}

impl Executable for JITModule {
    fn entry(&self, id: FuncId) -> ModuleResult<*const u8> {
        Ok(self.get_finalized_function(id))
    }
}

impl Executable for DedupModule<JITModule> {
    fn entry(&self, id: FuncId) -> ModuleResult<*const u8> {
        self.try_get_finalized_function(id)
    }
}

/// The ids a module gave to the units added to it.
struct Program {
    /// Per unit: the id of each of its functions.
    functions: HashMap<usize, Vec<FuncId>>,
    /// The unit of each function id.
    owner: HashMap<FuncId, usize>,
    /// One trampoline per signature, shared by the module's units.
    trampolines: HashMap<Signature, FuncId>,
    ctx: Context,
}

impl Default for Program {
    fn default() -> Self {
        Self {
            functions: HashMap::new(),
            owner: HashMap::new(),
            trampolines: HashMap::new(),
            ctx: Context::new(),
        }
    }
}

impl Program {
    /// Declares and defines the functions of `unit` (index `u`) in
    /// `module`, with the file's names mapped to them, and a trampoline for
    /// each signature a run line calls.
    fn add<M: Module>(&mut self, module: &mut M, u: usize, unit: &Unit) -> Result<(), BuildError> {
        let mut ids = HashMap::new();
        let mut declared = Vec::with_capacity(unit.functions.len());
        for func in &unit.functions {
            let id = module
                .declare_function(
                    &format!("{u}:{}", func.name),
                    Linkage::Local,
                    &func.signature,
                )
                .map_err(|e| BuildError::Other(error_text(&e)))?;
            if ids.insert(func.name.clone(), id).is_some() {
                return Err(BuildError::Other(format!(
                    "the file defines {} twice",
                    func.name
                )));
            }
            declared.push(id);
            self.owner.insert(id, u);
        }
        for (func, &id) in unit.functions.iter().zip(&declared) {
            self.ctx.clear();
            self.ctx.func = func.clone();
            bind_names(&mut self.ctx.func, id, &ids).map_err(BuildError::Unresolved)?;
            module
                .define_function(id, &mut self.ctx)
                .map_err(|e| BuildError::Other(format!("{}: {}", func.name, error_text(&e))))?;
        }
        for line in &unit.lines {
            let signature = &unit.functions[line.function].signature;
            if line_skip(&line.command).is_some() || self.trampolines.contains_key(signature) {
                continue;
            }
            let trampoline = invoke::trampoline_for(signature, module.isa());
            let n = self.trampolines.len();
            let id = module
                .declare_function(
                    &format!("trampoline{n}"),
                    Linkage::Local,
                    &trampoline.signature,
                )
                .map_err(|e| BuildError::Other(error_text(&e)))?;
            self.ctx.clear();
            self.ctx.func = trampoline;
            module.define_function(id, &mut self.ctx).map_err(|e| {
                BuildError::Other(format!("trampoline for {signature}: {}", error_text(&e)))
            })?;
            self.trampolines.insert(signature.clone(), id);
        }
        self.functions.insert(u, declared);
        Ok(())
    }

    /// Runs the lines of `units` (each with its index), which must have
    /// been added, and returns their outcomes in that order. The calls of
    /// all of them run in child processes ([`invoke::call_isolated`], one
    /// child until a call ends one), so a call that traps, faults or does
    /// not end fails its own line only.
    /// Runs the lines of `units` in `module`. A line that failed in
    /// `baseline` is not run again (a line that loops until its time limit
    /// would cost that limit once more): it fails with the baseline's
    /// message, followed by [`NOT_RUN_AGAIN`].
    fn run(
        &self,
        module: &impl Executable,
        units: &[(usize, &Unit)],
        baseline: Option<&ModeResult>,
    ) -> Vec<Vec<LineOutcome>> {
        let mut outcomes: Vec<Vec<LineOutcome>> = Vec::with_capacity(units.len());
        // (unit position, line index, command) of the lines to call, and
        // their calls.
        let mut to_run = Vec::new();
        let mut calls = Vec::new();
        for (k, &(u, unit)) in units.iter().enumerate() {
            let ids = &self.functions[&u];
            let mut own = Vec::with_capacity(unit.lines.len());
            for (l, line) in unit.lines.iter().enumerate() {
                if let Some(reason) = line_skip(&line.command) {
                    own.push(LineOutcome::Skipped(reason));
                    continue;
                }
                if let Some(LineOutcome::Failed(message)) =
                    baseline.and_then(|b| b.outcomes[u].get(l))
                {
                    own.push(LineOutcome::Failed(format!("{message} {NOT_RUN_AGAIN}")));
                    continue;
                }
                let Ok(command @ RunCommand::Run(invocation, ..)) = &line.command else {
                    unreachable!("line_skip skips unparsed and print lines")
                };
                let signature = &unit.functions[line.function].signature;
                let entries = module
                    .entry(ids[line.function])
                    .and_then(|f| Ok((f, module.entry(self.trampolines[signature])?)));
                match entries {
                    Ok((function, trampoline)) => {
                        to_run.push((k, own.len(), command));
                        calls.push(invoke::Call {
                            trampoline,
                            function,
                            signature,
                            args: &invocation.args,
                        });
                        // Replaced by the call's outcome below.
                        own.push(LineOutcome::Failed("not run".to_string()));
                    }
                    Err(e) => own.push(LineOutcome::Failed(format!("no entry point: {e}"))),
                }
            }
            outcomes.push(own);
        }
        // SAFETY: each trampoline was made by `trampoline_for(signature)` and
        // each function has `signature`; both are finalized in `module`,
        // which outlives the calls.
        let results = unsafe { invoke::call_isolated(&calls) };
        for ((k, l, command), result) in to_run.into_iter().zip(results) {
            outcomes[k][l] = match command.run(|_, _| result) {
                Ok(()) => LineOutcome::Passed,
                Err(message) => LineOutcome::Failed(message),
            };
        }
        outcomes
    }
}

/// A module error with its source chain (Cranelift's compile errors carry
/// the verifier's message there).
fn error_text(e: &cranelift_module::ModuleError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
