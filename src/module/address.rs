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
use crate::fingerprint::{SymbolName, declared_user_names};
use crate::plan::Walk;
use cranelift_codegen::ir::{self, Function, InstructionData, UserExternalNameRef};
use cranelift_module::{FuncId, Module, ModuleRelocTarget};
use hashbrown::{HashMap, HashSet};

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

/// The walk of `func` once each of `rewrites` (see
/// [`DedupModule::reference_rewrites`]) is made in it, from `walk`, its
/// walk as it is now: `walk` with the names of the rewritten slots
/// replaced, where that is what walking the rewritten function gives;
/// `None` where it may not be (the caller walks it again).
///
/// A key numbers names by slot, in order of first use, and holds them
/// after its template ([`crate::Template::with_names`]), so renaming names
/// changes nothing else as long as every slot keeps one name and no two
/// slots get one: every entry a declaration refers to that names a
/// rewritten function must be rewritten, to one function, and no two
/// slots may then name one function. Nothing else a walk finds reads
/// names (which address is used as data is read per slot). A key made
/// unique ([`crate::Walk::key_is_unique`]) is left to a new walk.
pub(super) fn renamed_walk(
    walk: &Walk,
    func: &Function,
    rewrites: &[(UserExternalNameRef, FuncId)],
) -> Option<Walk> {
    if walk.key_is_unique {
        return None;
    }
    let table = func.params.user_named_funcs();
    // Each function renamed, by index, to the one it is renamed to.
    let mut renamed: HashMap<u32, u32> = HashMap::with_capacity(rewrites.len());
    for &(r, to) in rewrites {
        let from = table.get(r)?;
        if from.namespace != 0 {
            return None;
        }
        if *renamed.entry(from.index).or_insert(to.as_u32()) != to.as_u32() {
            return None;
        }
    }
    let rewritten: HashSet<UserExternalNameRef> = rewrites.iter().map(|&(r, _)| r).collect();
    let left_behind = declared_user_names(func).any(|(r, name)| {
        name.namespace == 0 && renamed.contains_key(&name.index) && !rewritten.contains(&r)
    });
    if left_behind {
        return None;
    }
    let names: Vec<SymbolName> = walk
        .names
        .iter()
        .map(|name| match name {
            SymbolName::User(user) if user.namespace == 0 => renamed.get(&user.index).map_or_else(
                || name.clone(),
                |&to| SymbolName::User(ir::UserExternalName::new(0, to)),
            ),
            SymbolName::User(_) | SymbolName::TestCase(_) => name.clone(),
        })
        .collect();
    let distinct = {
        let mut seen = HashSet::with_capacity(names.len());
        names.iter().all(|name| seen.insert(name))
    };
    if !distinct {
        return None;
    }
    let Walk {
        fingerprint,
        names: _,
        address_taken,
        observes_own_frame,
        key_is_unique,
        named_values_exist,
        alias_chains_short,
    } = walk;
    Some(Walk {
        fingerprint: fingerprint.to_template().with_names(&names),
        names,
        address_taken: address_taken.clone(),
        observes_own_frame: *observes_own_frame,
        key_is_unique: *key_is_unique,
        named_values_exist: *named_values_exist,
        alias_chains_short: *alias_chains_short,
    })
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

#[cfg(test)]
mod tests {
    use super::{renamed_walk, rewrite_references};
    use crate::Fingerprinter;
    use crate::plan::Walk;
    use cranelift_codegen::ir::{Function, UserExternalName, UserExternalNameRef};
    use cranelift_module::FuncId;

    /// `u0:0(i64) -> i64` in the `tail` convention, declaring `u0:1`,
    /// `u0:2` and `u0:3` as `fn0` to `fn2`, with the blocks `body`.
    fn parsed(body: &str) -> Function {
        let text = format!(
            "function u0:0(i64) -> i64 tail {{
                sig0 = (i64) -> i64 tail
                fn0 = u0:1 sig0
                fn1 = u0:2 sig0
                fn2 = u0:3 sig0
            {body}
            }}"
        );
        cranelift_reader::parse_functions(&text).unwrap().remove(0)
    }

    /// `u0:0` calling `u0:1` and `u0:2` in its entry block, and `u0:3` in a
    /// block no branch reaches.
    fn caller() -> Function {
        parsed(
            "block0(v0: i64):
                v1 = call fn0(v0)
                v2 = call fn1(v1)
                return v2
            block1:
                v3 = iconst.i64 0
                v4 = call fn2(v3)
                return v4",
        )
    }

    /// The entry of `func`'s name table that names `u0:index`.
    fn entry(func: &Function, index: u32) -> UserExternalNameRef {
        let name = UserExternalName::new(0, index);
        let (r, _) = func
            .params
            .user_named_funcs()
            .iter()
            .find(|(_, n)| **n == name)
            .unwrap();
        r
    }

    /// What `renamed_walk` gives for `rewrites` of `func`, and the walk of
    /// the rewritten function.
    fn renamed_and_walked(
        func: &Function,
        rewrites: &[(UserExternalNameRef, FuncId)],
    ) -> (Option<Walk>, Walk) {
        let mut walker = Fingerprinter::new();
        let walk = Walk::of(&mut walker, func);
        let renamed = renamed_walk(&walk, func, rewrites);
        let mut rewritten = func.clone();
        rewrite_references(&mut rewritten, rewrites);
        (renamed, Walk::of(&mut walker, &rewritten))
    }

    #[test]
    fn a_callee_renamed_to_a_function_named_nowhere_else_renames_its_slot() {
        let func = caller();
        let rewrites = [(entry(&func, 1), FuncId::from_u32(7))];
        let (renamed, walked) = renamed_and_walked(&func, &rewrites);
        let renamed = renamed.expect("renamed");
        assert!(renamed.finds_as(&walked));
        assert_eq!(
            renamed.names[0],
            crate::SymbolName::User(UserExternalName::new(0, 7))
        );
        // Names only unreachable code uses are in no slot; renaming one
        // changes nothing, as a new walk shows.
        let rewrites = [(entry(&func, 3), FuncId::from_u32(1))];
        let (renamed, walked) = renamed_and_walked(&func, &rewrites);
        assert!(renamed.expect("renamed").finds_as(&walked));
    }

    #[test]
    fn slots_that_would_name_one_function_are_walked_again() {
        let func = caller();
        // `u0:1` becomes `u0:2`, which the other slot names: the slots
        // merge, and the template changes.
        let rewrites = [(entry(&func, 1), FuncId::from_u32(2))];
        let (renamed, walked) = renamed_and_walked(&func, &rewrites);
        assert!(renamed.is_none());
        assert_eq!(walked.names.len(), 1);
        // Two callees renamed to one function: likewise.
        let rewrites = [
            (entry(&func, 1), FuncId::from_u32(7)),
            (entry(&func, 2), FuncId::from_u32(7)),
        ];
        assert!(renamed_and_walked(&func, &rewrites).0.is_none());
    }

    #[test]
    fn a_name_left_in_an_entry_not_rewritten_is_walked_again() {
        let mut func = parsed(
            "block0(v0: i64):
                v1 = call fn0(v0)
                v2 = call fn1(v1)
                v3 = call fn2(v2)
                return v3",
        );
        // A second entry naming `u0:1` (as an embedder renaming a callee
        // in place makes), which the rewrite leaves as it is.
        let second = entry(&func, 3);
        let first = entry(&func, 1);
        func.params
            .reset_user_func_name(second, UserExternalName::new(0, 1));
        let rewrites = [(first, FuncId::from_u32(7))];
        let (renamed, walked) = renamed_and_walked(&func, &rewrites);
        assert!(renamed.is_none());
        // The slot splits in two: a renamed walk would have been wrong.
        assert_eq!(walked.names.len(), 3);
    }
}
