//! A small deterministic generator of CLIF functions for tests: one abstract
//! program per seed, emitted through `FunctionBuilder` in several ways that
//! must not change the fingerprint (block creation order, layout order, dead
//! code, source locations, names).

use cranelift_codegen::ir::{
    self, AbiParam, ExtFuncData, ExternalName, Function, InstBuilder, MemFlagsData, Signature,
    StackSlotData, StackSlotKind, UserFuncName, condcodes::IntCC, types::I64,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};

/// How to emit a program; none of these may change its fingerprint.
#[derive(Clone, Copy, Debug, Default)]
pub struct Variant {
    /// Create blocks in reverse order (different block numbers).
    pub reverse_block_creation: bool,
    /// Lay non-entry blocks out in reverse order.
    pub reverse_layout: bool,
    /// Insert instructions and remove them again, and unused values.
    pub dead_code: bool,
    /// Give every instruction a source location.
    pub srclocs: bool,
    /// The function's name.
    pub name: u32,
}

/// Splitmix64: a tiny deterministic random source.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Debug)]
enum Op {
    Bin(u8, usize, usize, usize),
    Const(usize, i64),
    Cmp(u8, usize, usize, usize),
    Float(usize, u64),
    Store(usize, usize),
    Load(usize, usize),
    Call(usize, usize, usize),
}

#[derive(Clone, Debug)]
enum Term {
    Jump(usize),
    Brif(usize, usize, usize),
    Table(usize, Vec<usize>),
    Return(usize),
}

/// An abstract program: straight-line ops per block and a terminator.
#[derive(Clone, Debug)]
pub struct Program {
    blocks: Vec<(Vec<Op>, Term)>,
}

const VARS: usize = 4;

impl Program {
    /// The program for `seed`: 1 to 5 blocks, forward and backward edges.
    pub fn generate(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let n = 1 + rng.below(5) as usize;
        let mut blocks = Vec::new();
        for b in 0..n {
            let mut ops = Vec::new();
            for _ in 0..1 + rng.below(6) {
                let v = |rng: &mut Rng| rng.below(VARS as u64) as usize;
                ops.push(match rng.below(7) {
                    0 => Op::Bin(rng.below(6) as u8, v(&mut rng), v(&mut rng), v(&mut rng)),
                    1 => Op::Const(v(&mut rng), rng.next() as i64 >> rng.below(64)),
                    2 => Op::Cmp(rng.below(10) as u8, v(&mut rng), v(&mut rng), v(&mut rng)),
                    3 => {
                        let bits = [
                            0x8000_0000_0000_0000,
                            0x7ff8_0000_0000_0001,
                            0x7ff8_0000_0000_0002,
                            0x3ff0_0000_0000_0000,
                        ];
                        Op::Float(v(&mut rng), bits[rng.below(4) as usize])
                    }
                    4 => Op::Store(rng.below(2) as usize, v(&mut rng)),
                    5 => Op::Load(v(&mut rng), rng.below(2) as usize),
                    _ => Op::Call(v(&mut rng), rng.below(2) as usize, v(&mut rng)),
                });
            }
            let target = |rng: &mut Rng| rng.below(n as u64) as usize;
            let term = if b + 1 == n {
                Term::Return(rng.below(VARS as u64) as usize)
            } else {
                match rng.below(4) {
                    0 => Term::Jump(b + 1),
                    1 => Term::Brif(rng.below(VARS as u64) as usize, b + 1, target(&mut rng)),
                    2 => Term::Table(
                        rng.below(VARS as u64) as usize,
                        (0..1 + rng.below(3))
                            .map(|_| target(&mut rng))
                            .chain([b + 1])
                            .collect(),
                    ),
                    _ => Term::Jump(target(&mut rng).max(b + 1)),
                }
            };
            blocks.push((ops, term));
        }
        Program { blocks }
    }

