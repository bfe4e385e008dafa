//! Errors a caller can match: each misuse gives the error kind plain
//! `JITModule` gives (or, where `JITModule` panics or accepts it, a
//! documented kind), and jitfold's own failures are a `DedupError` inside
//! `ModuleError::Backend`.

use crate::common;

use crate::common::build::{call1, define, tail_caller};
use cranelift_codegen::CodegenError;
use cranelift_codegen::ir::{AbiParam, InstBuilder, types::I32, types::I64};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{DataId, FuncId, Linkage, Module, ModuleError, default_libcall_names};
use jitfold::{DedupError, DedupModule, DedupOptions, Mode};
use std::panic::{AssertUnwindSafe, catch_unwind};

fn jit() -> JITModule {
    JITModule::new(JITBuilder::new(default_libcall_names()).unwrap())
}

/// The plain module, then a `DedupModule` in each mode.
fn modules(mut each: impl FnMut(&mut dyn FnMut() -> Box<dyn AnyModule>, &str)) {
    each(&mut || Box::new(jit()), "plain");
    for mode in [Mode::Eager, Mode::Batch] {
        let options = DedupOptions::default().with_mode(mode);
        each(
            &mut || Box::new(DedupModule::wrap(jit(), options)),
            &format!("{mode:?}"),
        );
    }
}

/// What the tests need of both module types.
trait AnyModule {
    fn module(&mut self) -> &mut dyn ModuleDyn;
    fn finalize(&mut self) -> Result<(), ModuleError>;
    fn pointer(&self, id: FuncId) -> *const u8;
}

/// `Module` is not object safe; the tests use it through this.
trait ModuleDyn {
    fn declare(&mut self, name: &str, returns_i32: bool) -> FuncId;
    fn define_add(&mut self, id: FuncId, k: i64) -> Result<(), ModuleError>;
    fn define_mistyped(&mut self, id: FuncId) -> Result<(), ModuleError>;
}

impl<M: Module> ModuleDyn for M {
    fn declare(&mut self, name: &str, returns_i32: bool) -> FuncId {
        let mut sig = self.make_signature();
        sig.params.push(AbiParam::new(I64));
        sig.returns
            .push(AbiParam::new(if returns_i32 { I32 } else { I64 }));
        self.declare_function(name, Linkage::Local, &sig).unwrap()
    }
    fn define_add(&mut self, id: FuncId, k: i64) -> Result<(), ModuleError> {
        // Always (i64) -> i64, whatever `id` was declared with.
        let mut ctx = self.make_context();
        ctx.func.signature = self.make_signature();
        ctx.func.signature.params.push(AbiParam::new(I64));
        ctx.func.signature.returns.push(AbiParam::new(I64));
        let mut fctx = cranelift_frontend::FunctionBuilderContext::new();
        let mut b = cranelift_frontend::FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let x = b.block_params(entry)[0];
        let r = b.ins().iadd_imm_s(x, k);
        b.ins().return_(&[r]);
        b.seal_all_blocks();
        b.finalize(self.target_config());
        self.define_function(id, &mut ctx)
    }
    fn define_mistyped(&mut self, id: FuncId) -> Result<(), ModuleError> {
        define(self, id, |b, _, p| {
            let narrow = b.ins().iconst(I32, 1);
            let bad = b.ins().iadd(p[0], narrow);
            b.ins().return_(&[bad]);
        })
    }
}

impl AnyModule for JITModule {
    fn module(&mut self) -> &mut dyn ModuleDyn {
        self
    }
    fn finalize(&mut self) -> Result<(), ModuleError> {
        self.finalize_definitions()
    }
    fn pointer(&self, id: FuncId) -> *const u8 {
        self.get_finalized_function(id)
    }
}

impl AnyModule for DedupModule<JITModule> {
    fn module(&mut self) -> &mut dyn ModuleDyn {
        self
    }
    fn finalize(&mut self) -> Result<(), ModuleError> {
        self.finalize_definitions()
    }
    fn pointer(&self, id: FuncId) -> *const u8 {
        self.get_finalized_function(id)
    }
}

#[test]
fn defining_twice_is_a_duplicate_definition() {
    modules(|make, label| {
        let mut m = make();
        let f = m.module().declare("f", false);
        m.module().define_add(f, 1).unwrap();
        let again = m.module().define_add(f, 2);
        assert!(
            matches!(&again, Err(ModuleError::DuplicateDefinition(name)) if name == "f"),
            "{label}: {again:?}"
        );
    });
}

#[test]
fn defining_after_finalize_is_a_duplicate_definition_for_the_same_id_only() {
    modules(|make, label| {
        let mut m = make();
        let f = m.module().declare("f", false);
        let g = m.module().declare("g", false);
        m.module().define_add(f, 1).unwrap();
        m.finalize().unwrap();
        let again = m.module().define_add(f, 2);
        assert!(
            matches!(&again, Err(ModuleError::DuplicateDefinition(name)) if name == "f"),
            "{label}: {again:?}"
        );
        m.module().define_add(g, 2).unwrap();
        m.finalize().unwrap();
    });
}

/// `JITModule` compiles a function whose signature is not the declared one
/// (cranelift-module refuses another signature only when a name is
/// declared again), and so does jitfold, in every mode; the function then
/// returns what it was defined to return.
#[test]
fn a_signature_other_than_the_declared_one_is_accepted() {
    modules(|make, label| {
        let mut m = make();
        let f = m.module().declare("f", true);
        let result = m.module().define_add(f, 1);
        assert!(result.is_ok(), "{label}: {result:?}");
        m.finalize().unwrap();
        assert_eq!(call1(m.pointer(f), 41), 42, "{label}");
    });
}

