//! Parallel compilation in batch mode: with more than one
//! [thread](super::DedupOptions::threads), a flush walks its functions
//! on that many threads before it plans (see 6), compiles the functions it
//! is going to compile on them, then defines every function in the inner
//! module in the order a flush on one thread does (see 7 in `batch.rs`:
//! what planned duplicates run first, then the duplicates, then the rest,
//! each in definition order). The entries it fetched from a code store
//! are checked on them too (see 5 in `stored.rs`).
//!
//! # How
//!
//! After planning (see `batch.rs`), the pending functions are walked in
//! definition order and the flush's forecast is made (7 in `plan.rs`:
//! each planned against the cache as it was before the flush). A
//! function is *selected* when the forecast says it gets code of its own:
//! its plan is to compile it and no earlier function of the flush has its
//! exact key, its template (when it is to be kept for reuse) or its body
//! with the calling convention erased (when adaptable). Those are the
//! functions a one-thread flush compiles, since an earlier function with
//! one of these keys would make it a duplicate, reused code or an
//! adapter. The others are left to the define
//! pass, and so are functions whose walk fails, functions with exception
//! tables where the inner module must compile them (see 5), and, in a
//! module whose inner module has compiled nothing yet, the first selected
//! function (see 5).
//!
//! The selected functions are compiled on the flush's pool (`pool.rs`:
//! the flushing thread and `threads - 1` scoped threads), each thread with
//! its own `Context`, reused from one function to the next. Then the define pass
//! (`batch.rs`) goes through the functions in its order as before,
//! and where a function's plan is to compile it, defines the code compiled
//! for it instead of compiling it in the inner module.
//!
//! # What this module guarantees
//!
//! 1. Each selected function is compiled once, on one thread, against the
//!    inner module's ISA, with a copy of the control plane it was defined
//!    with. No lock is taken while compiling (nor at all: the functions
//!    are borrowed, the results are each thread's own until it ends).
//! 2. The module is the same as with one thread, byte for byte: a function
//!    is compiled from the same `Function` (as planning left it; see 3 for
//!    one rewritten since), ISA and control plane, and Cranelift's output
//!    depends on nothing else; it is defined in its turn with
//!    `define_function_bytes`, with the alignment and relocations the inner
//!    module derives from the compiled code in `define_function` (the same
//!    `ModuleReloc::from_mach_reloc`), and `JITModule` and `ObjectModule`
//!    place such code exactly as code they compile. The inner module so
//!    receives the same definitions in the same order: the same code bytes
//!    and symbol offsets.
//! 3. The define pass decides: code from the parallel phase is used only
//!    if, in the function's turn, rewriting its references changed nothing
//!    and its plan is still to compile it. Otherwise the code is dropped
//!    (counted in [`Stats::parallel_discarded`](super::Stats)) and the
//!    function is defined as on one thread.
//! 4. A compile error, or a panic of Cranelift, on a thread is that
//!    function's result, reported in its turn as on one thread: the
//!    `CodegenError` the inner module returns, or
//!    [`DedupError::CraneliftPanic`] naming the function. Failures are so
//!    listed in definition order, and every other function is defined. A
//!    thread that cannot be started leaves its share to the others; a
//!    function that got no result (its thread died) is compiled in its
//!    turn.
//! 5. What differs from one thread, none of it in the code:
//!    - The inner module does not compile these functions, so a wrapper
//!      inside it that reads `ctx.compiled_code()` does not see them (as
//!      with reused code; see "Where the wrapper sits" in the module docs).
//!    - `ObjectModule` writes frame descriptions only for what it compiles:
//!      jitfold writes those of these functions from their own unwind
//!      information (`unwind.rs`), the same descriptions in another place
//!      of `.eh_frame`. It knows that they were asked for when the inner
//!      module wrote one of its own, so a module's first compile is left
//!      to the inner module.
//!    - `JITModule` registers no unwind information, but with
//!      cranelift-jit's `wasmtime-unwinder` feature it records exception
//!      tables of the functions it compiles: then, and in a module jitfold
//!      does not know, functions with exception tables are left to the
//!      inner module
//!      ([`Policy::compile_catching`](crate::plan::Policy::compile_catching)).
//!    - [`Stats::compile_time`](super::Stats) counts each function's
//!      compile on its thread (without the inner module's defining); the
//!      phase's wall time is [`Stats::parallel_time`](super::Stats).
//! 6. Before planning, the pending functions not walked yet are walked on
//!    the pool, each by a fingerprinter of its thread's: a walk reads the
//!    function alone (the fingerprinter is scratch memory, reset at every
//!    walk), so it is the walk a one-thread flush makes, and planning
//!    keeps it only while its function is unchanged (6 in `batch.rs`). A
//!    walk that panics, or that got no result (its thread died), is left
//!    to planning, which walks the function again and fails it with the
//!    error a one-thread flush gives.

