//! Batch mode: the definitions recorded since the last flush are refined
//! over their call graph, grouped by fingerprint, and compiled one per
//! class; the others are defined as duplicates.
//!
//! # What this module guarantees
//!
//! 1. Before anything is compiled, functions equal over the call graph
//!    ([`crate::refine`], with callees of one class counted as one, see
//!    [`CallGraph::refine_with`](crate::refine::CallGraph::refine_with))
//!    are planned as duplicates of their class's first member, and
//!    references to planned duplicates are rewritten, round after round,
//!    until no new duplicate appears. Each round's plan is decided as a
//!    value by one pure step (`duplicates.rs`), and applied only once
//!    every function it counts on is verified (see 3).
//! 2. Duplicate links may chain; each duplicate is defined as a trampoline
//!    (or alias) to the root of its chain, which is a compiled function.
//! 3. Every function defined without being compiled (a planned duplicate)
//!    is verified first when the ISA's flags enable the verifier (see
//!    `verify.rs`), and so is the first member of every class with
//!    duplicates, before references to its duplicates are rewritten to it:
//!    a caller is never redirected to a function that fails to verify (nor,
//!    see 7, defined with a reference redirected to one that failed to
//!    compile).
//! 4. A failure does not stop the flush: a function that fails to verify,
//!    fingerprint or compile is left undefined (it may be defined again),
//!    and every other function is defined, duplicates of a failed function
//!    on their own. A panic while planning only costs the merges: every
//!    function is then defined on its own.
//! 5. Every failure is reported: the flush returns the error of its one
//!    failure as it is (the error plain Cranelift gives), or one error
//!    listing every failed function with its error; and as long as a failed
//!    function is neither defined again nor given up
//!    ([`DedupModule::take_failed_definitions`]), every later flush (and so
//!    `finalize_definitions`) fails, listing it.
//! 6. Each function is walked once per flush unless it changes (when it
//!    is recorded with one thread, on the flush's threads with more): its
//!    walk is kept in its record (`flush.rs`) from planning to the
//!    selection for other threads and to its definition, and dropped
//!    whenever a pass rewrites the function (its references to
//!    duplicates, or the function itself into a thunk), so every pass
//!    plans the function as it is.
//!    (Similar merging walks its candidates again for their shapes.)
//! 7. What a planned duplicate runs is defined before anything that
//!    counts on it, and a failure of it undoes the plan that counted on
//!    it (see `roots.rs`). The duplicates come next, and a failure of one
//!    undoes the plan the same way, before any function that counts on it
//!    is defined; then the other functions. Failures are listed in
//!    definition order.
//! 8. When a flush ends, every function it had to define is defined or
//!    listed as failed (and undefined), every duplicate runs a defined
//!    function, no store reservation or prefetched entry is left, and the
//!    statistics add up: one outcome counted per function defined and per
//!    merged body, and one function fewer counted as defined per failure.
//!    Debug builds check all of it (`check_flushed`). Nothing of the plan
//!    outlives the flush: it is in the flush's records and the ids'
//!    states, and every id of the flush ends defined or undefined.
//! 9. Every loop of a flush is bounded in code: each round that plans
//!    again fails one more function, leaves one more alone, marks one
//!    more as having its own address or plans one more as a duplicate, so
//!    none takes more rounds than the flush has functions, and one more.

use super::duplicates::{self, Canonical, Keyed, Round};
use super::flush::{Ahead, Record, Role};
use super::ids::State;
use super::parallel::Precompiled;
use super::verify::Walked;
use super::{DedupError, DedupModule, verify};
use crate::cache::DedupCache;
use crate::fingerprint::SymbolName;
use crate::plan::{Foreseen, Walk};
use crate::refine::{CallGraph, NodeId, RefinedClass};
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::{self, Function};
use cranelift_codegen::{CodegenError, Context};
use cranelift_module::{FuncId, Module, ModuleError, ModuleResult};
use hashbrown::HashMap;
use std::hash::Hash;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Functions that failed in this flush, with their errors.
pub(super) type Failures = Vec<(FuncId, ModuleError)>;

