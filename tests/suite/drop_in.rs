//! Drop-in: one body of client code, written as for `JITModule` (and
//! `ObjectModule`), compiles and runs unchanged against `DedupModule<…>`.
//! Each inherent method of the plain module is pinned to its exact
//! signature (as a function pointer), so a wrapper method whose signature
//! drifts fails to compile here.

use crate::common::build::{call1, define, emit_call, sig};
use cranelift_codegen::ir::{AbiParam, InstBuilder, types::I64};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{
    DataDescription, DataId, FuncId, Linkage, Module, ModuleRelocTarget, ModuleResult,
    default_libcall_names,
};
use cranelift_object::{ObjectBuilder, ObjectModule, ObjectProduct};
use jitfold::DedupModule;

fn jit_builder() -> JITBuilder {
    JITBuilder::new(default_libcall_names()).unwrap()
}

fn object_builder() -> ObjectBuilder {
    let isa = jitfold::isa::isa_by_name("x86_64", jitfold::isa::flags(&[]).unwrap()).unwrap();
    ObjectBuilder::new(isa, "client", default_libcall_names()).unwrap()
}

/// Declares and defines what a small JIT client would: two twins
/// (`x * 3 + 1`), a caller of the second, and a table holding the first's
/// address. Returns (twin a, twin b, caller, table).
fn client_program<M: Module>(m: &mut M) -> (FuncId, FuncId, FuncId, DataId) {
    let mut sig = m.make_signature();
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I64));
    let a = m.declare_function("twin_a", Linkage::Export, &sig).unwrap();
    let b = m.declare_function("twin_b", Linkage::Export, &sig).unwrap();
    let caller = m.declare_function("caller", Linkage::Local, &sig).unwrap();
    for id in [a, b] {
        define(m, id, |b, _, p| {
            let t = b.ins().imul_imm_s(p[0], 3);
            let r = b.ins().iadd_imm_s(t, 1);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    define(m, caller, |fb, m, p| {
        let r = emit_call(fb, m, b, p[0]);
        fb.ins().return_(&[r]);
    })
    .unwrap();
    let table = m
        .declare_data("table", Linkage::Local, false, false)
        .unwrap();
    let mut data = DataDescription::new();
    data.define_zeroinit(8);
    let fref = m.declare_func_in_data(a, &mut data);
    data.write_function_addr(0, fref);
    m.define_data(table, &data).unwrap();
    (a, b, caller, table)
}

/// JIT client code, written for `JITModule` and compiled once per type.
/// Returns what the program computed and the addresses it saw.
macro_rules! jit_client {
    ($M:ty) => {{
        // The inherent API, signature by signature.
        let _: fn(JITBuilder) -> $M = <$M>::new;
        let _: fn(&mut $M) -> ModuleResult<()> = <$M>::finalize_definitions;
        let _: fn(&$M, FuncId) -> *const u8 = <$M>::get_finalized_function;
        let _: fn(&$M, DataId) -> (*const u8, usize) = <$M>::get_finalized_data;
        let _: fn(&$M, &ModuleRelocTarget) -> *const u8 = <$M>::get_address;
        let _: unsafe fn($M) = <$M>::free_memory;

        let mut module = <$M>::new(jit_builder());
        let (a, b, caller, table) = client_program(&mut module);
        module.finalize_definitions().unwrap();
        let code_a = module.get_finalized_function(a);
        let code_b = module.get_finalized_function(b);
        let code_caller = module.get_finalized_function(caller);
        // The usual cast of an entry point to a Rust function pointer.
        // SAFETY: (i64) -> i64 in the host's default convention, finalized.
        let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(code_b) };
        let (table_ptr, table_size) = module.get_finalized_data(table);
        // SAFETY: the table is 8 bytes holding one function address.
        let in_table = unsafe { std::ptr::read_unaligned(table_ptr as *const *const u8) };
        let by_name = module.get_address(&ModuleRelocTarget::user(0, a.as_u32()));
        let results = [
            call1(code_a, 4),
            f(5),
            call1(code_caller, 6),
            call1(in_table, 7),
        ];
        assert_eq!(table_size, 8);
        assert_eq!(in_table, code_a, "the table holds twin_a's address");
        assert_eq!(
            by_name, code_a,
            "get_address agrees with get_finalized_function"
        );
        assert_ne!(code_a, code_b, "two ids, two addresses (by default)");
        // SAFETY: nothing of this module runs or is called afterwards.
        unsafe { module.free_memory() };
        results
    }};
}

/// Object client code, written for `ObjectModule` and compiled once per
/// type. Returns the emitted object's size and the defined functions'
/// symbol names.
macro_rules! object_client {
    ($M:ty) => {{
        let _: fn(ObjectBuilder) -> $M = <$M>::new;
        let _: fn($M) -> ObjectProduct = <$M>::finish;

        let mut module = <$M>::new(object_builder());
        let (a, b, caller, _) = client_program(&mut module);
        let product = module.finish();
        let names: Vec<String> = [a, b, caller]
            .iter()
            .map(|&id| {
                let symbol = product.object.symbol(product.function_symbol(id));
                String::from_utf8_lossy(&symbol.name).into_owned()
            })
            .collect();
        let bytes = product.emit().unwrap();
        (bytes.is_empty(), names)
    }};
}

#[test]
fn jit_client_code_runs_unchanged() {
    let plain = jit_client!(JITModule);
    let dedup = jit_client!(DedupModule<JITModule>);
    assert_eq!(plain, [13, 16, 19, 22]);
    assert_eq!(dedup, plain);
}

#[test]
fn object_client_code_runs_unchanged() {
    let plain = object_client!(ObjectModule);
    let dedup = object_client!(DedupModule<ObjectModule>);
    assert_eq!(
        plain,
        (
            false,
            vec!["twin_a".into(), "twin_b".into(), "caller".into()]
        )
    );
    assert_eq!(dedup, plain);
}

/// Batch mode takes the function out of the context at `define_function`
/// (leaving its name and signature), where eager mode, as plain
/// `JITModule`, compiles it in the context.
#[test]
fn batch_mode_takes_the_function_out_of_the_context() {
    use crate::common::build::{built, declare};
    use cranelift_codegen::isa::CallConv;
    for options in [
        jitfold::DedupOptions::eager(),
        jitfold::DedupOptions::batch(),
    ] {
        let mut m = DedupModule::<JITModule>::with_options(jit_builder(), options);
        let f = declare(&mut m, "f", CallConv::SystemV);
        let mut ctx = m.make_context();
        ctx.func = built(&mut m, f, |b, _, p| {
            let r = b.ins().iadd_imm_s(p[0], 7);
            b.ins().return_(&[r]);
        });
        let (name, sig) = (ctx.func.name.clone(), ctx.func.signature.clone());
        m.define_function(f, &mut ctx).unwrap();
        assert_eq!((&ctx.func.name, &ctx.func.signature), (&name, &sig));
        let blocks = ctx.func.layout.blocks().count();
        assert_eq!(
            blocks == 0,
            options.mode == jitfold::Mode::Batch,
            "{options}"
        );
        m.finalize_definitions().unwrap();
        assert_eq!(call1(m.get_finalized_function(f), 5), 12, "{options}");
    }
}

/// After a definition, the context holds the compiled code of that
/// function if it was compiled then, and none otherwise: a duplicate
/// (nothing compiled) and a definition in batch mode leave
/// `ctx.compiled_code()` `None`, never what an earlier compile in the same
/// context left there.
#[test]
fn the_context_holds_compiled_code_only_of_a_function_compiled_now() {
    use crate::common::build::{built, declare};
    use cranelift_codegen::isa::CallConv;
    let add = |k: i64| {
        move |b: &mut cranelift_frontend::FunctionBuilder, _: &mut _, p: &[_]| {
            let r = b.ins().iadd_imm_s(p[0], k);
            b.ins().return_(&[r]);
        }
    };
    let code_size =
        |ctx: &cranelift_codegen::Context| ctx.compiled_code().map(|c| c.code_info().total_size);
    // Eager: one context for all three, never cleared.
    let mut m = DedupModule::<JITModule>::new(jit_builder());
    let [f, twin, other] = ["f", "twin", "other"].map(|n| declare(&mut m, n, CallConv::SystemV));
    let mut ctx = m.make_context();
    ctx.func = built(&mut m, f, add(7));
    m.define_function(f, &mut ctx).unwrap();
    assert!(code_size(&ctx).is_some_and(|size| size > 0));
    ctx.func = built(&mut m, twin, add(7));
    m.define_function(twin, &mut ctx).unwrap();
    assert_eq!(code_size(&ctx), None, "a duplicate compiles nothing");
    ctx.func = built(&mut m, other, add(8));
    m.define_function(other, &mut ctx).unwrap();
    assert!(code_size(&ctx).is_some_and(|size| size > 0));
    m.finalize_definitions().unwrap();
    assert_eq!(call1(m.get_finalized_function(twin), 5), 12);

    // Batch: the context holds code compiled before the definition.
    let mut m =
        DedupModule::<JITModule>::with_options(jit_builder(), jitfold::DedupOptions::batch());
    let f = declare(&mut m, "f", CallConv::SystemV);
    let mut ctx = m.make_context();
    ctx.func = built(&mut m, f, add(7));
    ctx.compile(m.isa(), &mut Default::default()).unwrap();
    ctx.func = built(&mut m, f, add(7));
    assert!(code_size(&ctx).is_some());
    m.define_function(f, &mut ctx).unwrap();
    assert_eq!(code_size(&ctx), None, "batch mode compiles nothing yet");
    m.finalize_definitions().unwrap();
    assert_eq!(call1(m.get_finalized_function(f), 5), 12);
}

/// A preemptible (weak) function may be replaced at link time by a strong
/// definition elsewhere, so it is never merged with its twin, whichever
/// comes first: calls to it stay calls to it, and its twin runs its own
/// code. A hidden twin defined after it is compiled too (it may not run
/// the weak one's code), and two twins of the weak one still merge.
#[test]
fn a_preemptible_function_is_merged_with_nothing() {
    for options in [
        jitfold::DedupOptions::eager(),
        jitfold::DedupOptions::batch(),
    ] {
        for weak_first in [false, true] {
            let mut m = DedupModule::wrap(ObjectModule::new(object_builder()), options);
            let sig = sig(&m, m.isa().default_call_conv());
            let linkages = if weak_first {
                [Linkage::Preemptible, Linkage::Hidden, Linkage::Hidden]
            } else {
                [Linkage::Hidden, Linkage::Preemptible, Linkage::Hidden]
            };
            let ids = define_twins(&mut m, &linkages, &sig);
            let caller = m.declare_function("caller", Linkage::Hidden, &sig).unwrap();
            let weak = ids[linkages
                .iter()
                .position(|&l| l == Linkage::Preemptible)
                .unwrap()];
            define(&mut m, caller, |fb, m, p| {
                let r = emit_call(fb, m, weak, p[0]);
                fb.ins().return_(&[r]);
            })
            .unwrap();
            m.flush().unwrap();
            let context = format!("{options} weak first {weak_first}");
            assert_eq!(m.canonical(weak), Some(weak), "{context}");
            // The two hidden twins merge, the first being canonical.
            let twins: Vec<FuncId> = ids.iter().copied().filter(|&id| id != weak).collect();
            assert_eq!(m.canonical(twins[0]), Some(twins[0]), "{context}");
            assert_eq!(m.canonical(twins[1]), Some(twins[0]), "{context}");
            assert_eq!(m.stats().compiled, 3, "{context}: {:?}", m.stats());
            assert!(!m.into_inner().finish().emit().unwrap().is_empty());
        }
    }
}

/// Declaring a function preemptible after it was defined (or recorded, in
/// batch mode) is refused: it may already be merged, and cranelift-object
/// would make its symbol weak all the same. Before its definition, the
/// same declaration makes it preemptible, and it is then merged with
/// nothing.
#[test]
fn a_defined_function_cannot_become_preemptible() {
    for options in [
        jitfold::DedupOptions::eager(),
        jitfold::DedupOptions::batch(),
    ] {
        let mut m = DedupModule::wrap(ObjectModule::new(object_builder()), options);
        let sig = sig(&m, m.isa().default_call_conv());
        let ids: Vec<FuncId> = (0..3)
            .map(|i| {
                m.declare_function(&format!("f{i}"), Linkage::Local, &sig)
                    .unwrap()
            })
            .collect();
        for &id in &ids[..2] {
            define(&mut m, id, |b, _, p| {
                let r = b.ins().imul_imm_s(p[0], 3);
                b.ins().return_(&[r]);
            })
            .unwrap();
        }
        let error = m
            .declare_function("f1", Linkage::Preemptible, &sig)
            .unwrap_err();
        assert!(
            matches!(
                jitfold::DedupError::of(&error),
                Some(jitfold::DedupError::PreemptibleAfterDefinition { function }) if function == "f1"
            ),
            "{options}: {error}"
        );
        // Not declared preemptible after all: still local.
        let decl = m.declarations().get_function_decl(ids[1]);
        assert_eq!(decl.linkage, Linkage::Local, "{options}");
        // Before its definition it may.
        assert_eq!(
            m.declare_function("f2", Linkage::Preemptible, &sig)
                .unwrap(),
            ids[2]
        );
        define(&mut m, ids[2], |b, _, p| {
            let r = b.ins().imul_imm_s(p[0], 3);
            b.ins().return_(&[r]);
        })
        .unwrap();
        m.flush().unwrap();
        assert_eq!(m.canonical(ids[1]), Some(ids[0]), "{options}");
        assert_eq!(m.canonical(ids[2]), Some(ids[2]), "{options}");
    }
}

/// Declaring a defined function exported again with another signature is
/// the inner module's `IncompatibleSignature`, as without the wrapper,
/// not the wrapper's refusal to make it exported (found by the API
/// differential test).
#[test]
fn a_declaration_with_another_signature_is_incompatible_before_it_is_refused() {
    for options in [
        jitfold::DedupOptions::eager(),
        jitfold::DedupOptions::batch(),
    ] {
        let mut m = DedupModule::wrap(ObjectModule::new(object_builder()), options);
        let sig = sig(&m, m.isa().default_call_conv());
        define_twins(&mut m, &[Linkage::Local], &sig);
        let mut other = sig.clone();
        other.returns.clear();
        for linkage in [Linkage::Export, Linkage::Preemptible] {
            let error = m.declare_function("f0", linkage, &other).unwrap_err();
            assert!(
                matches!(
                    error,
                    cranelift_module::ModuleError::IncompatibleSignature(..)
                ),
                "{options}: {error}"
            );
        }
    }
}

/// In a JIT nothing replaces the code defined for an id (`JITModule`
/// looks a preemptible name up only while it is undefined): preemptible
/// twins merge like any other, and, as `JITModule` does, the wrapper
/// accepts declaring a defined function preemptible again.
#[test]
fn in_a_jit_preemptible_twins_merge_and_a_defined_function_may_become_preemptible() {
    for options in [
        jitfold::DedupOptions::eager(),
        jitfold::DedupOptions::batch(),
    ] {
        let mut m = DedupModule::wrap(JITModule::new(jit_builder()), options);
        let sig = sig(&m, m.isa().default_call_conv());
        let ids = define_twins(&mut m, &[Linkage::Preemptible, Linkage::Local], &sig);
        assert_eq!(
            m.declare_function("f1", Linkage::Preemptible, &sig)
                .unwrap(),
            ids[1],
            "{options}"
        );
        m.finalize_definitions().unwrap();
        assert_eq!(m.canonical(ids[1]), Some(ids[0]), "{options}");
        assert_eq!(m.stats().compiled, 1, "{options}");
        for &id in &ids {
            assert_eq!(call1(m.get_finalized_function(id), 5), 15, "{options}");
        }
    }
}

/// Declares and defines twins `f0`, `f1`, ... with `linkages` and
/// signature `sig` (one `i64` in and out: they return it times 3).
fn define_twins<M: Module>(
    m: &mut DedupModule<M>,
    linkages: &[Linkage],
    sig: &cranelift_codegen::ir::Signature,
) -> Vec<FuncId> {
    let ids: Vec<FuncId> = linkages
        .iter()
        .enumerate()
        .map(|(i, &linkage)| m.declare_function(&format!("f{i}"), linkage, sig).unwrap())
        .collect();
    for &id in &ids {
        define(m, id, |b, _, p| {
            let r = b.ins().imul_imm_s(p[0], 3);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    ids
}

/// Defines three twins (`f0` to `f2`, with `linkages`) and a caller of
/// the exported one in `m`, flushes, and returns the twins' canonical
/// functions, by index, and the functions compiled.
fn twins_with_an_export<M: Module>(
    m: &mut DedupModule<M>,
    linkages: [Linkage; 3],
) -> ([usize; 3], u64) {
    let sig = sig(m, m.isa().default_call_conv());
    let ids = define_twins(m, &linkages, &sig);
    let exported = ids[linkages.iter().position(|&l| l == Linkage::Export).unwrap()];
    let caller = m.declare_function("caller", Linkage::Hidden, &sig).unwrap();
    define(m, caller, |fb, m, p| {
        let r = emit_call(fb, m, exported, p[0]);
        fb.ins().return_(&[r]);
    })
    .unwrap();
    m.flush().unwrap();
    let canonical = |i: usize| {
        let c = m.canonical(ids[i]).unwrap();
        ids.iter().position(|&id| id == c).unwrap()
    };
    (
        [canonical(0), canonical(1), canonical(2)],
        m.stats().compiled,
    )
}

/// In an object file an exported symbol may be interposed (in a shared
/// library, the dynamic linker may bind it to a definition elsewhere), so
/// an exported function is merged with nothing there: its twins neither
/// run its code nor does it run theirs, whichever comes first, while the
/// other twins still merge. With `interposable_exports` off, and in a JIT
/// (wrapped or not), it merges as any function does.
#[test]
fn an_exported_function_is_merged_with_nothing_where_it_may_be_interposed() {
    use jitfold::DedupOptions;
    let (e, h) = (Linkage::Export, Linkage::Hidden);
    for options in [DedupOptions::eager(), DedupOptions::batch()] {
        for (linkages, alone) in [
            ([e, h, h], [0, 1, 1]),
            ([h, e, h], [0, 1, 0]),
            ([h, h, e], [0, 0, 2]),
        ] {
            let context = format!("{options} {linkages:?}");
            let object = || ObjectModule::new(object_builder());
            let mut m = DedupModule::wrap(object(), options);
            assert_eq!(
                twins_with_an_export(&mut m, linkages),
                (alone, 3),
                "{context}"
            );
            assert!(!m.into_inner().finish().emit().unwrap().is_empty());
            // (`new` makes an eager module.)
            if options == DedupOptions::eager() {
                let mut m = DedupModule::<ObjectModule>::new(object_builder());
                assert_eq!(
                    twins_with_an_export(&mut m, linkages),
                    (alone, 3),
                    "{context}"
                );
            }
            let merged = ([0, 0, 0], 2);
            let kept_apart = options.with_interposable_exports(false);
            let mut m = DedupModule::wrap(object(), kept_apart);
            assert_eq!(twins_with_an_export(&mut m, linkages), merged, "{context}");
            let jit = || JITModule::new(JITBuilder::new(default_libcall_names()).unwrap());
            let mut m = DedupModule::wrap(jit(), options);
            assert_eq!(twins_with_an_export(&mut m, linkages), merged, "{context}");
            let mut m = DedupModule::wrap(jit(), options.with_interposable_exports(true));
            assert_eq!(
                twins_with_an_export(&mut m, linkages),
                (alone, 3),
                "{context}"
            );
        }
    }
}

/// Declaring a defined (or, in batch mode, recorded) local or hidden
/// function exported is refused where exports may be interposed (it may
/// already be merged), and allowed in a JIT.
#[test]
fn a_defined_function_cannot_become_exported_where_exports_may_be_interposed() {
    use jitfold::DedupOptions;
    fn declare_twice<M: Module>(m: &mut DedupModule<M>, first: Linkage) -> ModuleResult<FuncId> {
        let sig = sig(m, m.isa().default_call_conv());
        let id = m.declare_function("f", first, &sig).unwrap();
        define(m, id, |b, _, p| {
            b.ins().return_(&[p[0]]);
        })
        .unwrap();
        m.declare_function("f", Linkage::Export, &sig)
    }
    for options in [DedupOptions::eager(), DedupOptions::batch()] {
        for first in [Linkage::Local, Linkage::Hidden] {
            let context = format!("{options} {first:?}");
            let mut m = DedupModule::wrap(ObjectModule::new(object_builder()), options);
            let error = declare_twice(&mut m, first).unwrap_err();
            assert!(
                matches!(
                    jitfold::DedupError::of(&error),
                    Some(jitfold::DedupError::PreemptibleAfterDefinition { function }) if function == "f"
                ),
                "{context}: {error}"
            );
            let mut m = DedupModule::wrap(JITModule::new(jit_builder()), options);
            assert!(declare_twice(&mut m, first).is_ok(), "{context}");
        }
    }
    let mut m = DedupModule::<ObjectModule>::new(object_builder());
    assert!(declare_twice(&mut m, Linkage::Local).is_err());
    let mut m = DedupModule::<JITModule>::new(jit_builder());
    assert!(declare_twice(&mut m, Linkage::Local).is_ok());
}

/// Both module kinds have the same constructors from their builders, and a
/// call names no type: the builder decides the module.
#[test]
fn both_module_kinds_are_made_from_their_builders_with_options() {
    let options = jitfold::DedupOptions::batch().with_reuse(false);
    let jit = DedupModule::with_options(jit_builder(), options);
    let object = DedupModule::with_options(object_builder(), options);
    let _: &DedupModule<JITModule> = &jit;
    let _: &DedupModule<ObjectModule> = &object;
    assert_eq!(jit.options(), options);
    assert_eq!(object.options(), options);
    let pinned: fn(ObjectBuilder, jitfold::DedupOptions) -> DedupModule<ObjectModule> =
        DedupModule::with_options;
    let _ = pinned;
}

/// A function whose name table holds an entry no declaration refers to
/// (of any namespace and index, `u32::MAX` among them, which is no
/// `FuncId`) names nothing by it: `JITModule` compiles it, and so does
/// `DedupModule`, eager and in batch, alone and after a twin of it (the
/// entry aside) was defined.
#[test]
fn an_entry_of_the_name_table_no_declaration_refers_to_is_no_reference() {
    use crate::common::build::declare;
    use cranelift_codegen::ir::{Function, UserExternalName};
    use cranelift_codegen::isa::CallConv;
    use cranelift_frontend::FunctionBuilder;
    /// `x + 7`, with `unused` in the name table, if any.
    fn body<M: Module>(
        unused: Option<UserExternalName>,
    ) -> impl FnOnce(&mut FunctionBuilder, &mut M, &[cranelift_codegen::ir::Value]) {
        move |b, _, p| {
            if let Some(name) = unused {
                let func: &mut Function = b.func;
                func.declare_imported_user_function(name);
            }
            let r = b.ins().iadd_imm_s(p[0], 7);
            b.ins().return_(&[r]);
        }
    }
    for (namespace, index) in [(1, u32::MAX), (0, u32::MAX), (0, 100_000)] {
        let unused = Some(UserExternalName::new(namespace, index));
        let mut plain = JITModule::new(jit_builder());
        let id = declare(&mut plain, "f", CallConv::SystemV);
        define(&mut plain, id, body(unused.clone())).unwrap();
        for options in [
            jitfold::DedupOptions::eager(),
            jitfold::DedupOptions::batch(),
        ] {
            for twin in [false, true] {
                let mut m = DedupModule::with_options(jit_builder(), options);
                let mut ids = Vec::new();
                if twin {
                    ids.push(declare(&mut m, "twin", CallConv::SystemV));
                    define(&mut m, ids[0], body(None)).unwrap();
                }
                let f = declare(&mut m, "f", CallConv::SystemV);
                ids.push(f);
                define(&mut m, f, body(unused.clone())).unwrap();
                m.finalize_definitions().unwrap();
                for &id in &ids {
                    let code = m.get_finalized_function(id);
                    assert_eq!(call1(code, 5), 12, "u{namespace}:{index}, {options:?}");
                }
            }
        }
    }
}