use super::flush::Record;
use super::ids::State;
use super::{DedupError, DedupModule, pool, verify};
use crate::code::MachineCode;
use crate::fingerprint::Fingerprinter;
use crate::plan::Foreseen;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::isa::unwind::UnwindInfo;
use cranelift_codegen::{CodegenError, Context};
use cranelift_module::{FuncId, Module, ModuleError, ModuleReloc};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// A function compiled on a thread of a flush: what defining it needs.
pub(super) struct Compiled {
    /// Its code, with relocations by name (kept as a template for reuse,
    /// or as reference code in check mode).
    pub(super) code: MachineCode,
    /// Its relocations, as the inner module would derive them.
    pub(super) relocs: Vec<ModuleReloc>,
    /// The code size Cranelift reports (`code_info().total_size`).
    pub(super) code_bytes: u64,
    /// Its unwind information, if the ISA has any for it.
    pub(super) unwind: Option<UnwindInfo>,
    /// How long compiling it took on its thread.
    pub(super) time: Duration,
}

/// Why a function compiled on a thread has no code.
pub(super) enum Failure {
    /// Cranelift returned this error.
    Codegen(CodegenError),
    /// Cranelift panicked with this payload.
    Panic(Box<dyn std::any::Any + Send>),
}

/// What compiling a function on a thread gave.
pub(super) type Precompiled = Result<Compiled, Failure>;

impl Failure {
    /// The error a one-thread flush gives for it, for function `function`.
    pub(super) fn into_error(self, function: impl FnOnce() -> String) -> ModuleError {
        match self {
            // What `From<CompileError>` for `ModuleError` makes of it.
            Failure::Codegen(e) => ModuleError::Compilation(e),
            Failure::Panic(panic) => DedupError::CraneliftPanic {
                function: function(),
                message: crate::compile::panic_message(&panic),
            }
            .into(),
        }
    }
}

/// One function to compile on a thread.
struct Job<'a> {
    id: FuncId,
    func: &'a Function,
    ctrl_plane: ControlPlane,
}

impl<M: Module> DedupModule<M> {
    /// Walks the pending functions of `flush` that hold no walk on the
    /// flush's threads (see 6 in the module docs), each walk kept in its
    /// record; nothing with one thread.
    pub(super) fn walk_in_parallel(&mut self, flush: &mut [Record]) {
        let threads = self.options.threads.max(1);
        if threads == 1 {
            return;
        }
        let unwalked: Vec<usize> = (0..flush.len())
            .filter(|&i| flush[i].walk.is_none() && self.ids.state(flush[i].id) == State::Pending)
            .collect();
        if unwalked.is_empty() {
            return;
        }
        let funcs: Vec<&Function> = unwalked.iter().map(|&i| &flush[i].func).collect();
        let isa = self.inner.isa();
        let done = pool::run(threads, &funcs, Fingerprinter::default, |walker, func| {
            verify::walk_ahead(walker, func, isa)
        });
        drop(funcs);
        for (job, walk) in done.results {
            flush[unwalked[job]].walk = walk;
        }
    }

    /// Compiles the functions of `flush` (planned, in definition order)
    /// that the define pass is going to compile, on
    /// [`DedupOptions::threads`](super::DedupOptions::threads) threads (see
    /// the module docs), with the walks the records hold (see `batch.rs`;
    /// the selection walks those they lack). Leaves each one's result in
    /// its record; nothing with one thread, or fewer than two such
    /// functions.
    pub(super) fn compile_in_parallel(&mut self, flush: &mut [Record]) {
        let threads = self.options.threads.max(1);
        if threads == 1 {
            return;
        }
        let selected = self.select_for_parallel(flush);
        if selected.len() < 2 {
            return;
        }
        let jobs: Vec<Job<'_>> = selected
            .iter()
            .map(|&index| {
                let record = &flush[index];
                Job {
                    id: record.id,
                    func: &record.func,
                    ctrl_plane: record.control.clone(),
                }
            })
            .collect();
        let isa = self.inner.isa();
        let done = pool::run(threads, &jobs, Context::new, |ctx, job| {
            compile_job(ctx, job, isa)
        });
        log::debug!(
            "batch flush: {} functions compiled on {} threads ({:?}) in {:?}",
            jobs.len(),
            done.per_thread.len(),
            done.per_thread,
            done.wall_time
        );
        self.stats
            .count_parallel_phase(&done.per_thread, done.wall_time);
        // The jobs borrow the functions: done with, before the records
        // take their results.
        drop(jobs);
        for (job, result) in done.results {
            flush[selected[job]].code = Some(result);
        }
    }

