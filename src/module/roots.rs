//! In a batch flush, what planned duplicates run (their *roots*) is defined
//! before anything that counts on it.
//!
//! Planning (`batch.rs`) rewrites references to a planned duplicate into
//! references to its root before the root is compiled. Were a function
//! defined with such a reference and the root then failed, the reference
//! would bind to whatever the user later defines under the root's id,
//! however the duplicate is defined.
//!
//! # What this module guarantees
//!
//! 1. The roots are defined first, in an order where each comes after the
//!    roots named by its references that planning rewrote (definition
//!    order among those that are ready); where such references form a
//!    cycle, a root on the cycle goes first.
//! 2. If a root fails, nothing more is defined in that pass: every
//!    pending function not defined yet is put back as it was before the
//!    flush first rewrote it ([`Batch::originals`](super::batch::Batch),
//!    kept by [`DedupModule::canonicalize_pending`]), with its walk and any
//!    code compiled for it on other threads dropped; planned duplicates
//!    are pending again; the failed root's duplicates are left alone
//!    (planned neither as duplicates nor as roots; each is defined on its
//!    own); and the flush plans again. Each retry leaves one more function
//!    undefined, so the flush ends.
//! 3. Similar merging (`similar.rs`) leaves out every function with a
//!    reference rewritten to a function not defined yet: a merged body is
//!    defined before the roots, and a thunk passes its callees' addresses.
//!
//! So a function is never defined with a reference rewritten to a root
//! that fails, except that in a cycle of rewritten references between
//! roots the root that goes first is defined before the others.

use super::DedupModule;
use super::batch::{Failures, KnownWalks};
use super::ids::State;
use super::parallel::Precompiled;
use cranelift_codegen::ir::Function;
use cranelift_module::{FuncId, Module};
use hashbrown::{HashMap, HashSet};
use std::collections::BTreeSet;

impl<M: Module> DedupModule<M> {
    /// Defines the roots of this flush's planned duplicates (see 1 and 2
    /// above). Returns `false` if one failed: the plan is then undone, to
    /// be made again.
    pub(super) fn define_roots(
        &mut self,
        pending: &mut [(FuncId, Function)],
        walks: &mut KnownWalks,
        precompiled: &mut [Option<Precompiled>],
        failures: &mut Failures,
    ) -> bool {
        let index_of: HashMap<FuncId, usize> = pending
            .iter()
            .enumerate()
            .map(|(i, (id, _))| (*id, i))
            .collect();
        let mut roots = BTreeSet::new();
        for (id, _) in pending.iter() {
            if let State::Duplicate { canonical } = self.ids.state(*id) {
                let root = self.ids.root_of(canonical);
                if let Some(&i) = index_of.get(&root)
                    && self.ids.state(root) == State::Pending
                {
                    roots.insert(i);
                }
            }
        }
        let named: HashMap<usize, Vec<usize>> = roots
            .iter()
            .map(|&i| {
                let (id, func) = &pending[i];
                let names = rewritten_names(self.batch.originals.get(id), func);
                let mut named: Vec<usize> = names
                    .filter_map(|id| index_of.get(&id).copied())
                    .filter(|j| *j != i && roots.contains(j))
                    .collect();
                named.sort_unstable();
                named.dedup();
                (i, named)
            })
            .collect();
        for i in definition_order(&roots, &named) {
            let (id, func) = &mut pending[i];
            let code = precompiled.get_mut(i).and_then(Option::take);
            self.define_own(*id, func, code, walks[i].take(), failures);
            if self.ids.state(*id) == State::Undefined {
                self.after_failed_root(pending, walks, precompiled);
                return false;
            }
        }
        true
    }

    /// What follows a root's failure (see 2 above).
    fn after_failed_root(
        &mut self,
        pending: &mut [(FuncId, Function)],
        walks: &mut KnownWalks,
        precompiled: &mut [Option<Precompiled>],
    ) {
        let mut alone = Vec::new();
        for (id, _) in pending.iter() {
            if let State::Duplicate { canonical } = self.ids.state(*id)
                && self.ids.state(self.ids.root_of(canonical)) == State::Undefined
            {
                alone.push(*id);
            }
        }
        log::debug!(
            "batch flush: a function planned duplicates run failed; {} left alone, planning again",
            alone.len()
        );
        self.batch.alone.extend(alone);
        self.undo_plan(pending, walks, precompiled);
    }

