//! Parallel compilation in batch mode: with more than one
//! [thread](super::DedupOptions::threads), a flush compiles the functions
//! it is going to compile on a pool of threads while it defines every
//! function in the inner module in definition order, as a flush on one
//! thread does.
//!
//! # How
//!
//! After planning (see `batch.rs`), the flushing thread walks the pending
//! functions in definition order and plans them against the cache as it
//! was before the flush. A function is *selected* when
//! its plan is to compile it and no earlier function of the flush has its
//! exact key, its template (when it is to be kept for reuse) or its body
//! with the calling convention erased (when adaptable): those are the
//! functions a one-thread flush compiles, since an earlier function with
//! one of these keys would make it a duplicate, reused code or an adapter.
//! The others are left to the define pass, and so are functions whose walk
//! fails, functions with exception tables (see 5), and, in a module whose
//! inner module has compiled nothing yet, the first selected function (see
//! 5). Each selected function is queued (a copy of it, with a copy of its
//! control plane) as soon as it is selected. With the first, `threads - 1`
//! scoped threads (with the 8 MiB stack of a main thread) are started,
//! each taking the first function nobody has taken, each with its own
//! `Context`, reused from one function to the next; a flush that queues
//! nothing starts no thread.
//!
//! Then the flushing thread runs the define pass (`batch.rs`): it goes
//! through the functions in definition order as before, and where a
//! function was queued, it takes the code compiled for it; if that is
//! still being compiled, it compiles the next queued function nobody has
//! taken, and waits only when there is none. So defining overlaps
//! compiling, and the flushing thread compiles when it would wait. Where
//! a function's plan is to compile it, the define pass defines the code
//! compiled for it instead of compiling it in the inner module. When the
//! pass ends, queued functions nobody took are not compiled.
//!
//! The pool compiles against a copy of the inner module's ISA, built from
//! its triple and flags (`isa_copy`), since the define pass needs the
//! inner module while the pool compiles. Cranelift's backends (x64,
//! aarch64, riscv64, s390x in 0.135.8) hold nothing but the triple, the
//! shared flags and the ISA flags, every one of which `isa_flags()` lists,
//! so the copy compiles what the original compiles. An ISA that cannot be
//! rebuilt with equal flags is compiled for on one thread; an embedder's
//! own `TargetIsa` that reports a built-in backend's name, triple and
//! flags is assumed to compile as that backend does.
//!
//! # What this module guarantees
//!
//! 1. Each queued function is compiled at most once, on one thread,
//!    against an ISA with the inner module's triple and flags, with a copy
//!    of the control plane it was defined with. No lock is held while
//!    compiling: the queue's lock is taken to take a function and to hand
//!    in its result.
//! 2. The module is the same as with one thread, byte for byte: a function
//!    is compiled from the same `Function` (as planning left it; see 3 for
//!    one rewritten since), ISA flags and control plane, and Cranelift's
//!    output depends on nothing else; it is defined in its turn with
//!    `define_function_bytes`, with the alignment and relocations the inner
//!    module derives from the compiled code in `define_function` (the same
//!    `ModuleReloc::from_mach_reloc`), and `JITModule` and `ObjectModule`
//!    place such code exactly as code they compile. The inner module so
//!    receives the same definitions in the same order: the same code bytes
//!    and symbol offsets.
//! 3. The define pass decides: code from the pool is used only if, in the
//!    function's turn, rewriting its references changed nothing and its
//!    plan is still to compile it. Otherwise the code is dropped (counted
//!    in [`Stats::parallel_discarded`](super::Stats)) and the function is
//!    defined as on one thread.
//! 4. A compile error, or a panic of Cranelift, on a thread is that
//!    function's result, reported in its turn as on one thread: the
//!    `CodegenError` the inner module returns, or
//!    [`DedupError::CraneliftPanic`] naming the function. Failures are so
//!    listed in definition order, and every other function is defined. A
//!    thread that cannot be started leaves its share to the others (the
//!    flushing thread is always one of them); a function whose thread died
//!    while compiling it is compiled in its turn, and the flush goes on
//!    (the dead thread is joined and logged).
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
//!      tables of the functions it compiles: functions with exception
//!      tables are left to the inner module.
//!    - [`Stats::compile_time`](super::Stats) counts each function's
//!      compile on its thread (without the inner module's defining); the
//!      wall time from the pool's start to the end of the define pass is
//!      [`Stats::parallel_time`](super::Stats).

