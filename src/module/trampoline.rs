//! Trampolines: the smallest machine code that continues in another
//! function with every register and stack slot as it found them.
//!
//! # What this module guarantees
//!
//! - A trampoline is one unconditional direct jump, so arguments (in
//!   registers and on the stack), the return address and callee-saved state
//!   reach the target untouched: the target returns straight to the
//!   trampoline's caller. This is correct for every calling convention,
//!   because caller and target have the same signature.
//! - x86-64: `jmp rel32` (5 bytes, `X86CallPCRel4` relocation); aarch64: `b`
//!   (4 bytes, `Arm64Call`), after `bti c` when the ISA's flags turn on
//!   branch protection (`use_bti`), so that an indirect call may land on
//!   it as on any function Cranelift compiles. Other ISAs get `None`; there `DedupModule`
//!   makes a CLIF `return_call` trampoline when both functions use the
//!   `tail` convention, and otherwise copies or compiles the function.

use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::isa::TargetIsa;
use cranelift_module::{FuncId, ModuleReloc, ModuleRelocTarget};
use target_lexicon::Architecture;

/// aarch64 `bti c`: the landing pad of calls through a register.
const BTI_C: u32 = 0xd503_245f;

/// Machine code of a trampoline with the relocation that points it at its
/// target.
#[derive(Clone)]
pub struct Trampoline {
    /// The code bytes, with the jump offset left for the relocation.
    pub bytes: Vec<u8>,
    /// The one relocation.
    pub reloc: ModuleReloc,
    /// Required alignment of the code.
    pub alignment: u64,
}

/// A trampoline that jumps to the function `target`, or `None` when this ISA
/// has no trampoline form here (or the flags ask for an alignment Cranelift
/// cannot give either).
///
/// Aligned as Cranelift aligns every function it compiles: at least the
/// ISA's minimum and `1 << log2_min_function_alignment` (which `MachBuffer`
/// raises every function's alignment to), so that a duplicate's address
/// is as aligned as the flags promise. (A compile may align a function
/// further, for the constants its code holds; a trampoline holds none.)
pub fn trampoline_to(isa: &dyn TargetIsa, target: FuncId) -> Option<Trampoline> {
    let name = ModuleRelocTarget::user(0, target.as_u32());
    let alignment = u64::from(*crate::store::load::code_alignments(isa)?.start());
    match isa.triple().architecture {
        Architecture::X86_64 => Some(Trampoline {
            // jmp rel32; the displacement is relative to the end of the
            // instruction, hence the addend -4 from the relocated field.
            bytes: vec![0xe9, 0, 0, 0, 0],
            reloc: ModuleReloc {
                offset: 1,
                kind: Reloc::X86CallPCRel4,
                name,
                addend: -4,
            },
            alignment,
        }),
        Architecture::Aarch64(_) => {
            // With branch protection, an indirect call may land only on a
            // landing pad, and every function Cranelift compiles starts
            // with one (`bti c`, or `paciasp`, which is one too:
            // `gen_prologue_frame_setup` in `isa/aarch64/abi.rs`), so the
            // trampoline starts with `bti c` as well.
            let landing_pad = isa.is_branch_protection_enabled();
            let mut bytes = Vec::with_capacity(8);
            if landing_pad {
                bytes.extend_from_slice(&BTI_C.to_le_bytes());
            }
            // b #0; the relocation fills in the 26-bit word offset.
            let offset = bytes.len() as u32;
            bytes.extend_from_slice(&0x1400_0000u32.to_le_bytes());
            Some(Trampoline {
                bytes,
                reloc: ModuleReloc {
                    offset,
                    kind: Reloc::Arm64Call,
                    name,
                    addend: 0,
                },
                alignment,
            })
        }
        _ => None,
    }
}
