//! Check mode ([`DedupOptions::check`](super::DedupOptions::check)): every
//! function that jitfold defines without compiling is also compiled on its
//! own, and the code it is handed must be that code. The counterpart of
//! Cranelift's `enable_incremental_compilation_cache_checks`, for embedders
//! who want to see the cache proved right on their own functions.
//!
//! # What this module guarantees
//!
//! With check mode on, before anything is defined:
//!
//! 1. A duplicate (cache hit, eager or batch): its own compilation equals
//!    the *reference code* of its class, relocation targets on both sides
//!    mapped through canonicalization (a name of a duplicate is read as its
//!    canonical function's, following the module's duplicate links and call
//!    aliases).
//! 2. Reused code: its own compilation equals the template's code
//!    retargeted to its names, relocation for relocation.
//! 3. An adapter: the function compiled with its calling convention set to
//!    the target's equals the reference code of the target's class, names
//!    mapped as in 1.
//! 4. Where the code differs, both functions are laid out in one block
//!    order and compiled again ([`compile::compare_compiled_code`], the one
//!    place that decides "the same machine code"): block layout is not in
//!    the fingerprint and can change register choice. A difference that
//!    remains is an error, [`DedupError::CheckMismatch`] (inside
//!    `ModuleError::Backend`), naming both functions,
//!    saying what differs (bytes, relocations, alignment) and showing both
//!    disassemblies; the function is not defined.
//!
//! The reference code of a class is the code its first function compiled
//! to, or, when that function was itself reused or adapted, its own
//! compilation made by the check, kept with that function. It is kept only
//! in check mode.

use super::ids::State;
use super::reuse::CodeTemplate;
use super::{DedupError, DedupModule};
use crate::cache::ClassId;
use crate::compile::{self, MachineCode, Renaming};
use crate::fingerprint::SymbolName;
use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::{Function, UserExternalName};
use cranelift_module::{FuncId, Module, ModuleError, ModuleResult};

/// The reference code of each class, in check mode.
#[derive(Default)]
pub(super) struct ReferenceCode {
    code: SecondaryMap<ClassId, Option<Reference>>,
}

/// A class's reference code and the function it was compiled from.
#[derive(Clone)]
struct Reference {
    func: Function,
    code: MachineCode,
}

impl<M: Module> DedupModule<M> {
    /// Keeps `code`, compiled from `func`, as the reference code of `id`'s
    /// class, unless the class has one (check mode only).
    pub(super) fn keep_reference_code(
        &mut self,
        id: FuncId,
        func: &Function,
        code: Option<MachineCode>,
    ) {
        if let (State::Compiled(class), Some(code)) = (self.ids.state(id), code)
            && self.reference.code[class].is_none()
        {
            let func = func.clone();
            self.reference.code[class] = Some(Reference { func, code });
        }
    }

    /// Checks a duplicate (see 1 above): `func`, to be defined as `id`,
    /// against the reference code of `canonical`'s class.
    pub(super) fn check_duplicate(
        &self,
        id: FuncId,
        func: &Function,
        canonical: FuncId,
    ) -> ModuleResult<()> {
        let own = self.compile_for_check(id, func)?;
        self.check_against_class(id, func, &own, canonical, "a duplicate of")
    }

    /// Checks reused code (see 2 above): `reused` is what `id` (`func`,
    /// whose names in slot order are `names`) is to be defined as, `template`
    /// the code it was made from. Returns `func`'s own compilation, the
    /// reference code of its class.
    pub(super) fn check_reused(
        &self,
        id: FuncId,
        func: &Function,
        names: &[SymbolName],
        reused: &MachineCode,
        template: &CodeTemplate,
    ) -> ModuleResult<MachineCode> {
        let own = self.compile_for_check(id, func)?;
        if compile::difference(&own, reused).is_none() {
            return Ok(own);
        }
        // Compared again with both laid out in one order: the template's
        // function, names slot for slot.
        let relation = "code reused from";
        let source = template.source;
        let Some(reference) = self.reference_of(source) else {
            return Err(self.mismatch(id, relation, source, "its code was not kept"));
        };
        let renaming = Renaming::slots(template.names(), names);
        let compared = compile::compare_compiled_code(
            self.inner.isa(),
            (&reference.func, &reference.code),
            (func, &own),
            &renaming,
        );
        self.compared(id, relation, source, compared).map(|()| own)
    }

    /// Checks an adapter (see 3 above): `id` (`func`) is to call `target`.
    /// Returns `func`'s own compilation, the reference code of its class.
    pub(super) fn check_adapter(
        &self,
        id: FuncId,
        func: &Function,
        target: FuncId,
    ) -> ModuleResult<MachineCode> {
        let mut converted = func.clone();
        converted.signature.call_conv = self.call_conv(target);
        let as_target = self.compile_for_check(id, &converted)?;
        self.check_against_class(id, &converted, &as_target, target, "an adapter to")?;
        self.compile_for_check(id, func)
    }