use super::ids::State;
use super::{DedupError, DedupModule, verify};
use crate::code::MachineCode;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::unwind::UnwindInfo;
use cranelift_codegen::isa::{self, OwnedTargetIsa, TargetIsa};
use cranelift_codegen::settings::Configurable;
use cranelift_codegen::{CodegenError, Context};
use cranelift_module::{FuncId, Module, ModuleError, ModuleReloc};
use hashbrown::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The stack of each thread started for a flush: a main thread's, so that
/// a function that compiles on the flushing thread compiles on any.
const STACK_BYTES: usize = 8 << 20;

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

/// One function queued for the pool.
struct Job {
    id: FuncId,
    /// A copy of the function as planning left it.
    func: Function,
    /// A copy of the control plane it was defined with.
    ctrl_plane: ControlPlane,
}

/// Where a queued function is.
enum Slot {
    /// Queued; no thread has taken it.
    Queued(Box<Job>),
    /// A thread is compiling it.
    Compiling,
    /// Compiled; its result is waiting for the define pass.
    Done(Precompiled),
    /// Nothing to take: its result was taken, its thread died while
    /// compiling it, or the pool stopped before anyone took it.
    Empty,
}

/// The functions a flush queued, shared by the pool's threads.
struct Queue {
    /// The copy of the inner module's ISA the pool compiles against.
    isa: OwnedTargetIsa,
    state: Mutex<QueueState>,
    /// Notified when a function is queued or compiled, a slot is emptied,
    /// or the queue is closed.
    changed: Condvar,
}

/// What [`Queue::state`] guards.
struct QueueState {
    /// Each queued function, in the order queued (definition order).
    slots: Vec<Slot>,
    /// No slot before this one is [`Slot::Queued`].
    first_queued: usize,
    /// No more functions will be queued: a thread that finds nothing
    /// queued ends.
    closed: bool,
    /// The define pass has ended: a result handed in now is dropped.
    stopped: bool,
    /// Functions compiled by each thread, the flushing thread's first.
    per_thread: Vec<u64>,
    /// Functions compiled whose results nobody took.
    dropped: u64,
}

impl QueueState {
    /// Takes the first function nobody has taken, leaving its slot
    /// [`Slot::Compiling`].
    fn take_queued(&mut self) -> Option<(usize, Job)> {
        while self.first_queued < self.slots.len() {
            let n = self.first_queued;
            self.first_queued += 1;
            // A slot after the first may have been taken out of turn by
            // the define pass.
            if matches!(self.slots[n], Slot::Queued(_))
                && let Slot::Queued(job) = std::mem::replace(&mut self.slots[n], Slot::Compiling)
            {
                return Some((n, *job));
            }
        }
        None
    }
}

impl Queue {
    fn new(isa: OwnedTargetIsa, threads: usize) -> Queue {
        Queue {
            isa,
            state: Mutex::new(QueueState {
                slots: Vec::new(),
                first_queued: 0,
                closed: false,
                stopped: false,
                per_thread: vec![0; threads],
                dropped: 0,
            }),
            changed: Condvar::new(),
        }
    }