#[test]
fn a_function_that_fails_to_verify_is_the_verifier_error() {
    modules(|make, label| {
        let mut m = make();
        let f = m.module().declare("f", false);
        let mut result = m.module().define_mistyped(f);
        if label == "Batch" {
            assert!(result.is_ok(), "recorded only");
            result = m.finalize();
        }
        assert!(
            matches!(
                result,
                Err(ModuleError::Compilation(CodegenError::Verifier(_)))
            ),
            "{label}: {result:?}"
        );
    });
}

/// Undefined and undeclared ids: `JITModule` panics; jitfold's drop-in
/// methods panic too (naming the function), and the `try_` methods return
/// a `DedupError` or `Undeclared`.
#[test]
fn undefined_and_undeclared_ids() {
    let mut plain = jit();
    let f = plain.declare("never_defined", false);
    plain.finalize_definitions().unwrap();
    let plain_panics = catch_unwind(AssertUnwindSafe(|| plain.get_finalized_function(f))).is_err();
    let undeclared = FuncId::from_u32(99);
    let plain_undeclared = catch_unwind(AssertUnwindSafe(|| {
        let _ = plain.define_add(undeclared, 1);
    }))
    .is_err();

    let mut d = DedupModule::wrap(jit(), DedupOptions::default());
    let f = d.declare("never_defined", false);
    let data = d
        .declare_data("no_data", Linkage::Local, false, false)
        .unwrap();
    d.finalize_definitions().unwrap();
    let message = catch_unwind(AssertUnwindSafe(|| d.get_finalized_function(f)))
        .map(|_| String::new())
        .unwrap_or_else(|p| jitfold::compile::panic_message(&p));
    let data_panics = catch_unwind(AssertUnwindSafe(|| d.get_finalized_data(data))).is_err();

    assert!(plain_panics && plain_undeclared);
    assert!(
        message.contains("function never_defined is not defined"),
        "{message}"
    );
    assert!(data_panics);
    let e = d.try_get_finalized_function(f).unwrap_err();
    assert_eq!(
        DedupError::of(&e),
        Some(&DedupError::FunctionNotDefined {
            function: "never_defined".into()
        })
    );
    let e = d.try_get_finalized_data(data).unwrap_err();
    assert_eq!(
        DedupError::of(&e),
        Some(&DedupError::DataNotDefined {
            data: "no_data".into()
        })
    );
    assert!(matches!(
        d.define_add(undeclared, 1),
        Err(ModuleError::Undeclared(_))
    ));
    assert!(matches!(
        d.try_get_finalized_data(DataId::from_u32(99)),
        Err(ModuleError::Undeclared(_))
    ));
}

/// An entry point asked before finalizing, and a referenced function
/// never defined: `JITModule` panics; jitfold returns its own errors.
#[test]
fn unfinalized_and_referenced_but_undefined() {
    for mode in [Mode::Eager, Mode::Batch] {
        let options = DedupOptions::default().with_mode(mode);
        let mut d = DedupModule::wrap(jit(), options);
        let f = d.declare("f", false);
        let g = d.declare("g", false);
        define(&mut d, f, |b, m, p| {
            let r = common::build::emit_call(b, m, g, p[0]);
            b.ins().return_(&[r]);
        })
        .unwrap();
        let e = d.try_get_finalized_function(f).unwrap_err();
        assert_eq!(
            DedupError::of(&e),
            Some(&DedupError::FunctionNotFinalized {
                function: "f".into()
            }),
            "{mode:?}"
        );
        let e = d.finalize_definitions().unwrap_err();
        assert_eq!(
            DedupError::of(&e),
            Some(&DedupError::ReferencedButNotDefined {
                missing: vec!["function g".into()]
            }),
            "{mode:?}"
        );
        d.define_add(g, 1).unwrap();
        d.finalize_definitions().unwrap();
        assert_eq!(call1(d.get_finalized_function(f), 1), 2);
    }
}

/// Several batch failures are one `BatchDefinitionsFailed` listing each.
#[test]
fn several_batch_failures_are_listed() {
    let options = DedupOptions::batch();
    let mut d = DedupModule::wrap(jit(), options);
    let f = d.declare("f", false);
    let g = d.declare("g", false);
    d.define_mistyped(f).unwrap();
    // Not a twin of f: another constant.
    define(&mut d, g, |b, _, p| {
        let narrow = b.ins().iconst(I32, 2);
        let bad = b.ins().iadd(p[0], narrow);
        b.ins().return_(&[bad]);
    })
    .unwrap();
    let e = d.flush().unwrap_err();
    let Some(DedupError::BatchDefinitionsFailed { failures }) = DedupError::of(&e) else {
        panic!("{e:?}");
    };
    let ids: Vec<FuncId> = failures.iter().map(|f| f.0).collect();
    assert_eq!(ids, [f, g]);
    assert!(failures[0].1.starts_with("f: "), "{failures:?}");
}

/// A panic inside Cranelift (on x86-64, a `return_call` without
/// `preserve_frame_pointers` panics at emission) is `CraneliftPanic`,
/// naming the function, not `CodegenError::Unsupported`; plain
/// `JITModule` panics.
#[test]
fn a_cranelift_panic_is_its_own_kind() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let plain = catch_unwind(AssertUnwindSafe(|| tail_caller(&mut jit())));
    let mut d = DedupModule::wrap(jit(), DedupOptions::default());
    let result = tail_caller(&mut d);
    assert!(plain.is_err(), "plain JITModule panics");
    let e = result.unwrap_err();
    assert!(
        matches!(DedupError::of(&e), Some(DedupError::CraneliftPanic { function, .. }) if function == "tail_caller"),
        "{e:?}"
    );
}
