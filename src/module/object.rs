//! The object-file calls of a [`DedupModule`] around an `ObjectModule`:
//! the same inherent methods as `ObjectModule` (`new`, `finish`), with the
//! same signatures, finishing into a relocatable object (ELF for Linux
//! targets) for any ISA, the host's or not.
//!
//! # What this module guarantees
//!
//! - `DedupModule<ObjectModule>` has every public inherent method of
//!   `ObjectModule` 0.135.8 with the same signature ([`DedupModule::new`],
//!   [`DedupModule::finish`]), so code written against `ObjectModule`
//!   compiles when only the type changes.
//! - [`DedupModule::try_finish`] compiles pending batch definitions, refuses
//!   to finish while a referenced local function or data object is
//!   undefined (a linker would fail later, further from the cause), then
//!   finishes the inner module. [`DedupModule::finish`] panics where it
//!   returns an error (`ObjectModule::finish` panics, in debug builds, on
//!   a function or data object that must be defined but is not).
//! - The symbol of every duplicate that shares its canonical function's
//!   address (only without [`DedupOptions::distinct_addresses`](super::DedupOptions),
//!   see item 6 of the [module docs](super)) is an *alias*: it is moved onto
//!   its canonical function's code (same section, offset and size), as
//!   identical-code folding in a linker makes it, so every relocation
//!   against it, from any function, reaches the shared code directly. The
//!   duplicate's trampoline (which the inner module received at definition
//!   time, before the object existed) stays in the text section, unnamed
//!   and unreachable; [`Stats::trampoline_bytes`](super::Stats) counts it.
//! - Every other duplicate's symbol names its own trampoline: one direct
//!   branch to the canonical function (x86-64 `jmp rel32`, aarch64 `b`),
//!   the cheapest correct form.
//! - With unwind information (`ObjectBuilder::unwind_info(true)`), every
//!   function's address is covered by an FDE in `.eh_frame`: the inner
//!   module describes what it compiled, and jitfold appends descriptions
//!   of reused code and trampolines (see `unwind.rs`).

use super::ids::State;
use super::{DedupModule, DedupOptions, unwind};
use cranelift_module::{FuncId, Module, ModuleResult};
use cranelift_object::{ObjectBuilder, ObjectModule, ObjectProduct};

impl super::InnerBuilder for ObjectBuilder {
    type Module = ObjectModule;
    fn build(self) -> ObjectModule {
        ObjectModule::new(self)
    }
}

impl DedupModule<ObjectModule> {
    /// Like `ObjectModule::new`: a new object module, wrapped with the
    /// default [`DedupOptions`] ([`DedupModule::with_options`] for others).
    pub fn new(builder: ObjectBuilder) -> Self {
        Self::with_options(builder, DedupOptions::default())
    }

    /// Compiles what is pending and finishes the object, as
    /// `ObjectModule::finish` (see the module docs for what duplicates
    /// become).
    ///
    /// # Panics
    ///
    /// When [`DedupModule::try_finish`] returns an error: a pending batch
    /// definition fails, or a referenced local function or data object is
    /// not defined.
    pub fn finish(self) -> ObjectProduct {
        self.try_finish().unwrap_or_else(|e| panic!("finish: {e}"))
    }

    /// [`DedupModule::finish`], with an error instead of a panic.
    pub fn try_finish(mut self) -> ModuleResult<ObjectProduct> {
        self.flush()?;
        self.check_references_defined()?;
        let aliases: Vec<(FuncId, FuncId)> = self
            .ids
            .functions()
            .filter_map(|id| match self.ids.state(id) {
                State::Duplicate { .. } => {
                    let address = self.address_id(id);
                    (address != id).then_some((id, address))
                }
                State::Undefined
                | State::Pending
                | State::Planned { .. }
                | State::Compiled(_)
                | State::Bytes => None,
            })
            .collect();
        // Frames for code defined from bytes, except sharing duplicates'
        // trampolines (their symbols move into the canonical function).
        let frames: Vec<(FuncId, super::frames::Frame)> = self
            .frames
            .all()
            .iter()
            .filter(|(id, _)| self.address_id(*id) == *id)
            .copied()
            .collect();
        let target = unwind::Target::of(self.inner.isa());
        let templates = self.compiled.take_template_codes();
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
        unwind::write_frames(
            &mut product,
            &target,
            &frames,
            &templates,
            self.frames.own(),
        )?;
        Ok(product)
    }
}
