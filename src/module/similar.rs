//! Similar-function merging (with
//! [`DedupOptions::similar`](super::DedupOptions::similar)): in batch mode,
//! after a flush has planned its duplicates, the functions it is going to
//! compile that
//! differ only in a few constants or callees ([`crate::similar`]) share
//! one parameterized body, and each becomes a thunk that passes its own
//! values and callees' addresses.
//!
//! In eager mode, functions are merged as they come, without compiling
//! anything again (see 6).
//!
//! Deciding is pure ([`plan_merges`], over the shapes of the candidates,
//! with [`similar::split`] and [`similar::plan_group`]; in eager mode
//! [`similar::derive`], the cost model and [`similar::values_for`]);
//! carrying it out is [`DedupModule::merge_similar`]'s and
//! [`DedupModule::eager_thunk`]'s.
//!
//! # What this module guarantees
//!
//! 1. **Candidates.** Only functions still pending whose plan is to
//!    compile them (no duplicate, reused code or adapter, as the flush's
//!    forecast says, 7 in `plan.rs`, and no entry in the code store) are
//!    merged, only when they are
//!    [`similar::mergeable`] and have a parameter site, and never in check
//!    mode (whose comparison with each function's own code would find a
//!    thunk there). A function whose walk fails is left alone (planning
//!    failed it already).
//! 2. **Groups.** Candidates of one [shape](crate::similar) are split so
//!    that each subgroup fits [`SimilarOptions::max_params`], and a
//!    subgroup of two or more is merged only if [`similar::plan_group`]
//!    says so (the cost model predicts that it pays, and a stack limit's
//!    growth is within [`SimilarOptions::stack`]), with each member's code
//!    size estimated from the instructions Cranelift lowers
//!    ([`similar::lowered`]: a client's dead code does not count) by
//!    [`CostModel::function_bytes`](crate::similar::CostModel::function_bytes)
//!    (they are not compiled yet). Members are in definition order; the
//!    first one's code becomes the body.
//! 3. **Thunks.** A thunk tail-calls the body (`return_call`) when both
//!    use the `tail` convention and the target compiles tail calls (on
//!    x86-64, only with `preserve_frame_pointers`); otherwise it calls and
//!    returns. A thunk of a member with a stack limit checks that limit
//!    (see [`similar::StackDepth`]), unless it tail-calls, on x86-64 or
//!    aarch64, a body whose arguments are all in registers
//!    ([`similar::thunk_skips_stack_check`]).
//! 4. **Ids.** The body is declared as an anonymous local function of the
//!    inner module (an id of the module's own, never one of the user's: in
//!    an object file, a local symbol) and defined at once as any function
//!    is (`define.rs`: compiled by the inner module, counted in
//!    [`Stats`](super::Stats), kept in the cache under its own keys).
//!    Every member keeps its id: its `Function` in the flush is replaced
//!    by its thunk, which the define pass then defines as any function,
//!    under the thunk's own keys. So every member's address
//!    (`get_finalized_function`, references, symbols) is its thunk's, and
//!    no cache entry describes code other than its own: a later function
//!    equal to a member is never taken for it (it compiles, or merges
//!    anew, and only what is equal to a thunk or body becomes their
//!    duplicate).
//! 5. **Failures.** Merging never fails a function: a group whose body
//!    cannot be built or defined, or one of whose members (other than the
//!    first, which the body's compile verifies) fails to verify when the
//!    flags enable the verifier, is left alone, and its members are then
//!    compiled (or fail) on their own. A panic while deciding merges
//!    nothing. A body that fails to compile is defined in the inner module
//!    as a function that traps, referenced by nothing and not counted, so
//!    that its id does not stay undefined (`ObjectModule::finish` asserts
//!    that every local function is defined; see `define_unused_body`).
//!
//! 6. **Eager mode.** A function whose plan reaches
//!    [`Step::Similar`](crate::plan::Step::Similar) (right before
//!    compiling: no duplicate, reused code, adapter or stored code served
//!    it), mergeable and with parameter
//!    sites is shaped (a second walk: the define path's walk is borrowed
//!    by its plan). The first function of a shape is compiled on its own
//!    and its site values are kept. The second gets a body built from it,
//!    with the parameters [`similar::derive`] gives for the two, if
//!    [`similar::plan_group`] merges a group of two such members (though
//!    the first keeps its own code, so that only members from the third
//!    on save code); it becomes that body's thunk.
//!    Otherwise the shape is left alone for good. A later member becomes a
//!    thunk of the body if it fits ([`similar::values_for`]: the sites the
//!    body keeps as constants have its values), and is compiled on its own
//!    otherwise. Every member that becomes a thunk is verified first (its
//!    own code is never compiled), and bodies and thunks are not merged
//!    again. The same guarantees as above hold for ids, the cache and
//!    failures (a body that fails leaves the shape alone). A body whose
//!    code a JIT bound to a host symbol the module may still define takes
//!    no more members (see `retired.rs`). Definitions an eager module
//!    leaves to a flush (8 in `stored.rs`) are kept as they were walked
//!    (`Role::Kept` in `flush.rs`): the flush's pass above leaves them
//!    out, and each is merged as eager mode merges when the flush defines
//!    it, its thunk naming the duplicates defined since as an eager define
//!    names them (so that every address it passes is the one the module
//!    gives).
//!
//! What an embedder sees differently: code addresses inside a body belong
//! to the body's anonymous id (in `DedupModule::functions_at`, a profiler's
//! map, an object file's local symbol), not to the members; and
//! [`Stats::code_bytes_without_dedup`](super::Stats) counts the bodies and
//! thunks, not the members' code they replace (which was never compiled).
//!
//! # What it costs
//!
//! Shaping each candidate (a second walk and the shape scan, about twice
//! a walk's time, see [`crate::similar`]) and the plans; at run time, one
//! extra call per entry into a merged function, and registers instead of
//! immediates in the body (see
//! [`DedupOptions::similar`](super::DedupOptions::similar)). Functions
//! outside the flush's pending ones are never merged: an earlier flush's
//! compiled functions stay as they are.

