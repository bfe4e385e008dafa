//! Reading back the frame descriptions of an ELF object file.

use cranelift_codegen::gimli::{self, UnwindSection};
use cranelift_object::object::read::elf::ElfFile64;
use cranelift_object::object::{self, Object as _, ObjectSection as _, ObjectSymbol as _};

/// An FDE read back: its range in the text section and its instructions.
pub struct Fde {
    /// Where it starts.
    pub start: u64,
    /// How many bytes it covers.
    pub len: u64,
    /// Its call frame instructions, printed.
    pub instructions: Vec<String>,
}

/// The FDEs of `.eh_frame` in `file`, with the relocations of their
/// addresses applied (section-relative to the one text section).
pub fn fdes(file: &ElfFile64<'_, object::Endianness>) -> Vec<Fde> {
    let section = file.section_by_name(".eh_frame").expect("an .eh_frame");
    let mut data = section.data().unwrap().to_vec();
    for (offset, reloc) in section.relocations() {
        let object::RelocationTarget::Symbol(index) = reloc.target() else {
            panic!("{reloc:?}");
        };
        let symbol = file.symbol_by_index(index).unwrap();
        let target = symbol.address() as i64 + reloc.addend();
        let at = offset as usize;
        match (reloc.kind(), reloc.size()) {
            (object::RelocationKind::Absolute, 64) => {
                data[at..at + 8].copy_from_slice(&target.to_le_bytes());
            }
            // pc-relative: S + A - P.
            (object::RelocationKind::Relative, 32) => {
                let value = (target - offset as i64) as i32;
                data[at..at + 4].copy_from_slice(&value.to_le_bytes());
            }
            _ => panic!("{reloc:?}"),
        }
    }
    let eh_frame = gimli::EhFrame::new(&data, gimli::LittleEndian);
    let bases = gimli::BaseAddresses::default().set_eh_frame(0);
    let mut entries = eh_frame.entries(&bases);
    let mut fdes = Vec::new();
    while let Some(entry) = entries.next().unwrap() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial
            .parse(|section, bases, offset| section.cie_from_offset(bases, offset))
            .unwrap();
        let mut instructions = Vec::new();
        let mut iter = fde.instructions(&eh_frame, &bases);
        while let Some(i) = iter.next().unwrap() {
            instructions.push(format!("{i:?}"));
        }
        fdes.push(Fde {
            start: fde.initial_address(),
            len: fde.len(),
            instructions,
        });
    }
    fdes
}

/// How many CIEs `.eh_frame` in `file` has.
pub fn cies(file: &ElfFile64<'_, object::Endianness>) -> usize {
    let section = file.section_by_name(".eh_frame").expect("an .eh_frame");
    let data = section.data().unwrap();
    let eh_frame = gimli::EhFrame::new(data, gimli::LittleEndian);
    let bases = gimli::BaseAddresses::default().set_eh_frame(0);
    let mut entries = eh_frame.entries(&bases);
    let mut cies = 0;
    while let Some(entry) = entries.next().unwrap() {
        cies += usize::from(matches!(entry, gimli::CieOrFde::Cie(_)));
    }
    cies
}
