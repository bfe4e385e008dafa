//! A differential test of the `Module` API: random sequences of
//! declarations, definitions and finalizations, run call for call against
//! a plain module and a [`DedupModule`] wrapping the same kind.
//!
//! The sequences are what clients do and misdo: names declared again with
//! other linkages or signatures, functions defined with a signature other
//! than the declared one (RustPython's JIT adds the return type while it
//! translates), duplicates among the bodies, calls between functions,
//! loads from data objects, bodies that fail to verify, definitions of
//! imports, of ids defined before and of ids never declared, and
//! finalizations in between.
//!
//! # What this module guarantees
//!
//! [`check_jit`] and [`check_object`] return `Err` (with the program's
//! calls and what differed) exactly when one of these fails:
//!
//! 1. Every call gives the same outcome under both modules: `Ok`, the same
//!    kind of error ([`Outcome`]), or a panic. The only exceptions are the
//!    rows of the table in the [module docs](crate::module) ("What differs
//!    from the wrapped module"), each recognized here by what it is
//!    ([`allowed`]): where the plain module panics on an id never
//!    declared, or on finalizing with a referenced local undefined, the
//!    wrapper returns `Undeclared` or [`DedupError::ReferencedButNotDefined`],
//!    and where it panics while defining a function, the wrapper returns
//!    [`DedupError::CraneliftPanic`];
//!    in batch mode, a definition that fails to compile (or panics) returns `Ok` and
//!    the next finalization fails, listing it (the test then gives it up
//!    with [`DedupModule::take_failed_definitions`], which must list exactly
//!    those functions, and finalizes again); `ObjectModule` compiles
//!    before it checks an id, so where a call has two faults it may report
//!    the compile error and the wrapper the other fault.
//! 2. After every finalization both modules accept, every function defined
//!    so far that can be called safely (its defined signature is
//!    `(i64) -> i64` in the host's convention, and every function it may
//!    call is defined, with a signature its callers' declaration can call)
//!    returns the same value under both, for several arguments. Every
//!    generated call is guarded by a decreasing argument, so each
//!    terminates.
//! 3. A run ends at the first panic of the plain module (which may leave it
//!    half-finalized), after comparing the wrapper's outcome.

use crate::{DedupError, DedupModule, DedupOptions, Mode};
use arbitrary::{Arbitrary, Result, Unstructured};
use cranelift_codegen::CodegenError;
use cranelift_codegen::ir::{self, AbiParam, InstBuilder, MemFlagsData, condcodes::IntCC, types};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{DataDescription, DataId, FuncId, Linkage, Module, ModuleError};
use hashbrown::{HashMap, HashSet};
use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The arguments every safely callable function is called with.
const ARGUMENTS: [i64; 4] = [0, 1, 2, 5];

/// A sequence of `Module` calls.
#[derive(Clone, Debug)]
pub struct ApiProgram {
    /// The calls, in order.
    pub calls: Vec<ApiCall>,
}

/// One `Module` call (or the JIT's `finalize_definitions`).
#[derive(Clone, Copy, Debug)]
pub enum ApiCall {
    /// `declare_function` of `jf_api_{name}`.
    DeclareFunction {
        /// Which name (function and data names overlap on 4 and 5).
        name: u8,
        /// Its linkage.
        linkage: Linkage,
        /// Its signature.
        sig: Sig,
    },
    /// `declare_anonymous_function`.
    DeclareAnonymousFunction {
        /// Its signature.
        sig: Sig,
    },
    /// `define_function` with a body built for `sig`.
    DefineFunction {
        /// Which function.
        func: Target,
        /// The signature it is defined with (not always the declared one).
        sig: Sig,
        /// What it computes.
        body: Body,
    },
    /// `declare_data` of `jf_api_{name}`.
    DeclareData {
        /// Which name.
        name: u8,
        /// Its linkage.
        linkage: Linkage,
        /// Whether it is writable.
        writable: bool,
    },
    /// `define_data` with eight bytes holding `value`.
    DefineData {
        /// Which data object.
        data: Target,
        /// Its contents.
        value: i64,
    },
    /// `finalize_definitions` (nothing for object modules).
    Finalize,
}