use super::define::compile_panic;
use super::flush::{Ahead, Record};
use super::ids::State;
use super::{DedupModule, verify};
use crate::fingerprint::{Fingerprinter, Shape};
use crate::similar::{
    self, Decision, Derived, GroupPlan, ParamValue, ShapeOf, Shaper, SimilarOptions, SiteValue,
};
use cranelift_codegen::Context;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::cursor::{Cursor, FuncCursor};
use cranelift_codegen::ir::{
    Function, InstBuilder, Signature, TrapCode, Type, UserExternalName, UserFuncName,
};
use cranelift_module::{FuncId, Module};
use hashbrown::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A pending function that may be merged.
pub(super) struct Candidate {
    /// Its index among the flush's records.
    pub(super) index: usize,
    /// Its shape and parameter sites.
    pub(super) shape: ShapeOf,
    /// What its code size is estimated from ([`similar::lowered`]).
    pub(super) lowered: similar::Lowered,
}

/// A group to merge: its members' indices among the candidates, in
/// definition order, and its plan.
pub(super) struct Merge {
    /// Indices into the candidates; the first one's code is the body.
    pub(super) members: Vec<usize>,
    /// Its parameters and the cost model's prediction.
    pub(super) plan: GroupPlan,
}

/// The groups of `candidates` (each standing for the function whose
/// signature, and whether it checks a stack limit, `signatures` holds at
/// its [`Candidate::index`]) to merge
/// under `options`: by
/// shape, split to fit the parameter limit, merged where the cost model
/// predicts a saving (see 2 in the module docs). Pure.
pub(super) fn plan_merges(
    candidates: &[Candidate],
    signatures: &[(&Signature, bool)],
    options: &SimilarOptions,
) -> Vec<Merge> {
    let mut by_shape: HashMap<&Shape, usize> = HashMap::new();
    let mut shapes: Vec<Vec<usize>> = Vec::new();
    for (c, candidate) in candidates.iter().enumerate() {
        let next = shapes.len();
        let g = *by_shape.entry(&candidate.shape.shape).or_insert(next);
        if g == next {
            shapes.push(Vec::new());
        }
        shapes[g].push(c);
    }
    let mut merges = Vec::new();
    for group in shapes.into_iter().filter(|g| g.len() > 1) {
        let values: Vec<&[similar::ParamValue]> = group
            .iter()
            .map(|&c| &candidates[c].shape.values[..])
            .collect();
        for part in similar::split(&values, options.max_params) {
            if part.len() < 2 {
                continue;
            }
            let members: Vec<usize> = part.iter().map(|&i| group[i]).collect();
            let values: Vec<&[similar::ParamValue]> = members
                .iter()
                .map(|&c| &candidates[c].shape.values[..])
                .collect();
            let bytes: Vec<u64> = members
                .iter()
                .map(|&c| options.model.function_bytes(candidates[c].lowered))
                .collect();
            let (sig, stack_limited) = signatures[candidates[members[0]].index];
            let Some(plan) = similar::plan_group(sig, stack_limited, &values, &bytes, options)
            else {
                continue;
            };
            if plan.decision == Decision::Merge {
                merges.push(Merge { members, plan });
            }
        }
    }
    merges
}

