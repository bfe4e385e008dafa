//! Function and data ids: what each id of the inner module is to the
//! wrapper (its [`State`]), and what linking needs to know (code sizes,
//! references, what is finalized).
//!
//! # What this module guarantees
//!
//! 1. An id the wrapper never saw declared is [`State::Undefined`] and is
//!    not definable: [`Ids::check_definable`] gives the error Cranelift's
//!    modules give for it (an import, defined twice), and `Undeclared`
//!    where they panic (an id never declared). A definition's signature
//!    is not checked against the declaration, as `JITModule` and
//!    `ObjectModule` do not check it (cranelift-module 0.135.8 raises
//!    `IncompatibleSignature` only when a name is declared again): the
//!    signature a function was defined with is what [`Ids::signature`]
//!    gives from then on, and what every trampoline, adapter and stored
//!    entry is built for.
//! 2. Only [`Ids::defined`] makes an id defined (compiled, a duplicate or
//!    bytes), and it queues the id for the next finalization; only
//!    [`Ids::finalize`] takes the queue, marking the ids finalized.
//! 3. [`Ids::check_references_defined`] lists, by name, every local
//!    function and data object that something defined since the last
//!    finalization refers to and that is not defined: finalizing then is
//!    an error, not a panic in the JIT. What a finalization finalized was
//!    relocated then; the JIT does not look its references up again, even
//!    when a name it bound to a host symbol is declared local later.
//! 4. Duplicate links point to earlier definitions or planned ones, so
//!    [`Ids::root_of`] ends after at most as many steps as there are ids.

// Finalization is read by the JIT's methods, the list of ids by the object
// module's: without either feature, those parts are unused.
#![cfg_attr(not(all(feature = "jit", feature = "object")), allow(dead_code))]

use super::DedupError;
use cranelift_codegen::Context;
use cranelift_codegen::entity::{EntityRef, SecondaryMap};
use cranelift_codegen::ir;
use cranelift_module::{
    DataId, FuncId, Linkage, ModuleDeclarations, ModuleError, ModuleRelocTarget, ModuleResult,
};
use hashbrown::{HashMap, HashSet};

/// What a function id is to the wrapper.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum State {
    #[default]
    Undefined,
    /// Recorded in batch mode, not yet compiled.
    Pending,
    /// Compiled by the inner module, or defined from reused code or as an
    /// adapter; the first of its class.
    Compiled(crate::ClassId),
    /// A duplicate of `canonical`, defined as a trampoline to it (or an
    /// alias). Whether its address is `canonical`'s is
    /// `DedupModule::shares_address`.
    Duplicate { canonical: FuncId },
    /// During a batch flush: planned as a duplicate of `canonical`, not
    /// defined yet (see `flush.rs`); references to it are rewritten as to
    /// a duplicate.
    Planned { canonical: FuncId },
    /// Defined by the user from raw bytes, or outside the cache by jitfold
    /// (the trap that replaces a merged body that failed, `similar.rs`).
    Bytes,
}

/// The ids of the inner module, as the wrapper sees them.
#[derive(Default)]
pub(super) struct Ids {
    functions: SecondaryMap<FuncId, State>,
    /// Number of function ids declared in the inner module.
    declared_functions: usize,
    /// Number of data ids declared in the inner module.
    declared_data: usize,
    /// The size of each defined function's own code (its trampoline, for
    /// a duplicate).
    code_size: SecondaryMap<FuncId, u32>,
    /// Local functions and data objects referenced by definitions so far.
    referenced_functions: HashSet<FuncId>,
    referenced_data: HashSet<DataId>,
    defined_data: SecondaryMap<DataId, bool>,
    /// Ids defined in the inner module since the last finalization.
    unfinalized: Vec<FuncId>,
    finalized: SecondaryMap<FuncId, bool>,
    /// The signature each function was last defined (or recorded) with,
    /// where it is not the declared one (see 1 above).
    defined_signatures: HashMap<FuncId, ir::Signature>,
    /// Data objects defined since the last finalization, and those
    /// finalized.
    unfinalized_data: Vec<DataId>,
    finalized_data: SecondaryMap<DataId, bool>,
}

