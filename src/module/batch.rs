//! Batch mode: the definitions recorded since the last flush are refined
//! over their call graph, grouped by fingerprint, and compiled one per
//! class; the others are defined as duplicates.
//!
//! # What this module guarantees
//!
//! 1. Before anything is compiled, functions equal over the call graph
//!    ([`crate::refine`]) are planned as duplicates of their class's first
//!    member, and references to planned duplicates are rewritten, round
//!    after round, until no new duplicate appears.
//! 2. Duplicate links may chain; each duplicate is defined as a trampoline
//!    (or alias) to the root of its chain, which is a compiled function.
//! 3. A function that fails to compile, and every duplicate planned onto
//!    it, is left undefined (and may be defined again); the others are
//!    defined, and the first error is returned.

use super::{DedupModule, State};
use crate::cache::DedupCache;
use crate::fingerprint::SymbolName;
use crate::refine::CallGraph;
use cranelift_codegen::Context;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::{self, Function};
use cranelift_module::{FuncId, Module, ModuleResult};
use std::collections::HashSet;

impl<M: Module> DedupModule<M> {
    /// Compiles the definitions recorded in batch mode: groups them by
    /// fingerprint (repeating after each round of reference rewriting, so that
    /// callers of merged functions merge too), compiles one function per
    /// group and defines the others as duplicates. Does nothing in eager mode.
    ///
    /// On an error the failed function (and its planned duplicates) are left
    /// undefined and may be defined again; the others are defined.
    pub fn flush(&mut self) -> ModuleResult<()> {
        let mut pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return Ok(());
        }
        // Without a trampoline form for this ISA every function is compiled.
        if self.machine_trampolines {
            self.plan_refined(&mut pending);
            self.plan_duplicates(&mut pending);
        }
        // Compile the first of each group, then define the duplicates that
        // were planned (`define_now` may define more duplicates itself).
        let planned: Vec<(FuncId, FuncId)> = pending
            .iter()
            .filter_map(|(id, _)| match self.functions[*id] {
                State::Duplicate { canonical } => Some((*id, canonical)),
                State::Undefined | State::Pending | State::Compiled(_) | State::Bytes => None,
            })
            .collect();
        let mut first_error = None;
        let mut failed = HashSet::new();
        for (id, func) in pending.iter_mut() {
            if self.functions[*id] != State::Pending {
                continue;
            }
            self.functions[*id] = State::Undefined;
            let mut ctx = Context::for_function(std::mem::replace(func, Function::new()));
            if let Err(e) = self.define_now(*id, &mut ctx, &mut ControlPlane::default()) {
                failed.insert(*id);
                first_error.get_or_insert(e);
            }
        }
        for (id, canonical) in planned {
            // Planning may chain duplicates (a group's first member can turn
            // out to be a duplicate in a later round); follow to the root.
            let root = self.root_of(canonical);
            self.functions[id] = State::Undefined;
            let defined = matches!(self.functions[root], State::Compiled(_) | State::Bytes);
            if defined && !failed.contains(&root) {
                match self.define_trampoline(id, root) {
                    Ok(true) => {}
                    Ok(false) => unreachable!("duplicates are planned only with trampolines"),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        // What failed (or depended on what failed) is undefined again.
        let undefined = pending
            .iter()
            .filter(|(id, _)| self.functions[*id] == State::Undefined)
            .count();
        self.stats.defined -= undefined as u64;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Refines the pending functions over their call graph (see
    /// [`crate::refine`]) and marks each function of a class with two or
    /// more members as a duplicate of the class's first member. Callees are
    /// compared by class, so recursive and mutually recursive twins merge;
    /// names used as data (addresses) are compared by value.
    fn plan_refined(&mut self, pending: &mut [(FuncId, Function)]) {
        // A node per exact class of the pending functions.
        let mut exact = DedupCache::new();
        let mut graph = CallGraph::with_capacity(pending.len());
        let mut node_of = Vec::with_capacity(pending.len());
        for (id, func) in pending.iter_mut() {
            self.canonicalize_references(func);
            let fp = self.fingerprinter.fingerprint(func);
            let node = match exact.get(&fp) {
                Some(class) => class.as_u32(),
                None => {
                    let node = graph.add_node(
                        &fp,
                        self.fingerprinter.last_names(),
                        self.fingerprinter.last_address_taken(),
                    );
                    exact.insert(fp);
                    node
                }
            };
            let own = SymbolName::User(ir::UserExternalName::new(0, id.as_u32()));
            graph.add_function(&own, node);
            node_of.push(node);
        }
        let refinement = graph.refine();
        self.stats.refine_rounds += u64::from(refinement.rounds);
        let mut first: hashbrown::HashMap<u32, FuncId> = hashbrown::HashMap::new();
        for ((id, _), &node) in pending.iter().zip(&node_of) {
            let class = refinement.class_of[node as usize];
            match first.entry(class) {
                hashbrown::hash_map::Entry::Occupied(e) => {
                    self.functions[*id] = State::Duplicate {
                        canonical: *e.get(),
                    };
                }
                hashbrown::hash_map::Entry::Vacant(e) => {
                    e.insert(*id);
                }
            }
        }
    }

    /// Marks each pending function whose fingerprint equals an earlier one's
    /// (or a compiled class's) as its duplicate; repeats, since rewriting
    /// references to new duplicates can make callers equal, until nothing
    /// changes.
    fn plan_duplicates(&mut self, pending: &mut [(FuncId, Function)]) {
        loop {
            let mut first_of: hashbrown::HashMap<crate::Fingerprint, FuncId> =
                hashbrown::HashMap::new();
            let mut changed = false;
            for (id, func) in pending.iter_mut() {
                if self.functions[*id] != State::Pending {
                    continue;
                }
                self.canonicalize_references(func);
                let fp = self.fingerprinter.fingerprint(func);
                if let Some(class) = self.cache.get(&fp) {
                    self.functions[*id] = State::Duplicate {
                        canonical: self.classes[class].canonical,
                    };
                    changed = true;
                } else if let Some(&first) = first_of.get(&fp) {
                    self.functions[*id] = State::Duplicate { canonical: first };
                    changed = true;
                } else {
                    first_of.insert(fp, *id);
                }
            }
            if !changed {
                break;
            }
        }
    }
}