impl<M: Module> DedupModule<M> {
    /// Merges similar functions among `flush` (planned; see the module
    /// docs) when [`DedupOptions::similar`](super::DedupOptions::similar)
    /// is on: defines each merged group's body and replaces its members'
    /// functions with their thunks (which forgets their walks).
    pub(super) fn merge_similar(&mut self, flush: &mut [Record]) {
        let Some(options) = self.options.similar else {
            return;
        };
        if self.options.check {
            return;
        }
        let decided = catch_unwind(AssertUnwindSafe(|| {
            let candidates = self.similar_candidates(flush, &options);
            let signatures: Vec<(&Signature, bool)> = flush
                .iter()
                .map(|r| (&r.func.signature, r.func.stack_limit.is_some()))
                .collect();
            let merges = plan_merges(&candidates, &signatures, &options);
            (candidates, merges)
        }));
        let Ok((candidates, merges)) = decided else {
            log::debug!("batch flush: similar-function merging panicked; nothing merged");
            return;
        };
        for merge in merges {
            self.carry_out(flush, &candidates, merge);
        }
    }

    /// The candidates for merging among `flush` (see 1 in the module
    /// docs), in definition order: the functions the flush's forecast says
    /// get code of their own (`plan.rs`; every one, not only the first of
    /// its template or body, which merging may turn into thunks too), as
    /// the define pass will see them, but what the store holds.
    fn similar_candidates(
        &mut self,
        flush: &mut [Record],
        options: &SimilarOptions,
    ) -> Vec<Candidate> {
        for record in flush.iter_mut() {
            // As the define pass will see it; one that cannot be walked
            // fails in its define.
            if self.ids.state(record.id) == State::Pending {
                let _ = self.walk_pending(record);
            }
        }
        let foreseen = self.forecast(flush);
        let isa = self.inner.isa();
        let mut walker = std::mem::take(&mut self.fingerprinter);
        let mut shaper = Shaper::new();
        let mut candidates = Vec::new();
        for (index, (record, foreseen)) in flush.iter().zip(foreseen).enumerate() {
            let Some(foreseen) = foreseen.filter(|f| f.needs_code) else {
                continue;
            };
            // Its body or thunk would be defined calling a function not
            // defined yet (see `roots.rs`).
            if record.rewritten_in_flush() {
                continue;
            }
            let func = &record.func;
            let walk = record.walk.as_ref().expect("planned").as_ref();
            if self.store_holds(&walk, foreseen.load) {
                continue;
            }
            if !similar::mergeable(func, walk.observes_own_frame, options.stack) {
                continue;
            }
            // Walked again, for its shape (which reads the walk's state).
            if verify::walk_checked(&mut walker, func, isa).is_err() {
                continue;
            }
            let shape = shaper.shape(&walker.last_walk(), func);
            if shape.values.is_empty() {
                continue;
            }
            candidates.push(Candidate {
                index,
                shape,
                lowered: similar::lowered(func),
            });
        }
        self.fingerprinter = walker;
        candidates
    }

