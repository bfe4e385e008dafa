//! Function identity: one address per function id (item 6 of the
//! [module docs](super)), and the reference rewriting that keeps it.
//!
//! # What this module guarantees
//!
//! 1. [`DedupModule::address_of`] is the one place that says whose entry
//!    point an id's address is; `get_finalized_function`, `get_address`,
//!    data relocations, raw-byte relocations and object symbols all follow
//!    it.
//! 2. A duplicate shares its canonical function's address only without
//!    distinct addresses, and only if its own address was not compiled
//!    into anything before it was defined: the fingerprint walk reports
//!    which names a function uses as data (`func_addr`, symbol global
//!    values), and data objects and raw bytes report their relocations;
//!    each such name is marked before its function is defined.
//! 3. Once a duplicate shares, every reference made later to it as data is
//!    rewritten to the canonical function before it is compiled or
//!    defined, so nothing marks it afterwards: whether it shares never
//!    changes once it is defined.
//! 4. Calls to a duplicate are always rewritten to the canonical function
//!    (a call does not observe the callee's address); calls to a function
//!    found equal to another after both were compiled go to the other.

use super::DedupModule;
use super::ids::State;
use crate::fingerprint::declared_user_names;
use cranelift_codegen::ir::{self, Function, InstructionData, UserExternalNameRef};
use cranelift_module::{FuncId, Module, ModuleRelocTarget};
use hashbrown::HashSet;

impl<M: Module> DedupModule<M> {
    /// The function whose entry point is `id`'s address (see 6 in the
    /// [module docs](super)): `id` itself, unless it is a duplicate that
    /// shares its canonical function's address. `None` if `id` is not
    /// defined (or still pending).
    pub fn address_of(&self, id: FuncId) -> Option<FuncId> {
        self.canonical(id).map(|_| self.address_id(id))
    }

    /// The function whose entry point is `id`'s address: the one that
    /// `get_finalized_function`, `get_address` and references compiled
    /// into code or data resolve to.
    pub(super) fn address_id(&self, id: FuncId) -> FuncId {
        match self.ids.state(id) {
            State::Duplicate { .. } | State::Planned { .. } if self.shares_address(id) => {
                self.ids.root_of(id)
            }
            _ => id,
        }
    }

    /// Whether `id`, a duplicate (defined or planned), shares its canonical
    /// function's address: only without distinct addresses, and only if its
    /// own address was not compiled into anything. Once a duplicate is
    /// defined this never changes, since references to a sharing duplicate
    /// are rewritten before anything is compiled or defined with them.
    pub(super) fn shares_address(&self, id: FuncId) -> bool {
        !self.options.distinct_addresses && !self.address_taken[id]
    }

    /// Notes that the function `target` names (if a local function) has
    /// its own address compiled into something.
    pub(super) fn note_address_taken(&mut self, target: &ModuleRelocTarget) {
        if let ModuleRelocTarget::User {
            namespace: 0,
            index,
        } = *target
        {
            self.address_taken[FuncId::from_u32(index)] = true;
        }
    }

    /// Notes the functions whose addresses the function walked as `walk`
    /// uses as data.
    pub(super) fn note_addresses_taken(&mut self, walk: &crate::plan::WalkRef<'_>) {
        for (name, &taken) in walk.names.iter().zip(walk.address_taken) {
            if let (true, crate::fingerprint::SymbolName::User(u)) = (taken, name)
                && u.namespace == 0
            {
                self.address_taken[FuncId::from_u32(u.index)] = true;
            }
        }
    }

    /// Notes the functions whose addresses `func` uses as data anywhere in
    /// its layout (for a function not walked).
    pub(super) fn note_addresses_used_as_data(&mut self, func: &Function) {
        for id in functions_used_as_data(func) {
            self.mark_address_taken(id);
        }
    }

    /// Marks `id` as having its own address compiled into something (see
    /// `roots.rs`).
    pub(super) fn mark_address_taken(&mut self, id: FuncId) {
        self.address_taken[id] = true;
    }

    /// The canonical function's name when `target` names a duplicate that
    /// shares its address, else `None`.
    pub(super) fn shared_target(&self, target: &ModuleRelocTarget) -> Option<ModuleRelocTarget> {
        if let ModuleRelocTarget::User {
            namespace: 0,
            index,
        } = *target
        {
            let id = self.address_id(FuncId::from_u32(index));
            return (id.as_u32() != index).then(|| ModuleRelocTarget::user(0, id.as_u32()));
        }
        None
    }

