//! Random programs for differential testing: several functions with calls
//! among them, built from `arbitrary` bytes, and their variants. This is
//! the project's one program generator: the fingerprint tests build single
//! functions from it too ([`Body::from_bytes`], [`standalone`]).
//!
//! # What this module guarantees
//!
//! - Every generated function passes the verifier, has the signature
//!   `(i64, i64) -> i64` (or `-> i32` with `uext` or `sext`, which the
//!   callee extends to 64 bits) in a calling convention whose integer
//!   argument and return registers are the host default's
//!   ([`Body::signature`]), so a harness calls it as
//!   `extern "C" fn(i64, i64) -> i64`, and
//!   always terminates: loops are bounded by a fuel counter checked at every
//!   block, and function `i` only calls functions `j > i`
//!   except for its own recursive call, which it makes at most once per
//!   invocation, in its entry block, with a second argument whose low two
//!   bits are one less (so recursion is at most three calls deep).
//! - It traps only in an [`Op::Trapping`] (a `trapz`, or a division whose
//!   divisor may be zero or overflow), in the stack check of a function
//!   with a stack limit ([`Body::stack_limit`]), or in a function that
//!   calls one: all
//!   other divisions are guarded, shift amounts are masked, the stack
//!   accesses stay inside their slots, and [`Op::GuardedTrap`] never fires.
//! - A [`Variant`] changes how a body is emitted (block creation order,
//!   layout order, dead instructions, source locations), never what it
//!   computes: every variant of a body gets one fingerprint, and so does
//!   every [`standalone`] function of it, whatever its name.
//! - A [`Form::Twin`] is emitted from the same [`Body`] as its original as
//!   [`Variant::TWIN`] (blocks created in another order, dead instructions,
//!   another layout order and source locations): it must get the original's
//!   fingerprint.
//! - A [`Form::Mutant`] is its original with one constant changed: it must
//!   get another fingerprint.
//! - A [`Form::FlagMutant`] is its original with one flag or immediate
//!   changed (a condition code, the memory flags of its stack accesses, the
//!   trap code of its traps, its calling convention, or the extension of its
//!   parameters and result): it must get another fingerprint when the
//!   changed part is reachable. Memory-flag, trap-code and convention
//!   mutants compute what their original computes; merging them would
//!   still be wrong (a trap code is what a runtime reports, a convention is
//!   how callers call). An extension mutant returns other bits for most
//!   results (on [`NARROW_RETURNS`] hosts an extended result keeps only
//!   its low 32 bits, zero- or sign-extended).
//! - A [`Form::FrameMutant`] is its original with two stack slots swapped
//!   in index order (same slots, same uses, another frame layout): it must
//!   get another fingerprint exactly when [`Body::frame`] changes (a used
//!   slot moves, or slots of other sizes trade places, unused ones
//!   included), since Cranelift lays the frame out in index order, and
//!   [`Op::SlotDistance`] and the stack check make that layout observable.
//! - A [`Form::DeclTwin`] is a twin that declares its callees and their
//!   signatures in reverse order, each twice when `duplicates` is set
//!   (calls use the first declaration, indirect calls the second, with a
//!   signature declared again): the same code, so merging it is right,
//!   and its merges are checked by machine code.
//! - A [`Form::Relinked`] is a twin whose calls go to the functions after
//!   itself instead of those after its original: the same code calling
//!   other functions, which exercises code reuse (same template, other
//!   names) and must still compute what plain compilation computes.

use arbitrary::{Arbitrary, Result, Unstructured};
use cranelift_codegen::ir::{
    self, Function, InstBuilder, StackSlotData, StackSlotKind, UserFuncName, condcodes::IntCC,
    types::F64, types::I64, types::I64X2,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};

/// Number of `i64` variables a body computes with.
const VARS: u8 = 4;
/// Blocks a function may run before it returns (bounds loops).
const FUEL: i64 = 48;
/// The bits of the float constants [`Op::FloatConst`] uses: negative
/// zero, two NaNs that differ only in their payload, and one.
pub const FLOAT_BITS: [u64; 4] = [
    0x8000_0000_0000_0000,
    0x7ff8_0000_0000_0001,
    0x7ff8_0000_0000_0002,
    0x3ff0_0000_0000_0000,
];

/// A straight-line operation on the variables.
#[derive(Clone, Debug)]
pub enum Op {
    /// `d = a op b` for an integer binary op (0..6: add, sub, mul, and, or, xor).
    Int(u8, u8, u8, u8),
    /// `d = constant k` (index into [`Body::constants`]).
    Const(u8, u8),
    /// `d = (a cc b) ? a : b` for one of the ten integer condition codes.
    Select(u8, u8, u8, u8),
    /// `d = uextend(a cc b)` for one of the ten integer condition codes.
    Compare(u8, u8, u8, u8),
    /// `d = a / (b | 1)` (signed or not; signed `MIN / -1` avoided).
    Div(bool, u8, u8, u8),
    /// `d = a shift (b & 63)` (0: shl, 1: ushr, 2: sshr, 3: rotl).
    Shift(u8, u8, u8, u8),
    /// `d = bits(f64(a) op f64(b))` (0: add, 1: mul, 2: min, 3: max).
    Float(u8, u8, u8, u8),
    /// `d = bits(f64const FLOAT_BITS[k])` (modulo their number): a float
    /// constant, no float operation.
    FloatConst(u8, u8),
    /// Store `a` into stack slot `s`, then `d = ` the other slot.
    Slots(u8, u8, u8),
    /// As [`Op::Slots`], with `stack_store` and `stack_load` (no address,
    /// no memory flags).
    StackSlots(u8, u8, u8),
    /// `d = call fN(a, b)` for a later function (by offset).
    Call(u8, u8, u8, u8),
    /// `d = call_indirect (func_addr fN)(a, b)` for a later function.
    CallIndirect(u8, u8, u8, u8),
    /// `d = lane (k & 1) of ([a, b] op [b, a])` on `i64x2` (0..4: add, sub,
    /// mul, xor).
    Vector(u8, u8, u8, u8),
    /// A trap that never fires: `trapnz` on "the fuel counter is negative"
    /// (it is positive in every code block), with the body's trap code.
    GuardedTrap,
    /// `d ^= stack_addr(slot s) - stack_addr(slot t)`, slots by their
    /// logical number (modulo [`Body::slot_count`]): where the frame layout
    /// puts them, observed.
    SlotDistance(u8, u8, u8),
    /// A trap that fires on some inputs: 0: `trapz b` with the body's trap
    /// code; 1: `d = a / b` unsigned, 2: signed, with nothing guarded (a
    /// zero divisor traps, and so does `MIN / -1`).
    Trapping(u8, u8, u8, u8),
}