    /// Carries out `merge` (see 3 to 5 in the module docs): defines its
    /// body and replaces its members' functions in `flush` with thunks.
    fn carry_out(&mut self, flush: &mut [Record], candidates: &[Candidate], merge: Merge) {
        let first = &candidates[merge.members[0]];
        let first_record = &flush[first.index];
        let first_id = first_record.id;
        // The members the body's compile does not verify.
        for &c in &merge.members[1..] {
            let record = &flush[candidates[c].index];
            if let Err(e) = self.verify_uncompiled(&record.func, None) {
                log::debug!(
                    "{} ({}): not merged with similar functions, fails to verify: {e}",
                    self.function_name(record.id),
                    record.id
                );
                return;
            }
        }
        let derived = &merge.plan.derived;
        let ctrl_plane = first_record.control.clone();
        let Some(body) = self.define_body(
            first_id,
            &first_record.func,
            &first.shape,
            derived,
            ctrl_plane,
        ) else {
            return;
        };
        for (m, &c) in merge.members.iter().enumerate() {
            let record = &mut flush[candidates[c].index];
            let thunk = self.thunk(&record.func, &body, similar::thunk_values(derived, m));
            let code = record.replace(thunk);
            self.discard_precompiled(record.id, code);
            log::debug!(
                "{} ({}): a thunk for the merged body {} (member {m} of {}, {} parameters)",
                self.function_name(record.id),
                record.id,
                body.id,
                merge.members.len(),
                derived.params.len()
            );
        }
        self.stats.count_similar_group(merge.members.len());
    }

    /// Builds the merged body of `first` (the function of `first_id`,
    /// whose shape is `shape`) with the parameters `derived`, and defines
    /// it as an anonymous function of the inner module, compiled with
    /// `ctrl_plane`; `None` (logged) if it cannot be built or defined.
    fn define_body(
        &mut self,
        first_id: FuncId,
        first: &Function,
        shape: &ShapeOf,
        derived: &Derived,
        mut ctrl_plane: ControlPlane,
    ) -> Option<Body> {
        // Building it reads only `first` (a panic on a malformed function
        // the checks missed merges nothing).
        let built = catch_unwind(AssertUnwindSafe(|| {
            similar::merged_body(first, &shape.sites, derived)
        }))
        .unwrap_or_else(|_| Err("building it panicked".to_string()));
        let mut body = match built {
            Ok(body) => body,
            Err(e) => {
                log::debug!(
                    "{} ({first_id}): no merged body: {e}",
                    self.function_name(first_id)
                );
                return None;
            }
        };
        let id = match self.declare_anonymous_function(&body.signature) {
            Ok(id) => id,
            Err(e) => {
                log::debug!("similar functions: no id for a body: {e}");
                return None;
            }
        };
        body.name = UserFuncName::user(0, id.as_u32());
        let signature = body.signature.clone();
        let mut ctx = Context::for_function(body);
        // In eager mode a member is being defined, and holds the store's
        // reservation of its template until it is the body's thunk.
        let member_reservation = self.take_reservation();
        let defined = self.define_now(id, &mut ctx, &mut ctrl_plane, &mut Ahead::default(), None);
        self.restore_reservation(member_reservation);
        if let Err(e) = defined {
            log::debug!(
                "{} ({first_id}): the merged body failed, left alone: {e}",
                self.function_name(first_id)
            );
            self.define_unused_body(id, signature);
            return None;
        }
        Some(Body { id, signature })
    }