/// What batch mode keeps between flushes.
#[derive(Default)]
pub(super) struct Batch {
    /// Definitions recorded since the last flush, in order.
    pending: Vec<Record>,
    /// Definitions that failed and are still undefined, with their errors'
    /// text (see 5 above).
    failed: Vec<(FuncId, String)>,
    /// The context the flushes' definitions are compiled in, one after
    /// another, as an embedder reuses one: Cranelift keeps what it
    /// allocated (the register allocator's buffers above all) from one
    /// compile to the next. `None` while a definition holds it. Boxed: a
    /// `Context` is some 7 KB, which taking it out and putting it back
    /// moved for every function (a twentieth of a warm batch start).
    context: Option<Box<Context>>,
}

impl Batch {
    /// Forgets that a definition of `id` failed: it is being defined again.
    pub(super) fn forget_failure(&mut self, id: FuncId) {
        if !self.failed.is_empty() {
            self.failed.retain(|(failed, _)| *failed != id);
        }
    }
}

impl<M: Module> DedupModule<M> {
    /// Records the definition of `id` in `ctx` for the next flush (every
    /// definition in batch mode). Compiling rewrites the function in the
    /// context; the record takes it instead of a copy, and leaves its name
    /// and signature.
    pub(super) fn record_pending(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &ControlPlane,
    ) {
        let func = self.take_recorded(id, ctx);
        let mut record = Record::new(id, func, ctrl_plane.clone());
        // On one thread, the walk the flush needs is made now, while the
        // function is in the CPU's caches (a flush reads every function
        // recorded since the last, long after it was built); on more, the
        // flush's threads make it (see 6 above).
        if self.options.threads <= 1 {
            let isa = self.inner.isa();
            record.walk = verify::walk_ahead(&mut self.fingerprinter, &record.func, isa);
        }
        // Its entry is fetched while the flush records the rest.
        self.fetch_ahead(&mut record);
        self.batch.pending.push(record);
    }

    /// Records the definition of `id` in `ctx`, walked as `walk`, that
    /// eager mode leaves to the next flush, since another module is
    /// compiling its template (see 8 in `stored.rs`): kept as it is (see
    /// `Role::Kept` in `flush.rs`), the functions whose addresses it uses
    /// as data noted now, as its define would have. Its entry is not
    /// fetched ahead: another module is compiling it.
    pub(super) fn record_deferred(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &ControlPlane,
        walk: Walk,
    ) {
        self.note_addresses_taken(&walk.as_ref());
        let func = self.take_recorded(id, ctx);
        let record = Record::kept(id, func, ctrl_plane.clone(), walk);
        self.batch.pending.push(record);
    }

    /// Takes the function of `ctx` for a record of `id`, leaving its name
    /// and signature, and notes `id` as pending.
    fn take_recorded(&mut self, id: FuncId, ctx: &mut Context) -> Function {
        log::trace!(
            "{} ({id}): recorded for the next flush",
            self.function_name(id)
        );
        self.ids.plan(id, State::Pending);
        let rest = Function::with_name_signature(ctx.func.name.clone(), ctx.func.signature.clone());
        std::mem::replace(&mut ctx.func, rest)
    }