impl Ids {
    /// The ids of a module that declared `functions` functions and `data`
    /// data objects so far, none defined.
    pub(super) fn new(functions: usize, data: usize) -> Self {
        Self {
            declared_functions: functions,
            declared_data: data,
            ..Self::default()
        }
    }

    /// Notes that the inner module declared function `id`.
    pub(super) fn declare_function(&mut self, id: FuncId) {
        self.declared_functions = self.declared_functions.max(id.index() + 1);
    }

    /// Notes that the inner module declared data object `id`.
    pub(super) fn declare_data(&mut self, id: DataId) {
        self.declared_data = self.declared_data.max(id.index() + 1);
    }

    /// Whether function `id` was declared.
    pub(super) fn is_declared(&self, id: FuncId) -> bool {
        id.index() < self.declared_functions
    }

    /// Whether data object `id` was declared.
    pub(super) fn is_declared_data(&self, id: DataId) -> bool {
        id.index() < self.declared_data
    }

    /// Every declared function id, in order.
    pub(super) fn functions(&self) -> impl Iterator<Item = FuncId> + use<> {
        (0..self.declared_functions).map(FuncId::new)
    }

    /// What `id` is (undefined if never declared).
    pub(super) fn state(&self, id: FuncId) -> State {
        if self.is_declared(id) {
            self.functions[id]
        } else {
            State::Undefined
        }
    }

    /// Moves `id` between the states that define nothing in the inner
    /// module: undefined, pending, or planned as a duplicate.
    pub(super) fn plan(&mut self, id: FuncId, state: State) {
        debug_assert!(matches!(
            state,
            State::Undefined | State::Pending | State::Planned { .. }
        ));
        self.functions[id] = state;
    }

    /// Records `id` as defined in the inner module, as `state`, with
    /// `code_size` bytes of its own code; it is finalized next time.
    pub(super) fn defined(&mut self, id: FuncId, state: State, code_size: u64) {
        self.functions[id] = state;
        self.code_size[id] = code_size as u32;
        self.unfinalized.push(id);
    }

    /// The size of `id`'s own code.
    pub(super) fn code_size(&self, id: FuncId) -> usize {
        self.code_size[id] as usize
    }

    /// Follows duplicate links from `id` to a function that is not a
    /// duplicate (see 4 above).
    pub(super) fn root_of(&self, mut id: FuncId) -> FuncId {
        for _ in 0..=self.declared_functions {
            match self.state(id) {
                State::Duplicate { canonical } | State::Planned { canonical } => id = canonical,
                State::Undefined | State::Pending | State::Compiled(_) | State::Bytes => break,
            }
        }
        id
    }

    /// Checks that `id` may be defined now (see 1 above).
    pub(super) fn check_definable(
        &self,
        decls: &ModuleDeclarations,
        id: FuncId,
    ) -> ModuleResult<()> {
        if !self.is_declared(id) {
            return Err(ModuleError::Undeclared(format!("{id} (never declared)")));
        }
        let decl = decls.get_function_decl(id);
        let name = || decl.linkage_name(id).into_owned();
        if !decl.linkage.is_definable() {
            return Err(ModuleError::InvalidImportDefinition(name()));
        }
        if self.functions[id] != State::Undefined {
            return Err(ModuleError::DuplicateDefinition(name()));
        }
        Ok(())
    }

    /// Notes that `id` is being defined with `signature` (`None` for raw
    /// bytes, which carry none: the declared one stands for them).
    pub(super) fn note_signature(
        &mut self,
        decls: &ModuleDeclarations,
        id: FuncId,
        signature: Option<&ir::Signature>,
    ) {
        match signature {
            Some(signature) if *signature != decls.get_function_decl(id).signature => {
                self.defined_signatures.insert(id, signature.clone());
            }
            _ => {
                self.defined_signatures.remove(&id);
            }
        }
    }

