//! What compiling a function does with its value aliases, checked without
//! changing the function.
//!
//! Before it optimizes, `Context::optimize` (cranelift-codegen 0.135.8,
//! `src/context.rs`) removes unreachable blocks from the layout, clearing
//! the jump tables and exception tables no reachable block ends with
//! (`unreachable_code.rs`: a jump table keeps its default entry, an
//! exception table nothing), and then resolves every value alias
//! (`DataFlowGraph::resolve_all_aliases`, `src/ir/dfg.rs`), whatever the
//! flags. That pass panics on:
//!
//! - an alias whose chain loops or leaves the value table (placeholder
//!   values, which the parser makes, are skipped as a start, not as a
//!   link);
//! - a value that is not in the table, named by any instruction the
//!   function holds, in the layout or not, through its arguments, the
//!   entries of its jump table or exception table as they are after the
//!   clearing, or its exception table's contexts;
//! - a value-label key that is not in the table, or, for a label whose
//!   key is not an alias, a label alias target that is not.
//!
//! The verifier reads only the layout and the key only reachable code, so a
//! function built through the API with such a defect elsewhere would take
//! its twin's code where compiling it panics.
//!
//! # What this module guarantees
//!
//! [`check`] fails exactly when compiling the function panics in that
//! pass, with Cranelift's own panic, and never otherwise, for any function
//! built through Cranelift's API or parser. (A function deserialized with
//! serde can hold what neither makes: a placeholder whose packed entry has
//! a nonzero first word, which `values()` skips as a placeholder and the
//! pass does not; the public API cannot see that word.) It works in two
//! steps:
//!
//! 1. A filter that makes every table lookup the pass makes, and more
//!    (every entry of every jump table and exception table, where the
//!    pass looks only at those a reachable block ends with), on the
//!    function as it is, through Cranelift's own functions, in time linear
//!    in the size of the function (each alias chain is followed once,
//!    where Cranelift's `resolve_aliases` follows it again from each of
//!    its aliases). The passes before
//!    (`remove_constant_phis` turns block parameters into aliases, whose
//!    labels the pass then drops) only take lookups away, so a function
//!    the filter passes compiles through the pass.
//! 2. For a function the filter fails, Cranelift's own passes, in
//!    `Context::optimize`'s order up to and including the pass, on a copy:
//!    their outcome is the check's.
//!
//! The filter's lookups for the instructions (`named_values_exist`) are
//! left out where a walk of the function showed that every value they
//! name exists ([`Named::values_exist`], from
//! [`crate::Walk::named_values_exist`]: the walk encoded every instruction
//! the function holds, with all the values the filter would look up, and
//! found each in the table), and its pass over the value table
//! (`chains_end`) where the walk found every alias chain one link long
//! ([`Named::chains_short`], from [`alias_chains_short`], which a batch
//! flush reads with its walks ahead of a function's turn where the flags
//! make this check the only one a function defined without compiling
//! goes through: on one thread,
//! when the function is recorded, while its value table is still in the
//! CPU's caches; its rewrites of references change no value, so it holds
//! for the rewritten function).

use super::define::panic_as_error;
use cranelift_codegen::entity::EntityRef;
use cranelift_codegen::ir::{self, Function};
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::{CodegenResult, Context};
use cranelift_module::{ModuleError, ModuleResult};

/// What is known, before [`check`], of the values a function names: each
/// fact `true` only where a walk of the function, as it is now, showed it;
/// `false` says nothing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Named {
    /// Every value its instructions name exists
    /// ([`crate::Walk::named_values_exist`]).
    pub(super) values_exist: bool,
    /// Every alias chain of its value table is one link long
    /// ([`alias_chains_short`]).
    pub(super) chains_short: bool,
}

impl Named {
    /// Nothing is known.
    pub(super) const UNKNOWN: Self = Self {
        values_exist: false,
        chains_short: false,
    };

    /// What `walk`, a walk of the function as it is now, showed.
    pub(super) fn of(walk: &crate::plan::WalkRef<'_>) -> Self {
        Self {
            values_exist: walk.named_values_exist,
            chains_short: walk.alias_chains_short,
        }
    }
}