    /// Emits the program as a CLIF function.
    pub fn build(&self, variant: Variant) -> Function {
        let mut sig = Signature::new(CallConv::SystemV);
        sig.params.push(AbiParam::new(I64));
        sig.params.push(AbiParam::new(I64));
        sig.returns.push(AbiParam::new(I64));
        let mut func =
            Function::with_name_signature(UserFuncName::user(0, variant.name), sig.clone());
        let mut ctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut func, &mut ctx);
        let n = self.blocks.len();
        let mut blocks = vec![None; n];
        let order: Vec<usize> = if variant.reverse_block_creation {
            (0..n).rev().collect()
        } else {
            (0..n).collect()
        };
        for &i in &order {
            blocks[i] = Some(b.create_block());
        }
        let blocks: Vec<_> = blocks.into_iter().map(Option::unwrap).collect();
        let slots = [
            b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 8, 3)),
            b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 8, 3)),
        ];
        let callees: Vec<_> = (0..2)
            .map(|k| {
                let mut s = Signature::new(CallConv::SystemV);
                s.params.push(AbiParam::new(I64));
                s.returns.push(AbiParam::new(I64));
                let signature = b.import_signature(s);
                let name = b
                    .func
                    .declare_imported_user_function(ir::UserExternalName::new(1, k));
                b.import_function(ExtFuncData {
                    name: ExternalName::user(name),
                    signature,
                    colocated: false,
                    patchable: false,
                })
            })
            .collect();
        let vars: Vec<Variable> = (0..VARS).map(|_| b.declare_var(I64)).collect();
        let entry = blocks[0];
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let params = b.block_params(entry).to_vec();
        for (i, &var) in vars.iter().enumerate() {
            b.def_var(var, params[i % 2]);
        }
        // Emit in program order (SSA construction depends on the order of
        // `use_var` calls); the layout is permuted afterwards.
        let mut srcloc = 1u32;
        for bi in 0..n {
            let block = blocks[bi];
            if bi != 0 {
                b.switch_to_block(block);
            }
            let (ops, term) = &self.blocks[bi];
            for op in ops {
                if variant.srclocs {
                    b.set_srcloc(ir::SourceLoc::new(srcloc));
                    srcloc += 7;
                }
                if variant.dead_code {
                    let dead = b.ins().iconst(I64, 12345);
                    let sum = b.ins().iadd(dead, dead);
                    for v in [sum, dead] {
                        let inst = b.func.dfg.value_def(v).unwrap_inst();
                        b.func.layout.remove_inst(inst);
                    }
                }
                emit_op(&mut b, op, &vars, &slots, &callees);
            }
            match *term {
                Term::Jump(t) => {
                    b.ins().jump(blocks[t], &[]);
                }
                Term::Brif(c, t, e) => {
                    let c = b.use_var(vars[c]);
                    b.ins().brif(c, blocks[t], &[], blocks[e], &[]);
                }
                Term::Table(c, ref targets) => {
                    let c = b.use_var(vars[c]);
                    let c = b.ins().ireduce(ir::types::I32, c);
                    let pool = &mut b.func.dfg.value_lists;
                    let calls: Vec<_> = targets[..targets.len() - 1]
                        .iter()
                        .map(|&t| ir::BlockCall::new(blocks[t], [], pool))
                        .collect();
                    let default = ir::BlockCall::new(blocks[*targets.last().unwrap()], [], pool);
                    let jt = b.create_jump_table(ir::JumpTableData::new(default, &calls));
                    b.ins().br_table(c, jt);
                }
                Term::Return(v) => {
                    let v = b.use_var(vars[v]);
                    b.ins().return_(&[v]);
                }
            }
        }
        for &block in &blocks {
            b.seal_block(block);
        }
        b.finalize(TargetFrontendConfig {
            default_call_conv: CallConv::SystemV,
            pointer_width: target_lexicon::PointerWidth::U64,
            page_size_align_log2: 12,
        });
        if variant.reverse_layout {
            // Move the non-entry blocks, with their instructions, to the end
            // of the layout in reverse order.
            for &block in blocks[1..].iter().rev() {
                let insts: Vec<_> = func.layout.block_insts(block).collect();
                for &inst in &insts {
                    func.layout.remove_inst(inst);
                }
                func.layout.remove_block(block);
                func.layout.append_block(block);
                for inst in insts {
                    func.layout.append_inst(inst, block);
                }
            }
        }
        func
    }
}

fn emit_op(
    b: &mut FunctionBuilder,
    op: &Op,
    vars: &[Variable],
    slots: &[ir::StackSlot],
    callees: &[ir::FuncRef],
) {
    match *op {
        Op::Bin(k, d, x, y) => {
            let (x, y) = (b.use_var(vars[x]), b.use_var(vars[y]));
            let r = match k {
                0 => b.ins().iadd(x, y),
                1 => b.ins().isub(x, y),
                2 => b.ins().imul(x, y),
                3 => b.ins().band(x, y),
                4 => b.ins().bor(x, y),
                _ => b.ins().bxor(x, y),
            };
            b.def_var(vars[d], r);
        }
        Op::Const(d, c) => {
            let r = b.ins().iconst(I64, c);
            b.def_var(vars[d], r);
        }
        Op::Cmp(cc, d, x, y) => {
            let (x, y) = (b.use_var(vars[x]), b.use_var(vars[y]));
            let c = b.ins().icmp(IntCC::all()[cc as usize], x, y);
            let r = b.ins().uextend(I64, c);
            b.def_var(vars[d], r);
        }
        Op::Float(d, bits) => {
            let f = b.ins().f64const(ir::immediates::Ieee64::with_bits(bits));
            let r = b.ins().bitcast(I64, MemFlagsData::new(), f);
            b.def_var(vars[d], r);
        }
        Op::Store(s, x) => {
            let x = b.use_var(vars[x]);
            b.ins().stack_store(I64, x, slots[s], 0);
        }
        Op::Load(d, s) => {
            let r = b.ins().stack_load(I64, I64, slots[s], 0);
            b.def_var(vars[d], r);
        }
        Op::Call(d, f, x) => {
            let x = b.use_var(vars[x]);
            let call = b.ins().call(callees[f], &[x]);
            let r = b.inst_results(call)[0];
            b.def_var(vars[d], r);
        }
    }
}