/// The id a definition is for.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// The declaration made `n`-th (modulo how many there were).
    Declared(u8),
    /// An id no declaration made.
    Undeclared,
}

/// A signature: one `i64` parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sig {
    /// `(i64) -> i64`, the host's convention.
    Returns,
    /// `(i64)`, the host's convention (as RustPython declares a function
    /// whose return type it has not seen yet).
    NoReturn,
    /// `(i64) -> i64`, the `tail` convention.
    TailReturns,
}

/// What a defined function computes from its argument `x`.
#[derive(Clone, Copy, Debug)]
pub enum Body {
    /// `x + k`.
    Add(i64),
    /// `x * k`.
    Mul(i64),
    /// `x > 0 ? callee(x - 1) + k : k` (the callee's result where its
    /// declaration has one, else `x`).
    CallThen {
        /// Which declared function.
        callee: u8,
        /// The constant.
        k: i64,
    },
    /// `*data + x + k`.
    Load {
        /// Which declared data object.
        data: u8,
        /// The constant.
        k: i64,
    },
    /// Twelve rounds of `x = x * 3 + k`: long enough for an adapter (a
    /// twin in another convention) and for similar merging.
    Long(i64),
    /// Adds an `i32` to an `i64`: fails to verify.
    Invalid,
}

impl Sig {
    /// The signature, in `m`'s default convention where not `tail`.
    fn signature(self, m: &impl Module) -> ir::Signature {
        let mut s = m.make_signature();
        s.params.push(AbiParam::new(types::I64));
        if self != Sig::NoReturn {
            s.returns.push(AbiParam::new(types::I64));
        }
        if self == Sig::TailReturns {
            s.call_conv = CallConv::Tail;
        }
        s
    }

    /// Whether code calling through a declaration of `self` may call a
    /// function defined as `defined`: the same signature, or one that
    /// returns a value the caller ignores.
    fn may_call(self, defined: Sig) -> bool {
        self == defined || (self == Sig::NoReturn && defined == Sig::Returns)
    }
}

fn linkage(u: &mut Unstructured) -> Result<Linkage> {
    Ok(match u.int_in_range(0..=9)? {
        0 => Linkage::Import,
        1 => Linkage::Preemptible,
        2 | 3 => Linkage::Export,
        4 => Linkage::Hidden,
        _ => Linkage::Local,
    })
}

fn sig(u: &mut Unstructured) -> Result<Sig> {
    Ok(match u.int_in_range(0..=5)? {
        0..=2 => Sig::Returns,
        3 | 4 => Sig::NoReturn,
        _ => Sig::TailReturns,
    })
}

fn target(u: &mut Unstructured) -> Result<Target> {
    Ok(if u.int_in_range(0..=24)? == 0 {
        Target::Undeclared
    } else {
        Target::Declared(u8::arbitrary(u)?)
    })
}

impl<'a> Arbitrary<'a> for ApiProgram {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        // A few declarations first, as clients start, so that most
        // definitions have a declared id to define.
        let mut calls = Vec::new();
        for _ in 0..u.int_in_range(1..=4)? {
            calls.push(ApiCall::DeclareFunction {
                name: u.int_in_range(0..=5)?,
                linkage: linkage(u)?,
                sig: sig(u)?,
            });
        }
        for _ in 0..u.int_in_range(0..=2)? {
            calls.push(ApiCall::DeclareData {
                name: u.int_in_range(4..=7)?,
                linkage: linkage(u)?,
                writable: bool::arbitrary(u)?,
            });
        }
        for _ in 0..u.int_in_range(1..=40)? {
            // Constants from a few values, so that bodies repeat.
            let k = i64::from(u.int_in_range(0u8..=3)?);
            calls.push(match u.int_in_range(0..=19)? {
                0..=3 => ApiCall::DeclareFunction {
                    name: u.int_in_range(0..=5)?,
                    linkage: linkage(u)?,
                    sig: sig(u)?,
                },
                4 => ApiCall::DeclareAnonymousFunction { sig: sig(u)? },
                5..=13 => ApiCall::DefineFunction {
                    func: target(u)?,
                    // The declared signature, or (a third of the time)
                    // another.
                    sig: sig(u)?,
                    body: match u.int_in_range(0..=14)? {
                        13 | 14 => Body::Long(k),
                        0..=3 => Body::Add(k),
                        4..=5 => Body::Mul(k + 2),
                        6..=8 => Body::CallThen {
                            callee: u8::arbitrary(u)?,
                            k,
                        },
                        9..=11 => Body::Load {
                            data: u8::arbitrary(u)?,
                            k,
                        },
                        _ => Body::Invalid,
                    },
                },
                14 | 15 => ApiCall::DeclareData {
                    name: u.int_in_range(4..=7)?,
                    linkage: linkage(u)?,
                    writable: bool::arbitrary(u)?,
                },
                16 | 17 => ApiCall::DefineData {
                    data: target(u)?,
                    value: i64::from(u.int_in_range(-2i8..=2)?),
                },
                _ => ApiCall::Finalize,
            });
        }
        Ok(ApiProgram { calls })
    }
}