    /// Compiles the definitions recorded in batch mode: groups them by
    /// fingerprint (repeating after each round of reference rewriting, so that
    /// callers of merged functions merge too), compiles one function per
    /// group and defines the others as duplicates. In eager mode, defines
    /// the definitions left to it (see 8 in `stored.rs`), if any.
    ///
    /// With more than one [thread](super::DedupOptions::threads), the
    /// functions are walked, the code store's entries for them checked
    /// and the functions it compiles compiled on that many threads first,
    /// then every function is defined in the order one thread defines them
    /// (what planned duplicates run first, then the duplicates, then the
    /// rest, each in definition order):
    /// the inner module gets the same code in the same order (the same
    /// bytes and symbol offsets), failures are the same, listed in the same
    /// order. What differs: the inner module is handed that code with
    /// `define_function_bytes` (a wrapper inside it does not see it
    /// compiled; `ObjectModule`'s frame descriptions of it are written by
    /// jitfold, elsewhere in `.eh_frame`), functions with exception tables
    /// and a module's first compile are still compiled by the inner module,
    /// and [`Stats`](super::Stats) counts the compiles per thread and the
    /// phase's wall time.
    ///
    /// On an error the failed functions are left undefined and may be
    /// defined again; the others are defined. The error is the one failed
    /// function's own, or one listing every failed function; until each
    /// failed function is defined again or given up
    /// ([`DedupModule::take_failed_definitions`]), later flushes fail too.
    pub fn flush(&mut self) -> ModuleResult<()> {
        let mut flush = std::mem::take(&mut self.batch.pending);
        // Eager definitions deferred so far are defined now.
        self.forget_deferred();
        let mut failures = Failures::new();
        let before = (!flush.is_empty()).then(|| self.stats.clone());
        if before.is_some() {
            self.define_pending(&mut flush, &mut failures);
            // What failed is undefined again.
            let undefined = flush
                .iter()
                .filter(|r| self.ids.state(r.id) == State::Undefined)
                .count();
            self.stats.defined -= undefined as u64;
        }
        // Every entry is sent to the writer when a flush ends (eager
        // mode's too), and written before it ends where other modules may
        // wait for it, behind it elsewhere (see 9 in `stored.rs`); nothing
        // asked ahead outlives it (a flush cut short).
        self.end_writes();
        self.forget_fetches();
        if let Some(before) = before.filter(|_| cfg!(debug_assertions)) {
            self.check_flushed(&flush, &failures, &before);
        }
        self.report_failures(failures)
    }

    /// What holds once a flush has defined `flush` (see 8 above), checked
    /// in debug builds (the tests and the fuzzer): a panic names the broken
    /// invariant. `before` is the statistics before the flush.
    fn check_flushed(&self, flush: &[Record], failures: &Failures, before: &super::Stats) {
        let failed_ids: hashbrown::HashSet<FuncId> = failures.iter().map(|(f, _)| *f).collect();
        let mut defined = 0;
        for record in flush {
            let id = record.id;
            let failed = failed_ids.contains(&id);
            match self.ids.state(id) {
                State::Undefined => assert!(failed, "{id} is undefined, and did not fail"),
                State::Pending => panic!("{id} is still pending after the flush"),
                State::Planned { .. } => panic!("{id} is a duplicate only planned"),
                State::Compiled(_) | State::Bytes => defined += 1,
                State::Duplicate { .. } => {
                    defined += 1;
                    let root = self.ids.root_of(id);
                    assert!(
                        matches!(self.ids.state(root), State::Compiled(_) | State::Bytes),
                        "{id} runs {root}, which is not defined"
                    );
                }
            }
            assert!(
                !failed || self.ids.state(id) == State::Undefined,
                "{id} failed and is defined"
            );
        }
        // Every function defined counted one outcome, and so did every
        // merged body (see `similar.rs`): nothing else was counted.
        let outcomes = |s: &super::Stats| {
            s.compiled + s.reused + s.loaded + s.adapted + s.aliased + s.trampolined
        };
        let bodies = self.stats.similar_groups - before.similar_groups;
        assert_eq!(
            outcomes(&self.stats) - outcomes(before),
            defined + bodies,
            "outcomes counted, against functions defined ({defined}) and merged bodies"
        );
        assert_eq!(
            before.defined - self.stats.defined,
            failures.len() as u64,
            "functions counted as defined, against failures"
        );
        assert!(
            self.batch.pending.is_empty(),
            "definitions recorded while flushing"
        );
        assert!(
            !self.holds_store_state(),
            "a store reservation or prefetched entries outlive the flush"
        );
    }

    /// The batch definitions that failed and are still undefined, with
    /// their errors' text, oldest first.
    pub fn failed_definitions(&self) -> &[(FuncId, String)] {
        &self.batch.failed
    }

    /// Gives up the failed batch definitions: they stay undefined, and
    /// flushing no longer reports them. Returns them, as
    /// [`DedupModule::failed_definitions`] listed them.
    pub fn take_failed_definitions(&mut self) -> Vec<(FuncId, String)> {
        std::mem::take(&mut self.batch.failed)
    }

