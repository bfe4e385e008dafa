//! The object-file call of a [`DedupModule`] around an `ObjectModule`:
//! finishing into a relocatable object (ELF for Linux targets) for any ISA,
//! the host's or not.
//!
//! # What this module guarantees
//!
//! - [`DedupModule::finish`] compiles pending batch definitions, refuses to
//!   finish while a referenced local function or data object is undefined
//!   (a linker would fail later, further from the cause), then finishes the
//!   inner module.
//! - Without [`DedupOptions::distinct_addresses`](super::DedupOptions), the
//!   symbol of every duplicate is an *alias*: it is moved onto its canonical
//!   function's code (same section, offset and size), as identical-code
//!   folding in a linker makes it, so every relocation against it, from any
//!   function, reaches the shared code directly. The duplicate's trampoline
//!   (which the inner module received at definition time, before the
//!   object existed) stays in the text section, unnamed and unreachable;
//!   [`Stats::trampoline_bytes`](super::Stats) counts it.
//! - With distinct addresses, every duplicate's symbol names its own
//!   trampoline: one direct branch to the canonical function (x86-64
//!   `jmp rel32`, aarch64 `b`), the cheapest correct form.

use super::{DedupModule, State};
use cranelift_codegen::entity::EntityRef;
use cranelift_module::{FuncId, ModuleResult};
use cranelift_object::{ObjectModule, ObjectProduct};

impl DedupModule<ObjectModule> {
    /// Compiles what is pending and finishes the object (see the module
    /// docs for what duplicates become).
    pub fn finish(mut self) -> ModuleResult<ObjectProduct> {
        self.flush()?;
        self.check_references_defined()?;
        let aliases: Vec<(FuncId, FuncId)> = if self.options.distinct_addresses {
            Vec::new()
        } else {
            (0..self.declared_functions)
                .map(FuncId::new)
                .filter_map(|id| match self.functions[id] {
                    State::Duplicate { .. } => Some((id, self.root_of(id))),
                    State::Undefined | State::Pending | State::Compiled(_) | State::Bytes => None,
                })
                .collect()
        };
        let mut product = self.inner.finish();
        for (duplicate, canonical) in aliases {
            let (Some((dup_symbol, _)), Some((canonical_symbol, _))) =
                (product.functions[duplicate], product.functions[canonical])
            else {
                continue;
            };
            let code = product.object.symbol(canonical_symbol);
            let (section, value, size) = (code.section, code.value, code.size);
            let alias = product.object.symbol_mut(dup_symbol);
            alias.section = section;
            alias.value = value;
            alias.size = size;
        }
        Ok(product)
    }
}
