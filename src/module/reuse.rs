//! Compile once, instantiate many: reusing the machine code of a function
//! for another function with the same [template](crate::Fingerprint::to_template).
//!
//! # What this module guarantees
//!
//! 1. A code template is captured only when every relocation of the code
//!    is against a libcall, a known symbol, the function's own code, or a
//!    name in the function's slot list (anything else could not be
//!    retargeted, so such code is not reused).
//! 2. An instance has the template's bytes unchanged and the template's
//!    relocations in order with the same offset, kind and addend; only the
//!    target changes: a relocation against slot `i` of the template's names
//!    points at slot `i` of the instance's names, and one into the
//!    template's own code points at the same offset of the instance's code.
//! 3. No instance is made when the slot lists differ in length or when a
//!    relocated slot holds a test-case name (which `cranelift-module` cannot
//!    link); the caller compiles the function instead.

use crate::code::{MachineCode, RelocTarget};
use crate::fingerprint::SymbolName;
use cranelift_codegen::Context;
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::isa::unwind::UnwindInfo;
use cranelift_module::{FuncId, ModuleReloc, ModuleRelocTarget};
use std::time::Duration;

/// Compiled code of the first function of a template class, with the names
/// its relocations were made against.
pub(crate) struct CodeTemplate {
    code: MachineCode,
    names: Vec<SymbolName>,
    /// The function it was compiled for.
    pub(crate) source: FuncId,
    /// What compiling it cost; what each instance saves.
    pub(crate) compile_time: Duration,
    /// The code's unwind information, which every instance shares (see
    /// `unwind.rs`); `None` where the ISA has none.
    pub(crate) unwind: Option<UnwindInfo>,
}

impl CodeTemplate {
    /// The code just compiled in `ctx` for `source`, whose names in slot
    /// order are `names`; `None` if it cannot be retargeted (see 1 above).
    pub(crate) fn capture(
        source: FuncId,
        ctx: &Context,
        names: &[SymbolName],
        compile_time: Duration,
        isa: &dyn TargetIsa,
    ) -> Option<Self> {
        let code = MachineCode::of(ctx)?;
        let unwind = ctx
            .compiled_code()
            .and_then(|compiled| compiled.create_unwind_info(isa).ok().flatten());
        Self::of_code(source, code, names, compile_time, unwind)
    }

    /// [`CodeTemplate::capture`] of code compiled elsewhere: `code`, with
    /// unwind information `unwind`, compiled for `source`.
    pub(crate) fn of_code(
        source: FuncId,
        code: MachineCode,
        names: &[SymbolName],
        compile_time: Duration,
        unwind: Option<UnwindInfo>,
    ) -> Option<Self> {
        let retargetable = code.relocs.iter().all(|r| match &r.target {
            RelocTarget::Name(name) => names.contains(name),
            RelocTarget::LibCall(_) | RelocTarget::KnownSymbol(_) | RelocTarget::OwnOffset(_) => {
                true
            }
        });
        retargetable.then(|| Self {
            code,
            names: names.to_vec(),
            source,
            compile_time,
            unwind,
        })
    }

    /// The code bytes every instance shares.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.code.bytes
    }

    /// The alignment the code asks for.
    pub(crate) fn alignment(&self) -> u64 {
        u64::from(self.code.alignment)
    }

    /// The names of the function this code was compiled for, in slot order.
    pub(crate) fn names(&self) -> &[SymbolName] {
        &self.names
    }

    /// The code of the instance of this template with `names` in slot
    /// order (what [`CodeTemplate::instantiate`] defines, before names
    /// become module relocation targets); `None` if there is none.
    pub(crate) fn retargeted(&self, names: &[SymbolName]) -> Option<MachineCode> {
        self.code.retarget(&self.names, names)
    }

    /// The relocations of the instance of this template defined as `id`
    /// with `names` in slot order; `None` if there is none (see 3 above).
    pub(crate) fn instantiate(&self, id: FuncId, names: &[SymbolName]) -> Option<Vec<ModuleReloc>> {
        let code = self.retargeted(names)?;
        code.relocs
            .iter()
            .map(|reloc| {
                let name = match &reloc.target {
                    RelocTarget::Name(SymbolName::User(user)) => {
                        ModuleRelocTarget::user(user.namespace, user.index)
                    }
                    RelocTarget::Name(SymbolName::TestCase(_)) => return None,
                    RelocTarget::LibCall(libcall) => ModuleRelocTarget::LibCall(*libcall),
                    RelocTarget::KnownSymbol(symbol) => ModuleRelocTarget::KnownSymbol(*symbol),
                    RelocTarget::OwnOffset(offset) => {
                        ModuleRelocTarget::FunctionOffset(id, *offset)
                    }
                };
                Some(ModuleReloc {
                    offset: reloc.offset,
                    kind: reloc.kind,
                    name,
                    addend: reloc.addend,
                })
            })
            .collect()
    }

    /// Heap bytes held: the code, its relocations and the names.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.code.bytes.len()
            + self.code.relocs.len() * size_of::<crate::code::Relocation>()
            + self.names.len() * size_of::<SymbolName>()
    }
}