    /// The signature `id` was defined (or recorded) with: the declared one
    /// unless the definition had another (see 1 above).
    pub(super) fn signature<'a>(
        &'a self,
        decls: &'a ModuleDeclarations,
        id: FuncId,
    ) -> &'a ir::Signature {
        self.defined_signatures
            .get(&id)
            .unwrap_or_else(|| &decls.get_function_decl(id).signature)
    }

    /// Notes the local functions and data objects the code just compiled in
    /// `ctx` has relocations against, so that finalizing can check they are
    /// defined. (Declared but unused references are not relocated, so they
    /// need no definition.)
    pub(super) fn note_references(&mut self, ctx: &Context) {
        let Some(code) = ctx.compiled_code() else {
            return;
        };
        let params = &ctx.func.params;
        for reloc in code.buffer.relocs() {
            let cranelift_codegen::FinalizedRelocTarget::ExternalName(ir::ExternalName::User(r)) =
                reloc.target
            else {
                continue;
            };
            if let Some(name) = params.user_named_funcs().get(r) {
                self.note_reference(&ModuleRelocTarget::user(name.namespace, name.index));
            }
        }
    }

    /// Notes that something defined refers to `target`, so that finalizing
    /// can check that it is defined.
    pub(super) fn note_reference(&mut self, target: &ModuleRelocTarget) {
        match *target {
            ModuleRelocTarget::User {
                namespace: 0,
                index,
            } => {
                self.referenced_functions.insert(FuncId::from_u32(index));
            }
            ModuleRelocTarget::User {
                namespace: 1,
                index,
            } => {
                self.referenced_data.insert(DataId::from_u32(index));
            }
            _ => {}
        }
    }

    /// Records data object `id` as defined; it is finalized next time.
    pub(super) fn define_data(&mut self, id: DataId) {
        self.defined_data[id] = true;
        self.unfinalized_data.push(id);
    }

    /// Whether data object `id` is defined.
    pub(super) fn is_data_defined(&self, id: DataId) -> bool {
        self.defined_data[id]
    }

    /// Whether function `id` is finalized.
    pub(super) fn is_finalized(&self, id: FuncId) -> bool {
        self.finalized[id]
    }

    /// Whether data object `id` is finalized.
    pub(super) fn is_data_finalized(&self, id: DataId) -> bool {
        self.finalized_data[id]
    }

    /// The functions defined since the last finalization, in definition
    /// order.
    pub(super) fn unfinalized(&self) -> &[FuncId] {
        &self.unfinalized
    }

    /// Marks everything defined since the last finalization as finalized;
    /// returns the functions among it, in definition order. What it
    /// referred to was resolved then, once (a JIT relocates only what a
    /// finalization finalizes), so it is no longer checked (see 3 above).
    pub(super) fn finalize(&mut self) -> Vec<FuncId> {
        self.referenced_functions.clear();
        self.referenced_data.clear();
        for id in std::mem::take(&mut self.unfinalized_data) {
            self.finalized_data[id] = true;
        }
        let functions = std::mem::take(&mut self.unfinalized);
        for &id in &functions {
            self.finalized[id] = true;
        }
        functions
    }

    /// Checks that every local function and data object referenced by a
    /// definition is defined (see 3 above).
    pub(super) fn check_references_defined(&self, decls: &ModuleDeclarations) -> ModuleResult<()> {
        let mut missing: Vec<String> = Vec::new();
        for &id in &self.referenced_functions {
            let local = self.is_declared(id)
                && decls.get_function_decl(id).linkage.is_final()
                && decls.get_function_decl(id).linkage != Linkage::Import;
            if local
                && matches!(
                    self.state(id),
                    State::Undefined | State::Pending | State::Planned { .. }
                )
            {
                let name = decls.get_function_decl(id).linkage_name(id).into_owned();
                missing.push(format!("function {name}"));
            }
        }
        for &id in &self.referenced_data {
            let decl = self.is_declared_data(id).then(|| decls.get_data_decl(id));
            if let Some(decl) = decl
                && decl.linkage.is_final()
                && !self.defined_data[id]
            {
                missing.push(format!("data object {}", decl.linkage_name(id)));
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            missing.sort();
            Err(DedupError::ReferencedButNotDefined { missing }.into())
        }
    }
}