    /// Defines every function of `flush` (see 3 and 4 above), adding each
    /// failure to `failures`: the flush's phases, in order.
    fn define_pending(&mut self, flush: &mut [Record], failures: &mut Failures) {
        // 1. Plan duplicates (walking on the flush's threads first, see
        //    `parallel.rs`); put the roots back as the user wrote them.
        //    The store's entries for what is walked are fetched ahead,
        //    while planning.
        self.walk_in_parallel(flush);
        self.fetch_flush_ahead(flush);
        self.plan_and_put_back(flush, failures);
        // 2. The entries of what is planned to need code, fetched ahead or
        //    now, in a round trip per chunk of keys.
        self.prefetch_stored(flush);
        // 3. Merge similar functions into bodies and thunks.
        self.merge_similar(flush);
        // 4. With several threads, compile what is to be compiled (see
        //    `parallel.rs`); it is defined below in its turn.
        self.compile_in_parallel(flush);
        // 5. What planned duplicates run, then the duplicates (see 7 above).
        self.define_planned(flush, failures);
        // 6. The rest, a function another module is compiling last.
        self.define_rest(flush, failures);
        // 7. Failures listed in definition order, whatever order they
        //    were defined in.
        let position: HashMap<FuncId, usize> =
            flush.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
        failures.sort_by_key(|(id, _)| position.get(id).copied());
    }

    /// Defines the roots of the plan, then its planned duplicates; a
    /// failure of either undoes the plan for what is not defined yet and
    /// plans again (see `roots.rs`). Each failure leaves one more function
    /// of the flush failed for good, so this takes at most as many rounds
    /// as the flush has functions, and one more; should it take more (a
    /// bug, which debug builds stop at), every function left is defined on
    /// its own, as after a panic while planning.
    fn define_planned(&mut self, flush: &mut [Record], failures: &mut Failures) {
        for _ in 0..=flush.len() {
            if self.define_roots(flush, failures) && self.define_duplicates(flush, failures) {
                return;
            }
            self.plan_and_put_back(flush, failures);
        }
        debug_assert!(
            false,
            "a flush's plan was undone more often than it has functions"
        );
        self.plan_nothing(flush);
    }

    /// Undoes the plan and leaves every function of `flush` not defined
    /// yet alone: each is defined on its own (past a loop's bound, a bug).
    fn plan_nothing(&mut self, flush: &mut [Record]) {
        self.undo_plan(flush);
        for record in flush.iter_mut() {
            record.leave_alone();
        }
    }

    /// Defines every function of `flush` not defined yet, each as its own
    /// plan says (`define.rs`; the plan is settled: its roots and
    /// duplicates are defined). A function whose template another module
    /// is compiling comes last, after this flush gives up the templates it
    /// claimed (see 7 in `stored.rs`).
    fn define_rest(&mut self, flush: &mut [Record], failures: &mut Failures) {
        let mut deferred = Vec::new();
        // Templates are claimed a span of functions ahead, in one round
        // trip (see 7 in `stored.rs`).
        let spans = super::stored::claim_spans(flush.len());
        let mut spans_begun = 0;
        for i in 0..flush.len() {
            if spans.get(spans_begun).is_some_and(|span| span.start == i) {
                self.claim_ahead(flush, spans[spans_begun].clone());
                spans_begun += 1;
            }
            // Halfway through a span, the next one's claims are sent
            // ahead, where the store's calls are round trips.
            let span = &spans[spans_begun - 1];
            if i == span.start + span.len() / 2
                && let Some(next) = spans.get(spans_begun)
            {
                self.send_claims_ahead(flush, next.clone());
            }
            let record = &mut flush[i];
            if self.ids.state(record.id) != State::Pending {
                continue;
            }
            if record.code.is_none() && self.compiled_elsewhere(&record.func, &mut record.walk) {
                deferred.push(i);
                continue;
            }
            self.define_own(record, true, failures);
        }
        // What this flush claimed and did not define is no longer its to
        // compile: given up before it waits for others, whose entries
        // stored since are fetched at once.
        self.release_claims();
        self.refetch_deferred(flush, &deferred);
        for i in deferred {
            if self.ids.state(flush[i].id) == State::Pending {
                self.define_own(&mut flush[i], true, failures);
            }
        }
        self.end_prefetch();
    }

