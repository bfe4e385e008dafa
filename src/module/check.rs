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
//! 4. Anything else is an error, `ModuleError::Backend`, naming both
//!    functions and saying what differs (bytes, relocations, alignment), and
//!    the function is not defined.
//!
//! The reference code of a class is the code its first function compiled
//! to, or, when that function was itself reused or adapted, its own
//! compilation made by the check. It is kept only in check mode.
//!
//! Block layout is not in the fingerprint, and can change code bytes:
//! until the check lays both functions out in one order before comparing,
//! a duplicate whose blocks are laid out in another order may be reported
//! although it computes the same.

use super::{DedupModule, State};
use crate::cache::ClassId;
use crate::compile::{self, MachineCode, RelocTarget};
use crate::fingerprint::SymbolName;
use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::{Function, UserExternalName};
use cranelift_module::{FuncId, Module, ModuleError, ModuleResult};

/// The reference code of each class, in check mode.
#[derive(Default)]
pub(super) struct ReferenceCode {
    code: SecondaryMap<ClassId, Option<MachineCode>>,
}

/// Why two compilations differ.
fn difference(a: &MachineCode, b: &MachineCode) -> Option<&'static str> {
    if a.bytes != b.bytes {
        Some("the machine code bytes differ")
    } else if a.relocs != b.relocs {
        Some("the relocations differ")
    } else if a.alignment != b.alignment {
        Some("the alignment differs")
    } else {
        None
    }
}

impl<M: Module> DedupModule<M> {
    /// Keeps `code` as the reference code of `id`'s class, unless the class
    /// has one (check mode only).
    pub(super) fn keep_reference_code(&mut self, id: FuncId, code: Option<MachineCode>) {
        if let (State::Compiled(class), Some(code)) = (self.functions[id], code)
            && self.reference.code[class].is_none()
        {
            self.reference.code[class] = Some(code);
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
        self.check_against_class(id, &own, canonical, "a duplicate of")
    }

    /// Checks reused code (see 2 above): `reused` is what `id` (`func`) is
    /// to be defined as; `source` is the function it was compiled for.
    /// Returns `func`'s own compilation, the reference code of its class.
    pub(super) fn check_reused(
        &self,
        id: FuncId,
        func: &Function,
        reused: &MachineCode,
        source: FuncId,
    ) -> ModuleResult<MachineCode> {
        let own = self.compile_for_check(id, func)?;
        match difference(&own, reused) {
            None => Ok(own),
            Some(what) => Err(self.mismatch(id, "code reused from", source, what)),
        }
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
        self.check_against_class(id, &as_target, target, "an adapter to")?;
        self.compile_for_check(id, func)
    }

    /// Compares `code` (of `id`) with the reference code of `canonical`'s
    /// class, names mapped through canonicalization.
    fn check_against_class(
        &self,
        id: FuncId,
        code: &MachineCode,
        canonical: FuncId,
        relation: &str,
    ) -> ModuleResult<()> {
        let reference = match self.functions[self.root_of(canonical)] {
            State::Compiled(class) => self.reference.code[class].as_ref(),
            State::Undefined | State::Pending | State::Duplicate { .. } | State::Bytes => None,
        };
        let Some(reference) = reference else {
            return Err(self.mismatch(id, relation, canonical, "the latter's code was not kept"));
        };
        match difference(
            &self.canonical_names(code),
            &self.canonical_names(reference),
        ) {
            None => Ok(()),
            Some(what) => Err(self.mismatch(id, relation, canonical, what)),
        }
    }

    /// `code` with every local function name replaced by its canonical
    /// function's (duplicate links, then call aliases).
    fn canonical_names(&self, code: &MachineCode) -> MachineCode {
        let mut code = code.clone();
        for reloc in &mut code.relocs {
            if let RelocTarget::Name(SymbolName::User(name)) = &mut reloc.target
                && name.namespace == 0
            {
                let root = self.root_of(FuncId::from_u32(name.index));
                let root = self.joins.call_target(root).unwrap_or(root);
                *name = UserExternalName::new(0, root.as_u32());
            }
        }
        code
    }

    /// `func` (to be defined as `id`) compiled on its own for the module's
    /// ISA.
    fn compile_for_check(&self, id: FuncId, func: &Function) -> ModuleResult<MachineCode> {
        compile::compile(func, self.inner.isa())
            .map(|compiled| compiled.code)
            .map_err(|e| {
                ModuleError::Backend(anyhow::anyhow!(
                    "check mode: {} does not compile on its own: {e}",
                    self.function_name(id)
                ))
            })
    }

    fn mismatch(&self, id: FuncId, relation: &str, other: FuncId, what: &str) -> ModuleError {
        ModuleError::Backend(anyhow::anyhow!(
            "check mode: {} was to be defined as {relation} {}, but {what}",
            self.function_name(id),
            self.function_name(other)
        ))
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
        let State::Compiled(class) = self.functions[target] else {
            return;
        };
        let mut func = func.clone();
        self.canonicalize_references(&mut func);
        let fp = self.fingerprinter.fingerprint(&func);
        match what {
            Poison::Exact => {
                self.cache.insert_alias(fp, class);
            }
            Poison::Template => {
                let template = self.code_templates.iter().position(|t| t.source == target);
                if let Some(template) = template {
                    let class = ClassId::from_u32(template as u32);
                    self.templates.insert_alias(fp.template(), class);
                }
            }
            Poison::Body => {
                self.adaptable_bodies
                    .insert(fp.with_call_conv_erased(), target);
            }
        }
    }
}