    /// Compares `code`, compiled from `func` (to be `id`), with the
    /// reference code of `canonical`'s class, names mapped through
    /// canonicalization.
    fn check_against_class(
        &self,
        id: FuncId,
        func: &Function,
        code: &MachineCode,
        canonical: FuncId,
        relation: &str,
    ) -> ModuleResult<()> {
        let Some(reference) = self.reference_of(canonical) else {
            return Err(self.mismatch(id, relation, canonical, "its code was not kept"));
        };
        let renaming = Renaming::by_class(|_, name| self.canonical_name(name));
        let compared = compile::compare_compiled_code(
            self.inner.isa(),
            (func, code),
            (&reference.func, &reference.code),
            &renaming,
        );
        self.compared(id, relation, canonical, compared)
    }

    /// The reference code of the class `id`'s code belongs to.
    fn reference_of(&self, id: FuncId) -> Option<&Reference> {
        match self.ids.state(self.ids.root_of(id)) {
            State::Compiled(class) => self.reference.code[class].as_ref(),
            State::Undefined
            | State::Pending
            | State::Planned { .. }
            | State::Duplicate { .. }
            | State::Bytes => None,
        }
    }

    /// The outcome of comparing `id`'s code with `other`'s as an error, if
    /// it is not "the same code".
    fn compared(
        &self,
        id: FuncId,
        relation: &str,
        other: FuncId,
        compared: Result<Option<compile::CodeMismatch>, String>,
    ) -> ModuleResult<()> {
        match compared {
            Ok(None) => Ok(()),
            Ok(Some(mismatch)) => Err(self.mismatch(id, relation, other, &mismatch.to_string())),
            Err(e) => Err(self.mismatch(id, relation, other, &e)),
        }
    }

    /// `name`, if it is a local function, replaced by its canonical
    /// function's (duplicate links, then call aliases).
    fn canonical_name(&self, name: &SymbolName) -> SymbolName {
        match name {
            SymbolName::User(user) if user.namespace == 0 => {
                let root = self.ids.root_of(FuncId::from_u32(user.index));
                let root = self.joins.call_target(root).unwrap_or(root);
                SymbolName::User(UserExternalName::new(0, root.as_u32()))
            }
            SymbolName::User(_) | SymbolName::TestCase(_) => name.clone(),
        }
    }

    /// `func` (to be defined as `id`) compiled on its own for the module's
    /// ISA.
    pub(super) fn compile_for_check(
        &self,
        id: FuncId,
        func: &Function,
    ) -> ModuleResult<MachineCode> {
        compile::compile(func, self.inner.isa())
            .map(|compiled| compiled.code)
            .map_err(|e| {
                DedupError::CheckCompileFailed {
                    function: self.function_name(id),
                    message: e.to_string(),
                }
                .into()
            })
    }

    fn mismatch(&self, id: FuncId, relation: &str, other: FuncId, what: &str) -> ModuleError {
        DedupError::CheckMismatch {
            function: self.function_name(id),
            relation: relation.to_string(),
            other: self.function_name(other),
            difference: what.to_string(),
        }
        .into()
    }
}

/// Which table [`DedupModule::poison_cache_for_testing`] corrupts.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum Poison {
    /// The exact fingerprints (cache hits: duplicates).
    Exact,
    /// The templates of reusable code.
    Template,
    /// The calling-convention-erased fingerprints (adapters).
    Body,
}

impl<M: Module> DedupModule<M> {
    /// Test hook, not API: makes the cache wrong on purpose, so that tests
    /// can show check mode catching it. Records the fingerprint of `func`
    /// (as the module would compute it when `func` is defined next) in the
    /// table `what` as belonging to `target`, a compiled function (for
    /// [`Poison::Template`], one whose code was kept for reuse). Does
    /// nothing when `target` is not such a function.
    #[doc(hidden)]
    pub fn poison_cache_for_testing(&mut self, func: &Function, target: FuncId, what: Poison) {
        let State::Compiled(class) = self.ids.state(target) else {
            return;
        };
        let mut func = func.clone();
        self.canonicalize_references(&mut func);
        let fp = crate::plan::Walk::of(&mut self.fingerprinter, &func).fingerprint;
        match what {
            Poison::Exact => {
                self.compiled.add_alias(fp, class);
            }
            Poison::Template => {
                let codes = self.compiled.template_codes();
                let template = codes.iter().position(|t| t.source == target);
                if let Some(template) = template {
                    let class = ClassId::from_u32(template as u32);
                    self.compiled.alias_template(fp.to_template(), class);
                }
            }
            Poison::Body => {
                let call_conv = self.call_conv(target);
                self.compiled
                    .replace_body(fp.erase_call_conv(), class, call_conv);
            }
        }
    }
}