    /// What a reference to `id` becomes (see
    /// [`DedupModule::canonicalize_references`]); `as_data` when the name is
    /// used as data.
    fn reference_target(&self, id: FuncId, as_data: bool) -> FuncId {
        let id = match self.ids.state(id) {
            State::Duplicate { canonical } | State::Planned { canonical }
                if !as_data || self.shares_address(id) =>
            {
                canonical
            }
            _ => id,
        };
        // Functions found equal after both were compiled: calls only,
        // never addresses (their entry points differ).
        // Nor to or from code bound to a host symbol the module may still
        // define (see `retired.rs`).
        match self.joins.call_target(id) {
            Some(target)
                if !as_data
                    && !self.retired.runs_retired(id)
                    && !self.retired.runs_retired(target) =>
            {
                target
            }
            _ => id,
        }
    }

    /// Retires `class` (see `retired.rs`).
    pub(super) fn retire(&mut self, class: crate::cache::ClassId) {
        let canonical = self.canonical_of(class);
        log::debug!(
            "{}: its code calls a host symbol the module may still define; \
             no later function runs it",
            self.function_name(canonical)
        );
        self.retired.retire(class, canonical);
    }

    /// The rewrites [`DedupModule::canonicalize_references`] would make
    /// of `func` now: each reference to rewrite, with the function it is
    /// to name, each once. A reference is an entry of the function's name
    /// table that a declaration refers to; an entry none does is left as
    /// it is (it names nothing the function does).
    pub(super) fn reference_rewrites(&self, func: &Function) -> Vec<(UserExternalNameRef, FuncId)> {
        // A name used as data is rewritten only if a call of it would be:
        // the calls first, and the names used as data, which take a look
        // at every instruction, only if a call is rewritten. The calls are
        // looked for in the name table alone first (every declared name is
        // in it; in a batch flush, of a function recorded long before, one
        // table is one cache miss where the declarations are several).
        // The table may hold entries no declaration refers to, of any
        // index: `u32::MAX` is no `FuncId` (`from_u32` asserts as much), and
        // is no function's name either.
        let call_rewritten = |name: &ir::UserExternalName| {
            name.namespace == 0 && name.index != u32::MAX && {
                let id = FuncId::from_u32(name.index);
                self.reference_target(id, false) != id
            }
        };
        if !func.params.user_named_funcs().values().any(&call_rewritten) {
            return Vec::new();
        }
        let local = || declared_user_names(func).filter(|(_, name)| name.namespace == 0);
        if !local().any(|(_, name)| call_rewritten(name)) {
            return Vec::new();
        }
        let used_as_data = names_used_as_data(func);
        let mut rewrites: Vec<(UserExternalNameRef, FuncId)> = local()
            .filter_map(|(r, name)| {
                let id =
                    self.reference_target(FuncId::from_u32(name.index), used_as_data.contains(&r));
                (id.as_u32() != name.index).then_some((r, id))
            })
            .collect();
        rewrites.sort_unstable();
        rewrites.dedup();
        rewrites
    }

    /// Rewrites `func`'s references to known duplicates into references to
    /// their canonical functions: calls always, names used as data only
    /// where the duplicate shares its canonical function's address (see
    /// [`DedupModule::reference_rewrites`]). Returns whether it rewrote
    /// any.
    pub(super) fn canonicalize_references(&self, func: &mut Function) -> bool {
        let rewrites = self.reference_rewrites(func);
        rewrite_references(func, &rewrites);
        !rewrites.is_empty()
    }
}

/// Makes each of `rewrites` (see [`DedupModule::reference_rewrites`]) in
/// `func`.
pub(super) fn rewrite_references(func: &mut Function, rewrites: &[(UserExternalNameRef, FuncId)]) {
    for &(r, canonical) in rewrites {
        log::trace!(
            "{}: references to {} rewritten to {canonical}",
            func.name,
            FuncId::from_u32(func.params.user_named_funcs()[r].index)
        );
        func.params
            .reset_user_func_name(r, ir::UserExternalName::new(0, canonical.as_u32()));
    }
}

/// The local functions whose addresses `func` uses as data, anywhere in
/// its layout.
pub(super) fn functions_used_as_data(func: &Function) -> Vec<FuncId> {
    let named = func.params.user_named_funcs();
    names_used_as_data(func)
        .into_iter()
        .filter_map(|r| named.get(r))
        .filter(|name| name.namespace == 0)
        .map(|name| FuncId::from_u32(name.index))
        .collect()
}

/// The external-name references of `func` that are used as data: by
/// `func_addr` or by symbol global values.
fn names_used_as_data(func: &Function) -> HashSet<UserExternalNameRef> {
    let mut names = HashSet::new();
    let mut note = |name: &ir::ExternalName| {
        if let ir::ExternalName::User(r) = name {
            names.insert(*r);
        }
    };
    for block in func.layout.blocks() {
        for inst in func.layout.block_insts(block) {
            if let InstructionData::FuncAddr { func_ref, .. } = func.dfg.insts[inst]
                && let Some(data) = func.dfg.ext_funcs.get(func_ref)
            {
                note(&data.name);
            }
        }
    }
    for (_, gv) in func.global_values.iter() {
        if let ir::GlobalValueData::Symbol { name, .. } = gv {
            note(name);
        }
    }
    names
}