    /// Defines the planned duplicates of this flush, once what they run is
    /// defined. Returns `false` if one failed: the plan is then undone for
    /// what is not defined yet (see `roots.rs`), to be made again, since
    /// functions not defined yet may count on that duplicate.
    fn define_duplicates(&mut self, flush: &mut [Record], failures: &mut Failures) -> bool {
        for (i, canonical) in self.planned_duplicates(flush) {
            let record = &mut flush[i];
            let id = record.id;
            // Planning may chain duplicates (a group's first member can turn
            // out to be a duplicate in a later round); follow to the root.
            let root = self.ids.root_of(canonical);
            let root_defined = matches!(self.ids.state(root), State::Compiled(_) | State::Bytes);
            if !root_defined {
                // Its class's compiled function failed: it is on its own.
                self.define_own(record, true, failures);
                continue;
            }
            // Checked while still planned as a duplicate, so that its own
            // name maps to the root's.
            let checked = if self.options.check {
                self.check_duplicate(id, &record.func, root)
            } else {
                Ok(())
            };
            self.ids.plan(id, State::Undefined);
            let defined = checked.and_then(|()| self.define_trampoline(id, root));
            match defined {
                Ok(Some(outcome)) => self.stats.count(&outcome),
                Ok(None) => unreachable!("duplicates are planned only with trampolines"),
                Err(e) => {
                    failures.push((id, e));
                    self.undo_plan(flush);
                    return false;
                }
            }
        }
        true
    }

    /// Plans, then puts the roots back as the user wrote them (see
    /// `roots.rs`), planning again while that would change an address.
    /// Each round that plans again marks one more function of the flush as
    /// having its own address, so this takes at most as many rounds as the
    /// flush has functions, and one more; should it take more (a bug,
    /// which debug builds stop at), nothing is planned.
    fn plan_and_put_back(&mut self, flush: &mut [Record], failures: &mut Failures) {
        for _ in 0..=flush.len() {
            self.plan(flush, failures);
            if self.write_roots_as_written(flush) {
                return;
            }
        }
        debug_assert!(
            false,
            "putting roots back changed addresses more often than possible"
        );
        self.plan_nothing(flush);
    }

    /// Plans this flush's duplicates among its functions (see 1 to 3
    /// above); a panic while planning plans none (and undoes the rewrites
    /// made so far).
    fn plan(&mut self, flush: &mut [Record], failures: &mut Failures) {
        // Without a trampoline form for this ISA every function is compiled.
        if !self.machine_trampolines {
            return;
        }
        let planned = catch_unwind(AssertUnwindSafe(|| {
            self.plan_refined(flush, failures);
            self.plan_duplicates(flush, failures);
        }));
        if planned.is_err() {
            log::debug!("batch flush: planning panicked; nothing merged");
            self.undo_plan(flush);
            // Planning again could panic again.
            for record in flush.iter_mut() {
                if self.ids.state(record.id) == State::Pending {
                    record.leave_alone();
                }
            }
        }
    }