/// What a call did, compared between the two modules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It succeeded.
    Ok,
    /// It failed with this kind of error: the `ModuleError` variant, with
    /// the `CodegenError` or [`DedupError`] variant inside.
    Error(String),
    /// It panicked.
    Panic,
}

/// The kind of `error`, as [`Outcome::Error`] names it.
fn kind(error: &ModuleError) -> String {
    match error {
        ModuleError::Undeclared(_) => "Undeclared".into(),
        ModuleError::IncompatibleDeclaration(_) => "IncompatibleDeclaration".into(),
        ModuleError::IncompatibleSignature(..) => "IncompatibleSignature".into(),
        ModuleError::DuplicateDefinition(_) => "DuplicateDefinition".into(),
        ModuleError::InvalidImportDefinition(_) => "InvalidImportDefinition".into(),
        ModuleError::Compilation(e) => format!(
            "Compilation({})",
            match e {
                CodegenError::Verifier(_) => "Verifier",
                CodegenError::ImplLimitExceeded => "ImplLimitExceeded",
                CodegenError::CodeTooLarge => "CodeTooLarge",
                CodegenError::Unsupported(_) => "Unsupported",
                CodegenError::RegisterMappingError(_) => "RegisterMappingError",
                CodegenError::Regalloc(_) => "Regalloc",
            }
        ),
        ModuleError::Allocation { .. } => "Allocation".into(),
        ModuleError::Backend(_) => match DedupError::of(error) {
            Some(e) => format!("Backend({})", dedup_kind(e)),
            None => "Backend".into(),
        },
        ModuleError::Flag(_) => "Flag".into(),
    }
}

/// The variant of `error`.
fn dedup_kind(error: &DedupError) -> &'static str {
    match error {
        DedupError::FunctionNotDefined { .. } => "FunctionNotDefined",
        DedupError::FunctionNotFinalized { .. } => "FunctionNotFinalized",
        DedupError::DataNotDefined { .. } => "DataNotDefined",
        DedupError::DataNotFinalized { .. } => "DataNotFinalized",
        DedupError::ReferencedButNotDefined { .. } => "ReferencedButNotDefined",
        DedupError::BatchDefinitionsFailed { .. } => "BatchDefinitionsFailed",
        DedupError::CheckMismatch { .. } => "CheckMismatch",
        DedupError::CheckCompileFailed { .. } => "CheckCompileFailed",
        DedupError::CraneliftPanic { .. } => "CraneliftPanic",
        DedupError::FingerprintPanic { .. } => "FingerprintPanic",
        DedupError::PreemptibleAfterDefinition { .. } => "PreemptibleAfterDefinition",
        DedupError::Unresolved { .. } => "Unresolved",
    }
}

/// Runs `call`, with a panic as [`Outcome::Panic`].
fn outcome<T>(call: impl FnOnce() -> std::result::Result<T, ModuleError>) -> (Outcome, Option<T>) {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => (Outcome::Ok, Some(value)),
        Ok(Err(e)) => (Outcome::Error(kind(&e)), None),
        Err(_) => (Outcome::Panic, None),
    }
}

