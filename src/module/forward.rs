//! The `cranelift_module::Module` implementation: declarations and
//! everything else forward to the inner module; definitions go through
//! the wrapper's bookkeeping (see the [module docs](super)).
//!
//! # What this module guarantees
//!
//! 1. Declaring forwards to the inner module and notes the id, so that an
//!    id the wrapper did not see declared is never indexed.
//! 2. A definition is checked first (see `ids.rs`): misuse is the error
//!    Cranelift's modules give, never a panic.
//! 3. Function addresses in raw bytes and data objects are made the
//!    address every other reference to the same id gets (see
//!    `address.rs`).

use super::flush::Ahead;
use super::ids::State;
use super::retired::Named;
use super::{DedupError, DedupModule};
use crate::plan::{self, Admission};
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::{Context, ir, isa};
use cranelift_module::{
    DataDescription, DataId, FuncId, FuncOrDataId, Linkage, Module, ModuleDeclarations,
    ModuleError, ModuleReloc, ModuleResult,
};

impl<M: Module> DedupModule<M> {
    /// The linkage `name` is declared with, if it is declared.
    fn declared_linkage(&self, name: &str) -> Option<Linkage> {
        let decls = self.inner.declarations();
        Some(match decls.get_name(name)? {
            FuncOrDataId::Func(id) => decls.get_function_decl(id).linkage,
            FuncOrDataId::Data(id) => decls.get_data_decl(id).linkage,
        })
    }

    /// Retires every class whose code names `named`, an import that a
    /// declaration just made definable: a JIT bound it to the host's
    /// symbol, which a definition would replace for what is finalized
    /// after it (see `retired.rs`).
    fn retire_naming(&mut self, named: Named) {
        for class in self.retired.naming(named) {
            self.retire(class);
        }
    }

    /// Whether a function of `linkage` may be replaced by another
    /// definition when the code is linked (see 14 in the module docs).
    fn replaceable(&self, linkage: Linkage) -> bool {
        match linkage {
            Linkage::Preemptible => self.preemptible_replaceable,
            Linkage::Export => self.exports_interposable,
            Linkage::Import | Linkage::Local | Linkage::Hidden => false,
        }
    }
}

/// The linkage a function declared `existing` has once declared again as
/// `new`: cranelift-module 0.135.8's `Linkage::merge` (private there), for
/// the cases where it matters here: exported wins over everything, then
/// preemptible over the rest.
fn merged_linkage(existing: Linkage, new: Linkage) -> Linkage {
    match (existing, new) {
        (Linkage::Export, _) | (_, Linkage::Export) => Linkage::Export,
        (Linkage::Preemptible, _) | (_, Linkage::Preemptible) => Linkage::Preemptible,
        (Linkage::Import, other) => other,
        (Linkage::Hidden, _) | (_, Linkage::Hidden) => Linkage::Hidden,
        (Linkage::Local, Linkage::Local | Linkage::Import) => Linkage::Local,
    }
}

impl<M: Module> Module for DedupModule<M> {
    fn isa(&self) -> &dyn isa::TargetIsa {
        self.inner.isa()
    }

    fn declarations(&self) -> &ModuleDeclarations {
        self.inner.declarations()
    }

    fn get_name(&self, name: &str) -> Option<cranelift_module::FuncOrDataId> {
        self.inner.get_name(name)
    }

    fn target_config(&self) -> isa::TargetFrontendConfig {
        self.inner.target_config()
    }

    fn make_context(&self) -> Context {
        self.inner.make_context()
    }

    fn clear_context(&self, ctx: &mut Context) {
        self.inner.clear_context(ctx)
    }

    fn make_signature(&self) -> ir::Signature {
        self.inner.make_signature()
    }

    fn clear_signature(&self, sig: &mut ir::Signature) {
        self.inner.clear_signature(sig)
    }