    /// Defines the function of `record` as `define_now` does in eager
    /// mode (the function is taken), with the code compiled for it on
    /// another thread, if any (used only if the function is still what
    /// was compiled, see `parallel.rs`), the store entry checked for it on
    /// another thread, if any (likewise, see `stored.rs`), and its walk
    /// kept from planning, if any; its references to duplicates are
    /// rewritten first if `rewrite` (not for a root put back as the user
    /// wrote it, see `roots.rs`) and the record's role allows it (not for
    /// a function eager mode left to the flush, see `Role::Kept`).
    pub(super) fn define_own(
        &mut self,
        record: &mut Record,
        rewrite: bool,
        failures: &mut Failures,
    ) {
        let id = record.id;
        self.ids.plan(id, State::Undefined);
        let mut ahead = Ahead {
            code: record.code.take(),
            entry: record.entry.take(),
            key: record.key.take(),
        };
        let mut walk = record.walk.take();
        // Planning may have found duplicates since the function was last
        // rewritten (a failed class's members are defined here too); a
        // function kept as eager mode walked it stays so (see `flush.rs`).
        let rewrite = rewrite && record.rewritten_when_defined();
        if rewrite && self.canonicalize_references(&mut record.func) {
            // Not the function that was compiled, walked or checked.
            self.discard_precompiled(id, ahead.code.take());
            ahead.entry = None;
            ahead.key = None;
            walk = None;
        }
        // Should the define unwind, the context goes with it, and the next
        // define makes a new one.
        let mut ctx = self
            .batch
            .context
            .take()
            .unwrap_or_else(|| Box::new(Context::new()));
        ctx.func = record.take_func();
        // The control plane the caller defined it with, as it was then.
        let mut ctrl_plane = std::mem::take(&mut record.control);
        let defined = self.define_now(id, &mut ctx, &mut ctrl_plane, &mut ahead, walk.as_ref());
        self.discard_precompiled(id, ahead.code);
        match defined {
            // What the function and its compile left is dropped or cleared
            // (capacity kept); nothing of it reaches the next function.
            Ok(()) => {
                ctx.clear();
                self.batch.context = Some(ctx);
            }
            // A failed define (a compile that panicked among them, whose
            // panic became its error) may leave anything in the context:
            // it goes, and the next define makes a new one.
            Err(e) => failures.push((id, e)),
        }
    }

    /// Drops `code`, compiled for `id` on another thread, if any: `id` was
    /// not defined from it (see 3 in `parallel.rs`).
    pub(super) fn discard_precompiled(&mut self, id: FuncId, code: Option<Precompiled>) {
        if code.is_some() {
            log::debug!(
                "{} ({id}): code compiled on another thread not used",
                self.function_name(id)
            );
            self.stats.parallel_discarded += 1;
        }
    }

    /// Marks `id` as failed with `error` (left undefined).
    fn fail(&mut self, id: FuncId, error: ModuleError, failures: &mut Failures) {
        log::debug!(
            "{} ({id}): failed, left undefined: {error}",
            self.function_name(id)
        );
        self.ids.plan(id, State::Undefined);
        failures.push((id, error));
    }

    /// Records this flush's `failures` beside the earlier ones still
    /// undefined, and returns the error to report (see 5 above).
    fn report_failures(&mut self, failures: Failures) -> ModuleResult<()> {
        let alone = failures.len() == 1 && self.batch.failed.is_empty();
        for (id, e) in &failures {
            let text = format!("{}: {}", self.function_name(*id), describe(e));
            self.batch.failed.push((*id, text));
        }
        if alone {
            return Err(failures.into_iter().next().expect("one failure").1);
        }
        if self.batch.failed.is_empty() {
            return Ok(());
        }
        Err(DedupError::BatchDefinitionsFailed {
            failures: self.batch.failed.clone(),
        }
        .into())
    }

    /// Plans over the call graph (see [`crate::refine`]): each pending
    /// function of a class with two or more members is planned as a
    /// duplicate of the class's first member. Callees are compared by
    /// class, so recursive and mutually recursive twins merge; names used
    /// as data (addresses) are compared by value.
    ///
    /// When a function the round counts on fails to verify, the
    /// refinement, which may have counted on it, is made again without it:
    /// each time fails one more function of the flush, so this takes at
    /// most as many rounds as the flush has functions, and one more.
    fn plan_refined(&mut self, flush: &mut [Record], failures: &mut Failures) {
        for _ in 0..=flush.len() {
            let keys = self.refined_keys(flush, failures);
            if let Some(round) = self.decide_verified(flush, &keys, failures) {
                self.apply_round(flush, &round);
                return;
            }
        }
        unreachable!("each refinement again fails one more function");
    }

