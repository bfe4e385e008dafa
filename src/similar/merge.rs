//! The merged body and the thunks: the CLIF transforms that carry out a
//! group's plan (see the [module docs](super)).

use super::group::{Derived, thunk_skips_stack_check};
use super::shape::{Site, SiteValue, constant_kind, references_of};
use crate::fingerprint::SymbolName;
use cranelift_codegen::ir::{
    AbiParam, ExtFuncData, ExternalName, Function, GlobalValue, GlobalValueData, InstBuilder,
    InstructionData, Opcode, Signature, Type, UserExternalName, Value,
    immediates::{Ieee32, Ieee64, Imm64},
    types,
};
use cranelift_codegen::isa::{CallConv, TargetIsa};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

/// The merged body of a group: `first` (the group's first member, whose
/// parameter sites are `sites`, as [`ShapeOf::sites`](super::ShapeOf::sites)) with each site that
/// [`Derived::site_param`] maps to a parameter replaced by that parameter,
/// appended to the signature and to the entry block in order: a constant's
/// result becomes an alias of it, and every `call` of a callee site becomes
/// a `call_indirect` through it, with the same signature and arguments.
/// Sites that stay constants keep `first`'s constant or callee. An error if
/// `sites` do not match `derived` or are not sites of `first`, or if a
/// callee's name is still referred to afterwards.
pub fn merged_body(
    first: &Function,
    sites: &[Site],
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
    for (site, param) in sites.iter().zip(&derived.site_param) {
        let Some(p) = *param else { continue };
        let inst = match site {
            Site::Constant(inst) => *inst,
            Site::Callee(name) => {
                call_through(&mut body, name, params[p])?;
                no_reference_left(&body, name)?;
                continue;
            }
            Site::FunctionAddress(name) | Site::SymbolAddress(name) => {
                address_from(&mut body, site, name, params[p])?;
                no_reference_left(&body, name)?;
                continue;
            }
        };
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

/// Turns every `call` of `name` in `body` into a `call_indirect` through
/// `pointer`; an error if `name` is referred to otherwise (see
/// [`Site::Callee`]) or by nothing.
fn call_through(body: &mut Function, name: &SymbolName, pointer: Value) -> Result<(), String> {
    let mut calls = Vec::new();
    for block in body.layout.blocks() {
        for inst in body.layout.block_insts(block) {
            if let InstructionData::Call {
                opcode: Opcode::Call,
                func_ref,
                ..
            } = body.dfg.insts[inst]
            {
                // A reference to no declared function (possible in a
                // block the walk does not reach, with the verifier off).
                let Some(data) = body.dfg.ext_funcs.get(func_ref) else {
                    return Err(format!("{inst} calls {func_ref}, which is not declared"));
                };
                if SymbolName::of(body, &data.name).as_ref() == Some(name) {
                    calls.push((inst, data.signature));
                }
            }
        }
    }
    if calls.is_empty() {
        return Err(format!("no call of {name:?}"));
    }
    for (inst, sig_ref) in calls {
        let args = body.dfg.inst_args(inst).to_vec();
        let mut with_pointer = Vec::with_capacity(args.len() + 1);
        with_pointer.push(pointer);
        with_pointer.extend(args);
        let list =
            cranelift_codegen::ir::ValueList::from_slice(&with_pointer, &mut body.dfg.value_lists);
        body.dfg.insts[inst] = InstructionData::CallIndirect {
            opcode: Opcode::CallIndirect,
            args: list,
            sig_ref,
        };
    }
    Ok(())
}

/// Makes every `func_addr` of `name` (for a [`Site::FunctionAddress`]) or
/// every `symbol_value` of a global value that is `name` (for a
/// [`Site::SymbolAddress`]) in `body` an alias of `address`; an error if
/// there is none, or one is not of `address`'s type.
fn address_from(
    body: &mut Function,
    site: &Site,
    name: &SymbolName,
    address: Value,
) -> Result<(), String> {
    let mut found = Vec::new();
    for block in body.layout.blocks() {
        for inst in body.layout.block_insts(block) {
            let names_it = match (site, body.dfg.insts[inst]) {
                (
                    Site::FunctionAddress(_),
                    InstructionData::FuncAddr {
                        opcode: Opcode::FuncAddr,
                        func_ref,
                    },
                ) => match body.dfg.ext_funcs.get(func_ref) {
                    Some(data) => SymbolName::of(body, &data.name),
                    None => return Err(format!("{inst} names {func_ref}, which is not declared")),
                },
                (
                    Site::SymbolAddress(_),
                    InstructionData::UnaryGlobalValue {
                        opcode: Opcode::SymbolValue,
                        global_value,
                    },
                ) => match body.global_values.get(global_value) {
                    Some(GlobalValueData::Symbol { name, .. }) => SymbolName::of(body, name),
                    Some(_) => None,
                    None => {
                        return Err(format!(
                            "{inst} names {global_value}, which is not declared"
                        ));
                    }
                },
                _ => None,
            };
            if names_it.as_ref() == Some(name) {
                found.push(inst);
            }
        }
    }
    if found.is_empty() {
        return Err(format!("no address of {name:?}"));
    }
    let ty = body.dfg.value_type(address);
    for inst in found {
        let Some(&result) = body.dfg.inst_results(inst).first() else {
            return Err(format!("{inst} has no result"));
        };
        if body.dfg.value_type(result) != ty {
            return Err(format!("{inst} is not of its parameter's type"));
        }
        body.layout.remove_inst(inst);
        body.dfg.clear_results(inst);
        body.dfg.change_to_alias(result, address);
    }
    Ok(())
}

/// `name` as an external name of `func` (a user name is declared in it).
fn external_name(func: &mut Function, name: &SymbolName) -> ExternalName {
    match name {
        SymbolName::User(user) => {
            ExternalName::User(func.declare_imported_user_function(user.clone()))
        }
        SymbolName::TestCase(bytes) => ExternalName::testcase(bytes),
    }
}

/// An error if anything in `body` still refers to `name` (an instruction
/// through a function reference or a global value, or a global value
/// through its base): the body would use `first`'s function or symbol
/// where another member uses its own.
fn no_reference_left(body: &Function, name: &SymbolName) -> Result<(), String> {
    // A reference to an entity that is not declared (possible in a block
    // the walk does not reach, with the verifier off) counts as one to
    // `name`: nothing shows that it is not.
    let names_it = |n: &ExternalName| SymbolName::of(body, n).as_ref() == Some(name);
    let gv_names_it = |gv: cranelift_codegen::ir::GlobalValue| match body.global_values.get(gv) {
        Some(GlobalValueData::Symbol { name, .. }) => names_it(name),
        Some(_) => false,
        None => true,
    };
    let func_names_it = |r: cranelift_codegen::ir::FuncRef| {
        body.dfg
            .ext_funcs
            .get(r)
            .is_none_or(|data| names_it(&data.name))
    };
    for block in body.layout.blocks() {
        for inst in body.layout.block_insts(block) {
            let refs = references_of(&body.dfg.insts[inst]);
            if refs.funcs.iter().any(|&r| func_names_it(r))
                || refs.global_values.iter().any(|&gv| gv_names_it(gv))
            {
                return Err(format!("{inst} still refers to {name:?}"));
            }
        }
    }
    for data in body.global_values.values() {
        if let GlobalValueData::Load { base, .. } | GlobalValueData::IAddImm { base, .. } = data
            && gv_names_it(*base)
        {
            return Err(format!("a global value's base refers to {name:?}"));
        }
    }
    if body
        .dfg
        .dynamic_types
        .values()
        .any(|ty| gv_names_it(ty.dynamic_scale))
    {
        return Err(format!("a dynamic type's scale refers to {name:?}"));
    }
    Ok(())
}

/// A thunk of `member`: a function with `member`'s name and signature
/// that calls `body` (a merged body with signature `body_sig`, named as a
/// `cranelift-module` name: namespace 0, the body's function id as index)
/// with its own arguments followed by `values` (one per parameter, as
/// constants of their types) and returns what it returns. With both
/// signatures in the `tail` convention it is a `return_call`; otherwise a
/// `call` and a `return`. Float values are `f32const`s and `f64const`s of
/// their raw bits. Where `member` checks a stack limit, the thunk checks
/// the same limit (its global values are copied), unless it tail-calls a
/// body whose arguments are all in registers on a target where that
/// leaves nothing on the stack before the body's own check
/// ([`thunk_skips_stack_check`]). `isa` is the target's.
pub fn thunk(
    isa: &dyn TargetIsa,
    member: &Function,
    body: UserExternalName,
    body_sig: &Signature,
    values: &[(Type, SiteValue)],
) -> Function {
    let sig = &member.signature;
    let tail_call = sig.call_conv == CallConv::Tail && body_sig.call_conv == CallConv::Tail;
    thunk_calling(isa, member, body, body_sig, values, tail_call)
}

/// [`thunk`], with a `return_call` only if `tail_call` (which needs both
/// signatures in the `tail` convention), and a `call` and a `return`
/// otherwise: for targets where a tail call cannot be compiled (x86-64
/// without `preserve_frame_pointers`, where Cranelift 0.135.8 asserts).
pub fn thunk_calling(
    isa: &dyn TargetIsa,
    member: &Function,
    body: UserExternalName,
    body_sig: &Signature,
    values: &[(Type, SiteValue)],
    tail_call: bool,
) -> Function {
    let sig = &member.signature;
    let tail_call =
        tail_call && sig.call_conv == CallConv::Tail && body_sig.call_conv == CallConv::Tail;
    let mut func = Function::with_name_signature(member.name.clone(), sig.clone());
    let arch = isa.triple().architecture;
    let skips_check = tail_call && thunk_skips_stack_check(arch, body_sig, &[]);
    func.stack_limit = member
        .stack_limit
        .filter(|_| !skips_check)
        .map(|limit| copy_global_value(member, limit, &mut func));
    let mut context = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut context);
    let block = b.create_block();
    b.append_block_params_for_function_params(block);
    b.switch_to_block(block);
    b.seal_block(block);
    let mut args = b.block_params(block).to_vec();
    for (ty, value) in values {
        args.push(match (*ty, value) {
            (types::F32, SiteValue::Bits(bits)) => {
                b.ins().f32const(Ieee32::with_bits(*bits as u32))
            }
            (types::F64, SiteValue::Bits(bits)) => {
                b.ins().f64const(Ieee64::with_bits(*bits as u64))
            }
            (ty, SiteValue::Bits(bits)) => b.ins().iconst(ty, *bits),
            (ty, SiteValue::Function(name, sig)) => {
                let signature = b.import_signature(sig.clone());
                let name = external_name(b.func, name);
                let callee = b.import_function(ExtFuncData {
                    name,
                    signature,
                    colocated: false,
                    patchable: false,
                });
                b.ins().func_addr(ty, callee)
            }
            (ty, SiteValue::Symbol(name)) => {
                let name = external_name(b.func, name);
                let symbol = b.create_global_value(GlobalValueData::Symbol {
                    name,
                    offset: Imm64::new(0),
                    colocated: false,
                    tls: false,
                });
                b.ins().symbol_value(ty, symbol)
            }
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
    b.finalize(isa.frontend_config());
    func
}

/// Copies global value `gv` of `from`, and the global values it is
/// computed from, into `to`; returns the copy. A symbol's name is declared
/// in `to` as it is named in `from`; a load's flags (and their alias
/// region) are interned in `to`.
fn copy_global_value(from: &Function, gv: GlobalValue, to: &mut Function) -> GlobalValue {
    let data = match from.global_values[gv].clone() {
        GlobalValueData::Load {
            base,
            offset,
            global_type,
            flags,
        } => {
            // Flags and their alias region are interned per function.
            let data = from.dfg.mem_flags[flags];
            let region = data.alias_region().map(|region| {
                to.dfg
                    .alias_regions
                    .insert(from.dfg.alias_regions[region].clone())
            });
            GlobalValueData::Load {
                base: copy_global_value(from, base, to),
                offset,
                global_type,
                flags: to
                    .dfg
                    .mem_flags
                    .insert_unchecked(data.with_alias_region(region)),
            }
        }
        GlobalValueData::IAddImm {
            base,
            offset,
            global_type,
        } => GlobalValueData::IAddImm {
            base: copy_global_value(from, base, to),
            offset,
            global_type,
        },
        GlobalValueData::Symbol {
            name,
            offset,
            colocated,
            tls,
        } => GlobalValueData::Symbol {
            name: match SymbolName::of(from, &name) {
                Some(symbol) => external_name(to, &symbol),
                None => name,
            },
            offset,
            colocated,
            tls,
        },
        data @ (GlobalValueData::VMContext | GlobalValueData::DynScaleTargetConst { .. }) => data,
    };
    to.create_global_value(data)
}

/// The values a thunk of member `member` passes: each parameter's value
/// in that member, with its type.
pub fn thunk_values(derived: &Derived, member: usize) -> Vec<(Type, SiteValue)> {
    derived
        .params
        .iter()
        .map(|p| (p.ty, p.values[member].clone()))
        .collect()
}