/// Which flag a [`Form::FlagMutant`] changes.
#[derive(Clone, Copy, Debug)]
pub enum Flag {
    /// The condition code of one `Select` or `Compare` op (by index among
    /// those ops, modulo their number).
    Condition(usize),
    /// The memory flags of the stack accesses.
    MemFlags,
    /// The trap code of the traps (`GuardedTrap` and `trapz`).
    TrapCode,
    /// The calling convention (another of [`CALL_CONVS`]).
    CallConv,
    /// The extension of the parameters and the result (another of none,
    /// `uext`, `sext`).
    Extension,
}

/// How a block ends.
#[derive(Clone, Debug)]
pub enum Term {
    /// Jump to a block.
    Jump(u8),
    /// Branch on a variable.
    Brif(u8, u8, u8),
    /// `br_table` on a variable: default and entries.
    Table(u8, u8, Vec<u8>),
    /// Return a variable.
    Return(u8),
}

/// The body of one function.
#[derive(Clone, Debug)]
pub struct Body {
    /// Constants the `Const` ops use.
    pub constants: Vec<i64>,
    /// Which memory flags the stack accesses carry (see [`mem_flags`]).
    pub mem_flags: u8,
    /// The user trap code of the traps.
    pub trap_code: u8,
    /// The calling convention, an index into [`CALL_CONVS`].
    pub call_conv: u8,
    /// The extension of the parameters and the result: 0 none, 1 `uext`,
    /// 2 `sext`.
    pub extension: u8,
    /// Whether the function calls itself first: if `b & 3 != 0`, variable
    /// `d` becomes `self(a, b - 1) ^ b` before the blocks run.
    pub recurse: Option<u8>,
    /// Blocks: operations and terminator (block 0 is the entry).
    pub blocks: Vec<(Vec<Op>, Term)>,
    /// Sized stack slots besides the two 8-byte data slots (logical slots 0
    /// and 1, which [`Op::Slots`] uses): `(size, align_shift)` of logical
    /// slots 2, 3, ..., sizes 1..=32, shifts 0..=4. Slots no reachable op
    /// uses are still in the frame.
    pub slots: Vec<(u8, u8)>,
    /// The order the slots are declared in (their index order): a
    /// permutation of the logical slots `0..slot_count()`.
    pub slot_order: Vec<u8>,
    /// Whether the function has a stack limit: its first parameter is its
    /// `vmctx`, which is the limit. The check traps when the stack pointer
    /// is below the limit plus the frame size (unsigned, wrapping), so a
    /// limit of `-k` traps exactly when the frame is smaller than `k`
    /// bytes: the frame size is observable.
    pub stack_limit: bool,
}

/// What a generated function is.
#[derive(Clone, Debug)]
pub enum Form {
    /// A body of its own.
    Original(Body),
    /// Function `of`'s body, emitted another way (`of` is a later function).
    Twin {
        /// The original.
        of: usize,
    },
    /// Function `of`'s body, emitted another way, with its calls going to
    /// the functions after itself (`callees[k]` is function `k + 1` places
    /// after this one, not after `of`).
    Relinked {
        /// The original.
        of: usize,
    },
    /// Function `of`'s body with constant `which` changed by `delta`.
    Mutant {
        /// The original.
        of: usize,
        /// Which constant (modulo their number).
        which: usize,
        /// The change (never 0).
        delta: i64,
    },
    /// Function `of`'s body with the slots at index positions `swap.0` and
    /// `swap.1` (modulo their number) declared in each other's place.
    FrameMutant {
        /// The original.
        of: usize,
        /// The two index positions.
        swap: (u8, u8),
    },
    /// Function `of`'s body, emitted another way, with its callees and
    /// their signatures declared in reverse order (twice each with
    /// `duplicates`).
    DeclTwin {
        /// The original.
        of: usize,
        /// Whether each callee and signature is declared twice.
        duplicates: bool,
    },
    /// Function `of`'s body with one flag changed.
    FlagMutant {
        /// The original.
        of: usize,
        /// The flag.
        flag: Flag,
    },
}

/// A generated program: functions `f0 .. fN`, and inputs to call them with.
#[derive(Clone, Debug)]
pub struct Program {
    /// The functions, in declaration order.
    pub functions: Vec<Form>,
    /// Argument pairs every function is called with.
    pub inputs: Vec<(i64, i64)>,
}

fn var(u: &mut Unstructured) -> Result<u8> {
    u.int_in_range(0..=VARS - 1)
}

