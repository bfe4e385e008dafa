//! Frame descriptions for the code jitfold defines from bytes, in object
//! files with unwind information.
//!
//! `ObjectModule` (with `ObjectBuilder::unwind_info(true)`) writes an FDE
//! for every function it compiles, and none for functions defined from
//! bytes. jitfold defines three kinds of function from bytes: reused code,
//! trampolines, and code compiled on the threads of a batch flush (see
//! `parallel.rs`). This module writes their FDEs, appended to the same
//! `.eh_frame` section, under the inner module's CIE (see 6).
//!
//! # What this module guarantees
//!
//! 1. Reused code is a byte-for-byte copy of its template's code, so its
//!    frame description is the template's: the unwind information Cranelift
//!    computed when the template was compiled, over the copy's own range.
//! 2. A trampoline is one jump executed at function entry: nothing is
//!    pushed, no register changes, and nothing is called from it, so no
//!    return address ever points into it. The only way to unwind from it
//!    is from an interrupted PC on the jump itself (a signal, a profiler's
//!    sample), where the frame is exactly the one at function entry, which
//!    is what the CIE's initial instructions describe. Its FDE therefore
//!    has no instructions, and covers its bytes.
//! 3. A duplicate that shares its canonical function's address has its
//!    symbol inside the canonical function's range, which the canonical
//!    function's FDE covers (its trampoline stays unnamed and unreachable).
//!    Adapters and tail trampolines are compiled by the inner module, which
//!    writes their FDEs.
//! 4. Nothing is written when the object has no `.eh_frame` data of the
//!    inner module's (unwind information was not asked for; the section
//!    may then be left empty) or the ISA has no System V CIE. (A parallel
//!    flush leaves a module's first compile to the inner module, so that
//!    this tells.) Functions the user defines from bytes get no FDE, as in
//!    plain `ObjectModule`.
//! 5. Code compiled on a thread of a batch flush has the unwind information
//!    Cranelift computed for it, which is what the inner module would have
//!    written: every function is described as in a one-thread flush, but
//!    its FDE comes after the inner module's FDEs, so the bytes of
//!    `.eh_frame` are laid out differently (the code is not). Without
//!    unwind information the object is the one-thread object: where a
//!    one-thread flush has no frames to write (neither reused code nor
//!    trampolines), the section is looked for without being created,
//!    at the cost of writing the object once more.
//! 6. One CIE for the whole section, as `ObjectModule` alone writes: the
//!    CIE written here is the one the inner module wrote first in the
//!    section (both are the ISA's System V CIE), so the FDEs are appended
//!    without it, each pointing to the inner module's. Should the two
//!    ever differ, this CIE is appended too, and the FDEs point to it.

use super::frames::Frame;
use super::reuse::CodeTemplate;
use cranelift_codegen::gimli::write::{
    Address, CommonInformationEntry, EhFrame, EndianVec, FrameDescriptionEntry, FrameTable,
    RelocateWriter, Relocation, RelocationTarget,
};
use cranelift_codegen::gimli::{self, RunTimeEndian};
use cranelift_codegen::ir;
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::isa::unwind::UnwindInfo;
use cranelift_module::{FuncId, ModuleError, ModuleResult};
use cranelift_object::ObjectProduct;
use cranelift_object::object::write::{self, SymbolId};
use cranelift_object::object::{RelocationEncoding, RelocationFlags, RelocationKind};

/// What writing frames needs of the ISA, taken before the inner module is
/// finished (which consumes it).
pub(super) struct Target {
    cie: Option<CommonInformationEntry>,
    pointer_bytes: u8,
    endianness: ir::Endianness,
}

impl Target {
    /// The System V CIE and pointer size of `isa`.
    pub(super) fn of(isa: &dyn TargetIsa) -> Self {
        Self {
            cie: isa.create_systemv_cie(),
            pointer_bytes: isa.pointer_bytes(),
            endianness: isa.endianness(),
        }
    }
}

/// The `.eh_frame` section being written, with its relocations.
struct Section {
    writer: EndianVec<RunTimeEndian>,
    relocations: Vec<Relocation>,
}

impl RelocateWriter for Section {
    type Writer = EndianVec<RunTimeEndian>;

