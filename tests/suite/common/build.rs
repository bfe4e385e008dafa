//! Building and calling functions through any `Module`.

use cranelift_codegen::ir::{self, InstBuilder};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module, ModuleError};

/// The function `id` of `m` would be: its declared signature, and a body
/// that `body` builds (given the builder positioned in the entry block
/// and the parameters). Not defined.
pub fn built<M: Module>(
    m: &mut M,
    id: FuncId,
    body: impl FnOnce(&mut FunctionBuilder, &mut M, &[ir::Value]),
) -> ir::Function {
    let mut func = ir::Function::new();
    func.signature = m.declarations().get_function_decl(id).signature.clone();
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    body(&mut b, m, &params);
    b.seal_all_blocks();
    b.finalize(m.target_config());
    func
}

/// Defines `id` in `m` with its declared signature: `body` gets the builder
/// positioned in the entry block and the parameters.
pub fn define<M: Module>(
    m: &mut M,
    id: FuncId,
    body: impl FnOnce(&mut FunctionBuilder, &mut M, &[ir::Value]),
) -> Result<(), ModuleError> {
    let mut ctx = m.make_context();
    ctx.func = built(m, id, body);
    m.define_function(id, &mut ctx)
}

/// `(i64) -> i64` in calling convention `conv`.
pub fn sig(m: &impl Module, conv: CallConv) -> ir::Signature {
    let mut s = m.make_signature();
    s.call_conv = conv;
    s.params.push(ir::AbiParam::new(ir::types::I64));
    s.returns.push(ir::AbiParam::new(ir::types::I64));
    s
}

/// Declares a local function `name` of [`sig`]`(conv)`.
pub fn declare(m: &mut impl Module, name: &str, conv: CallConv) -> FuncId {
    let s = sig(m, conv);
    m.declare_function(name, Linkage::Local, &s).unwrap()
}

/// Emits a call of `callee` (declared in `m`, of one result) with `arg`;
/// returns the result.
pub fn emit_call<M: Module>(
    b: &mut FunctionBuilder,
    m: &mut M,
    callee: FuncId,
    arg: ir::Value,
) -> ir::Value {
    let callee = m.declare_func_in_func(callee, b.func);
    let call = b.ins().call(callee, &[arg]);
    b.inst_results(call)[0]
}

/// Calls finalized code of signature `(i64) -> i64`.
pub fn call1(ptr: *const u8, x: i64) -> i64 {
    // SAFETY: every function this is used on has the signature (i64) -> i64
    // in the host's default calling convention and was finalized.
    let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(ptr) };
    f(x)
}

/// Twelve multiply-add steps on `x` (`a = a * x + i`), returned: a body
/// large enough for an adapter.
pub fn twelve_steps(b: &mut FunctionBuilder, x: ir::Value) -> ir::Value {
    let mut a = x;
    for i in 1..=12 {
        let t = b.ins().imul(a, x);
        a = b.ins().iadd_imm_s(t, i);
    }
    a
}

/// Leaves `leaf{k}` (`x * (3 + k) + step * k`: a template each) and a
/// caller of each, `caller{k}` (`leaf{k}(x + 1)`: one template for all),
/// declared and defined in `order` (other orders give other ids and name
/// tables); returns the leaves, then the callers, by `k`.
pub fn leaves_and_callers<M: Module>(m: &mut M, order: &[i64], step: i64) -> Vec<FuncId> {
    let conv = m.isa().default_call_conv();
    let n = order.len();
    let mut leaves = vec![FuncId::from_u32(0); n];
    let mut callers = leaves.clone();
    for &k in order {
        leaves[k as usize] = declare(m, &format!("leaf{k}"), conv);
        callers[k as usize] = declare(m, &format!("caller{k}"), conv);
    }
    for &k in order {
        define(m, leaves[k as usize], |b, _, p| {
            let t = b.ins().imul_imm_s(p[0], 3 + k);
            let r = b.ins().iadd_imm_s(t, step * k);
            b.ins().return_(&[r]);
        })
        .unwrap();
        let leaf = leaves[k as usize];
        define(m, callers[k as usize], |b, m, p| {
            let one = b.ins().iconst(ir::types::I64, 1);
            let x = b.ins().iadd(p[0], one);
            let r = emit_call(b, m, leaf, x);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    leaves.into_iter().chain(callers).collect()
}

/// Declares `callee` and `tail_caller` (both `tail`) and defines
/// `tail_caller` as a `return_call` of `callee`: on x86-64 without
/// `preserve_frame_pointers`, Cranelift panics while emitting it.
pub fn tail_caller<M: Module>(m: &mut M) -> Result<(), ModuleError> {
    let mut sig = m.make_signature();
    sig.call_conv = CallConv::Tail;
    sig.params.push(ir::AbiParam::new(ir::types::I64));
    sig.returns.push(ir::AbiParam::new(ir::types::I64));
    let callee = m.declare_function("callee", Linkage::Local, &sig)?;
    let f = m.declare_function("tail_caller", Linkage::Local, &sig)?;
    define(m, f, |b, m, p| {
        let callee = m.declare_func_in_func(callee, b.func);
        b.ins().return_call(callee, &[p[0]]);
    })
}

/// `x * 5 + 2000`: the third leaf [`leaves_and_callers`] defines (step
/// 1000).
pub fn leaf2<M>(b: &mut FunctionBuilder, _: &mut M, p: &[ir::Value]) {
    let t = b.ins().imul_imm_s(p[0], 5);
    let r = b.ins().iadd_imm_s(t, 2000);
    b.ins().return_(&[r]);
}

/// The store key, in a JIT for the host, of the template of the function
/// `body` builds (one `i64` parameter and result, the ISA's default
/// convention).
pub fn template_key(
    body: fn(&mut FunctionBuilder, &mut cranelift_jit::JITModule, &[ir::Value]),
) -> jitfold::store::StoreKey {
    let builder = cranelift_jit::JITBuilder::new(cranelift_module::default_libcall_names());
    let mut probe = cranelift_jit::JITModule::new(builder.unwrap());
    let context = jitfold::store::CodeContext::of(probe.isa());
    let conv = probe.isa().default_call_conv();
    let id = declare(&mut probe, "probe", conv);
    let func = built(&mut probe, id, body);
    let walk = jitfold::plan::Walk::of(&mut jitfold::Fingerprinter::new(), &func);
    jitfold::store::StoreKey::of(&context, &walk.fingerprint.to_template())
}