/// Whether the wrapper's `dedup` outcome of a call stands for the plain
/// module's `plain` (see 1 in the module docs). `object`: the modules are
/// object modules.
pub fn allowed(call: &ApiCall, plain: &Outcome, dedup: &Outcome, object: bool) -> bool {
    if plain == dedup {
        return true;
    }
    let definition = matches!(
        call,
        ApiCall::DefineFunction { .. } | ApiCall::DefineData { .. }
    );
    match (plain, dedup) {
        // An id never declared: a panic (or, in an object module, the
        // compile error it reports first), and `Undeclared`.
        (Outcome::Panic, Outcome::Error(e)) if definition => {
            e == "Undeclared" || e == "Backend(CraneliftPanic)"
        }
        (Outcome::Error(p), Outcome::Error(e)) if object && definition => {
            p.starts_with("Compilation")
                && matches!(
                    e.as_str(),
                    "Undeclared" | "InvalidImportDefinition" | "DuplicateDefinition"
                )
        }
        // Declaring a defined function preemptible or exported again,
        // where exports may be interposed.
        (Outcome::Ok, Outcome::Error(e)) if object => {
            matches!(call, ApiCall::DeclareFunction { .. })
                && e == "Backend(PreemptibleAfterDefinition)"
        }
        // Finalizing with a referenced local undefined.
        (Outcome::Panic, Outcome::Error(e)) => {
            matches!(call, ApiCall::Finalize) && e == "Backend(ReferencedButNotDefined)"
        }
        _ => false,
    }
}

/// One side of the comparison: a module and the ids its declarations
/// returned, in order.
struct Side<M> {
    module: M,
    functions: Vec<FuncId>,
    data: Vec<DataId>,
}

impl<M: Module> Side<M> {
    fn new(module: M) -> Self {
        Self {
            module,
            functions: Vec::new(),
            data: Vec::new(),
        }
    }

    fn function(&self, target: Target) -> FuncId {
        match target {
            Target::Declared(n) if !self.functions.is_empty() => {
                self.functions[usize::from(n) % self.functions.len()]
            }
            _ => FuncId::from_u32(1 << 20),
        }
    }

    fn data_object(&self, target: Target) -> DataId {
        match target {
            Target::Declared(n) if !self.data.is_empty() => {
                self.data[usize::from(n) % self.data.len()]
            }
            _ => DataId::from_u32(1 << 20),
        }
    }

    /// Carries out `call` (but `Finalize`), returning its outcome and, for
    /// a definition, what the function calls and loads.
    fn apply(&mut self, call: &ApiCall) -> Outcome {
        match *call {
            ApiCall::DeclareFunction { name, linkage, sig } => {
                let signature = sig.signature(&self.module);
                let m = &mut self.module;
                let (o, id) =
                    outcome(|| m.declare_function(&format!("jf_api_{name}"), linkage, &signature));
                self.functions.extend(id);
                o
            }
            ApiCall::DeclareAnonymousFunction { sig } => {
                let signature = sig.signature(&self.module);
                let m = &mut self.module;
                let (o, id) = outcome(|| m.declare_anonymous_function(&signature));
                self.functions.extend(id);
                o
            }
            ApiCall::DefineFunction { func, sig, body } => {
                let id = self.function(func);
                let mut ctx = self.module.make_context();
                ctx.func = self.build(sig, body);
                let m = &mut self.module;
                outcome(|| m.define_function(id, &mut ctx)).0
            }
            ApiCall::DeclareData {
                name,
                linkage,
                writable,
            } => {
                let m = &mut self.module;
                let (o, id) =
                    outcome(|| m.declare_data(&format!("jf_api_{name}"), linkage, writable, false));
                self.data.extend(id);
                o
            }
            ApiCall::DefineData { data, value } => {
                let id = self.data_object(data);
                let mut description = DataDescription::new();
                description.define(value.to_le_bytes().to_vec().into_boxed_slice());
                let m = &mut self.module;
                outcome(|| m.define_data(id, &description)).0
            }
            ApiCall::Finalize => Outcome::Ok,
        }
    }

