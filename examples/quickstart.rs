//! The smallest use of jitfold: wrap a `JITModule`, define two functions
//! that are the same function built two ways, call both.
//!
//! Run with `cargo run --example quickstart`.

use cranelift_codegen::ir::{AbiParam, InstBuilder, types::I64};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use jitfold::DedupModule;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Where you had `JITModule::new(builder)`, change only the type (or
    // wrap a module you made: `DedupModule::wrap(jit, DedupOptions::batch())`).
    let mut module = DedupModule::<JITModule>::new(JITBuilder::new(default_libcall_names())?);

    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I64));

    // The same function, x + x + x + 1, generated twice; the second time
    // every block and value gets another number.
    let mut ids = Vec::new();
    for (name, renumbered) in [("triple_plus_one", false), ("also_triple_plus_one", true)] {
        let id = module.declare_function(name, Linkage::Export, &sig)?;
        let mut ctx = module.make_context();
        ctx.func.signature = sig.clone();
        let mut fctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        if renumbered {
            // A block that is never used: the entry becomes block1.
            b.create_block();
        }
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let x = b.block_params(entry)[0];
        if renumbered {
            // An instruction the generator emitted and then deleted: every
            // later value gets another number.
            let dead = b.ins().iconst(I64, 0);
            let inst = b.func.dfg.value_def(dead).unwrap_inst();
            b.func.layout.remove_inst(inst);
        }
        let one = b.ins().iconst(I64, 1);
        let two_x = b.ins().iadd(x, x);
        let three_x = b.ins().iadd(two_x, x);
        let result = b.ins().iadd(three_x, one);
        b.ins().return_(&[result]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
        module.define_function(id, &mut ctx)?;
        ids.push(id);
    }
    module.finalize_definitions()?;

    for &id in &ids {
        let code = module.get_finalized_function(id);
        // SAFETY: the function was declared with (i64) -> i64 in the host's
        // default calling convention and is finalized.
        let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(code) };
        println!("{id}: f(14) = {} at {code:p}", f(14));
    }
    println!("\n{}", module.stats());
    Ok(())
}
