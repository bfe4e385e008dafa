//! Late merges in eager mode: when a function turns out to be a duplicate
//! after its callers were compiled, the callers' classes learn the key they
//! would have had had their calls named the canonical function, so that
//! later definitions equal to them hit the cache (LLVM's MergeFunctions
//! re-analyses callers in the same spirit).
//!
//! # What this module guarantees
//!
//! 1. A class gets an extra key only if that key is exactly what the walk
//!    gives the class's function with one callee renamed to its canonical
//!    function ([`Template::with_names`]): same template, the callee's
//!    slot changed, every other slot unchanged. Only callees named by calls
//!    alone are renamed, never a name whose address the function takes, and
//!    never when the canonical name already has a slot of its own (the
//!    rename would change the slots).
//! 2. When the extra key already belongs to another compiled class, the two
//!    compiled functions are the same function. Neither id's entry point
//!    changes (code and pointers handed out stay valid and keep their
//!    identity); from then on, calls to the first that are compiled are
//!    made to the second, and the first's callers are re-keyed in turn.
//! 3. It terminates: each step adds a cache key or a call alias that did not
//!    exist, and a call alias is never added that would lead back to its
//!    own source.

use super::DedupModule;
use crate::cache::ClassId;
use crate::fingerprint::{Fingerprint, SymbolName, Template};
use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::UserExternalName;
use cranelift_module::{FuncId, Module};
use hashbrown::HashMap;

/// What re-keying a class needs: its template and names.
#[derive(Clone)]
pub(super) struct ClassNames {
    template: Template,
    names: Vec<SymbolName>,
    taken: Vec<bool>,
}

impl ClassNames {
    /// The names of a function just fingerprinted, if it calls any local
    /// function (otherwise nothing can ever re-key it).
    pub(super) fn of(fp: &Fingerprint, names: &[SymbolName], taken: &[bool]) -> Option<Self> {
        let calls_local = names
            .iter()
            .zip(taken)
            .any(|(n, &t)| !t && matches!(n, SymbolName::User(u) if u.namespace == 0));
        calls_local.then(|| Self {
            template: fp.to_template(),
            names: names.to_vec(),
            taken: taken.to_vec(),
        })
    }
}

/// Classes by the local functions they call, and call aliases.
#[derive(Default)]
pub(super) struct Joins {
    names: SecondaryMap<ClassId, Option<ClassNames>>,
    callers: HashMap<FuncId, Vec<ClassId>>,
    call_alias: HashMap<FuncId, FuncId>,
}

fn function_name(id: FuncId) -> SymbolName {
    SymbolName::User(UserExternalName::new(0, id.as_u32()))
}

impl Joins {
    /// Records the names of a new class.
    pub(super) fn record(&mut self, class: ClassId, names: ClassNames) {
        for (name, &taken) in names.names.iter().zip(&names.taken) {
            if let SymbolName::User(u) = name
                && u.namespace == 0
                && !taken
            {
                self.callers
                    .entry(FuncId::from_u32(u.index))
                    .or_default()
                    .push(class);
            }
        }
        self.names[class] = Some(names);
    }

    /// The function calls to `id` are made to instead, if any.
    pub(super) fn call_target(&self, id: FuncId) -> Option<FuncId> {
        let mut target = *self.call_alias.get(&id)?;
        // Aliases never form a cycle (3 above); the bound is a safeguard.
        for _ in 0..self.call_alias.len() {
            match self.call_alias.get(&target) {
                Some(&next) => target = next,
                None => break,
            }
        }
        Some(target)
    }
}

impl<M: Module> DedupModule<M> {
    /// `from` now runs the code of `to`: re-keys the classes that call
    /// `from` (see the module docs).
    pub(super) fn join_callers(&mut self, from: FuncId, to: FuncId) {
        let mut work = vec![(from, to)];
        while let Some((old, new)) = work.pop() {
            let Some(classes) = self.joins.callers.remove(&old) else {
                continue;
            };
            let (old_name, new_name) = (function_name(old), function_name(new));
            for class in classes {
                let Some(names) = &self.joins.names[class] else {
                    continue;
                };
                let Some(slot) = names.names.iter().position(|n| *n == old_name) else {
                    continue;
                };
                if names.taken[slot] || names.names.contains(&new_name) {
                    continue;
                }
                let mut renamed = names.names.clone();
                renamed[slot] = new_name.clone();
                let key = names.template.with_names(&renamed);
                match self.compiled.class_of(&key) {
                    None => {
                        self.compiled.add_alias(key, class);
                        if let Some(names) = &mut self.joins.names[class] {
                            names.names = renamed;
                        }
                        self.joins.callers.entry(new).or_default().push(class);
                        self.stats.joined += 1;
                    }
                    Some(other) if other != class => {
                        let this = self.canonical_of(class);
                        let that = self.canonical_of(other);
                        let that = self.joins.call_target(that).unwrap_or(that);
                        if this != that && !self.joins.call_alias.contains_key(&this) {
                            log::debug!(
                                "{this} and {that} found equal after both were compiled: \
                                 calls to {this} go to {that} from now on"
                            );
                            self.joins.call_alias.insert(this, that);
                            self.stats.joined += 1;
                            work.push((this, that));
                        }
                    }
                    Some(_) => {}
                }
            }
        }
    }
}