    /// The key of each function of `flush` that takes part in planning
    /// over the call graph: its refined class (nothing is compiled with
    /// one; a function that fails to walk fails).
    fn refined_keys(
        &mut self,
        flush: &mut [Record],
        failures: &mut Failures,
    ) -> Vec<Option<Keyed<RefinedClass>>> {
        // A node per exact class of the pending functions.
        let mut exact = DedupCache::new();
        let mut graph = CallGraph::with_capacity(flush.len());
        let mut node_of = Vec::with_capacity(flush.len());
        // The record of each node's first function.
        let mut first_of_node = Vec::with_capacity(flush.len());
        for record in flush.iter_mut() {
            let id = record.id;
            if !self.takes_part(record) {
                node_of.push(None);
                continue;
            }
            let walk = match self.walk_pending(record) {
                Ok(walk) => walk,
                Err(e) => {
                    self.fail(id, e, failures);
                    node_of.push(None);
                    continue;
                }
            };
            // Nodes are added in the order of exact classes, one each.
            let node = match exact.get(&walk.fingerprint) {
                Some(class) => NodeId::from_u32(class.as_u32()),
                None => {
                    let node = graph.add_node(&walk.fingerprint, &walk.names, &walk.address_taken);
                    let class = exact.insert(walk.fingerprint.clone()).class();
                    debug_assert_eq!(node.as_u32(), class.as_u32(), "a node per exact class");
                    first_of_node.push(node_of.len());
                    node
                }
            };
            let own = SymbolName::User(ir::UserExternalName::new(0, id.as_u32()));
            graph.add_function(&own, node);
            node_of.push(Some(node));
        }
        // Callees of one class count as one (each node's function walked
        // again with them renamed, where it has two).
        let refinement = {
            let flush = &*flush;
            graph.refine_with(|node| Some(&flush[first_of_node[node.as_u32() as usize]].func))
        };
        log::trace!(
            "batch flush: {} functions refined in {} rounds",
            flush.len(),
            refinement.rounds
        );
        self.stats.refine_rounds += u64::from(refinement.rounds);
        node_of
            .into_iter()
            .map(|node| {
                node.map(|node| Keyed {
                    key: refinement.class_of[node],
                    compiled: None,
                })
            })
            .collect()
    }

    /// Plans each pending function whose fingerprint equals an earlier
    /// one's (or a compiled class's) as its duplicate, in rounds, since
    /// rewriting references to new duplicates can make callers equal,
    /// until a round plans nothing more: each round that plans plans one
    /// more function of the flush, so this takes at most as many rounds as
    /// the flush has functions, and one more.
    fn plan_duplicates(&mut self, flush: &mut [Record], failures: &mut Failures) {
        for _ in 0..=flush.len() {
            if !self.plan_exact_round(flush, failures) {
                return;
            }
        }
        unreachable!("each round of planning plans one more function");
    }

    /// One round of [`DedupModule::plan_duplicates`], made again without a
    /// function it counts on that fails to verify (each time fails one
    /// more function of the flush, so at most as many times as it has,
    /// and one more). Returns whether it planned a duplicate.
    fn plan_exact_round(&mut self, flush: &mut [Record], failures: &mut Failures) -> bool {
        for _ in 0..=flush.len() {
            // Every function taking part walked as it is now rewritten.
            for record in flush.iter_mut() {
                if self.takes_part(record)
                    && let Err(e) = self.walk_pending(record)
                {
                    self.fail(record.id, e, failures);
                }
            }
            let keys: Vec<Option<Keyed<&crate::Fingerprint>>> = flush
                .iter()
                .map(|record| {
                    let walk = record.walk.as_ref().filter(|_| self.takes_part(record))?;
                    let key = &walk.fingerprint;
                    // A retired class runs code bound as this one's would
                    // not be (see `retired.rs`).
                    let compiled = self.compiled.class_of(key);
                    let compiled = compiled.filter(|&class| !self.retired.is_retired(class));
                    Some(Keyed {
                        key,
                        compiled: compiled.map(|class| self.canonical_of(class)),
                    })
                })
                .collect();
            if let Some(round) = self.decide_verified(flush, &keys, failures) {
                return self.apply_round(flush, &round);
            }
        }
        unreachable!("each round again fails one more function");
    }

    /// Whether the function of `record` takes part in planning: pending,
    /// and not left alone.
    fn takes_part(&self, record: &Record) -> bool {
        self.ids.state(record.id) == State::Pending && record.role() != Role::Alone
    }