    /// The callee a body calls (none if no function is declared).
    fn callee(&self, body: Body) -> Option<FuncId> {
        match body {
            Body::CallThen { callee, .. } => {
                Some(self.function(Target::Declared(callee))).filter(|_| !self.functions.is_empty())
            }
            _ => None,
        }
    }

    /// The data object a body loads (none if none is declared).
    fn loaded(&self, body: Body) -> Option<DataId> {
        match body {
            Body::Load { data, .. } => {
                Some(self.data_object(Target::Declared(data))).filter(|_| !self.data.is_empty())
            }
            _ => None,
        }
    }

    /// The function `body` describes, of signature `sig`.
    fn build(&mut self, sig: Sig, body: Body) -> ir::Function {
        let callee = self.callee(body);
        let loaded = self.loaded(body);
        let mut func = ir::Function::new();
        func.signature = sig.signature(&self.module);
        let mut fctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let x = b.block_params(entry)[0];
        let value = match body {
            Body::Add(k) => b.ins().iadd_imm_s(x, k),
            Body::Mul(k) => b.ins().imul_imm_s(x, k),
            Body::Long(k) => {
                let mut v = x;
                for _ in 0..12 {
                    let t = b.ins().imul_imm_s(v, 3);
                    v = b.ins().iadd_imm_s(t, k);
                }
                v
            }
            Body::Invalid => {
                let narrow = b.ins().iconst(types::I32, 1);
                b.ins().iadd(x, narrow)
            }
            Body::Load { k, .. } => match loaded {
                Some(data) => {
                    let gv = self.module.declare_data_in_func(data, b.func);
                    let pointer = self.module.target_config().pointer_type();
                    let address = b.ins().symbol_value(pointer, gv);
                    let loaded = b
                        .ins()
                        .load(types::I64, MemFlagsData::trusted(), address, 0);
                    let sum = b.ins().iadd(loaded, x);
                    b.ins().iadd_imm_s(sum, k)
                }
                None => b.ins().iadd_imm_s(x, k),
            },
            Body::CallThen { k, .. } => match callee {
                Some(callee) => {
                    let fref = self.module.declare_func_in_func(callee, b.func);
                    let call_block = b.create_block();
                    let done = b.create_block();
                    b.append_block_param(done, types::I64);
                    let positive = b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
                    let base = b.ins().iconst(types::I64, k);
                    b.ins()
                        .brif(positive, call_block, &[], done, &[base.into()]);
                    b.switch_to_block(call_block);
                    let less = b.ins().iadd_imm_s(x, -1);
                    let call = b.ins().call(fref, &[less]);
                    let result = b.inst_results(call).first().copied().unwrap_or(x);
                    let sum = b.ins().iadd_imm_s(result, k);
                    b.ins().jump(done, &[sum.into()]);
                    b.switch_to_block(done);
                    b.block_params(done)[0]
                }
                None => b.ins().iadd_imm_s(x, k),
            },
        };
        if sig == Sig::NoReturn {
            b.ins().return_(&[]);
        } else {
            b.ins().return_(&[value]);
        }
        b.seal_all_blocks();
        b.finalize(self.module.target_config());
        func
    }
}

/// A function the plain module defined: with what signature, declared
/// with what, calling and loading what (the plain module's ids), and
/// after how many finalizations.
struct Defined {
    declared: Sig,
    defined: Sig,
    callee: Option<FuncId>,
    loaded: Option<DataId>,
    epoch: usize,
}

/// What the plain module has defined, to tell which functions may be
/// called safely (see 2 in the module docs).
#[derive(Default)]
struct Model {
    /// The signature each function was declared with.
    declared: HashMap<FuncId, Sig>,
    functions: HashMap<FuncId, Defined>,
    /// The data objects defined, with the finalizations before.
    data: HashMap<DataId, usize>,
    /// Finalizations so far.
    epoch: usize,
}

