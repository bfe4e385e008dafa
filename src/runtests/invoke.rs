//! Calling a compiled function with [`DataValue`] arguments: one trampoline
//! per signature, which loads the arguments from a buffer of 16-byte slots,
//! calls the function, and stores its results back into the same slots.
//!
//! # What this module guarantees
//!
//! - [`trampoline_for`] builds a function of the ISA's default calling
//!   convention, `(callee: pointer, slots: pointer)`, that passes slot *i* as
//!   argument *i* with the argument's own type, and writes result *i* into
//!   slot *i*; it works for any calling convention of the callee, since it
//!   calls through `call_indirect` with the callee's own signature.
//! - [`call`] writes each argument in native byte order into its slot and
//!   reads each result back typed by the signature. Its only `unsafe` is
//!   the call itself; the caller vouches that the two pointers are a
//!   finalized trampoline for `signature` and a finalized function of that
//!   signature.

use cranelift_codegen::data_value::DataValue;
use cranelift_codegen::ir::{self, AbiParam, InstBuilder, MemFlagsData, Signature, UserFuncName};
use cranelift_codegen::isa::TargetIsa;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

/// Bytes per argument or result in the buffer: the widest value a run line
/// can hold (`i128`, 128-bit vectors).
const SLOT_BYTES: usize = 16;

/// The trampoline that calls functions of `signature` (see the module docs).
pub fn trampoline_for(signature: &Signature, isa: &dyn TargetIsa) -> ir::Function {
    let pointer = isa.pointer_type();
    let mut own = Signature::new(isa.default_call_conv());
    own.params.push(AbiParam::new(pointer));
    own.params.push(AbiParam::new(pointer));
    let mut func = ir::Function::with_name_signature(UserFuncName::default(), own);
    let mut builder_context = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut builder_context);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let (callee, slots) = {
        let params = b.block_params(entry);
        (params[0], params[1])
    };
    let args: Vec<ir::Value> = signature
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            b.ins()
                .load(p.value_type, MemFlagsData::trusted(), slots, slot_offset(i))
        })
        .collect();
    let sig_ref = b.import_signature(signature.clone());
    let call = b.ins().call_indirect(sig_ref, callee, &args);
    let results = b.inst_results(call).to_vec();
    for (i, result) in results.into_iter().enumerate() {
        b.ins()
            .store(MemFlagsData::trusted(), result, slots, slot_offset(i));
    }
    b.ins().return_(&[]);
    b.finalize(isa.frontend_config());
    func
}

fn slot_offset(i: usize) -> i32 {
    i32::try_from(i * SLOT_BYTES).expect("a signature has far fewer than 2^27 parameters")
}

/// Calls `function` (of `signature`) through `trampoline` with `args`, and
/// returns its results. `args` must match the signature's parameters in
/// number and type (as `cranelift_reader::parse_run_command` makes them);
/// a mismatch is an error, not a call.
///
/// # Safety
///
/// `trampoline` must be the finalized code of [`trampoline_for`]`(signature)`
/// and `function` the finalized code of a function with `signature`, both
/// for the host, and both kept alive (not freed) during the call.
pub unsafe fn call(
    trampoline: *const u8,
    function: *const u8,
    signature: &Signature,
    args: &[DataValue],
) -> Result<Vec<DataValue>, String> {
    if args.len() != signature.params.len() {
        return Err(format!(
            "{} arguments given, the signature has {} parameters",
            args.len(),
            signature.params.len()
        ));
    }
    let slots = signature.params.len().max(signature.returns.len()).max(1);
    // `u128` keeps every slot 16-byte aligned, as vector loads may want.
    let mut buffer = vec![0u128; slots];
    for (i, (arg, param)) in args.iter().zip(&signature.params).enumerate() {
        if arg.ty().bytes() != param.value_type.bytes() {
            return Err(format!(
                "argument {i} is {} but the parameter is {}",
                arg.ty(),
                param.value_type
            ));
        }
        let mut bytes = [0u8; SLOT_BYTES];
        arg.write_to_slice_ne(&mut bytes);
        buffer[i] = u128::from_ne_bytes(bytes);
    }
    // SAFETY: the caller guarantees that `trampoline` is the code of
    // `trampoline_for(signature)`, which has the host's default calling
    // convention (`extern "C"` on the hosts Cranelift JITs for) and reads and
    // writes only the first `max(params, returns)` slots of `buffer`, and
    // that `function` has `signature`.
    unsafe {
        let entry: extern "C" fn(*const u8, *mut u128) = std::mem::transmute(trampoline);
        entry(function, buffer.as_mut_ptr());
    }
    Ok(signature
        .returns
        .iter()
        .zip(&buffer)
        .map(|(r, slot)| DataValue::read_from_slice_ne(&slot.to_ne_bytes(), r.value_type))
        .collect())
}
