//! In a batch flush, what planned duplicates run (their *roots*) is defined
//! before anything that counts on the plan.
//!
//! Planning (`batch.rs`) rewrites references to a planned duplicate into
//! references to its root, and plans functions as duplicates of others on
//! the strength of such rewrites and of refinement, before any root is
//! compiled. Were a function defined counting on that and a root then
//! failed, its reference would bind to whatever the user later defines
//! under the root's id, however the duplicate is defined.
//!
//! # What this module guarantees
//!
//! 1. Right after planning, every root that planning rewrote (its
//!    references to planned duplicates, or to anything: a rewrite counts on
//!    the duplicate it replaces being planned right) is put back as the
//!    user wrote it (the record's original, kept by
//!    [`DedupModule::canonicalize_pending`]; its walk and any code compiled
//!    for it dropped: `Role::AsWritten` in `flush.rs`) and rewritten no
//!    more while it is a root, so a root's code
//!    counts on nothing this flush planned (its calls of planned
//!    duplicates go through their trampolines). The roots are then
//!    defined first, in definition order.
//! 2. If a root fails (or, once every root is defined, a planned
//!    duplicate: see 7 in `batch.rs`), nothing more is defined in that
//!    pass: every
//!    pending function not defined yet is put back as it was before the
//!    flush first rewrote it, with its walk and any code compiled for it on
//!    other threads dropped; planned duplicates are pending again; the
//!    failed root's duplicates are left alone (planned neither as
//!    duplicates nor as roots; each is defined on its own); and the flush
//!    plans again (and puts the new roots back as 1 says). Each retry
//!    leaves one more function undefined, so the flush ends.
//! 3. Similar merging (`similar.rs`), which defines merged bodies before
//!    the roots, leaves out every function this flush rewrote, so that no
//!    body names a root that may yet fail (a member rewritten would be put
//!    back by 2 anyway; the body would stay, naming the failed root, which
//!    finalizing then requires), and every root put back, whose thunk
//!    would take the addresses of the planned duplicates it calls.
//! 4. Putting a root back changes no address: if it would use as data
//!    the address of a planned duplicate that planning let share its
//!    root's (and so rewrote others' references to), that duplicate is
//!    marked as having its own address (see 2 in `address.rs`), the plan
//!    is undone and made again, before anything is defined. Each round
//!    marks one more function, so this ends.
//!
//! So what is defined before every root is defined counts on no plan, and
//! what is defined after counts only on a plan whose roots are all
//! defined, and, after the duplicates, whose duplicates are too.

use super::DedupModule;
use super::address::{functions_used_as_data, renamed_walk, rewrite_references};
use super::batch::Failures;
use super::flush::{Record, Role};
use super::ids::State;
use crate::plan::Walk;
use cranelift_module::{FuncId, Module};
use hashbrown::HashMap;
use std::collections::BTreeSet;

impl<M: Module> DedupModule<M> {
    /// The planned duplicates of `flush` (not defined yet), by index in
    /// definition order, each with the function it was planned as a
    /// duplicate of.
    pub(super) fn planned_duplicates(&self, flush: &[Record]) -> Vec<(usize, FuncId)> {
        flush
            .iter()
            .enumerate()
            .filter_map(|(i, record)| match self.ids.state(record.id) {
                State::Planned { canonical } => Some((i, canonical)),
                State::Undefined
                | State::Pending
                | State::Compiled(_)
                | State::Duplicate { .. }
                | State::Bytes => None,
            })
            .collect()
    }

    /// The functions of `flush` (by index, in definition order) that its
    /// planned duplicates are to be defined as trampolines to.
    fn roots(&self, flush: &[Record]) -> BTreeSet<usize> {
        let index_of: HashMap<FuncId, usize> =
            flush.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
        self.planned_duplicates(flush)
            .into_iter()
            .map(|(_, canonical)| self.ids.root_of(canonical))
            .filter(|root| self.ids.state(*root) == State::Pending)
            .filter_map(|root| index_of.get(&root).copied())
            .collect()
    }

