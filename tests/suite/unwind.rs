//! Unwind information in object files: with `ObjectBuilder::unwind_info`,
//! every defined function's address is covered by an FDE of the object's
//! `.eh_frame`, whatever jitfold made of it (compiled, reused code,
//! trampoline, alias, adapter), with reuse on and off; reused code has its
//! template's frame description.

use crate::common::build::{define, emit_call, twelve_steps};
use crate::common::eh_frame::{self, Fde};
use cranelift_codegen::ir::{AbiParam, InstBuilder, Signature, types::I64};
use cranelift_codegen::isa::CallConv;
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use cranelift_object::object::read::elf::ElfFile64;
use cranelift_object::object::{self, Object as _, ObjectSymbol as _};
use cranelift_object::{ObjectBuilder, ObjectModule};
use jitfold::{DedupModule, DedupOptions, Mode};
use std::collections::HashMap;

/// Functions that leave a frame to describe (they call), twins, callers
/// with one template (`call_b` reuses `call_a`'s code), and a function in
/// another calling convention. Returns every id.
fn program<M: Module>(m: &mut M) -> Vec<FuncId> {
    let conv = m.isa().default_call_conv();
    let sig = |conv: CallConv| {
        let mut s = Signature::new(conv);
        s.params.push(AbiParam::new(I64));
        s.returns.push(AbiParam::new(I64));
        s
    };
    let declare = |m: &mut M, name: &str, conv: CallConv| {
        m.declare_function(name, Linkage::Hidden, &sig(conv))
            .unwrap()
    };
    let [leaf_a, leaf_b, twin_a, twin_b, call_a, call_b] =
        ["leaf_a", "leaf_b", "twin_a", "twin_b", "call_a", "call_b"].map(|n| declare(m, n, conv));
    let [big_sysv, big_tail] = [
        ("big_sysv", CallConv::SystemV),
        ("big_tail", CallConv::Tail),
    ]
    .map(|(n, c)| declare(m, n, c));
    for (f, k) in [(leaf_a, 1), (leaf_b, 2)] {
        define(m, f, |b, _, p| {
            let r = b.ins().iadd_imm_s(p[0], k);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    // Twins that call (so they have a frame).
    for f in [twin_a, twin_b] {
        define(m, f, |b, m, p| {
            let r = emit_call(b, m, leaf_a, p[0]);
            let r = emit_call(b, m, leaf_a, r);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    // One template, other callees.
    for (f, leaf) in [(call_a, leaf_a), (call_b, leaf_b)] {
        define(m, f, |b, m, p| {
            let r = emit_call(b, m, leaf, p[0]);
            let r = b.ins().imul(r, p[0]);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    for f in [big_sysv, big_tail] {
        define(m, f, |b, _, p| {
            let r = twelve_steps(b, p[0]);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    vec![
        leaf_a, leaf_b, twin_a, twin_b, call_a, call_b, big_sysv, big_tail,
    ]
}

/// The FDEs of `.eh_frame` in the ELF object `bytes` (see
/// [`eh_frame::fdes`]), and the address of each symbol by name.
fn read_frames(bytes: &[u8]) -> (Vec<Fde>, HashMap<String, u64>) {
    let file = ElfFile64::<object::Endianness>::parse(bytes).unwrap();
    let fdes = eh_frame::fdes(&file);
    // One CIE, which every FDE shares, as `ObjectModule` alone writes.
    assert_eq!(eh_frame::cies(&file), 1);
    let symbols = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text)
        .map(|s| (s.name().unwrap().to_string(), s.address()))
        .collect();
    (fdes, symbols)
}

fn object_module(isa: &str) -> ObjectModule {
    let isa = jitfold::isa::isa_by_name(isa, jitfold::isa::flags(&[]).unwrap()).unwrap();
    let mut builder = ObjectBuilder::new(isa, "unwind", default_libcall_names()).unwrap();
    builder.unwind_info(true);
    ObjectModule::new(builder)
}

#[test]
fn every_function_is_covered_by_an_fde() {
    for isa in ["x86_64", "aarch64"] {
        covered_on(isa);
    }
}

fn covered_on(isa: &str) {
    // Plain ObjectModule first: every function has an FDE.
    let mut plain = object_module(isa);
    program(&mut plain);
    let (fdes, symbols) = read_frames(&plain.finish().emit().unwrap());
    assert_eq!(fdes.len(), 8);
    assert_eq!(symbols.len(), 8);

    let mut all = DedupOptions::ALL.to_vec();
    for (mode, distinct_addresses, reuse) in [
        (Mode::Eager, true, true),
        (Mode::Eager, true, false),
        (Mode::Eager, false, true),
        (Mode::Batch, false, false),
    ] {
        all.push(
            DedupOptions::default()
                .with_mode(mode)
                .with_distinct_addresses(distinct_addresses)
                .with_reuse(reuse)
                .with_check(false),
        );
    }
    for options in all {
        let mut d = DedupModule::wrap(object_module(isa), options);
        let ids = program(&mut d);
        assert_covered(isa, options, d, &ids);
    }
}

/// With a code store (entries keep unwind information: feature
/// `store-unwind`), code loaded from it is described as compiled code is,
/// with or without reuse, in a warm module.
#[cfg(feature = "store-unwind")]
#[test]
fn code_from_a_store_is_covered_by_an_fde() {
    use jitfold::store::{CodeStore, MemoryStore};
    use std::sync::Arc;
    for isa in ["x86_64", "aarch64"] {
        for options in [
            DedupOptions::default(),
            DedupOptions::default().with_reuse(false),
            DedupOptions::batch().with_distinct_addresses(false),
        ] {
            let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
            let mut cold =
                DedupModule::wrap(object_module(isa), options).with_store(store.clone(), None);
            program(&mut cold);
            cold.flush().unwrap();
            drop(cold);
            let mut warm = DedupModule::wrap(object_module(isa), options).with_store(store, None);
            let ids = program(&mut warm);
            warm.flush().unwrap();
            assert!(warm.stats().loaded > 0, "{isa} {options}: {}", warm.stats());
            assert_eq!(
                warm.stats().compiled,
                0,
                "{isa} {options}: {}",
                warm.stats()
            );
            assert_covered(isa, options, warm, &ids);
        }
    }
}

/// Every function of `d` (`ids`, `program`'s) is covered by exactly one
/// FDE in its object file; with eager reuse, the copy is described as its
/// template is.
fn assert_covered(isa: &str, options: DedupOptions, d: DedupModule<ObjectModule>, ids: &[FuncId]) {
    let stats = d.stats().clone();
    let names: Vec<String> = ids
        .iter()
        .map(|&id| {
            d.declarations()
                .get_function_decl(id)
                .linkage_name(id)
                .into_owned()
        })
        .collect();
    let (fdes, symbols) = read_frames(&d.finish().emit().unwrap());
    let covering = |address: u64| {
        fdes.iter()
            .filter(|f| f.start <= address && address < f.start + f.len)
            .collect::<Vec<_>>()
    };
    for name in &names {
        let address = symbols[name];
        assert_eq!(
            covering(address).len(),
            1,
            "{isa} {options:?}: {name} at {address:#x} is covered by one FDE ({stats:?})"
        );
    }
    if options.reuse && options.mode == Mode::Eager {
        assert_eq!(stats.reused, 1, "{options:?}");
        // The copy is described as its template is.
        let template = &covering(symbols["call_a"])[0];
        let reused = &covering(symbols["call_b"])[0];
        assert_eq!(reused.start, symbols["call_b"]);
        assert_eq!(reused.len, template.len);
        assert!(!template.instructions.is_empty());
        assert_eq!(reused.instructions, template.instructions, "{options:?}");
    }
}
