//! What a function's code size is estimated from before it is compiled:
//! the instructions Cranelift lowers.
//!
//! # What this module guarantees
//!
//! [`live_instructions`] counts the instructions of `func` that are in a
//! block reachable from the entry block and that Cranelift lowers to
//! machine code: those with an effect other than their results, and those
//! whose results an instruction counted uses (as an operand or a block
//! argument). That is the rule of Cranelift 0.135.8's lowering
//! (`machinst/lower.rs`: an instruction whose results are all unused is
//! skipped unless `has_lowering_side_effect`, which is a call, branch,
//! terminator, trap, store, other side effect or a load, but
//! `get_pinned_reg`, `inst_predicates.rs`), applied to the function as
//! written (its mid-end removes no more than that). So a client's dead or
//! unreachable code does not make a function look larger to the cost
//! model ([`CostModel::predict`](super::CostModel::predict)). A value,
//! jump table or exception table the function does not have counts
//! nothing; like Cranelift's accessors, it panics on a loop of value
//! aliases (which the verifier rejects), so callers that may see
//! unverified functions catch panics around it.

use cranelift_codegen::entity::EntitySet;
use cranelift_codegen::ir::{Block, Function, Inst, InstructionData, Opcode, ValueDef};

/// What the cost model sizes a function by before it is compiled
/// ([`CostModel::function_bytes`](super::CostModel::function_bytes)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lowered {
    /// The instructions Cranelift lowers ([`live_instructions`]).
    pub instructions: u32,
    /// Whether one of them is a call of any kind (`Opcode::is_call`): a
    /// function without one is a leaf, which Cranelift compiles without a
    /// stack-limit check when it needs no stack (`gen_prologue` in
    /// `machinst/abi.rs`).
    pub calls: bool,
    /// Whether the function checks a stack limit (`Function::stack_limit`).
    pub stack_limited: bool,
}

/// [`Lowered`] of `func`: its live instructions, whether one is a call,
/// and whether it has a stack limit.
pub fn lowered(func: &Function) -> Lowered {
    let live = live_set(func);
    let calls = live
        .iter()
        .any(|&inst| func.dfg.insts[inst].opcode().is_call());
    Lowered {
        instructions: u32::try_from(live.len()).unwrap_or(u32::MAX),
        calls,
        stack_limited: func.stack_limit.is_some(),
    }
}

/// The number of instructions of `func` that Cranelift lowers (see the
/// module docs).
pub fn live_instructions(func: &Function) -> u32 {
    u32::try_from(live_set(func).len()).unwrap_or(u32::MAX)
}

/// The instructions of `func` that Cranelift lowers, in layout order.
fn live_set(func: &Function) -> Vec<Inst> {
    let (reachable, is_reachable) = reachable_blocks(func);
    let mut live: EntitySet<Inst> = EntitySet::new();
    let mut work: Vec<Inst> = Vec::new();
    for &block in &reachable {
        for inst in func.layout.block_insts(block) {
            if lowered_for_effect(func, inst) && live.insert(inst) {
                work.push(inst);
            }
        }
    }
    while let Some(inst) = work.pop() {
        if !tables_valid(func, inst) {
            continue;
        }
        for value in func.dfg.inst_values(inst) {
            if !func.dfg.value_is_valid(value) {
                continue;
            }
            let ValueDef::Result(def, _) = func.dfg.value_def(value) else {
                continue;
            };
            let in_reachable = func
                .layout
                .inst_block(def)
                .is_some_and(|b| is_reachable.contains(b));
            if in_reachable && live.insert(def) {
                work.push(def);
            }
        }
    }
    reachable
        .iter()
        .flat_map(|&b| func.layout.block_insts(b))
        .filter(|&inst| live.contains(inst))
        .collect()
}

/// Whether Cranelift lowers `inst` even when none of its results is used.
fn lowered_for_effect(func: &Function, inst: Inst) -> bool {
    let op = func.dfg.insts[inst].opcode();
    op != Opcode::GetPinnedReg
        && (op.is_call()
            || op.is_branch()
            || op.is_terminator()
            || op.is_return()
            || op.can_trap()
            || op.other_side_effects()
            || op.can_store()
            || op.can_load())
}