    /// Defines `id`, the declared id of a merged body that failed to
    /// compile, as a function of `signature` that traps, in the inner
    /// module only: nothing calls it, so it is neither cached, stored nor
    /// counted in [`Stats`](super::Stats), but an id jitfold declared must
    /// not stay undefined (`ObjectModule::finish` asserts that every local
    /// function is defined). Should even that fail to compile (a signature
    /// the target cannot lower), the id stays undefined, with a warning.
    fn define_unused_body(&mut self, id: FuncId, signature: Signature) {
        let mut ctx = Context::for_function(trap_of(UserFuncName::user(0, id.as_u32()), signature));
        let inner = &mut self.inner;
        let defined = catch_unwind(AssertUnwindSafe(|| inner.define_function(id, &mut ctx)))
            .unwrap_or_else(|panic| Err(compile_panic(self.function_name(id), panic)));
        match defined {
            Ok(()) => {
                self.frames.note_inner_compiled();
                let code_bytes = ctx
                    .compiled_code()
                    .map_or(0, |c| u64::from(c.code_info().total_size));
                self.ids.defined(id, State::Bytes, code_bytes);
            }
            Err(e) => log::warn!("similar functions: {id}, an unused body, stays undefined: {e}"),
        }
    }

    /// The thunk of `member` that calls `body` with `values` (see 3 in the
    /// module docs).
    fn thunk(&self, member: &Function, body: &Body, values: Vec<(Type, SiteValue)>) -> Function {
        similar::thunk_calling(
            self.inner.isa(),
            member,
            UserExternalName::new(0, body.id.as_u32()),
            &body.signature,
            &values,
            self.thunks_tail_call(),
        )
    }

    /// Whether the inner module's target compiles a thunk's tail call:
    /// Cranelift 0.135.8 compiles `return_call` on x86-64 only with frame
    /// pointers kept (it asserts).
    fn thunks_tail_call(&self) -> bool {
        let isa = self.inner.isa();
        isa.triple().architecture != target_lexicon::Architecture::X86_64
            || isa.flags().preserve_frame_pointers()
    }
}

/// A function named `name` of `signature` whose one block traps.
fn trap_of(name: UserFuncName, signature: Signature) -> Function {
    let mut func = Function::with_name_signature(name, signature);
    let block = func.dfg.make_block();
    func.layout.append_block(block);
    for i in 0..func.signature.params.len() {
        let ty = func.signature.params[i].value_type;
        func.dfg.append_block_param(block, ty);
    }
    FuncCursor::new(&mut func)
        .at_bottom(block)
        .ins()
        .trap(TrapCode::unwrap_user(1));
    func
}

/// Eager mode: what was seen of each shape (see 6 in the module docs).
#[derive(Default)]
pub(super) struct EagerShapes {
    seen: HashMap<Shape, Seen>,
    /// Walks candidates again, for their shapes (the define path's walk is
    /// borrowed by its plan).
    walker: Fingerprinter,
    shaper: Shaper,
    /// Set while a body or thunk is defined: those are not merged again
    /// (no [`Policy::similar`](crate::plan::Policy::similar) meanwhile).
    pub(super) busy: bool,
}

/// What eager mode saw of a shape.
enum Seen {
    /// One member, compiled on its own, with these site values.
    First(Vec<ParamValue>),
    /// A body, built with these parameters from a member with these site
    /// values.
    Merged {
        body: Body,
        derived: Derived,
        built_from: Vec<ParamValue>,
    },
    /// Left alone: the cost model refused, or the body failed.
    Refused,
}