/// Fails, with [`DedupError::CraneliftPanic`](super::DedupError), when
/// compiling `func` would panic resolving its aliases (see the module
/// docs); `named` is what is known of its values (see [`Named`]).
pub(super) fn check(func: &Function, isa: &dyn TargetIsa, named: Named) -> ModuleResult<()> {
    let filter = panic_as_error(func, || {
        if !named.chains_short {
            chains_end(&func.dfg);
        }
        if !named.values_exist {
            named_values_exist(func);
        }
        labels_exist(&func.dfg);
        Ok(())
    });
    if filter.is_ok() {
        return filter;
    }
    // What `Context::optimize` runs, up to resolving aliases.
    let mut ctx = Context::for_function(func.clone());
    panic_as_error(func, || {
        let mut passes = || -> CodegenResult<()> {
            if isa.flags().enable_nan_canonicalization() {
                ctx.canonicalize_nans(isa)?;
            }
            ctx.verify_if(isa)?;
            ctx.compute_cfg();
            ctx.compute_domtree();
            ctx.eliminate_unreachable_code(isa)?;
            ctx.remove_constant_phis(isa)?;
            ctx.func.dfg.resolve_all_aliases();
            Ok(())
        };
        passes().map_err(ModuleError::Compilation)
    })
}

/// Whether every alias of `dfg`'s value table names a value in the table
/// that is no alias (placeholders, which the parser makes and Cranelift's
/// alias pass skips, aside): then resolving every alias, which compiling
/// does, follows one link from each and neither loops nor leaves the
/// table. Most functions have no alias, or only such: nothing to follow
/// further, nothing to keep. One pass over the value table, in a loop of
/// Cranelift's own (`values()` leaves out the placeholders, most of the
/// table of a large function of the wasm corpora);
/// `value_alias_dest_for_serialization` is `#[cold]`, asked only of
/// aliases.
pub(super) fn alias_chains_short(dfg: &ir::DataFlowGraph) -> bool {
    dfg.values().all(|value| {
        !dfg.value_is_alias(value)
            || dfg
                .value_alias_dest_for_serialization(value)
                .is_some_and(|next| dfg.value_is_valid(next) && !dfg.value_is_alias(next))
    })
}

/// Panics if an alias's chain loops or leaves the value table.
fn chains_end(dfg: &ir::DataFlowGraph) {
    if alias_chains_short(dfg) {
        return;
    }
    const UNSEEN: u8 = 0;
    const ON_CHAIN: u8 = 1;
    const ENDS: u8 = 2;
    let mut state = vec![UNSEEN; dfg.num_values()];
    let mut chain = Vec::new();
    // `values()` leaves out the placeholders the pass skips too.
    for value in dfg.values() {
        let mut at = value;
        while state[at.index()] == UNSEEN {
            let Some(next) = dfg.value_alias_dest_for_serialization(at) else {
                break;
            };
            state[at.index()] = ON_CHAIN;
            chain.push(at);
            if !dfg.value_is_valid(next) || state[next.index()] == ON_CHAIN {
                // A loop, or a value that is not in the table: Cranelift's
                // own lookup panics, with its message.
                dfg.resolve_aliases(value);
            }
            at = next;
        }
        state[at.index()] = ENDS;
        for link in chain.drain(..) {
            state[link.index()] = ENDS;
        }
    }
}

/// Panics if an instruction names a value that is not in the table:
/// through its arguments, every entry of its jump table or exception
/// table and the exception table's contexts. That is every lookup the pass
/// makes and more (it looks only at the default entry of a jump table no
/// reachable block ends with, and at no entry or context of such an
/// exception table), so the filter needs no control-flow graph; a function
/// it fails for a value the pass would not look up is decided by the
/// passes themselves (step 2 of the module docs).
fn named_values_exist(func: &Function) {
    let dfg = &func.dfg;
    let exists = |value: &ir::Value| dfg.value_is_valid(*value);
    for inst in (0..dfg.num_insts()).map(ir::Inst::new) {
        // What `inst_values` yields, read without its iterator chain: the
        // arguments, the arguments of each branch destination, then the
        // contexts of its exception table.
        let data = &dfg.insts[inst];
        let all_exist = data.arguments(&dfg.value_lists).iter().all(exists)
            && data
                .branch_destination(&dfg.jump_tables, &dfg.exception_tables)
                .iter()
                .all(|call| {
                    call.args(&dfg.value_lists)
                        .all(|arg| arg.as_value().as_ref().is_none_or(exists))
                })
            && data.exception_table().is_none_or(|table| {
                dfg.exception_tables[table].items().all(|item| match item {
                    ir::ExceptionTableItem::Context(value) => exists(&value),
                    ir::ExceptionTableItem::Tag(..) | ir::ExceptionTableItem::Default(_) => true,
                })
            });
        if all_exist {
            continue;
        }
        for value in dfg.inst_values(inst) {
            // A value out of the table: indexed as the pass does, which
            // panics.
            if !dfg.value_is_valid(value) {
                dfg.value_is_alias(value);
            }
        }
    }
}

