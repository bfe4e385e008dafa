//! `DedupModule` over `ObjectModule` for other ISAs than the host's: aarch64
//! gets `b` trampolines; an ISA without a trampoline form compiles every
//! function instead of failing.

#![cfg(feature = "all-targets")]

use cranelift_codegen::ir::{AbiParam, InstBuilder, types::I64};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use cranelift_object::{ObjectBuilder, ObjectModule, ObjectProduct};
use jitfold::{DedupModule, DedupOptions, Mode};

fn object_module(isa: &str) -> ObjectModule {
    let isa = jitfold::isa::isa_by_name(isa, jitfold::isa::flags(&[]).unwrap()).unwrap();
    ObjectModule::new(ObjectBuilder::new(isa, "twins", default_libcall_names()).unwrap())
}

/// Defines three functions, the first two twins; returns their ids.
fn define_twins<M: Module>(m: &mut M) -> [FuncId; 3] {
    let conv = m.isa().default_call_conv();
    define_twins_with(m, conv)
}

/// [`define_twins`] with calling convention `conv`.
fn define_twins_with<M: Module>(m: &mut M, conv: CallConv) -> [FuncId; 3] {
    let mut sig = m.make_signature();
    sig.call_conv = conv;
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I64));
    let mut ids = [FuncId::from_u32(0); 3];
    for (i, (name, k)) in [("twin_a", 5), ("twin_b", 5), ("other", 6)]
        .into_iter()
        .enumerate()
    {
        let id = m.declare_function(name, Linkage::Hidden, &sig).unwrap();
        let mut ctx = m.make_context();
        ctx.func.signature = sig.clone();
        let mut fctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        if i == 1 {
            b.create_block(); // renumber the blocks
        }
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let x = b.block_params(entry)[0];
        let r = b.ins().imul_imm_s(x, k);
        b.ins().return_(&[r]);
        b.seal_all_blocks();
        b.finalize(m.target_config());
        m.define_function(id, &mut ctx).unwrap();
        ids[i] = id;
    }
    ids
}

#[test]
fn aarch64_duplicates_become_branch_trampolines() {
    for mode in [Mode::Eager, Mode::Batch] {
        let mut m = DedupModule::wrap(
            object_module("aarch64"),
            DedupOptions::default()
                .with_mode(mode)
                .with_distinct_addresses(false)
                .with_check(true),
        );
        let ids = define_twins(&mut m);
        m.flush().unwrap();
        assert_eq!(m.stats().compiled, 2, "{mode:?}");
        assert_eq!(m.stats().aliased, 1);
        assert_eq!(m.stats().trampoline_bytes, 4, "one `b` instruction");
        assert_eq!(m.canonical(ids[1]), Some(ids[0]));
        assert_every_symbol_emitted(m.into_inner().finish(), ids);
    }
}

/// With branch protection (`use_bti`), every function Cranelift compiles
/// for aarch64 starts with a landing pad (`bti c`), where calls through a
/// register may land; a duplicate's trampoline must too, or calling it
/// through its address faults on hardware that enforces it.
#[test]
fn aarch64_trampolines_have_a_landing_pad_with_branch_protection() {
    const BTI_C: [u8; 4] = 0xd503_245fu32.to_le_bytes();
    for bti in [false, true] {
        let mut isa = cranelift_codegen::isa::lookup_by_name("aarch64").unwrap();
        if bti {
            cranelift_codegen::settings::Configurable::enable(&mut isa, "use_bti").unwrap();
        }
        let flags = cranelift_codegen::settings::Flags::new(cranelift_codegen::settings::builder());
        let isa = isa.finish(flags).unwrap();
        let inner =
            ObjectModule::new(ObjectBuilder::new(isa, "bti", default_libcall_names()).unwrap());
        let mut m = DedupModule::wrap(inner, DedupOptions::default());
        let ids = define_twins(&mut m);
        m.flush().unwrap();
        assert_eq!(m.stats().trampolined, 1, "bti {bti}");
        let product = m.into_inner().finish();
        let code = |id: FuncId| {
            let (symbol, _) = product.functions[id].unwrap();
            let symbol = product.object.symbol(symbol);
            let data = product.object.section(symbol.section.id().unwrap()).data();
            data[symbol.value as usize..][..symbol.size as usize].to_vec()
        };
        let (compiled, trampoline) = (code(ids[0]), code(ids[1]));
        // The compiled function shows what Cranelift does.
        assert_eq!(compiled.starts_with(&BTI_C), bti, "bti {bti}");
        assert_eq!(trampoline.starts_with(&BTI_C), bti, "bti {bti}");
        assert_eq!(trampoline.len(), if bti { 8 } else { 4 }, "bti {bti}");
        // Then `b` (opcode 0b000101 in the top six bits).
        let branch = u32::from_le_bytes(trampoline[trampoline.len() - 4..].try_into().unwrap());
        assert_eq!(branch >> 26, 0b000101, "bti {bti}");
    }
}

/// A `DedupModule` over an riscv64 object (an ISA without a trampoline
/// form), shared addresses.
fn riscv64(mode: Mode, reuse: bool) -> DedupModule<ObjectModule> {
    DedupModule::wrap(
        object_module("riscv64"),
        DedupOptions::default()
            .with_mode(mode)
            .with_distinct_addresses(false)
            .with_reuse(reuse)
            .with_check(true),
    )
}

/// Every function keeps its symbol, and the object is written.
fn assert_every_symbol_emitted(product: ObjectProduct, ids: [FuncId; 3]) {
    for id in ids {
        assert!(product.functions[id].is_some());
    }
    assert!(!product.emit().unwrap().is_empty());
}

#[test]
fn isas_without_a_trampoline_form_copy_or_compile_duplicates() {
    for mode in [Mode::Eager, Mode::Batch] {
        for reuse in [true, false] {
            let mut m = riscv64(mode, reuse);
            let ids = define_twins(&mut m);
            m.flush().unwrap();
            let s = m.stats();
            // No trampoline can stand for the duplicate: with reuse it gets a
            // copy of its twin's code, without it is compiled again.
            assert_eq!(s.compiled, if reuse { 2 } else { 3 }, "{mode:?}: {s:?}");
            assert_eq!(s.reused, u64::from(reuse), "{mode:?}: {s:?}");
            assert_eq!(s.aliased + s.trampolined, 0);
            assert_eq!(m.canonical(ids[1]), Some(ids[1]));
            assert_every_symbol_emitted(m.into_inner().finish(), ids);
        }
    }
}

#[test]
fn tail_duplicates_without_a_trampoline_form_tail_call_their_twin() {
    for mode in [Mode::Eager, Mode::Batch] {
        for reuse in [true, false] {
            let mut m = riscv64(mode, reuse);
            let ids = define_twins_with(&mut m, CallConv::Tail);
            m.flush().unwrap();
            let s = m.stats();
            // A `return_call` stands for the duplicate: nothing copied or
            // compiled again.
            assert_eq!(s.compiled, 2, "{mode:?} {reuse}: {s:?}");
            assert_eq!(s.reused, 0, "{mode:?} {reuse}: {s:?}");
            assert_eq!(s.aliased, 1, "{mode:?} {reuse}: {s:?}");
            assert!(s.trampoline_bytes > 0);
            assert_eq!(m.canonical(ids[1]), Some(ids[0]));
            assert_every_symbol_emitted(m.finish(), ids);
        }
    }
}