impl Body {
    fn arbitrary(u: &mut Unstructured, functions_after: usize) -> Result<Self> {
        // Of every magnitude, small ones too.
        let constants = (0..u.int_in_range(1..=4)?)
            .map(|_| Ok(i64::arbitrary(u)? >> u.int_in_range(0..=63)?))
            .collect::<Result<Vec<_>>>()?;
        let slots = (0..u.int_in_range(0..=4)?)
            .map(|_| Ok((u.int_in_range(1..=32)?, u.int_in_range(0..=4)?)))
            .collect::<Result<Vec<(u8, u8)>>>()?;
        // A permutation of the logical slots, by random swaps.
        let mut slot_order: Vec<u8> = (0..2 + slots.len() as u8).collect();
        for k in (1..slot_order.len()).rev() {
            slot_order.swap(k, u.int_in_range(0..=k)?);
        }
        // A third of the bodies observe their frame layout (the
        // interpreter, which lays frames out otherwise, skips them).
        let observes_frame = u.ratio(1, 3)?;
        let nblocks = u.int_in_range(1..=5u8)?;
        let mut blocks = Vec::new();
        for b in 0..nblocks {
            let mut ops = Vec::new();
            for _ in 0..u.int_in_range(0..=6)? {
                let (d, a, c) = (var(u)?, var(u)?, var(u)?);
                ops.push(match u.int_in_range(0..=15)? {
                    0 => Op::Int(u.int_in_range(0..=5)?, d, a, c),
                    1 => Op::Const(d, u.int_in_range(0..=constants.len() as u8 - 1)?),
                    2 => Op::Select(u.int_in_range(0..=9)?, d, a, c),
                    3 => Op::Div(bool::arbitrary(u)?, d, a, c),
                    4 => Op::Shift(u.int_in_range(0..=3)?, d, a, c),
                    5 => Op::Float(u.int_in_range(0..=3)?, d, a, c),
                    6 => Op::Slots(u.int_in_range(0..=1)?, d, a),
                    7 if functions_after > 0 => {
                        let callee = u.int_in_range(1..=functions_after.min(255) as u8)?;
                        Op::Call(callee, d, a, c)
                    }
                    8 if functions_after > 0 => {
                        let callee = u.int_in_range(1..=functions_after.min(255) as u8)?;
                        Op::CallIndirect(callee, d, a, c)
                    }
                    9 => Op::Vector(u.int_in_range(0..=7)?, d, a, c),
                    10 => Op::GuardedTrap,
                    11 => Op::Trapping(u.int_in_range(0..=2)?, d, a, c),
                    12 if observes_frame => {
                        Op::SlotDistance(u8::arbitrary(u)?, u8::arbitrary(u)?, d)
                    }
                    13 => Op::FloatConst(d, u.int_in_range(0..=FLOAT_BITS.len() as u8 - 1)?),
                    14 => Op::Compare(u.int_in_range(0..=9)?, d, a, c),
                    15 => Op::StackSlots(u.int_in_range(0..=1)?, d, a),
                    _ => Op::Int(0, d, a, c),
                });
            }
            let target = |u: &mut Unstructured| u.int_in_range(0..=nblocks - 1);
            let term = if b + 1 == nblocks {
                Term::Return(var(u)?)
            } else {
                match u.int_in_range(0..=3)? {
                    0 => Term::Jump(target(u)?),
                    1 => Term::Brif(var(u)?, target(u)?, target(u)?),
                    2 => Term::Table(
                        var(u)?,
                        target(u)?,
                        (0..u.int_in_range(0..=3)?)
                            .map(|_| target(u))
                            .collect::<Result<_>>()?,
                    ),
                    _ => Term::Return(var(u)?),
                }
            };
            blocks.push((ops, term));
        }
        Ok(Body {
            constants,
            mem_flags: u.int_in_range(0..=MEM_FLAG_KINDS - 1)?,
            trap_code: u.int_in_range(1..=200)?,
            // Mostly the host's default convention and no extension, as
            // most functions are.
            call_conv: if u.ratio(1, 4)? {
                u.int_in_range(0..=CALL_CONVS.len() as u8 - 1)?
            } else {
                0
            },
            extension: if u.ratio(1, 4)? {
                u.int_in_range(0..=2)?
            } else {
                0
            },
            recurse: if u.ratio(1, 4)? { Some(var(u)?) } else { None },
            blocks,
            slots,
            slot_order,
            stack_limit: u.ratio(1, 8)?,
        })
    }
}