/// Panics if a value-label key is not in the table, or the alias target of
/// a label whose key is no alias is not (the pass drops the labels of
/// aliases before it looks at targets).
fn labels_exist(dfg: &ir::DataFlowGraph) {
    for (&key, assignments) in dfg.values_labels.iter().flatten() {
        if dfg.value_is_alias(key) {
            continue;
        }
        if let ir::ValueLabelAssignments::Alias { value, .. } = assignments {
            dfg.value_is_alias(*value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Named, check};
    use cranelift_codegen::Context;
    use cranelift_codegen::control::ControlPlane;
    use cranelift_codegen::cursor::{Cursor, FuncCursor};
    use cranelift_codegen::ir::{self, AbiParam, Function, InstBuilder, types::I64};
    use cranelift_codegen::isa::{CallConv, OwnedTargetIsa};
    use cranelift_codegen::settings::{self, Configurable};

    /// The host's ISA with the verifier off, as embedders ship it.
    fn isa() -> OwnedTargetIsa {
        let mut flags = settings::builder();
        flags.set("enable_verifier", "false").unwrap();
        cranelift_codegen::isa::lookup(target_lexicon::Triple::host())
            .unwrap()
            .finish(settings::Flags::new(flags))
            .unwrap()
    }

    /// `f(x)` in the `tail` convention, returning `x`, with a `try_call`
    /// of an imported `g(x)` whose exception table holds the context
    /// `context` (and a default target): in the entry block, or, when not
    /// `reachable`, in a block of the layout no branch reaches.
    fn try_call_with_context(context: ir::Value, reachable: bool) -> Function {
        let mut sig = ir::Signature::new(CallConv::Tail);
        sig.params.push(AbiParam::new(I64));
        sig.returns.push(AbiParam::new(I64));
        let mut func = Function::with_name_signature(ir::UserFuncName::user(0, 0), sig.clone());
        let sig_ref = func.import_signature(sig);
        let name = func.declare_imported_user_function(ir::UserExternalName::new(0, 1));
        let callee = func.import_function(ir::ExtFuncData {
            name: ir::ExternalName::user(name),
            signature: sig_ref,
            colocated: false,
            patchable: false,
        });
        let [entry, call, returned, caught] = [(); 4].map(|()| func.dfg.make_block());
        let x = func.dfg.append_block_param(entry, I64);
        func.dfg.append_block_param(returned, I64);
        let mut pos = FuncCursor::new(&mut func);
        for block in [entry, call, returned, caught] {
            pos.insert_block(block);
        }
        pos.goto_bottom(entry);
        if reachable {
            pos.ins().jump(call, &[ir::BlockArg::Value(x)]);
        } else {
            pos.ins().return_(&[x]);
        }
        let arg = pos.func.dfg.append_block_param(call, I64);
        pos.goto_bottom(call);
        let normal = pos
            .func
            .dfg
            .block_call(returned, &[ir::BlockArg::TryCallRet(0)]);
        let default = pos.func.dfg.block_call(caught, &[]);
        let items = [
            ir::ExceptionTableItem::Context(context),
            ir::ExceptionTableItem::Default(default),
        ];
        let table = ir::ExceptionTableData::new(sig_ref, normal, items);
        let table = pos.func.dfg.exception_tables.push(table);
        pos.ins().try_call(callee, &[arg], table);
        pos.goto_bottom(returned);
        let r = pos.func.dfg.block_params(returned)[0];
        pos.ins().return_(&[r]);
        pos.goto_bottom(caught);
        pos.ins().return_(&[arg]);
        func
    }

    /// Whether compiling `func` panics (Cranelift's own verdict).
    fn compiling_panics(func: &Function) -> bool {
        let isa = isa();
        crate::compile::with_quiet_panics(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut ctx = Context::for_function(func.clone());
                let _ = ctx.compile(&*isa, &mut ControlPlane::default());
            }))
        })
        .is_err()
    }

    /// An instruction in two blocks' lists (which `Layout`'s debug
    /// assertions reject, so this runs only in builds without them: `cargo
    /// test --release`) counts twice in a walk, as many encoded
    /// instructions as the function holds when one outside the layout
    /// names a value not in the table: the walk must not take that count
    /// for every instruction encoded. (Found in review: the walk once did,
    /// and the check then passed a function whose compile panics.)
    #[cfg(not(debug_assertions))]
    #[test]
    fn an_instruction_in_two_blocks_does_not_stand_for_one_outside_the_layout() {
        let mut sig = ir::Signature::new(CallConv::SystemV);
        sig.params.push(AbiParam::new(I64));
        let mut func = Function::with_name_signature(ir::UserFuncName::user(0, 0), sig);
        let [entry, then, other] = [(); 3].map(|()| func.dfg.make_block());
        let x = func.dfg.append_block_param(entry, I64);
        let mut pos = FuncCursor::new(&mut func);
        for block in [entry, then, other] {
            pos.insert_block(block);
        }
        pos.goto_bottom(entry);
        pos.ins().brif(x, then, &[], other, &[]);
        let ret = func.dfg.make_inst(ir::InstructionData::MultiAry {
            opcode: ir::Opcode::Return,
            args: ir::ValueList::new(),
        });
        func.layout.append_inst(ret, then);
        func.layout.append_inst(ret, other);
        func.dfg.make_inst(ir::InstructionData::Unary {
            opcode: ir::Opcode::Ineg,
            arg: ir::Value::from_u32(1000),
        });
        assert_eq!(func.dfg.num_insts(), 3);
        let named = named_by_walk(&func);
        assert!(!named.values_exist);
        assert!(check(&func, &*isa(), named).is_err());
    }

    /// A function of an `i64` to an `i64` with an empty entry block, in
    /// the layout: its parameter and the block.
    fn taking_an_i64() -> (Function, (ir::Value, ir::Block)) {
        let mut sig = ir::Signature::new(CallConv::SystemV);
        sig.params.push(AbiParam::new(I64));
        sig.returns.push(AbiParam::new(I64));
        let mut func = Function::with_name_signature(ir::UserFuncName::user(0, 0), sig);
        let entry = func.dfg.make_block();
        let x = func.dfg.append_block_param(entry, I64);
        func.layout.append_block(entry);
        (func, (x, entry))
    }

    /// What a walk of `func` ahead of its turn (as a batch flush walks
    /// it, for [`isa`], whose flags enable neither the verifier nor NaN
    /// canonicalization) shows of its values.
    fn named_by_walk(func: &Function) -> Named {
        let mut walker = crate::fingerprint::Fingerprinter::new();
        let walk = super::super::verify::walk_ahead(&mut walker, func, &*isa()).expect("walks");
        Named::of(&walk.as_ref())
    }

    /// The parser's placeholders (which fill gaps in value numbering) are
    /// skipped by Cranelift's alias pass, but a chain that leads to one
    /// leaves the table there: the check says what compiling does, both
    /// ways.
    #[test]
    fn a_placeholder_is_no_alias_but_no_link_either() {
        let isa = isa();
        let (mut func, (x, entry)) = taking_an_i64();
        FuncCursor::new(&mut func)
            .at_bottom(entry)
            .ins()
            .return_(&[x]);
        func.dfg.make_invalid_value_for_parser();
        func.dfg.make_invalid_value_for_parser();
        let [placeholder, other] = [1, 2].map(ir::Value::from_u32);
        assert!(!compiling_panics(&func));
        assert!(check(&func, &*isa, Named::UNKNOWN).is_ok());
        // A walk passes over placeholders: no chain to follow.
        assert!(named_by_walk(&func).chains_short);
        func.dfg
            .make_value_alias_for_serialization(placeholder, other);
        assert!(compiling_panics(&func));
        assert!(!named_by_walk(&func).chains_short);
        assert!(check(&func, &*isa, Named::UNKNOWN).is_err());
    }

    /// A context value outside the value table: Cranelift's alias pass
    /// looks it up when the `try_call` is reachable (and panics), and not
    /// when it is not (its table is cleared first); the check says the
    /// same, told nothing or what a walk showed. (The filter once left
    /// contexts out, and passed the first.)
    #[test]
    fn an_exception_context_out_of_the_table_fails_where_compiling_panics() {
        let isa = isa();
        let missing = ir::Value::from_u32(1000);
        for reachable in [true, false] {
            let func = try_call_with_context(missing, reachable);
            assert_eq!(compiling_panics(&func), reachable, "reachable: {reachable}");
            // The walk met the missing value, or did not encode the
            // unreachable `try_call`: it shows nothing.
            assert!(!named_by_walk(&func).values_exist);
            for named in [Named::UNKNOWN, named_by_walk(&func)] {
                assert_eq!(
                    check(&func, &*isa, named).is_err(),
                    reachable,
                    "reachable: {reachable}"
                );
            }
        }
        // A context in the table passes, and the walk shows that every
        // named value exists.
        let func = try_call_with_context(ir::Value::from_u32(0), true);
        assert!(!compiling_panics(&func));
        let named = named_by_walk(&func);
        assert!(named.values_exist);
        assert!(check(&func, &*isa, Named::UNKNOWN).is_ok());
        assert!(check(&func, &*isa, named).is_ok());
    }

    /// `f(x) = x + 1`, returning `x + 1` through a chain of `links`
    /// aliases, the first of the sum, each other of the one before (made
    /// as the parser makes them: a placeholder, then made an alias).
    fn returning_through_aliases(links: u32) -> Function {
        let (mut func, (x, entry)) = taking_an_i64();
        let mut pos = FuncCursor::new(&mut func).at_bottom(entry);
        let sum = pos.ins().iadd_imm_s(x, 1);
        let mut last = sum;
        for _ in 0..links {
            pos.func.dfg.make_invalid_value_for_parser();
            let alias = ir::Value::from_u32(pos.func.dfg.num_values() as u32 - 1);
            // Makes `alias` an alias of `last`.
            pos.func.dfg.make_value_alias_for_serialization(last, alias);
            last = alias;
        }
        pos.ins().return_(&[last]);
        func
    }

    /// A walk says the chains are one link long only where they are: a
    /// single alias of a value is, a chain of two is not; and the check,
    /// told either, says what compiling does, where a chain made into a
    /// loop (which no walk shows as short) panics.
    #[test]
    fn a_walk_shows_chains_short_only_where_each_alias_names_a_value() {
        let isa = isa();
        for (links, short) in [(0, true), (1, true), (2, false), (3, false)] {
            let func = returning_through_aliases(links);
            let named = named_by_walk(&func);
            assert_eq!(named.chains_short, short, "{links} links");
            assert!(named.values_exist, "{links} links");
            assert!(!compiling_panics(&func), "{links} links");
            for named in [Named::UNKNOWN, named] {
                assert!(check(&func, &*isa, named).is_ok(), "{links} links");
            }
        }
        // Two values no instruction names, made aliases of each other: a
        // loop, which compiling resolves, and panics on.
        let mut func = returning_through_aliases(1);
        let first = func.dfg.num_values() as u32;
        func.dfg.make_invalid_value_for_parser();
        func.dfg.make_invalid_value_for_parser();
        let [p, q] = [first, first + 1].map(ir::Value::from_u32);
        func.dfg.make_value_alias_for_serialization(p, q);
        func.dfg.make_value_alias_for_serialization(q, p);
        assert!(compiling_panics(&func));
        let named = named_by_walk(&func);
        assert!(!named.chains_short);
        assert!(check(&func, &*isa, named).is_err());
        assert!(check(&func, &*isa, Named::UNKNOWN).is_err());
    }
}