impl Model {
    /// Whether `id` and everything it may call can be called from the
    /// host as `(i64) -> i64`. What a function refers to must have been
    /// defined by the finalization that relocated it: `JITModule`
    /// relocates a function once, and a preemptible name undefined then
    /// is null for good.
    fn callable(&self, id: FuncId) -> bool {
        let Some(f) = self.functions.get(&id) else {
            return false;
        };
        if f.defined != Sig::Returns {
            return false;
        }
        let mut seen = HashSet::new();
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            let Some(f) = self.functions.get(&id) else {
                return false;
            };
            if let Some(data) = f.loaded
                && self.data.get(&data).is_none_or(|&epoch| epoch > f.epoch)
            {
                return false;
            }
            if let Some(callee) = f.callee {
                match self.functions.get(&callee) {
                    Some(c) if c.declared.may_call(c.defined) && c.epoch <= f.epoch => {
                        stack.push(callee)
                    }
                    _ => return false,
                }
            }
        }
        true
    }
}

/// How a JIT module finalizes and hands out code.
trait Jit: Module {
    fn finalize(&mut self) -> std::result::Result<(), ModuleError>;
    fn pointer(&self, id: FuncId) -> *const u8;
}

impl Jit for cranelift_jit::JITModule {
    fn finalize(&mut self) -> std::result::Result<(), ModuleError> {
        self.finalize_definitions()
    }
    fn pointer(&self, id: FuncId) -> *const u8 {
        self.get_finalized_function(id)
    }
}

impl Jit for DedupModule<cranelift_jit::JITModule> {
    fn finalize(&mut self) -> std::result::Result<(), ModuleError> {
        self.finalize_definitions()
    }
    fn pointer(&self, id: FuncId) -> *const u8 {
        self.get_finalized_function(id)
    }
}

/// The text of a failed check: what differed, then the program.
fn failure(
    kind: &str,
    options: DedupOptions,
    at: usize,
    program: &ApiProgram,
    what: String,
) -> String {
    let mut text = format!("{kind}, {options}: call {at}: {what}\nprogram:\n");
    for (i, call) in program.calls.iter().enumerate() {
        let _ = writeln!(text, "  {i}: {call:?}");
    }
    text
}

/// What a check ran: calls compared and function calls compared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ran {
    /// Module calls compared.
    pub calls: usize,
    /// Calls of finalized functions compared.
    pub executions: usize,
}

/// The check of 1 to 3 in the module docs for `JITModule` against
/// `DedupModule<JITModule>` with `options`; `jit` makes each `JITModule`.
pub fn check_jit(
    program: &ApiProgram,
    options: DedupOptions,
    jit: impl Fn() -> cranelift_jit::JITModule,
) -> std::result::Result<Ran, String> {
    let mut plain = Side::new(jit());
    let mut dedup = Side::new(DedupModule::wrap(jit(), options));
    run(program, options, &mut plain, &mut dedup, false)
}

/// The check of 1 and 3 in the module docs for `ObjectModule` against
/// `DedupModule<ObjectModule>` with `options` (nothing runs; `Finalize`
/// does nothing); `object` makes each `ObjectModule`.
pub fn check_object(
    program: &ApiProgram,
    options: DedupOptions,
    object: impl Fn() -> cranelift_object::ObjectModule,
) -> std::result::Result<Ran, String> {
    let mut plain = Side::new(object());
    let mut dedup = Side::new(DedupModule::wrap(object(), options));
    run(program, options, &mut plain, &mut dedup, true)
}

/// What a plain module and its wrapper must agree on, whatever their kind.
trait Finalizes {
    /// Finalizes (a JIT) and returns the outcome; `None` for modules that
    /// do not finalize.
    fn finalize_outcome(&mut self) -> Option<Outcome>;
    /// Calls finalized `id` with `x`.
    fn call(&self, id: FuncId, x: i64) -> Option<i64>;
}