/// Whether the jump or exception table `inst` names exists (Cranelift's
/// accessors unwrap it).
fn tables_valid(func: &Function, inst: Inst) -> bool {
    let data = &func.dfg.insts[inst];
    let jump_table = match *data {
        InstructionData::BranchTable { table, .. } => func.dfg.jump_tables.get(table).is_some(),
        _ => true,
    };
    jump_table
        && data
            .exception_table()
            .is_none_or(|table| func.dfg.exception_tables.get(table).is_some())
}

/// The blocks reachable from the entry block, in the order first reached,
/// and as a set.
fn reachable_blocks(func: &Function) -> (Vec<Block>, EntitySet<Block>) {
    let Some(entry) = func.layout.entry_block() else {
        return (Vec::new(), EntitySet::new());
    };
    let mut seen: EntitySet<Block> = EntitySet::new();
    seen.insert(entry);
    let mut order = vec![entry];
    let mut next = 0;
    while let Some(&block) = order.get(next) {
        next += 1;
        for inst in func.layout.block_insts(block) {
            if !tables_valid(func, inst) {
                continue;
            }
            let data = &func.dfg.insts[inst];
            let dests = data.branch_destination(&func.dfg.jump_tables, &func.dfg.exception_tables);
            for dest in dests {
                let target = dest.block(&func.dfg.value_lists);
                if func.layout.is_block_inserted(target) && seen.insert(target) {
                    order.push(target);
                }
            }
        }
    }
    (order, seen)
}

#[cfg(test)]
mod tests {
    use super::{Lowered, live_instructions, lowered};
    use cranelift_codegen::ir::Function;

    fn parse(text: &str) -> Function {
        cranelift_reader::parse_functions(text).unwrap().remove(0)
    }

    #[test]
    fn dead_and_unreachable_instructions_are_not_counted() {
        // `v3` to `v5` are used by nothing with an effect; block2 is
        // reached from no block.
        let f = parse(
            "function %f(i64, i64) -> i64 {
             block0(v0: i64, v1: i64):
                 v2 = iadd v0, v1
                 v3 = imul v0, v1
                 v4 = bxor v3, v1
                 v5 = iadd v4, v1
                 brif v2, block1(v2), block1(v1)
             block1(v6: i64):
                 v7 = iadd v6, v6
                 return v7
             block2:
                 v8 = iconst.i64 9
                 return v8
             }",
        );
        // v2 (a branch operand and a block argument), the brif, v7 and
        // the return.
        assert_eq!(live_instructions(&f), 4);
    }

    #[test]
    fn effects_count_without_a_use_and_keep_their_operands() {
        let f = parse(
            "function %f(i64, i64) -> i64 {
                 fn0 = %g(i64) -> i64
             block0(v0: i64, v1: i64):
                 v2 = iadd v0, v1
                 store v1, v2
                 v3 = load.i64 notrap v2
                 v4 = call fn0(v1)
                 v5 = udiv v0, v1
                 v6 = iconst.i64 0
                 return v6
             }",
        );
        // All seven: the store (and its address), the unused load, the
        // call, the division that may trap, the constant returned.
        assert_eq!(live_instructions(&f), 7);
    }

    #[test]
    fn a_live_call_makes_a_function_no_leaf() {
        let text = |callee: &str| {
            format!(
                "function %f(i64) -> i64 {{
                     gv0 = vmctx
                     stack_limit = gv0
                     fn0 = %g(i64) -> i64 system_v
                 block0(v0: i64):
                     {callee}
                     return v0
                 block1:
                     v2 = call fn0(v0)
                     return v2
                 }}"
            )
        };
        // The only call is in a block nothing reaches.
        let leaf = lowered(&parse(&text("")));
        assert_eq!(
            leaf,
            Lowered {
                instructions: 1,
                calls: false,
                stack_limited: true
            }
        );
        let calls = lowered(&parse(&text("v1 = call fn0(v0)")));
        assert!(calls.calls);
        assert_eq!(calls.instructions, 2);
    }

    #[test]
    fn a_function_without_blocks_counts_nothing() {
        let f = Function::new();
        assert_eq!(live_instructions(&f), 0);
    }
}