impl<'a> Arbitrary<'a> for Program {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let n = u.int_in_range(1..=8usize)?;
        let mut functions = Vec::with_capacity(n);
        for i in 0..n {
            let later = n - i - 1;
            let form = match u.int_in_range(0..=7u8)? {
                0 if later > 0 => Form::Twin {
                    of: i + u.int_in_range(1..=later)?,
                },
                4 if later > 0 => Form::Relinked {
                    of: i + u.int_in_range(1..=later)?,
                },
                1 if later > 0 => Form::Mutant {
                    of: i + u.int_in_range(1..=later)?,
                    which: usize::arbitrary(u)?,
                    delta: i64::arbitrary(u)?.max(1),
                },
                6 if later > 0 => Form::FrameMutant {
                    of: i + u.int_in_range(1..=later)?,
                    swap: (u8::arbitrary(u)?, u8::arbitrary(u)?),
                },
                7 if later > 0 => Form::DeclTwin {
                    of: i + u.int_in_range(1..=later)?,
                    duplicates: bool::arbitrary(u)?,
                },
                5 if later > 0 => Form::FlagMutant {
                    of: i + u.int_in_range(1..=later)?,
                    flag: match u.int_in_range(0..=4u8)? {
                        0 => Flag::Condition(usize::arbitrary(u)?),
                        1 => Flag::MemFlags,
                        2 => Flag::TrapCode,
                        3 => Flag::CallConv,
                        _ => Flag::Extension,
                    },
                },
                _ => Form::Original(Body::arbitrary(u, later)?),
            };
            functions.push(form);
        }
        // Twins, relinked twins and mutants of those point at an original.
        for i in (0..n).rev() {
            let Some(of) = functions[i].of() else {
                continue;
            };
            if let Some(root) = functions[of].of() {
                match &mut functions[i] {
                    Form::Twin { of }
                    | Form::Relinked { of }
                    | Form::Mutant { of, .. }
                    | Form::FrameMutant { of, .. }
                    | Form::DeclTwin { of, .. }
                    | Form::FlagMutant { of, .. } => *of = root,
                    Form::Original(_) => unreachable!(),
                }
            }
        }
        let edge = [0, 1, -1, i64::MIN, i64::MAX, 0x8000_0000];
        let mut inputs = vec![(edge[0], edge[1]), (edge[3], edge[2])];
        // A stack limit of -k: a function with a stack limit traps exactly
        // when its frame is smaller than k bytes.
        inputs.push((-i64::from(u.int_in_range(1..=320u16)?), edge[1]));
        for _ in 0..u.int_in_range(1..=4)? {
            let pick = |u: &mut Unstructured| -> Result<i64> {
                Ok(if bool::arbitrary(u)? {
                    edge[u.int_in_range(0..=edge.len() - 1)?]
                } else {
                    i64::arbitrary(u)?
                })
            };
            inputs.push((pick(u)?, pick(u)?));
        }
        Ok(Program { functions, inputs })
    }
}

impl Body {
    /// Whether each block is reachable from the entry block (unreachable
    /// blocks are not in a fingerprint).
    pub fn reachable(&self) -> Vec<bool> {
        let mut seen = vec![false; self.blocks.len()];
        let mut stack = vec![0usize];
        while let Some(b) = stack.pop() {
            if std::mem::replace(&mut seen[b], true) {
                continue;
            }
            match &self.blocks[b].1 {
                Term::Jump(t) => stack.push(*t as usize),
                Term::Brif(_, t, e) => stack.extend([*t as usize, *e as usize]),
                Term::Table(_, d, entries) => {
                    stack.push(*d as usize);
                    stack.extend(entries.iter().map(|&t| t as usize));
                }
                Term::Return(_) => {}
            }
        }
        seen
    }
}

impl Body {
    /// Number of logical stack slots: the two data slots and the others.
    pub fn slot_count(&self) -> usize {
        2 + self.slots.len()
    }

    /// `(size, align_shift)` of logical slot `l`.
    pub fn slot(&self, l: usize) -> (u32, u8) {
        match l {
            0 | 1 => (8, 3),
            _ => {
                let (size, shift) = self.slots[l - 2];
                (u32::from(size), shift)
            }
        }
    }

    /// The frame as Cranelift lays it out: each slot in index order, with
    /// its size, alignment and (when a reachable instruction uses it) its
    /// logical number. Two bodies that differ only in their frames compile
    /// alike exactly when these are equal.
    pub fn frame(&self) -> Vec<(u32, u8, Option<u8>)> {
        let n = self.slot_count();
        let mut used = vec![false; n];
        // The entry block stores to both data slots.
        used[0] = true;
        used[1] = true;
        for op in self.reachable_ops() {
            if let Op::SlotDistance(s, t, _) = op {
                used[*s as usize % n] = true;
                used[*t as usize % n] = true;
            }
        }
        self.slot_order
            .iter()
            .map(|&l| {
                let (size, shift) = self.slot(l as usize);
                (size, shift, used[l as usize].then_some(l))
            })
            .collect()
    }
}

impl Form {
    /// The function this one is derived from, if any.
    pub fn of(&self) -> Option<usize> {
        match *self {
            Form::Original(_) => None,
            Form::Twin { of }
            | Form::Relinked { of }
            | Form::Mutant { of, .. }
            | Form::FrameMutant { of, .. }
            | Form::DeclTwin { of, .. }
            | Form::FlagMutant { of, .. } => Some(of),
        }
    }
}

impl Body {
    /// The ops of the reachable blocks.
    pub fn reachable_ops(&self) -> impl Iterator<Item = &Op> {
        self.blocks
            .iter()
            .zip(self.reachable())
            .filter(|(_, r)| *r)
            .flat_map(|((ops, _), _)| ops)
    }

    /// Applies `flag`'s change; returns whether a reachable part of the
    /// function changed (else the fingerprint must stay the same).
    pub fn mutate(&mut self, flag: Flag) -> bool {
        match flag {
            Flag::Condition(which) => {
                let reachable = self.reachable();
                let selects: Vec<(usize, usize)> = self
                    .blocks
                    .iter()
                    .enumerate()
                    .flat_map(|(b, (ops, _))| {
                        ops.iter()
                            .enumerate()
                            .filter(|(_, op)| matches!(op, Op::Select(..) | Op::Compare(..)))
                            .map(move |(i, _)| (b, i))
                    })
                    .collect();
                let Some(&(b, i)) = selects.get(which % selects.len().max(1)) else {
                    return false;
                };
                if let Op::Select(cc, ..) | Op::Compare(cc, ..) = &mut self.blocks[b].0[i] {
                    // Another of the ten condition codes.
                    *cc = (*cc % 10 + 1) % 10;
                }
                reachable[b]
            }
            Flag::MemFlags => {
                // The entry block stores to both slots: always reachable.
                self.mem_flags = (self.mem_flags + 1) % MEM_FLAG_KINDS;
                true
            }
            Flag::TrapCode => {
                self.trap_code = self.trap_code % 200 + 1;
                self.reachable_ops().any(|op| match op {
                    Op::GuardedTrap => true,
                    // The `trapz` kind (see `emit_op`).
                    Op::Trapping(k, ..) => k % 3 == 0,
                    _ => false,
                })
            }
            // The signature is always part of a function.
            Flag::CallConv => {
                self.call_conv = (self.call_conv + 1) % CALL_CONVS.len() as u8;
                true
            }
            Flag::Extension => {
                self.extension = (self.extension + 1) % 3;
                true
            }
        }
    }

