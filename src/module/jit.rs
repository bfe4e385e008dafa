//! The JIT-only calls of a [`DedupModule`] around a `JITModule`:
//! finalizing and getting code pointers, with errors instead of the panics
//! `JITModule` has for the same misuse.

use super::{DedupModule, State};
use cranelift_codegen::entity::EntityRef;
use cranelift_jit::JITModule;
use cranelift_module::{DataId, FuncId, Module, ModuleError, ModuleResult};

impl DedupModule<JITModule> {
    /// Compiles pending batch definitions, checks that everything referenced
    /// is defined, then performs relocations and makes the code executable.
    pub fn finalize_definitions(&mut self) -> ModuleResult<()> {
        self.flush()?;
        self.check_references_defined()?;
        self.inner.finalize_definitions()?;
        for id in std::mem::take(&mut self.unfinalized) {
            self.finalized[id] = true;
        }
        Ok(())
    }

    /// The entry point of function `id`: for a duplicate, the canonical
    /// function's entry point unless distinct addresses were asked for.
    pub fn get_finalized_function(&self, id: FuncId) -> ModuleResult<*const u8> {
        if id.index() >= self.declared_functions {
            return Err(ModuleError::Undeclared(format!("{id} (never declared)")));
        }
        let state = self.functions[id];
        if matches!(state, State::Undefined | State::Pending) || !self.finalized[id] {
            return Err(ModuleError::Backend(anyhow::anyhow!(
                "function {} is not {}",
                self.function_name(id),
                if matches!(state, State::Undefined) {
                    "defined"
                } else {
                    "finalized yet (call finalize_definitions)"
                }
            )));
        }
        let target = match state {
            State::Duplicate { canonical } if !self.options.distinct_addresses => canonical,
            _ => id,
        };
        Ok(self.inner.get_finalized_function(target))
    }

    /// The address and size of a finalized data object.
    pub fn get_finalized_data(&self, id: DataId) -> ModuleResult<(*const u8, usize)> {
        if id.index() >= self.declared_data {
            return Err(ModuleError::Undeclared(format!("{id} (never declared)")));
        }
        let decl = self.inner.declarations().get_data_decl(id);
        if !self.defined_data[id] {
            return Err(ModuleError::Backend(anyhow::anyhow!(
                "data object {} is not defined",
                decl.linkage_name(id)
            )));
        }
        Ok(self.inner.get_finalized_data(id))
    }
}