    /// Puts every root this flush rewrote back as the user wrote it, for
    /// the rest of the flush (see 1 above). Called after each planning,
    /// before anything is compiled for what it planned. Returns `false`,
    /// having put back nothing, if a root put back would use as data the
    /// address of a planned duplicate that planning let share its root's
    /// (see 4 above): that duplicate is marked, and the plan undone, to be
    /// made again.
    pub(super) fn write_roots_as_written(&mut self, flush: &mut [Record]) -> bool {
        let roots = self.roots(flush);
        let mut marked = false;
        for &i in &roots {
            let Some(original) = flush[i].original() else {
                continue;
            };
            for target in functions_used_as_data(original) {
                let planned = matches!(self.ids.state(target), State::Planned { .. });
                if planned && self.shares_address(target) {
                    self.mark_address_taken(target);
                    marked = true;
                }
            }
        }
        if marked {
            self.undo_plan(flush);
            return false;
        }
        for i in roots {
            let code = flush[i].put_back_as_written();
            self.discard_precompiled(flush[i].id, code);
        }
        true
    }

    /// Defines the roots of this flush's planned duplicates (see 1 and 2
    /// above), put back as the user wrote them where this flush rewrote
    /// them. Returns `false` if one failed: the plan is then undone, to be
    /// made again.
    pub(super) fn define_roots(&mut self, flush: &mut [Record], failures: &mut Failures) -> bool {
        for i in self.roots(flush) {
            let rewrite = flush[i].role() != Role::AsWritten;
            self.define_own(&mut flush[i], rewrite, failures);
            if self.ids.state(flush[i].id) == State::Undefined {
                self.after_failed_root(flush);
                return false;
            }
        }
        true
    }

    /// What follows a root's failure (see 2 above).
    fn after_failed_root(&mut self, flush: &mut [Record]) {
        let alone: Vec<usize> = self
            .planned_duplicates(flush)
            .into_iter()
            .filter(|&(_, canonical)| {
                self.ids.state(self.ids.root_of(canonical)) == State::Undefined
            })
            .map(|(i, _)| i)
            .collect();
        log::debug!(
            "batch flush: a function planned duplicates run failed; {} left alone, planning again",
            alone.len()
        );
        for i in alone {
            flush[i].leave_alone();
        }
        self.undo_plan(flush);
    }

    /// Undoes this flush's plan for every function of `flush` not defined
    /// yet: planned duplicates are pending again, functions this flush
    /// rewrote are as they were before (their walks dropped), and code
    /// compiled on other threads for any of them is dropped.
    pub(super) fn undo_plan(&mut self, flush: &mut [Record]) {
        for record in flush.iter_mut() {
            match self.ids.state(record.id) {
                State::Planned { .. } => self.ids.plan(record.id, State::Pending),
                State::Pending => {}
                State::Undefined | State::Compiled(_) | State::Duplicate { .. } | State::Bytes => {
                    continue;
                }
            }
            let code = record.undo();
            self.discard_precompiled(record.id, code);
        }
    }

    /// [`DedupModule::canonicalize_references`] of the function of
    /// `record` during a flush, keeping it as it was before the flush first
    /// rewrites it (see 2 above); nothing for a root put back as the user
    /// wrote it, nor for a function kept as eager mode walked it
    /// (`Role::Kept` in `flush.rs`). `walk`, a walk of the function as it is (taken out of the
    /// record), becomes the walk of the rewritten function where renaming
    /// its names gives that ([`renamed_walk`]), else nothing.
    pub(super) fn canonicalize_pending(
        &mut self,
        record: &mut Record,
        walk: &mut Option<Walk>,
    ) -> bool {
        if !record.rewritten_by_planning() {
            return false;
        }
        let rewrites = self.reference_rewrites(&record.func);
        if rewrites.is_empty() {
            return false;
        }
        *walk = walk
            .take()
            .and_then(|walk| renamed_walk(&walk, &record.func, &rewrites));
        record.keep_original();
        rewrite_references(&mut record.func, &rewrites);
        // Its walk, checked entry and code are of the function as it was.
        let code = record.rewritten();
        self.discard_precompiled(record.id, code);
        true
    }
}
