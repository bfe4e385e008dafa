//! Building and calling functions through any `Module`.

use cranelift_codegen::ir::{self, InstBuilder};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Module, ModuleError};

/// Defines `id` in `m` with its declared signature: `body` gets the builder
/// positioned in the entry block and the parameters.
pub fn define<M: Module>(
    m: &mut M,
    id: FuncId,
    body: impl FnOnce(&mut FunctionBuilder, &mut M, &[ir::Value]),
) -> Result<(), ModuleError> {
    let mut ctx = m.make_context();
    ctx.func.signature = m.declarations().get_function_decl(id).signature.clone();
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    body(&mut b, m, &params);
    b.seal_all_blocks();
    b.finalize(m.target_config());
    m.define_function(id, &mut ctx)
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
