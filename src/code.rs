//! Machine code of one function, with its relocations by target, and
//! retargeting it to another function's names: what code reuse copies, what
//! a persistent cache stores and what the machine-code oracle
//! ([`crate::compile`]) compares.
//!
//! # What this module guarantees
//!
//! - [`MachineCode`] holds everything that decides what the code does once
//!   linked: the bytes, their alignment, and each relocation's offset, kind,
//!   addend and target, with external names resolved through the function's
//!   own name table (so two functions that number their name tables
//!   differently compare equal when they refer to the same symbols).
//! - [`MachineCode::retarget`] changes relocation targets only, and only
//!   those against names in the slot list it is given.

use crate::fingerprint::SymbolName;
use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::ir::{ExternalName, KnownSymbol, LibCall};
use cranelift_codegen::{Context, FinalizedRelocTarget};

/// What a relocation points at, with names resolved to their values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelocTarget {
    /// A user or test-case name.
    Name(SymbolName),
    /// A libcall the code calls.
    LibCall(LibCall),
    /// A symbol such as the ELF GOT.
    KnownSymbol(KnownSymbol),
    /// An offset inside the function's own code.
    OwnOffset(u32),
}

/// One relocation of compiled code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relocation {
    /// Where in the code.
    pub offset: u32,
    /// How to patch it.
    pub kind: Reloc,
    /// Added to the target's address.
    pub addend: i64,
    /// What it refers to.
    pub target: RelocTarget,
}

/// Machine code of one function: everything needed to compare two
/// compilations, or to define the function again from bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineCode {
    /// The code bytes.
    pub bytes: Vec<u8>,
    /// The alignment the code asks for.
    pub alignment: u32,
    /// Every relocation, in order.
    pub relocs: Vec<Relocation>,
}

impl MachineCode {
    /// The code compiled in `ctx`, if it holds any.
    pub fn of(ctx: &Context) -> Option<Self> {
        let code = ctx.compiled_code()?;
        let names = ctx.func.params.user_named_funcs();
        let relocs = code
            .buffer
            .relocs()
            .iter()
            .map(|r| {
                let target = match &r.target {
                    FinalizedRelocTarget::ExternalName(name) => match name {
                        ExternalName::User(user) => {
                            RelocTarget::Name(SymbolName::User(names[*user].clone()))
                        }
                        ExternalName::TestCase(name) => {
                            RelocTarget::Name(SymbolName::TestCase(name.raw().into()))
                        }
                        ExternalName::LibCall(libcall) => RelocTarget::LibCall(*libcall),
                        ExternalName::KnownSymbol(symbol) => RelocTarget::KnownSymbol(*symbol),
                    },
                    FinalizedRelocTarget::Func(offset) => RelocTarget::OwnOffset(*offset),
                };
                Relocation {
                    offset: r.offset,
                    kind: r.kind,
                    addend: r.addend,
                    target,
                }
            })
            .collect();
        Some(Self {
            bytes: code.code_buffer().to_vec(),
            alignment: code.buffer.alignment,
            relocs,
        })
    }

    /// This code with every relocation against `from[i]` retargeted to
    /// `to[i]`: the code of a function whose template equals this one's,
    /// given both functions' names in slot order. `None` if the slot lists
    /// differ in length or a relocation names something not in `from`.
    pub fn retarget(&self, from: &[SymbolName], to: &[SymbolName]) -> Option<Self> {
        if from.len() != to.len() {
            return None;
        }
        let mut relocs = self.relocs.clone();
        for reloc in &mut relocs {
            if let RelocTarget::Name(name) = &reloc.target {
                let slot = from.iter().position(|n| n == name)?;
                reloc.target = RelocTarget::Name(to[slot].clone());
            }
        }
        Some(Self {
            bytes: self.bytes.clone(),
            alignment: self.alignment,
            relocs,
        })
    }
}

impl MachineCode {
    /// This code with each relocation's target replaced by `rename` of the
    /// relocation (bytes, alignment, offsets, kinds and addends unchanged).
    pub fn renamed(&self, rename: &dyn Fn(&Relocation) -> RelocTarget) -> Self {
        Self {
            bytes: self.bytes.clone(),
            alignment: self.alignment,
            relocs: self
                .relocs
                .iter()
                .map(|r| Relocation {
                    target: rename(r),
                    ..r.clone()
                })
                .collect(),
        }
    }
}