impl<M: Module> DedupModule<M> {
    /// Eager mode's [`Step::Similar`](crate::plan::Step::Similar) (planned
    /// under [`Policy::similar`](crate::plan::Policy::similar)): the thunk
    /// to define `id` (`func`; `observes_own_frame` as its walk found) as,
    /// if its shape has a body or should now get one (see 6 in the module
    /// docs); `None` to compile it.
    pub(super) fn eager_thunk(
        &mut self,
        id: FuncId,
        func: &Function,
        observes_own_frame: bool,
        ctrl_plane: &ControlPlane,
    ) -> Option<Function> {
        let options = self.options.similar?;
        if !similar::mergeable(func, observes_own_frame, options.stack) {
            return None;
        }
        let shapes = &mut self.eager_shapes;
        // A panic while shaping merges nothing (the walk and the shaper
        // reset their scratch memory on every use).
        let shaped = catch_unwind(AssertUnwindSafe(|| {
            let walk = shapes.walker.walk(func);
            let shape = shapes.shaper.shape(&walk, func);
            (shape, similar::lowered(func))
        }));
        let Ok((shape, lowered)) = shaped else {
            log::debug!("{id}: shaping panicked; not merged");
            return None;
        };
        if shape.values.is_empty() {
            return None;
        }
        self.eager_shapes.busy = true;
        let thunk = self.eager_merge(id, func, shape, lowered, &options, ctrl_plane);
        self.eager_shapes.busy = false;
        thunk
    }

    /// [`DedupModule::eager_thunk`] once `func` is known to be a candidate
    /// of shape `shape`.
    fn eager_merge(
        &mut self,
        id: FuncId,
        func: &Function,
        shape: ShapeOf,
        lowered: similar::Lowered,
        options: &SimilarOptions,
        ctrl_plane: &ControlPlane,
    ) -> Option<Function> {
        let seen = self.eager_shapes.seen.get(&shape.shape);
        let first = match seen {
            None => {
                let ShapeOf { shape, values, .. } = shape;
                self.eager_shapes.seen.insert(shape, Seen::First(values));
                return None;
            }
            Some(Seen::Refused) => return None,
            // A body bound to a host symbol the module may still define
            // takes no more members (see `retired.rs`).
            Some(Seen::Merged { body, .. }) if self.retired.runs_retired(body.id) => return None,
            Some(Seen::Merged {
                body,
                derived,
                built_from,
            }) => {
                let values = similar::values_for(derived, built_from, &shape.values)?;
                let body = body.clone();
                // Its own code is never compiled: it is verified as code
                // that is not compiled always is.
                self.verify_uncompiled(func, None).ok()?;
                self.stats.similar_merged += 1;
                return Some(self.thunk(func, &body, values));
            }
            Some(Seen::First(first)) => first,
        };
        // The second member: a body for it and the members to come, if a
        // group of two such members pays.
        let bytes = options.model.function_bytes(lowered);
        let plan = similar::plan_group(
            &func.signature,
            func.stack_limit.is_some(),
            &[first, &shape.values],
            &[bytes, bytes],
            options,
        )?;
        let fits = plan.decision == Decision::Merge;
        let derived = plan.derived;
        // (Verified, as above; the shape is left alone if it fails.)
        let body = if fits && self.verify_uncompiled(func, None).is_ok() {
            self.define_body(id, func, &shape, &derived, ctrl_plane.clone())
        } else {
            None
        };
        let ShapeOf { shape, values, .. } = shape;
        let Some(body) = body else {
            self.eager_shapes.seen.insert(shape, Seen::Refused);
            return None;
        };
        let thunk = self.thunk(func, &body, similar::thunk_values(&derived, 1));
        self.stats.count_similar_group(1);
        let merged = Seen::Merged {
            body,
            derived,
            built_from: values,
        };
        self.eager_shapes.seen.insert(shape, merged);
        Some(thunk)
    }

    /// Defines `id` as `thunk` (from [`DedupModule::eager_thunk`]) in
    /// `ctx`: as any function, but not merged again.
    pub(super) fn define_eager_thunk(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        thunk: Function,
        ctrl_plane: &mut ControlPlane,
    ) -> cranelift_module::ModuleResult<()> {
        log::debug!(
            "{} ({id}): a thunk of a merged body (eager)",
            self.function_name(id)
        );
        ctx.func = thunk;
        // The thunk passes the callees and addresses its function names.
        // A function eager mode left to a flush is kept as it was walked
        // (`Role::Kept`), naming duplicates defined since as the user
        // wrote it: the thunk names them as any eager define does (see
        // `forward.rs`), so that an address it passes is the one the
        // module gives (a duplicate that shares its canonical function's
        // address keeps sharing it). For any other function, already
        // rewritten when defined, this rewrites nothing.
        self.canonicalize_references(&mut ctx.func);
        self.eager_shapes.busy = true;
        let defined = self.define_now(id, ctx, ctrl_plane, &mut Ahead::default(), None);
        self.eager_shapes.busy = false;
        defined
    }
}