impl<M: Jit> Finalizes for Side<M> {
    fn finalize_outcome(&mut self) -> Option<Outcome> {
        let m = &mut self.module;
        Some(outcome(|| m.finalize()).0)
    }
    fn call(&self, id: FuncId, x: i64) -> Option<i64> {
        // SAFETY: only called on a finalized function defined as
        // `(i64) -> i64` in the host's convention, all of whose callees
        // are defined with signatures their callers' declarations can
        // call (`Model::callable`).
        let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(self.module.pointer(id)) };
        Some(f(x))
    }
}

/// The object modules' sides: nothing to finalize or call.
impl Finalizes for Side<cranelift_object::ObjectModule> {
    fn finalize_outcome(&mut self) -> Option<Outcome> {
        None
    }
    fn call(&self, _: FuncId, _: i64) -> Option<i64> {
        None
    }
}

impl Finalizes for Side<DedupModule<cranelift_object::ObjectModule>> {
    fn finalize_outcome(&mut self) -> Option<Outcome> {
        None
    }
    fn call(&self, _: FuncId, _: i64) -> Option<i64> {
        None
    }
}

/// Runs `program` on both sides, comparing as the module docs say.
fn run<P, D>(
    program: &ApiProgram,
    options: DedupOptions,
    plain: &mut Side<P>,
    dedup: &mut Side<DedupModule<D>>,
    object: bool,
) -> std::result::Result<Ran, String>
where
    P: Module,
    D: Module,
    Side<P>: Finalizes,
    Side<DedupModule<D>>: Finalizes,
{
    let fail = |at: usize, what: String| {
        let kind = if object { "ObjectModule" } else { "JITModule" };
        failure(kind, options, at, program, what)
    };
    let mut model = Model::default();
    // Plain ids to the wrapper's (which differ once similar merging
    // declares bodies of its own).
    let mut ids: HashMap<FuncId, FuncId> = HashMap::new();
    // Batch mode: functions whose definition failed in the plain module
    // and is recorded in the wrapper, to fail at the next finalization
    // (plain ids, and the wrapper's).
    let mut deferred: Vec<(FuncId, FuncId)> = Vec::new();
    let mut ran = Ran::default();
    for (at, call) in program.calls.iter().enumerate() {
        if let ApiCall::Finalize = call {
            let Some(p) = plain.finalize_outcome() else {
                continue;
            };
            let mut d = dedup.finalize_outcome().expect("both sides finalize");
            if !deferred.is_empty() {
                // See 1 in the module docs: the failures, then given up.
                if d != Outcome::Error("Backend(BatchDefinitionsFailed)".into())
                    && !matches!(&d, Outcome::Error(e) if e.starts_with("Compilation"))
                {
                    return Err(fail(at, format!("a failed batch definition gave {d:?}")));
                }
                let mut given_up: Vec<FuncId> = dedup
                    .module
                    .take_failed_definitions()
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect();
                let mut expected: Vec<FuncId> = deferred.drain(..).map(|(_, d)| d).collect();
                given_up.sort();
                given_up.dedup();
                expected.sort();
                expected.dedup();
                if given_up != expected {
                    return Err(fail(
                        at,
                        format!("failed definitions {given_up:?}, expected {expected:?}"),
                    ));
                }
                d = dedup.finalize_outcome().expect("both sides finalize");
            }
            ran.calls += 1;
            if !allowed(call, &p, &d, object) {
                return Err(fail(at, format!("plain {p:?}, jitfold {d:?}")));
            }
            if p != Outcome::Ok {
                if p == Outcome::Panic {
                    return Ok(ran);
                }
                continue;
            }
            model.epoch += 1;
            for (&id, _) in model.functions.iter() {
                if !model.callable(id) {
                    continue;
                }
                for x in ARGUMENTS {
                    let expected = plain.call(id, x);
                    let got = dedup.call(ids[&id], x);
                    ran.executions += 1;
                    if expected != got {
                        return Err(fail(
                            at,
                            format!("function {id} ({x}): plain {expected:?}, jitfold {got:?}"),
                        ));
                    }
                }
            }
            continue;
        }
        // Batch mode: a function whose failed definition is still
        // recorded counts as defined until the flush (see the table in
        // the module docs); it is not defined again before.
        if let ApiCall::DefineFunction { func, .. } = *call
            && deferred.iter().any(|&(p, _)| p == plain.function(func))
        {
            continue;
        }
        let before_functions = plain.functions.len();
        let p = plain.apply(call);
        let d = dedup.apply(call);
        ran.calls += 1;
        // Declarations pair the ids.
        if plain.functions.len() > before_functions && dedup.functions.len() > before_functions {
            let (pid, did) = (
                plain.functions[before_functions],
                dedup.functions[before_functions],
            );
            ids.insert(pid, did);
            if let ApiCall::DeclareFunction { sig, .. }
            | ApiCall::DeclareAnonymousFunction { sig } = *call
            {
                model.declared.entry(pid).or_insert(sig);
            }
        }
        let deferrable = options.mode == Mode::Batch
            && matches!(call, ApiCall::DefineFunction { .. })
            && (matches!(&p, Outcome::Error(e) if e.starts_with("Compilation"))
                || p == Outcome::Panic)
            && d == Outcome::Ok;
        if deferrable {
            let ApiCall::DefineFunction { func, .. } = *call else {
                unreachable!()
            };
            deferred.push((plain.function(func), dedup.function(func)));
        } else if !allowed(call, &p, &d, object) {
            return Err(fail(at, format!("plain {p:?}, jitfold {d:?}")));
        }
        // A declaration the wrapper refused as the table says still names
        // the same function on both sides.
        if let ApiCall::DeclareFunction { name, .. } = *call
            && dedup.functions.len() < plain.functions.len()
            && let Some(cranelift_module::FuncOrDataId::Func(id)) =
                dedup.module.get_name(&format!("jf_api_{name}"))
        {
            dedup.functions.push(id);
        }
        if p == Outcome::Ok {
            match *call {
                ApiCall::DefineFunction { func, sig, body } => {
                    let id = plain.function(func);
                    model.functions.insert(
                        id,
                        Defined {
                            declared: model.declared.get(&id).copied().unwrap_or(sig),
                            defined: sig,
                            callee: plain.callee(body),
                            loaded: plain.loaded(body),
                            epoch: model.epoch,
                        },
                    );
                }
                ApiCall::DefineData { data, .. } => {
                    model.data.insert(plain.data_object(data), model.epoch);
                }
                _ => {}
            }
        }
    }
    Ok(ran)
}