    /// The function's signature: `(i64, i64) -> i64` in its calling
    /// convention, with its extension on every parameter and the result;
    /// on hosts whose ABI extends results ([`NARROW_RETURNS`]) an extended
    /// result is an `i32`, so that `uext` and `sext` return other bits.
    pub fn signature(&self) -> ir::Signature {
        let conv = match CALL_CONVS[self.call_conv as usize % CALL_CONVS.len()] {
            None => CallConv::triple_default(&target_lexicon::Triple::host()),
            Some(conv) => conv,
        };
        let extended = |ty| match self.extension % 3 {
            0 => ir::AbiParam::new(ty),
            1 => ir::AbiParam::new(ty).uext(),
            _ => ir::AbiParam::new(ty).sext(),
        };
        let narrow = !self.extension.is_multiple_of(3) && NARROW_RETURNS;
        let mut sig = ir::Signature::new(conv);
        let first = if self.stack_limit {
            ir::AbiParam {
                purpose: ir::ArgumentPurpose::VMContext,
                ..extended(I64)
            }
        } else {
            extended(I64)
        };
        sig.params.extend([first, extended(I64)]);
        sig.returns
            .push(extended(if narrow { ir::types::I32 } else { I64 }));
        sig
    }
}

/// The calling conventions a body may have (`None`: the host's default).
/// Each passes two integer arguments and returns one integer in the
/// registers the host default does, so a harness calls every generated
/// function as `extern "C" fn(i64, i64) -> i64`. (`tail` does so on x86-64
/// only; `preserve_all` returns nothing.)
#[cfg(target_arch = "x86_64")]
pub const CALL_CONVS: &[Option<CallConv>] = &[None, Some(CallConv::Fast), Some(CallConv::Tail)];
/// The calling conventions a body may have (`None`: the host's default).
/// Each passes two integer arguments and returns one integer in the
/// registers the host default does, so a harness calls every generated
/// function as `extern "C" fn(i64, i64) -> i64`.
#[cfg(not(target_arch = "x86_64"))]
pub const CALL_CONVS: &[Option<CallConv>] = &[None, Some(CallConv::Fast)];

/// Whether a function with an extension returns an `i32` (extended into
/// the whole return register by the callee): on x86-64, whose calling
/// conventions extend results as the signature says. (Linux aarch64
/// leaves the upper bits undefined, which a harness reading an `i64` would
/// see.)
pub const NARROW_RETURNS: bool = cfg!(target_arch = "x86_64");

/// Kinds of memory flags the stack accesses may carry.
const MEM_FLAG_KINDS: u8 = 3;

/// The memory flags of kind `kind`: all mean the same for an aligned stack
/// slot on a little-endian machine, and all are distinct flags.
pub fn mem_flags(kind: u8) -> ir::MemFlagsData {
    match kind % MEM_FLAG_KINDS {
        0 => ir::MemFlagsData::trusted(),
        1 => ir::MemFlagsData::new().with_notrap(),
        _ => ir::MemFlagsData::trusted().with_endianness(ir::Endianness::Little),
    }
}

impl Program {
    /// Whether any function has a stack limit.
    pub fn any_stack_limit(&self) -> bool {
        (0..self.functions.len()).any(|i| self.body(i).0.stack_limit)
    }

    /// Whether an op of any function (reachable or not) satisfies `pred`.
    pub fn any_op(&self, pred: impl Fn(&Op) -> bool) -> bool {
        (0..self.functions.len()).any(|i| {
            let body = self.body(i).0;
            body.blocks.iter().flat_map(|(ops, _)| ops).any(&pred)
        })
    }

    /// The body function `index` is built from, with a mutation applied,
    /// and how it is emitted.
    pub fn body(&self, index: usize) -> (Body, Variant) {
        let plain = Variant::default();
        match &self.functions[index] {
            Form::Original(body) => (body.clone(), plain),
            Form::Twin { of } | Form::Relinked { of } | Form::DeclTwin { of, .. } => {
                (self.body(*of).0, Variant::TWIN)
            }
            Form::FrameMutant { of, swap } => {
                let mut body = self.body(*of).0;
                let n = body.slot_order.len();
                body.slot_order
                    .swap(swap.0 as usize % n, swap.1 as usize % n);
                (body, plain)
            }
            Form::Mutant { of, which, delta } => {
                let mut body = self.body(*of).0;
                let k = which % body.constants.len();
                body.constants[k] = body.constants[k].wrapping_add(*delta);
                (body, plain)
            }
            Form::FlagMutant { of, flag } => {
                let mut body = self.body(*of).0;
                body.mutate(*flag);
                (body, plain)
            }
        }
    }
}