    fn declare_function(
        &mut self,
        name: &str,
        linkage: Linkage,
        signature: &ir::Signature,
    ) -> ModuleResult<FuncId> {
        // Declaring a local, hidden or imported function again as
        // preemptible (or exported, where exports are interposable) makes
        // it so (cranelift-module's `Linkage::merge`). One already defined
        // or recorded may already be merged: refused (see 14 in the module
        // docs), before the inner module changes it. With another
        // signature, the inner module would refuse it too, but only after
        // changing the linkage (cranelift-module 0.135.8's
        // `FunctionDeclaration::merge`): its error is given here, and the
        // linkage left alone.
        if self.replaceable(linkage)
            && let Some(FuncOrDataId::Func(id)) = self.inner.declarations().get_name(name)
            && let existing = self.inner.declarations().get_function_decl(id)
            && !self.replaceable(existing.linkage)
            && self.replaceable(merged_linkage(existing.linkage, linkage))
            && matches!(
                self.ids.state(id),
                State::Pending
                    | State::Planned { .. }
                    | State::Compiled(_)
                    | State::Duplicate { .. }
            )
        {
            if existing.signature != *signature {
                return Err(ModuleError::IncompatibleSignature(
                    name.to_owned(),
                    existing.signature.clone(),
                    signature.clone(),
                ));
            }
            return Err(DedupError::PreemptibleAfterDefinition {
                function: name.to_owned(),
            }
            .into());
        }
        let was_import = self.declared_linkage(name) == Some(Linkage::Import);
        let id = self.inner.declare_function(name, linkage, signature)?;
        self.ids.declare_function(id);
        if was_import && self.inner.declarations().get_function_decl(id).linkage != Linkage::Import
        {
            self.retire_naming(Named::Function(id));
        }
        Ok(id)
    }

    fn declare_anonymous_function(&mut self, signature: &ir::Signature) -> ModuleResult<FuncId> {
        let id = self.inner.declare_anonymous_function(signature)?;
        self.ids.declare_function(id);
        Ok(id)
    }

    fn declare_data(
        &mut self,
        name: &str,
        linkage: Linkage,
        writable: bool,
        tls: bool,
    ) -> ModuleResult<DataId> {
        let was_import = self.declared_linkage(name) == Some(Linkage::Import);
        let id = self.inner.declare_data(name, linkage, writable, tls)?;
        self.ids.declare_data(id);
        if was_import && self.inner.declarations().get_data_decl(id).linkage != Linkage::Import {
            self.retire_naming(Named::Data(id));
        }
        Ok(id)
    }

    fn declare_anonymous_data(&mut self, writable: bool, tls: bool) -> ModuleResult<DataId> {
        let id = self.inner.declare_anonymous_data(writable, tls)?;
        self.ids.declare_data(id);
        Ok(id)
    }

    fn declare_func_in_func(&mut self, func_id: FuncId, func: &mut ir::Function) -> ir::FuncRef {
        self.inner.declare_func_in_func(func_id, func)
    }

    fn declare_data_in_func(&self, data: DataId, func: &mut ir::Function) -> ir::GlobalValue {
        self.inner.declare_data_in_func(data, func)
    }

    fn declare_func_in_data(&self, func_id: FuncId, data: &mut DataDescription) -> ir::FuncRef {
        self.inner.declare_func_in_data(func_id, data)
    }

    fn declare_data_in_data(&self, data_id: DataId, data: &mut DataDescription) -> ir::GlobalValue {
        self.inner.declare_data_in_data(data_id, data)
    }