/// Runs [`check_jit`] on the program `data` encodes with every option set
/// of [`DedupOptions::ALL`] and batch mode on two threads, and
/// [`check_object`] in eager and batch mode. Returns `None` when `data` is
/// too short to make a program.
pub fn check_bytes(data: &[u8]) -> Option<std::result::Result<Ran, String>> {
    let program = ApiProgram::arbitrary(&mut Unstructured::new(data)).ok()?;
    Some(check_all(&program))
}

/// The option sets [`check_all`] runs.
pub fn option_sets() -> Vec<DedupOptions> {
    let mut all = DedupOptions::ALL.to_vec();
    all.push(DedupOptions::batch().with_threads(2));
    all
}

/// [`check_bytes`] for a program.
pub fn check_all(program: &ApiProgram) -> std::result::Result<Ran, String> {
    let mut ran = Ran::default();
    let jit = || {
        let isa = crate::isa::host_isa(crate::isa::jit_flags()).expect("the host ISA");
        cranelift_jit::JITModule::new(cranelift_jit::JITBuilder::with_isa(
            isa,
            cranelift_module::default_libcall_names(),
        ))
    };
    for options in option_sets() {
        let r = check_jit(program, options, jit)?;
        ran.calls += r.calls;
        ran.executions += r.executions;
    }
    let object = || {
        let isa = crate::isa::host_isa(crate::isa::jit_flags()).expect("the host ISA");
        cranelift_object::ObjectModule::new(
            cranelift_object::ObjectBuilder::new(
                isa,
                "api",
                cranelift_module::default_libcall_names(),
            )
            .expect("an object builder"),
        )
    };
    for options in [DedupOptions::eager(), DedupOptions::batch()] {
        let r = check_object(program, options, object)?;
        ran.calls += r.calls;
    }
    Ok(ran)
}