/// How a body refers to one callee: the declaration its calls use, and
/// the declaration and signature its indirect calls use (the same ones,
/// or content-identical duplicates).
#[derive(Clone, Copy, Debug)]
pub struct Callee {
    /// Called by `call`.
    pub call: ir::FuncRef,
    /// Taken by `func_addr` for `call_indirect`.
    pub address: ir::FuncRef,
    /// The signature `call_indirect` names.
    pub signature: ir::SigRef,
}

/// How [`emit`] writes a body. No choice here changes what the function
/// computes or its fingerprint; each changes how it is numbered, laid out
/// or printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Variant {
    /// Create the blocks in reverse order (other block numbers).
    pub reverse_block_creation: bool,
    /// Lay the blocks after the entry out in reverse order.
    pub reverse_layout: bool,
    /// Insert instructions and remove them again, at the start of every
    /// code block and before every op: values nothing uses, which shift the
    /// numbers of the others.
    pub dead_code: bool,
    /// Give the ops and terminators of the code blocks source locations.
    pub srclocs: bool,
}

impl Variant {
    /// How a twin ([`Form::Twin`], [`Form::Relinked`], [`Form::DeclTwin`])
    /// is emitted: every choice the other way.
    pub const TWIN: Variant = Variant {
        reverse_block_creation: true,
        reverse_layout: true,
        dead_code: true,
        srclocs: true,
    };
}

/// Emits `body` into the (empty) function of `b`; `callees[k]` is the
/// function `k + 1` places later, `own` the function itself (needed when
/// the body recurses). `variant` says how.
pub fn emit(
    b: &mut FunctionBuilder,
    body: &Body,
    callees: &[Callee],
    own: Option<ir::FuncRef>,
    variant: Variant,
) {
    let n = body.blocks.len();
    // Each body block becomes a fuel check and the code itself.
    let mut checks = vec![None; n];
    let mut codes = vec![None; n];
    let order: Vec<usize> = if variant.reverse_block_creation {
        (0..n).rev().collect()
    } else {
        (0..n).collect()
    };
    for &i in &order {
        codes[i] = Some(b.create_block());
        checks[i] = Some(b.create_block());
    }
    let (checks, codes): (Vec<_>, Vec<_>) = (
        checks.into_iter().map(Option::unwrap).collect(),
        codes.into_iter().map(Option::unwrap).collect(),
    );
    let entry = b.create_block();
    let out_of_fuel = b.create_block();
    // Declared in index order; `slots[l]` is logical slot `l`.
    let mut declared = vec![None; body.slot_count()];
    for &l in &body.slot_order {
        let (size, shift) = body.slot(l as usize);
        let data = StackSlotData::new(StackSlotKind::ExplicitSlot, size, shift);
        declared[l as usize] = Some(b.create_sized_stack_slot(data));
    }
    let slots: Vec<ir::StackSlot> = declared
        .into_iter()
        .map(|s| s.expect("slot_order is a permutation"))
        .collect();
    if body.stack_limit {
        let vmctx = b.create_global_value(ir::GlobalValueData::VMContext);
        b.func.stack_limit = Some(vmctx);
    }
    let vars: Vec<Variable> = (0..VARS).map(|_| b.declare_var(I64)).collect();
    let fuel = b.declare_var(I64);

    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    for (i, &v) in vars.iter().enumerate() {
        b.def_var(v, params[i % 2]);
    }
    let f = b.ins().iconst(I64, FUEL);
    b.def_var(fuel, f);
    let zero = b.ins().iconst(I64, 0);
    let flags = mem_flags(body.mem_flags);
    for &slot in &slots[..2] {
        let addr = b.ins().stack_addr(I64, slot, 0);
        b.ins().store(flags, zero, addr, 0);
    }
    if let (Some(d), Some(own)) = (body.recurse, own) {
        // if b & 3 != 0 { vars[d] = self(a, b - 1) ^ b }
        let recurse = b.create_block();
        let low = b.ins().band_imm_s(params[1], 3);
        b.ins().brif(low, recurse, &[], checks[0], &[]);
        b.switch_to_block(recurse);
        let less = b.ins().iadd_imm_s(params[1], -1);
        let call = b.ins().call(own, &[params[0], less]);
        let r = widened_result(b, call);
        let r = b.ins().bxor(r, params[1]);
        b.def_var(vars[d as usize], r);
        b.seal_block(recurse);
    }
    b.ins().jump(checks[0], &[]);

    let mut srcloc = 0;
    let mut decorate = |b: &mut FunctionBuilder| {
        if variant.srclocs {
            srcloc += 3;
            b.set_srcloc(ir::SourceLoc::new(srcloc));
        }
        if variant.dead_code {
            let dead = b.ins().iconst(I64, 77);
            let sum = b.ins().iadd(dead, dead);
            for v in [sum, dead] {
                let inst = b.func.dfg.value_def(v).unwrap_inst();
                b.func.layout.remove_inst(inst);
            }
        }
    };
    for i in 0..n {
        b.switch_to_block(checks[i]);
        let f = b.use_var(fuel);
        let f = b.ins().iadd_imm_s(f, -1);
        b.def_var(fuel, f);
        b.ins().brif(f, codes[i], &[], out_of_fuel, &[]);
        b.switch_to_block(codes[i]);
        let (ops, term) = &body.blocks[i];
        decorate(b);
        for op in ops {
            decorate(b);
            emit_op(b, op, body, &vars, (&slots, fuel), callees);
        }
        decorate(b);
        match term {
            Term::Jump(t) => {
                b.ins().jump(checks[*t as usize], &[]);
            }
            Term::Brif(c, t, e) => {
                let c = b.use_var(vars[*c as usize]);
                b.ins()
                    .brif(c, checks[*t as usize], &[], checks[*e as usize], &[]);
            }
            Term::Table(c, default, entries) => {
                let c = b.use_var(vars[*c as usize]);
                let c = b.ins().ireduce(ir::types::I32, c);
                let pool = &mut b.func.dfg.value_lists;
                let entries: Vec<_> = entries
                    .iter()
                    .map(|&t| ir::BlockCall::new(checks[t as usize], [], pool))
                    .collect();
                let default = ir::BlockCall::new(checks[*default as usize], [], pool);
                let jt = b.create_jump_table(ir::JumpTableData::new(default, &entries));
                b.ins().br_table(c, jt);
            }
            Term::Return(v) => {
                let v = b.use_var(vars[*v as usize]);
                return_narrowed(b, v);
            }
        }
    }
    b.switch_to_block(out_of_fuel);
    let v = b.use_var(vars[0]);
    return_narrowed(b, v);
    // Seal in one fixed order: SSA construction depends on it.
    for block in [entry, out_of_fuel].into_iter().chain(checks).chain(codes) {
        b.seal_block(block);
    }
    if variant.reverse_layout {
        reverse_layout(b.func);
    }
}