    fn writer(&self) -> &Self::Writer {
        &self.writer
    }

    fn writer_mut(&mut self) -> &mut Self::Writer {
        &mut self.writer
    }

    fn relocate(&mut self, relocation: Relocation) {
        self.relocations.push(relocation);
    }
}

/// The FDE of one function at `address`, or `None` when its unwind
/// information is not System V (another section format describes it).
fn fde(
    frame: Frame,
    templates: &[CodeTemplate],
    own: &[UnwindInfo],
    address: Address,
) -> Option<FrameDescriptionEntry> {
    let unwind = match frame {
        Frame::Entry(len) => return Some(FrameDescriptionEntry::new(address, len)),
        Frame::Template(index) => templates.get(index)?.unwind.as_ref()?,
        Frame::Own(index) => own.get(index)?,
    };
    match unwind {
        UnwindInfo::SystemV(info) => Some(info.to_fde(address)),
        UnwindInfo::WindowsX64(_) | UnwindInfo::WindowsArm64(_) => None,
        // `UnwindInfo` is `#[non_exhaustive]`: a kind added later is not
        // System V either.
        _ => None,
    }
}

/// Appends to `product`'s `.eh_frame` section one CIE and an FDE for each
/// of `frames` (see the module docs), if the section has the inner
/// module's data; `templates` are the module's code templates, `own` the
/// unwind information of [`Frame::Own`] frames.
pub(super) fn write_frames(
    product: &mut ObjectProduct,
    target: &Target,
    frames: &[(FuncId, Frame)],
    templates: &[CodeTemplate],
    own: &[UnwindInfo],
) -> ModuleResult<()> {
    if frames.is_empty() {
        return Ok(());
    }
    let Some(cie) = target.cie.clone() else {
        return Ok(());
    };
    // Looking the section up creates it where it is missing. Where a
    // one-thread flush would have had no frames to write (all are of code
    // compiled on a flush's threads), it does not look, so neither does
    // this unless the section is there (see 5 above).
    let own_only = frames.iter().all(|(_, f)| matches!(f, Frame::Own(_)));
    if own_only && !has_eh_frame_data(&product.object)? {
        return Ok(());
    }
    let Some(section_id) = existing_eh_frame(&mut product.object) else {
        return Ok(());
    };
    let mut table = FrameTable::default();
    let cie = table.add_cie(cie);
    let mut symbols: Vec<SymbolId> = Vec::new();
    for &(id, frame) in frames {
        let Some((symbol, _)) = product.functions[id] else {
            continue;
        };
        let address = Address::Symbol {
            symbol: symbols.len(),
            addend: 0,
        };
        if let Some(fde) = fde(frame, templates, own, address) {
            symbols.push(symbol);
            table.add_fde(cie, fde);
        }
    }
    if symbols.is_empty() {
        return Ok(());
    }
    let endian = match target.endianness {
        ir::Endianness::Little => RunTimeEndian::Little,
        ir::Endianness::Big => RunTimeEndian::Big,
    };
    let mut eh_frame = EhFrame(Section {
        writer: EndianVec::new(endian),
        relocations: Vec::new(),
    });
    table
        .write_eh_frame(&mut eh_frame)
        .map_err(|e| backend(format!("cannot write .eh_frame: {e}")))?;
    let EhFrame(section) = eh_frame;
    let mut bytes = section.writer.into_vec();
    // Where the inner module's CIE (first in the section) is the one
    // written here, the FDEs alone are appended, pointing to it (see 6
    // above).
    let align = u64::from(target.pointer_bytes);
    let existing = product.object.section(section_id).data();
    let shared_cie =
        entry_len(&bytes, endian).filter(|&len| existing.get(..len) == bytes.get(..len));
    let base = (existing.len() as u64).next_multiple_of(align);
    let skipped = shared_cie.unwrap_or(0);
    if shared_cie.is_some() {
        bytes.drain(..skipped);
        point_fdes_to_first_cie(&mut bytes, base, endian)?;
    }
    let appended = product
        .object
        .append_section_data(section_id, &bytes, align);
    if appended != base {
        return Err(backend(format!(
            ".eh_frame data appended at {appended}, not at {base}"
        )));
    }
    for mut relocation in section.relocations {
        relocation.offset -= skipped;
        let RelocationTarget::Symbol(index) = relocation.target else {
            // The writer makes section-relative relocations only for
            // debugging sections, never for `.eh_frame`.
            continue;
        };
        let kind = match relocation.eh_pe.map(|pe| pe.application()) {
            Some(gimli::DW_EH_PE_pcrel) => RelocationKind::Relative,
            None | Some(gimli::DW_EH_PE_absptr) => RelocationKind::Absolute,
            Some(other) => {
                return Err(backend(format!(
                    "unsupported .eh_frame pointer encoding {other}"
                )));
            }
        };
        product
            .object
            .add_relocation(
                section_id,
                write::Relocation {
                    offset: base + relocation.offset as u64,
                    symbol: symbols[index],
                    addend: relocation.addend,
                    flags: RelocationFlags::Generic {
                        kind,
                        encoding: RelocationEncoding::Generic,
                        size: relocation.size * 8,
                    },
                },
            )
            .map_err(|e| backend(format!("cannot relocate .eh_frame: {e}")))?;
    }
    Ok(())
}