    fn define_function_with_control_plane(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<()> {
        self.ids.check_definable(self.inner.declarations(), id)?;
        self.ids
            .note_signature(self.inner.declarations(), id, Some(&ctx.func.signature));
        self.batch.forget_failure(id);
        // What an earlier compile left in the context is another
        // function's code: dropped, so that afterwards
        // `ctx.compiled_code()` is this function's code if it was compiled
        // now, and `None` otherwise (see "Where the wrapper sits").
        drop(ctx.take_compiled_code());
        self.canonicalize_references(&mut ctx.func);
        // Counted now; taken back if the definition fails (in batch mode,
        // when `flush` finds out).
        self.stats.defined += 1;
        // A preemptible (weak) function may be replaced when the object is
        // linked, by a definition elsewhere, and so may an exported one in
        // a shared library: a call to it must stay a call to it, and no
        // other function may run its code. So it is compiled now, in
        // either mode, outside the cache: never a duplicate, never what a
        // duplicate runs (see 14 in the module docs, and 9 in `plan.rs`).
        let replaceable = self.replaceable(self.inner.declarations().get_function_decl(id).linkage);
        match plan::admission(self.options.mode, replaceable) {
            Admission::Alone => self.compile_alone(id, ctx, ctrl_plane).inspect_err(|_| {
                self.stats.defined -= 1;
            }),
            Admission::Now => {
                // Another module sharing the store is compiling its
                // template: defined by the next flush instead of waited
                // for (see 8 in `stored.rs`).
                let mut walk = None;
                if self.defers_to_flush(&ctx.func, &mut walk) {
                    self.stats.store_deferred += 1;
                    let walk = walk.expect("a deferred function was walked");
                    self.record_deferred(id, ctx, ctrl_plane, walk);
                    return Ok(());
                }
                let defined =
                    self.define_now(id, ctx, ctrl_plane, &mut Ahead::default(), walk.as_ref());
                // A claim the define did not take (it failed first) is
                // given up.
                self.end_prefetch();
                defined.inspect_err(|_| {
                    self.stats.defined -= 1;
                })
            }
            Admission::Flush => {
                self.record_pending(id, ctx, ctrl_plane);
                Ok(())
            }
        }
    }

    fn define_function_bytes(
        &mut self,
        id: FuncId,
        alignment: u64,
        bytes: &[u8],
        relocs: &[ModuleReloc],
    ) -> ModuleResult<()> {
        self.ids.check_definable(self.inner.declarations(), id)?;
        // Raw bytes carry no signature: the declared one stands for them.
        self.ids.note_signature(self.inner.declarations(), id, None);
        self.batch.forget_failure(id);
        // A relocation may take an address: one to a duplicate sharing its
        // canonical function's address is made to that function; any other
        // keeps its target's own address.
        let relocs: Vec<ModuleReloc> = relocs
            .iter()
            .map(|r| ModuleReloc {
                name: self
                    .shared_target(&r.name)
                    .unwrap_or_else(|| r.name.clone()),
                ..r.clone()
            })
            .collect();
        self.inner
            .define_function_bytes(id, alignment, bytes, &relocs)?;
        for reloc in &relocs {
            self.ids.note_reference(&reloc.name);
            self.note_address_taken(&reloc.name);
        }
        log::trace!("{} ({id}): defined from bytes", self.function_name(id));
        self.ids.defined(id, State::Bytes, bytes.len() as u64);
        self.stats.defined += 1;
        self.stats.bytes_defined += 1;
        Ok(())
    }

    fn define_data(&mut self, data_id: DataId, data: &DataDescription) -> ModuleResult<()> {
        if !self.ids.is_declared_data(data_id) {
            return Err(ModuleError::Undeclared(format!(
                "{data_id} (never declared)"
            )));
        }
        // Function addresses in data: one of a duplicate that shares its
        // canonical function's address is that function's; any other keeps
        // its target's own address.
        let rewritten;
        let data = if data
            .function_decls
            .values()
            .any(|t| self.shared_target(t).is_some())
        {
            let mut copy = data.clone();
            for target in copy.function_decls.values_mut() {
                if let Some(shared) = self.shared_target(target) {
                    *target = shared;
                }
            }
            rewritten = copy;
            &rewritten
        } else {
            data
        };
        self.inner.define_data(data_id, data)?;
        self.ids.define_data(data_id);
        for target in data.function_decls.values() {
            self.ids.note_reference(target);
            self.note_address_taken(target);
        }
        for target in data.data_decls.values() {
            self.ids.note_reference(target);
        }
        Ok(())
    }
}