    /// Undoes this flush's plan for every pending function not defined
    /// yet: planned duplicates are pending again, functions this flush
    /// rewrote are as they were before (their walks dropped), and code
    /// compiled on other threads for any of them is dropped.
    pub(super) fn undo_plan(
        &mut self,
        pending: &mut [(FuncId, Function)],
        walks: &mut KnownWalks,
        precompiled: &mut [Option<Precompiled>],
    ) {
        for (i, (id, func)) in pending.iter_mut().enumerate() {
            match self.ids.state(*id) {
                State::Duplicate { .. } => self.ids.plan(*id, State::Pending),
                State::Pending => {}
                State::Undefined | State::Compiled(_) | State::Bytes => continue,
            }
            if let Some(original) = self.batch.originals.remove(id) {
                *func = original;
                walks[i] = None;
            }
            if let Some(code) = precompiled.get_mut(i) {
                self.discard_precompiled(*id, code.take());
            }
        }
    }

    /// [`DedupModule::canonicalize_references`] of the pending function
    /// `id` during a flush, keeping it as it was before the flush first
    /// rewrites it (see 2 above).
    pub(super) fn canonicalize_pending(&mut self, id: FuncId, func: &mut Function) -> bool {
        if !self.batch.originals.contains_key(&id) && self.rewrites_references(func) {
            self.batch.originals.insert(id, func.clone());
        }
        self.canonicalize_references(func)
    }

    /// Whether the pending function `id` (as `func` now) has a reference
    /// that this flush rewrote to a function not defined yet (see 3 above).
    pub(super) fn names_undefined_root(&self, id: FuncId, func: &Function) -> bool {
        rewritten_names(self.batch.originals.get(&id), func)
            .any(|target| !matches!(self.ids.state(target), State::Compiled(_) | State::Bytes))
    }
}

/// The functions that references of `func` name where `original` (`func`
/// before this flush rewrote it, if it did) names another.
fn rewritten_names<'a>(
    original: Option<&'a Function>,
    func: &'a Function,
) -> impl Iterator<Item = FuncId> + 'a {
    let before = original.map(|f| f.params.user_named_funcs());
    func.params
        .user_named_funcs()
        .iter()
        .filter(move |(r, name)| {
            name.namespace == 0 && before.is_some_and(|b| b.get(*r).is_some_and(|old| old != *name))
        })
        .map(|(_, name)| FuncId::from_u32(name.index))
}

/// `roots` (indices) in the order of 1 above: each after the roots in
/// `named[root]`, the smallest ready first; in a cycle, one on the cycle.
fn definition_order(roots: &BTreeSet<usize>, named: &HashMap<usize, Vec<usize>>) -> Vec<usize> {
    let mut waiting: HashMap<usize, usize> = named.iter().map(|(&i, n)| (i, n.len())).collect();
    let mut dependents: HashMap<usize, Vec<usize>> = HashMap::new();
    for (&i, n) in named {
        for &j in n {
            dependents.entry(j).or_default().push(i);
        }
    }
    let mut ready: BTreeSet<usize> = roots.iter().copied().filter(|i| waiting[i] == 0).collect();
    let mut left = roots.clone();
    let mut order = Vec::with_capacity(roots.len());
    while let Some(&first) = left.first() {
        let next = match ready.pop_first() {
            Some(i) => i,
            // Every root left names one left: follow such names from the
            // first until one repeats, which is on a cycle.
            None => {
                let mut seen = HashSet::new();
                let mut at = first;
                while seen.insert(at) {
                    at = *named[&at]
                        .iter()
                        .find(|j| left.contains(*j))
                        .expect("a root that is not ready names one left");
                }
                at
            }
        };
        left.remove(&next);
        order.push(next);
        for d in dependents.get(&next).into_iter().flatten() {
            let w = waiting.get_mut(d).expect("a root");
            *w -= 1;
            if *w == 0 && left.contains(d) {
                ready.insert(*d);
            }
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(roots: &[usize], edges: &[(usize, usize)]) -> Vec<usize> {
        let roots: BTreeSet<usize> = roots.iter().copied().collect();
        let mut named: HashMap<usize, Vec<usize>> = roots.iter().map(|&i| (i, vec![])).collect();
        for &(from, to) in edges {
            named.get_mut(&from).unwrap().push(to);
        }
        definition_order(&roots, &named)
    }

    #[test]
    fn roots_come_after_the_roots_they_name_and_otherwise_in_definition_order() {
        assert_eq!(order(&[1, 4, 7], &[]), [1, 4, 7]);
        assert_eq!(order(&[1, 4, 7], &[(1, 7)]), [4, 7, 1]);
        // A chain named callers first.
        assert_eq!(
            order(&[1, 2, 3, 4], &[(1, 2), (2, 3), (3, 4)]),
            [4, 3, 2, 1]
        );
    }

    #[test]
    fn in_a_cycle_a_root_on_the_cycle_goes_first() {
        // 2 names the cycle 5 <-> 7 but is not on it.
        let got = order(&[2, 5, 7], &[(2, 5), (5, 7), (7, 5)]);
        assert_eq!(got, [5, 2, 7]);
        // A cycle through every root: the first goes first.
        assert_eq!(order(&[1, 2, 3], &[(1, 2), (2, 3), (3, 1)]), [1, 3, 2]);
    }
}