/// The length of the entry (CIE or FDE) at the start of `bytes`, length
/// field included, as gimli writes `.eh_frame` entries (32-bit DWARF).
fn entry_len(bytes: &[u8], endian: RunTimeEndian) -> Option<usize> {
    let field: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
    let len = match endian {
        RunTimeEndian::Little => u32::from_le_bytes(field),
        RunTimeEndian::Big => u32::from_be_bytes(field),
    };
    // 0xffff_ffff would announce 64-bit DWARF, which gimli does not
    // write here.
    (len < 0xffff_fff0).then(|| 4 + len as usize)
}

/// Makes each FDE of `fdes` (FDEs only, to be appended at offset `base`
/// of `.eh_frame`) point to the section's first CIE, at offset 0: an
/// FDE's CIE pointer is the distance back from the pointer to its CIE.
fn point_fdes_to_first_cie(fdes: &mut [u8], base: u64, endian: RunTimeEndian) -> ModuleResult<()> {
    let mut at = 0;
    while at < fdes.len() {
        let len = entry_len(&fdes[at..], endian)
            .filter(|&len| len >= 8 && at + len <= fdes.len())
            .ok_or_else(|| backend(format!("a malformed .eh_frame entry at {at}")))?;
        let distance = u32::try_from(base + at as u64 + 4)
            .map_err(|_| backend(".eh_frame beyond 4 GiB".to_string()))?;
        let pointer = match endian {
            RunTimeEndian::Little => distance.to_le_bytes(),
            RunTimeEndian::Big => distance.to_be_bytes(),
        };
        fdes[at + 4..at + 8].copy_from_slice(&pointer);
        at += len;
    }
    Ok(())
}

/// The `.eh_frame` section, if the inner module wrote data into it.
/// (`object` can only look a standard section up by creating it, so where
/// the inner module wrote none, the object gains an empty `.eh_frame`,
/// which linkers ignore.)
fn existing_eh_frame(object: &mut write::Object<'_>) -> Option<write::SectionId> {
    let id = object.section_id(write::StandardSection::EhFrame);
    (!object.section(id).data().is_empty()).then_some(id)
}

/// Whether `object` has a `.eh_frame` section with data, found without
/// creating one (`object` cannot look a section up otherwise): by writing
/// the object and reading it back.
fn has_eh_frame_data(object: &write::Object<'_>) -> ModuleResult<bool> {
    use cranelift_object::object::{Object as _, ObjectSection as _};
    let bytes = object
        .write()
        .map_err(|e| backend(format!("cannot write the object: {e}")))?;
    let file = cranelift_object::object::File::parse(&*bytes)
        .map_err(|e| backend(format!("cannot read the object back: {e}")))?;
    Ok(file.sections().any(|section| {
        matches!(section.name(), Ok(".eh_frame" | "__eh_frame")) && section.size() > 0
    }))
}

fn backend(message: String) -> ModuleError {
    ModuleError::Backend(anyhow::anyhow!(message))
}
