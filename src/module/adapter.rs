//! ABI adapters: sharing one compiled body between functions that differ
//! only in their calling convention.
//!
//! Two functions with the same body, callees and parameter types, one
//! `system_v` and one `tail` (say), compile to different code, so neither
//! can be an alias or a jump trampoline of the other. The second can still
//! share the first one's body through an *adapter*: a small function with
//! its own signature that passes its parameters to the first and returns
//! its results.
//!
//! # What this module guarantees
//!
//! - [`adaptable`] holds only for a function that cannot tell an extra frame
//!   between it and its caller apart: it reads no frame, stack or return
//!   address (`get_frame_pointer`, `get_stack_pointer`,
//!   `get_return_address`), switches no stack, catches no exception
//!   (`try_call`, `try_call_indirect`), takes no struct by value
//!   (`StructArgument`), and has no stack limit. It must also have at least
//!   [`MIN_INSTRUCTIONS`] instructions: a smaller body compiles about as
//!   fast as its adapter.
//! - [`adapter`] builds one function with the adapted function's signature
//!   whose only work is the call: `return_call` when both conventions are
//!   `tail` (the callee returns straight to the caller), else `call`
//!   followed by `return` of every result, unchanged.
//! - The caller ([`DedupModule`](super::DedupModule)) adapts a function
//!   only to a compiled function whose fingerprint equals its own with the
//!   calling convention erased ([`Fingerprint::erase_call_conv`]),
//!   both being adaptable.
//!
//! [`Fingerprint::erase_call_conv`]: crate::Fingerprint::erase_call_conv

use cranelift_codegen::ir::{
    self, ArgumentPurpose, Function, InstBuilder, Signature, UserFuncName,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

/// Functions with fewer instructions are compiled rather than adapted.
pub const MIN_INSTRUCTIONS: u32 = 16;

/// Whether `func` may run behind an adapter (see the module docs); its
/// instruction count is `instructions`, and `observes_own_frame` tells
/// whether one of its reachable instructions reads its frame, switches
/// stacks or catches exceptions, as [`Walk::observes_own_frame`] tells.
///
/// [`Walk::observes_own_frame`]: crate::Walk::observes_own_frame
pub fn adaptable(func: &Function, instructions: u32, observes_own_frame: bool) -> bool {
    let struct_by_value = func
        .signature
        .params
        .iter()
        .any(|p| matches!(p.purpose, ArgumentPurpose::StructArgument(_)));
    instructions >= MIN_INSTRUCTIONS
        && func.stack_limit.is_none()
        && !observes_own_frame
        && !struct_by_value
}

/// A function of signature `own` that calls `target` (a function of
/// signature `target_sig`, with the same parameter and return types) with
/// its parameters and returns its results; `import` declares `target` in
/// the function being built and returns the reference.
pub fn adapter(
    own: &Signature,
    target_sig: &Signature,
    config: TargetFrontendConfig,
    import: impl FnOnce(&mut Function) -> ir::FuncRef,
) -> Function {
    let mut func = Function::with_name_signature(UserFuncName::default(), own.clone());
    let target = import(&mut func);
    let mut builder_context = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut builder_context);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let params = b.block_params(entry).to_vec();
    if own.call_conv == CallConv::Tail && target_sig.call_conv == CallConv::Tail {
        b.ins().return_call(target, &params);
    } else {
        let call = b.ins().call(target, &params);
        let results = b.inst_results(call).to_vec();
        b.ins().return_(&results);
    }
    b.finalize(config);
    func
}

#[cfg(test)]
mod tests {
    use super::*;
    use cranelift_codegen::ir::Opcode;
    use cranelift_codegen::ir::instructions::InstructionFormat;
    use cranelift_codegen::settings;

    /// A function of `n` `iadd`s, with `extra` before the return.
    fn parsed(conv: &str, n: usize, extra: &str) -> Function {
        let mut text = format!("function %f(i64) -> i64 {conv} {{\nblock0(v0: i64):\n");
        for i in 0..n {
            text.push_str(&format!("    v{} = iadd v{i}, v0\n", i + 1));
        }
        text.push_str(extra);
        text.push_str(&format!("    return v{n}\n}}\n"));
        cranelift_reader::parse_functions(&text).unwrap().remove(0)
    }

    /// [`adaptable`] as `DedupModule` asks it, after fingerprinting `f`.
    fn adaptable_after_walk(f: &Function) -> bool {
        let mut walker = crate::Fingerprinter::new();
        let walk = walker.walk(f);
        adaptable(f, walk.instructions(), walk.observes_own_frame())
    }

    #[test]
    fn only_large_functions_that_ignore_their_frame_are_adaptable() {
        let f = parsed("system_v", 20, "");
        assert!(adaptable_after_walk(&f));
        assert!(!adaptable(&f, MIN_INSTRUCTIONS - 1, false), "too small");
        let frame = parsed("system_v", 20, "    v100 = get_return_address.i64\n");
        assert!(!adaptable_after_walk(&frame));
        let sp = parsed("system_v", 20, "    v100 = get_stack_pointer.i64\n");
        assert!(!adaptable_after_walk(&sp));
        let fp = parsed("system_v", 20, "    v100 = get_frame_pointer.i64\n");
        assert!(!adaptable_after_walk(&fp));
        // The walk learns of the rest where their formats are encoded.
        assert_eq!(Opcode::StackSwitch.format(), InstructionFormat::Ternary);
        assert_eq!(Opcode::TryCall.format(), InstructionFormat::TryCall);
        assert_eq!(
            Opcode::TryCallIndirect.format(),
            InstructionFormat::TryCallIndirect
        );
    }

    #[test]
    fn tail_to_tail_adapters_tail_call() {
        let config = TargetFrontendConfig {
            default_call_conv: CallConv::SystemV,
            pointer_width: target_lexicon::PointerWidth::U64,
            page_size_align_log2: 12,
        };
        let f = parsed("tail", 20, "");
        for (own_conv, tail_call) in [(CallConv::Tail, true), (CallConv::SystemV, false)] {
            let mut own = f.signature.clone();
            own.call_conv = own_conv;
            let adapter = adapter(&own, &f.signature, config, |func| {
                let sig = func.import_signature(f.signature.clone());
                let name = func.declare_imported_user_function(ir::UserExternalName::new(0, 7));
                func.import_function(ir::ExtFuncData {
                    name: ir::ExternalName::user(name),
                    signature: sig,
                    colocated: true,
                    patchable: false,
                })
            });
            let flags = settings::Flags::new(settings::builder());
            cranelift_codegen::verify_function(&adapter, &flags).unwrap();
            let opcodes: Vec<Opcode> = adapter
                .layout
                .blocks()
                .flat_map(|b| adapter.layout.block_insts(b))
                .map(|i| adapter.dfg.insts[i].opcode())
                .collect();
            let expected = if tail_call {
                vec![Opcode::ReturnCall]
            } else {
                vec![Opcode::Call, Opcode::Return]
            };
            assert_eq!(opcodes, expected, "{own_conv}");
        }
    }
}
