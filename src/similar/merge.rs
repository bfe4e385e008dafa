//! The merged body and the thunks: the CLIF transforms that carry out a
//! group's plan (see the [module docs](super)).

use super::group::Derived;
use super::shape::constant_kind;
use cranelift_codegen::ir::{
    AbiParam, ExtFuncData, ExternalName, Function, Inst, InstBuilder, Signature, Type,
    UserExternalName, UserFuncName,
    immediates::{Ieee32, Ieee64},
    types,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

/// The merged body of a group: `first` (the group's first member, whose
/// parameter sites are `sites`, as [`ShapeOf::sites`](super::ShapeOf::sites)) with each site that
/// [`Derived::site_param`] maps to a parameter replaced by that parameter,
/// appended to the signature and to the entry block in order. Sites that
/// stay constants keep `first`'s constant. An error if `sites` do not match
/// `derived` or are not constants of `first`.
pub fn merged_body(
    first: &Function,
    sites: &[Inst],
    derived: &Derived,
) -> Result<Function, String> {
    if sites.len() != derived.site_param.len() {
        return Err(format!(
            "{} sites for {} derived sites",
            sites.len(),
            derived.site_param.len()
        ));
    }
    let mut body = first.clone();
    let entry = body
        .layout
        .entry_block()
        .ok_or_else(|| "a function without an entry block".to_string())?;
    let mut params = Vec::with_capacity(derived.params.len());
    for p in &derived.params {
        body.signature.params.push(AbiParam::new(p.ty));
        params.push(body.dfg.append_block_param(entry, p.ty));
    }
    for (&inst, param) in sites.iter().zip(&derived.site_param) {
        let Some(p) = *param else { continue };
        let is_site = body.dfg.inst_is_valid(inst)
            && constant_kind(body.dfg.insts[inst].opcode()).is_some()
            && body.layout.inst_block(inst).is_some()
            && body.dfg.inst_results(inst).len() == 1;
        if !is_site {
            return Err(format!("{inst} is not a constant of the function"));
        }
        let result = body.dfg.first_result(inst);
        if body.dfg.value_type(result) != derived.params[p].ty {
            return Err(format!("{inst} is not of its parameter's type"));
        }
        body.layout.remove_inst(inst);
        body.dfg.clear_results(inst);
        body.dfg.change_to_alias(result, params[p]);
    }
    Ok(body)
}

/// A thunk: a function named `name` with signature `sig` (a member's)
/// that calls `body` (a merged body with signature `body_sig`, named as a
/// `cranelift-module` name: namespace 0, the body's function id as index)
/// with its own arguments followed by `values` (one per parameter, as
/// constants of their types) and returns what it returns. With both
/// signatures in the `tail` convention it is a `return_call`; otherwise a
/// `call` and a `return`. Float values are `f32const`s and `f64const`s of
/// their raw bits. `frontend` is the target's
/// (`TargetIsa::frontend_config`).
pub fn thunk(
    frontend: TargetFrontendConfig,
    name: UserFuncName,
    sig: &Signature,
    body: UserExternalName,
    body_sig: &Signature,
    values: &[(Type, i64)],
) -> Function {
    let tail_call = sig.call_conv == CallConv::Tail && body_sig.call_conv == CallConv::Tail;
    thunk_calling(frontend, name, sig, body, body_sig, values, tail_call)
}

/// [`thunk`], with a `return_call` only if `tail_call` (which needs both
/// signatures in the `tail` convention), and a `call` and a `return`
/// otherwise: for targets where a tail call cannot be compiled (x86-64
/// without `preserve_frame_pointers`, where Cranelift 0.135.8 asserts).
pub fn thunk_calling(
    frontend: TargetFrontendConfig,
    name: UserFuncName,
    sig: &Signature,
    body: UserExternalName,
    body_sig: &Signature,
    values: &[(Type, i64)],
    tail_call: bool,
) -> Function {
    let tail_call =
        tail_call && sig.call_conv == CallConv::Tail && body_sig.call_conv == CallConv::Tail;
    let mut func = Function::with_name_signature(name, sig.clone());
    let mut context = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut context);
    let block = b.create_block();
    b.append_block_params_for_function_params(block);
    b.switch_to_block(block);
    b.seal_block(block);
    let mut args = b.block_params(block).to_vec();
    for &(ty, bits) in values {
        args.push(match ty {
            types::F32 => b.ins().f32const(Ieee32::with_bits(bits as u32)),
            types::F64 => b.ins().f64const(Ieee64::with_bits(bits as u64)),
            _ => b.ins().iconst(ty, bits),
        });
    }
    let signature = b.import_signature(body_sig.clone());
    let name = b.func.declare_imported_user_function(body);
    let callee = b.import_function(ExtFuncData {
        name: ExternalName::User(name),
        signature,
        colocated: true,
        patchable: false,
    });
    if tail_call {
        b.ins().return_call(callee, &args);
    } else {
        let call = b.ins().call(callee, &args);
        let results = b.inst_results(call).to_vec();
        b.ins().return_(&results);
    }
    b.finalize(frontend);
    func
}

/// The values a thunk of member `member` passes: each parameter's value
/// in that member, with its type.
pub fn thunk_values(derived: &Derived, member: usize) -> Vec<(Type, i64)> {
    derived
        .params
        .iter()
        .map(|p| (p.ty, p.values[member]))
        .collect()
}