/// A merged body defined in the inner module.
#[derive(Clone)]
struct Body {
    /// Its anonymous id.
    id: FuncId,
    signature: Signature,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fingerprinter;

    /// `(i64) -> i64`: `v0 + a`, times `b`, shifted left by `shift`, then
    /// `pad` more instructions without constants.
    fn text(a: i64, b: i64, shift: i64, pad: usize) -> String {
        let mut lines = String::new();
        let mut prev = "v5".to_string();
        for i in 0..pad {
            lines.push_str(&format!("v{} = iadd {prev}, v0\n", 100 + i));
            prev = format!("v{}", 100 + i);
        }
        format!(
            "function %f(i64) -> i64 system_v {{
             block0(v0: i64):
                 v1 = iconst.i64 {a}
                 v2 = iadd v0, v1
                 v3 = iconst.i64 {b}
                 v4 = imul v2, v3
                 v6 = iconst.i64 {shift}
                 v5 = ishl v4, v6
                 {lines}
                 return {prev}
             }}"
        )
    }

    /// The pending functions of `texts` (ids in order) and their
    /// candidates.
    fn candidates(texts: &[String]) -> (Vec<(FuncId, Function)>, Vec<Candidate>) {
        let mut walker = Fingerprinter::new();
        let mut shaper = Shaper::new();
        let mut pending = Vec::new();
        let mut candidates = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            let func = cranelift_reader::parse_functions(t).unwrap().remove(0);
            let walk = walker.walk(&func);
            let lowered = similar::lowered(&func);
            let shape = shaper.shape(&walk, &func);
            candidates.push(Candidate {
                index: i,
                shape,
                lowered,
            });
            pending.push((FuncId::from_u32(i as u32), func));
        }
        (pending, candidates)
    }

    /// The signatures of `pending`, by index, and whether each checks a
    /// stack limit.
    fn signatures(pending: &[(FuncId, Function)]) -> Vec<(&Signature, bool)> {
        pending
            .iter()
            .map(|(_, f)| (&f.signature, f.stack_limit.is_some()))
            .collect()
    }

    fn members(merges: &[Merge]) -> Vec<Vec<usize>> {
        merges.iter().map(|m| m.members.clone()).collect()
    }

    #[test]
    fn groups_of_one_shape_that_pay_are_merged() {
        let options = SimilarOptions::default();
        // f1 shifts by another amount: another shape.
        let texts = [
            text(1, 2, 3, 30),
            text(5, 6, 4, 30),
            text(7, 8, 3, 30),
            text(9, 2, 3, 30),
        ];
        let (pending, c) = candidates(&texts);
        let merges = plan_merges(&c, &signatures(&pending), &options);
        assert_eq!(members(&merges), [vec![0, 2, 3]]);
        assert_eq!(merges[0].plan.derived.params.len(), 2);
        assert_eq!(merges[0].plan.decision, Decision::Merge);
        // The same functions without the padding do not pay.
        let texts = [text(1, 2, 3, 0), text(7, 8, 3, 0)];
        let (pending, c) = candidates(&texts);
        assert!(plan_merges(&c, &signatures(&pending), &options).is_empty());
    }

    #[test]
    fn groups_are_split_to_fit_the_parameter_limit() {
        let options = SimilarOptions {
            max_params: 1,
            ..SimilarOptions::default()
        };
        // f0 and f2 differ in one constant, f1 from both in two.
        let texts = [text(1, 2, 3, 30), text(5, 6, 3, 30), text(1, 9, 3, 30)];
        let (pending, c) = candidates(&texts);
        assert_eq!(
            members(&plan_merges(&c, &signatures(&pending), &options)),
            [vec![0, 2]]
        );
    }
}