/// Moves the blocks after the entry, with their instructions, to the end
/// of the layout in reverse order.
fn reverse_layout(func: &mut Function) {
    let blocks: Vec<ir::Block> = func.layout.blocks().skip(1).collect();
    for &block in blocks.iter().rev() {
        let insts: Vec<ir::Inst> = func.layout.block_insts(block).collect();
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

impl Body {
    /// The body `data` encodes, as [`Program`]'s `arbitrary` makes each
    /// original, for a function with `callees` functions after it (which
    /// its calls may call); `None` if `arbitrary` fails on `data` (bytes
    /// that run out read as zeros, so it does not today).
    pub fn from_bytes(data: &[u8], callees: usize) -> Option<Body> {
        Body::arbitrary(&mut Unstructured::new(data), callees).ok()
    }

    /// The body for `seed`: [`Body::from_bytes`] of 512 bytes made from
    /// the seed (by splitmix64), so that a seed gives one body on every run
    /// and host.
    pub fn from_seed(seed: u64, callees: usize) -> Option<Body> {
        let mut state = seed;
        let bytes: Vec<u8> = (0..512 / 8)
            .flat_map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)).to_le_bytes()
            })
            .collect();
        Body::from_bytes(&bytes, callees)
    }
}

/// `body` as a function of its own, named `u0:name` and emitted as
/// `variant` says, with [`Body::signature`]; the functions it calls are
/// declared as imports: the one `k + 1` places later (`k < callees`) as
/// `u1:k`, with the signature `(i64, i64) -> i64` in the host's default
/// convention, and itself, when it recurses, as `u2:0` (so that its name
/// is in no slot: another `name` gives the same fingerprint).
pub fn standalone(body: &Body, callees: usize, name: u32, variant: Variant) -> Function {
    let mut func = Function::with_name_signature(UserFuncName::user(0, name), body.signature());
    let conv = CallConv::triple_default(&target_lexicon::Triple::host());
    let import = |func: &mut Function, namespace: u32, index: u32, sig: ir::Signature| {
        let signature = func.import_signature(sig);
        let name = func.declare_imported_user_function(ir::UserExternalName::new(namespace, index));
        func.import_function(ir::ExtFuncData {
            name: ir::ExternalName::user(name),
            signature,
            colocated: false,
            patchable: false,
        })
    };
    let callees: Vec<Callee> = (0..callees as u32)
        .map(|k| {
            let mut sig = ir::Signature::new(conv);
            sig.params
                .extend([ir::AbiParam::new(I64), ir::AbiParam::new(I64)]);
            sig.returns.push(ir::AbiParam::new(I64));
            let call = import(&mut func, 1, k, sig.clone());
            Callee {
                call,
                address: call,
                signature: func.dfg.ext_funcs[call].signature,
            }
        })
        .collect();
    let own = body
        .recurse
        .map(|_| import(&mut func, 2, 0, body.signature()));
    let mut context = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut context);
    emit(&mut b, body, &callees, own, variant);
    b.finalize(TargetFrontendConfig {
        default_call_conv: conv,
        pointer_width: target_lexicon::PointerWidth::U64,
        page_size_align_log2: 12,
    });
    func
}

/// Returns `v`, reduced to the function's return type (`i32` when it
/// returns an extended result).
fn return_narrowed(b: &mut FunctionBuilder, v: ir::Value) {
    let ty = b.func.signature.returns[0].value_type;
    let v = if ty == I64 { v } else { b.ins().ireduce(ty, v) };
    b.ins().return_(&[v]);
}

/// The result of `call` as an `i64`: an `i32` result is extended the way
/// the callee's signature says the ABI extends it.
fn widened_result(b: &mut FunctionBuilder, call: ir::Inst) -> ir::Value {
    let r = b.inst_results(call)[0];
    if b.func.dfg.value_type(r) == I64 {
        return r;
    }
    let sig = b
        .func
        .dfg
        .call_signature(call)
        .expect("a call has a signature");
    match b.func.dfg.signatures[sig].returns[0].extension {
        ir::ArgumentExtension::Uext => b.ins().uextend(I64, r),
        ir::ArgumentExtension::Sext | ir::ArgumentExtension::None => b.ins().sextend(I64, r),
    }
}