    /// The round [`duplicates::decide`] takes over `keys` (one per record
    /// of `flush`), once every function it counts on is verified; `None`
    /// once one fails to verify, which fails it.
    fn decide_verified<K: Eq + Hash>(
        &mut self,
        flush: &[Record],
        keys: &[Option<Keyed<K>>],
        failures: &mut Failures,
    ) -> Option<Round> {
        let round = duplicates::decide(keys);
        for &i in &round.counts_on {
            let record = &flush[i];
            let walked = record.walk.as_ref().map(|walk| Walked::of(&walk.as_ref()));
            if let Err(e) = self.verify_uncompiled(&record.func, walked) {
                self.fail(record.id, e, failures);
                return None;
            }
        }
        Some(round)
    }

    /// Plans the duplicates of `round`; returns whether it has any.
    fn apply_round(&mut self, flush: &[Record], round: &Round) -> bool {
        for &(i, canonical) in &round.duplicates {
            let canonical = match canonical {
                Canonical::First(first) => flush[first].id,
                Canonical::Compiled(id) => id,
            };
            self.ids.plan(flush[i].id, State::Planned { canonical });
        }
        !round.duplicates.is_empty()
    }
}

impl<M: Module> DedupModule<M> {
    /// The walk of the function of `record` after rewriting its references
    /// to this flush's duplicates: the one it holds, if the rewriting
    /// changed nothing and it holds one; after a rewrite, the one it held
    /// renamed, where that is the rewritten function's walk
    /// (`renamed_walk` in `address.rs`); or else a new walk, kept in it.
    pub(super) fn walk_pending<'r>(&mut self, record: &'r mut Record) -> ModuleResult<&'r Walk> {
        // Taken out first, so that a rewrite cut short (a panic) leaves
        // no walk of the function as it was.
        let mut kept = record.walk.take();
        // Rewriting references changes no value, so what the walk it held
        // read of the value table holds for the rewritten function too.
        let chains_short = kept.as_ref().is_some_and(|walk| walk.alias_chains_short);
        // A rewrite leaves the walk renamed, where that is the walk of the
        // rewritten function, else nothing.
        let rewritten = self.canonicalize_pending(record, &mut kept);
        record.walk = kept;
        // Debug builds (the tests and the fuzzer) check a renamed walk
        // against a new one.
        if cfg!(debug_assertions)
            && rewritten
            && let Some(renamed) = &record.walk
        {
            let walked =
                verify::walk_checked(&mut self.fingerprinter, &record.func, self.inner.isa())
                    .map(|walk| walk.to_owned());
            assert!(
                walked.is_ok_and(|walked| walked.finds_as(renamed)),
                "a walk renamed after a rewrite is not the rewritten function's"
            );
        }
        if record.walk.is_none() {
            let walk =
                verify::walk_checked(&mut self.fingerprinter, &record.func, self.inner.isa())?;
            let mut walk = walk.to_owned();
            walk.alias_chains_short = chains_short;
            debug_assert!(
                !chains_short || super::aliases::alias_chains_short(&record.func.dfg),
                "a rewrite of references changed the value table"
            );
            record.walk = Some(walk);
        }
        Ok(record.walk.as_ref().expect("walked"))
    }
}

impl<M: Module> DedupModule<M> {
    /// The forecast of `flush` (7 in `plan.rs`): what the define pass will
    /// need for each of its functions that is pending and walked (`None`
    /// for the others), as the cache stands before the flush defines them.
    pub(super) fn forecast(&self, flush: &[Record]) -> Vec<Option<Foreseen>> {
        let planned = flush.iter().map(|r| {
            let pending = self.ids.state(r.id) == State::Pending;
            r.walk
                .as_ref()
                .filter(|_| pending)
                .map(|w| w.planned(&r.func))
        });
        self.compiled.forecast(planned, self.policy())
    }
}

/// The text of `e`, with the verifier's errors when it has them.
fn describe(e: &ModuleError) -> String {
    match e {
        ModuleError::Compilation(CodegenError::Verifier(errors)) => format!("{e}: {errors}"),
        _ => e.to_string(),
    }
}
