//! A test double of an inner module: a `JITModule` whose `define_function`
//! fails (with an error, or a panic) for chosen function ids, so that the
//! tests of what a failed definition undoes run on every host, whatever
//! Cranelift can or cannot compile there.

use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::{CodegenError, Context, ir, isa};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{
    DataDescription, DataId, FuncId, FuncOrDataId, Linkage, Module, ModuleDeclarations,
    ModuleError, ModuleReloc, ModuleResult, default_libcall_names,
};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// How a chosen definition fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// `define_function` returns `CodegenError::Unsupported`.
    Error,
    /// `define_function` panics.
    Panic,
}

/// The ids whose definitions fail, shared with the test, which may change
/// them between definitions.
#[derive(Clone, Default)]
pub struct Failing(Arc<Mutex<HashSet<FuncId>>>);

impl Failing {
    /// Makes `id`'s definitions fail (`true`) or succeed.
    pub fn set(&self, id: FuncId, fails: bool) {
        let mut ids = self.0.lock().unwrap();
        if fails {
            ids.insert(id);
        } else {
            ids.remove(&id);
        }
    }

    fn fails(&self, id: FuncId) -> bool {
        self.0.lock().unwrap().contains(&id)
    }
}

/// A `JITModule` whose compiles of the [`Failing`] ids fail as `failure`
/// says (code defined from bytes is never refused).
pub struct FailingJit {
    pub jit: JITModule,
    pub failing: Failing,
    pub failure: Failure,
}

impl FailingJit {
    pub fn new(failure: Failure) -> Self {
        Self {
            jit: JITModule::new(JITBuilder::with_flags(&[], default_libcall_names()).unwrap()),
            failing: Failing::default(),
            failure,
        }
    }
}

impl Module for FailingJit {
    fn isa(&self) -> &dyn isa::TargetIsa {
        self.jit.isa()
    }
    fn declarations(&self) -> &ModuleDeclarations {
        self.jit.declarations()
    }
    fn get_name(&self, name: &str) -> Option<FuncOrDataId> {
        self.jit.get_name(name)
    }
    fn declare_function(
        &mut self,
        name: &str,
        linkage: Linkage,
        signature: &ir::Signature,
    ) -> ModuleResult<FuncId> {
        self.jit.declare_function(name, linkage, signature)
    }
    fn declare_anonymous_function(&mut self, signature: &ir::Signature) -> ModuleResult<FuncId> {
        self.jit.declare_anonymous_function(signature)
    }
    fn declare_data(
        &mut self,
        name: &str,
        linkage: Linkage,
        writable: bool,
        tls: bool,
    ) -> ModuleResult<DataId> {
        self.jit.declare_data(name, linkage, writable, tls)
    }
    fn declare_anonymous_data(&mut self, writable: bool, tls: bool) -> ModuleResult<DataId> {
        self.jit.declare_anonymous_data(writable, tls)
    }
    fn define_function_with_control_plane(
        &mut self,
        func: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<()> {
        if self.failing.fails(func) {
            match self.failure {
                Failure::Error => {
                    return Err(ModuleError::Compilation(CodegenError::Unsupported(
                        format!("{func} fails in this test"),
                    )));
                }
                Failure::Panic => panic!("{func} panics in this test"),
            }
        }
        self.jit
            .define_function_with_control_plane(func, ctx, ctrl_plane)
    }
    fn define_function_bytes(
        &mut self,
        func: FuncId,
        alignment: u64,
        bytes: &[u8],
        relocs: &[ModuleReloc],
    ) -> ModuleResult<()> {
        self.jit
            .define_function_bytes(func, alignment, bytes, relocs)
    }
    fn define_data(&mut self, data: DataId, desc: &DataDescription) -> ModuleResult<()> {
        self.jit.define_data(data, desc)
    }
}