    /// The state, also after a thread panicked holding the lock (every
    /// update leaves it consistent).
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a change of the state.
    fn wait<'a>(&self, state: MutexGuard<'a, QueueState>) -> MutexGuard<'a, QueueState> {
        self.changed
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job`; returns its slot.
    fn push(&self, job: Job) -> usize {
        let mut state = self.lock();
        state.slots.push(Slot::Queued(Box::new(job)));
        self.changed.notify_one();
        state.slots.len() - 1
    }

    /// Closes the queue: nothing more will be queued.
    fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// Compiles `job` (slot `n`) on thread `thread` in `ctx`, and hands in
    /// the result.
    fn compile(&self, ctx: &mut Context, thread: usize, n: usize, job: Job) {
        let result = compile_job(ctx, job, &*self.isa);
        let mut state = self.lock();
        state.per_thread[thread] += 1;
        if state.stopped {
            state.dropped += 1;
        } else {
            state.slots[n] = Slot::Done(result);
        }
        self.changed.notify_all();
    }

    /// What each thread of the pool but the flushing one does: compiles
    /// queued functions until the queue is closed and empty.
    fn work(&self, thread: usize) {
        let mut ctx = Context::new();
        loop {
            let (n, job) = {
                let mut state = self.lock();
                loop {
                    if let Some(taken) = state.take_queued() {
                        break taken;
                    }
                    if state.closed {
                        return;
                    }
                    state = self.wait(state);
                }
            };
            let abandoned = Abandoned {
                queue: self,
                slot: n,
            };
            self.compile(&mut ctx, thread, n, job);
            std::mem::forget(abandoned);
        }
    }

    /// Stops the pool: closes the queue and empties every slot whose
    /// result is still to take, counting the results dropped (functions
    /// compiled for nothing) in [`QueueState::dropped`], as
    /// [`Queue::compile`] counts those handed in afterwards.
    fn stop(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.stopped = true;
        let mut dropped = 0;
        for slot in &mut state.slots {
            match slot {
                Slot::Done(_) => {
                    dropped += 1;
                    *slot = Slot::Empty;
                }
                Slot::Queued(_) => *slot = Slot::Empty,
                Slot::Compiling | Slot::Empty => {}
            }
        }
        state.dropped += dropped;
        self.changed.notify_all();
    }
}

/// Armed while a pool thread compiles a function: if the thread unwinds
/// out of it (not out of Cranelift, whose panics `compile_job` catches),
/// the function's slot is emptied, so that the define pass compiles it in
/// its turn instead of waiting for it.
struct Abandoned<'q> {
    queue: &'q Queue,
    slot: usize,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        if let Some(slot @ Slot::Compiling) = state.slots.get_mut(self.slot) {
            *slot = Slot::Empty;
        }
        self.queue.changed.notify_all();
    }
}

/// The flushing thread's side of the pool, for the define pass.
pub(super) struct Pool<'q> {
    queue: &'q Queue,
    /// The context the flushing thread compiles in.
    ctx: Context,
    /// Each pending function's slot, if it was queued.
    slot_of: Vec<Option<usize>>,
}

impl Pool<'_> {
    /// The code compiled for the pending function at `index`, if it was
    /// queued (and its thread did not die): taken when done, compiled here
    /// if nobody has taken it; while another thread compiles it, this
    /// thread compiles other queued functions, and waits only when there
    /// are none.
    pub(super) fn take(&mut self, index: usize) -> Option<Precompiled> {
        let n = (*self.slot_of.get(index)?)?;
        let queue = self.queue;
        let mut state = queue.lock();
        loop {
            match std::mem::replace(&mut state.slots[n], Slot::Empty) {
                Slot::Done(result) => return Some(result),
                Slot::Empty => return None,
                Slot::Queued(job) => {
                    drop(state);
                    let result = compile_job(&mut self.ctx, *job, &*queue.isa);
                    queue.lock().per_thread[0] += 1;
                    return Some(result);
                }
                Slot::Compiling => {
                    state.slots[n] = Slot::Compiling;
                    if let Some((m, job)) = state.take_queued() {
                        drop(state);
                        queue.compile(&mut self.ctx, 0, m, job);
                        state = queue.lock();
                    } else {
                        state = queue.wait(state);
                    }
                }
            }
        }
    }
}

impl Drop for Pool<'_> {
    /// Stops the pool also when the define pass unwinds, so that its
    /// threads end and the flush's scope can.
    fn drop(&mut self) {
        self.queue.stop();
    }
}

impl<M: Module> DedupModule<M> {
    /// Runs `define_pass` over `pending` (planned, in definition order)
    /// with a pool compiling what it is going to compile, on
    /// [`DedupOptions::threads`](super::DedupOptions::threads) threads (see
    /// the module docs); without a pool with one thread, or when the ISA
    /// cannot be copied.
    pub(super) fn with_pool(
        &mut self,
        pending: &mut [(FuncId, Function)],
        define_pass: impl FnOnce(&mut Self, &mut [(FuncId, Function)], Option<&mut Pool<'_>>),
    ) {
        let threads = self.options.threads.max(1);
        let isa = if threads > 1 {
            isa_copy(self.inner.isa())
        } else {
            None
        };
        let Some(isa) = isa else {
            if threads > 1 {
                log::debug!("batch flush: the ISA cannot be copied, compiling on one thread");
            }
            return define_pass(self, pending, None);
        };
        let queue = Queue::new(isa, threads);
        let start = Instant::now();
        std::thread::scope(|scope| {
            let queue = &queue;
            // Stops the pool however this scope ends, so that its threads
            // end.
            let mut pool = Pool {
                queue,
                ctx: Context::new(),
                slot_of: Vec::new(),
            };
            // The threads start with the first function queued.
            let mut started = Vec::new();
            pool.slot_of = self.queue_selected(pending, &mut |job| {
                if started.is_empty() {
                    started = (1..threads)
                        .filter_map(|t| {
                            let thread = std::thread::Builder::new()
                                .name(format!("jitfold-flush-{t}"))
                                .stack_size(STACK_BYTES)
                                .spawn_scoped(scope, move || queue.work(t));
                            thread
                                .inspect_err(|e| log::debug!("batch flush: thread {t}: {e}"))
                                .ok()
                        })
                        .collect();
                }
                queue.push(job)
            });
            queue.close();
            define_pass(self, pending, Some(&mut pool));
            drop(pool);
            // A thread that died (outside Cranelift, whose panics are
            // caught) has had its function compiled in its turn (see 4).
            for thread in started {
                if thread.join().is_err() {
                    log::warn!("batch flush: a compiling thread panicked");
                }
            }
        });
        let wall_time = start.elapsed();
        let (per_thread, dropped, queued) = {
            let state = queue.lock();
            (state.per_thread.clone(), state.dropped, state.slots.len())
        };
        if queued == 0 {
            return;
        }
        log::debug!(
            "batch flush: {} functions compiled on {threads} threads ({per_thread:?}) in {wall_time:?}",
            per_thread.iter().sum::<u64>(),
        );
        self.stats.count_parallel_phase(&per_thread, wall_time);
        self.stats.parallel_discarded += dropped;
    }

    /// Queues the functions of `pending` to compile in parallel with
    /// `queue` (which returns a job's slot), in definition order (see the
    /// module docs); returns each one's slot.
    fn queue_selected(
        &mut self,
        pending: &[(FuncId, Function)],
        queue: &mut dyn FnMut(Job) -> usize,
    ) -> Vec<Option<usize>> {
        let policy = self.policy();
        let mut walker = std::mem::take(&mut self.fingerprinter);
        let isa = self.inner.isa();
        // Every key that a function of this flush may add to the cache
        // before its turn.
        let mut exact = HashSet::new();
        let mut templates = HashSet::new();
        let mut bodies = HashSet::new();
        // The inner module compiles a module's first function (see 5).
        let mut leave_one = !self.frames.inner_compiled();
        let mut slot_of = vec![None; pending.len()];
        for (index, (id, func)) in pending.iter().enumerate() {
            if self.ids.state(*id) != State::Pending {
                continue;
            }
            let Ok(walk) = verify::walk_checked(&mut walker, func, isa) else {
                continue;
            };
            let plan = self.compiled.plan(&walk.planned(func), policy);
            let compiles =
                plan.duplicate_of.is_none() && plan.reuse.is_none() && plan.adapter_for.is_none();
            let new_key = exact.insert(walk.fingerprint.to_fingerprint());
            let new_template = plan.keep_template.is_none_or(|t| templates.insert(t));
            let new_body = plan.keep_body.is_none_or(|b| bodies.insert(b));
            if !(compiles && new_key && new_template && new_body) {
                continue;
            }
            if !func.dfg.exception_tables.is_empty() {
                continue;
            }
            // What the code store holds is loaded, not compiled.
            if self.store_holds(&walk) {
                continue;
            }
            if leave_one {
                leave_one = false;
                continue;
            }
            slot_of[index] = Some(queue(Job {
                id: *id,
                func: func.clone(),
                ctrl_plane: self.batch.control_plane(*id),
            }));
        }
        self.fingerprinter = walker;
        slot_of
    }
}

/// A copy of `isa`: the same triple, shared flags and ISA flags, or `None`
/// if it cannot be built with flags equal to `isa`'s.
fn isa_copy(isa: &dyn TargetIsa) -> Option<OwnedTargetIsa> {
    let mut builder = isa::lookup(isa.triple().clone()).ok()?;
    let flags_of = |isa: &dyn TargetIsa| -> Vec<(&'static str, String)> {
        let values = isa.isa_flags();
        values.iter().map(|v| (v.name, v.value_string())).collect()
    };
    let wanted = flags_of(isa);
    for (name, value) in &wanted {
        builder.set(name, value).ok()?;
    }
    let copy = builder.finish(isa.flags().clone()).ok()?;
    let same = copy.triple() == isa.triple()
        && copy.flags() == isa.flags()
        && flags_of(&*copy) == wanted
        && copy.name() == isa.name();
    same.then_some(copy)
}

/// Compiles `job` in `ctx` against `isa` (see 1 and 4 in the module docs).
fn compile_job(ctx: &mut Context, job: Job, isa: &dyn TargetIsa) -> Precompiled {
    let start = Instant::now();
    let Job {
        id,
        func,
        mut ctrl_plane,
    } = job;
    let compiled = catch_unwind(AssertUnwindSafe(|| {
        ctx.clear();
        ctx.func = func;
        if let Err(e) = ctx.compile(isa, &mut ctrl_plane) {
            return Err(Failure::Codegen(e.inner));
        }
        let code = ctx.compiled_code().expect("just compiled");
        let relocs = code
            .buffer
            .relocs()
            .iter()
            .map(|reloc| ModuleReloc::from_mach_reloc(reloc, &ctx.func, id))
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

#[cfg(test)]
mod tests {
    use super::*;
    use cranelift_codegen::ir::{AbiParam, InstBuilder, Signature, UserFuncName, types::I64};
    use cranelift_codegen::isa::CallConv;
    use cranelift_codegen::settings::{self, Configurable};
    use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

    fn isa() -> OwnedTargetIsa {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").unwrap();
        crate::isa::host_isa(settings::Flags::new(flags)).unwrap()
    }

    /// `fn(x: i64) -> i64 { x + k }`.
    fn add(k: i64) -> Function {
        let mut sig = Signature::new(CallConv::SystemV);
        sig.params.push(AbiParam::new(I64));
        sig.returns.push(AbiParam::new(I64));
        let mut func = Function::with_name_signature(UserFuncName::user(0, k as u32), sig);
        let mut ctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut func, &mut ctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let x = b.block_params(entry)[0];
        let k = b.ins().iconst(I64, k);
        let y = b.ins().iadd(x, k);
        b.ins().return_(&[y]);
        b.seal_all_blocks();
        b.finalize(isa().frontend_config());
        func
    }

    fn job(k: i64) -> Job {
        Job {
            id: FuncId::from_u32(k as u32),
            func: add(k),
            ctrl_plane: ControlPlane::default(),
        }
    }

    fn bytes(result: Option<Precompiled>) -> Vec<u8> {
        match result {
            Some(Ok(compiled)) => compiled.code.bytes,
            Some(Err(_)) => panic!("a compile failed"),
            None => panic!("no result"),
        }
    }

    #[test]
    fn the_isa_copy_compiles_what_the_isa_compiles() {
        let isa = isa();
        let copy = isa_copy(&*isa).expect("a host ISA can be copied");
        assert!(copy.flags() == isa.flags());
        let compiled = |isa: &dyn TargetIsa| {
            let mut ctx = Context::new();
            bytes(Some(compile_job(&mut ctx, job(7), isa)))
        };
        assert_eq!(compiled(&*copy), compiled(&*isa));
    }

    #[test]
    fn the_define_pass_compiles_what_nobody_took_in_any_order() {
        let queue = Queue::new(isa(), 2);
        let slots: Vec<_> = (0..3).map(|k| Some(queue.push(job(k)))).collect();
        queue.close();
        let mut pool = Pool {
            queue: &queue,
            ctx: Context::new(),
            slot_of: slots,
        };
        // Out of turn, then the ones before it, with no thread to help.
        let last = bytes(pool.take(2));
        let first = bytes(pool.take(0));
        assert_ne!(first, last);
        bytes(pool.take(1));
        // Taken once: nothing the second time, nor for an index never queued.
        assert!(pool.take(0).is_none());
        assert!(pool.take(3).is_none());
        drop(pool);
        let state = queue.lock();
        assert_eq!(state.per_thread, [3, 0]);
        assert_eq!(state.dropped, 0);
    }

    #[test]
    fn a_worker_compiles_what_is_queued_and_results_nobody_takes_are_dropped() {
        let queue = Queue::new(isa(), 2);
        let n = queue.push(job(1));
        queue.push(job(2));
        queue.close();
        // A worker alone empties the queue, then ends.
        queue.work(1);
        let mut pool = Pool {
            queue: &queue,
            ctx: Context::new(),
            slot_of: vec![Some(n)],
        };
        let mut ctx = Context::new();
        assert_eq!(
            bytes(pool.take(0)),
            bytes(Some(compile_job(&mut ctx, job(1), &*isa())))
        );
        drop(pool);
        let state = queue.lock();
        assert_eq!(state.per_thread, [0, 2]);
        assert_eq!(state.dropped, 1, "the second result was never taken");
    }

    #[test]
    fn a_worker_skips_what_the_define_pass_took_out_of_turn() {
        let queue = Queue::new(isa(), 2);
        let slots: Vec<_> = (0..3).map(|k| Some(queue.push(job(k)))).collect();
        queue.close();
        let mut pool = Pool {
            queue: &queue,
            ctx: Context::new(),
            slot_of: slots,
        };
        bytes(pool.take(1));
        queue.work(1);
        assert!(matches!(queue.lock().slots[1], Slot::Empty));
        bytes(pool.take(0));
        bytes(pool.take(2));
        drop(pool);
        assert_eq!(queue.lock().per_thread, [1, 2]);
    }

    /// A result handed in after `stop` (its thread was compiling when the
    /// define pass ended without taking it) is counted as dropped, so that
    /// every compile in `Stats::compiles_per_thread` is in `compiled`,
    /// failures or `parallel_discarded`.
    #[test]
    fn a_result_handed_in_after_stop_is_counted_as_dropped() {
        let queue = Queue::new(isa(), 2);
        queue.push(job(1));
        queue.close();
        let (n, taken) = queue.lock().take_queued().unwrap();
        // The define pass ends (the pool is dropped) while it compiles.
        queue.stop();
        queue.compile(&mut Context::new(), 1, n, taken);
        let state = queue.lock();
        assert_eq!(state.per_thread, [0, 1]);
        assert_eq!(state.dropped, 1, "a compile nobody took is not counted");
        assert!(matches!(state.slots[n], Slot::Compiling));
    }

    #[test]
    fn a_function_whose_thread_died_is_compiled_in_its_turn() {
        let queue = Queue::new(isa(), 2);
        let n = queue.push(job(1));
        queue.close();
        let taken = queue.lock().take_queued();
        assert!(matches!(taken, Some((0, _))));
        // The thread that took it unwinds before handing anything in.
        drop(Abandoned {
            queue: &queue,
            slot: n,
        });
        let mut pool = Pool {
            queue: &queue,
            ctx: Context::new(),
            slot_of: vec![Some(n)],
        };
        assert!(pool.take(0).is_none());
    }
}