    /// The indices of the functions of `flush` to compile in parallel, in
    /// definition order (see the module docs): those the flush's forecast
    /// says get code of their own (`plan.rs`), but what the inner module
    /// compiles and what the store serves.
    fn select_for_parallel(&mut self, flush: &mut [Record]) -> Vec<usize> {
        let policy = self.policy();
        let isa = self.inner.isa();
        for record in flush.iter_mut() {
            if record.walk.is_none() && self.ids.state(record.id) == State::Pending {
                record.walk = verify::walk_checked(&mut self.fingerprinter, &record.func, isa)
                    .ok()
                    .map(|walk| walk.to_owned());
            }
        }
        let foreseen = self.forecast(flush);
        // Those getting code of their own, and whether their plans load.
        let candidates: Vec<(usize, bool)> = flush
            .iter()
            .zip(foreseen)
            .enumerate()
            .filter_map(|(index, (record, foreseen))| {
                let foreseen = foreseen.filter(Foreseen::gets_own_code)?;
                let walk = record.walk.as_ref().expect("planned").as_ref();
                // Code compiled here is defined from bytes.
                let by_inner = walk.planned(&record.func).compiled_by_inner(policy);
                (!by_inner).then_some((index, foreseen.load))
            })
            .collect();
        // The templates the store may serve are claimed at once (one round
        // trip to Redis per 256, rather than one each).
        Self::claim_all(
            &mut self.stored,
            candidates
                .iter()
                .filter(|&&(_, load)| load)
                .map(|&(index, _)| flush[index].walk.as_ref().expect("planned").as_ref()),
        );
        // The inner module compiles a module's first function (see 5).
        let mut leave_one = !self.frames.inner_compiled();
        let mut selected = Vec::new();
        for (index, load) in candidates {
            let walk = flush[index].walk.as_ref().expect("planned").as_ref();
            // What the code store holds, or another module compiles, is
            // loaded, not compiled.
            if Self::store_serves(&mut self.stored, &walk, load) {
                continue;
            }
            if leave_one {
                leave_one = false;
                continue;
            }
            selected.push(index);
        }
        Self::forget_busy(&mut self.stored);
        selected
    }
}

/// Compiles `job` in `ctx` against `isa` (see 1 and 4 in the module docs).
fn compile_job(ctx: &mut Context, job: &Job<'_>, isa: &dyn TargetIsa) -> Precompiled {
    let start = Instant::now();
    let mut ctrl_plane = job.ctrl_plane.clone();
    let compiled = catch_unwind(AssertUnwindSafe(|| {
        ctx.clear();
        ctx.func = job.func.clone();
        if let Err(e) = ctx.compile(isa, &mut ctrl_plane) {
            return Err(Failure::Codegen(e.inner));
        }
        let code = ctx.compiled_code().expect("just compiled");
        let relocs = code
            .buffer
            .relocs()
            .iter()
            .map(|reloc| ModuleReloc::from_mach_reloc(reloc, &ctx.func, job.id))
            .collect();
        Ok(Compiled {
            code: MachineCode::of(ctx).expect("just compiled"),
            relocs,
            code_bytes: u64::from(code.code_info().total_size),
            unwind: code.create_unwind_info(isa).ok().flatten(),
            time: Duration::ZERO,
        })
    }));
    match compiled {
        Ok(Ok(compiled)) => Ok(Compiled {
            time: start.elapsed(),
            ..compiled
        }),
        Ok(Err(failure)) => Err(failure),
        Err(panic) => {
            // Whatever the panic left in the context goes with it.
            *ctx = Context::new();
            Err(Failure::Panic(panic))
        }
    }
}