fn emit_op(
    b: &mut FunctionBuilder,
    op: &Op,
    body: &Body,
    vars: &[Variable],
    (slots, fuel): (&[ir::StackSlot], Variable),
    callees: &[Callee],
) {
    let constants = &body.constants;
    let get = |b: &mut FunctionBuilder, v: u8| b.use_var(vars[v as usize]);
    let (d, r) = match *op {
        Op::Int(k, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            let r = match k {
                0 => b.ins().iadd(x, y),
                1 => b.ins().isub(x, y),
                2 => b.ins().imul(x, y),
                3 => b.ins().band(x, y),
                4 => b.ins().bor(x, y),
                _ => b.ins().bxor(x, y),
            };
            (d, r)
        }
        Op::Const(d, k) => (
            d,
            b.ins().iconst(I64, constants[k as usize % constants.len()]),
        ),
        Op::Select(cc, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            let c = b.ins().icmp(IntCC::all()[cc as usize % 10], x, y);
            (d, b.ins().select(c, x, y))
        }
        Op::Compare(cc, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            let c = b.ins().icmp(IntCC::all()[cc as usize % 10], x, y);
            (d, b.ins().uextend(I64, c))
        }
        Op::FloatConst(d, k) => {
            let bits = FLOAT_BITS[k as usize % FLOAT_BITS.len()];
            let f = b.ins().f64const(ir::immediates::Ieee64::with_bits(bits));
            (d, b.ins().bitcast(I64, ir::MemFlagsData::new(), f))
        }
        Op::StackSlots(s, d, x) => {
            let x = get(b, x);
            b.ins().stack_store(I64, x, slots[s as usize % 2], 0);
            let from = slots[(s as usize + 1) % 2];
            (d, b.ins().stack_load(I64, I64, from, 0))
        }
        Op::Div(signed, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            // y | 1 is never 0; for signed division also avoid MIN / -1 by
            // clearing the sign bit of x when y is -1.
            let y = b.ins().bor_imm_s(y, 1);
            let r = if signed {
                let is_minus_one = b.ins().icmp_imm_s(IntCC::Equal, y, -1);
                let x_abs = b.ins().band_imm_s(x, i64::MAX);
                let x = b.ins().select(is_minus_one, x_abs, x);
                b.ins().sdiv(x, y)
            } else {
                b.ins().udiv(x, y)
            };
            (d, r)
        }
        Op::Shift(k, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            let y = b.ins().band_imm_s(y, 63);
            let r = match k {
                0 => b.ins().ishl(x, y),
                1 => b.ins().ushr(x, y),
                2 => b.ins().sshr(x, y),
                _ => b.ins().rotl(x, y),
            };
            (d, r)
        }
        Op::Float(k, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            let flags = ir::MemFlagsData::new();
            let (fx, fy) = (
                b.ins().bitcast(F64, flags, x),
                b.ins().bitcast(F64, flags, y),
            );
            let r = match k {
                0 => b.ins().fadd(fx, fy),
                1 => b.ins().fmul(fx, fy),
                2 => b.ins().fmin(fx, fy),
                _ => b.ins().fmax(fx, fy),
            };
            (d, b.ins().bitcast(I64, flags, r))
        }
        Op::Slots(s, d, x) => {
            let x = get(b, x);
            let flags = mem_flags(body.mem_flags);
            let to = b.ins().stack_addr(I64, slots[s as usize % 2], 0);
            b.ins().store(flags, x, to, 0);
            let from = b.ins().stack_addr(I64, slots[(s as usize + 1) % 2], 0);
            (d, b.ins().load(I64, flags, from, 0))
        }
        Op::Call(offset, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            let callee = callees[(offset as usize - 1) % callees.len()].call;
            let call = b.ins().call(callee, &[x, y]);
            (d, widened_result(b, call))
        }
        Op::CallIndirect(offset, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            let callee = callees[(offset as usize - 1) % callees.len()];
            let address = b.ins().func_addr(I64, callee.address);
            let call = b.ins().call_indirect(callee.signature, address, &[x, y]);
            (d, widened_result(b, call))
        }
        Op::Vector(k, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            let lanes = |b: &mut FunctionBuilder, first, second| {
                let v = b.ins().scalar_to_vector(I64X2, first);
                b.ins().insertlane(v, second, 1)
            };
            let (xy, yx) = (lanes(b, x, y), lanes(b, y, x));
            let r = match k % 4 {
                0 => b.ins().iadd(xy, yx),
                1 => b.ins().isub(xy, yx),
                2 => b.ins().imul(xy, yx),
                _ => b.ins().bxor(xy, yx),
            };
            (d, b.ins().extractlane(r, k / 4 % 2))
        }
        Op::SlotDistance(s, t, d) => {
            let n = slots.len();
            let from = b.ins().stack_addr(I64, slots[s as usize % n], 0);
            let to = b.ins().stack_addr(I64, slots[t as usize % n], 0);
            let distance = b.ins().isub(from, to);
            let old = get(b, d);
            (d, b.ins().bxor(old, distance))
        }
        Op::GuardedTrap => {
            let f = b.use_var(fuel);
            let negative = b.ins().icmp_imm_s(IntCC::SignedLessThan, f, 0);
            let code = ir::TrapCode::user(body.trap_code.max(1)).expect("user codes are 1..=255");
            b.ins().trapnz(negative, code);
            return;
        }
        Op::Trapping(k, d, x, y) => {
            let (x, y) = (get(b, x), get(b, y));
            let r = match k % 3 {
                0 => {
                    let code =
                        ir::TrapCode::user(body.trap_code.max(1)).expect("user codes are 1..=255");
                    b.ins().trapz(y, code);
                    return;
                }
                1 => b.ins().udiv(x, y),
                _ => b.ins().sdiv(x, y),
            };
            (d, r)
        }
    };
    b.def_var(vars[d as usize], r);
}
